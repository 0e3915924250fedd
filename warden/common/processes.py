"""The one wrapper around a child server process: the engine, Prometheus, Alertmanager, Grafana.

A child gets a new session, so a Ctrl-C in the terminal reaches only its parent (``warden up``,
the supervisor), which then stops the children in order; stopping signals the whole group (a
process and anything it forked), escalates to SIGKILL, and finally kills any descendant that
left the group. ``kill`` skips the graceful part: it works on stopped (SIGSTOP) processes and
never waits on a hung server's shutdown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx
import psutil

from warden.common.waiting import WaitAborted, wait_until


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
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(10)
    _kill_all(survivors, max(0.0, deadline - time.monotonic()))


def kill_tree(pid: int, popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGKILL the group led by ``pid`` and every descendant at once, no grace."""
    survivors = descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(10)
    _kill_all(survivors, 0.0)


def _kill_all(processes: Sequence[psutil.Process], grace_s: float) -> None:
    alive = [p for p in processes if p.is_running()]
    if alive and grace_s > 0:
        _, alive = psutil.wait_procs(alive, timeout=min(grace_s, 5.0))
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    if alive:
        psutil.wait_procs(alive, timeout=5.0)


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``url`` answers 200 right now."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def wait_http_ok(
    url: str,
    timeout_s: float,
    alive: Callable[[], bool] = lambda: True,
    what: str = "",
) -> float:
    """Poll ``url`` until it answers 200; seconds taken. Fails early when ``alive()`` is false."""
    started = time.monotonic()
    try:
        wait_until(
            lambda: http_ok(url),
            timeout_s,
            interval_s=0.2,
            what=f"{what or url} ready",
            abort=lambda: not alive(),
        )
    except WaitAborted:
        raise ChildStartError(f"{what or url} exited before it was ready") from None
    except TimeoutError:
        raise ChildStartError(f"{what or url} not ready after {timeout_s:.0f}s") from None
    return time.monotonic() - started


class OutputTail:
    """Copies a child's output to this process's stdout line by line, keeping the last lines.

    A child without a log file writes to our stdout as before, through this pump, so that when
    it dies the lines that say why are still at hand (``lines``). A failed echo (our stdout
    closed) stops the echo, never the draining: a child must not block on a full pipe.
    """

    def __init__(self, keep_lines: int = 1000, echo_fd: int | None = 1) -> None:
        self._lines: deque[str] = deque(maxlen=keep_lines)
        self._lock = threading.Lock()
        self._echo_fd = echo_fd
        self._thread: threading.Thread | None = None

    def follow(self, pipe: IO[bytes], name: str) -> None:
        self._thread = threading.Thread(
            target=self._pump, args=(pipe,), name=f"{name}-output", daemon=True
        )
        self._thread.start()

    def _pump(self, pipe: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in iter(pipe.readline, b""):
                if self._echo_fd is not None:
                    try:
                        os.write(self._echo_fd, raw)
                    except OSError:
                        self._echo_fd = None
                with self._lock:
                    self._lines.append(raw.decode(errors="replace").rstrip("\n"))
        with contextlib.suppress(OSError):
            pipe.close()

    def wait_closed(self, timeout_s: float) -> None:
        """Until the child's output ended (all its writers exited), at most ``timeout_s``."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)


class ChildProcess:
    """One server: started in its own session, output to a log file, or to ours when None
    (then through an ``OutputTail`` when ``keep_tail``, so ``output_lines`` has its last words).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path | None,
        ready_url: str,
        env: Mapping[str, str] | None = None,
        keep_tail: bool = False,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.ready_url = ready_url
        self.env = dict(os.environ if env is None else env)
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.tail: OutputTail | None = OutputTail() if keep_tail and log_path is None else None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def returncode(self) -> int | None:
        """None while it runs (or before it started), else its exit status."""
        return None if self.process is None else self.process.poll()

    def returncode_within(self, timeout_s: float) -> int | None:
        """Its exit status once it exits, waiting up to ``timeout_s``; None if it still runs."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        output: IO[bytes] | int | None = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = output = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        elif self.tail is not None:
            output = subprocess.PIPE
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            start_new_session=True,
        )
        if self.tail is not None and self.process.stdout is not None:
            self.tail.follow(self.process.stdout, self.name)

    def wait_ready(self, timeout_s: float = 60.0) -> float:
        """Block until the ready URL answers 200; the seconds it took."""
        try:
            return wait_http_ok(self.ready_url, timeout_s, self.running, self.name)
        except ChildStartError as exc:
            message = f"{exc}; log: {self.log_path}" if self.log_path else str(exc)
            tail = self.log_tail()
            raise ChildStartError(f"{message}\n{tail}" if tail else message) from None

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.output_lines()[-lines:])

    def output_lines(self, max_bytes: int = 1 << 20) -> list[str]:
        """The child's last output lines: the end of its log file, or the kept tail."""
        if self.log_path is not None:
            with contextlib.suppress(OSError), open(self.log_path, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - max_bytes))
                return log.read().decode(errors="replace").splitlines()
            return []
        return self.tail.lines() if self.tail is not None else []

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL the group and its descendants."""
        if self.process is not None:
            terminate_tree(self.process.pid, self.process, timeout_s)
        self._close_log()

    def kill(self) -> None:
        """SIGKILL at once: the group and every descendant."""
        if self.process is not None:
            kill_tree(self.process.pid, self.process)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
