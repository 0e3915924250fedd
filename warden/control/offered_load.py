"""Requests offered to admission per second: the load the engine is asked to carry.

Every request admission judges counts, admitted or refused, a refused client's return too:
set against what the engine drains at a full batch it tells an overload from a light load's
burst (``SaturationState.overloaded`` in exporter/saturation.py), which the engine's own
counts cannot, since admission keeps its queue short either way. Counted only where a
saturation limit is set (``Controller.admit``): the default config pays nothing for it.
"""

from __future__ import annotations

import math
import threading

# Over how many seconds the rate is read, in buckets of this many, and over how many of the
# last of them as well (``OfferedLoad.rate``: the larger of the two). A burst of a few
# requests at once is spread over the window; an overload shows within its first second. Read
# over two seconds alone, a 2x load after a quiet spell read as one only 1.5-1.6 s in, and the
# deep slots admitted before (its first second's queue behind a batch filling with prefills,
# steps 1.3-1.6x the next seconds') were judged on the last minute's pace alone: 8 of them
# late at 2x in run 61 (issue #28).
OFFERED_WINDOW_S = 2.0
OFFERED_SHORT_S = 1.0
OFFERED_BUCKET_S = 0.25


class OfferedLoad:
    """Requests offered in each ``bucket_s`` of the last ``window_s``: a ring of counts, so a
    request counts in constant time whatever the rate. Thread-safe: requests count on the
    event loop, ``/warden/state`` reads from elsewhere."""

    def __init__(
        self,
        window_s: float = OFFERED_WINDOW_S,
        bucket_s: float = OFFERED_BUCKET_S,
        short_s: float = OFFERED_SHORT_S,
    ):
        self.bucket_s = bucket_s
        self._size = max(1, math.ceil(window_s / bucket_s))
        self._short = min(self._size, max(1, math.ceil(short_s / bucket_s)))
        self._bucket = [-1] * self._size  # which bucket each slot holds now
        self._count = [0] * self._size
        self._lock = threading.Lock()

    def note(self, now: float) -> None:
        """One request offered at ``now``."""
        bucket = int(now // self.bucket_s)
        slot = bucket % self._size
        with self._lock:
            if self._bucket[slot] != bucket:
                self._bucket[slot], self._count[slot] = bucket, 0
            self._count[slot] += 1

    def rate(self, now: float) -> float:
        """Requests offered per second up to ``now``: the larger of the rate over the window
        and over its last ``short_s`` (each over its whole buckets before ``now`` and the
        current one in part), so an overload shows within its first second and a burst at
        once reads as at most its size over three quarters of that second."""
        last = int(now // self.bucket_s)
        part = now - last * self.bucket_s
        with self._lock:
            counts = [
                self._count[bucket % self._size]
                if self._bucket[bucket % self._size] == bucket
                else 0
                for bucket in range(last - self._size + 1, last + 1)
            ]
        return max(
            sum(counts) / max((self._size - 1) * self.bucket_s + part, self.bucket_s),
            sum(counts[-self._short :])
            / max((self._short - 1) * self.bucket_s + part, self.bucket_s),
        )
