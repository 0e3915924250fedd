"""The engine container run natively (no Docker here): its entrypoint, with the environment
compose gives it, and the kubelet's view of the probes the Kubernetes manifest declares."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from exporter.supervisor_state import STATE_FILE, SupervisorState
from warden.common.ports import free_port
from warden.supervisor.engine import engine_children

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
ENGINE_MANIFEST = REPO / "deploy" / "kubernetes" / "engine.yaml"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def compose_engine_environment(env_file: Path, values: Mapping[str, str]) -> dict[str, str]:
    """The engine service's environment as ``docker-compose config`` resolves it, with
    ``values`` as the compose/.env knobs (everything else at the file's defaults)."""
    env_file.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    result = subprocess.run(
        ["docker-compose", "--env-file", str(env_file), "-f", str(COMPOSE_FILE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")},
    )
    engine = yaml.safe_load(result.stdout)["services"]["engine"]
    return {str(k): "" if v is None else str(v) for k, v in engine["environment"].items()}


def engine_container_spec() -> dict[str, Any]:
    """The engine container of the committed StatefulSet (what users apply)."""
    for doc in yaml.safe_load_all(ENGINE_MANIFEST.read_text()):
        if doc and doc["kind"] == "StatefulSet":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            return dict(container)
    raise AssertionError(f"no StatefulSet in {ENGINE_MANIFEST}")


@dataclass
class Container:
    """``python -m warden.stack.container`` with its data folder, ports and output."""

    process: subprocess.Popen[bytes]
    data_dir: Path
    port: int
    supervisor_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state_path(self) -> Path:
        return self.data_dir / "run" / STATE_FILE

    def state(self) -> SupervisorState:
        return SupervisorState.load(self.state_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def engine_core(self) -> int:
        server = self.state().engine_pid
        assert server is not None
        cores = [p for p, role in engine_children(server).items() if role == "EngineCore"]
        assert len(cores) == 1, engine_children(server)
        return cores[0]

    def kubelet(self, probe: str) -> bool:
        """The probe of the manifest's engine container, as the kubelet runs it: an HTTP GET
        on the named port; success is a status from 200 to 399 within the timeout."""
        spec = engine_container_spec()
        get = spec[probe]["httpGet"]
        ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
        local = {ports["http"]: self.port, ports["supervisor"]: self.supervisor_port}
        port = local[ports[get["port"]] if isinstance(get["port"], str) else get["port"]]
        timeout = float(spec[probe].get("timeoutSeconds", 1))
        try:
            status = httpx.get(f"http://127.0.0.1:{port}{get['path']}", timeout=timeout)
        except httpx.HTTPError:
            return False
        return 200 <= status.status_code < 400


def start_container(data_dir: Path, env: Mapping[str, str]) -> Container:
    """Start the entrypoint natively: ``env`` (the compose environment) on top of this
    process's, with free local ports and a local data folder."""
    port, supervisor_port = free_port(), free_port()
    log_path = data_dir / "container.log"
    environment = {
        **os.environ,
        **env,
        "WARDEN_HOST": "127.0.0.1",
        "WARDEN_PORT": str(port),
        "WARDEN_SUPERVISOR_PORT": str(supervisor_port),
        "WARDEN_DATA_DIR": str(data_dir),
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "warden.stack.container"],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Container(process, data_dir, port, supervisor_port, log_path)


def stop_container(container: Container, engine_pids: set[int]) -> None:
    """Backstop after the tests: no process of the container outlives them."""
    if container.process.poll() is None:
        container.process.send_signal(signal.SIGTERM)
        try:
            container.process.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(container.process.pid, signal.SIGKILL)
            container.process.wait(10)
    for pid in engine_pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
