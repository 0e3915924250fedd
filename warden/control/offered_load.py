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
        """Requests surely offered per second up to ``now``: the larger of the rate over the
        window and over its last ``short_s`` (each over its whole buckets before ``now`` and
        the current one in part), each counted less one Poisson standard deviation
        (``sure_count``). So an overload shows within its first second, and a burst at once
        reads as at most its size over three quarters of that second, less its chance.

        Why less its chance: arrivals at a light load are Poisson, and the moments admission
        judges a deep or long request are the ones they bunched in. Read as counted, a 0.5x
        load's bunches read 10.5-14.0 a second where 5.8 were offered, over a full batch's
        drain of 8.2-10.8 (issue #28, quick check 65), so the engine read as not keeping up
        and an overload's remembered pace margin scaled a light load's deep slots (run 64:
        26 refused at 0.5x, deep slots behind a bunch). An overload's count stands well clear
        of its deviation: 20 a second for 0.8 s reads 15."""
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
            sure_count(sum(counts)) / max((self._size - 1) * self.bucket_s + part, self.bucket_s),
            sure_count(sum(counts[-self._short :]))
            / max((self._short - 1) * self.bucket_s + part, self.bucket_s),
        )


def sure_count(count: int) -> float:
    """A count of Poisson arrivals less its standard deviation (the square root of the count):
    the count the rate behind it surely gives, at about one chance in six of less."""
    return max(0.0, count - math.sqrt(count))
