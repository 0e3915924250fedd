"""A tiny shared-memory board of floats, so the API process sees worker-side signals per step.

The watermark is computed in the API process once per engine step, but the allocator and
device signals live in the process that owns the device. Reading them through HTTP or a file
per step would put I/O on the step path; a memory-mapped slot costs a memory load. Writers own
one slot each (by local rank); a NaN slot means "no value".

A second region is a ring of request ids whose logits went non-finite: the worker's logits
processor writes them, the API server's middleware looks its request up there before it lets
a response out, so a poisoned request is retried or failed instead of returned as garbage.

A fourth region holds the host memory risk of the engine's processes (exporter/host_memory.py):
one slot, written by the API process's collector thread, read with the device slots.

A write counter (the last region) changes with every memory-risk write, so a reader that
remembers what it read, and until when it stays fresh, need not read the slots again on every
step: ``MemorySignals``.

A third region says how far the logits flags are resolved: per engine slot, the number of logits
steps checked (``applied``) and how many of them have their flags read on the host
(``resolved``). On a GPU the flags reach the host a little after the step (no sync on the step
path), so the middleware waits, boundedly, until ``resolved`` catches up with the ``applied``
it saw when a response ended, instead of letting a poisoned last token out unnoticed.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import tempfile

from exporter.settings import env_name

ENV_VAR = env_name("signal_board")  # set for the process tree by the API process
_FLAG_BYTES = {"nan": b"n", "inf": b"i", "masked": b"m"}  # a flag's kind, one byte on the board
_FLAG_KINDS = {flag[0]: kind for kind, flag in _FLAG_BYTES.items()}
MAX_RANKS = 16
# Per rank: the device and allocator memory risks (exporter/memory_risk.py), unix time of the
# sample. The names are the watermark's sources (catalog.MEMORY_RISK_SOURCES).
FIELDS = ("device", "allocator", "timestamp")
_SLOT = struct.Struct("<" + "d" * len(FIELDS))
SIGNALS_SIZE = _SLOT.size * MAX_RANKS
RING_SLOTS = 1024
RID_BYTES = 47  # request ids longer than this are truncated (warden's own are 32)
_RING_SLOT = RID_BYTES + 1  # id + kind byte
_RING_HEADER = struct.Struct("<Q")
RING_OFFSET = SIGNALS_SIZE
PROGRESS_OFFSET = RING_OFFSET + _RING_HEADER.size + RING_SLOTS * _RING_SLOT
_PROGRESS = struct.Struct("<QQ")  # applied, resolved
_ALL_PROGRESS = struct.Struct("<" + "QQ" * MAX_RANKS)  # every slot's, in one read
HOST_OFFSET = PROGRESS_OFFSET + _PROGRESS.size * MAX_RANKS
HOST_SOURCE = "host"  # the host slot's watermark source (catalog.MEMORY_RISK_SOURCES)
_HOST = struct.Struct("<dd")  # risk, unix time of the sample
WRITES_OFFSET = HOST_OFFSET + _HOST.size
_WRITES = struct.Struct("<Q")  # memory-risk writes so far (device slots and host)
SIZE = WRITES_OFFSET + _WRITES.size


class SignalBoard:
    def __init__(self, path: str, create: bool = False) -> None:
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, SIZE)
                os.pwrite(fd, _SLOT.pack(*([math.nan] * len(FIELDS))) * MAX_RANKS, 0)
                os.pwrite(fd, _RING_HEADER.pack(0), RING_OFFSET)
                os.pwrite(fd, bytes(_PROGRESS.size * MAX_RANKS), PROGRESS_OFFSET)
                os.pwrite(fd, _HOST.pack(math.nan, math.nan), HOST_OFFSET)
                os.pwrite(fd, _WRITES.pack(0), WRITES_OFFSET)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)

    @classmethod
    def create_for_process_tree(cls) -> SignalBoard:
        """Create a board and publish its path in the environment children inherit."""
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix="warden-signals-", dir=directory)
        os.close(fd)
        board = cls(path, create=True)
        os.environ[ENV_VAR] = path
        return board

    def write(self, rank: int, device: float, allocator: float, timestamp: float) -> None:
        """This rank's risks (NaN: not measured here) as of ``timestamp``."""
        if 0 <= rank < MAX_RANKS:
            _SLOT.pack_into(self._map, rank * _SLOT.size, device, allocator, timestamp)
            self._count_write()

    def write_host(self, risk: float, timestamp: float) -> None:
        """The host memory risk of the engine's processes (NaN: not measured)."""
        _HOST.pack_into(self._map, HOST_OFFSET, risk, timestamp)
        self._count_write()

    def _count_write(self) -> None:
        # After the data: a reader that sees the new count reads the new values. Two writers
        # racing may count one write where there were two; the count still changes.
        (count,) = _WRITES.unpack_from(self._map, WRITES_OFFSET)
        _WRITES.pack_into(self._map, WRITES_OFFSET, count + 1)

    def writes(self) -> int:
        """Memory-risk writes so far: unchanged means every slot holds what it held."""
        return int(_WRITES.unpack_from(self._map, WRITES_OFFSET)[0])

    def read_max(
        self, max_age_s: float, now: float, host_max_age_s: float | None = None
    ) -> dict[str, float]:
        """Worst value of each signal over the ranks whose sample is fresh enough, and the host
        risk if its sample is (``host_max_age_s``, default ``max_age_s``)."""
        return self.read_max_until(max_age_s, now, host_max_age_s)[0]

    def read_max_until(
        self, max_age_s: float, now: float, host_max_age_s: float | None = None
    ) -> tuple[dict[str, float], float]:
        """``read_max`` and the time until which it holds with no new write: when the first
        sample it counted grows too old."""
        worst: dict[str, float] = {}
        until = math.inf
        host, stamp = _HOST.unpack_from(self._map, HOST_OFFSET)
        host_age = max_age_s if host_max_age_s is None else host_max_age_s
        if not math.isnan(host) and not math.isnan(stamp) and now - stamp <= host_age:
            worst[HOST_SOURCE] = host
            until = stamp + host_age
        for rank in range(MAX_RANKS):
            *values, stamp = _SLOT.unpack_from(self._map, rank * _SLOT.size)
            if math.isnan(stamp) or now - stamp > max_age_s:
                continue
            counted = False
            for name, value in zip(FIELDS, values, strict=False):
                if not math.isnan(value):
                    worst[name] = max(worst.get(name, 0.0), value)
                    counted = True
            if counted:
                until = min(until, stamp + max_age_s)
        return worst, until

    def flag_request(self, request_id: str, kind: str) -> None:
        """Record that ``request_id`` produced non-finite logits (``kind`` nan or inf), or had
        every token masked by its own constraints (``kind`` masked)."""
        rid = request_id.encode("ascii", "replace")[:RID_BYTES].ljust(RID_BYTES, b"\0")
        (count,) = _RING_HEADER.unpack_from(self._map, RING_OFFSET)
        slot = RING_OFFSET + _RING_HEADER.size + (count % RING_SLOTS) * _RING_SLOT
        self._map[slot : slot + _RING_SLOT] = rid + _FLAG_BYTES.get(kind, b"i")
        _RING_HEADER.pack_into(self._map, RING_OFFSET, count + 1)

    def flagged(self, request_id: str) -> str | None:
        """'nan', 'inf' or 'masked' if ``request_id`` was flagged (among the last RING_SLOTS)."""
        if not _RING_HEADER.unpack_from(self._map, RING_OFFSET)[0]:
            return None  # nothing was ever flagged: the usual answer, without a search
        rid = request_id.encode("ascii", "replace")[:RID_BYTES].ljust(RID_BYTES, b"\0")
        start = RING_OFFSET + _RING_HEADER.size
        position = self._map.find(rid, start)
        while position != -1:
            if (position - start) % _RING_SLOT == 0:
                return _FLAG_KINDS.get(self._map[position + RID_BYTES], "inf")
            position = self._map.find(rid, position + 1)
        return None

    def publish_progress(self, slot: int, applied: int, resolved: int) -> None:
        """Logits steps checked and resolved so far by the engine in ``slot`` (monotonic)."""
        if 0 <= slot < MAX_RANKS:
            offset = PROGRESS_OFFSET + slot * _PROGRESS.size
            _PROGRESS.pack_into(self._map, offset, applied, resolved)

    def progress(self) -> list[tuple[int, int]]:
        """(applied, resolved) of every slot an engine has written (others read (0, 0))."""
        values = _ALL_PROGRESS.unpack_from(self._map, PROGRESS_OFFSET)
        return list(zip(values[::2], values[1::2], strict=True))

    def unresolved(self) -> tuple[int, ...] | None:
        """None when every slot has resolved every logits step it applied (a CPU engine, and a
        GPU one between steps); else each slot's applied count, to wait for. One read."""
        values = _ALL_PROGRESS.unpack_from(self._map, PROGRESS_OFFSET)
        applied = values[::2]
        return None if applied == values[1::2] else applied

    def unlink(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class MemorySignals:
    """The board's memory risks as of each step, read again only when a writer wrote or a
    sample it counted grew too old: the answer is ``read_max``'s at every call, and a step in
    between costs one counter load instead of a read of every slot."""

    def __init__(self, board: SignalBoard) -> None:
        self.board = board
        self._key: tuple[int, float, float | None] | None = None  # writes, ages read with
        self._read_at = math.inf
        self._until = -math.inf
        self._signals: dict[str, float] = {}

    def unchanged(self, now: float) -> bool:
        """Whether ``read`` with the ages of the last read would return what it returned then:
        no writer wrote since, and no sample it counted grew too old (one counter load)."""
        key = self._key
        return (
            key is not None
            and self._read_at <= now <= self._until
            and key[0] == self.board.writes()
        )

    def read(
        self, max_age_s: float, now: float, host_max_age_s: float | None = None
    ) -> dict[str, float]:
        """``read_max(max_age_s, now, host_max_age_s)``; do not change the dict returned."""
        key = (self.board.writes(), max_age_s, host_max_age_s)
        # A clock that went back could make an old sample fresh again: read it.
        if key != self._key or now > self._until or now < self._read_at:
            self._signals, self._until = self.board.read_max_until(max_age_s, now, host_max_age_s)
            self._key, self._read_at = key, now
        return self._signals
