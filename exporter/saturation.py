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
  It is also kept by batch (``service_at``): each completion's batch is the mean running
  count while it was served, and a request is forecast the quantile of the completions served
  in a batch no larger than the one it would join. One slow request at a full batch (a burst,
  a preemption) otherwise put every forecast over a tight SLO; only a request on an idle engine
  was admitted, served alone and fast, and the slow one left the window only after 32 of them:
  the engine ran one request at a time for tens of seconds (issue #28).
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
  and the alerts show the number admission decided on. (Counting the first round slot by
  slot, from when each running request started and the slowest recent service time, was
  tried in issue #28: interleaved with this one at 2x on this machine it refused more and
  kept no more requests within the SLO, so whole batches stay.)
Pure arithmetic on numbers the stat logger hands over: no I/O, no device access.
"""

from __future__ import annotations

import bisect
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
    # (batch, service quantile of the recent completions served at that batch or a smaller
    # one), by batch: the service time a request joining a batch of that size is forecast.
    service_by_batch: tuple[tuple[float, float], ...] = ()

    def service_at(self, batch: int) -> float | None:
        """The service time a request served in a batch of ``batch`` is forecast: the
        quantile of recent completions served at that batch or a smaller one (mean running
        count while each was served), once ``SERVICE_MIN_SAMPLES`` are; else ``service_s``."""
        table = self.service_by_batch
        if not table:
            return self.service_s
        upto = bisect.bisect_right(table, batch + 0.5, key=lambda row: row[0])
        if upto < SERVICE_MIN_SAMPLES:
            return self.service_s
        return table[upto - 1][1]

    def join_batch(self) -> int:
        """The batch a request arriving now would be served in: the running ones and itself
        when a slot is free and nothing waits, else the batch it waits for."""
        free = self.capacity is None or self.running < self.capacity
        if self.waiting <= 0 and free:
            return self.running + 1
        return max(1, self.running)

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
# Completions at a batch size (or smaller) needed before their own quantile is forecast there.
SERVICE_MIN_SAMPLES = 3


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
        # (busy clock, slot clock, tokens, service seconds, batch) of recent completions; one
        # more than ``keep``: the oldest is the reference the rates are measured from.
        self._done: deque[tuple[float, float, int, float, float]] = deque(maxlen=keep + 1)
        self._preempted: deque[tuple[float, int]] = deque()
        # Busy-clock readings at which the running requests started, oldest first, and the
        # slot clock's at the same moments (how many ran meanwhile: the batch each is served in).
        self._starts: list[float] = []
        self._start_slots: list[float] = []
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
        if finished or preempted or len(self._starts) != running:
            batches = self._track_starts(running, finished, preempted)
            for (tokens, _queued, served), batch in zip(finished, batches, strict=True):
                self._done.append((self._busy, self._slot_s, tokens, served, batch))
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
            service_by_batch=summary.service_by_batch,
        )

    def _track_starts(
        self, running: int, finished: list[tuple[int, float, float]], preempted: int
    ) -> list[float]:
        """Keep the start of each running request: a finished one takes the start nearest
        its service time ago, a preempted one the youngest (vLLM preempts the request it
        scheduled last), and the count is brought to ``running`` by starts now (new requests,
        and preempted ones scheduled again, which recompute from the start). Returns the
        batch each finished request was served in: the mean running count since its start."""
        starts, slots = self._starts, self._start_slots
        batches = []
        for _tokens, _queued, served in finished:
            batch = float(max(1, running))  # its start not seen: the batch now
            if starts:
                at = bisect.bisect_left(starts, self._busy - served)
                if at == len(starts) or (
                    at > 0
                    and self._busy - served - starts[at - 1] < starts[at] - self._busy + served
                ):
                    at -= 1
                span = self._busy - starts[at]
                if span > 1e-3:
                    batch = max(1.0, (self._slot_s - slots[at]) / span)
                del starts[at], slots[at]
            batches.append(batch)
        if preempted:
            keep = max(0, len(starts) - preempted)
            del starts[keep:], slots[keep:]
        if len(starts) > running:
            del starts[running:], slots[running:]
        grow = running - len(starts)
        starts.extend([self._busy] * grow)
        slots.extend([self._slot_s] * grow)
        return batches

    def _summarize(self) -> _Completions:
        done = list(self._done)
        if len(done) < self.min_finished:
            return _Completions(len(done))
        if len(done) > self.keep:
            (reference, slot_reference, *_rest), counted = done[0], done[1:]
        else:
            reference, slot_reference, counted = 0.0, 0.0, done
        while self._preempted and self._preempted[0][0] < reference:
            self._preempted.popleft()
        return _Completions(
            count=len(counted),
            reference=reference,
            slot_reference=slot_reference,
            service_s=_quantile([entry[3] for entry in counted], SERVICE_QUANTILE),
            tokens_per_request=sum(entry[2] for entry in counted) / len(counted),
            preemptions=sum(n for _at, n in self._preempted),
            service_by_batch=_service_by_batch([(entry[4], entry[3]) for entry in counted]),
        )


def _service_by_batch(served: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """For each completion's batch (ascending), the service quantile of the completions
    served at that batch or a smaller one."""
    table = []
    seen: list[float] = []
    for batch, service in sorted(served):
        bisect.insort(seen, service)
        table.append((batch, seen[min(len(seen) - 1, math.ceil(SERVICE_QUANTILE * len(seen)) - 1)]))
    return tuple(table)


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
    service_by_batch: tuple[tuple[float, float], ...] = ()
