"""The supervisor against a stand-in vLLM server: real processes, fast.

The stand-in (this file run as a script) is a small HTTP server with an ``VLLM::EngineCore``
child process, answering the endpoints the supervisor reads (/health, /warden/ready,
/warden/state, /metrics, /warden/degrade, /fault_tolerance/*) from files a test writes in a
control folder. It starts in a fraction of a second, so every supervisor rule gets a test with
real processes, signals and HTTP, without waiting a minute per vLLM start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

# --- the stand-in server (runs as a script) -------------------------------------------------


def _engine_child(title: str) -> None:
    import setproctitle

    setproctitle.setproctitle(title)
    control = Path(os.environ["FAKE_CONTROL_DIR"])
    helper_asked = control / f"fork_helper_{title.split('::')[1]}"
    while True:
        if helper_asked.exists():
            # A helper forked without exec, as a library in vLLM's processes may start one: it
            # carries its parent's title for its short life (a forked child before its exec
            # does too).
            helper_asked.unlink()
            helper = os.fork()
            if helper == 0:
                time.sleep(float(os.environ.get("FAKE_HELPER_S", "1.5")))
                os._exit(0)
            # Written whole, then renamed: the test reads it as soon as it exists, and a file
            # created and then written was once read empty in between.
            (control / "helper_pid.tmp").write_text(str(helper))
            (control / "helper_pid.tmp").rename(control / "helper_pid")
            os.waitpid(helper, 0)
            (control / "helper_done").touch()
        time.sleep(0.05)


def _serve(port: int, args: list[str]) -> None:
    control = Path(os.environ["FAKE_CONTROL_DIR"])
    token = os.environ.get("WARDEN_WEBHOOK_TOKEN")
    born = time.time()
    time.sleep(float(os.environ.get("FAKE_START_S", "0.2")))
    if (control / "fail_start").exists():
        # Like vLLM: the root cause from the engine core, then the API server's wrapper.
        print(f"(EngineCore_DP0 pid={os.getpid()}) ERROR 11-23 14:18:28 [core.py:1] Traceback")
        print(f"(EngineCore_DP0 pid={os.getpid()}) ERROR 11-23 14:18:28 [core.py:1] ValueError: "
              "fake vLLM cannot start: not enough memory on the CPU backend.")  # fmt: skip
        print("RuntimeError: Engine core initialization failed. See root cause above.")
        sys.stdout.flush()
        raise SystemExit(int((control / "fail_start").read_text() or 1))
    child = subprocess.Popen([sys.executable, __file__, "--child"])
    # A model worker beside the engine core, as vLLM's multiprocessing executor starts one.
    worker = (
        subprocess.Popen([sys.executable, __file__, "--worker"])
        if (control / "with_worker").exists()
        else None
    )
    (control / f"argv-{os.getpid()}.json").write_text(json.dumps(args))

    def flag(name: str) -> str | None:
        path = control / name
        return path.read_text() if path.exists() else None

    def own_flag(name: str) -> str | None:
        """A flag set since this server started: one set before was its predecessor's (a
        restarted engine is a new process). Read as a plain flag, a "dead" status written
        for generation 1 was still there when generation 2 came up on a loaded machine,
        before the test could clear it, and generation 2 was restarted too (1 failure)."""
        path = control / name
        try:
            return path.read_text() if path.stat().st_mtime >= born else None
        except FileNotFoundError:
            return None

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: Any) -> None:  # noqa: A002
            return

        def _send(self, status: int, body: Any) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            if path == "/health":
                self._send(200, b"")
            elif path == "/warden/ready":
                time.sleep(float(flag("ready_delay_s") or 0))  # a slow, not a dead, server
                stalled = flag("stalled") is not None
                dead = flag("engine_dead") is not None
                driver = flag("driver_error") is not None
                checks = {
                    "engine": {"ok": not dead, "detail": "engine dead: EngineDeadError"},
                    "stalled": {"ok": not stalled, "detail": "1 requests pending"},
                    "driver_error": {"ok": not driver, "detail": "1 CUDA driver errors"},
                }
                ok = not (stalled or dead or driver)
                self._send(200 if ok else 503, {"checks": checks})
            elif path == "/warden/state":
                eager = flag("policy_eager") is not None
                # Memory risks by source, for this server's pid only: a restarted engine is
                # a new process and starts with none.
                signals = json.loads(flag("signals") or "{}").get(str(os.getpid()), {})
                body = {"policy": {"enforce_eager": eager}, "leases": [], "signals": signals}
                self._send(200, body)
            elif path == "/metrics":
                running = float(flag("inflight") or 0)
                text = f'vllm:num_requests_running{{engine="0"}} {running}\n'
                text += 'vllm:num_requests_waiting{engine="0"} 0.0\n'
                self._send(200, text.encode())
            elif path == "/fault_tolerance/status":
                status = own_flag("ft_status") or "healthy"
                self._send(200, {"engines": [{"id": 0, "status": status}]})
            else:
                self._send(404, {})

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/warden/degrade":
                if self.headers.get("Authorization") != f"Bearer {token}":
                    self._send(401, {})
                    return
                with open(control / "degrade.log", "a") as log:
                    log.write(body.decode() + "\n")
                self._send(200, {"lease": json.loads(body)})
            elif self.path == "/fault_tolerance/apply":
                with open(control / "ft_apply.log", "a") as log:
                    log.write(body.decode() + "\n")
                if flag("ft_retry_heals") is not None:
                    (control / "ft_status").write_text("healthy")
                self._send(202, {"request_id": "x"})
            else:
                self._send(404, {})

        def do_DELETE(self) -> None:  # noqa: N802
            with open(control / "degrade.log", "a") as log:
                log.write(f"DELETE {self.path}\n")
            self._send(200, {})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def on_term(*_: object) -> None:
        child.kill()
        if worker is not None:
            worker.kill()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    while child.poll() is None:
        if flag("close_port") is not None and server.socket.fileno() != -1:
            server.shutdown()  # alive, but nothing serves the port: connections are refused
            server.server_close()
        exit_code = flag("exit_code")
        if exit_code is not None and (control / "exit_now").exists():
            child.kill()
            raise SystemExit(int(exit_code))
        time.sleep(0.1)
    time.sleep(0.5)  # like vLLM: the server shuts down after its engine core died
    raise SystemExit(0)


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        _engine_child("VLLM::EngineCore")
    elif sys.argv[1:] == ["--worker"]:
        _engine_child("VLLM::Worker")
    else:
        _serve(int(sys.argv[2]), sys.argv[3:])


# --- tests ----------------------------------------------------------------------------------

from exporter import catalog  # noqa: E402
from exporter.supervisor_state import SupervisorState  # noqa: E402
from warden.common.metrics_text import value  # noqa: E402
from warden.common.ports import free_port  # noqa: E402
from warden.common.waiting import wait_until  # noqa: E402
from warden.engine.launch import LaunchSpec  # noqa: E402
from warden.supervisor import first_start  # noqa: E402
from warden.supervisor.config import SupervisorConfig  # noqa: E402
from warden.supervisor.engine import EngineProcess, engine_children, is_gone  # noqa: E402
from warden.supervisor.loop import Supervisor  # noqa: E402

TOKEN = "test-token"


@dataclass
class FakeSpec(LaunchSpec):
    def argv(self) -> list[str]:
        return [sys.executable, __file__, "--port", str(self.port), *self.extra_args]


@dataclass
class Harness:
    supervisor: Supervisor
    control: Path
    thread: threading.Thread
    control_url: str
    status: list[int]  # Supervisor.run()'s return value, once it returned

    @property
    def serving_url(self) -> str:
        return f"http://127.0.0.1:{self.supervisor.spec.port}"

    def state(self) -> SupervisorState:
        return SupervisorState.load(self.supervisor.state_path)

    def wait(self, what: str, condition: Callable[[], bool], timeout: float = 20.0) -> None:
        try:
            wait_until(condition, timeout, 0.05, what)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}; state: {self.state()}") from None

    def wait_running(self, generation: int) -> None:
        self.wait(
            f"generation {generation} ready",
            lambda: self.supervisor.engine_ready() and self.state().generation == generation,
        )

    def engine_core_pid(self) -> int:
        engine = self.supervisor.engine
        assert engine is not None and engine.pid is not None
        pid = engine.pid

        def known_core() -> int | None:
            cores = [p for p, role in engine_children(pid).items() if role == "EngineCore"]
            if cores and cores[0] in engine.children:  # the supervisor knows it too
                return cores[0]
            return None

        try:
            return wait_until(known_core, 10, 0.05, "the EngineCore child")
        except TimeoutError:
            raise AssertionError("no EngineCore child") from None

    def engine_signals(self, **risks: float) -> None:
        """The memory risks the running engine reports on /warden/state from now on."""
        engine = self.supervisor.engine
        assert engine is not None and engine.pid is not None
        (self.control / "signals").write_text(json.dumps({str(engine.pid): risks}))

    def post(self, path: str, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(f"{self.control_url}{path}", headers=headers, timeout=5)

    def delete(self, path: str, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.delete(f"{self.control_url}{path}", headers=headers, timeout=5)


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    started: list[Harness] = []

    def start(
        extra_args: tuple[str, ...] = (), run_dir: Path | None = None, **overrides: Any
    ) -> Harness:
        control = tmp_path / "control"
        control.mkdir(exist_ok=True)
        settings: dict[str, Any] = {
            "max_restarts": 5,
            "backoff_base_s": 0.2,
            "backoff_max_s": 1.0,
            "poll_s": 0.05,
            "probe_s": 0.1,
            "children_poll_s": 0.1,
            "policy_poll_s": 0.1,
            "stall_grace_s": 0.3,
            "unhealthy_grace_s": 1.0,
            "start_timeout_s": 20.0,
            "stop_timeout_s": 5.0,
            "drain_timeout_s": 5.0,
            "ft_recovery_timeout_s": 3.0,
            "control_port": 0,
        }
        settings.update(overrides)
        spec = FakeSpec(
            "fake-model",
            port=free_port(),
            extra_args=list(extra_args),
            env={"FAKE_CONTROL_DIR": str(control), "WARDEN_WEBHOOK_TOKEN": TOKEN},
        )
        supervisor = Supervisor(spec, run_dir or tmp_path / "run", SupervisorConfig(**settings))
        status: list[int] = []
        thread = threading.Thread(target=lambda: status.append(supervisor.run()), daemon=True)
        thread.start()
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: supervisor.control, 5, 0.01, "the control server")
        assert supervisor.control is not None
        harness = Harness(
            supervisor, control, thread, f"http://127.0.0.1:{supervisor.control.port}", status
        )
        started.append(harness)
        return harness

    yield start
    for harness in started:
        harness.supervisor.stop()
        harness.thread.join(20)
        engine = harness.supervisor.engine
        if engine is not None and engine.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(engine.process.pid, signal.SIGKILL)
        assert not harness.thread.is_alive(), "supervisor did not stop"


def test_killed_engine_core_is_restarted_and_counted_as_crash(
    supervised: Callable[..., Harness],
) -> None:
    h = supervised()
    h.wait_running(1)
    os.kill(h.engine_core_pid(), signal.SIGKILL)
    h.wait_running(2)
    state = h.state()
    assert state.restart_totals == {"crash": 1}
    event = state.restarts[-1]
    assert event.reason == "crash" and "EngineCore" in event.detail
    assert event.duration_s is not None and 0 < event.duration_s < 10
    status = httpx.get(f"{h.control_url}/supervisor/state", timeout=5).json()
    assert status["engine_ready"] and status["restart_totals"]["crash"] == 1
    metrics = httpx.get(f"{h.control_url}/metrics", timeout=5).text
    assert value(metrics, catalog.ENGINE_RESTARTS.name, reason="crash") == 1


def test_engine_core_failing_after_its_worker_is_named_with_it(
    supervised: Callable[..., Harness],
) -> None:
    """A failed engine core takes its worker down before it exits itself: the supervisor's
    first look sees only the worker gone, and the restart must still name both."""
    h = supervised()
    (h.control / "with_worker").touch()
    h.wait_running(1)
    engine = h.supervisor.engine
    assert engine is not None
    h.wait("the worker known", lambda: "Worker" in engine.children.values())
    core = h.engine_core_pid()
    worker = next(pid for pid, role in engine.children.items() if role == "Worker")
    os.kill(worker, signal.SIGKILL)
    h.wait("the worker seen gone", lambda: is_gone(worker))
    time.sleep(0.5)  # several of the supervisor's looks (every 0.05 s) see only the worker gone
    os.kill(core, signal.SIGKILL)  # the server exits 0.5 s after its engine core
    h.wait_running(2)
    event = h.state().restarts[-1]
    assert event.reason == "crash"
    assert f"Worker (pid {worker})" in event.detail, event.detail
    assert f"EngineCore (pid {core})" in event.detail, event.detail


@pytest.mark.parametrize("role", ["EngineCore", "Worker"])
def test_a_helper_an_engine_process_forks_is_not_an_engine_process(
    supervised: Callable[..., Harness], role: str
) -> None:
    """A forked helper of the engine core (or of a worker) has its parent's title while it runs
    and is gone when it is done: the engine is healthy, and neither the supervisor nor anyone
    asking for the engine core takes the helper for one."""
    h = supervised()
    (h.control / "with_worker").touch()
    h.wait_running(1)
    engine = h.supervisor.engine
    assert engine is not None and engine.pid is not None
    h.wait("the worker known", lambda: "Worker" in engine.children.values())
    core = h.engine_core_pid()
    (h.control / f"fork_helper_{role}").touch()
    h.wait("the helper forked", lambda: (h.control / "helper_pid").exists())
    helper = int((h.control / "helper_pid").read_text())
    seen_as: set[str | None] = set()
    while not (h.control / "helper_done").exists():
        seen_as.add(engine_children(engine.pid).get(helper))
        time.sleep(0.02)
    time.sleep(0.5)  # several of the supervisor's looks after the helper exited
    assert seen_as == {None}, seen_as
    assert helper not in engine.children, engine.children
    assert [p for p, r in engine_children(engine.pid).items() if r == "EngineCore"] == [core]
    state = h.state()
    assert state.generation == 1 and not state.restarts, state.restarts
    assert h.supervisor.engine_ready()


def test_exit_codes_restart_with_growing_backoff(supervised: Callable[..., Harness]) -> None:
    h = supervised(backoff_base_s=0.5, backoff_max_s=5.0)
    h.wait_running(1)
    # The supervisor knows the engine core before the server exits 3 and takes it down
    # (on a fast machine it does; the exit is the server's own all the same).
    engine = h.supervisor.engine
    assert engine is not None
    h.wait("the engine core known", lambda: "EngineCore" in engine.children.values())
    (h.control / "exit_code").write_text("3")
    (h.control / "exit_now").touch()
    h.wait("three restarts", lambda: sum(h.state().restart_totals.values()) >= 3)
    (h.control / "exit_now").unlink()
    h.wait_running(4)
    events = h.state().restarts
    assert [e.reason for e in events] == ["exit"] * 3
    assert all("exit code 3" in e.detail for e in events)
    gaps = [b.restarted_at - a.restarted_at for a, b in zip(events, events[1:], strict=False)]
    # Attempts 2 and 3 waited 0.5 s and 1 s on top of the (fast) start.
    assert gaps[0] >= 0.5 and gaps[1] >= 1.0, gaps


def test_stalled_engine_is_killed_and_restarted(supervised: Callable[..., Harness]) -> None:
    h = supervised()
    h.wait_running(1)
    core = h.engine_core_pid()
    os.kill(core, signal.SIGSTOP)  # a stopped process only dies by SIGKILL
    (h.control / "stalled").touch()
    h.wait("stalled restart", lambda: h.state().restart_totals.get("stalled") == 1)
    (h.control / "stalled").unlink()
    h.wait_running(2)
    h.wait("stopped engine core gone", lambda: not Path(f"/proc/{core}").exists())


def test_dead_engine_after_the_grace_and_driver_errors_at_once_are_unhealthy(
    supervised: Callable[..., Harness],
) -> None:
    # The grace is far above what noticing takes on a loaded machine (up to about 1 s with
    # the suite's workers on two cores): at a grace of 1 s, a poisoned context noticed in
    # 0.94 s read as if it had waited for it.
    grace_s = 3.0
    h = supervised(unhealthy_grace_s=grace_s)
    h.wait_running(1)
    (h.control / "engine_dead").touch()
    noticed = time.time()
    h.wait("dead engine restart", lambda: h.state().generation == 2)
    (h.control / "engine_dead").unlink()
    event = h.state().restarts[-1]
    assert event.reason == "unhealthy" and "EngineDeadError" in event.detail
    assert event.failed_at - noticed >= grace_s - 0.1, "waited for the grace"
    h.wait_running(2)
    (h.control / "driver_error").touch()
    noticed = time.time()
    h.wait("driver error restart", lambda: h.state().generation == 3)
    (h.control / "driver_error").unlink()
    event = h.state().restarts[-1]
    assert event.reason == "unhealthy" and "CUDA driver" in event.detail
    assert event.failed_at - noticed < grace_s / 2, "no grace for a poisoned context"


def test_a_slow_server_gets_the_long_grace_and_a_closed_port_the_short_one(
    supervised: Callable[..., Harness],
) -> None:
    """Probes that time out (a busy or paged-out server) are not a dead engine: the restart
    waits for ``unresponsive_grace_s``; a refused connection waits only ``unhealthy_grace_s``."""
    h = supervised(unhealthy_grace_s=1.0, unresponsive_grace_s=6.0)
    h.wait_running(1)
    (h.control / "ready_delay_s").write_text("2.5")  # over the supervisor's 2 s probe timeout
    slow_since = time.time()
    h.wait("slow server restart", lambda: h.state().generation == 2, timeout=30)
    (h.control / "ready_delay_s").unlink()
    event = h.state().restarts[-1]
    assert event.reason == "unhealthy" and "timed out" in event.detail, event
    assert event.failed_at - slow_since >= 6.0, "a slow server got the long grace"
    h.wait_running(2)
    (h.control / "close_port").touch()
    closed_at = time.time()
    h.wait("closed port restart", lambda: h.state().generation == 3, timeout=30)
    (h.control / "close_port").unlink()
    event = h.state().restarts[-1]
    assert event.reason == "unhealthy" and "connection refused" in event.detail, event
    assert 1.0 <= event.failed_at - closed_at < 6.0, "a refused port got the short grace"
    h.wait_running(3)


def test_restart_loop_opens_the_circuit_and_the_stand_in_says_why(
    supervised: Callable[..., Harness],
) -> None:
    h = supervised(max_restarts=1)
    h.wait_running(1)
    os.kill(h.engine_core_pid(), signal.SIGKILL)
    h.wait_running(2)
    os.kill(h.engine_core_pid(), signal.SIGKILL)
    h.wait("circuit open", lambda: h.state().circuit_open)
    state = h.state()
    assert state.phase == "circuit_open" and "limit 1" in state.circuit_reason

    def answer() -> httpx.Response | None:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{h.serving_url}/warden/ready", timeout=2)
        return None

    ready = None
    with contextlib.suppress(TimeoutError):
        ready = wait_until(answer, 10, 0.05, "the stand-in's /warden/ready")
    assert ready is not None and ready.status_code == 503
    assert "supervisor_circuit" in ready.json()["failing"]
    assert "limit 1" in ready.json()["checks"]["supervisor_circuit"]["detail"]
    refused = httpx.post(f"{h.serving_url}/v1/completions", json={}, timeout=2)
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    assert httpx.get(f"{h.serving_url}/warden/live", timeout=2).status_code == 200
    metrics = httpx.get(f"{h.serving_url}/metrics", timeout=2).text
    assert value(metrics, catalog.SUPERVISOR_CIRCUIT_OPEN.name) == 1
    time.sleep(0.5)
    assert h.state().generation == 2, "no restart while the circuit is open"
    assert h.post("/supervisor/reset", token="wrong").status_code == 401
    assert h.post("/supervisor/reset").status_code == 202
    h.wait_running(3)
    state = h.state()
    assert not state.circuit_open and state.restarts[-1].reason == "manual"


def test_open_circuit_survives_a_supervisor_restart_until_reset(
    supervised: Callable[..., Harness], tmp_path: Path
) -> None:
    run_dir = tmp_path / "persistent"
    state = SupervisorState()
    state.open_circuit("5 restarts in the last 3600s (limit 5)", time.time())
    state.save(run_dir / "supervisor-state.json")
    h = supervised(run_dir=run_dir)
    time.sleep(0.5)
    assert h.state().generation == 0 and h.state().phase == "circuit_open"
    h.supervisor.stop()
    h.thread.join(10)
    h2 = supervised(run_dir=run_dir, reset_circuit=True)
    h2.wait_running(1)


def test_policy_enforce_eager_drains_and_restarts_eager_until_cleared(
    supervised: Callable[..., Harness], tmp_path: Path
) -> None:
    run_dir = tmp_path / "eager-run"
    h = supervised(run_dir=run_dir)
    h.wait_running(1)
    (h.control / "inflight").write_text("2")
    (h.control / "policy_eager").touch()
    h.wait("drain lease", lambda: (h.control / "degrade.log").exists())
    lease = json.loads((h.control / "degrade.log").read_text().splitlines()[0])
    assert lease["action"] == "stop_admission" and lease["key"] == "supervisor-drain"
    assert lease["ttl_s"] > 5 and lease["params"] == {}
    time.sleep(0.5)
    assert h.state().draining and h.state().generation == 1, "waits for in-flight requests"
    assert h.state().eager, "decided before the drain: a crash meanwhile still restarts eager"
    (h.control / "inflight").write_text("0")
    (h.control / "policy_eager").unlink()
    h.wait_running(2)
    state = h.state()
    assert state.eager and not state.draining
    assert state.restarts[-1].reason == "enforce_eager"
    argv_files = sorted(h.control.glob("argv-*.json"), key=lambda p: p.stat().st_mtime)
    assert "--enforce-eager" in json.loads(argv_files[-1].read_text())
    assert "--enforce-eager" not in json.loads(argv_files[0].read_text())
    # Eager mode is kept across supervisor restarts, until cleared.
    h.supervisor.stop()
    h.thread.join(10)
    h2 = supervised(run_dir=run_dir)
    h2.wait_running(3)
    assert h2.state().eager
    assert h2.post("/supervisor/eager", token=None).status_code == 401
    assert h2.post("/supervisor/eager").status_code == 202  # already eager: nothing to do
    h2.supervisor.stop()
    h2.thread.join(10)
    h3 = supervised(run_dir=run_dir, clear_eager=True)
    h3.wait_running(4)
    assert not h3.state().eager


def test_memory_creep_drains_and_restarts_earlier_when_it_comes_back_until_forgotten(
    supervised: Callable[..., Harness],
) -> None:
    h = supervised()
    h.wait_running(1)
    assert h.state().memory_restart_risk == {"device": 0.9, "allocator": 0.9, "host": 0.9}
    h.engine_signals(host=0.85, device=0.1)
    time.sleep(0.5)
    assert h.state().generation == 1, "below the restart risk: nothing happens"
    h.engine_signals(host=0.93)
    h.wait_running(2)
    state = h.state()
    event = state.restarts[-1]
    assert (event.reason, state.restart_totals) == ("memory", {"memory": 1})
    assert event.detail.startswith("host memory risk 0.930 reached 0.90"), event.detail
    lease = json.loads((h.control / "degrade.log").read_text().splitlines()[0])
    assert lease["action"] == "stop_admission", "drained before the restart"
    # The creep is remembered: the same source now restarts at the early risk.
    assert state.memory_restart_risk["host"] == 0.6 and state.memory_restart_risk["device"] == 0.9
    assert "if it comes back" in state.memory_remediation
    metrics = httpx.get(f"{h.control_url}/metrics", timeout=5).text
    assert value(metrics, catalog.MEMORY_RESTART_RISK.name, source="host") == 0.6
    h.engine_signals(host=0.65)
    h.wait_running(3)
    state = h.state()
    assert "(early: the same creep" in state.restarts[-1].detail
    assert "crept back" in state.memory_remediation
    # This machine's engine is vLLM's CPU build: no eager switch, and the record says why.
    assert "eager mode does not apply" in state.memory_remediation and not state.eager
    # One command undoes it.
    assert h.delete("/supervisor/memory", token=None).status_code == 401
    assert h.delete("/supervisor/memory").status_code == 202
    h.wait("creeps forgotten", lambda: h.state().memory_restart_risk["host"] == 0.9)
    assert not h.state().memory_creeps and not h.state().memory_remediation
    h.engine_signals(host=0.65)
    time.sleep(0.5)
    assert h.state().generation == 3, "back at the usual restart risk"


def test_planned_restart_beyond_the_limit_keeps_the_engine_and_opens_the_circuit(
    supervised: Callable[..., Harness],
) -> None:
    h = supervised(max_restarts=1)
    h.wait_running(1)
    os.kill(h.engine_core_pid(), signal.SIGKILL)
    h.wait_running(2)
    assert h.post("/supervisor/eager").status_code == 202
    h.wait("circuit open", lambda: h.state().circuit_open)
    time.sleep(0.3)
    state = h.state()
    assert state.generation == 2 and state.phase == "running" and not state.eager
    assert h.supervisor.engine is not None and h.supervisor.engine.returncode() is None


def test_manual_restart_is_not_counted_toward_the_circuit(
    supervised: Callable[..., Harness],
) -> None:
    h = supervised(max_restarts=1)
    h.wait_running(1)
    for generation in (2, 3):
        assert h.post("/supervisor/restart").status_code == 202
        h.wait_running(generation)
    state = h.state()
    assert state.restart_totals == {"manual": 2} and not state.circuit_open


def test_fault_tolerance_retry_in_place_then_process_restart_when_dead(
    supervised: Callable[..., Harness],
) -> None:
    h = supervised(extra_args=("--enable-fault-tolerance",))
    h.wait_running(1)
    (h.control / "ft_retry_heals").touch()
    (h.control / "ft_status").write_text("unhealthy")
    h.wait("in-place retry", lambda: h.state().restart_totals.get("unhealthy") == 1)
    h.wait("recovered", lambda: h.state().restarts[-1].duration_s is not None)
    assert json.loads((h.control / "ft_apply.log").read_text()) == {"instruction": "retry"}
    assert h.state().generation == 1, "recovered without a process restart"
    (h.control / "ft_status").write_text("dead")
    # The new process starts healthy: "dead" was generation 1's (the fake's ``own_flag``).
    h.wait_running(2)
    state = h.state()
    assert state.restarts[-1].detail == "fault tolerance: engine reported dead"
    assert (state.generation, state.restart_totals) == (2, {"unhealthy": 2})


def test_engine_that_fails_its_first_start_is_not_restarted_and_says_why(
    supervised: Callable[..., Harness], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A vLLM that exits before it was ever ready on the first start would fail the same way
    on every restart (bad flag, no model, no memory): the supervisor stops with vLLM's own
    error line and a hint, and exits non-zero."""
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "fail_start").write_text("2")
    with caplog.at_level(logging.CRITICAL, logger="warden.supervisor"):
        h = supervised(max_restarts=2, backoff_base_s=0.1, backoff_max_s=0.2)
        h.thread.join(20)
    assert not h.thread.is_alive(), "the supervisor must stop by itself"
    assert h.status == [first_start.EXIT_FIRST_START_FAILED]
    state = h.state()
    assert state.generation == 1 and state.restart_totals == {} and not state.circuit_open
    assert state.phase == "stopped" and state.engine_pid is None
    message = caplog.records[-1].getMessage()
    assert "exit code 2" in message and "first start" in message
    assert "vLLM said: ValueError: fake vLLM cannot start: not enough memory" in message
    assert "VLLM_CPU_KVCACHE_SPACE" in message  # the hint for that error
    assert "See root cause above" not in message


def test_failed_start_after_the_engine_was_ready_is_restarted(
    supervised: Callable[..., Harness],
) -> None:
    """Only the first start is judged final: an engine that served once and then fails to
    start again is restarted (with backoff) until the circuit opens."""
    h = supervised(max_restarts=2, backoff_base_s=0.1, backoff_max_s=0.2)
    h.wait_running(1)
    (h.control / "fail_start").write_text("2")
    os.kill(h.engine_core_pid(), signal.SIGKILL)
    h.wait("circuit open", lambda: h.state().circuit_open)
    state = h.state()
    assert state.restart_totals == {"crash": 1, "exit": 1}
    assert "before it was ready" in state.restarts[-1].detail
    assert h.thread.is_alive() and h.status == []


def test_failed_starts_after_a_long_healthy_run_still_back_off(
    supervised: Callable[..., Harness],
) -> None:
    h = supervised(max_restarts=4, backoff_base_s=0.4, backoff_max_s=5.0, backoff_reset_s=0.5)
    h.wait_running(1)
    time.sleep(0.8)  # served longer than stable_s: the next crash starts a new episode
    (h.control / "fail_start").write_text("1")
    os.kill(h.engine_core_pid(), signal.SIGKILL)
    h.wait("four restarts", lambda: sum(h.state().restart_totals.values()) >= 4)
    events = h.state().restarts
    gaps = [b.restarted_at - a.restarted_at for a, b in zip(events, events[1:], strict=False)]
    # Restart 1 at once, then 0.4, 0.8, 1.6 s waits on top of each failed start.
    assert gaps[0] >= 0.4 and gaps[1] >= 0.8 and gaps[2] >= 1.6, gaps


def test_supervisor_stop_leaves_no_process_behind(supervised: Callable[..., Harness]) -> None:
    h = supervised()
    h.wait_running(1)
    core = h.engine_core_pid()
    os.kill(core, signal.SIGSTOP)
    engine = h.supervisor.engine
    assert isinstance(engine, EngineProcess) and engine.pid is not None
    server = engine.pid
    h.supervisor.stop()
    h.thread.join(20)
    assert not h.thread.is_alive()
    for pid in (server, core):
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), pid
    assert h.state().phase == "stopped"


def _is_zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    return True


def test_a_stop_drains_in_flight_requests_first(supervised: Callable[..., Harness]) -> None:
    h = supervised(drain_timeout_s=30.0)
    h.wait_running(1)
    (h.control / "inflight").write_text("2")
    h.supervisor.stop()
    h.wait("drain lease", lambda: (h.control / "degrade.log").exists())
    lease = json.loads((h.control / "degrade.log").read_text().splitlines()[0])
    assert lease["action"] == "stop_admission"
    time.sleep(0.5)
    assert h.thread.is_alive() and h.state().draining, "waits for the requests in flight"
    assert h.supervisor.engine is not None and h.supervisor.engine.returncode() is None
    (h.control / "inflight").write_text("0")
    h.thread.join(20)
    assert h.status == [0] and h.state().phase == "stopped" and not h.state().draining


def test_a_second_stop_skips_the_rest_of_the_drain(supervised: Callable[..., Harness]) -> None:
    h = supervised(drain_timeout_s=60.0)
    h.wait_running(1)
    (h.control / "inflight").write_text("2")
    h.supervisor.stop()
    h.wait("drain lease", lambda: (h.control / "degrade.log").exists())
    stopping = time.monotonic()
    h.supervisor.stop()  # a second SIGTERM/SIGINT
    h.thread.join(20)
    assert not h.thread.is_alive() and time.monotonic() - stopping < 10
    assert h.status == [0] and h.state().phase == "stopped"


def test_no_drain_on_stop_stops_at_once(supervised: Callable[..., Harness]) -> None:
    h = supervised(drain_on_stop=False)
    h.wait_running(1)
    (h.control / "inflight").write_text("2")
    h.supervisor.stop()
    h.thread.join(20)
    assert h.status == [0] and not (h.control / "degrade.log").exists()
