"""Non-finite logits on CPU tensors: the detection core, both logits processors (V1 through its
BatchUpdate, V2 built by vLLM's own V2 loader), the flag progress and the middleware's wait.

No fakes but one: ``FakeCudaEvent`` stands in for ``torch.cuda.Event`` to drive the CUDA
resolver thread on a machine without a GPU (tests/gpu runs it with real events)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY, CollectorRegistry
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor.interface import MoveDirectionality
from vllm.v1.worker.gpu.sample.logits_processor import (
    LogitsContext,
    build_custom_logits_processors,
    build_custom_logits_processors_params_validator,
)

from exporter import catalog
from exporter.logits import NonFiniteLogitsProcessor
from exporter.logits_select import V1_PROCESSOR, V2_PROCESSOR
from exporter.logits_v2 import NonFiniteLogitsProcessorV2
from exporter.metrics import WardenMetrics
from exporter.nonfinite import NonFiniteDetector, RowOwner, _Pending, fault_kind
from exporter.signals import SignalBoard
from warden.engine import flag_wait

EOS = 2
NINF = float("-inf")


def nonfinite_total(kind: str) -> float:
    return REGISTRY.get_sample_value(catalog.NONFINITE_LOGITS.name, {"kind": kind}) or 0.0


class Recorder:
    def __init__(self) -> None:
        self.reports: list[tuple[int, str]] = []
        self.progress: list[tuple[int, int]] = []

    def report(self, owner: RowOwner, kind: str) -> None:
        self.reports.append((owner.key, kind))

    def publish(self, applied: int, resolved: int) -> None:
        self.progress.append((applied, resolved))


def masked_batch() -> torch.Tensor:
    """What vLLM's own masks leave: -inf over most of a row, never over all of it."""
    logits = torch.randn(4, 32)
    logits[0, :30] = NINF  # allowed_token_ids: two tokens left
    logits[1, EOS] = NINF  # min_tokens: end-of-sequence banned
    logits[2, 5:] = NINF  # a grammar bitmask
    return logits


# --- the detection core ---------------------------------------------------------------------


def test_masked_minus_inf_is_not_a_fault() -> None:
    recorder = Recorder()
    detector = NonFiniteDetector(EOS, recorder.report, recorder.publish)
    logits = masked_batch()
    before = logits.clone()
    detector.check(logits, [RowOwner(i) for i in range(4)])
    assert recorder.reports == []
    assert torch.equal(logits, before)  # untouched
    assert recorder.progress == [(1, 1)]


@pytest.mark.parametrize(
    ("poison", "kind"),
    [
        (lambda row: row.__setitem__(7, float("nan")), "nan"),
        (lambda row: row.__setitem__(7, float("inf")), "inf"),
        (lambda row: row.fill_(NINF), "masked"),  # the request's constraints left nothing
        (lambda row: (row.__setitem__(3, float("inf")), row.__setitem__(9, float("nan"))), "nan"),
        (lambda row: (row[:20].fill_(NINF), row.__setitem__(25, float("nan"))), "nan"),
    ],
    ids=["nan", "plus_inf", "all_minus_inf", "inf_and_nan", "masked_and_nan"],
)
def test_each_fault_is_reported_once_and_contained(poison, kind: str) -> None:
    recorder = Recorder()
    detector = NonFiniteDetector(EOS, recorder.report, recorder.publish)
    owners = [RowOwner(10 + i) for i in range(4)]
    for _ in range(3):  # the fault persists for three steps: still one report
        logits = masked_batch()
        poison(logits[3])
        detector.check(logits, owners)
        # Contained: the bad row can only sample end-of-sequence; the masked rows are as they were.
        assert logits[3, EOS] == 0 and torch.isneginf(logits[3, :EOS]).all()
        assert torch.isneginf(logits[3, EOS + 1 :]).all()
        assert torch.isfinite(logits[:3].amax(dim=-1)).all()
    assert recorder.reports == [(13, kind)]
    assert recorder.progress[-1] == (3, 3)


def test_rows_map_to_slots_when_a_mapping_is_given() -> None:
    recorder = Recorder()
    detector = NonFiniteDetector(EOS, recorder.report)
    owners: list[RowOwner | None] = [None] * 8
    owners[6] = RowOwner(66)
    owners[1] = RowOwner(11)
    logits = torch.zeros(2, 16)
    logits[0, 3] = float("inf")  # row 0 is slot 6
    detector.check(logits, owners, np.array([6, 1]))
    assert recorder.reports == [(66, "inf")]


def test_half_precision_logits_are_checked_too() -> None:
    recorder = Recorder()
    detector = NonFiniteDetector(EOS, recorder.report)
    for base, dtype in ((100, torch.bfloat16), (200, torch.float16)):
        logits = torch.zeros(3, 16, dtype=dtype)
        logits[1, 2] = float("nan")
        detector.check(logits, [RowOwner(base + i) for i in range(3)])
    assert recorder.reports == [(101, "nan"), (201, "nan")]


def test_fault_kind_of_a_row_maximum() -> None:
    assert fault_kind(1.5) is None and fault_kind(-1e30) is None
    assert fault_kind(float("nan")) == "nan"
    assert fault_kind(float("inf")) == "inf" and fault_kind(NINF) == "masked"


class FakeCudaEvent:
    """FAKE of torch.cuda.Event: ``synchronize`` blocks until the test says the copy is done."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def synchronize(self) -> None:
        self.done.wait(30)


def test_resolver_thread_reports_after_the_event_and_then_publishes_progress() -> None:
    """The CUDA path's host side: nothing is reported before the copy's event completes, and
    ``resolved`` moves only after the flags were reported (the middleware relies on it)."""
    recorder = Recorder()
    latencies: list[float] = []
    detector = NonFiniteDetector(EOS, recorder.report, recorder.publish, latencies.append)
    event = FakeCudaEvent()
    maxima = torch.tensor([1.0, float("nan"), 2.0])
    detector.applied = 1
    detector._queue.put(
        _Pending(1, maxima, None, [RowOwner(1), RowOwner(2), RowOwner(3)], event, time.monotonic())
    )
    detector._thread = threading.Thread(target=detector._resolve_loop, daemon=True)
    detector._thread.start()
    assert not detector.wait_resolved(0.2)
    assert recorder.reports == [] and detector.resolved == 0
    event.done.set()
    assert detector.wait_resolved(30)
    assert recorder.reports == [(2, "nan")]
    assert recorder.progress[-1] == (1, 1) and len(latencies) == 1
    detector.close()


def test_triton_containment_kernel_matches_the_torch_path() -> None:
    """The CUDA containment kernel, run by Triton's interpreter on CPU tensors."""
    script = f"""
import torch
from exporter.nonfinite import contain_rows, triton_containment
kernel = triton_containment()
assert kernel is not None, "triton missing"
logits = torch.randn(5, 3000)
logits[1, 7] = float("nan"); logits[2, 11] = float("inf"); logits[3].fill_(float("-inf"))
logits[4, :2000] = float("-inf")
expected = logits.clone()
row_max = logits.amax(dim=-1)
contain_rows(expected, ~torch.isfinite(row_max), {EOS})
kernel(logits, row_max, {EOS})
assert torch.equal(logits, expected), (logits, expected)
print("same")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "same" in done.stdout, done.stderr[-3000:]


# --- the V1 processor ----------------------------------------------------------------------


def v1_added(count: int, rid: str = "warden-r") -> BatchUpdate:
    params = [
        SamplingParams(max_tokens=8, extra_args={"warden_rid": f"{rid}{i}"}) for i in range(count)
    ]
    return BatchUpdate(
        count, removed=[], added=[(i, p, [], []) for i, p in enumerate(params)], moved=[]
    )


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SignalBoard:
    path = tmp_path / "board"
    created = SignalBoard(str(path), create=True)
    monkeypatch.setenv("WARDEN_SIGNAL_BOARD", str(path))
    return created


def test_v1_processor_flags_the_request_of_the_poisoned_row_and_not_masked_ones(
    board: SignalBoard,
) -> None:
    processor = NonFiniteLogitsProcessor(None, torch.device("cpu"), False)
    processor.update_state(v1_added(4, "warden-v1-"))
    before = nonfinite_total("nan")
    logits = masked_batch()
    processor.apply(logits)
    assert nonfinite_total("nan") == before
    # Rows 0 and 3 swap; then the request now in row 0 (warden-v1-3) goes NaN.
    processor.update_state(BatchUpdate(4, [], [], [(0, 3, MoveDirectionality.SWAP)]))
    logits = masked_batch()
    logits[0, 4] = float("nan")
    processor.apply(logits)
    assert nonfinite_total("nan") == before + 1
    assert board.flagged("warden-v1-3") == "nan"
    assert board.flagged("warden-v1-0") is None
    assert board.progress()[0] == (2, 2)


def test_v1_processor_unidirectional_move_and_removal(board: SignalBoard) -> None:
    processor = NonFiniteLogitsProcessor(None, torch.device("cpu"), False)
    processor.update_state(v1_added(3, "warden-mv-"))
    # Row 0 finished; row 2 moves into its place (vLLM condenses the batch).
    processor.update_state(BatchUpdate(2, [0], [], [(2, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    logits = torch.zeros(2, 8)
    logits[0, 1] = float("inf")
    processor.apply(logits)
    assert board.flagged("warden-mv-2") == "inf"
    assert board.flagged("warden-mv-0") is None


def test_engine_error_switch_raises_a_classified_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.errors import classify_exception

    params = SamplingParams(max_tokens=8, extra_args={"warden_raise": "cuda_driver"})
    monkeypatch.delenv("WARDEN_TEST_ENGINE_ERROR", raising=False)
    off = NonFiniteLogitsProcessor(None, torch.device("cpu"), False)
    off.update_state(BatchUpdate(1, [], [(0, params, [], [])], []))
    off.apply(torch.zeros(1, 8))  # the switch is off: nothing raised
    monkeypatch.setenv("WARDEN_TEST_ENGINE_ERROR", "1")
    on = NonFiniteLogitsProcessor(None, torch.device("cpu"), False)
    on.update_state(BatchUpdate(1, [], [(0, params, [], [])], []))
    with pytest.raises(RuntimeError) as raised:
        on.apply(torch.zeros(1, 8))
    assert classify_exception(raised.value) == "cuda_driver"


# --- the V2 processor, through vLLM's own V2 loader --------------------------------------------


def v2_request_states(max_num_reqs: int = 8) -> types.SimpleNamespace:
    """The model runner's RequestState fields V2's loader hands to processors (CPU tensors)."""
    return types.SimpleNamespace(
        device=torch.device("cpu"),
        max_num_reqs=max_num_reqs,
        vocab_size=32,
        all_token_ids=None,
        prompt_len=None,
        prefill_len=None,
        total_len=None,
    )


def v2_context(slots: list[int]) -> LogitsContext:
    rows = len(slots)
    mapping = torch.tensor(slots, dtype=torch.int32)
    return LogitsContext(
        expanded_idx_mapping=mapping,
        idx_mapping=mapping,
        idx_mapping_np=np.array(slots, dtype=np.int32),
        expanded_local_pos=torch.zeros(rows, dtype=torch.int32),
        input_ids=torch.zeros(rows, dtype=torch.int32),
        pos=torch.zeros(rows, dtype=torch.int64),
        seq_lens_upper_bound_np=np.ones(rows, dtype=np.int32),
    )


def test_v2_loader_builds_warden_v2_processor_and_refuses_the_v1_one() -> None:
    (built,) = build_custom_logits_processors(None, v2_request_states(), False, [V2_PROCESSOR])  # type: ignore[arg-type]
    assert isinstance(built, NonFiniteLogitsProcessorV2)
    with pytest.raises(ValueError, match="not a subclass"):
        build_custom_logits_processors(None, v2_request_states(), False, [V1_PROCESSOR])  # type: ignore[arg-type]
    # The API server's start-up check under V2 (input_processor.py) accepts it and every request.
    validate = build_custom_logits_processors_params_validator([V2_PROCESSOR])
    validate(SamplingParams(max_tokens=4, extra_args={"warden_rid": "x"}))


def test_v2_processor_flags_by_slot_and_sees_every_request(board: SignalBoard) -> None:
    (processor,) = build_custom_logits_processors(None, v2_request_states(), False, [V2_PROCESSOR])  # type: ignore[arg-type]
    for slot in (5, 1, 3):
        answer = processor.add_request(
            slot, SamplingParams(extra_args={"warden_rid": f"warden-v2-{slot}"})
        )
        assert answer is True  # V2 skips processing a batch nobody asked for
    before = nonfinite_total("inf")
    logits = masked_batch()[:3]
    logits[2, 7] = float("inf")  # batch position 2 is slot 3
    processor.apply(logits, v2_context([5, 1, 3]))
    assert nonfinite_total("inf") == before + 1
    assert board.flagged("warden-v2-3") == "inf"
    assert board.flagged("warden-v2-5") is None and board.flagged("warden-v2-1") is None
    # Slot 3 is recycled for a new request: its state starts fresh.
    processor.add_request(3, SamplingParams(extra_args={"warden_rid": "warden-v2-new"}))
    logits = torch.zeros(1, 32)
    logits[0, 9] = float("nan")
    processor.apply(logits, v2_context([3]))
    assert board.flagged("warden-v2-new") == "nan"


def test_v2_processor_asks_for_no_copy_when_told_not_to_check_every_step(
    board: SignalBoard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WARDEN_LOGITS_CHECK_EVERY_STEP=0: plain requests ask V2 for nothing (no float32 copy
    on a batch nobody else processes); a request with a test switch still asks; and a batch
    vLLM processes anyway is checked in every row, declined ones included."""
    monkeypatch.setenv("WARDEN_LOGITS_CHECK_EVERY_STEP", "0")
    monkeypatch.setenv("WARDEN_TEST_INJECT_NONFINITE", "1")
    (processor,) = build_custom_logits_processors(None, v2_request_states(), False, [V2_PROCESSOR])  # type: ignore[arg-type]
    plain = SamplingParams(extra_args={"warden_rid": "warden-plain"})
    assert processor.add_request(2, plain) is False
    switched = SamplingParams(extra_args={"warden_rid": "warden-switch", "warden_inject": "nan"})
    assert processor.add_request(6, switched) is True
    logits = torch.zeros(1, 32)
    logits[0, 4] = float("nan")
    processor.apply(logits, v2_context([2]))
    assert board.flagged("warden-plain") == "nan"


def test_v2_processor_maps_speculative_rows_through_the_expanded_mapping(
    board: SignalBoard,
) -> None:
    (processor,) = build_custom_logits_processors(None, v2_request_states(), False, [V2_PROCESSOR])  # type: ignore[arg-type]
    processor.add_request(0, SamplingParams(extra_args={"warden_rid": "warden-spec-0"}))
    processor.add_request(4, SamplingParams(extra_args={"warden_rid": "warden-spec-4"}))
    context = v2_context([0, 4])
    expanded = torch.tensor([0, 0, 4, 4, 4], dtype=torch.int32)  # draft tokens: several rows each
    context = LogitsContext(**{**context.__dict__, "expanded_idx_mapping": expanded})
    logits = torch.zeros(5, 32)
    logits[3, 1] = float("inf")
    processor.apply(logits, context)
    assert board.flagged("warden-spec-4") == "inf" and board.flagged("warden-spec-0") is None


# --- the middleware's bounded wait -------------------------------------------------------------


def waits(registry: CollectorRegistry | None = None) -> Any:
    """The wait histogram on a registry of its own."""
    return WardenMetrics(registry or CollectorRegistry()).get(catalog.NONFINITE_FLAG_WAIT)


def test_flag_wait_returns_at_once_when_every_step_is_resolved(board: SignalBoard) -> None:
    registry = CollectorRegistry()
    waited = waits(registry)
    board.publish_progress(0, 7, 7)
    assert asyncio.run(flag_wait.nonfinite_flag(board, "warden-none", 5.0, waited)) is None
    board.flag_request("warden-bad", "nan")
    assert asyncio.run(flag_wait.nonfinite_flag(board, "warden-bad", 5.0, waited)) == "nan"
    assert registry.get_sample_value(f"{catalog.NONFINITE_FLAG_WAIT.name}_count") == 2


def test_flag_wait_holds_the_response_until_the_pending_step_is_resolved(
    board: SignalBoard,
) -> None:
    """A GPU engine: step 8 was applied but its flags are still on their way. The flag arrives,
    then the step counts as resolved: the response must be reported poisoned, not let out."""
    board.publish_progress(0, 8, 7)
    released = threading.Event()

    def resolver() -> None:
        released.wait(30)
        board.flag_request("warden-late", "inf")
        board.publish_progress(0, 8, 8)

    thread = threading.Thread(target=resolver)
    thread.start()

    async def ask() -> str | None:
        task = asyncio.create_task(flag_wait.nonfinite_flag(board, "warden-late", 60.0, waits()))
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for step 8
        released.set()
        return await task

    assert asyncio.run(ask()) == "inf"
    thread.join()


def test_flag_wait_is_bounded_when_flags_never_come(board: SignalBoard) -> None:
    board.publish_progress(0, 9, 3)  # a device that stopped answering
    started = time.monotonic()
    assert asyncio.run(flag_wait.nonfinite_flag(board, "warden-stuck", 0.05, waits())) is None
    assert time.monotonic() - started >= 0.05


# --- the tiny model's real NaN source -----------------------------------------------------------


def test_tiny_nan_model_poisons_only_prompts_with_its_token_and_keeps_the_cache_finite(
    tmp_path: Path,
) -> None:
    """Forward passes of the saved weights (transformers, CPU): NaN logits wherever the token
    sits in the prompt, finite logits without it, finite keys and values either way (a NaN KV
    block would poison the next request that reuses it), and the token never the likeliest."""
    from transformers import AutoModelForCausalLM

    from warden.common.tinymodel import build_tiny_model, nan_token_of

    folder = build_tiny_model(tmp_path / "nan", seed=0, nan_token=5)
    assert nan_token_of(folder) == 5
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompt = [300 + i for i in range(12)]
    with torch.no_grad():
        healthy = model(torch.tensor([prompt])).logits[0]
        assert torch.isfinite(healthy).all()
        assert (healthy.argmax(dim=-1) != 5).all() and (healthy[:, 5] < healthy.max() - 50).all()
        for where in (0, 6, 12):
            out = model(torch.tensor([[*prompt[:where], 5, *prompt[where:]]]), use_cache=True)
            assert torch.isnan(out.logits[0, -1]).all()
            for layer in out.past_key_values.layers:
                assert torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all()
    with pytest.raises(ValueError, match="not a token id"):
        build_tiny_model(tmp_path / "bad", nan_token=10**6)
