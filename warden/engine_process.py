"""A vLLM server child process: start it with warden's hooks, wait until it serves, stop it.

Used by ``warden demo``, the tests and (later) the supervisor, so all of them start and stop an
engine the same way: its own process group, so stopping it leaves no engine core or worker
behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx

from warden.launch import LaunchSpec


class EngineStartError(RuntimeError):
    pass


class EngineProcess:
    def __init__(self, spec: LaunchSpec, log_path: Path | None = None) -> None:
        self.spec = spec
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    def start(self) -> None:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.spec.argv(),
            env=self.spec.environment(),
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 300.0) -> float:
        """Block until /health answers 200; return the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise EngineStartError(
                    f"vLLM exited with {self.process.returncode} before it was ready"
                    f"{'; log: ' + str(self.log_path) if self.log_path else ''}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return time.monotonic() - started
            time.sleep(0.5)
        raise EngineStartError(f"vLLM not ready after {timeout_s:.0f}s (log: {self.log_path})")

    def stop(self, timeout_s: float = 30.0) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        if process is not None:
            # Children that outlived the leader (engine core, workers) go too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EngineProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
