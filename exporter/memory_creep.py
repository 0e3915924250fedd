"""Test switch: an engine core whose host memory creeps at a rate set from outside.

Warden's memory path (host risk, watermark, reflex, time-to-OOM, the supervisor's restart) must
be proven on a live engine, and a CPU engine's memory does not creep by itself. With
``WARDEN_TEST_MEMORY_CREEP=1`` (off unless set; never set by the generated compose and
Kubernetes files) the engine core runs a daemon thread that grows the process's own memory the
way a leak, a fragmenting allocator or a graph pool does: touched pages it keeps and never uses.
The rate comes from a control file named after the engine core's pid (``warden-creep-<pid>``
in /dev/shm, one number, MB/s), which the thread creates at 0 when it starts (so its presence
says the switch is on: vLLM's process title overwrites what /proc shows of the core's
environment) and ``warden chaos creep --rate MB/s`` rewrites; 0 stops the growth and frees what
it held. The file is removed when the engine core exits, or, if it was killed, by the next
engine core that starts with the switch. The thread never touches the
engine's step: it allocates in its own time.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import tempfile
import threading
import time
from multiprocessing.util import Finalize
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from exporter import import_hooks
from exporter.settings import env_name, load_settings

log = logging.getLogger("warden.exporter")
SWITCH_ENV = env_name("test_memory_creep")
CORE_MODULE = "vllm.v1.engine.core"
MB = 1_000_000
MAX_RATE_MB_S = 1000.0
# Never more than this share of the machine, whatever the rate and however long it runs.
MAX_SHARE = 0.5


def control_path(pid: int) -> Path:
    """The file that holds the creep rate of the engine core with this pid."""
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return Path(directory) / f"warden-creep-{pid}"


def read_rate(path: Path) -> float:
    """MB/s the control file asks for; 0 when it is missing or not a sane number."""
    with contextlib.suppress(OSError, ValueError):
        rate = float(path.read_text().strip() or 0)
        if 0 <= rate <= MAX_RATE_MB_S:
            return rate
    return 0.0


def write_rate(path: Path, rate_mb_s: float) -> None:
    """Set the rate atomically (the engine's thread reads a whole number or the old one)."""
    if not 0 <= rate_mb_s <= MAX_RATE_MB_S:
        raise ValueError(f"creep rate {rate_mb_s} MB/s is not in 0..{MAX_RATE_MB_S:g}")
    fd, tmp = tempfile.mkstemp(prefix=".creep-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{rate_mb_s:g}\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class MemoryCreep:
    """Grows held memory at the control file's rate; ``tick`` is one step of its thread."""

    def __init__(self, control: Path, max_bytes: int, tick_s: float = 0.25) -> None:
        self.control = control
        self.max_bytes = max_bytes
        self.tick_s = tick_s
        self.held: list[bytearray] = []
        self.held_bytes = 0
        self._debt = 0.0  # bytes owed by rounding
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self, elapsed_s: float) -> None:
        rate = read_rate(self.control)
        if rate <= 0:
            if self.held:
                log.warning("warden: memory creep off, %d MB freed", self.held_bytes // MB)
            self.held.clear()
            self.held_bytes = 0
            self._debt = 0.0
            return
        self._debt += rate * MB * elapsed_s
        grow = min(int(self._debt), self.max_bytes - self.held_bytes)
        if grow <= 0:
            return
        self._debt -= grow
        # Filled, not just allocated: zero pages would not be resident.
        self.held.append(bytearray(b"\x5a") * grow)
        self.held_bytes += grow

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="warden-memory-creep", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.tick_s):
            now = time.monotonic()
            try:
                self.tick(now - last)
            except MemoryError:
                log.warning("warden: memory creep stopped by MemoryError")
            last = now

    def stop(self) -> None:
        self._stop.set()


_state: dict[str, Any] = {}


def install() -> None:
    """With the switch on, start the creep thread in the engine core when its busy loop starts
    (patched on import, so a forked engine core inherits it). No-op when the switch is off."""
    if not load_settings().test_memory_creep:
        return
    import_hooks.when_imported(CORE_MODULE, _patch)


def _patch(core_module: ModuleType) -> None:
    proc = core_module.EngineCoreProc
    original = proc.run_busy_loop
    if getattr(original, "_warden_creep", False):
        return

    def run_busy_loop(self: Any) -> Any:
        start_creep()
        return original(self)

    run_busy_loop._warden_creep = True  # type: ignore[attr-defined]
    proc.run_busy_loop = run_busy_loop


def prune_stale(directory: Path) -> int:
    """Remove control files of engine cores that are gone (one killed by a signal leaves its
    file behind); the number removed."""
    removed = 0
    for path in directory.glob("warden-creep-*"):
        pid = path.name.rpartition("-")[2]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            _remove(path)
            removed += 1
    return removed


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def start_creep() -> MemoryCreep | None:
    """The creep thread of this process (one), with its control file at rate 0."""
    if "creep" in _state:
        return _state["creep"]  # type: ignore[no-any-return]
    path = control_path(os.getpid())
    prune_stale(path.parent)
    write_rate(path, 0.0)
    # A multiprocessing child (vLLM's engine core) leaves through os._exit, past atexit; its
    # finalizers still run.
    Finalize(None, _remove, args=(path,), exitpriority=10)
    atexit.register(_remove, path)
    creep = MemoryCreep(path, int(psutil.virtual_memory().total * MAX_SHARE))
    creep.start()
    _state["creep"] = creep
    log.warning(
        "warden: TEST SWITCH %s=1: this engine core grows its memory at the rate written to %s "
        "(warden chaos creep)",
        SWITCH_ENV,
        creep.control,
    )
    return creep
