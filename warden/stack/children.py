"""Child processes of the native stack, each in its own process group, all stoppable.

A child gets a new session, so a Ctrl-C in the terminal reaches only ``warden up``, which then
stops the children in order; stopping signals the whole group (a process and anything it
forked), escalates to SIGKILL, and finally kills any descendant that left the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx
import psutil


class ChildStartError(RuntimeError):
    """A child exited or never became ready; the message points at its log."""


def descendants(pid: int) -> list[psutil.Process]:
    """The live processes below ``pid`` (empty when it is gone)."""
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def terminate_tree(
    pid: int,
    popen: subprocess.Popen[bytes] | None = None,
    timeout_s: float = 15.0,
) -> None:
    """SIGTERM the process group led by ``pid``, wait, then SIGKILL it and every descendant."""
    survivors = descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if popen is not None:
        popen.wait(10)
    _kill_all(survivors, max(0.0, deadline - time.monotonic()))


def _kill_all(processes: Sequence[psutil.Process], grace_s: float) -> None:
    alive = [p for p in processes if p.is_running()]
    if alive:
        _, alive = psutil.wait_procs(alive, timeout=min(grace_s, 5.0))
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    if alive:
        psutil.wait_procs(alive, timeout=5.0)


def wait_http_ok(
    url: str,
    timeout_s: float,
    alive: Callable[[], bool] = lambda: True,
    what: str = "",
) -> float:
    """Poll ``url`` until it answers 200; seconds taken. Fails early when ``alive()`` is false."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not alive():
            raise ChildStartError(f"{what or url} exited before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return time.monotonic() - started
        time.sleep(0.2)
    raise ChildStartError(f"{what or url} not ready after {timeout_s:.0f}s")


class ChildProcess:
    """One server binary of the stack: started in its own session, output to a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        ready_url: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.ready_url = ready_url
        self.env = dict(os.environ if env is None else env)
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 60.0) -> float:
        try:
            return wait_http_ok(self.ready_url, timeout_s, self.running, self.name)
        except ChildStartError as exc:
            raise ChildStartError(f"{exc}; log: {self.log_path}\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is not None:
            terminate_tree(self.process.pid, self.process, timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
