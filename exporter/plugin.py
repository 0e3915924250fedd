"""The ``vllm.general_plugins`` entry point: vLLM calls ``register()`` in every process it runs.

- First process of the tree (the API server, or the user's script): creates the signal board
  and publishes its path in the environment the engine processes inherit.
- Engine core process: counts model-execution errors by class.
- Any process that initialises a worker: after the device is up, starts the device collectors
  (allocator, NVML, CUDA graphs) on a background thread, or says which are unavailable.
- Every engine process (engine core, workers): a heartbeat thread, so the API process's stall
  check tells one long step from a hung engine (``exporter.heartbeat``).
An invalid configuration raises here, so vLLM refuses to start with a message naming it.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from exporter import __version__, catalog, engine_errors, vllm_compat
from exporter.adapters import NvmlDevices, TorchCudaAllocator, VllmCudaGraphs
from exporter.collectors import Collector, CollectorRunner
from exporter.device_collectors import (
    AllocatorCollector,
    CudaGraphCollector,
    NvmlCollector,
    SignalPublisher,
)
from exporter.heartbeat import Heartbeat, heartbeat_dir
from exporter.metrics import WardenMetrics, process_metrics
from exporter.settings import WardenSettings, load_settings
from exporter.signals import SignalBoard

log = logging.getLogger("warden.exporter")
_state: dict[str, Any] = {}


def register() -> None:
    if _state.get("registered"):
        return
    config = load_settings()
    metrics = process_metrics()
    if config.signal_board is None:
        board = SignalBoard.create_for_process_tree()
        atexit.register(board.unlink)
        _state["board"] = board
        beats = heartbeat_dir(board.path)
        beats.mkdir(exist_ok=True)
        atexit.register(shutil.rmtree, beats, True)
    else:
        _start_heartbeat(config.signal_board)
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        log.warning(
            "warden: PROMETHEUS_MULTIPROC_DIR is not set; metrics from engine and worker "
            "processes will not reach /metrics (warden serve sets it for you)"
        )
    metrics.get(catalog.EXPORTER_INFO).labels(__version__, vllm_compat.device_type()).set(1)
    engine_errors.install(metrics)
    _patch_worker_init(config, metrics)
    _state["registered"] = True


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
        nvml = NvmlCollector(nvml_source, metrics)
        collectors.append(nvml)
    else:
        unavailable["nvml"] = reason

    graphs = VllmCudaGraphs(device_type)
    reason = graphs.availability()
    if reason is None:
        graphs.install()
        collectors.append(CudaGraphCollector(graphs, metrics))
    else:
        unavailable["cudagraph"] = reason

    for source in ("torch_allocator", "nvml", "cudagraph"):
        available.labels(source).set(0 if source in unavailable else 1)
    if unavailable:
        log.warning(
            "warden: sources unavailable in this process (exporting the rest): %s",
            "; ".join(f"{name}: {why}" for name, why in unavailable.items()),
        )
    # Read again: the API process publishes the board's path after this process's settings.
    path = load_settings().signal_board
    if collectors and path and path.exists():
        collectors.append(SignalPublisher(SignalBoard(str(path)), rank, allocator, nvml))
    if collectors:
        runner = CollectorRunner(collectors, metrics, config.collector_interval_s)
        runner.start()
        _state["device_runner"] = runner
