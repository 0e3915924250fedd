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
  Each recent service time is scaled down to the batch the new request will be served in
  when that batch is smaller than the one the request was served in (its mean running count):
  by the ratio of the seconds a step takes at the two sizes now (``StepTimes``). The batch it
  will be served in is the largest the engine ran within the last service time
  (``BatchPeaks``), or the one it joins if larger. Unscaled, after a burst at a full batch a
  light load was forecast the burst's service time, refused whenever anything ran, and,
  refusing, finished too few requests to learn otherwise (benchmarks/README.md, run 13). The
  batch it joins alone is too small under overload: the batch fills before the request ends
  (run 5). Scaled up only when the request joins a batch the engine has held for half a
  service time and whose steps take measurably longer (``SLOWDOWN_NOISE``) than those of the
  batch a recent request was served in: at an overload's onset, the batch full behind a
  queue after a load at capacity (run 20), not a light load's moment of queue (run 21).
  Under steady load the forecast is the measured quantile itself.
- a request's own length: service time is mostly decoding, a token a step, so a request is
  forecast for the tokens it asks for (its ``max_tokens``, at most as many as the longest
  recent request generated), from vLLM's own count of each recent request's tokens and decode
  time (``service_times_for``): each recent service time is cut to that many tokens where the
  recent request generated more, and where it generated fewer, the tokens it lacks are added
  at the engine's pace, the recent requests' decode time per token over all their tokens
  (``decode_pace``), where it was served at a batch no larger than the one the new request
  will be served in (from a larger one, its time as it was). Forecast the longest recent
  request's time, short requests the SLO had room for were refused with the long ones (run
  44), and long ones outran it (run 45: 23 of the 32 late at 4x asked for 110-144 tokens);
  each recent request's own pace stretched to a long request's tokens, a short one's slow
  pace (a few tokens among a burst's prefills) set the forecast, and a light load after an
  overload was refused (run 46: 21 at 0.5x). A recent request the model stopped before its
  limit (vLLM's finish reason: an end-of-sequence token, a stop string) is taken to no
  more tokens than it generated: where requests end on their own, a limit is not a length
  (``RecentOutput.tokens_like``).
- slowdown: when the engine's steps take measurably longer now than when the recent
  requests finished (``SaturationState.slowdown``), the service forecast is that many times
  longer and the drain rate that many times lower, from the step times, within about 20
  steps: the completions alone follow a slower engine only a batch later (run 18). For a
  request that takes a free slot with nothing waiting (``starts_at_once``), only a slowdown
  that has lasted about 100 steps counts: it delays no one, and the last 20 steps of a
  shared machine read 1.3-1.5x slower for a moment (run 58: 25 refused at 0.5x). While the
  engine keeps up with what it is offered (``keeps_up``), admission does not refuse such a
  request at all (warden/control/saturation.py, ``assess``). A recent
  request served at a batch size the engine has not stepped since (a light load after an
  overload) is scaled once, by the serving batch's step now over its own then or by the
  slowdown, whichever is larger (``_unstepped_scale``), not by both.
- preemption (recompute) rate: preemptions per busy second and per finished request.
- ``predicted_wait``: how long a request would sit in vLLM's queue: the requests ahead of it,
  plus, when its prompt does not fit in the free KV blocks, the requests that must finish to
  free them. Slots free up in batches (requests admitted together finish together), so the
  wait is counted in whole batches of the running size, each lasting ``running / drain rate``
  (the drain rate of that batch, ``batch_drain_rate``): the worst case, since admission
  promises the SLO to the requests it admits. A slot within the running batch frees sooner,
  as its requests end, from how long each has run (``served_ages``, ``_slot_freed_by``)
  and the tokens each may generate (``served_limits``: each is forecast its own length,
  ``running_times``); for the first half of those slots, admission also judges the wait
  and the request's own service time together, their sum's 99th percentile
  (``slot_meets``). Deeper, each queued request takes the slot that frees first and holds it
  for its own length (``queued_limits``, ``queue_turnover``), where the running requests'
  ends are known. A request that deep (``deep_slots_from``) is forecast at the full batch,
  which the requests ahead of it keep full (``at_full_batch``).
- pace margin: how much slower the engine's pace at a full batch has lately turned from one
  couple of seconds to the next, at the 95th percentile over the last minute (``PaceRecord``,
  ``SaturationState.pace_margin``): admission scales a deep slot's forecast by it, since a
  request admitted there cannot follow a slowdown that comes after it was admitted. At an
  overload's onset the last minute holds too few changes to tell: while requests are offered
  faster than the engine drains them (``SaturationState.overloaded``), the margin of the last
  ten minutes is its floor, and a light load's burst is not scaled by an earlier overload.
  Preemptions are in it twice: preempted requests wait again in the queue, and recomputation
  lowers the drain rate. There is one prediction: admission (warden/control/saturation.py)
  judges with it, and ``warden_queue_wait_predicted_seconds`` exports it for a typical
  request, so the dashboard and the alerts show the number admission decided on.
Pure arithmetic on numbers the stat logger hands over: no I/O, no device access.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import math
import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

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
    # (seconds served, the mean batch it was served in) of the same completions.
    recent_service: tuple[tuple[float, int], ...] = ()
    # Seconds a step took at that batch when each of them finished (None: not timed yet).
    finish_step_s: tuple[float | None, ...] = ()
    # What each of the same completions generated and how long it decoded, where vLLM said
    # (empty: not known; ``service_times_for``).
    recent_output: tuple[RecentOutput, ...] = ()
    # Seconds per engine step by batch size, the meter's own (live: the engine's speed now).
    step_times: StepTimes | None = field(default=None, hash=False)
    # The meter's record of recent batch sizes (live), and when this state was measured.
    batch_peaks: BatchPeaks | None = field(default=None, hash=False, compare=False)
    # The meter's record of the engine's pace at a full batch (live: ``pace_margin``).
    pace_record: PaceRecord | None = field(default=None, hash=False, compare=False)
    measured_at: float = 0.0
    kv_usage: float | None = None  # the KV cache's use (0..1) at the step, when known
    # Requests waited at the step observed before and vLLM started fewer than those since:
    # its scheduler passed them over (no KV blocks, no token budget), they are held back.
    queue_held_over: bool = False
    # The mean batch over the last ``SUSTAINED_SHARE`` of the service time (0: not measured).
    sustained_batch: int = 0
    # Seconds each running request has been served, oldest first (read live by admission, and
    # by the step monitor where a saturation limit is set; empty: unknown, and each slot is
    # taken to free a whole batch later: ``predicted_wait``).
    served_ages: tuple[float, ...] = ()
    # The most tokens each of them may generate (its max_tokens; None: up to the context), in
    # the same order; empty: unknown, and each is taken to be a typical recent request
    # (``running_times``).
    served_limits: tuple[int | None, ...] = ()
    # The most tokens each request not scheduled yet may generate, in the order they arrived
    # (read with ``served_ages``; empty: unknown, each a typical recent request): how long
    # each holds the slot it takes (``queue_turnover``).
    queued_limits: tuple[int | None, ...] = ()
    # Requests offered to admission per second, admitted or refused: the larger of its last
    # second's and two seconds' rates, each counted less its Poisson deviation, so a light
    # load's chance bunching is not read as an overload (admission's, ``with_live_queue``,
    # from warden/control/offered_load.py; None: not counted): whether the engine is offered
    # more than it drains (``overloaded``, ``keeps_up``).
    offered_per_s: float | None = None

    @property
    def recent_peak(self) -> int:
        """The largest batch the engine ran within the last service time (measured, seconds)."""
        if self.batch_peaks is None:
            return 0
        return self.batch_peaks.peak(self.measured_at, self.service_s or 0.0)

    @property
    def joining_batch(self) -> int:
        """The batch a request arriving now joins: the next slot, or a full batch when it
        has to queue."""
        if self.capacity is not None and (self.waiting > 0 or self.running >= self.capacity):
            return self.capacity
        return self.running + 1

    @functools.cached_property
    def serving_batch(self) -> int:
        """The batch a request arriving now will be served in: the one it joins, or the
        largest of the last service time if larger (under load the batch fills again before
        the request ends), never above the capacity. Worked out once per state: the scaling,
        the lengthening and the pace all read it, and a state lives one step."""
        batch = max(self.joining_batch, self.recent_peak)
        return min(batch, self.capacity) if self.capacity is not None else batch

    @property
    def forecast_service_s(self) -> float | None:
        """Service time forecast for a request arriving now: the ``SERVICE_QUANTILE`` of the
        recent service times, each scaled down to the batch it will be served in when that is
        smaller than the one it was served in; the measured quantile where nothing scales."""
        times = self.forecast_service_times
        if times:
            return nearest_rank(times, SERVICE_QUANTILE)
        if self.service_s is None or self.step_times is None or not self.recent_service:
            return self.service_s
        return self.service_s * self.slowdown  # the serving batch's steps are not timed yet

    @functools.cached_property
    def forecast_service_times(self) -> tuple[float, ...]:
        """The recent service times as a request arriving now is forecast to take them (each
        scaled as ``forecast_service_s`` says, and by how much slower the engine's steps are
        now than when it finished: its own ``step_ratios``, else ``_unstepped_scale``),
        sorted; empty where they cannot be scaled (no step timed at the batch it will be
        served in). Worked out once per state: the latency forecast and the wait for a slot
        both read it, and a state lives one step (admission's live copies, one decision)."""
        return tuple(sorted(self._scaled_service))

    def service_times_for(
        self, output_tokens: int | None, prompt_tokens: int | None = None
    ) -> tuple[float, ...]:
        """The service times a request arriving now is forecast to take, sorted: each recent
        request's (``forecast_service_times``, as scaled to the engine now) taken to as many
        tokens as this one may generate (``RecentOutput.time_for``): its ``output_tokens``
        (its ``max_tokens``; None: unknown, up to the context), at most as many as the longest
        recent request generated. Cut, the part that is not decoding (the prefill above all)
        is taken as long as the recent request's, longer in proportion where this one's prompt
        is known to be longer (``prompt_tokens``); lengthened, the tokens the recent request
        did not generate are added at the engine's ``decode_pace``. The recent times as they
        are where vLLM did not say what they generated.

        Service time is mostly decoding, one token a step, so a request asking for 48 tokens
        is done in about a third of the steps of one that generated 144. Judged on the recent
        requests' 99th percentile alone, the short ones were forecast the longest ones' time
        and refused with it (run 44: at 4x goodput 0.60-0.80 of capacity), and the long ones
        were promised it, late when a shorter request had run slower than the longest (run
        45: 0.976 of the admitted within the SLO at 4x, most of the late ones long).

        The tokens a recent request lacks are added at the pace of all recent tokens, not at
        its own: a short request's pace is that of a few steps, slow where a burst's prefills
        fell among them, and stretched to a long request's length (run 46, up to twice its
        own) it set the forecast, refusing 21 requests at 0.5x after an overload with nothing
        waiting, forecast 0.86-1.03 s where the slowest recent request took 0.54 s. A long
        request's own pace is that of many steps, about the engine's mean. At most the longest
        recent request's length: a limit is an upper bound, and most requests stop before it
        (a chat's ``max_tokens`` of 4096 is not forecast as 4096 tokens)."""
        times = self.forecast_service_times
        output = self.recent_output
        if not times or len(output) != len(self.recent_service):
            return times
        shared = self._shared_forecasts.times
        key = (output_tokens, prompt_tokens)
        found = shared.get(key)
        if found is None:
            found = shared[key] = self._service_times_for(times, output_tokens, prompt_tokens)
        return found

    def _service_times_for(
        self, times: tuple[float, ...], output_tokens: int | None, prompt_tokens: int | None
    ) -> tuple[float, ...]:
        output = self.recent_output
        longest = max(recent.generated for recent in output)
        tokens = longest if output_tokens is None else min(output_tokens, longest)
        pace = self.decode_pace
        serving = self.serving_batch
        taken = [
            recent.time_for(
                time, recent.tokens_like(tokens), pace if batch <= serving else None, prompt_tokens
            )
            for time, recent, (_served, batch) in zip(
                self._scaled_service, output, self.recent_service, strict=True
            )
        ]
        if taken == list(self._scaled_service):
            return times
        return tuple(sorted(taken))

    @functools.cached_property
    def decode_pace(self) -> float | None:
        """Seconds per generated token at the engine's pace now: the decode time of the
        recent requests served at a batch no larger than the one a request arriving now will
        be served in (their scaled service time's decoding share), over the tokens they
        decoded after the first, all together; None where none decoded two tokens. The pace
        of many steps, so that one request's few slow ones do not set it
        (``service_times_for``). A request served in a larger batch is left out, and its time
        is not lengthened: its steps carried more prefills than this one's will, which the
        step times' ratio does not scale away (issue #28's quick check: after a warm-up burst
        of a full batch, a 132-token request was forecast 1.00 s at 0.5x with 3 running, where
        the slowest recent request took 0.58 s and plain's p99 was 0.47 s)."""
        serving = self.serving_batch
        decoded = 0
        seconds = 0.0
        for time, recent, (_served, batch) in zip(
            self._scaled_service, self.recent_output, self.recent_service, strict=False
        ):
            if recent.generated >= 2 and batch <= serving:
                decoded += recent.generated - 1
                seconds += time * min(max(recent.decode_share, 0.0), 1.0)
        return seconds / decoded if decoded else None

    def forecast_service_for(
        self, output_tokens: int | None, prompt_tokens: int | None = None
    ) -> float | None:
        """``forecast_service_s`` for a request that generates at most ``output_tokens`` from
        a prompt of ``prompt_tokens`` (None: unknown): the ``SERVICE_QUANTILE`` of
        ``service_times_for``."""
        return self.service_quantile(self.service_times_for(output_tokens, prompt_tokens))

    def service_quantile(self, times: tuple[float, ...]) -> float | None:
        """The ``SERVICE_QUANTILE`` of ``service_times_for``'s ``times`` (worked out once per
        decision: the latency forecast and the slot's joint draw both read them)."""
        if times is self.forecast_service_times:
            return self.forecast_service_s
        return nearest_rank(times, SERVICE_QUANTILE) if times else None

    @functools.cached_property
    def _scaled_service(self) -> tuple[float, ...]:
        """``forecast_service_times`` before sorting: in the order of ``recent_service``."""
        times = self.step_times
        if times is None or not self.recent_service or self.service_s is None:
            return ()
        serving = self.serving_batch
        step_s = times.at(serving)
        if step_s is None:
            return ()
        slowdown = self.slowdown
        growing = self.growing_batch
        target = times.at(growing, self.starts_at_once)
        finish = self.finish_step_s
        factors: dict[int, float] = {}
        scaled = []
        for index, ((served, batch), ratio) in enumerate(
            zip(self.recent_service, self.step_ratios, strict=True)
        ):
            factor = factors.get(batch)
            if factor is None:
                if batch > serving:
                    then = times.at(batch)
                    factor = min(1.0, step_s / then) if then else 1.0
                else:
                    factor = self.batch_growth(batch, growing)
                factors[batch] = factor
            if ratio is not None:
                factor *= _beyond_noise(ratio)
            elif batch > serving:
                factor *= slowdown
            else:
                then = finish[index] if index < len(finish) else None
                factor = _unstepped_scale(factor, target, then, slowdown)
            scaled.append(served * factor)
        return tuple(scaled)

    @functools.cached_property
    def at_full_batch(self) -> SaturationState:
        """This state as a request in a deep slot sees it (``deep_slots_from`` or more queued
        ahead of it behind a full batch): the requests ahead keep the batch full until it is
        served, so its wait and its own service are forecast at the full batch's steps
        (``growing_batch`` the capacity), whatever the engine held over the last half service
        time. Forecast at the batch held, an overload's first second was judged at the load
        before it: 34-35 requests were admitted in a second the engine finished 9 (issue
        #28, runs 52 and 53). A light load's moment of queue (run 21) takes the first slots,
        which stay at the batch held."""
        capacity = self.capacity
        if capacity is None or self.sustained_batch >= capacity:
            return self
        return dataclasses.replace(self, sustained_batch=capacity)

    @property
    def overloaded(self) -> bool:
        """Requests are offered at ``OVERLOAD_RATIO`` or more of what the engine drains at a
        full batch (``batch_drain_rate``): an overload, not a light load's burst, which offers
        a few requests at once and then none. False where either is not known."""
        share = self.offered_share
        return share is not None and share >= OVERLOAD_RATIO

    @property
    def keeps_up(self) -> bool:
        """Requests are offered at under what the engine drains at a full batch (both known):
        a batch a request joins now empties behind it instead of filling again. Unknown either
        way: False (as under an overload). Under an overload a slot freed a moment ago, with
        nothing waiting, is the next arrival's, and the batch fills behind it (run 5)."""
        share = self.offered_share
        return share is not None and share < 1.0

    @property
    def offered_share(self) -> float | None:
        """Requests offered over what the engine drains at a full batch (None: either is not
        known, or nothing drains): ``overloaded`` and ``keeps_up`` read it."""
        offered, capacity = self.offered_per_s, self.capacity
        if offered is None or not capacity:
            return None
        drained = batch_drain_rate(self, capacity)
        if not drained or drained <= 0:
            return None
        return offered / drained

    @property
    def pace_margin(self) -> float:
        """How much slower the engine's pace at a full batch has lately turned from one
        couple of seconds to the next (``PaceRecord.margin``; 1.0 unmeasured): a deep slot's
        forecast is scaled by it. A request there is promised the SLO over a wait of several
        turnovers and its own service, and the engine's pace moves by 20-60% for seconds at
        a time on a loaded machine (a neighbour, the prefills of a burst): at a load the
        forecast had right, the requests admitted as it slowed missed the SLO together, 14-18
        in two seconds (runs 52 and 53: misses 1.03-1.15x the SLO at the median). The
        forecast follows a slowdown within about 20 steps (``slowdown``); the requests
        admitted before it cannot. Under an overload, until the last minute has measured it,
        the margin of the last ``PACE_REMEMBER_S`` is its floor (``PaceRecord.reading``)."""
        return self.pace_reading.margin

    @property
    def pace_reading(self) -> PaceReading:
        """``pace_margin``, the window changes it went on and the remembered floor, worked
        out once (``/warden/state`` shows them)."""
        record = self.pace_record
        if record is None:
            return PaceReading(1.0, 0)
        return record.reading(self.measured_at, self.capacity, self.overloaded)

    def recent_full_paces(self) -> dict[str, float]:
        """``PaceRecord.full_paces`` of the last ``PACE_SHOWN_S`` seconds, in milliseconds per
        step, by the second (empty: no record, or the batch's size limit unknown)."""
        record = self.pace_record
        if record is None or self.capacity is None:
            return {}
        paces = record.full_paces(self.measured_at, self.capacity)
        first = int(self.measured_at // record.bucket_s) - PACE_SHOWN_S
        return {
            str(round(bucket * record.bucket_s)): round(pace * 1000, 2)
            for bucket, pace in sorted(paces.items())
            if bucket >= first
        }

    @property
    def growing_batch(self) -> int:
        """The larger batch a request arriving now is forecast to be served in: the one it
        joins, as far as the engine has held it (``sustained_batch``). A queue that a burst
        of a light load made for a moment drains again before the request ends; a batch held
        full for half a service time stays full (run 21: forecast at the batch joined, 2 of
        96 requests were refused at 0.5x)."""
        return min(self.joining_batch, self.sustained_batch)

    def batch_growth(self, batch: int, larger: int) -> float:
        """How many times longer a step of the ``larger`` batch takes now than one of the
        ``batch`` a recent request was served in: 1.0 under ``1 + SLOWDOWN_NOISE`` or when
        either is unmeasured. Requests served at a part-full batch (a load at capacity) say
        little of a full one: at an overload's onset the batch fills, each step carries more
        prefills and decodes, and the steps of the smaller batch, no longer made, keep their
        old time, so the slowdown stays 1.0 (run 20: 14 of the 16 misses at 2x in a point's
        first 4 s, the time per token 8.3 ms at 1x's end and 13.5 ms there)."""
        times = self.step_times
        if times is None or larger <= batch:
            return 1.0
        then, now = times.at(batch), times.at(larger)
        if not then or now is None:
            return 1.0
        return _beyond_noise(now / then)

    @property
    def slowdown(self) -> float:
        """How many times longer the engine's steps take now than when the recent requests
        finished: the median of their ``step_ratios``. Under ``1 + SLOWDOWN_NOISE`` it is 1.0
        (the step times' own noise), and it is never below 1: a faster engine is learned as
        its requests finish, as before.

        The service times and the drain rate are the last completions', as fast as the engine
        was while they ran. When it slows (a neighbour on the machine, a throttled device, long
        contexts joining the batch), the forecast would follow only as slower requests finish,
        about one batch later, and the requests admitted meanwhile missed the SLO
        (benchmarks/README.md, run 18: steps 1.7x slower at a point's start than at the
        previous point's end). The step times follow within about 20 steps. A batch larger
        than the recent requests' makes steps of its own: ``batch_growth`` compares those."""
        known = [ratio for ratio in self.step_ratios if ratio is not None]
        if not known:
            return 1.0
        return _beyond_noise(statistics.median(known))

    @property
    def starts_at_once(self) -> bool:
        """A request arriving now takes a free slot with nothing waiting: it delays no one's
        start, and refused, it would be refused for its own latency alone. Its forecast is
        made slower only by a slowdown that has lasted (``StepTimes.now_at``'s ``lasting``);
        a request that would queue is judged on the last 20 steps, since its wait follows
        the engine's speed too."""
        return self.waiting <= 0 and (self.capacity is None or self.running < self.capacity)

    @functools.cached_property
    def step_ratios(self) -> tuple[float | None, ...]:
        """For each recent request, the step time now at the batch it was served in over the
        same when it finished (now: a slowdown that has lasted, where a request arriving now
        ``starts_at_once``); None where either is unknown: not timed then, or that batch not
        stepped within the last service time. A request's own ratio scales its own service
        time (``forecast_service_times``): one served in a burst of prefills already took the
        burst's slow steps and is not slowed again, while those served before it are. Run 33:
        scaled by the median, a burst's slowest request was forecast 1.47x its 0.60 s, and
        steps of sizes the emptied engine no longer made kept the burst's time for seconds:
        45 of 320 requests refused at 0.5x, most with 0-3 running (benchmarks/README.md)."""
        times = self.step_times
        if times is None or not self.finish_step_s or self.service_s is None:
            return (None,) * len(self.recent_service)
        since = self.measured_at - self.service_s
        finish = self.finish_step_s
        lasting = self.starts_at_once
        ratios: list[float | None] = []
        for index, (_served, batch) in enumerate(self.recent_service):
            then = finish[index] if index < len(finish) else None
            now = times.now_at(batch, since, lasting) if then else None
            ratios.append(now / then if now is not None and then else None)
        return tuple(ratios)

    @functools.cached_property
    def running_times(self) -> tuple[tuple[float, ...], ...]:
        """For each running request (``served_ages``' order), the service times it is forecast
        to take, sorted: ``service_times_for`` its limit (``served_limits``), each recent
        request's time taken to as many tokens as it may generate, or, where the model
        stopped the recent one early, to as many as that one did (``RecentOutput.tokens_like``).
        A typical request's (``forecast_service_times``) where the limits are not known.
        Worked out once per limit and state: the requests of a batch share few limits."""
        times = self.forecast_service_times
        limits = self.served_limits
        if not times or len(limits) != len(self.served_ages):
            return (times,) * len(self.served_ages)
        by_limit: dict[int | None, tuple[float, ...]] = {}
        found = []
        for limit in limits:
            own = by_limit.get(limit)
            if own is None:
                own = by_limit[limit] = self.service_times_for(limit)
            found.append(own)
        return tuple(found)

    def mean_service_for(self, limit: int | None) -> float | None:
        """The mean of ``service_times_for`` a request that may generate ``limit`` tokens: how
        long a queued request holds the slot it takes (``queue_turnover``). Worked out at
        ``LIMIT_STEPS`` steps of the longest recent request's length and drawn straight
        between the two around ``limit`` (each recent time is linear in the tokens between
        its own length's kinks), so a queue of many different limits costs a few forecasts."""
        output = self.recent_output
        if limit is None or not output:
            return self._mean_service_at(limit)
        longest = max(recent.generated for recent in output)
        if limit >= longest:
            return self._mean_service_at(longest)
        step = longest / LIMIT_STEPS
        below = math.floor(limit / step)
        low = self._mean_service_at(round(below * step))
        high = self._mean_service_at(round((below + 1) * step))
        if low is None or high is None:
            return high
        return low + (high - low) * (limit / step - below)

    def _mean_service_at(self, limit: int | None) -> float | None:
        means = self._shared_forecasts.means
        if limit not in means:
            times = self.service_times_for(limit)
            means[limit] = statistics.fmean(times) if times else None
        return means[limit]

    @functools.cached_property
    def _shared_forecasts(self) -> Forecasts:
        """The forecasts by a request's limits (``service_times_for``, ``mean_service_for``),
        shared by every state that forecasts from the same basis: the scaled recent service
        times, what those requests generated and the batch a request arriving now is served
        in, all these forecasts read. Admission builds a live copy of the last step's state for
        each request (``with_live_queue``), and a queue's wait is a forecast per queued request
        (``queue_turnover``): worked out anew for each arrival, they were a quarter of the API
        server's time at 4x the capacity with a latency SLO set (issue #28, py-spy)."""
        basis = (self._scaled_service, self.recent_output, self.recent_service, self.serving_batch)
        return _FORECASTS.for_basis(basis)

    @functools.cached_property
    def running_ends(self) -> tuple[RunningEnd, ...]:
        """The running requests that may still end, oldest first: those served for less than
        their own ``SERVICE_QUANTILE`` service time (one served past it already is a long
        one, and nothing recent says when it ends)."""
        found = []
        for age, times in zip(self.served_ages, self.running_times, strict=True):
            if times and age < nearest_rank(times, SERVICE_QUANTILE):
                found.append(RunningEnd(age, times, len(times) - bisect.bisect_right(times, age)))
        return tuple(found)

    @functools.cached_property
    def running_bounds(self) -> tuple[float, ...]:
        """Seconds until each of ``running_ends`` ends at the latest, 99 times in 100 (its
        ``SERVICE_QUANTILE`` service time less its age), soonest first."""
        return tuple(
            sorted(nearest_rank(end.times, SERVICE_QUANTILE) - end.age for end in self.running_ends)
        )

    @property
    def queue_wait_s(self) -> float | None:
        """Predicted wait in vLLM's queue for a typical request arriving now (nothing known of
        its prompt): ``predicted_wait``, the number the saturation judge decides on."""
        return predicted_wait(self)

    def to_json(self) -> dict[str, object]:
        pace = self.pace_reading
        return {
            "running": self.running,
            "waiting": self.waiting,
            "drain_rate_per_s": _rounded(self.drain_rate),
            "service_s": _rounded(self.forecast_service_s),
            "measured_service_s": _rounded(self.service_s),
            "queue_wait_s": _rounded(self.queue_wait_s),
            "tokens_per_request": _rounded(self.tokens_per_request),
            "preemptions_per_s": _rounded(self.preemptions_per_s),
            "recompute_ratio": _rounded(self.recompute_ratio),
            "capacity": self.capacity,
            "slot_rate_per_s": _rounded(self.slot_rate),
            "kv_usage": _rounded(self.kv_usage),
            # Steps this many times slower than when the recent requests finished (1.0: not
            # measurably): the forecast and the drain rate above are scaled by it. Where a
            # request arriving now takes a free slot with nothing waiting, only a slowdown
            # that has lasted about 100 steps counts (``starts_at_once``, shown).
            "slowdown": _rounded(self.slowdown),
            "starts_at_once": self.starts_at_once,
            # vLLM passed over its queue at the last step: none of it starts at the next one.
            "queue_held_over": self.queue_held_over,
            # The mean batch over the last half service time: a request that joins a larger
            # one is forecast at most at this one's step time (``growing_batch``).
            "sustained_batch": self.sustained_batch,
            # How much slower the engine's pace at a full batch has lately turned from two
            # seconds to the next (95th percentile, last minute): a deep slot's forecast is
            # scaled by it (1.0: not measured, or no slower).
            "pace_margin": _rounded(pace.margin),
            # How many such changes the last minute held (fewer than ``PACE_MIN_CHANGES``: the
            # margin is not measured, and reads 1.0). Both need the batch's size limit, which
            # admission knows (``with_live_queue``): the meter's own state reads 1.0 and 0.
            "pace_changes": pace.changes,
            # Under an overload, while the last minute has too few changes: the margin of the
            # last ten minutes, the floor of the one above (None: not applied).
            "pace_margin_remembered": _rounded(pace.remembered),
            # Requests offered per second (admitted or refused, admission's last seconds), and
            # whether that is an overload: more than the engine drains at a full batch.
            "offered_per_s": _rounded(self.offered_per_s),
            "overloaded": self.overloaded,
            "keeps_up": self.keeps_up,
            # Milliseconds per step in each of the last ``PACE_SHOWN_S`` seconds whose batch
            # was full, by the second (wall clock, whole seconds): what the margin is read from.
            "full_pace_ms": self.recent_full_paces(),
            # Seconds per engine step by batch size, as the forecast reads them now.
            "step_s_by_batch": self.step_times.to_json() if self.step_times else {},
            # The same over about the last 100 steps: a slowdown that has lasted.
            "lasting_step_s_by_batch": (
                self.step_times.to_json(lasting=True) if self.step_times else {}
            ),
            # Prompts prefilled since start, whose steps were left out of the step times.
            "prefills_untimed": self.step_times.prefills_untimed if self.step_times else 0,
            # The recent requests' median output and share of service spent decoding: a
            # request's service time is forecast for its own max_tokens from them (None: vLLM
            # did not say; every request is forecast the recent ones' time).
            "recent_output_tokens": _median([float(r.generated) for r in self.recent_output]),
            "recent_decode_share": _rounded(_median([r.decode_share for r in self.recent_output])),
        }


@dataclass
class Forecasts:
    """One basis's forecasts: ``service_times_for`` by (output, prompt) tokens, and
    ``mean_service_for``'s means by limit."""

    times: dict[tuple[int | None, int | None], tuple[float, ...]] = field(default_factory=dict)
    means: dict[int | None, float | None] = field(default_factory=dict)


class SharedForecasts:
    """The limit-keyed forecasts of the last few bases (``SaturationState._shared_forecasts``):
    a state lives one step, and admission's live copies of it share its basis. Bounded, and
    safe across the threads that forecast (the API server's loop, the collectors)."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._by_basis: OrderedDict[tuple[object, ...], Forecasts] = OrderedDict()
        self._lock = threading.Lock()

    def for_basis(self, basis: tuple[object, ...]) -> Forecasts:
        with self._lock:
            found = self._by_basis.get(basis)
            if found is None:
                found = self._by_basis[basis] = Forecasts()
                while len(self._by_basis) > self.keep:
                    self._by_basis.popitem(last=False)
            return found


_FORECASTS = SharedForecasts()


class RecentOutput(NamedTuple):
    """What a recent request generated, from vLLM's own count: how a request asking for
    another number of tokens is forecast from its service time (``time_for``)."""

    generated: int
    decode_share: float  # of its service time, decoding (first token to last)
    prompt_tokens: int
    # The model ended it before its limit (vLLM's finish reason): its length is its own, and a
    # request like it generates as many, not as many as it may (``tokens_like``). False: it ran
    # to its ``max_tokens`` (or nothing says otherwise), so one like it runs to its own.
    stopped_early: bool = False

    def tokens_like(self, limit: int) -> int:
        """The tokens a request that may generate ``limit`` generates, drawn like this one:
        its limit where this one ran to its own, or as many as this one generated where the
        model stopped it, never more than ``limit``."""
        return min(self.generated, limit) if self.stopped_early else limit

    def time_for(
        self,
        served_s: float,
        output_tokens: int,
        pace_s: float | None,
        prompt_tokens: int | None = None,
    ) -> float:
        """This request's service time ``served_s`` taken to ``output_tokens``: cut by its
        ``share`` where it generated more; where it generated fewer, the tokens it lacks added
        at ``pace_s`` seconds each (the engine's, ``SaturationState.decode_pace``; None: as it
        was)."""
        if output_tokens <= self.generated or pace_s is None:
            return served_s * self.share(output_tokens, prompt_tokens)
        return served_s + (output_tokens - self.generated) * pace_s

    def share(self, output_tokens: int, prompt_tokens: int | None = None) -> float:
        """The part of this request's service time one generating at most ``output_tokens``
        takes: all of it but the decoding (prefill, the first token, the API server's part;
        scaled up by the prompts' ratio where ``prompt_tokens`` is known and longer), plus the
        decoding's share per token beyond the first; never more than 1.0, and 1.0 where this
        one generated no more, or fewer than two tokens (no decode to divide)."""
        generated = self.generated
        if generated < 2 or output_tokens >= generated:
            return 1.0
        decode = min(max(self.decode_share, 0.0), 1.0)
        rest = 1.0 - decode
        if prompt_tokens is not None and prompt_tokens > self.prompt_tokens > 0:
            rest *= prompt_tokens / self.prompt_tokens
        return min(1.0, rest + decode * (max(output_tokens, 1) - 1) / (generated - 1))


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
    ahead = requests_ahead(state, kv, prompt_tokens, margin_blocks)
    batch_full = state.capacity is not None and state.running >= state.capacity
    if ahead <= 0 and not batch_full:
        return 0.0
    if batch_full and math.ceil(ahead) >= deep_slots_from(state.capacity):
        state = state.at_full_batch
    slots = max(1, state.running)
    rate = batch_drain_rate(state, slots)
    if not rate:
        return None
    # This request needs the (ahead + 1)-th free slot; slots free a batch at a time.
    batches = math.ceil((max(ahead, 0.0) + 1) / slots)
    wait = batches * slots / rate
    if batches == 1:
        return min(wait, _slot_freed_by(state, math.ceil(max(ahead, 0.0))))
    turnover = queue_turnover(state, math.ceil(ahead), slots / rate)
    return wait if turnover is None else turnover


def deep_slots_from(capacity: int | None) -> int:
    """The first of a full batch's deep slots (``JOINT_SLOTS_SHARE`` of them come before).

    A request that takes one of the first slots is judged on its wait and its service time
    together (``slot_meets``), where the sum of their 99th percentiles is over the SLO: it
    only ever admits what that sum refused. Deeper slots keep the sum. A request there starts
    as most of the batch turns over, with as many others starting beside it, and the recent
    service times say less of its own: with the sum, 2.1% of the requests admitted behind 4
    to 7 queued missed the SLO (run 25: 22 of 1,045, in bursts), against 0.26% behind 0 to 3
    (2 of 781), and every miss of runs 27 and 28 was at slots 6-7; the joint percentile would
    admit more of them, not fewer. A deep slot is forecast at the full batch
    (``SaturationState.at_full_batch``) and with how much slower the engine's pace has
    lately turned within seconds (``pace_margin``); what the forecast still misses there is
    measured on the requests admitted there (warden/control/saturation.py,
    ``DeepSlotCalibration``)."""
    return max(1, int((capacity or 0) * JOINT_SLOTS_SHARE))


def queue_turnover(state: SaturationState, ahead: int, unknown_end_s: float) -> float | None:
    """Seconds until a request with ``ahead`` queued before it gets a slot, deeper than the
    running batch: each running request's slot frees by its ``SERVICE_QUANTILE`` end
    (``running_bounds``, as for a slot of the running batch; ``unknown_end_s`` for a slot
    whose request's end nothing forecasts: not read, or served past its forecast), and each
    queued request, in turn, takes the slot that frees first and holds it for the mean
    service time of its own length (``queued_limits``; a typical recent request's where
    unknown: places held for refused clients, another API server's requests). None where
    the running requests' ends are not known (the whole batches' wait stands).

    Counted in whole batches at the drain rate of the last completions, the wait followed
    the requests that had just finished, not those ahead: a queue of long requests behind a
    batch of young ones was forecast the short ones' turnover, and the requests admitted 2 to
    4 batches deep waited 1.4-2.1 s for their first token where 0.8 s had been forecast
    (issue #28, runs 51 and its quick check: 12 of 382 late at 4x, all in one burst). A
    queued request's own end is its mean, not its tail: the wait is the sum of several, whose
    tails do not come together; how late the deep slots run all the same is measured on the
    requests admitted there (warden/control/saturation.py, ``DeepSlotCalibration``). Beyond
    ``TURNOVER_QUEUE`` requests ahead, the rest turn over at the rate of those simulated."""
    if not state.served_ages or not state.forecast_service_times:
        return None
    slots = max(1, state.running)
    bounds = list(state.running_bounds[:slots])
    free = bounds + [unknown_end_s] * (slots - len(bounds))
    heapq.heapify(free)
    limits = state.queued_limits
    simulated = min(ahead, TURNOVER_QUEUE)
    typical = statistics.fmean(state.forecast_service_times)
    for index in range(simulated):
        service = state.mean_service_for(limits[index]) if index < len(limits) else typical
        heapq.heapreplace(free, free[0] + (typical if service is None else service))
    wait = free[0]
    if ahead > simulated:
        # By ``wait``, ``simulated + 1`` requests have ended: the rest end at that rate.
        wait += (ahead - simulated) * wait / (simulated + 1)
    return wait


def requests_ahead(
    state: SaturationState,
    kv: KvState | None = None,
    prompt_tokens: int | None = None,
    margin_blocks: int = 0,
) -> float:
    """The requests that take a freed slot before this one: the queue, plus, when its prompt
    does not fit in the free KV blocks, the requests that must finish to free them."""
    ahead = float(state.waiting)
    if kv is not None and prompt_tokens is not None and state.tokens_per_request:
        lacking = kv.blocks_for(prompt_tokens + 1) - kv.free_blocks(margin_blocks)
        if lacking > 0:
            # Each finished request frees about its own size in blocks.
            ahead += lacking / max(1, kv.blocks_for(state.tokens_per_request))
    return ahead


class RunningEnd(NamedTuple):
    """A running request that may end: how long it has been served, the service times it is
    forecast to take (sorted: ``SaturationState.running_times``), and how many of them are
    longer than its age (the draws it may still end at)."""

    age: float
    times: tuple[float, ...]
    past: int

    def goes_on(self, wait: float) -> float:
        """The chance it is still running ``wait`` seconds from now: the share of its service
        times past its age that are past its age plus ``wait``."""
        return (len(self.times) - bisect.bisect_right(self.times, self.age + wait)) / self.past


def slot_meets(
    state: SaturationState,
    slot: int,
    latency_s: float,
    own_times: tuple[float, ...] | None = None,
) -> bool | None:
    """Whether a request that takes the running batch's ``slot``-th freed slot (0: the
    first; ``slot`` requests ahead of it) is done within ``latency_s`` at the
    ``SERVICE_QUANTILE``: its wait for that slot and its own service time together, not each
    at its own 99th percentile. None where it cannot be worked out (ages or forecast
    service times unknown, fewer running requests with an age than the slot needs).

    The slot frees when ``slot + 1`` of the running requests have ended. Each one's end is
    drawn from the service times it is forecast to take (``running_times``: of its own
    length where its limit is known) longer than its age (as ``_first_end_s``; one served
    past its forecast already is not counted on to end), and the request's own service time
    is an independent draw: its length is its own, theirs are theirs. A service time ``s``
    of its own is late if fewer than ``slot + 1`` running requests end within
    ``latency_s - s``; averaged over its service times, that is the chance of a miss, and it
    must be within ``1 - SERVICE_QUANTILE``.

    Added at their 99th percentiles each (the wait's bound from the ``slot``-th oldest
    request, ``_slot_freed_by``, plus the service time), a request whose service time is at
    its tail was counted on to wait its tail too, as if both came together: arrivals that
    would have finished in time were refused (run 25: 2 at 0.5x, 154-300 a pair at 3x into a
    full batch with no queue; run 26: 5 at 0.5x behind one queued). Admission asks this for
    the first half of a full batch's slots only (``deep_slots_from`` in
    warden/control/saturation.py says why). The request's own draws are of its own length
    (``own_times``: ``service_times_for`` its ``max_tokens``; None: a typical request's)."""
    times = state.forecast_service_times
    if not times or not state.served_ages:
        return None
    own = times if own_times is None else own_times
    count = len(own)
    running = state.running_ends[:FIRST_END_REQUESTS]
    if len(running) <= slot:
        return None
    budget = (1.0 - SERVICE_QUANTILE) * count  # late draws allowed, of ``count``
    late = 0.0
    # Longest service time first: its wait is the shortest, the likeliest to be missed. The
    # chance that too few have ended only falls as the wait grows, so once the remaining
    # draws, each at most as likely to be late as this one, cannot reach the budget, they
    # are not worked out.
    for index in range(count - 1, -1, -1):
        wait = latency_s - own[index]
        if wait <= 0.0:
            late += 1.0
        else:
            too_few = _fewer_ended(running, wait, slot + 1)
            late += too_few
            if late + too_few * index <= budget:
                return True
        if late > budget:
            return False
    return True


def _fewer_ended(running: Sequence[RunningEnd], wait: float, needed: int) -> float:
    """The chance that fewer than ``needed`` of the ``running`` requests end within ``wait``:
    the ended count's distribution, built one request at a time, kept only below
    ``needed``."""
    chances = [1.0] + [0.0] * (needed - 1)  # chances[j]: exactly j ended so far
    for request in running:
        goes_on = request.goes_on(wait)
        ends = 1.0 - goes_on
        for ended in range(needed - 1, 0, -1):
            chances[ended] = chances[ended] * goes_on + chances[ended - 1] * ends
        chances[0] *= goes_on
    return sum(chances)


def _slot_freed_by(state: SaturationState, index: int) -> float:
    """Seconds until the running batch frees its ``index``-th slot (0: the first), at the
    ``SERVICE_QUANTILE``. Unknown (ages not read, or fewer running requests with an age than
    the slot asks): infinity, and the whole batch's wait stands.

    Each running request ends within its service forecast (of its own length, where its
    limit is known: ``running_times``) of its start, 99 times in 100, so the slot frees by
    the ``index + 1``-th soonest of those bounds: a bound that holds however the batch's
    requests are spread. A request served past its forecast already is not counted on to
    end (a long one: nothing recent says when). The first slot frees when any running
    request ends, whichever: ``_first_end_s`` forecasts that from each one's service times,
    its remaining time given how long it has run.

    A momentary full batch under a light load holds requests that started at different
    times: the first slot frees when one of them ends, not a whole batch later (run 23: at
    0.5x, 6 requests arriving into a burst were forecast a batch's wait, 0.7 s, on top of a
    p99 service time, over an SLO of 1.99 s that plain vLLM met for every request). Under
    overload the batch stays full, and with each request's end bounded by the oldest's, a
    request arriving to no queue was refused whenever the batch's requests were young
    (run 24: 127-169 refusals a pair at 3x in seconds where no admitted request queued).
    Each request's own length: forecast as a typical recent request, a batch of long ones
    was taken to free its slots sooner than it did, and requests admitted behind it waited
    0.4-1.1 s for their first token where those admitted into a batch of short ones waited
    0.03-0.67 s (issue #28, runs 49 and 50)."""
    if index >= len(state.served_ages):
        return math.inf
    if not state.forecast_service_times:
        service = state.forecast_service_s
        if service is None:
            return math.inf
        ages = tuple(age for age in state.served_ages if age < service)
        return service - ages[index] if index < len(ages) else math.inf
    bounds = state.running_bounds
    if index >= len(bounds):
        return math.inf
    if index > 0:
        return bounds[index]
    return min(bounds[0], _first_end_s(state.running_ends[:FIRST_END_REQUESTS], SERVICE_QUANTILE))


def _first_end_s(running: Sequence[RunningEnd], quantile: float) -> float:
    """The ``quantile`` of the time until the first of the ``running`` requests ends, given
    how long each has run and the service times it is forecast to take: the time by which
    the chance that none has ended falls to ``1 - quantile``. Found to
    ``FIRST_END_RESOLUTION_S`` by bisection, over the ``FIRST_END_REQUESTS`` oldest (fewer
    requests end later: a batch of hundreds costs no more than one of 16)."""
    if not running:
        return math.inf

    def none_ended(wait: float) -> float:
        chance = 1.0
        for request in running:
            chance *= request.goes_on(wait)
        return chance

    low, high = 0.0, max(request.times[-1] for request in running)
    if none_ended(high) > 1.0 - quantile:
        return math.inf
    while high - low > FIRST_END_RESOLUTION_S:
        middle = (low + high) / 2
        if none_ended(middle) > 1.0 - quantile:
            low = middle
        else:
            high = middle
    return high


def batch_drain_rate(state: SaturationState, slots: int) -> float | None:
    """Requests a batch of ``slots`` finishes per second: the measured drain rate, or, when it
    was measured on a smaller batch, ``slots`` times the rate per running request, slower by
    the time a step of the larger batch takes (``batch_growth``); slower by the engine's
    ``slowdown`` since those requests finished."""
    if state.slot_rate is None:
        rate = state.drain_rate
    else:
        rate = max(state.drain_rate or 0.0, state.slot_rate * slots)
        mean_batch = (state.drain_rate or 0.0) / state.slot_rate if state.slot_rate > 0 else 0.0
        if slots > mean_batch >= 1:
            # More slots than it was measured on: each of their steps may take longer.
            rate /= state.batch_growth(round(mean_batch), min(slots, state.sustained_batch))
    if not rate:
        return rate
    return rate / state.slowdown


def _unstepped_scale(
    growth: float, target: float | None, then: float | None, slowdown: float
) -> float:
    """The scale of a recent request whose batch size the engine has not stepped within the
    last service time (its step ratio unknown: the sizes a light load after an overload no
    longer reaches): the step time now at the batch a request arriving now will be served in
    (``target``) over its own size's when it finished (``then``), or the engine's
    ``slowdown`` where that is larger; never the two multiplied. The serving batch's step
    time now holds the engine's speed now already: scaled by its ``batch_growth`` (over its
    own size's average, left as the overload set it) and again by the slowdown read from
    other sizes, bursts at 0.5x after 4x were forecast up to 1.8x what their requests took
    and refused (issue #28's probe, benchmarks/README.md, run 43). Its own step time not
    timed then: the growth and the slowdown, as before."""
    if not then or target is None:
        return growth * slowdown
    return max(_beyond_noise(target / then), slowdown)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _beyond_noise(ratio: float) -> float:
    """A ratio of step times, or 1.0 when it is within their noise (``SLOWDOWN_NOISE``)."""
    return ratio if ratio >= 1.0 + SLOWDOWN_NOISE else 1.0


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


SERVICE_QUANTILE = 0.99
# The share of a full batch's slots, the first ones to free, for which admission judges the
# wait and the service time together (``slot_meets``); the rest are deep (``deep_slots_from``).
JOINT_SLOTS_SHARE = 0.5
# How precisely the first slot's end is forecast (``_first_end_s``): a few engine steps.
FIRST_END_RESOLUTION_S = 0.005
FIRST_END_REQUESTS = 16
# Queued requests whose slots ``queue_turnover`` follows one by one, and the steps of the
# longest recent request's length their service is worked out at (``mean_service_for``).
TURNOVER_QUEUE = 64
LIMIT_STEPS = 8
# The share of the service time over which the batch held is the one a request is forecast
# to be served in when it is larger than recent requests' (``SaturationState.growing_batch``).
SUSTAINED_SHARE = 0.5
# A slowdown of the engine's steps smaller than this share is taken for noise (``slowdown``):
# a step's time moves with the prefills in it, the moving average of ~20 steps by about a
# tenth under a steady load, more at a burst of arrivals.
SLOWDOWN_NOISE = 0.2
# Each step's duration moves its batch size's average by this share: about the last 20 steps.
STEP_WEIGHT = 0.05
# The same steps' lasting average moves by this share: about the last 100 steps. A request
# that starts at once (a free slot, nothing waiting) is forecast slower only by a slowdown
# both averages show (``StepTimes.now_at``): one that has lasted, not a blip of 20 steps.
LASTING_STEP_WEIGHT = 0.01
# Batch sizes up to this are timed one by one; above it in quarter octaves (about 19% apart),
# so an engine with hundreds of slots keeps a few dozen averages, each seeing steps often.
EXACT_BATCHES = 16
# The recent batch sizes: buckets of this many seconds, kept this long (the longest window a
# service time asks for; a longer service time looks back this far only).
PEAK_BUCKET_S = 0.25
PEAK_KEEP_S = 60.0
# Slot-clock readings kept to find the batch each finished request was served in (one per
# full step; halved when full, so the oldest cover far longer than any request is served).
CHECKPOINTS = 16384
# The engine's pace at a full batch (``PaceRecord``): seconds of busy time per step, every
# step counted, in buckets of this many seconds, kept this long; a bucket counts when the
# batch was full (``PACE_FULL_SHARE``) for at least this share
# of it. The pace is compared over windows of ``PACE_WINDOW_BUCKETS`` (about a deep
# request's life: its wait and its service), the next window's over the last one's; the
# margin is the ``PACE_QUANTILE`` of those changes, once ``PACE_MIN_CHANGES`` are known,
# between 1.0 and ``PACE_MARGIN_MAX``.
PACE_BUCKET_S = 1.0
PACE_KEEP_S = 60.0
PACE_MIN_BUSY_SHARE = 0.5
# A bucket's batch is full when its mean is within half a request of the capacity or at least
# this share of it: under admission with an SLO the queue is kept short, so a finished
# request's slot can wait a step or more for the next one. Held to half a request, run 56
# judged 212 of 213 deep admissions at 3x with no margin (whether for want of full seconds
# was not shown then), and the late deep admissions there ran 1.02-1.52x their allowance.
PACE_FULL_SHARE = 0.875
PACE_WINDOW_BUCKETS = 2
PACE_QUANTILE = 0.95
# Two changes are about 6 s of a full batch. At eight (about 11 s), the late deep admissions
# of run 56 came in their points' first 23 s (the load starts 9-11 s in), judged with no
# margin, and in quick check 62 the eighth change came about 11 s into a 3x load, after the
# late ones: an overload's onset went unscaled. With fewer changes than 20 the 95th
# percentile is the largest of them.
PACE_MIN_CHANGES = 2
PACE_MARGIN_MAX = 2.0
# How long the record is kept: under an overload (requests offered at ``OVERLOAD_RATIO`` or
# more of what the engine drains), until the last minute holds ``PACE_SETTLED_CHANGES``
# changes (about 11 s of a full batch), the margin is at least that of the whole record
# (``PaceRecord.reading``): the turns of earlier overloads stand for those of this one's onset.
PACE_REMEMBER_S = 600.0
PACE_SETTLED_CHANGES = 8
# Requests offered (admitted or refused, over admission's last couple of seconds) at this many
# times what the engine drains at a full batch: an overload (``SaturationState.overloaded``).
# A light load's burst is a few requests at once, not twice the drain for seconds.
OVERLOAD_RATIO = 1.5
# The last seconds of full-batch pace ``/warden/state`` shows (``recent_full_paces``).
PACE_SHOWN_S = 12


def batch_bucket(batch: int) -> int:
    """The batch size a step time is kept under."""
    if batch <= EXACT_BATCHES:
        return max(batch, 1)
    return int(round(2 ** (round(math.log2(batch) * 4) / 4)))


@dataclass(eq=True)
class StepTimes:
    """Seconds an engine step takes, by batch size (running requests), each a moving average
    of the steps the engine made at that size: the engine's speed now, whatever the load was
    when recent requests were served. Shared by the meter and the states it hands out.

    Decoding steps only: a step that prefilled a prompt is not timed (the meter skips the
    stretch its output ends). Its time is the prompt's more than the batch's, and it falls on
    the sizes the engine passes through while filling: in run 33's probe a step of 7
    averaged 3.4 ms against 2.4 ms for a step of 8, so a request joining a batch of 7 was
    forecast a larger batch's ``batch_growth`` and refused at 0.5x. The prefills' share of a
    request's time is in the service times measured (benchmarks/README.md, run 37)."""

    seconds: dict[int, float] = field(default_factory=dict)
    # When each size was last stepped (the meter's clock): a size the engine has left keeps
    # the time of its last steps, which may have been a burst's prefills (``now_at``).
    stepped_at: dict[int, float] = field(default_factory=dict)

    # Steps timed at each size, up to ``1 / LASTING_STEP_WEIGHT``: the first ones are
    # averaged evenly.
    counts: dict[int, int] = field(default_factory=dict)
    # The same sizes' lasting averages (about the last 100 steps, ``LASTING_STEP_WEIGHT``).
    lasting: dict[int, float] = field(default_factory=dict)
    # Prompts whose prefill's step was left out, since start (shown in /warden/state).
    prefills_untimed: int = 0

    def add(self, batch: int, step_s: float, steps: int, now: float = 0.0) -> None:
        """``steps`` steps at ``batch`` that took ``step_s`` each. A size's first steps weigh
        as one in their number, not as the whole average: the engine's first steps at a new
        size are its slowest (at the 0.5x probe's start, sizes the warm-up had passed through
        read 5.6-6.0 ms against 2.2-2.5 ms once stepped again), and seeded with them, an
        average kept 60% of the first step after ten more."""
        bucket = batch_bucket(batch)
        steps = max(steps, 1)
        seen = self.counts.get(bucket, 0)
        for averages, share in ((self.seconds, STEP_WEIGHT), (self.lasting, LASTING_STEP_WEIGHT)):
            last = averages.get(bucket)
            if last is None:
                averages[bucket] = step_s
            else:
                weight = max(1.0 - (1.0 - share) ** steps, steps / (seen + steps))
                averages[bucket] = last + weight * (step_s - last)
        self.counts[bucket] = min(seen + steps, round(1 / LASTING_STEP_WEIGHT))
        self.stepped_at[bucket] = now

    def at(self, batch: int, lasting: bool = False) -> float | None:
        """Seconds per step at ``batch``; unmeasured, the nearest smaller batch's (the first
        steps at the new size teach the rest), else the nearest larger one's. ``lasting``:
        the smaller of that and its lasting average (``now_at``)."""
        bucket = self._measured_bucket(batch)
        return None if bucket is None else self._read(bucket, lasting)

    def exact(self, batch: int) -> float | None:
        """Seconds per step at ``batch``'s own size, None where that size was never timed:
        a request's step time when it finished is compared with the same size's now
        (``SaturationState.step_ratios``), never with a neighbour's it borrowed then."""
        return self.seconds.get(batch_bucket(batch))

    def now_at(self, batch: int, since: float, lasting: bool = False) -> float | None:
        """``at(batch)``, or None when the size it reads was not stepped at or after ``since``:
        its average is then the speed of steps the engine no longer makes, not its speed now.
        ``lasting``: the smaller of that and the size's lasting average (about 100 steps), so
        that only a slowdown that has lasted reads slower: on a shared machine the last 20
        steps read 1.3-1.5x slower for a moment (another process's time slice, a burst of
        tokenizing), and a light load's requests were refused for it (run 58: 25 at 0.5x,
        with 1-4 running and nothing waiting, where the admitted took at most 0.95 s against
        an SLO of 1.14 s)."""
        bucket = self._measured_bucket(batch)
        if bucket is None or self.stepped_at.get(bucket, -math.inf) < since:
            return None
        return self._read(bucket, lasting)

    def _read(self, bucket: int, lasting: bool) -> float:
        """A measured bucket's average; ``lasting``: the smaller of it and the lasting one."""
        recent = self.seconds[bucket]
        return min(recent, self.lasting.get(bucket, recent)) if lasting else recent

    def _measured_bucket(self, batch: int) -> int | None:
        bucket = batch_bucket(batch)
        if bucket in self.seconds:
            return bucket
        smaller = [size for size in self.seconds if size < bucket]
        if smaller:
            return max(smaller)
        larger = [size for size in self.seconds if size > bucket]
        return min(larger) if larger else None

    def to_json(self, lasting: bool = False) -> dict[str, float]:
        averages = self.lasting if lasting else self.seconds
        return {str(size): round(averages[size], 5) for size in sorted(averages)}


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (over 32 completions, 0.99 is the slowest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


class BatchPeaks:
    """The largest batch (running requests) the engine ran in each ``bucket_s`` of the last
    ``keep_s``: a ring of buckets, so a step records in constant time and the peak over a
    window costs one look per bucket."""

    def __init__(self, bucket_s: float = PEAK_BUCKET_S, keep_s: float = PEAK_KEEP_S) -> None:
        self.bucket_s = bucket_s
        self._size = max(1, math.ceil(keep_s / bucket_s))
        self._bucket = [-1] * self._size  # which bucket each slot holds now
        self._peak = [0] * self._size

    def record(self, now: float, running: int) -> None:
        bucket = int(now // self.bucket_s)
        slot = bucket % self._size
        if self._bucket[slot] != bucket:
            self._bucket[slot], self._peak[slot] = bucket, running
        elif running > self._peak[slot]:
            self._peak[slot] = running

    def peak(self, now: float, window_s: float) -> int:
        """The largest batch recorded within ``window_s`` before ``now`` (at most ``keep_s``)."""
        last = int(now // self.bucket_s)
        first = max(last - math.ceil(window_s / self.bucket_s), last - self._size + 1)
        peak = 0
        for bucket in range(first, last + 1):
            slot = bucket % self._size
            if self._bucket[slot] == bucket and self._peak[slot] > peak:
                peak = self._peak[slot]
        return peak


class PaceReading(NamedTuple):
    """The pace margin as admission judges a deep slot with it (``PaceRecord.reading``): the
    margin, the window changes of the last minute it went on, and the margin of the last
    ``PACE_REMEMBER_S`` where that was its floor (None: not applied)."""

    margin: float
    changes: int
    remembered: float | None = None


class PaceRecord:
    """Seconds per engine step at a full batch, second by second over the last minutes: how
    much slower the engine has lately turned within seconds (``margin``). Every step is counted, a
    prefill's too: a request decodes one token a step, so this is its pace, prefills and all.
    A ring of buckets of busy seconds, steps and slot-seconds, so a step records in constant
    time; which buckets held a full batch is decided when asked (the capacity is admission's).
    """

    def __init__(self, bucket_s: float = PACE_BUCKET_S, keep_s: float = PACE_REMEMBER_S) -> None:
        self.bucket_s = bucket_s
        self._size = max(2, math.ceil(keep_s / bucket_s))
        self._bucket = [-1] * self._size  # which bucket each slot holds now
        self._busy = [0.0] * self._size  # seconds with a request running
        self._steps = [0] * self._size
        self._slots = [0.0] * self._size  # running-request seconds
        # (the last whole bucket, capacity, margin) of the last reading of the whole record:
        # it changes only as a bucket completes, and admission reads it per deep request.
        self._remembered: tuple[int, int, float] | None = None
        # ((the last whole bucket, capacity, span), its changes) of the last ``changes``.
        self._last_changes: tuple[tuple[int, int, float], tuple[float, ...]] | None = None

    def record(self, now: float, elapsed: float, steps: int, running: int) -> None:
        """``steps`` engine steps at a batch of ``running`` took ``elapsed`` seconds, up to
        ``now``."""
        if elapsed <= 0 or steps <= 0 or running <= 0:
            return
        bucket = int(now // self.bucket_s)
        slot = bucket % self._size
        if self._bucket[slot] != bucket:
            self._bucket[slot] = bucket
            self._busy[slot], self._steps[slot], self._slots[slot] = 0.0, 0, 0.0
        self._busy[slot] += elapsed
        self._steps[slot] += steps
        self._slots[slot] += elapsed * running

    def full_paces(
        self, now: float, capacity: int, span_s: float = PACE_KEEP_S
    ) -> dict[int, float]:
        """Seconds per step in each whole bucket of the ``span_s`` before ``now`` whose batch
        was full (``PACE_MIN_BUSY_SHARE`` of it busy, its mean batch within half a request of
        ``capacity`` or ``PACE_FULL_SHARE`` of it), by bucket."""
        last = int(now // self.bucket_s)
        span = min(self._size, math.ceil(span_s / self.bucket_s))
        full = min(capacity - 0.5, PACE_FULL_SHARE * capacity)
        found = {}
        for bucket in range(last - span + 1, last):
            slot = bucket % self._size
            busy = self._busy[slot]
            if self._bucket[slot] != bucket or busy < PACE_MIN_BUSY_SHARE * self.bucket_s:
                continue
            if self._slots[slot] / busy >= full and self._steps[slot]:
                found[bucket] = busy / self._steps[slot]
        return found

    def reading(self, now: float, capacity: int | None, overloaded: bool = False) -> PaceReading:
        """``margin``, with the window changes it went on; ``overloaded`` (requests offered
        faster than the engine drains them: ``SaturationState.overloaded``), a margin of the
        last minute that rests on fewer than ``PACE_SETTLED_CHANGES`` changes is raised to
        the margin of the last ``PACE_REMEMBER_S``, the engine's turns at earlier overloads.

        At an overload's onset the batch has been full for a few seconds: the last minute
        holds no change, or two or three, and the margin read 1.00 where the same point's
        later seconds read 1.27-1.56; the deep admissions of those seconds took 1.05-1.27x
        their allowance (issue #28, run 60: 21 of the 28 late at 4x). The earlier
        overload's turns are not carried to a light load's bursts (run 35: the deep slots'
        calibration, kept from a 4x, refused 11 at the next 0.5x): a burst does not offer
        more than the engine drains."""
        current = self.changes(now, capacity)
        margin = margin_of(current)
        if not overloaded or len(current) >= PACE_SETTLED_CHANGES or capacity is None:
            return PaceReading(margin, len(current))
        remembered = self._remembered_margin(now, capacity)
        return PaceReading(max(margin, remembered), len(current), remembered)

    def _remembered_margin(self, now: float, capacity: int) -> float:
        last = int(now // self.bucket_s)
        cached = self._remembered
        if cached is not None and cached[:2] == (last, capacity):
            return cached[2]
        found = margin_of(self.changes(now, capacity, PACE_REMEMBER_S))
        self._remembered = (last, capacity, found)
        return found

    def margin(self, now: float, capacity: int | None) -> float:
        """How much slower than over the window before it the engine has run over the next
        one, at a full batch, in the last minute: the ``PACE_QUANTILE`` of the ratios of
        each ``PACE_WINDOW_BUCKETS``-second window's pace to the previous window's, between
        1.0 and ``PACE_MARGIN_MAX``; 1.0 until ``PACE_MIN_CHANGES`` such pairs of windows
        were at a full batch.

        A forecast takes the engine's recent pace to hold over the request's life (the
        recent requests' service times, the step times of about 20 steps); this is how far
        that has been wrong lately, the way it hurts (slower). Judged on the slowest second
        over the pace now, single slow seconds (a burst's prefills, the API server's own
        pauses) read 1.8-2.0 at 4x on this 2-core machine and refused most deep slots: the
        engine was left at 0.78 of plain's tokens/s, where the deep slots' own calibration
        said their requests ran at most 1.21x their forecasts (issue #28's quick check)."""
        return margin_of(self.changes(now, capacity))

    def changes(self, now: float, capacity: int | None, span_s: float = PACE_KEEP_S) -> list[float]:
        """Each ``PACE_WINDOW_BUCKETS``-second window's pace over the previous window's, where
        all of both were at a full batch (``full_paces``), in the last ``span_s`` (a minute)."""
        if capacity is None or capacity <= 0:
            return []
        # Whole buckets only, so the changes move only as a bucket completes: admission reads
        # them for each deep request, and at an overload that is most arrivals.
        key = (int(now // self.bucket_s), capacity, span_s)
        last = self._last_changes
        if last is not None and last[0] == key:
            return list(last[1])
        paces = self.full_paces(now, capacity, span_s)
        window = PACE_WINDOW_BUCKETS
        changes = []
        for first in paces:
            if all(bucket in paces for bucket in range(first, first + 2 * window)):
                then = statistics.fmean(paces[first + offset] for offset in range(window))
                later = statistics.fmean(paces[first + window + offset] for offset in range(window))
                changes.append(later / then)
        self._last_changes = (key, tuple(changes))
        return changes


def margin_of(changes: Sequence[float]) -> float:
    """The pace margin from the window changes (``PaceRecord.changes``): their
    ``PACE_QUANTILE`` between 1.0 and ``PACE_MARGIN_MAX``; 1.0 with fewer than
    ``PACE_MIN_CHANGES``."""
    if len(changes) < PACE_MIN_CHANGES:
        return 1.0
    return min(PACE_MARGIN_MAX, max(1.0, nearest_rank(changes, PACE_QUANTILE)))


class SaturationMeter:
    """Turns each step's counts and finished requests into a SaturationState."""

    def __init__(self, keep: int = 32, min_finished: int = 3) -> None:
        self.keep = keep
        self.min_finished = min_finished
        self._busy = 0.0  # seconds with work in the engine, since start
        self._slot_s = 0.0  # running-request seconds (a slot busy for a second counts one)
        self._last: tuple[float, int, int] | None = None  # (time, running, waiting) last step
        # (time, slot clock, running) at each observed step: the mean batch a finished
        # request was served in.
        self._checkpoint_at: list[float] = []
        self._checkpoint_slots: list[tuple[float, int]] = []
        self.step_times = StepTimes()
        self.batch_peaks = BatchPeaks()
        self.pace = PaceRecord()
        # Recent completions; one more than ``keep``: the oldest is the reference the rates
        # are measured from.
        self._done: deque[_Done] = deque(maxlen=keep + 1)
        self._preempted: deque[tuple[float, int]] = deque()
        # What the recent completions add up to, kept until one finishes or is preempted:
        # most steps finish nothing, and this runs on every step.
        self._summary: _Completions | None = None
        # At the last step: the KV cache's use, and whether its queue was held over.
        self._kv_usage: float | None = None
        self._held_over = False

    def observe(
        self,
        now: float,
        running: int,
        waiting: int,
        finished: Sequence[Sequence[float]],
        preempted: int = 0,
        steps: int = 1,
        kv_usage: float | None = None,
        prefilled: int = 0,
    ) -> SaturationState:
        """One observed step (``ingest``) and the state it leaves (``state``)."""
        self.ingest(now, running, waiting, finished, preempted, steps, kv_usage, prefilled)
        return self.state()

    def ingest(
        self,
        now: float,
        running: int,
        waiting: int,
        finished: Sequence[Sequence[float]],
        preempted: int = 0,
        steps: int = 1,
        kv_usage: float | None = None,
        prefilled: int = 0,
    ) -> None:
        """One observed step, with the requests it finished: (prompt + generated tokens,
        seconds queued, seconds served[, tokens generated, seconds decoding[, 1.0 if the model
        stopped it before its limit]]), the last ones where vLLM says
        (``vllm_compat.finished_requests``); ``steps`` engine steps since the
        last one observed (the steps that changed nothing are counted, not observed:
        exporter/step_monitor.py); the KV cache's use at it, when known; how many prompts it
        finished prefilling (then its time is not a step time of the batch: ``StepTimes``).
        Only the clocks and records move here; what they add up to waits for ``state``, which
        the step monitor asks for only when something reads it (a saturation limit decides
        on every step; without one, the gauges every ``PUBLISH_EVERY_S``)."""
        last = self._last
        # Started since the last observed step: the batch's growth, plus what left it.
        started = running - last[1] + len(finished) + preempted if last is not None else 0
        self._held_over = last is not None and waiting > 0 and 0 <= started < last[2]
        self._kv_usage = kv_usage
        if last is not None and last[1] + last[2] > 0:
            elapsed = max(0.0, now - last[0])
            self._busy += elapsed
            self._slot_s += elapsed * last[1]
            if last[1] > 0 and not prefilled:  # decodes of the batch that ran since
                self.step_times.add(last[1], elapsed / max(steps, 1), steps, now)
            self.pace.record(now, elapsed, steps, last[1])
        self.step_times.prefills_untimed += prefilled
        self._last = (now, running, waiting)
        self.batch_peaks.record(now, running)
        self._checkpoint(now, running)
        for request in finished:
            tokens, served = int(request[0]), float(request[2])
            generated = int(request[3]) if len(request) > 4 else None
            decode_share = float(request[4]) / served if len(request) > 4 and served > 0 else 0.0
            stopped_early = len(request) > 5 and bool(request[5])
            batch = self._mean_batch(now, served) if served > 0 else max(running, 1)
            step_s = self.step_times.exact(batch)
            self._done.append(
                _Done(
                    self._busy,
                    self._slot_s,
                    tokens,
                    served,
                    batch,
                    step_s,
                    generated,
                    decode_share,
                    stopped_early,
                )
            )
        if preempted:
            self._preempted.append((self._busy, preempted))
        if finished or preempted:
            self._summary = None

    def state(self) -> SaturationState:
        """What the steps ingested so far add up to, as of the last one."""
        if self._last is None:
            return SaturationState(kv_usage=self._kv_usage)
        now, running, waiting = self._last
        if self._summary is None:
            self._summary = self._summarize()
        summary = self._summary
        kv_usage, held_over = self._kv_usage, self._held_over
        if summary.count < self.min_finished:
            # Too few finished to forecast; the step times are shown already (/warden/state).
            return SaturationState(
                running,
                waiting,
                kv_usage=kv_usage,
                queue_held_over=held_over,
                step_times=self.step_times,
            )
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
            recent_service=summary.recent_service,
            finish_step_s=summary.finish_step_s,
            recent_output=summary.recent_output,
            step_times=self.step_times,
            batch_peaks=self.batch_peaks,
            pace_record=self.pace,
            measured_at=now,
            kv_usage=kv_usage,
            queue_held_over=held_over,
            sustained_batch=self._mean_batch(now, SUSTAINED_SHARE * summary.service_s)
            if summary.service_s
            else 0,
        )

    def _checkpoint(self, now: float, running: int) -> None:
        at, slots = self._checkpoint_at, self._checkpoint_slots
        if at and now < at[-1]:  # the clock went back: start the record again
            at.clear()
            slots.clear()
        if slots and slots[-1][1] == running:
            return  # the same batch since the last reading: the slot clock follows from it
        at.append(now)
        slots.append((self._slot_s, running))
        if len(at) > CHECKPOINTS:
            del at[: CHECKPOINTS // 2]
            del slots[: CHECKPOINTS // 2]

    def _mean_batch(self, now: float, served: float) -> int:
        """The mean running count over the ``served`` seconds before ``now``, from the slot
        clock (read at the last batch change before then, and run on at that batch)."""
        start = now - served
        index = bisect.bisect_right(self._checkpoint_at, start) - 1
        if index < 0:  # older than the record: from its oldest reading
            index, start = 0, self._checkpoint_at[0]
        slot_then, running_then = self._checkpoint_slots[index]
        slot_at_start = slot_then + (start - self._checkpoint_at[index]) * running_then
        span = now - start
        if span <= 0:
            return max(running_then, 1)
        return max(1, round((self._slot_s - slot_at_start) / span))

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
            service_s=nearest_rank([entry.served_s for entry in counted], SERVICE_QUANTILE),
            recent_service=tuple((entry.served_s, entry.batch) for entry in counted),
            finish_step_s=tuple(entry.step_s for entry in counted),
            recent_output=_recent_output(counted),
            tokens_per_request=sum(entry.tokens for entry in counted) / len(counted),
            preemptions=sum(n for _at, n in self._preempted),
        )


class _Done(NamedTuple):
    """One recent completion, as the meter keeps it."""

    busy: float  # the busy clock when it finished
    slots: float  # the slot clock, same
    tokens: int  # prompt + generated
    served_s: float
    batch: int  # the mean batch it was served in
    step_s: float | None  # a step's time at that batch then (None: not timed)
    generated: int | None  # None: not known
    decode_share: float  # of ``served_s``, decoding
    stopped_early: bool = False  # the model ended it before its limit


def _recent_output(counted: list[_Done]) -> tuple[RecentOutput, ...]:
    """What each completion generated, where vLLM said for all of them: a window that mixes
    known and unknown lengths is not scaled at all (``service_times_for``)."""
    found = []
    for entry in counted:
        if entry.generated is None:
            return ()
        found.append(
            RecentOutput(
                entry.generated,
                entry.decode_share,
                entry.tokens - entry.generated,
                entry.stopped_early,
            )
        )
    return tuple(found)


@dataclass(frozen=True)
class _Completions:
    """The recent completions the meter measures from: how many, the busy-clock reading the
    drain rate counts from, their service quantile and mean size, the preemptions since."""

    count: int
    reference: float = 0.0
    slot_reference: float = 0.0
    service_s: float | None = None
    recent_service: tuple[tuple[float, int], ...] = ()
    finish_step_s: tuple[float | None, ...] = ()
    recent_output: tuple[RecentOutput, ...] = ()
    tokens_per_request: float | None = None
    preemptions: int = 0
