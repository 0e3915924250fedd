"""``warden chaos``: argument bounds, the loopback guard, and finding and signalling the engine
core, against a stand-in process tree shaped like vLLM's (an API server listening on a port,
with a child titled ``VLLM::EngineCore``). The real engine is broken in test_stack_native."""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psutil
import pytest

from warden.common.ports import free_port
from warden.common.waiting import wait_until
from warden.stack import chaos

# A parent that listens like the API server and forks a child titled like vLLM's engine core.
SERVER = textwrap.dedent(
    """
    import signal, socket, subprocess, sys, time
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # reap the core when it dies, as vLLM does
    sock = socket.socket()
    sock.bind(("127.0.0.1", int(sys.argv[1])))
    sock.listen()
    core = subprocess.Popen(
        ["VLLM::EngineCore", "-c", "import time; time.sleep(120)"], executable=sys.executable
    )
    print(core.pid, flush=True)
    time.sleep(120)
    """
)


@contextlib.contextmanager
def fake_engine() -> Iterator[tuple[str, psutil.Process, psutil.Process]]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        core_pid = int(server.stdout.readline())
        url = f"http://127.0.0.1:{port}"

        def listening() -> bool:
            with contextlib.suppress(chaos.ChaosError):
                chaos.listening_process(port)
                return True
            return False

        with contextlib.suppress(TimeoutError):  # the tests then say what is missing
            wait_until(listening, 10, 0.05, "the fake engine listening")
        yield url, psutil.Process(server.pid), psutil.Process(core_pid)
    finally:
        for process in psutil.Process(server.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                process.kill()
        server.kill()
        server.wait(10)


def settled_status(process: psutil.Process, wanted: str, timeout: float = 5.0) -> str:
    """The status once it reads ``wanted`` (signals land asynchronously), or the last seen."""
    status = ""

    def reads_wanted() -> bool:
        nonlocal status
        status = process.status()
        return status == wanted

    with contextlib.suppress(TimeoutError):
        wait_until(reads_wanted, timeout, 0.02, f"status {wanted}")
    return status


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    chaos.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_are_bounded_and_point_at_the_local_engine() -> None:
    args = parse("pressure")
    assert (args.requests, args.concurrency, args.duration) == (500, 8, 30.0)
    assert chaos.is_loopback(args.engine_url)
    assert parse("stall").seconds == 10.0 and not parse("stall").no_resume
    assert parse("stall", "--no-resume").no_resume
    assert parse("nan", "--count", "5").count == 5


@pytest.mark.parametrize(
    "argv",
    [
        ("pressure", "--requests", "0"),
        ("pressure", "--requests", "100000"),
        ("pressure", "--duration", "0"),
        ("pressure", "--concurrency", "1000"),
        ("pressure", "--duration", "86400"),
        ("nan", "--count", "0"),
        ("stall", "--seconds", "-1"),
        ("explode",),
    ],
)
def test_out_of_bounds_arguments_are_refused(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8000", True),
        ("http://localhost:8000", True),
        ("http://127.0.0.2:8000", True),
        ("http://[::1]:8000", True),
        ("http://10.0.0.5:8000", False),
        ("http://engine:8000", False),
        ("http://example.com", False),
    ],
)
def test_loopback_only(url: str, loopback: bool) -> None:
    assert chaos.is_loopback(url) is loopback


@pytest.mark.parametrize("command", ["pressure", "nan", "stall", "crash"])
def test_every_command_refuses_a_remote_engine(command: str) -> None:
    lines: list[str] = []
    status = chaos.run(parse(command, "--engine-url", "http://10.1.2.3:8000"), out=lines.append)
    assert status == 1
    assert "loopback" in lines[-1]


def test_no_engine_listening_is_a_clear_error() -> None:
    lines: list[str] = []
    url = f"http://127.0.0.1:{free_port()}"
    assert chaos.run(parse("crash", "--engine-url", url), out=lines.append) == 1
    assert "is the engine running" in lines[-1]


def test_engine_core_is_found_below_the_process_on_the_port() -> None:
    with fake_engine() as (url, server, core):
        assert chaos.listening_process(chaos.engine_port(url)).pid == server.pid
        assert chaos.engine_core_for(url).pid == core.pid
        assert chaos.engine_core_for(url, server_pid=server.pid).pid == core.pid


FORKING_SERVER = """
import os, socket, sys, time
listening = socket.socket()
listening.bind(("127.0.0.1", 0))
listening.listen()
if os.fork() == 0:  # the engine core, forked as vLLM forks it on CUDA: it holds the socket too
    if os.fork() == 0:  # and its worker
        time.sleep(120)
        os._exit(0)
    time.sleep(120)
    os._exit(0)
print(listening.getsockname()[1], flush=True)
time.sleep(120)
"""


def test_the_server_is_found_where_its_forked_children_hold_its_socket_too() -> None:
    """psutil names the youngest holder of a shared socket: here the grandchild."""
    server = subprocess.Popen(
        [sys.executable, "-c", FORKING_SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        holders = wait_until(
            lambda: len(psutil.Process(server.pid).children(recursive=True)) == 2 or None,
            10,
            0.05,
            "the forked children",
        )
        assert holders
        assert chaos.listening_process(port).pid == server.pid
    finally:
        for child in psutil.Process(server.pid).children(recursive=True):
            child.kill()
        server.kill()
        server.wait(10)


def test_a_server_without_engine_core_is_reported() -> None:
    with fake_engine() as (url, server, core):
        core.kill()
        core.wait(5)
        with pytest.raises(chaos.ChaosError, match="no EngineCore process"):
            chaos.engine_core_for(url)


def test_stall_stops_then_resumes_the_engine_core() -> None:
    seen: list[str] = []
    with fake_engine() as (url, _server, core):
        lines: list[str] = []
        chaos.stall(
            url,
            0.5,
            out=lines.append,
            sleep=lambda _: seen.append(settled_status(core, psutil.STATUS_STOPPED)),
        )
        assert seen == [psutil.STATUS_STOPPED]
        assert settled_status(core, psutil.STATUS_SLEEPING) == psutil.STATUS_SLEEPING
        assert f"SIGSTOP sent to engine core PID {core.pid}" in lines[0]
        assert "SIGCONT" in lines[-1]


def test_stall_without_resume_leaves_it_stopped() -> None:
    with fake_engine() as (url, _server, core):
        lines: list[str] = []
        chaos.run(parse("stall", "--engine-url", url, "--no-resume"), out=lines.append)
        assert settled_status(core, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
        assert f"kill -CONT {core.pid}" in lines[-1]


def test_an_interrupted_stall_still_resumes() -> None:
    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    with fake_engine() as (url, _server, core):
        with pytest.raises(KeyboardInterrupt):
            chaos.stall(url, 30, out=lambda _: None, sleep=interrupted)
        assert settled_status(core, psutil.STATUS_SLEEPING) == psutil.STATUS_SLEEPING


def test_crash_kills_the_engine_core_only() -> None:
    with fake_engine() as (url, server, core):
        lines: list[str] = []
        assert chaos.run(parse("crash", "--engine-url", url), out=lines.append) == 0
        core.wait(5)
        assert not core.is_running()
        assert server.is_running()
        assert f"SIGKILL sent to engine core PID {core.pid}" in lines[-1]


Answer = tuple[int, dict[str, str], dict[str, Any]]  # status, headers, JSON body
COMPLETED_ANSWER: Answer = (200, {}, {"choices": []})


class CompletionsServer:
    """An OpenAI-style server that takes ``delay`` per completion and counts what it sees;
    the n-th completion gets ``answers[n % len(answers)]`` (default: a 200)."""

    def __init__(
        self, delay: float, answers: list[Answer] | None = None, models_delay: float = 0.0
    ) -> None:
        answers = answers or [COMPLETED_ANSWER]
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                time.sleep(models_delay)
                self._json({"data": [{"id": "tiny", "max_model_len": 300}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    answer = answers[len(outer.bodies) % len(answers)]
                    outer.bodies.append(body)
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                time.sleep(delay)
                with lock:
                    outer.in_flight -= 1
                status, headers, data = answer
                self._json(data, status, headers)

            def _json(
                self, data: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
            ) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_pressure_keeps_long_requests_in_flight_within_its_bounds() -> None:
    server = CompletionsServer(delay=0.1)
    try:
        lines: list[str] = []
        outcomes = chaos.pressure(server.url, 12, 3, 30.0, out=lines.append)
    finally:
        server.close()
    assert outcomes.counts == {"completed": 12}
    assert len(server.bodies) == 12 and server.max_in_flight == 3
    body = server.bodies[0]
    assert body["model"] == "tiny" and body["ignore_eos"] is True
    assert body["max_tokens"] == 100 and len(body["prompt"].split()) == 100
    assert lines[-1].endswith("12 requests: completed: 12, refused: 0, failed: 0")


def test_pressure_counts_completed_refused_and_failed_by_the_one_rule() -> None:
    """A 503 with Retry-After is a refusal; a 503 after warden spent its retries (its body
    names the retry reason) is a failure, though it carries Retry-After too; so is a 500."""
    refused: Answer = (
        503, {"Retry-After": "5"}, {"error": {"warden_reason": "reject_all"}}
    )  # fmt: skip
    retries_spent: Answer = (
        503, {"Retry-After": "5"}, {"error": {"warden_reason": "warden_preemption"}}
    )  # fmt: skip
    broken: Answer = (500, {}, {"error": {"message": "boom"}})
    server = CompletionsServer(0.0, [COMPLETED_ANSWER, refused, retries_spent, broken])
    try:
        lines: list[str] = []
        outcomes = chaos.pressure(server.url, 8, 1, 30.0, out=lines.append)
    finally:
        server.close()
    assert outcomes.counts == {"completed": 2, "refused": 2, "failed": 4}
    assert "8 requests: completed: 2, refused: 2, failed: 4" in "\n".join(lines)
    failures = [line for line in lines if line.startswith("pressure: failed: ")]
    assert any("HTTP 503" in line and "warden_preemption" in line for line in failures), lines
    assert any("HTTP 500" in line for line in failures), lines


def test_pressure_stops_when_its_time_is_up() -> None:
    server = CompletionsServer(delay=0.3)
    try:
        started = time.monotonic()
        chaos.pressure(server.url, 5000, 2, 1.0, out=lambda _: None)
        elapsed = time.monotonic() - started
    finally:
        server.close()
    assert elapsed < 3.0
    assert 2 <= len(server.bodies) <= 10


def test_pressure_times_its_requests_not_the_model_lookup_before_them() -> None:
    """On a loaded machine the model lookup once took a 1 s pressure's whole time: nothing
    was sent. Its time counts from the first request."""
    server = CompletionsServer(delay=0.3, models_delay=1.2)
    try:
        chaos.pressure(server.url, 5000, 2, 1.0, out=lambda _: None)
    finally:
        server.close()
    assert 2 <= len(server.bodies) <= 10
