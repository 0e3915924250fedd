"""Admission at saturation: predicted queue wait and latency, the saturated state, Retry-After.

Pure decisions on the measurements of exporter/saturation.py (clock values passed in, no I/O).

- ``with_live_queue``: the last step's counts brought up to this instant with the requests in
  flight now. Requests that arrive together (the clients of a batch that just finished) are
  each judged with the others already counted, not on the same stale step. The requests
  vLLM reported waiting that it starts at its next step (a free slot and KV blocks for each:
  ``startable_now``) are not a queue.
- ``predicted_wait`` (exporter/saturation.py, so the exported gauge is the same number):
  how long a request would sit in vLLM's queue: for a slot in the running batch, until its
  requests end (from ``served_ages``: how long each has run); deeper, until the queued
  requests ahead of it have each held a slot for their own length (``queue_turnover``);
  counted in whole batches where neither is known.
- ``breach``: the first configured limit a request would break (latency = wait + the service
  time forecast for the batch it will be served in, each at its 99th percentile; for the
  first half of the slots a full batch frees, the 99th percentile of their sum when that is
  within the SLO: ``slot_meets``; queue wait; queue depth), with the signal and value. A
  request that starts at once (a free slot, nothing waiting, room in the cache) on an engine
  offered less than it drains breaks none: there is no queue for a refusal to shorten.
- ``SaturationJudge``: saturated or normal for a typical request, held ``hold_s`` after it
  clears (one change per hold at most: no flapping at steady saturation).
- ``RetrySchedule``: Retry-After from the drain rate: no earlier than the queue is expected to
  be back under the limit, in whole seconds (what most clients read), each second of the
  clock holding the returns the drain finishes in it (``RETURN_UTILISATION``), none within
  half an expected completion of another, so the retries arrive spread out, no faster than
  the engine drains, instead of as one herd. Each refused request's
  place is held until it is due back (plus ``CLAIM_GRACE_S``): while the batch is full, a new
  arrival queues behind the places held; the same request coming back (its body's hash) is
  its client's return and is judged without the places behind it. It still needs the SLO
  forecast, so a client that never waits gains nothing and costs no one the SLO. Without held
  places, the clients whose requests had just finished (a closed loop sends the next at once)
  took every freed slot, and a client that honoured Retry-After was refused again more often
  than one told a constant (benchmarks/retry_after.py). Only the share of places whose
  clients are seen to come back counts: places booked for clients that never return (vLLM's
  own benchmark client, scripts that give up) held the batch from filling and pushed every
  Retry-After to its bound (benchmarks/README.md, issue #28).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import operator
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from exporter.catalog import SATURATION_STATES
from exporter.saturation import (
    SERVICE_QUANTILE,
    KvState,
    SaturationState,
    batch_drain_rate,
    deep_slots_from,
    nearest_rank,
    predicted_wait,
    requests_ahead,
    slot_meets,
)
from exporter.step_monitor import StepSnapshot
from warden.control.config import SaturationSettings

NORMAL, SATURATED = SATURATION_STATES


def startable_now(state: SaturationState, capacity: int, kv_blocks: tuple[int, int] | None) -> int:
    """How many of the requests vLLM reported waiting it starts at its next step: those with a
    free slot and, each, room for a typical request (prompt and output) in the free KV blocks.
    vLLM counts a request that arrived while a step ran as waiting until the next step starts
    it; at a light load that is most of its queue, and judged as waiting for a slot to free, a
    request arriving beside them was forecast a whole batch's wait and refused at 0.5x
    (benchmarks/README.md, run 15). A queue held back by the KV cache (the engine full of
    long sequences: most of a loaded GPU's) has no free blocks: none start. Unknown cache
    geometry or use: none (the worst case, as before). A queue vLLM's scheduler already
    passed over (``queue_held_over``: fewer started since the step before than waited
    there) is held back by something: none start, whatever the blocks say. The blocks are
    counted for a typical finished request, and a burst of long prompts after short ones
    would otherwise be taken to fit (a flood held back by a small cache was admitted)."""
    if state.waiting <= 0 or kv_blocks is None or state.kv_usage is None:
        return 0
    if state.queue_held_over:
        return 0
    if not state.tokens_per_request:
        return 0
    kv = KvState(kv_blocks[0], kv_blocks[1], state.kv_usage)
    fits = kv.free_blocks(0) // max(1, kv.blocks_for(state.tokens_per_request))
    return max(0, min(state.waiting, capacity - state.running, fits))


def with_live_queue(
    state: SaturationState,
    in_flight: int,
    capacity: int | None,
    kv_blocks: tuple[int, int] | None = None,
    served_ages: tuple[float, ...] = (),
    served_limits: tuple[int | None, ...] = (),
    queued_limits: tuple[int | None, ...] = (),
    offered_per_s: float | None = None,
) -> SaturationState:
    """``state`` with the batch and queue this instant: ``in_flight`` requests unfinished now
    (this request not among them), at most ``capacity`` (max_num_seqs) of them running, and
    the seconds each started one has been served (``served_ages``, oldest first) and the
    tokens each may generate (``served_limits``, the same order): when the batch frees its
    next slots; and the tokens each queued request may generate, in the order they arrived
    (``queued_limits``): how long each holds the slot it takes; and the requests offered to
    admission per second (``offered_per_s``, warden/control/offered_load.py): whether the
    engine is overloaded (``SaturationState.overloaded``).

    The requests vLLM reported waiting are still waiting, unless it starts them at its next
    step (``startable_now``, from ``kv_blocks``: the cache's blocks and tokens per block),
    and are not also counted running: requests that arrived since take the free slots, then
    queue. The queue is never taken below what the engine last reported (another API
    server's requests are only in that); without a capacity the state is left as measured."""
    if capacity is None or capacity <= 0:
        return state
    in_flight = max(in_flight, 0)
    waiting = state.waiting - startable_now(state, capacity, kv_blocks)
    running = min(max(in_flight - waiting, min(in_flight, state.running)), capacity)
    return dataclasses.replace(
        state,
        running=running,
        waiting=max(waiting, in_flight - running),
        capacity=capacity,
        served_ages=served_ages,
        served_limits=served_limits,
        queued_limits=queued_limits,
        offered_per_s=offered_per_s,
    )


@dataclass(frozen=True)
class BatchCounts:
    """The batch and queue a request was judged on (``with_live_queue``'s), and the batch's
    size limit (None: unknown)."""

    running: int | None = None
    waiting: int | None = None
    capacity: int | None = None


@dataclass(frozen=True)
class Breach:
    """A limit a request would break: the signal, its value, the limit, and how long the queue
    needs at the current drain rate before the same request would be within it."""

    signal: str  # a catalog.SATURATION_SIGNALS name
    value: float
    limit: float
    earliest_s: float
    # A deep slot's scales, the larger of which the latency was scaled by (1.0: none): the
    # deep-slot calibration and how much slower the engine's pace has lately turned.
    deep_factor: float = 1.0
    pace_margin: float = 1.0
    # What the value was made of (``basis``): the wait and service time forecast, the slot a
    # full batch frees for it (None: the batch had room), the batch and queue it was judged on.
    wait_s: float | None = None
    service_s: float | None = None
    slot: int | None = None
    counts: BatchCounts | None = None
    # The recent service times' quantile as measured, before the forecast scaled it to the
    # engine's step times now and the batch the request joins: a forecast far above it was
    # made by the scaling, one near it by the requests themselves.
    measured_service_s: float | None = None
    # The request's own limit on its output the service time was forecast for (None: unknown).
    output_tokens: int | None = None
    # The recent service times as scaled to the engine now, before the request's own length
    # cut or lengthened them (``forecast_service_s``; given with ``output_tokens``): a service
    # time far from it was made by the length, one near it by the scaling or the requests.
    scaled_service_s: float | None = None
    # What the scaling was: the batch the request was forecast to be served in (it joins, or
    # the largest of the last service time: ``SaturationState.serving_batch``) and how much
    # slower the engine's steps are now than when the recent requests finished (``slowdown``).
    # A light load's refusal scaled by a full batch it no longer runs, or by a turn of pace,
    # says which here (run 54: 2 refused at 0.5x, their service times scaled 1.54x).
    serving_batch: int | None = None
    slowdown: float | None = None
    # Whether it was judged under an overload, and on what: requests offered per second and
    # what the engine drains at a full batch (``SaturationState.offered_share``), and the
    # margin of the last ``PACE_REMEMBER_S`` where an overload made it the pace margin's
    # floor (``PaceRecord.reading``; None: not applied). A light load's deep slot refused on
    # a remembered margin says here which of the two rates made it an overload.
    offered_per_s: float | None = None
    full_batch_drain_per_s: float | None = None
    pace_margin_remembered: float | None = None

    def basis(self) -> dict[str, float | int]:
        """The parts of the forecast this refusal was decided on, for ``/warden/state``: a
        refusal at a light load says there whether the wait, the service time or the slot
        made it (benchmarks/overload.py reports them)."""
        counts = self.counts or BatchCounts()
        parts = {
            "wait_s": self.wait_s,
            "service_s": self.service_s,
            "measured_service_s": self.measured_service_s,
            "scaled_service_s": self.scaled_service_s,
            "serving_batch": self.serving_batch,
            "slowdown": self.slowdown,
            "output_tokens": self.output_tokens,
            "slot": self.slot,
            "running": counts.running,
            "waiting": counts.waiting,
            "capacity": counts.capacity,
            "offered_per_s": self.offered_per_s,
            "full_batch_drain_per_s": self.full_batch_drain_per_s,
            "pace_margin_remembered": self.pace_margin_remembered,
        }
        found: dict[str, float | int] = {
            key: round(value, 3) if isinstance(value, float) else value
            for key, value in parts.items()
            if value is not None
        }
        if self.deep_factor != 1.0:
            found["deep_factor"] = round(self.deep_factor, 3)
        if self.pace_margin != 1.0:
            found["pace_margin"] = round(self.pace_margin, 3)
        return found

    def message(self) -> str:
        what = {
            "latency_s": "would finish in {value:.1f} s, over the latency SLO of {limit:g} s",
            "queue_wait_s": "would wait {value:.1f} s in the queue, over the limit of {limit:g} s",
            "queue_depth": "{value:.0f} requests are waiting, at the limit of {limit:g}",
        }[self.signal]
        text = what.format(value=self.value, limit=self.limit)
        if self.pace_margin > max(self.deep_factor, 1.0):
            text += (
                f" (its forecast x{self.pace_margin:.2f}: the engine's pace at a full batch has"
                " lately turned that much slower within seconds)"
            )
        elif self.deep_factor != 1.0:
            text += (
                f" (its forecast x{self.deep_factor:.2f}: recent requests this deep in the"
                " queue ran that much later than theirs)"
            )
        return "engine saturated: a new request " + text


def breach(
    settings: SaturationSettings,
    state: SaturationState,
    kv: KvState | None = None,
    prompt_tokens: int | None = None,
    margin_blocks: int = 0,
) -> Breach | None:
    """The first configured limit this request would break, or None (admit): ``assess``'s
    verdict with the deep slots' forecast unscaled (the saturation judge's typical request;
    admission itself asks ``assess`` with the calibration)."""
    return assess(settings, state, kv, prompt_tokens, margin_blocks).breach


@dataclass(frozen=True)
class DeepAdmission:
    """A request judged for a deep slot of a full batch: its latency forecast, unscaled (what
    ``DeepSlotCalibration`` compares its real latency with), and what the forecast was scaled
    by, the calibration's ``deep_factor`` and the engine's ``pace_margin``: kept with the
    request's real latency, they show what a deep admission allowed for before a turn of the
    engine's pace (``/warden/state``, ``deep_slots.recent``)."""

    forecast_s: float
    deep_factor: float = 1.0
    pace_margin: float = 1.0
    slot: int | None = None

    @property
    def allowed_s(self) -> float:
        """The latency it was judged on: the forecast times the larger scale."""
        return self.forecast_s * max(self.deep_factor, self.pace_margin)


@dataclass(frozen=True)
class Assessment:
    """A request judged at saturation: the limit it would break (None: admit), and, for one
    that takes a deep slot of a full batch, what it was judged on there (``DeepAdmission``)."""

    breach: Breach | None
    deep: DeepAdmission | None = None


def assess(
    settings: SaturationSettings,
    state: SaturationState,
    kv: KvState | None = None,
    prompt_tokens: int | None = None,
    margin_blocks: int = 0,
    deep_factor: float = 1.0,
    output_tokens: int | None = None,
) -> Assessment:
    """The first configured limit this request would break. An idle engine admits: refusing
    would leave it idle, and with nothing finishing the forecast (its service time, its drain
    rate) would never learn that the engine is fast again. So does one with a free slot,
    nothing waiting and room in the KV cache (``starts_at_once``, no wait) that keeps up with
    what it is offered (``keeps_up``): refusing the request shortens no one's wait, its own
    included.

    The latency is the wait plus the service time, each at its 99th percentile; for the first
    slots a full batch frees, their joint percentile where the sum is over the SLO
    (``slot_meets``); for the deep slots, forecast at the full batch (``at_full_batch``),
    the sum times the larger of ``deep_factor``, how much later than that forecast recent
    requests at those slots ran (``DeepSlotCalibration``), and the engine's ``pace_margin``,
    how much slower its pace at a full batch has lately turned within seconds. The service
    time is forecast for the request's own ``output_tokens`` (its ``max_tokens``; None:
    unknown, a typical request): ``SaturationState.service_times_for``."""
    if state.running <= 0 and state.waiting <= 0:
        return Assessment(None)
    rate = batch_drain_rate(state, max(1, state.running)) or 0.0
    depth = settings.max_queue_depth
    if depth is not None and state.waiting >= depth:
        earliest = (state.waiting - depth + 1) / rate if rate else 0.0
        found = Breach("queue_depth", state.waiting, depth, earliest, counts=_counts(state))
        return Assessment(found)
    slot = full_batch_slot(state, kv, prompt_tokens, margin_blocks)
    deep = slot is not None and slot >= deep_slots_from(state.capacity)
    if deep:
        state = state.at_full_batch
    wait = predicted_wait(state, kv, prompt_tokens, margin_blocks)
    if wait is None:
        return Assessment(None)
    if wait <= 0 and state.starts_at_once and state.keeps_up:
        # A free slot, nothing waiting, room in the cache, and fewer requests offered than the
        # engine drains: it starts at the next step, delays no one's start, and the batch
        # empties behind it. Refused, it would be refused for its own length alone, and sent
        # again it would take as long (run 63: 9 refused at 0.5x so, 1-5 running, forecast
        # 1.69-1.96 s for 106-144 tokens against 1.63 s, on a minute the machine ran slow).
        # Under an overload the batch fills again behind it, and its forecast is judged (run 5).
        return Assessment(None)
    slo = settings.latency_slo_s
    own = state.service_times_for(output_tokens, prompt_tokens) if slo is not None else ()
    service_s = state.service_quantile(own) if slo is not None else None
    judged_deep = None
    if slo is not None and service_s is not None:
        latency = wait + service_s
        if deep:
            pace = state.pace_reading  # read once: it counts the last minute's changes
            pace_margin = pace.margin
            judged_deep = DeepAdmission(latency, deep_factor, pace_margin, slot)
            latency = judged_deep.allowed_s
            if latency > slo:
                found = _latency_breach(state, latency, slo, wait, service_s, slot, output_tokens)
                found = dataclasses.replace(
                    found,
                    deep_factor=deep_factor,
                    pace_margin=pace_margin,
                    pace_margin_remembered=pace.remembered,
                )
                return Assessment(found, judged_deep)
        elif latency > slo and not (slot is not None and slot_meets(state, slot, slo, own)):
            found = _latency_breach(state, latency, slo, wait, service_s, slot, output_tokens)
            return Assessment(found)
    limit = settings.max_queue_wait_s
    if limit is not None and wait > limit:
        found = Breach(
            "queue_wait_s", wait, limit, wait - limit, wait_s=wait, counts=_counts(state)
        )
        return Assessment(found, judged_deep)
    return Assessment(None, judged_deep)


def _counts(state: SaturationState) -> BatchCounts:
    return BatchCounts(state.running, state.waiting, state.capacity)


def _latency_breach(
    state: SaturationState,
    latency: float,
    slo: float,
    wait: float,
    service_s: float,
    slot: int | None,
    output_tokens: int | None = None,
) -> Breach:
    """The latency SLO broken, with the forecast's parts (``Breach.basis``); built only for a
    refusal, so an admitted request pays nothing for them."""
    return Breach(
        "latency_s",
        latency,
        slo,
        latency - slo,
        wait_s=wait,
        service_s=service_s,
        slot=slot,
        counts=_counts(state),
        measured_service_s=state.service_s,
        output_tokens=output_tokens,
        scaled_service_s=state.forecast_service_s if output_tokens is not None else None,
        serving_batch=state.serving_batch,
        slowdown=state.slowdown,
        offered_per_s=state.offered_per_s,
        full_batch_drain_per_s=(
            batch_drain_rate(state, state.capacity)
            if state.capacity and state.offered_per_s is not None
            else None
        ),
    )


def full_batch_slot(
    state: SaturationState,
    kv: KvState | None = None,
    prompt_tokens: int | None = None,
    margin_blocks: int = 0,
) -> int | None:
    """The freed slot of a full batch this request takes (0: the first; the requests ahead of
    it), None when the batch has room (or its size is unknown)."""
    if state.capacity is None or state.running < state.capacity:
        return None
    return math.ceil(requests_ahead(state, kv, prompt_tokens, margin_blocks))


# Deep-slot admissions the calibration learns from (about 8 batches' turnovers of 8), how
# many before it applies, and its bounds. Never below 1: it only refuses what the summed
# tails admitted. Let down to 0.9 (run 29), a light load's early finishes carried the floor
# into the next overload, and the one pair that began 2x there missed the SLO 8 times in its
# first 4 s (0.980 within), against 1 and 5 in the pairs that began it at 1.06 and 1.11.
# Never above 2: one stalled request does not refuse every deep slot.
DEEP_WINDOW = 64
DEEP_MIN_SAMPLES = 16
DEEP_FACTOR_MIN = 1.0
DEEP_FACTOR_MAX = 2.0
# A deep admission says how late the deep slots ran under the load of its time: it is
# forgotten this many of its own forecasts after it ended (a forecast it was admitted on is
# within the SLO, so at most this many SLOs). Kept until 64 newer ones came, a factor learned
# at 4x (1.28-1.38) still scaled a light load's bursts minutes later, where deep admissions
# are rare (run 35: a pair's 0.5x began at 4x's 1.38 and refused 11, forecasts up to 1.31 s
# against an SLO of 0.78 s). Under an overload the window refills within seconds.
DEEP_KEPT_FORECASTS = 20
# The last deep admissions shown in ``/warden/state`` with what they were judged on and took:
# a benchmark reading the state at a phase's end sees what was allowed for before a turn.
DEEP_RECENT_SHOWN = 16


class DeepSlotCalibration:
    """How much later than forecast the requests admitted into deep slots finished: the
    ``SERVICE_QUANTILE`` of their latency over the forecast they were admitted on, the last
    ``window`` of them, between ``DEEP_FACTOR_MIN`` and ``DEEP_FACTOR_MAX``; 1.0 until
    ``min_samples`` finished. Admission scales a deep slot's forecast by it (``assess``), so
    a forecast the engine overran at the batch's turnover (slower steps as half a batch
    prefills together, a burst) refuses what would run late. Each admission is forgotten
    ``DEEP_KEPT_FORECASTS`` of its forecasts after it ended: an overload's lateness is not a
    later light load's.
    Thread-safe: requests end on the event loop, ``/warden/state`` reads from elsewhere."""

    def __init__(
        self,
        window: int = DEEP_WINDOW,
        min_samples: int = DEEP_MIN_SAMPLES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_samples = min_samples
        self.clock = clock
        # (when it is forgotten, latency over forecast), in the order they ended.
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        # (when it ended, what it was judged on, its latency), newest last.
        self._recent: deque[tuple[float, DeepAdmission, float]] = deque(maxlen=DEEP_RECENT_SHOWN)
        self._factor = 1.0
        self._next_expiry = math.inf
        self._lock = threading.Lock()

    def observe(self, admission: DeepAdmission, latency_s: float) -> None:
        """A request admitted into a deep slot on ``admission`` took ``latency_s``."""
        forecast_s = admission.forecast_s
        if forecast_s <= 0 or latency_s < 0:
            return
        now = self.clock()
        with self._lock:
            self._samples.append((now + DEEP_KEPT_FORECASTS * forecast_s, latency_s / forecast_s))
            self._recent.append((now, admission, latency_s))
            self._update(now)

    def factor(self) -> float:
        now = self.clock()
        if now >= self._next_expiry:
            with self._lock:
                self._update(now)
        return self._factor

    def to_json(self) -> dict[str, Any]:
        """The factor, the samples it is learned from, and the last deep admissions, newest
        first: what each was forecast, the scales it was judged with, and what it took."""
        now = self.clock()
        with self._lock:
            self._update(now)
            recent = [
                {
                    "ended_s_ago": round(now - ended, 2),
                    "slot": admission.slot,
                    "forecast_s": round(admission.forecast_s, 3),
                    "deep_factor": round(admission.deep_factor, 3),
                    "pace_margin": round(admission.pace_margin, 3),
                    "allowed_s": round(admission.allowed_s, 3),
                    "latency_s": round(latency_s, 3),
                }
                for ended, admission, latency_s in reversed(self._recent)
            ]
            return {
                "factor": round(self._factor, 3),
                "samples": len(self._samples),
                "recent": recent,
            }

    def _update(self, now: float) -> None:
        """Forget what expired; the factor from what is left (caller holds the lock)."""
        if now >= self._next_expiry:
            kept = [sample for sample in self._samples if sample[0] > now]
            self._samples = deque(kept, maxlen=self._samples.maxlen)
        self._next_expiry = min((until for until, _ratio in self._samples), default=math.inf)
        if len(self._samples) < self.min_samples:
            self._factor = 1.0
            return
        found = nearest_rank([ratio for _until, ratio in self._samples], SERVICE_QUANTILE)
        self._factor = min(DEEP_FACTOR_MAX, max(DEEP_FACTOR_MIN, found))


@dataclass(frozen=True)
class SaturationChange:
    entered: str  # NORMAL or SATURATED
    at: float
    breach: Breach | None  # what a typical request would break (None when leaving)


class SaturationJudge:
    """Saturated while a typical request (average prompt, nothing known about it) would break a
    limit; back to normal only after ``hold_s`` without a breach."""

    def __init__(self, settings: SaturationSettings) -> None:
        self.settings = settings
        self.state = NORMAL
        self.since: float | None = None
        self.breach: Breach | None = None
        self._clear_since: float | None = None

    def update(self, state: SaturationState, now: float) -> SaturationChange | None:
        found = breach(self.settings, state) if self.settings.enabled else None
        if found is not None:
            self.breach = found
            self._clear_since = None
            if self.state == SATURATED:
                return None
            self.state, self.since = SATURATED, now
            return SaturationChange(SATURATED, now, found)
        if self.state == NORMAL:
            return None
        if self._clear_since is None:
            self._clear_since = now
        if now - self._clear_since < self.settings.hold_s:
            return None
        self.state, self.since, self.breach, self._clear_since = NORMAL, now, None, None
        return SaturationChange(NORMAL, now, None)


# How long after its due time a booked return keeps its place: the refusal's way back and the
# return's way in take time on a loaded server (with 1 s, a client that honoured
# retry-after-ms to the millisecond lost its place in the engine tests). Retry-After and
# retry-after-ms say the same whole seconds (``RetrySchedule._free_wait``).
CLAIM_GRACE_S = 2.0
# Places held at most: a flood of refusals (each booked, retry_after_max_s ahead at most)
# keeps the list, and the work of each booking, bounded; past it a refusal is told when, and
# holds no place.
MAX_PLACES_HELD = 10_000
# How many recent bookings the return share is measured over.
RETURN_WINDOW = 32
# The share of the engine's drain the returns are booked at: the whole of it. Booked at 0.8
# (13de519), the queue stopped walking up (quick check 70: 0.85 and 0.65 admitted on their
# first return at 2x and 4x), but what walked it up was the slots of misaligned grids
# (``_free_wait``) sending the returns back at 1.6-2x the drain booked. Counted in the
# seconds of the clock they come back at the drain booked, itself a cautious reading of the
# engine's (slower by the engine's turns of pace: 10-19 a second where it finished 15-20),
# and at 0.8 of that the engine ran at 0.55-0.8 of its capacity while the refused clients
# trickled back (benchmarks/README.md, quick check 72).
RETURN_UTILISATION = 1.0
# A booking's return time: what the schedule (``RetrySchedule._due``) is sorted by.
_DUE_TIME = operator.itemgetter(0)


class RetrySchedule:
    """Books a return time for each refused request and holds its place in line until then
    (see the module docstring). Thread-safe: admission runs on the event loop, tests and the
    state endpoint elsewhere.

    A booking carries the refused request's key (a hash of its body) where the route has one:
    the same request coming back is its client's return, whatever arrived in between.
    Each booking ends as a return (its request came back) or lapses (it did not, by its due
    time plus the grace), and the share of recent bookings that ended in a return
    (``return_share``) is how many of the places held new arrivals queue behind, and how
    much of its second of the schedule each booking takes. Clients that honour Retry-After
    keep their places;
    clients that never come back (``vllm bench serve``, scripts that give up) stop holding
    the engine idle and stop pushing every Retry-After to its bound. A request without a key
    is taken for the client of the earliest booking due, as nothing tells them apart.
    """

    def __init__(
        self,
        grace_s: float = CLAIM_GRACE_S,
        max_held: int = MAX_PLACES_HELD,
        window: int = RETURN_WINDOW,
        utilisation: float = RETURN_UTILISATION,
    ) -> None:
        self.grace_s = grace_s
        self.utilisation = utilisation
        self.max_held = max_held
        # (return time, request_key, the spacing it was booked with), sorted by return time.
        self._due: list[tuple[float, int | None, float]] = []
        self._booked: dict[int, float] = {}  # request_key -> its return time
        # Each second of the clock -> the spacing its bookings take (``_has_room``), kept as
        # bookings come and go: a refusal tries up to retry_after_max_s seconds, each read once.
        self._load: dict[int, float] = {}
        self._outcomes: deque[bool] = deque(maxlen=window)  # True: its client came back
        self.returned = 0  # bookings ended by their request coming back, since start
        self.lapsed = 0  # bookings whose request never came back, since start
        # The drain rate (requests/s) the last booking was spaced by: /warden/state shows it
        # beside the engine's own completions, which it should match at a full batch.
        self.last_drain_rate: float | None = None
        self._lock = threading.Lock()

    def book(
        self,
        now: float,
        earliest_s: float,
        drain_rate: float | None,
        low_s: float,
        high_s: float,
        request_key: int | None = None,
    ) -> float:
        with self._lock:
            self._expire(now)
            # A client back and refused again gives up its old place and is booked anew.
            self._take(now, request_key)
            # Only the clients that come back take room: each booking takes its share of an
            # expected completion, of the part of the drain the returns are booked at.
            spacing = self._share() / (drain_rate * self.utilisation) if drain_rate else 0.0
            self.last_drain_rate = drain_rate
            retry = self._free_wait(now, max(earliest_s, low_s, 0.0), high_s, spacing)
            if len(self._due) < self.max_held:
                due = now + retry
                bisect.insort(self._due, (due, request_key, spacing), key=_DUE_TIME)
                second = math.floor(due)
                self._load[second] = self._load.get(second, 0.0) + spacing
                if request_key is not None:
                    self._booked[request_key] = due
            return retry

    def _free_wait(self, now: float, lowest_s: float, high_s: float, spacing: float) -> float:
        """The first whole second from ``lowest_s`` (at least 1) whose return lands where the
        schedule has room; ``high_s`` where it has none within it (lock held).

        Whole seconds, because most clients read only ``Retry-After``, which says whole
        seconds (``Decision.retry_after_headers``, rounded up), and come back when it says.
        Booked a fraction of a second apart and told the rounded-up second, the clients
        refused within the same second came back within the same second, as fast as they had
        been refused (issue #28, runs 65-66). Booked at whole seconds from the moment each was
        refused, the returns fall at the moments the refusals did.

        Room is counted in each second of the clock (``_has_room``): each return booked in it
        takes its ``spacing`` (one expected completion of the drain booked for returns, at
        the drain measured when it was booked), and a second holds returns while they take
        no more than the whole second, to the nearest return. Counted so, the rate of the
        returns is the rate booked whatever the drain read at each booking. It was a grid of
        slots of one spacing each before, one return to a slot: at a drain read anew at each
        booking (12-21 a second at one 4x overload) each booking cut the clock at its own
        grid, the grids did not line up, and the returns came back at 1.6-2x the drain
        booked (25-29 a second where the engine finished 18-22): the queue they made refused
        the long requests among them again (0.77 admitted on their first return, 0.49 of
        those asking 120 tokens or more). Kept a whole spacing from every other instead,
        returns booked at the refusals' random moments filled the schedule as cars park
        along a kerb, to 0.62-0.75 of the rate (run 67). None is booked within half a
        spacing of another: a burst refused at one instant is told a second apart each, not
        sent back as one herd into the same second."""
        first = max(1, math.ceil(lowest_s - 1e-9))
        last = math.floor(high_s)
        if last < first:
            # No whole second within the bound: the bound (a sub-second one: the earliest
            # time, where there is one under it).
            return lowest_s if 0 < lowest_s < high_s else high_s
        if spacing <= 0:
            return float(first)
        for wait in range(first, last + 1):
            if self._has_room(now + wait, spacing):
                return float(wait)
        return float(last)

    def _has_room(self, at: float, spacing: float) -> bool:
        """Whether a return booked with ``spacing`` fits at ``at`` (lock held): no other
        within half a spacing (a whole one where the spacing is a second or more: then a
        second holds at most one), and room in its second of the clock for its spacing, to
        the nearest return (``_free_wait``)."""
        due = self._due
        gap = spacing if spacing >= 1.0 else spacing / 2
        near = bisect.bisect_left(due, at - gap, key=_DUE_TIME)
        if near < len(due) and due[near][0] < at + gap:
            return False
        if spacing >= 1.0:
            return True
        taken = self._load.get(math.floor(at), 0.0)
        return taken + spacing <= 1.0 + spacing / 2 + 1e-9

    def _unload(self, due: float, spacing: float) -> None:
        """A booking ended: its second gives back the room it took (lock held)."""
        second = math.floor(due)
        left = self._load.get(second, 0.0) - spacing
        if left > 1e-9:
            self._load[second] = left
        else:
            self._load.pop(second, None)

    def held(self, now: float) -> int:
        """Places held in line: bookings whose client has not come back yet."""
        with self._lock:
            self._expire(now)
            return len(self._due)

    def expected_returns(self, now: float) -> int:
        """The places held whose clients are expected back (held x ``return_share``): what a
        new arrival queues behind."""
        with self._lock:
            self._expire(now)
            return round(len(self._due) * self._share())

    def return_share(self, now: float) -> float:
        """The share of recent bookings whose client came back (1.0 before any has ended)."""
        with self._lock:
            self._expire(now)
            return self._share()

    def is_return(self, now: float, request_key: int | None) -> bool:
        """Whether the request arriving now is a refused client's return: its key is booked,
        or, without a key, a booking is due (nothing tells them apart)."""
        with self._lock:
            self._expire(now)
            if request_key is not None:
                return request_key in self._booked
            return bool(self._due) and self._due[0][0] <= now

    def due(self, now: float) -> bool:
        """A booking is due now."""
        with self._lock:
            self._expire(now)
            return bool(self._due) and self._due[0][0] <= now

    def claim(self, now: float, request_key: int | None = None) -> bool:
        """An admitted request takes its own booking, or without a key the earliest one due
        now, if there is one."""
        with self._lock:
            self._expire(now)
            return self._take(now, request_key)

    def _take(self, now: float, request_key: int | None) -> bool:
        """Ends the booking of the client back now as a return (lock held)."""
        if request_key is not None:
            due = self._booked.pop(request_key, None)
            if due is None:
                return False
            at = bisect.bisect_left(self._due, due, key=_DUE_TIME)
            while self._due[at][1] != request_key:
                at += 1
            self._unload(due, self._due[at][2])
            del self._due[at]
        elif self._due and self._due[0][0] <= now:
            # A request without a key takes the earliest booking, keyed or not.
            taken_due, taken_key, taken_spacing = self._due.pop(0)
            self._unload(taken_due, taken_spacing)
            if taken_key is not None:
                del self._booked[taken_key]
        else:
            return False
        self._outcomes.append(True)
        self.returned += 1
        return True

    def _share(self) -> float:
        if not self._outcomes:
            return 1.0
        return sum(self._outcomes) / len(self._outcomes)

    def _expire(self, now: float) -> None:
        """Drops bookings whose client never came back (gave up, or honoured a shorter wait)."""
        lapsed = bisect.bisect_left(self._due, now - self.grace_s, key=_DUE_TIME)
        for lapsed_due, request_key, lapsed_spacing in self._due[:lapsed]:
            self._unload(lapsed_due, lapsed_spacing)
            if request_key is not None:
                self._booked.pop(request_key, None)
            self._outcomes.append(False)
            self.lapsed += 1
        del self._due[:lapsed]


class SaturationSink(Protocol):
    def observe_saturation(
        self, state: SaturationState, judge: SaturationJudge, change: SaturationChange | None
    ) -> None: ...


class SaturationWatch:
    """Step listener: judges saturation once per engine step and hands the state and any change
    to the controller, which admission reads and ``/warden/state`` shows."""

    name = "saturation"

    def __init__(
        self,
        settings: SaturationSettings,
        sink: SaturationSink,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.judge = SaturationJudge(settings)
        self.sink = sink
        self.clock = clock

    def __call__(self, snap: StepSnapshot) -> None:
        change = self.judge.update(snap.saturation, self.clock())
        self.sink.observe_saturation(snap.saturation, self.judge, change)
