"""One supervised vLLM server: its process tree, a hard stop, and what it says over HTTP.

The supervisor needs more than ``EngineProcess`` offers: the pids of the engine core and
workers (a child that vanishes under a live server is a crash), a stop that works on stopped
(SIGSTOP) processes, and short-timeout probes of the server's own endpoints.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from warden.engine_process import EngineProcess
from warden.launch import LaunchSpec

# Process titles vLLM sets (setproctitle): VLLM::EngineCore, VLLM::EngineCore_DP0, VLLM::Worker.
_ROLE = re.compile(r"VLLM::(EngineCore|Worker)")


def process_role(proc: psutil.Process) -> str | None:
    """'EngineCore' or 'Worker' for vLLM's engine processes, else None."""
    try:
        text = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    match = _ROLE.search(text)
    return match.group(1) if match else None


def engine_children(pid: int) -> dict[int, str]:
    """The engine core and worker processes under a vLLM server: pid -> role."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for child in children:
        role = process_role(child)
        if role is not None:
            found[child.pid] = role
    return found


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass
class Probe:
    """A short HTTP answer from the server: status code and JSON body (None if no answer)."""

    status: int | None
    body: Any = None

    @property
    def answered(self) -> bool:
        return self.status is not None


class SupervisedEngine(EngineProcess):
    def __init__(self, spec: LaunchSpec, log_path: Path | None = None) -> None:
        super().__init__(spec, log_path)
        self.children: dict[int, str] = {}
        self._client = httpx.Client(timeout=2.0)

    def start(self) -> None:
        """Like ``EngineProcess.start``, but without a log file vLLM's output goes to ours."""
        if self.log_path is not None:
            super().start()
            return
        self.process = subprocess.Popen(
            self.spec.argv(), env=self.spec.environment(), start_new_session=True
        )

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def returncode(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def refresh_children(self) -> None:
        """Remember the engine core and workers (they appear during start-up)."""
        if self.pid is not None and self.returncode() is None:
            self.children.update(engine_children(self.pid))

    def vanished_children(self) -> list[str]:
        """Roles of remembered engine processes that no longer run."""
        return [f"{role} (pid {pid})" for pid, role in self.children.items() if is_gone(pid)]

    def kill(self) -> None:
        """SIGKILL the whole process group at once: works on stopped (SIGSTOP) processes too,
        and never waits on a hung engine's graceful shutdown."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.stop()

    def close(self) -> None:
        self._client.close()

    # --- HTTP probes ------------------------------------------------------------------

    def get(self, path: str, timeout: float = 2.0) -> Probe:
        try:
            response = self._client.get(f"{self.base_url}{path}", timeout=timeout)
        except httpx.HTTPError:
            return Probe(None)
        try:
            body = response.json()
        except ValueError:
            body = response.text
        return Probe(response.status_code, body)

    def post(self, path: str, json: Any, headers: dict[str, str] | None = None) -> Probe:
        try:
            response = self._client.post(f"{self.base_url}{path}", json=json, headers=headers)
        except httpx.HTTPError:
            return Probe(None)
        try:
            body = response.json()
        except ValueError:
            body = response.text
        return Probe(response.status_code, body)

    def delete(self, path: str, headers: dict[str, str] | None = None) -> Probe:
        try:
            response = self._client.delete(f"{self.base_url}{path}", headers=headers)
        except httpx.HTTPError:
            return Probe(None)
        return Probe(response.status_code)

    def metrics_text(self) -> str | None:
        probe = self.get("/metrics", timeout=5.0)
        return probe.body if probe.status == 200 and isinstance(probe.body, str) else None
