"""Saturation, measured: how fast the engine drains its queue and how long service takes.

A saturated engine is vLLM at its most efficient (the batch full, the KV cache near 100%, a
preemption now and then); what hurts users is the time a request spends waiting in the queue
and being served. This module measures the inputs of that judgement from vLLM's own per-step
statistics, in the API process; admission (warden/control/admission.py) decides from them.

- drain rate: requests finished per second *of busy time* (time with a request running or
  waiting) over the last ``keep`` completions, so an idle night does not dilute it and a
  burst after idle is judged on the engine's real speed; it decays while requests wait and
  none finishes. Measured at a partial batch it counts the slots that stood empty, so it is
  also kept per running request (``slot_rate``: completions per busy slot-second): a batch of
  ``n`` drains about ``n`` times that. Without it, a burst that filled the batch at half load
  was judged on the half-load rate, a wait twice too long, and refused (issue #28).
- service time: the 99th percentile (``SERVICE_QUANTILE``) of end-to-end minus queue time of
  the same completions (vLLM's ``FinishedRequestStats``), so preemptions and recomputation are
  in it. Admission promises the latency SLO to each request it admits, so it forecasts with the
  service time 99 in 100 recent requests beat, not a typical one: with the 90th, a request
  admitted at the edge of the SLO missed it about once in ten (benchmarks/README.md, run 8).
- preemption (recompute) rate: preemptions per busy second and per finished request.
- ``predicted_wait``: how long a request would sit in vLLM's queue: the requests ahead of it,
  plus, when its prompt does not fit in the free KV blocks, the requests that must finish to
  free them. Slots free up in batches (requests admitted together finish together), so the
  wait is counted in whole batches of the running size, each lasting ``running / drain rate``
  (the drain rate of that batch, ``batch_drain_rate``):
  the worst case, since admission promises the SLO to the requests it admits. Preemptions are
  in it twice: preempted requests wait again in the queue, and recomputation lowers the drain
  rate. There is one prediction: admission (warden/control/saturation.py) judges with it, and
  ``warden_queue_wait_predicted_seconds`` exports it for a typical request, so the dashboard
  and the alerts show the number admission decided on.
Pure arithmetic on numbers the stat logger hands over: no I/O, no device access.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from exporter.catalog import SATURATION_STATES

NORMAL, SATURATED = SATURATION_STATES


@dataclass(frozen=True)
class SaturationState:
    """What the queue costs, as of the last step (None: not measured yet)."""

    running: int = 0
    waiting: int = 0
    drain_rate: float | None = None  # requests finished per busy second
    service_s: float | None = None  # SERVICE_QUANTILE of time served, recent completions
    tokens_per_request: float | None = None  # mean prompt + generated tokens, same
    preemptions_per_s: float = 0.0
    recompute_ratio: float = 0.0  # preemptions per finished request, same window
    capacity: int | None = None  # the batch's size limit (max_num_seqs), when known
    slot_rate: float | None = None  # requests finished per busy slot-second (per running one)

    @property
    def queue_wait_s(self) -> float | None:
        """Predicted wait in vLLM's queue for a typical request arriving now (nothing known of
        its prompt): ``predicted_wait``, the number the saturation judge decides on."""
        return predicted_wait(self)

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "running": self.running,
            "waiting": self.waiting,
            "drain_rate_per_s": _rounded(self.drain_rate),
            "service_s": _rounded(self.service_s),
            "queue_wait_s": _rounded(self.queue_wait_s),
            "tokens_per_request": _rounded(self.tokens_per_request),
            "preemptions_per_s": _rounded(self.preemptions_per_s),
            "recompute_ratio": _rounded(self.recompute_ratio),
            "capacity": self.capacity,
            "slot_rate_per_s": _rounded(self.slot_rate),
        }


@dataclass(frozen=True)
class KvState:
    """KV cache geometry and use, from vLLM's cache config and its last step."""

    total_blocks: int
    block_size: int
    usage: float  # 0..1

    def free_blocks(self, margin: int) -> int:
        return int(self.total_blocks * (1.0 - self.usage)) - margin

    def blocks_for(self, tokens: float) -> int:
        return math.ceil(tokens / self.block_size)


def predicted_wait(
    state: SaturationState,
    kv: KvState | None = None,
    prompt_tokens: int | None = None,
    margin_blocks: int = 0,
) -> float | None:
    """Seconds a request would wait before vLLM schedules it; None when the drain rate is not
    measured yet and something waits (no guess: unknown never refuses)."""
    ahead = float(state.waiting)
    if kv is not None and prompt_tokens is not None and state.tokens_per_request:
        lacking = kv.blocks_for(prompt_tokens + 1) - kv.free_blocks(margin_blocks)
        if lacking > 0:
            # Each finished request frees about its own size in blocks.
            ahead += lacking / max(1, kv.blocks_for(state.tokens_per_request))
    batch_full = state.capacity is not None and state.running >= state.capacity
    if ahead <= 0 and not batch_full:
        return 0.0
    slots = max(1, state.running)
    rate = batch_drain_rate(state, slots)
    if not rate:
        return None
    # This request needs the (ahead + 1)-th free slot; slots free a batch at a time.
    batches = math.ceil((max(ahead, 0.0) + 1) / slots)
    return batches * slots / rate


def batch_drain_rate(state: SaturationState, slots: int) -> float | None:
    """Requests a batch of ``slots`` finishes per second: the measured drain rate, or, when it
    was measured on a smaller batch, ``slots`` times the rate per running request."""
    if state.slot_rate is None:
        return state.drain_rate
    return max(state.drain_rate or 0.0, state.slot_rate * slots)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


SERVICE_QUANTILE = 0.99


def _quantile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (over 32 completions, 0.99 is the slowest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


class SaturationMeter:
    """Turns each step's counts and finished requests into a SaturationState."""

    def __init__(self, keep: int = 32, min_finished: int = 3) -> None:
        self.keep = keep
        self.min_finished = min_finished
        self._busy = 0.0  # seconds with work in the engine, since start
        self._slot_s = 0.0  # running-request seconds (a slot busy for a second counts one)
        self._last: tuple[float, int, int] | None = None  # (time, running, waiting) last step
        # (busy clock, slot clock, tokens, service seconds) of recent completions; one more
        # than ``keep``: the oldest is the reference the rates are measured from.
        self._done: deque[tuple[float, float, int, float]] = deque(maxlen=keep + 1)
        self._preempted: deque[tuple[float, int]] = deque()
        # What the recent completions add up to, kept until one finishes or is preempted:
        # most steps finish nothing, and this runs on every step.
        self._summary: _Completions | None = None

    def observe(
        self,
        now: float,
        running: int,
        waiting: int,
        finished: list[tuple[int, float, float]],
        preempted: int = 0,
    ) -> SaturationState:
        if self._last is not None and self._last[1] + self._last[2] > 0:
            elapsed = max(0.0, now - self._last[0])
            self._busy += elapsed
            self._slot_s += elapsed * self._last[1]
        self._last = (now, running, waiting)
        for tokens, _queued, served in finished:
            self._done.append((self._busy, self._slot_s, tokens, served))
        if preempted:
            self._preempted.append((self._busy, preempted))
        if finished or preempted or self._summary is None:
            self._summary = self._summarize()
        summary = self._summary
        if summary.count < self.min_finished:
            return SaturationState(running, waiting)
        # The rate counts completions after the reference point, over the busy time since.
        span = max(self._busy - summary.reference, 1e-3)
        slot_span = self._slot_s - summary.slot_reference
        return SaturationState(
            running,
            waiting,
            drain_rate=summary.count / span,
            service_s=summary.service_s,
            tokens_per_request=summary.tokens_per_request,
            preemptions_per_s=summary.preemptions / span,
            recompute_ratio=summary.preemptions / summary.count,
            slot_rate=summary.count / slot_span if slot_span > 1e-3 else None,
        )

    def _summarize(self) -> _Completions:
        done = list(self._done)
        if len(done) < self.min_finished:
            return _Completions(len(done))
        if len(done) > self.keep:
            (reference, slot_reference, _tokens, _served), counted = done[0], done[1:]
        else:
            reference, slot_reference, counted = 0.0, 0.0, done
        while self._preempted and self._preempted[0][0] < reference:
            self._preempted.popleft()
        return _Completions(
            count=len(counted),
            reference=reference,
            slot_reference=slot_reference,
            service_s=_quantile([entry[-1] for entry in counted], SERVICE_QUANTILE),
            tokens_per_request=sum(tokens for _at, _slot, tokens, _s in counted) / len(counted),
            preemptions=sum(n for _at, n in self._preempted),
        )


@dataclass(frozen=True)
class _Completions:
    """The recent completions the meter measures from: how many, the busy-clock reading the
    drain rate counts from, their service quantile and mean size, the preemptions since."""

    count: int
    reference: float = 0.0
    slot_reference: float = 0.0
    service_s: float | None = None
    tokens_per_request: float | None = None
    preemptions: int = 0
