"""The supervisor's pure parts: backoff, restart circuit, reason classification, the state file
and its mirror into metrics, the stand-in metrics page, drain and fault-tolerance parsing."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter import catalog
from exporter.heartbeat import INTERVAL_S as HEARTBEAT_INTERVAL_S
from exporter.metrics import WardenMetrics
from exporter.settings import load_settings
from exporter.supervisor_mirror import SupervisorMirror
from exporter.supervisor_state import STATE_ENV_VAR, SupervisorState, read_state_from_env
from warden.common.metrics_text import family_names, parse_samples, sum_samples
from warden.common.tokens import TokenError, bearer_matches, load_token
from warden.supervisor import cpu_memory, first_start
from warden.supervisor.config import SupervisorConfig
from warden.supervisor.engine import PROBE_TIMEOUT_S, Probe
from warden.supervisor.fault_tolerance import fault_tolerance_enabled
from warden.supervisor.metrics import render
from warden.supervisor.policy import (
    CRASH,
    EXIT,
    RESTART_REASONS,
    STALLED,
    UNHEALTHY,
    Backoff,
    RestartWindow,
    classify_exit,
    describe_returncode,
)
from warden.supervisor.probes import ProbeTimers, evaluate


def test_first_restart_is_immediate_then_doubles_to_the_cap() -> None:
    backoff = Backoff(base_s=1.0, max_s=10.0)
    assert backoff.schedule(7) == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_restart_window_opens_after_the_limit_and_forgets_old_restarts() -> None:
    window = RestartWindow(limit=2, window_s=100.0)
    assert window.allows(0.0)
    window.record(0.0)
    window.record(10.0)
    assert not window.allows(20.0)
    assert window.explain(20.0) == "2 restarts in the last 100s (limit 2)"
    # The first restart leaves the window: one more is allowed.
    assert window.allows(100.5)
    window.record(100.5)
    assert window.history == [10.0, 100.5]


@pytest.mark.parametrize(
    ("returncode", "vanished", "reason"),
    [
        (-signal.SIGKILL, [], CRASH),
        (-signal.SIGSEGV, [], CRASH),
        (1, [], EXIT),
        (0, [], EXIT),
        (0, ["EngineCore (pid 7)"], CRASH),  # vLLM exits cleanly after its engine core died
        # The server's own failure: its shutdown takes its engine core down first.
        (3, ["EngineCore (pid 7)"], EXIT),
        (None, ["Worker (pid 8)"], CRASH),
        (None, [], UNHEALTHY),
    ],
)
def test_reason_from_exit_code_signal_and_vanished_children(
    returncode: int | None, vanished: list[str], reason: str
) -> None:
    assert classify_exit(returncode, vanished) == reason


def test_returncode_is_described_for_people() -> None:
    assert describe_returncode(-9) == "killed by SIGKILL"
    assert describe_returncode(3) == "exit code 3"


def test_state_file_round_trip_keeps_history_totals_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = SupervisorState()
    event = state.record_restart(CRASH, failed_at=100.0, now=101.0, detail="EngineCore vanished")
    state.record_ready(event, episode_started_at=100.0, now=130.5)
    state.open_circuit("3 restarts in the last 3600s (limit 2)", now=140.0)
    state.set_eager(True, "policy", now=150.0)
    state.window = [101.0]
    state.save(path)
    loaded = SupervisorState.load(path)
    assert loaded.restarts[0].duration_s == 30.5
    assert loaded.restart_totals == {CRASH: 1}
    assert loaded.circuit_open and loaded.eager and loaded.window == [101.0]
    raw = json.loads(path.read_text())
    assert set(raw["restart_totals"]) == set(RESTART_REASONS)
    assert not list(tmp_path.glob(".supervisor-state-*")), "temp file left behind"


def test_unreadable_state_file_starts_fresh(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    assert SupervisorState.load(path).restart_totals == {}


def test_state_is_read_from_the_environment_only_when_supervised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(STATE_ENV_VAR, raising=False)
    assert read_state_from_env() is None
    path = tmp_path / "state.json"
    SupervisorState(circuit_open=True).save(path)
    monkeypatch.setenv(STATE_ENV_VAR, str(path))
    read = read_state_from_env()
    assert read is not None and read.circuit_open is True


def _values(registry: CollectorRegistry) -> dict[str, float]:
    return parse_samples(generate_latest(registry).decode())


def test_mirror_counts_deltas_and_replays_each_duration_once(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    registry = CollectorRegistry()
    mirror = SupervisorMirror(str(path), WardenMetrics(registry))
    mirror.collect()  # no file yet: nothing to mirror, no error
    state = SupervisorState()
    first = state.record_restart(CRASH, 0.0, 1.0, "")
    state.record_ready(first, 0.0, 25.0)
    state.save(path)
    mirror.collect()
    second = state.record_restart("stalled", 50.0, 51.0, "")
    state.set_eager(True, "", 52.0)
    state.save(path)
    mirror.collect()
    mirror.collect()  # unchanged file: nothing replayed twice
    state.record_ready(second, 50.0, 62.0)
    state.save(path)
    mirror.collect()
    values = _values(registry)
    restarts, duration = catalog.ENGINE_RESTARTS.name, catalog.ENGINE_RESTART_DURATION.name
    assert values[f'{restarts}{{reason="crash"}}'] == 1
    assert values[f'{restarts}{{reason="stalled"}}'] == 1
    assert values[f"{duration}_count"] == 2
    assert values[f"{duration}_sum"] == pytest.approx(37.0)
    assert values[catalog.ENGINE_EAGER_MODE.name] == 1
    assert values[catalog.SUPERVISOR_CIRCUIT_OPEN.name] == 0


def test_a_fresh_engine_mirrors_the_whole_history_at_once(tmp_path: Path) -> None:
    """A restarted engine's new process starts from zero and catches up in one collect."""
    path = tmp_path / "state.json"
    state = SupervisorState()
    for n in range(3):
        event = state.record_restart(CRASH, n * 100.0, n * 100.0 + 1, "")
        state.record_ready(event, n * 100.0, n * 100.0 + 20)
    state.open_circuit("limit", 400.0)
    state.save(path)
    registry = CollectorRegistry()
    SupervisorMirror(str(path), WardenMetrics(registry)).collect()
    values = _values(registry)
    assert values[f'{catalog.ENGINE_RESTARTS.name}{{reason="crash"}}'] == 3
    assert values[f"{catalog.ENGINE_RESTART_DURATION.name}_count"] == 3
    assert values[catalog.SUPERVISOR_CIRCUIT_OPEN.name] == 1


def test_supervisor_metrics_page_uses_catalog_names() -> None:
    state = SupervisorState()
    event = state.record_restart(CRASH, 0.0, 1.0, "")
    state.record_ready(event, 0.0, 33.0)
    state.open_circuit("limit", 40.0)
    text = render(state, ready=False).decode()
    samples = parse_samples(text)
    assert samples[catalog.ENGINE_RESTARTS.name + '{reason="crash"}'] == 1
    assert samples[catalog.ENGINE_RESTART_DURATION.name + '_bucket{le="45.0"}'] == 1
    assert samples[catalog.ENGINE_RESTART_DURATION.name + '_bucket{le="30.0"}'] == 0
    assert samples[catalog.SUPERVISOR_CIRCUIT_OPEN.name] == 1
    assert samples[catalog.ENGINE_READY.name] == 0
    assert family_names(text) <= {catalog.BY_NAME[n].base for n in catalog.BY_NAME} | {
        catalog.ENGINE_RESTART_DURATION.name
    }


def test_inflight_is_read_from_prometheus_text() -> None:
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running_other{engine="0"} 7.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
    )
    assert sum_samples(text, catalog.VLLM_NUM_REQUESTS_RUNNING.name) == 2.0
    assert sum_samples(text, catalog.VLLM_NUM_REQUESTS_WAITING.name) == 3.0
    assert sum_samples(text, "vllm:absent") is None


def test_override_token_prefers_the_file(tmp_path: Path) -> None:
    def token(env: dict[str, str]) -> str | None:
        return load_token(load_settings(env))

    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert token({"WARDEN_WEBHOOK_TOKEN": "plain"}) == "plain"
    env = {"WARDEN_WEBHOOK_TOKEN_FILE": str(token_file), "WARDEN_WEBHOOK_TOKEN": "plain"}
    assert token(env) == "from-file"
    assert token({}) is None


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_an_unreadable_or_empty_token_file_fails_closed(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TokenError, match="WARDEN_WEBHOOK_TOKEN_FILE"):
        load_token(load_settings({"WARDEN_WEBHOOK_TOKEN_FILE": str(path)}))


def test_bearer_comparison_needs_the_exact_token() -> None:
    assert bearer_matches("Bearer s3cret", "s3cret")
    assert bearer_matches("bearer s3cret", "s3cret")
    for header in (None, "", "s3cret", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret"):
        assert not bearer_matches(header, "s3cret")


def test_fault_tolerance_is_recognised_from_vllm_arguments() -> None:
    assert fault_tolerance_enabled(["--dtype", "float32", "--enable-fault-tolerance"])
    assert not fault_tolerance_enabled(["--dtype", "float32"])


# --- first start: vLLM's own error line, and the CPU memory default --------------------------
# Excerpts of what vLLM 0.32 (CPU) printed when it could not start, from real runs.
NOT_ENOUGH_MEMORY = [
    "(APIServer pid=1843) WARNING 11-23 14:17:44 [system_utils.py:255] Found ulimit of 20000 "
    "and failed to automatically increase with error current limit exceeds maximum limit. This "
    "can cause fd limit errors like `OSError: [Errno 24] Too many open files`.",
    "(VllmWorker-0 pid=1936) ERROR 11-23 14:18:28 [multiproc_executor.py:953]     raise "
    "ValueError(",
    "(VllmWorker-0 pid=1936) ERROR 11-23 14:18:28 [multiproc_executor.py:953] ValueError: "
    "Available memory on node 0 (8.94/10.34 GiB) on startup is less than desired CPU memory "
    "utilization (0.99, 10.23 GiB). On the CPU backend, the `--gpu-memory-utilization` flag "
    "controls the fraction of CPU memory reserved (despite its name).",
    '  File "/v/vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup',
    "    raise RuntimeError(",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
    "proc(s): {'EngineCore': 1}",
]
BAD_ARGUMENT = [
    "                     [model_tag]",
    "api_server.py: error: argument --dtype: invalid choice: 'float33' (choose from 'auto', "
    "'bfloat16', 'float', 'float16', 'float32', 'half')",
]
NO_MODEL = [
    "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
    "'namespace/repo_name': '/tmp/d/nonexistent'. Use `repo_type` argument if needed.",
    "",
    "During handling of the above exception, another exception occurred:",
    '    raise OSError(f"{e}") from e',
    "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
    "'/tmp/d/nonexistent'. Use `repo_type` argument if needed.",
]


@pytest.mark.parametrize(
    ("lines", "line_starts", "hint_says"),
    [
        (NOT_ENOUGH_MEMORY, "ValueError: Available memory on node 0", "VLLM_CPU_KVCACHE_SPACE"),
        (BAD_ARGUMENT, "api_server.py: error: argument --dtype", "--print-command"),
        (NO_MODEL, "OSError: Repo id must be in the form", "check the model path"),
        (["INFO starting", "Killed"], None, "fix the cause"),
    ],
    ids=["cpu-memory", "bad-argument", "no-model", "no-error-line"],
)
def test_first_start_failure_names_vllms_own_error_line_and_a_hint(
    lines: list[str], line_starts: str | None, hint_says: str
) -> None:
    line = first_start.error_line(lines)
    if line_starts is None:
        assert line is None
    else:
        assert line is not None and line.startswith(line_starts), line
    assert hint_says in first_start.hint(line)
    message = first_start.explain(lines, "exit code 1", "Full output: above.")
    assert "not restarting" in message and "exit code 1" in message
    assert "See root cause above" not in message


def test_a_cpu_build_without_a_kv_size_gets_a_quarter_of_the_available_memory() -> None:
    cpu = {"VLLM_TARGET_DEVICE": "cpu"}
    gib = cpu_memory.GIB
    default = cpu_memory.kv_cache_default(cpu, [], 9 * gib, 10 * gib)
    assert default is not None and default.gib == 2
    assert "VLLM_CPU_KVCACHE_SPACE=2" in default.reason and "0.92" in default.reason
    assert cpu_memory.kv_cache_default(cpu, [], int(2.5 * gib), 10 * gib).gib == 1  # type: ignore[union-attr]
    # The operator chose: nothing to do.
    assert (
        cpu_memory.kv_cache_default({**cpu, "VLLM_CPU_KVCACHE_SPACE": "4"}, [], 9 * gib, gib)
        is None
    )
    assert cpu_memory.kv_cache_default(cpu, ["--gpu-memory-utilization", "0.5"], gib, gib) is None
    assert cpu_memory.kv_cache_default(cpu, ["--kv-cache-memory-bytes=1G"], gib, gib) is None
    with pytest.raises(cpu_memory.CpuMemoryError, match="VLLM_CPU_KVCACHE_SPACE"):
        cpu_memory.kv_cache_default(cpu, [], gib, 10 * gib)


def test_this_machines_vllm_build_is_recognised() -> None:
    """The engine installed here is vllm-cpu (scripts/setup.sh); vLLM's own test agrees."""
    from vllm.platforms import cpu_platform_plugin

    assert cpu_memory.is_cpu_build({}) is (cpu_platform_plugin() is not None)


def test_memory_is_read_from_the_node_and_the_cgroup(tmp_path: Path) -> None:
    node = tmp_path / "devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "meminfo").write_text(
        "Node 0 MemTotal:       10485760 kB\nNode 0 MemFree:         1048576 kB\n"
        "Node 0 Active(file):     1048576 kB\nNode 0 Inactive(file):   1048576 kB\n"
        "Node 0 SReclaimable:     1048576 kB\n"
    )
    available, total = cpu_memory.memory_now(tmp_path)
    assert total == 10 * cpu_memory.GIB and available <= 4 * cpu_memory.GIB
    cgroup = tmp_path / "fs/cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text(f"{3 * cpu_memory.GIB}\n")
    (cgroup / "memory.current").write_text(f"{2 * cpu_memory.GIB}\n")
    assert cpu_memory.memory_now(tmp_path) == (cpu_memory.GIB, 3 * cpu_memory.GIB)


def test_serve_says_which_kv_cache_it_picked_and_passes_it_to_vllm(tmp_path: Path) -> None:
    """``warden serve`` on this CPU host without VLLM_CPU_KVCACHE_SPACE: the command it
    would run carries the default, and stderr says why."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    result = subprocess.run(
        [sys.executable, "-m", "warden.cli", "serve", "--print-command", "/m", "--", "--x", "1"],
        capture_output=True, text=True, env={**env, "VLLM_TARGET_DEVICE": "cpu"}, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("VLLM_CPU_KVCACHE_SPACE=")
    assert result.stdout.rstrip().endswith("--x 1")
    assert "VLLM_CPU_KVCACHE_SPACE is not set" in result.stderr
    chosen = subprocess.run(
        [sys.executable, "-m", "warden.cli", "serve", "--print-command", "/m"],
        capture_output=True, text=True, timeout=120,
        env={**env, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "3"},
    )  # fmt: skip
    assert not chosen.stdout.startswith("VLLM_CPU_KVCACHE_SPACE") and not chosen.stderr


def test_a_hung_engine_is_restarted_within_a_minute_by_default() -> None:
    """Defaults an operator gets: no step for the stall timeout while requests wait, then the
    supervisor's grace, a heartbeat late and a probe late: the restart starts within 60 s of
    the hang (the engine test measures the same path with short settings)."""
    settings, config = load_settings({}), SupervisorConfig()
    worst = (
        settings.stall_timeout_s
        + config.stall_grace_s
        + HEARTBEAT_INTERVAL_S
        + config.probe_s
        + config.poll_s
    )
    assert worst < 60.0, worst
    # A frozen API server (no probe answered) is restarted within the minute too, yet only
    # after a grace far longer than a paged-out server's slowest answers (7 to 9 s seen).
    frozen = config.unresponsive_grace_s + PROBE_TIMEOUT_S + config.probe_s + config.poll_s
    assert frozen < 60.0 and config.unresponsive_grace_s >= 30.0, frozen


@pytest.mark.parametrize(
    ("flag", "text", "error"),
    [
        ("--unresponsive-grace-s", "-5", "must be a finite number >= 0"),
        ("--stall-grace-s", "nan", "must be a finite number >= 0"),
        ("--max-restarts", "-1", "must be a finite number >= 0"),
        ("--supervisor-port", "70000", "must be at most 65535"),
        ("--backoff-max-s", "soon", "not a number: 'soon'"),
    ],
)
def test_absurd_supervisor_settings_are_refused_with_the_flag_named(
    flag: str, text: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="warden serve")
    SupervisorConfig.add_arguments(parser)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([flag, text])
    assert exited.value.code == 2
    assert f"argument {flag}: {error}" in capsys.readouterr().err
    accepted = SupervisorConfig.from_args(parser.parse_args(["--supervisor-port", "-1"]))
    assert accepted.control_port is None and accepted.unresponsive_grace_s == 45.0


class _SlowProbeEngine:
    """Answers /warden/ready with a stall verdict, taking ``delay_s`` of the fake clock."""

    def __init__(self, clock: list[float], delay_s: float) -> None:
        self.clock, self.delay_s = clock, delay_s

    def get(self, path: str) -> Probe:
        assert path == "/warden/ready"
        self.clock[0] += self.delay_s
        checks = {"stalled": {"ok": False, "detail": "no engine step ended for 3s"}}
        return Probe(503, {"checks": checks})


def test_the_stall_grace_is_timed_from_the_probes_answer_not_from_before_it_was_sent() -> None:
    """A busy API server answers late; timing the grace from before the probe would restart
    an engine before its grace had passed (CI saw a restart 0.06 s early)."""
    config = SupervisorConfig(stall_grace_s=1.0)
    clock = [100.0]
    engine = _SlowProbeEngine(clock, delay_s=0.3)
    timers = ProbeTimers()
    seen = []
    failure = None
    while failure is None:
        failure = evaluate(engine, timers, lambda: clock[0], config)  # type: ignore[arg-type]
        seen.append(clock[0])
        clock[0] += 0.5  # the supervisor's poll
    assert timers.stalled == seen[0] == 100.3
    assert failure.reason == STALLED
    assert failure.at - seen[0] >= config.stall_grace_s
