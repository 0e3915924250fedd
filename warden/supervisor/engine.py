"""One vLLM server child: started with every warden hook, its process tree, its HTTP answers.

Used by the supervisor, ``warden demo``, the tests and the benchmarks, so all of them start,
probe and stop an engine the same way. On top of the shared ``ChildProcess`` it knows vLLM's
shape: the pids of the engine core and workers (a child that vanishes under a live server is a
crash), readiness on ``/health``, and short-timeout probes of the server's own endpoints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from warden.common.processes import ChildProcess, ChildStartError
from warden.engine.launch import LaunchSpec

# Process titles vLLM sets (setproctitle): VLLM::EngineCore, VLLM::EngineCore_DP0, VLLM::Worker.
_ROLE = re.compile(r"VLLM::(EngineCore|Worker)")


class EngineStartError(ChildStartError):
    """vLLM exited, or did not answer /health, before it was ready."""


def process_role(proc: psutil.Process) -> str | None:
    """'EngineCore' or 'Worker' for vLLM's engine processes, else None."""
    try:
        text = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    match = _ROLE.search(text)
    return match.group(1) if match else None


def engine_children(pid: int) -> dict[int, str]:
    """The engine core and worker processes under a vLLM server: pid -> role.

    A process an engine process forks carries its title until it execs, and a forked helper
    for its whole life: a child with its parent's role is the parent's helper, not a second
    engine process (CI once saw such a helper of the engine core exit, and the supervisor
    restarted a healthy engine for a vanished "EngineCore")."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    roles: dict[int, str] = {}
    parents: dict[int, int] = {}
    for child in children:
        role = process_role(child)
        if role is None:
            continue
        try:
            parents[child.pid] = child.ppid()
        except psutil.NoSuchProcess:
            continue
        roles[child.pid] = role
    return {child: role for child, role in roles.items() if roles.get(parents[child]) != role}


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# Why a probe got no answer. A refused (or dropped) connection means nothing serves the port; a
# timeout means a server took the connection but is slow, which a paged-out or busy engine is.
REFUSED = "refused"
TIMED_OUT = "timed out"
PROBE_TIMEOUT_S = 2.0  # longest wait for one answer to a supervisor probe


@dataclass
class Probe:
    """A short HTTP answer from the server: status code and JSON body (None if no answer)."""

    status: int | None
    body: Any = None
    no_answer: str | None = None  # REFUSED or TIMED_OUT when status is None

    @property
    def answered(self) -> bool:
        return self.status is not None


class EngineProcess(ChildProcess):
    """A vLLM server with warden's hooks; ``with`` starts it, waits until ready, stops it."""

    def __init__(self, spec: LaunchSpec, log_path: Path | None = None) -> None:
        # Without a log file the output still reaches our stdout, and its tail is kept: when
        # vLLM dies before it is ready, its own error line is what the operator needs.
        super().__init__(
            "vllm",
            spec.argv(),
            log_path,
            f"http://{spec.host}:{spec.port}/health",
            env=spec.environment(),
            keep_tail=True,
        )
        self.spec = spec
        self.children: dict[int, str] = {}
        self._client = httpx.Client(timeout=PROBE_TIMEOUT_S)

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    def wait_ready(self, timeout_s: float = 300.0) -> float:
        """Block until /health answers 200; return the seconds it took."""
        try:
            return super().wait_ready(timeout_s)
        except ChildStartError as exc:
            code = self.returncode()
            head = f"vLLM exited with {code} before it was ready" if code is not None else ""
            raise EngineStartError(f"{head}{'; ' if head else ''}{exc}") from None

    # --- the process tree -------------------------------------------------------------

    def refresh_children(self) -> None:
        """Remember the engine core and workers (they appear during start-up)."""
        if self.pid is not None and self.returncode() is None:
            self.children.update(engine_children(self.pid))

    def vanished_children(self) -> list[str]:
        """Roles of remembered engine processes that no longer run."""
        return [f"{role} (pid {pid})" for pid, role in self.children.items() if is_gone(pid)]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EngineProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(30.0)
        self.close()

    # --- HTTP probes ------------------------------------------------------------------

    def _probe(
        self, method: str, path: str, timeout: float = PROBE_TIMEOUT_S, **kwargs: Any
    ) -> Probe:
        try:
            response = self._client.request(
                method, f"{self.base_url}{path}", timeout=timeout, **kwargs
            )
        except httpx.TimeoutException:
            return Probe(None, no_answer=TIMED_OUT)
        except httpx.HTTPError:
            return Probe(None, no_answer=REFUSED)
        try:
            body = response.json()
        except ValueError:
            body = response.text
        return Probe(response.status_code, body)

    def get(self, path: str, timeout: float = PROBE_TIMEOUT_S) -> Probe:
        return self._probe("GET", path, timeout)

    def post(self, path: str, json: Any, headers: dict[str, str] | None = None) -> Probe:
        return self._probe("POST", path, json=json, headers=headers)

    def delete(self, path: str, headers: dict[str, str] | None = None) -> Probe:
        return self._probe("DELETE", path, headers=headers)

    def metrics_text(self) -> str | None:
        probe = self.get("/metrics", timeout=5.0)
        return probe.body if probe.status == 200 and isinstance(probe.body, str) else None
