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

# Over how many seconds the rate is read, in buckets of this many: an overload shows within
# about a second, and a burst of a few requests at once is spread over the window.
OFFERED_WINDOW_S = 2.0
OFFERED_BUCKET_S = 0.25


class OfferedLoad:
    """Requests offered in each ``bucket_s`` of the last ``window_s``: a ring of counts, so a
    request counts in constant time whatever the rate. Thread-safe: requests count on the
    event loop, ``/warden/state`` reads from elsewhere."""

    def __init__(self, window_s: float = OFFERED_WINDOW_S, bucket_s: float = OFFERED_BUCKET_S):
        self.bucket_s = bucket_s
        self._size = max(1, math.ceil(window_s / bucket_s))
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
        """Requests offered per second over the window up to ``now`` (its current bucket in
        part: the window's length is the whole buckets before it plus that part)."""
        last = int(now // self.bucket_s)
        with self._lock:
            count = sum(
                self._count[bucket % self._size]
                for bucket in range(last - self._size + 1, last + 1)
                if self._bucket[bucket % self._size] == bucket
            )
        span = (self._size - 1) * self.bucket_s + (now - last * self.bucket_s)
        return count / max(span, self.bucket_s)
