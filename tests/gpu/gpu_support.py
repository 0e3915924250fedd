"""What every GPU acceptance test shares: the skip rule, the device, timing helpers.

Only torch, nvidia-ml-py, prometheus-client, pytest and this checkout are needed (no vLLM, no
network): the lent GPU machines have exactly that.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest
import torch


def why_no_gpu() -> str | None:
    if not torch.cuda.is_available():
        return (
            "needs an NVIDIA GPU and a CUDA build of PyTorch (torch "
            f"{torch.__version__}: torch.cuda.is_available() is False here); run "
            "`bash scripts/gpu-check.sh` or `pytest -m gpu tests/gpu` on a GPU machine"
        )
    return None


# Every module here: ``pytestmark = GPU``. Skipped with the reason above, never passed silently.
GPU = [pytest.mark.gpu, pytest.mark.skipif(why_no_gpu() is not None, reason=why_no_gpu() or "")]
GIB = 1 << 30


def gpu_time_us(fn: Callable[[], object], iterations: int, warmup: int = 10) -> float:
    """Median device time of ``fn`` per call (CUDA events around each call), microseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0)
    return round(statistics.median(samples), 2)


def host_time_us(fn: Callable[[], object], iterations: int, warmup: int = 10) -> float:
    """Median host time of ``fn`` per call (what the step's Python thread spends), microseconds.
    The device is synchronized between calls, so queued work never stalls the next call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(samples), 2)


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50": round(pick(0.5), 6), "p99": round(pick(0.99), 6)}
