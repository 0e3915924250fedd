"""The supervisor's control port is closed by default (#15): a token always guards its
actions (generated when none is configured), an unreadable token file stops the supervisor,
and bad input gets a 4xx that changes nothing, fuzzed against the real server.

Real objects: a ``Supervisor`` (its loop not started, so no engine runs) serving its control
port with the production ``HttpServer``."""

from __future__ import annotations

import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warden.common.tokens import TOKEN_ENV, TOKEN_FILE_ENV, TokenError, read_token_file
from warden.engine.launch import LaunchSpec
from warden.supervisor.config import SupervisorConfig
from warden.supervisor.http import MAX_BODY_BYTES, HttpServer
from warden.supervisor.loop import CONTROL_TOKEN_FILE, Supervisor

ACTIONS = ("/supervisor/restart", "/supervisor/reset", "/supervisor/eager")


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TOKEN_ENV, TOKEN_FILE_ENV, "WARDEN_WEBHOOK_INSECURE"):
        monkeypatch.delenv(name, raising=False)


def make_supervisor(run_dir: Path, env: dict[str, str] | None = None) -> Supervisor:
    spec = LaunchSpec("unused-model", env=dict(env or {}))
    return Supervisor(spec, run_dir, SupervisorConfig(control_port=0))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Supervisor, str]]:
    supervisor = make_supervisor(tmp_path / "run")
    server = HttpServer("127.0.0.1", 0, supervisor, stand_in=False)
    try:
        yield supervisor, f"http://127.0.0.1:{server.port}"
    finally:
        server.close()


def queued(supervisor: Supervisor) -> list[str]:
    """Drain the supervisor's request queue (what the loop would act on)."""
    actions = []
    while not supervisor._requests.empty():
        actions.append(supervisor._requests.get_nowait())
    return actions


def test_without_a_configured_token_one_is_generated_private_and_given_to_the_engine(
    tmp_path: Path, served: tuple[Supervisor, str]
) -> None:
    supervisor, url = served
    path = tmp_path / "run" / CONTROL_TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert supervisor.token == read_token_file(path)
    assert supervisor.spec.env[TOKEN_FILE_ENV] == str(path)  # the drain lease works too
    for action in ACTIONS:
        assert httpx.post(url + action).status_code == 401
        assert httpx.post(url + action, headers={"Authorization": "Bearer x"}).status_code == 401
    assert queued(supervisor) == []
    auth = {"Authorization": f"Bearer {supervisor.token}"}
    assert httpx.post(url + "/supervisor/reset", headers=auth).status_code == 202
    assert queued(supervisor) == ["reset"]
    assert httpx.get(url + "/supervisor/state").status_code == 200  # reads stay open


def test_a_fresh_token_each_start(tmp_path: Path) -> None:
    first = make_supervisor(tmp_path).token
    assert make_supervisor(tmp_path).token != first


def test_a_configured_token_is_used_and_nothing_is_generated(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("configured-token\n")
    supervisor = make_supervisor(tmp_path / "run", {TOKEN_FILE_ENV: str(token_file)})
    assert supervisor.token == "configured-token"
    assert not (tmp_path / "run" / CONTROL_TOKEN_FILE).exists()


@pytest.mark.parametrize("problem", ["missing", "empty", "directory"])
def test_an_unreadable_token_file_stops_the_supervisor(tmp_path: Path, problem: str) -> None:
    token_file = tmp_path / "token"
    if problem == "empty":
        token_file.write_text("  \n")
    elif problem == "directory":
        token_file.mkdir()
    with pytest.raises(TokenError, match=TOKEN_FILE_ENV):
        make_supervisor(tmp_path / "run", {TOKEN_FILE_ENV: str(token_file)})
    assert not (tmp_path / "run" / CONTROL_TOKEN_FILE).exists()


def test_an_insecure_engine_keeps_its_open_routes_but_the_port_stays_closed(
    tmp_path: Path,
) -> None:
    supervisor = make_supervisor(tmp_path, {"WARDEN_WEBHOOK_INSECURE": "1"})
    assert supervisor.token and TOKEN_FILE_ENV not in supervisor.spec.env


def raw_request(url: str, request: bytes) -> int:
    """Send bytes as they are; the status code the server answered (0: it closed silently)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line = data.split(b"\r\n", 1)[0].split()
    return int(status_line[1]) if len(status_line) > 1 else 0


def test_malformed_bodies_are_refused_before_any_action(served: tuple[Supervisor, str]) -> None:
    supervisor, url = served
    auth = f"Authorization: Bearer {supervisor.token}\r\n".encode()
    for extra, status in (
        (b"Content-Length: abc\r\n", 400),
        (b"Content-Length: \xb2\r\n", 400),
        (b"Content-Length: -5\r\n", 400),
        (b"Content-Length: " + b"9" * 5000 + b"\r\n", 400),
        (f"Content-Length: {MAX_BODY_BYTES + 1}\r\n".encode(), 413),
        (b"Transfer-Encoding: chunked\r\n", 400),
    ):
        request = b"POST /supervisor/restart HTTP/1.1\r\nHost: x\r\n" + auth + extra + b"\r\n"
        assert raw_request(url, request) == status, extra
    assert raw_request(url, b"PATCH /supervisor/restart HTTP/1.1\r\nHost: x\r\n\r\n") == 405
    assert raw_request(url, b"FROB / HTTP/1.1\r\nHost: x\r\n\r\n") == 405
    assert queued(supervisor) == []


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    method=st.sampled_from(["POST", "DELETE", "GET", "PUT", "OPTIONS", "HEAD", "X"]),
    path=st.sampled_from([*ACTIONS, "/supervisor/state", "/metrics", "/", "/%ff", "/" + "a" * 300]),
    auth=st.sampled_from([None, "Bearer wrong", "Basic abc", "Bearer", "bearer \u00e9\u00e9"]),
    length=st.one_of(
        st.none(),
        st.integers(min_value=0, max_value=1 << 40).map(str),
        st.text(max_size=30).filter(lambda t: "\r" not in t and "\n" not in t),
    ),
    body=st.binary(max_size=256),
)
def test_bad_control_input_is_never_5xx_and_never_acts(
    served: tuple[Supervisor, str],
    method: str,
    path: str,
    auth: str | None,
    length: str | None,
    body: bytes,
) -> None:
    supervisor, url = served
    before = supervisor.status()
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if auth is not None:
        head += f"Authorization: {auth}\r\n"
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    request = head.encode("utf-8", "surrogateescape") + b"\r\n" + body
    status = raw_request(url, request)
    assert 400 <= status < 500 or (status == 200 and method == "GET"), (status, request[:200])
    assert queued(supervisor) == []  # no valid token: no action reached the loop
    assert supervisor.status() == before
