"""A tiny shared-memory board of floats, so the API process sees worker-side signals per step.

The watermark is computed in the API process once per engine step, but the allocator and
device signals live in the process that owns the device. Reading them through HTTP or a file
per step would put I/O on the step path; a memory-mapped slot costs a memory load. Writers own
one slot each (by local rank); a NaN slot means "no value".
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import tempfile

ENV_VAR = "WARDEN_SIGNAL_BOARD"
MAX_RANKS = 16
# Per rank: device used ratio, torch reserved ratio, unix time of the sample.
FIELDS = ("device", "torch_reserved", "timestamp")
_SLOT = struct.Struct("<" + "d" * len(FIELDS))
SIZE = _SLOT.size * MAX_RANKS


class SignalBoard:
    def __init__(self, path: str, create: bool = False) -> None:
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, SIZE)
                os.pwrite(fd, _SLOT.pack(*([math.nan] * len(FIELDS))) * MAX_RANKS, 0)
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

    def write(self, rank: int, device: float, torch_reserved: float, timestamp: float) -> None:
        if 0 <= rank < MAX_RANKS:
            _SLOT.pack_into(self._map, rank * _SLOT.size, device, torch_reserved, timestamp)

    def read_max(self, max_age_s: float, now: float) -> dict[str, float]:
        """Worst value of each signal over the ranks whose sample is fresh enough."""
        worst: dict[str, float] = {}
        for rank in range(MAX_RANKS):
            device, reserved, stamp = _SLOT.unpack_from(self._map, rank * _SLOT.size)
            if math.isnan(stamp) or now - stamp > max_age_s:
                continue
            for name, value in (("device", device), ("torch_reserved", reserved)):
                if not math.isnan(value):
                    worst[name] = max(worst.get(name, 0.0), value)
        return worst

    def unlink(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
