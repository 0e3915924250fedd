"""The ``vllm.general_plugins`` entry point: vLLM calls ``register()`` in every process it runs.

- First process of the tree (the API server, or the user's script): creates the signal board
  and publishes its path in the environment the engine processes inherit, and picks the logits
  processor for the engine's model runner (``exporter.logits_select``).
- Engine core: counts model-execution errors by class; patched when ``vllm.v1.engine.core`` is
  imported, so a forked engine core inherits the patch (``exporter.engine_errors``).
- Any process that initialises a worker: after the device is up, starts the device collectors
  (allocator, NVML, CUDA graphs) on a background thread, or says which are unavailable.
- Every engine process (engine core, workers): a heartbeat thread, so the API process's stall
  check tells one long step from a hung engine (``exporter.heartbeat``). A spawned process runs
  ``register()`` and starts its own. A forked one (vLLM's default on CUDA) inherits this module
  with ``registered`` set and no thread (threads do not survive a fork), and vLLM does not run
  plugins again there: multiprocessing's after-fork hook starts its heartbeat instead.

Version contract: each hook point is checked where it is installed (``exporter.vllm_compat``);
a missing one disables what it feeds, logs why and sets ``warden_source_available{source}`` 0.
Nothing but an invalid warden configuration (which names the variable) stops vLLM here.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter import (
    __version__,
    catalog,
    engine_errors,
    fork_engine_processes,
    logits_select,
    vllm_compat,
)
from exporter.adapters import NvmlDevices, TorchCudaAllocator, VllmCudaGraphs
from exporter.collectors import Collector, CollectorRunner
from exporter.device_collectors import (
    AllocatorCollector,
    CudaGraphCollector,
    NvmlCollector,
    SignalPublisher,
)
from exporter.heartbeat import Heartbeat, engine_pids, heartbeat_dir
from exporter.memory_risk import MemoryBudget, MemoryPlanner
from exporter.metrics import WardenMetrics, process_metrics
from exporter.settings import WardenSettings, load_settings
from exporter.signals import SignalBoard

log = logging.getLogger("warden.exporter")
DEVICE_SOURCES = ("torch_allocator", "nvml", "cudagraph")  # fed by the worker-init hook
_state: dict[str, Any] = {}


def register() -> None:
    if _state.get("registered"):
        if _state.get("pid") != os.getpid():
            _beat_in_forked_child()  # a forked child where something ran the plugins again
        return
    config = load_settings()
    metrics = process_metrics()
    if config.signal_board is None:
        board = SignalBoard.create_for_process_tree()
        owner = os.getpid()
        atexit.register(_if_pid, owner, board.unlink)
        _state["board"] = board
        beats = heartbeat_dir(board.path)
        beats.mkdir(exist_ok=True)
        atexit.register(_if_pid, owner, shutil.rmtree, beats, True)
        _state["board_path"] = Path(board.path)
    else:
        _state["board_path"] = config.signal_board
        _start_heartbeat(config.signal_board)
    _beat_after_fork()
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        log.warning(
            "warden: PROMETHEUS_MULTIPROC_DIR is not set; metrics from engine and worker "
            "processes will not reach /metrics (warden serve sets it for you)"
        )
    metrics.get(catalog.EXPORTER_INFO).labels(__version__, vllm_compat.device_type()).set(1)
    if not vllm_compat.version_supported(vllm_compat.vllm_version()):
        log.warning("warden: %s: hooks are checked one by one", vllm_compat.version_note())
    _guarded(metrics, (engine_errors.SOURCE,), lambda: engine_errors.install(metrics))
    _guarded(metrics, ("logits",), logits_select.install)
    _guarded(metrics, DEVICE_SOURCES, lambda: _patch_worker_init(config, metrics))
    fork_engine_processes.install(config.test_fork_engine_processes)
    _state["pid"] = os.getpid()
    _state["registered"] = True


def _if_pid(owner: int, cleanup: Callable[..., object], *args: object) -> None:
    """Exit cleanup of the process that made the board: a forked child inherits the atexit
    list, and must not delete the board its parent still uses."""
    if os.getpid() == owner:
        cleanup(*args)


class _ForkHook:
    """What multiprocessing calls in each child it starts (it keeps a weak reference)."""

    def __call__(self) -> None:
        _beat_in_forked_child()


def _beat_after_fork() -> None:
    """Every engine process vLLM forks from here (engine core, workers) starts a heartbeat.

    multiprocessing's after-fork registry rather than ``os.register_at_fork``: it runs only in
    children started by multiprocessing (how vLLM starts engine processes), not in a child that
    a library forks only to exec another program, whose heartbeat file would stay behind for a
    live pid that never beats and read as a silent engine process (a false stall).
    """
    if "fork_hook" in _state:
        return
    hook = _ForkHook()
    _state["fork_hook"] = hook
    multiprocessing.util.register_after_fork(hook, lambda obj: obj())


def _beat_in_forked_child() -> None:
    """This process was forked: start its own heartbeat (once), drop the parent's."""
    inherited = _state.get("heartbeat")
    if isinstance(inherited, Heartbeat):
        if inherited.pid == os.getpid():
            return
        atexit.unregister(inherited.stop)  # it would delete the parent's beat file at exit
        del _state["heartbeat"]
    path = _state.get("board_path")
    if path is not None:
        _start_heartbeat(path)
    _state["pid"] = os.getpid()


def _guarded(metrics: WardenMetrics, sources: tuple[str, ...], install: Callable[[], None]) -> None:
    """Run one hook's install; a failure disables its sources, logged, never raised."""
    try:
        install()
    except Exception as exc:
        log.warning("warden: %s disabled: %s", ", ".join(sources), exc, exc_info=True)
        for source in sources:
            metrics.get(catalog.SOURCE_AVAILABLE).labels(source).set(0)


def _start_heartbeat(board_path: Path) -> None:
    """A process below the API server (engine core, worker) beats for the stall check."""
    try:
        heartbeat = Heartbeat(heartbeat_dir(board_path))
        heartbeat.start()
        atexit.register(heartbeat.stop)
        _state["heartbeat"] = heartbeat
    except Exception:
        log.exception("warden: no heartbeat from this process; the stall check falls back")


def _patch_worker_init(config: WardenSettings, metrics: WardenMetrics) -> None:
    missing = vllm_compat.missing_hook(vllm_compat.HOOK_WORKER_INIT)
    if missing is not None:
        raise RuntimeError(f"device collectors (allocator, NVML, CUDA graphs): {missing}")
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    original = WorkerWrapperBase.init_device
    if getattr(original, "_warden_wrapped", False):
        return

    def init_device(wrapper: Any) -> None:
        original(wrapper)
        try:
            start_device_collectors(wrapper, config, metrics)
        except Exception:
            log.exception("warden: device collectors not started; the engine is unaffected")

    init_device._warden_wrapped = True  # type: ignore[attr-defined]
    WorkerWrapperBase.init_device = init_device  # type: ignore[method-assign]


def start_device_collectors(wrapper: Any, config: WardenSettings, metrics: WardenMetrics) -> None:
    worker = getattr(wrapper, "worker", None)
    rank = int(getattr(worker, "local_rank", 0) or 0)
    device = getattr(worker, "device", None)
    device_type = getattr(device, "type", None) or vllm_compat.device_type()
    available = metrics.get(catalog.SOURCE_AVAILABLE)
    collectors: list[Collector] = []
    unavailable: dict[str, str] = {}

    allocator: AllocatorCollector | None = None
    torch_source = TorchCudaAllocator()
    reason = torch_source.availability()
    if reason is None:
        index = device.index if device is not None and device.index is not None else rank
        allocator = AllocatorCollector(torch_source, int(index), metrics)
        collectors.append(allocator)
    else:
        unavailable["torch_allocator"] = reason

    nvml: NvmlCollector | None = None
    nvml_source = NvmlDevices()
    reason = nvml_source.availability()
    if reason is None:
        # The engine's processes: this one and those beating beside the board (engine core,
        # workers). Read again at every collect: the path is published after this settings read.
        def pids() -> set[int]:
            board = load_settings().signal_board
            return engine_pids(heartbeat_dir(board) if board is not None else None)

        nvml = NvmlCollector(nvml_source, metrics, pids)
        collectors.append(nvml)
    else:
        unavailable["nvml"] = reason

    graphs = VllmCudaGraphs(device_type)
    reason = graphs.availability()
    if reason is None:
        try:
            graphs.install(lambda why: _source_lost(metrics, "cudagraph", why))
            collectors.append(CudaGraphCollector(graphs, metrics))
        except Exception as exc:
            unavailable["cudagraph"] = str(exc)
    else:
        unavailable["cudagraph"] = reason

    for source in DEVICE_SOURCES:
        available.labels(source).set(0 if source in unavailable else 1)
    if unavailable:
        log.warning(
            "warden: sources unavailable in this process (exporting the rest): %s",
            "; ".join(f"{name}: {why}" for name, why in unavailable.items()),
        )
    # Read again: the API process publishes the board's path after this process's settings.
    path = load_settings().signal_board
    if collectors and path and path.exists():
        budget = MemoryBudget(*vllm_compat.memory_budget(worker))
        planner = MemoryPlanner(budget, config.memory_settle_s, time.time())
        board = SignalBoard(str(path))
        collectors.append(SignalPublisher(board, rank, allocator, nvml, planner, metrics))
    if collectors:
        runner = CollectorRunner(collectors, metrics, config.collector_interval_s)
        runner.start()
        _state["device_runner"] = runner


def _source_lost(metrics: WardenMetrics, source: str, reason: str) -> None:
    log.warning("warden: %s unavailable: %s", source, reason)
    metrics.get(catalog.SOURCE_AVAILABLE).labels(source).set(0)
