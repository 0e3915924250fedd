"""How far the latency forecast is to be trusted, learnt from the requests admission let in.

Admission promises the latency SLO to each request it admits: it admits when the forecast
(queue wait + the request's service, warden/control/saturation.py) is within the SLO. The
forecast is built from the recent past, and the near future differs: a long answer served
beside other long ones, a preemption, a burst that lands together. Measured on the tiny
model, the 99th percentile of recent service times was outrun by one request in five of
those asking 140 tokens, and 2-5% of admitted requests missed the SLO at 2x-4x of capacity
(benchmarks/README.md, runs 8 and 10).

Rather than margins set by hand, each forecast is scaled by how far the forecasts of the
last ``window`` admitted requests fell short: the ``quantile`` of actual / forecast latency
(split conformal prediction). A request is admitted when ``factor x forecast`` is within the
SLO, so a request at the edge keeps it with probability ``quantile``. Where the forecast is
pessimistic (queue waits counted in whole batches), the factor falls below 1 and admits what
the raw forecast would refuse. Samples older than ``max_age_s`` count only while fewer than
``min_samples`` newer ones are there: a slow minute is forgotten as soon as enough requests
after it tell otherwise, and what was learnt outlasts an idle gap (with nothing learnt
after a gap, the first burst of the next load was admitted on the raw forecast and missed the
SLO; benchmarks/README.md, run 10). Until ``min_samples`` requests have been answered, the
factor is 1.
Bounded to ``[MIN_FACTOR, MAX_FACTOR]``: a handful of pathological requests (a client that
reads its stream slowly) cannot close admission, and an idle stretch cannot open it wide.
"""

from __future__ import annotations

import math
import threading
from collections import deque

WINDOW = 256  # admitted requests (about 15 s of the tiny model at capacity)
QUANTILE = 0.99
MIN_SAMPLES = 32
MAX_AGE_S = 60.0
MIN_FACTOR = 0.5
MAX_FACTOR = 4.0


class LatencyCalibration:
    """The quantile of actual / forecast latency over recently admitted requests.

    Thread-safe: requests finish on the event loop, ``/warden/state`` may read elsewhere."""

    def __init__(
        self,
        window: int = WINDOW,
        quantile: float = QUANTILE,
        min_samples: int = MIN_SAMPLES,
        bounds: tuple[float, float] = (MIN_FACTOR, MAX_FACTOR),
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self.quantile = quantile
        self.min_samples = min_samples
        self.bounds = bounds
        self.max_age_s = max_age_s
        self._ratios: deque[tuple[float, float]] = deque(maxlen=window)  # (answered at, ratio)
        self._factor: float | None = 1.0  # None: recompute on the next read
        self._lock = threading.Lock()

    def record(self, forecast_s: float, actual_s: float, now: float) -> None:
        """An admitted request answered at ``now``: ``actual_s`` from admission to its last
        byte, where admission forecast ``forecast_s`` (uncalibrated)."""
        if not (forecast_s > 0 and math.isfinite(forecast_s) and math.isfinite(actual_s)):
            return
        with self._lock:
            self._ratios.append((now, max(actual_s, 0.0) / forecast_s))
            self._factor = None

    def factor(self, now: float) -> float:
        """What each forecast is multiplied by before it is held against the SLO."""
        with self._lock:
            ratios = self._ratios
            while len(ratios) > self.min_samples and ratios[0][0] < now - self.max_age_s:
                ratios.popleft()
                self._factor = None
            if self._factor is None:
                self._factor = self._computed()
            return self._factor

    @property
    def samples(self) -> int:
        return len(self._ratios)

    def _computed(self) -> float:
        if len(self._ratios) < self.min_samples:
            return 1.0
        ordered = sorted(ratio for _at, ratio in self._ratios)
        rank = min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)
        low, high = self.bounds
        return min(high, max(low, ordered[rank]))
