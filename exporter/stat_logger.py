"""vLLM stat-logger plugin: the per-step hook in the API process.

Registered under the ``vllm.stat_logger_plugins`` entry point; vLLM calls ``record`` once per
batch of engine outputs. It hands the numbers to the process's StepMonitor and starts the API
process's collector thread (stall detection, host memory) on first construction.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from exporter import catalog, vllm_compat
from exporter.collectors import CollectorRunner, FailingCollector
from exporter.heartbeat import heartbeat_dir
from exporter.host_memory import HostMemoryCollector
from exporter.metrics import process_metrics
from exporter.settings import load_settings
from exporter.signals import SignalBoard
from exporter.stall import HangLimits, StallCollector, WatermarkPeakCollector
from exporter.step_monitor import StepMonitor, process_monitor
from exporter.supervisor_mirror import SupervisorMirror

log = logging.getLogger("warden.exporter")
_runner: CollectorRunner | None = None


def _make_monitor() -> StepMonitor:
    global _runner
    config = load_settings()
    metrics = process_metrics()
    path = config.signal_board
    board = SignalBoard(str(path)) if path and path.exists() else None
    monitor = StepMonitor(config, metrics, board)
    heartbeats = heartbeat_dir(path) if path else None
    collectors: list[Any] = [
        StallCollector(
            monitor, metrics, config.stall_timeout_s, HangLimits.from_settings(config), heartbeats
        ),
        WatermarkPeakCollector(monitor),
    ]
    host = HostMemoryCollector.from_settings(config, metrics, board)
    if host is not None:
        collectors.append(host)
    mirror = SupervisorMirror.from_env(metrics)
    if mirror is not None:
        collectors.append(mirror)
    if config.test_failing_collector:
        collectors.append(FailingCollector())
    _runner = CollectorRunner(collectors, metrics, min(config.collector_interval_s, 1.0))
    _runner.start()
    return monitor


class WardenStatLogger(StatLoggerBase):
    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.monitor = process_monitor(_make_monitor)
        self._errors = process_metrics().get(catalog.COLLECTOR_ERRORS).labels("stat_logger")

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        try:
            monitor = self.monitor
            assert monitor is not None
            quiet = vllm_compat.quiet_step(scheduler_stats, iteration_stats)
            if quiet is not None and monitor.on_quiet_step(*quiet):
                return
            running, waiting, kv = vllm_compat.scheduler_counts(scheduler_stats)
            preempted = vllm_compat.preempted_in_iteration(iteration_stats)
            finished = vllm_compat.finished_requests(iteration_stats)
            prefilled = vllm_compat.prefills_in_iteration(iteration_stats)
            monitor.on_step(running, waiting, kv, preempted, finished, prefilled)
        except Exception:
            # Never let a warden bug reach vLLM's output loop.
            self._errors.inc()

    def log_engine_initialized(self) -> None:
        log.info("warden: stat logger attached to engine %d", self.engine_index)
