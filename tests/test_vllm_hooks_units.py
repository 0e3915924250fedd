"""Warden's hooks into vLLM, checked against the installed vLLM (0.32, CPU build): the version
contract, a missing hook disabling only what it feeds, the logits processor picked for the
engine's model runner, engine-error counting in a *forked* engine core, and CUDA-graph numbers
read only after capture. Scripts that patch vLLM classes or fork run in child interpreters, so
this test process keeps vLLM as it found it.

One fake: ``FakeRunner`` stands in for vLLM's GPU model runner (CUDA graphs need a GPU)."""

from __future__ import annotations

import importlib
import logging
import multiprocessing.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exporter import fork_engine_processes, import_hooks, logits_select, vllm_compat
from exporter.adapters import VllmCudaGraphs

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: str, tmp_path: Path, **env: str) -> str:
    """Run ``script`` in a fresh interpreter with this checkout first on the path."""
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")},
        "PYTHONPATH": str(ROOT),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
        **env,
    }
    (tmp_path / "metrics").mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    return done.stdout


# --- version contract ---------------------------------------------------------------------------


def test_every_hook_point_exists_in_the_installed_vllm() -> None:
    assert vllm_compat.version_supported(vllm_compat.vllm_version())
    missing = {p.name: vllm_compat.missing_hook(p) for p in vllm_compat.HOOK_POINTS}
    assert missing == {p.name: None for p in vllm_compat.HOOK_POINTS}


def test_the_fork_switch_forks_the_engine_core_and_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``WARDEN_TEST_FORK_ENGINE_PROCESSES`` (the suite's engines run with it) replaces the
    start context of both places vLLM starts engine processes, once each, and leaves the
    environment that says spawn as vLLM's CPU platform set it."""
    import vllm.v1.engine.utils as core_launch
    import vllm.v1.executor.multiproc_executor as worker_launch

    modules = (core_launch, worker_launch)
    assert tuple(m.__name__ for m in modules) == fork_engine_processes.LAUNCH_MODULES
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # as vLLM's CPU platform sets
    name = fork_engine_processes.CONTEXT_FUNCTION
    for module in modules:
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
        assert getattr(module, name)().get_start_method() == "spawn"
        fork_engine_processes._fork_from(module)
        forking = getattr(module, name)
        fork_engine_processes._fork_from(module)  # once only: no wrapper around the wrapper
        assert getattr(module, name) is forking
        assert getattr(module, name)().get_start_method() == "fork"
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_the_fork_switch_is_ignored_off_a_cpu_host(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On CUDA vLLM chooses how to start its processes itself: nothing is patched."""
    installed: list[str] = []
    monkeypatch.setattr(fork_engine_processes, "_cpu_host", lambda: False)
    monkeypatch.setattr(import_hooks, "when_imported", lambda name, hook: installed.append(name))
    with caplog.at_level(logging.WARNING, logger="warden.exporter"):
        fork_engine_processes.install(True)
    assert installed == []
    assert "only a CPU host's engine is forked: ignored" in caplog.text
    monkeypatch.setattr(fork_engine_processes, "_cpu_host", lambda: True)
    monkeypatch.setattr(multiprocessing.util, "register_after_fork", lambda obj, func: None)
    fork_engine_processes.install(True)
    assert installed == list(fork_engine_processes.LAUNCH_MODULES)


def test_a_forked_worker_binds_itself_as_a_spawned_one_is_bound(tmp_path: Path) -> None:
    """vLLM sets a worker's OpenMP binding in the environment around its start; a forked
    worker, its torch already loaded, takes that core and thread count right after the fork
    (the parent here has all cores and two threads)."""
    out = run_script(
        """
        import multiprocessing, os, torch
        from exporter import fork_engine_processes
        torch.set_num_threads(2)
        core = max(os.sched_getaffinity(0))
        fork_engine_processes.install(True)
        def report(queue):
            queue.put((sorted(os.sched_getaffinity(0)), torch.get_num_threads()))
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        os.environ["GOMP_CPU_AFFINITY"], os.environ["OMP_NUM_THREADS"] = str(core), "1"
        child = context.Process(target=report, args=(queue,))
        child.start()
        print("WORKER", queue.get(timeout=60), "CORE", core)
        child.join(60)
        del os.environ["GOMP_CPU_AFFINITY"], os.environ["OMP_NUM_THREADS"]
        other = context.Process(target=report, args=(queue,))  # not a worker vLLM binds
        other.start()
        print("OTHER", queue.get(timeout=60), "PARENT", sorted(os.sched_getaffinity(0)))
        other.join(60)
        """,
        tmp_path,
    )
    worker = out.split("WORKER ")[1].splitlines()[0]
    core = worker.split(" CORE ")[1]
    assert worker.startswith(f"([{core}], 1)"), out
    other, parent = out.split("OTHER ")[1].splitlines()[0].split(" PARENT ")
    assert other == f"({parent}, 2)", out


def test_served_requests_are_read_on_the_engine_cores_clock_with_their_limits() -> None:
    """vLLM's request states in the API server: the ages count from each request's first
    scheduling to the engine core's latest output, its own clock, oldest first, each with its
    ``max_tokens`` (None: no limit but the context); a request not scheduled yet, preempted
    since (maybe back in the queue), or whose stats are off, has none. The queue's limits come
    in the order its requests arrived."""
    from types import SimpleNamespace

    from vllm.v1.metrics.stats import RequestStateStats

    def request(
        scheduled: float,
        last_token: float = 0.0,
        preempted: int = 0,
        limit: int | None = None,
        arrived: float = 0.0,
    ) -> SimpleNamespace:
        stats = RequestStateStats(
            arrival_time=arrived,
            scheduled_ts=scheduled,
            last_token_ts=last_token,
            num_preemptions=preempted,
        )
        return SimpleNamespace(stats=stats, max_tokens_param=limit)

    states = {
        "young": request(scheduled=5000.4, last_token=5001.0, limit=144),
        "old": request(scheduled=5000.1, last_token=5000.9),
        "queued last": request(scheduled=0.0, limit=48, arrived=2.0),
        "queued": request(scheduled=0.0, limit=16, arrived=1.0),
        "preempted": request(scheduled=4999.0, last_token=5000.0, preempted=1, limit=32),
        "no-stats": SimpleNamespace(stats=None),
    }
    client = SimpleNamespace(output_processor=SimpleNamespace(request_states=states))
    found = vllm_compat.served_requests(client)
    assert found.served_ages == pytest.approx((0.9, 0.6))
    assert found.served_limits == (None, 144)
    assert found.queued_limits == (16, 48)  # in the order they arrived
    assert vllm_compat.served_requests(SimpleNamespace()) == vllm_compat.EngineRequests()


def test_version_series() -> None:
    assert vllm_compat.version_supported("0.32.0")
    assert vllm_compat.version_supported("0.32.3+cu129")
    assert not vllm_compat.version_supported("0.33.0")
    assert not vllm_compat.version_supported("0.11.2")
    assert not vllm_compat.version_supported(None)


def test_a_missing_hook_says_what_and_which_version() -> None:
    point = vllm_compat.HookPoint("gone", "vllm.v1.engine.core", "EngineCore.no_such_hook", "x")
    reason = vllm_compat.missing_hook(point)
    assert reason is not None and "EngineCore.no_such_hook is missing" in reason
    assert f"vLLM {vllm_compat.vllm_version()}" in reason
    nowhere = vllm_compat.HookPoint("gone", "vllm.no_such_module", "X", "x")
    assert "cannot be imported" in (vllm_compat.missing_hook(nowhere) or "")


def test_missing_hooks_disable_their_sources_and_vllm_still_loads_the_plugin(
    tmp_path: Path,
) -> None:
    """Each broken hook point: register() does not raise, the source it feeds reads 0 and the
    log names the missing attribute; the others still install."""
    out = run_script(
        """
        import logging, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
        from exporter import plugin, vllm_compat
        broken = vllm_compat.HookPoint
        vllm_compat.HOOK_WORKER_INIT = broken(
            "worker_init", "vllm.v1.worker.worker_base", "WorkerWrapperBase.gone", "device")
        vllm_compat.HOOK_ENGINE_CONFIG = broken(
            "engine_config", "vllm.engine.arg_utils", "EngineArgs.gone", "logits")
        vllm_compat.HOOK_ENGINE_CORE = broken(
            "engine_core", "vllm.v1.engine.core", "EngineCore.gone", "engine_errors")
        plugin.register()                      # must not raise
        import vllm.v1.engine.core            # the engine-errors hook runs on this import
        from prometheus_client import REGISTRY
        for source in ("torch_allocator", "nvml", "cudagraph", "logits", "engine_errors"):
            value = REGISTRY.get_sample_value("warden_source_available", {"source": source})
            print(f"SOURCE {source}={value}")
        """,
        tmp_path,
    )
    for source in ("torch_allocator", "nvml", "cudagraph", "logits", "engine_errors"):
        assert f"SOURCE {source}=0.0" in out
    assert "WorkerWrapperBase.gone is missing" in out
    assert "EngineArgs.gone is missing" in out
    assert "EngineCore.gone is missing" in out


def test_the_server_entry_runs_vllms_own_server_and_imports_nothing_before() -> None:
    """warden starts vLLM through warden.engine.vllm_entry: it must name an entry point the
    installed vLLM has, and importing it (what each spawned engine process does first) must not
    import vLLM."""
    from warden.engine.launch import SERVER_MODULE, LaunchSpec
    from warden.engine.vllm_entry import VLLM_SERVER_ENTRY

    assert LaunchSpec("m").argv()[1:3] == ["-m", SERVER_MODULE]
    module, function = VLLM_SERVER_ENTRY
    assert callable(getattr(importlib.import_module(module), function))
    probe = f"import sys, {SERVER_MODULE}; print(sorted(m for m in sys.modules if m[:4] == 'vllm'))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout


# --- logits processor for the engine's model runner ---------------------------------------------


def test_engine_config_gets_the_processor_of_its_runner(tiny_model: Path, tmp_path: Path) -> None:
    """Through vLLM's own EngineArgs.create_engine_config, as the API server builds it: a V1
    engine keeps the V1 class; a V2 engine gets the V2 class, which V2's start-up check (the
    API server's params validator) and loader accept; a vLLM without the runner's interface
    starts without warden's processor."""
    out = run_script(
        f"""
        from exporter import logits_select, vllm_compat
        from vllm.config import VllmConfig
        from vllm.engine.arg_utils import EngineArgs
        logits_select.install()
        args = dict(model={str(tiny_model)!r}, dtype="float32", max_model_len=256,
                    enforce_eager=True, block_size=32,
                    logits_processors=[logits_select.V1_PROCESSOR])
        config = EngineArgs(**args).create_engine_config()
        print("V1RUNNER", config.use_v2_model_runner, config.model_config.logits_processors)

        # Model Runner V2 (CUDA's default). This CPU build cannot validate a V2 config (no
        # Triton), so the finished V1 config is told it runs V2 and handed to the same step
        # the wrapper runs.
        VllmConfig.use_v2_model_runner = property(lambda self: True)
        logits_select.select_logits_processor(config)
        print("V2RUNNER", config.model_config.logits_processors)
        from vllm.v1.worker.gpu.sample.logits_processor import (
            build_custom_logits_processors_params_validator)
        build_custom_logits_processors_params_validator(config.model_config.logits_processors)
        print("V2CHECK ok")

        vllm_compat.HOOK_LOGITS_V2 = vllm_compat.HookPoint(
            "logits_v2", "vllm.v1.worker.gpu.sample.logits_processor", "Gone", "logits")
        config.model_config.logits_processors = [logits_select.V1_PROCESSOR]
        logits_select.select_logits_processor(config)
        print("NOV2", config.model_config.logits_processors)
        """,
        tmp_path,
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    assert "V1RUNNER False ['exporter.logits:NonFiniteLogitsProcessor']" in out
    assert "V2RUNNER ['exporter.logits_v2:NonFiniteLogitsProcessorV2']" in out
    assert "V2CHECK ok" in out
    assert "NOV2 None" in out


def test_processor_left_out_where_vllm_refuses_custom_processors(
    tiny_model: Path, tmp_path: Path
) -> None:
    """``warden serve`` always names warden's processor; where vLLM would refuse to start with
    one, the config hook leaves it out, logs why and exports the logits source as 0, and the
    config is made: a pooling model (``--runner pooling``, ``--convert embed``), the V1 runner
    with speculative decoding, ``--return-sampling-mask`` (checked against vLLM's own verifier:
    this CPU build cannot make a V2 config)."""
    out = run_script(
        f"""
        import logging, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
        from prometheus_client import REGISTRY
        from exporter import logits_select
        from vllm.config import VllmConfig
        from vllm.engine.arg_utils import EngineArgs
        logits_select.install()
        base = dict(model={str(tiny_model)!r}, dtype="float32", max_model_len=256,
                    enforce_eager=True, block_size=32,
                    logits_processors=[logits_select.V1_PROCESSOR])
        ngram = dict(method="ngram", num_speculative_tokens=2, prompt_lookup_max=3)
        def source():
            return REGISTRY.get_sample_value("warden_source_available", dict(source="logits"))
        for name, extra in [("plain", dict()), ("pool", dict(runner="pooling")),
                            ("convert", dict(convert="embed")),
                            ("plain", dict()), ("spec", dict(speculative_config=ngram))]:
            config = EngineArgs(**base, **extra).create_engine_config()
            print("CASE", name, config.model_config.runner_type,
                  config.model_config.logits_processors, source())

        args = EngineArgs(**base, return_sampling_mask=True, logprobs_mode="processed_logprobs")
        config = EngineArgs(**base, logprobs_mode="processed_logprobs").create_engine_config()
        config.model_config.return_sampling_mask = True
        VllmConfig.use_v2_model_runner = property(lambda self: True)
        try:
            config._verify_sampling_replay_config()
        except ValueError as exc:
            print("VLLM REFUSES", exc)
        logits_select.leave_out_before_config(args)
        config.model_config.logits_processors = args.logits_processors
        config._verify_sampling_replay_config()
        print("CASE mask", args.logits_processors, source())
        """,
        tmp_path,
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    v1 = f"[{logits_select.V1_PROCESSOR!r}]"
    assert f"CASE plain generate {v1} 1.0" in out
    assert "CASE pool pooling None 0.0" in out
    assert "CASE convert pooling None 0.0" in out
    assert "CASE spec generate None 0.0" in out
    assert "VLLM REFUSES sampling distribution replay does not support custom logits" in out
    assert "CASE mask None 0.0" in out
    assert out.count("processor left out): pooling models") == 2
    assert "processor left out): the V1 model runner takes no custom logits processor" in out
    assert "processor left out): --return-sampling-mask" in out


# --- engine errors in a forked engine core -----------------------------------------------------


FORKED_ENGINE_CORE = """
import multiprocessing, sys, types
from vllm.plugins import load_general_plugins
load_general_plugins()                 # the API process: warden's plugin registers here
assert "vllm.v1.engine.core" not in sys.modules, "imported too early for this test"
import vllm.v1.engine.core as core    # AsyncLLM imports it before starting the engine core

def engine_core_step_fails():
    # The forked child: vLLM's plugins-loaded flag and warden's "registered" state are
    # inherited, so neither vLLM nor warden runs the plugin again here.
    load_general_plugins()
    engine = object.__new__(core.EngineCore)
    engine.vllm_config = None
    engine.scheduler = types.SimpleNamespace(make_stats=lambda: None)
    try:
        with engine.log_error_detail(None):
            raise RuntimeError("Worker failed with error 'CUDA error: an illegal memory access "
                               "was encountered', please check the stack trace above")
    except RuntimeError:
        pass

child = multiprocessing.get_context("fork").Process(target=engine_core_step_fails)
child.start(); child.join()
assert child.exitcode == 0, child.exitcode

from warden.engine.health import MetricWindows, check_driver_errors
windows = MetricWindows()
windows.sample()
print("COUNT", windows.latest().get("warden_engine_errors_total|cuda_driver"))
print("READY", check_driver_errors(windows))
"""


def test_forked_engine_core_counts_classified_errors_and_fails_readiness(tmp_path: Path) -> None:
    """The CUDA start path: plugin loaded in the API process before vllm.v1.engine.core is
    imported, engine core forked. The classified error reaches warden_engine_errors_total
    {class="cuda_driver"} (in the multiprocess folder, as /metrics serves it) and readiness."""
    out = run_script(FORKED_ENGINE_CORE, tmp_path, VLLM_PLUGINS="warden")
    assert "COUNT 1.0" in out
    assert "name='driver_error', ok=False" in out and "1 CUDA driver errors" in out


# --- heartbeats from forked engine processes -----------------------------------------------------


FORKED_HEARTBEATS = """
import multiprocessing, os, threading, time
from pathlib import Path
from vllm.plugins import load_general_plugins
load_general_plugins()                 # the API process: warden's plugin registers here
from exporter import plugin
from exporter.heartbeat import heartbeat_dir, read_beats
beats = heartbeat_dir(os.environ["WARDEN_SIGNAL_BOARD"])
fork = multiprocessing.get_context("fork")

def wait_for_own_beat():
    mine = beats / str(os.getpid())
    deadline = time.monotonic() + 60
    while not mine.exists():
        assert time.monotonic() < deadline, f"no beat file {mine}"
        time.sleep(0.05)
    load_general_plugins()             # vLLM's flag is inherited: a no-op here
    plugin.register()                  # so is warden's: must not start a second heartbeat
    names = [t.name for t in threading.enumerate() if t.name == "warden-heartbeat"]
    assert names == ["warden-heartbeat"], names

def worker():                          # forked by the engine core, as MultiprocExecutor does
    wait_for_own_beat()
    print("WORKER", os.getpid(), flush=True)

def engine_core():                     # forked by the API process, as vLLM does on CUDA
    wait_for_own_beat()
    child = fork.Process(target=worker)
    child.start(); child.join()
    assert child.exitcode == 0, child.exitcode
    assert (beats / str(os.getpid())).exists(), "the worker's exit took the core's beat"
    print("CORE", os.getpid(), flush=True)

assert not [t for t in threading.enumerate() if t.name == "warden-heartbeat"], "API process beats"
core = fork.Process(target=engine_core)
core.start(); core.join()
assert core.exitcode == 0, core.exitcode

# A child forked by other means (a library forking to exec a program) gets no heartbeat, so
# it can never leave a beat file for a live process that does not beat.
pid = os.fork()
if pid == 0:
    threads = [t.name for t in threading.enumerate()]
    os._exit(0 if "warden-heartbeat" not in threads else 1)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "os.fork child beats"
assert Path(os.environ["WARDEN_SIGNAL_BOARD"]).exists(), "a child's exit removed the board"
print("FILES", sorted(p.name for p in beats.iterdir() if p.name.isdigit()))
"""


def test_forked_engine_processes_start_their_own_heartbeat(tmp_path: Path) -> None:
    """The CUDA start path: the API process registers warden's plugin, then forks the engine
    core, which forks a worker. Neither runs the plugin again (vLLM's and warden's flags are
    inherited), yet each beats under its own pid, exactly once, and no child's exit removes its
    parent's board or beat file."""
    out = run_script(FORKED_HEARTBEATS, tmp_path, VLLM_PLUGINS="warden")
    core = next(line.split()[1] for line in out.splitlines() if line.startswith("CORE "))
    worker = next(line.split()[1] for line in out.splitlines() if line.startswith("WORKER "))
    assert core != worker
    files = next(line for line in out.splitlines() if line.startswith("FILES "))
    assert f"'{core}'" in files and f"'{worker}'" in files


# --- import hooks -------------------------------------------------------------------------------


def test_import_hook_runs_after_the_module_body_and_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "warden_probe_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    import_hooks.when_imported("warden_probe_mod", lambda m: seen.append(m.VALUE + 1))
    import_hooks.when_imported("warden_probe_mod", lambda m: 1 / 0)  # logged, not raised
    assert seen == [] and import_hooks.pending("warden_probe_mod")
    import warden_probe_mod  # noqa: F401

    assert seen == [42] and not import_hooks.pending("warden_probe_mod")
    import_hooks.when_imported("warden_probe_mod", lambda m: seen.append(0))  # already: at once
    assert seen == [42, 0]
    sys.modules.pop("warden_probe_mod", None)


# --- CUDA graphs: counted once capture has finished ---------------------------------------------


class FakeRunner:
    """FAKE of vLLM's GPU model runner: capture_model moves vLLM's real capture counter as the
    V2 runner does (profiling captures are put back afterwards)."""

    def capture_model(self, *, profile_only: bool = False) -> int:
        from vllm.compilation.counter import compilation_counter

        saved = compilation_counter.num_cudagraph_captured
        compilation_counter.num_cudagraph_captured += 35
        if profile_only:
            compilation_counter.num_cudagraph_captured = saved
            return 3 << 30
        return 512 << 20


def test_graph_numbers_count_only_the_real_capture() -> None:
    from vllm.compilation.counter import compilation_counter

    graphs = VllmCudaGraphs("cuda")
    runner_cls = type("Runner", (FakeRunner,), {})
    graphs._wrap(runner_cls)
    start = compilation_counter.num_cudagraph_captured
    runner = runner_cls()
    assert runner.capture_model(profile_only=True) == 3 << 30  # V2's memory profile
    assert graphs.captures() == 0 and graphs.pool_bytes() == 0
    assert runner.capture_model() == 512 << 20  # the capture that stays
    assert graphs.captures() == start + 35 and graphs.pool_bytes() == 512 << 20
    compilation_counter.num_cudagraph_captured = start


def test_graph_adapter_wraps_both_runners_of_this_vllm(tmp_path: Path) -> None:
    out = run_script(
        """
        from exporter.adapters import VllmCudaGraphs
        graphs = VllmCudaGraphs("cuda")
        graphs.install(lambda why: print("MISSING", why))
        import vllm.v1.worker.gpu_model_runner as v1
        import vllm.v1.worker.gpu.model_runner as v2
        print("WRAPPED", v1.GPUModelRunner.capture_model._warden_wrapped,
              v2.GPUModelRunner.capture_model._warden_wrapped, sorted(graphs.hooked))
        """,
        tmp_path,
    )
    assert "WRAPPED True True ['capture_v1', 'capture_v2']" in out
    assert "MISSING" not in out


def test_cpu_engine_has_no_graphs_to_hook() -> None:
    assert VllmCudaGraphs("cpu").availability() == "CUDA graphs are not used on a cpu engine"
