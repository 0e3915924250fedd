"""Warden's non-finite logits detection on CUDA tensors: the detection core both logits processors
share (V1 passes rows, V2 passes slots through a device mapping), with real CUDA events, pinned
copies and the resolver thread. No host sync on the step path (checked with PyTorch's sync debug
mode), both containment paths (Triton kernel, torch fallback), the flag latency, and the cost
per step at batch 8/64/256 x vocabulary 32k/128k in bf16 and fp32."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from exporter import nonfinite
from exporter.nonfinite import NonFiniteDetector, RowOwner
from tests.gpu.gpu_support import GPU, gpu_time_us, host_time_us, quantiles

pytestmark = GPU

EOS = 2
NINF = float("-inf")
VOCABS = (32_000, 128_256)
BATCHES = (8, 64, 256)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class Reports:
    def __init__(self) -> None:
        self.seen: dict[int, str] = {}
        self.progress: tuple[int, int] = (0, 0)
        self.latencies: list[float] = []
        self.lock = threading.Lock()

    def report(self, owner: RowOwner, kind: str) -> None:
        with self.lock:
            self.seen[owner.key] = kind

    def publish(self, applied: int, resolved: int) -> None:
        self.progress = (applied, resolved)


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def detector(reports: Reports) -> Iterator[NonFiniteDetector]:
    made = NonFiniteDetector(EOS, reports.report, reports.publish, reports.latencies.append)
    yield made
    made.close()


@pytest.fixture(params=["triton", "torch"])
def containment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both device containment paths: the Triton kernel (where Triton works) and the fallback."""
    if request.param == "triton":
        if nonfinite.triton_containment() is None:
            pytest.skip("Triton is not importable here: only the torch fallback can run")
    else:
        monkeypatch.setattr(nonfinite, "_triton_checked", True)
        monkeypatch.setattr(nonfinite, "_triton_kernel", None)
    return str(request.param)


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Any synchronizing CUDA call inside raises (PyTorch's sync debug mode)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def batch(rows: int, vocab: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    logits = torch.randn(rows, vocab, device="cuda", dtype=dtype)
    logits[0, : vocab - 3] = NINF  # allowed_token_ids
    logits[1, EOS] = NINF  # min_tokens
    logits[2, 100:] = NINF  # a grammar bitmask
    return logits


def test_masked_rows_are_not_faults_and_nothing_syncs(
    detector: NonFiniteDetector, reports: Reports, containment: str
) -> None:
    owners = [RowOwner(i) for i in range(8)]
    logits = batch(8, 32_000)
    detector.check(logits.clone(), owners)  # warm-up (Triton compiles on first use)
    assert detector.wait_resolved(30)
    before = logits.clone()
    with no_host_sync():
        detector.check(logits, owners)
    assert detector.wait_resolved(30)
    assert reports.seen == {}
    assert torch.equal(logits, before)
    assert reports.progress == (2, 2)


def test_faulty_rows_are_reported_once_and_contained_on_the_device(
    detector: NonFiniteDetector, reports: Reports, containment: str
) -> None:
    owners = [RowOwner(100 + i) for i in range(8)]
    for step in range(3):
        logits = batch(8, 32_000)
        logits[3, 7] = float("nan")
        logits[5, 11] = float("inf")
        logits[6].fill_(NINF)
        healthy = logits[[0, 1, 2, 4, 7]].clone()
        with no_host_sync():
            detector.check(logits, owners)
        assert detector.wait_resolved(30), f"step {step} never resolved"
        for row in (3, 5, 6):
            assert logits[row, EOS].item() == 0
            assert torch.isneginf(torch.cat((logits[row, :EOS], logits[row, EOS + 1 :]))).all()
        assert torch.equal(logits[[0, 1, 2, 4, 7]], healthy)
    assert reports.seen == {103: "nan", 105: "inf", 106: "masked"}


def test_v2_rows_map_to_slots_through_a_device_mapping(
    detector: NonFiniteDetector, reports: Reports
) -> None:
    owners: list[RowOwner | None] = [None] * 16
    owners[9], owners[4] = RowOwner(9), RowOwner(4)
    expanded = torch.tensor([9, 9, 4, 4, 4], dtype=torch.int32, device="cuda")  # draft tokens
    logits = torch.randn(5, 32_000, device="cuda")
    logits[3, 5] = float("inf")
    with no_host_sync():
        detector.check(logits, owners, expanded)
    assert detector.wait_resolved(30)
    assert reports.seen == {4: "inf"}


def test_flag_latency_on_the_event_path(
    detector: NonFiniteDetector, reports: Reports, gpu_report: dict[str, Any]
) -> None:
    """Steps at batch 64 x 128k, a new request poisoned every 10th: how long after a step's
    check its flags are resolved on the host (what the middleware's wait covers)."""
    owners = [RowOwner(i) for i in range(64)]
    logits = torch.randn(64, 128_256, device="cuda")
    weight = torch.randn(4096, 4096, device="cuda")
    poisoned = 0
    for step in range(200):
        weight @ weight  # a model step's worth of device work before the logits
        step_logits = logits.clone()
        if step % 10 == 0:
            owners[step % 64] = RowOwner(1000 + step)
            step_logits[step % 64, 3] = float("nan")
            poisoned += 1
        detector.check(step_logits, owners)
    assert detector.wait_resolved(60)
    assert len(reports.seen) == poisoned
    assert len(reports.latencies) == 200
    gpu_report["flag_latency_s"] = quantiles(reports.latencies)


def measure_shape(dtype: torch.dtype, vocab: int, rows: int) -> dict[str, float]:
    """Device and host time of one ``check`` (no fault) at one shape, against one pass over the
    same logits for scale; checks on the way that nothing is reported on finite logits and a
    NaN row is."""
    reports = Reports()
    detector = NonFiniteDetector(EOS, reports.report, reports.publish)
    owners = [RowOwner(i) for i in range(rows)]
    logits = torch.randn(rows, vocab, device="cuda", dtype=dtype)
    iterations = 30 if rows * vocab > 10_000_000 else 100
    figures = {
        "check_gpu_us": gpu_time_us(lambda: detector.check(logits, owners), iterations),
        "check_host_us": host_time_us(lambda: detector.check(logits, owners), iterations),
        "amax_gpu_us": gpu_time_us(lambda: logits.amax(dim=-1), iterations),
        "one_copy_gpu_us": gpu_time_us(lambda: logits.clone(), iterations),
        # What Model Runner V2 does before any processor runs (benchmarks/logits_copy.py).
        "v2_fp32_copy_gpu_us": gpu_time_us(
            lambda: torch.empty_like(logits, dtype=torch.float32).copy_(logits), iterations
        ),
    }
    assert detector.wait_resolved(60)
    assert reports.seen == {}
    logits[rows // 2, 1] = float("nan")
    detector.check(logits, owners)
    assert detector.wait_resolved(60)
    assert reports.seen == {rows // 2: "nan"}
    detector.close()
    return figures


def test_cost_per_step(gpu_report: dict[str, Any]) -> None:
    """Figures only for speed (judged in benchmarks/README.md, not asserted here)."""
    table = []
    for dtype_name, dtype in DTYPES.items():
        for vocab in VOCABS:
            for rows in BATCHES:
                figures = measure_shape(dtype, vocab, rows)
                table.append({"dtype": dtype_name, "batch": rows, "vocab": vocab, **figures})
    gpu_report["cost_per_step"] = table
    gpu_report["containment"] = (
        "triton" if nonfinite.triton_containment() is not None else "torch fallback"
    )


def test_resolver_thread_does_not_hold_the_step_thread(gpu_report: dict[str, Any]) -> None:
    """Host time of 500 checks in a row without waiting for the device: the step thread only
    queues work; the resolver thread sleeps on the events (blocking sync, GIL released)."""
    reports = Reports()
    detector = NonFiniteDetector(EOS, reports.report, reports.publish)
    owners = [RowOwner(i) for i in range(64)]
    logits = torch.randn(64, 32_000, device="cuda")
    detector.check(logits, owners)
    assert detector.wait_resolved(30)
    started = time.perf_counter()
    for _ in range(500):
        detector.check(logits, owners)
    queued_s = time.perf_counter() - started
    assert detector.wait_resolved(60)
    detector.close()
    assert reports.seen == {}
    gpu_report["host_us_per_check_back_to_back"] = round(queued_s / 500 * 1e6, 2)
