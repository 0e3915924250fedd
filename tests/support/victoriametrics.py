"""A real VictoriaMetrics (Debian's ``victoria-metrics``, single node) for remote_write tests."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from warden.common.ports import free_port
from warden.common.processes import ChildProcess

VICTORIA_METRICS_BINARY = "victoria-metrics"


def victoria_metrics_available() -> bool:
    return shutil.which(VICTORIA_METRICS_BINARY) is not None


@contextlib.contextmanager
def running_victoria_metrics(workdir: Path) -> Iterator[str]:
    """VictoriaMetrics until the block ends; yields its base URL (``/api/v1/write`` takes
    remote_write, ``/api/v1/query`` answers PromQL like Prometheus)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    child = ChildProcess(
        "victoria-metrics",
        [
            VICTORIA_METRICS_BINARY,
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-storageDataPath={workdir / 'data'}",
            "-retentionPeriod=1d",
            # Freshly written samples searchable at once, not after the default 30 s.
            "-search.latencyOffset=0s",
            "-loggerLevel=WARN",
        ],
        workdir / "victoria-metrics.log",
        f"{url}/health",
    )
    child.start()
    try:
        child.wait_ready(60)
        yield url
    finally:
        child.stop(timeout_s=10)
