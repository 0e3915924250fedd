"""The native stack for real: Prometheus, Alertmanager and the pager from ``NativeStack`` and
``warden up``, first around a stand-in engine (seconds), then with a real vLLM engine."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from alerts.alertmanager import RouteTiming
from alerts.config import ENGINE_JOB
from exporter import catalog
from exporter.catalog import ACTION_LABEL
from warden.common.ports import free_port
from warden.common.waiting import wait_until
from warden.stack import chaos
from warden.stack.config import ENGINE_WEBHOOK_PATH, Intervals
from warden.stack.native import ALERTMANAGER_BINARIES, NativeStack, StackSettings, find_binary
from warden.stack.webhook_token import read_token

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or find_binary(ALERTMANAGER_BINARIES) is None,
    reason="prometheus and alertmanager binaries are needed",
)
FAST = RouteTiming("1s", "2s", "1m")
WATERMARK = catalog.MEMORY_WATERMARK.name


class StandInEngine:
    """Answers /health, serves one warden metric, and records webhook calls with their
    Authorization header: enough for Prometheus and Alertmanager to treat it as the engine."""

    def __init__(self) -> None:
        self.webhook_calls: list[tuple[str | None, dict[str, Any]]] = []
        calls = self.webhook_calls

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = f"# TYPE {WATERMARK} gauge\n{WATERMARK} 0\n".encode()
                self.send_response(200 if self.path in ("/health", "/metrics") else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == ENGINE_WEBHOOK_PATH:
                    calls.append((self.headers.get("Authorization"), payload))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandInEngine:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def settings(workdir: Path, **overrides: Any) -> StackSettings:
    """Free ports, one-second intervals and notification timings: tests see results fast."""
    values: dict[str, Any] = {
        "workdir": workdir,
        "engine_port": free_port(),
        "supervisor_port": free_port(),
        "prometheus_port": free_port(),
        "alertmanager_port": free_port(),
        "grafana_port": free_port(),
        "pager_port": free_port(),
        "intervals": Intervals("1s", "1s"),
        "engine_timing": FAST,
        "pager_timing": FAST,
    }
    values.update(overrides)
    return StackSettings(**values)


def post_alert(stack: NativeStack, **labels: str) -> None:
    alert = {
        "labels": {"instance": "test", **labels},
        "annotations": {"summary": f"{labels['alertname']} posted by a test"},
    }
    response = httpx.post(f"{stack.alertmanager_url}/api/v2/alerts", json=[alert], timeout=10)
    response.raise_for_status()


def alive(pids: set[int]) -> list[int]:
    """PIDs still running (zombies count as gone: they hold no resources but a table slot)."""
    survivors = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                survivors.append(pid)
    return survivors


def amtool_check(path: Path) -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool is not installed")
    result = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture()
def stand_in() -> Iterator[StandInEngine]:
    with StandInEngine() as engine:
        yield engine


def test_stack_around_a_running_engine_scrapes_pages_and_feeds_the_webhook(
    tmp_path: Path, stand_in: StandInEngine
) -> None:
    stack = NativeStack(settings(tmp_path, engine_url=stand_in.url), out=lambda _: None)
    with stack:
        pids = stack.process_ids()
        assert len(pids) >= 2  # prometheus and alertmanager (grafana when installed)
        stack.wait_for_query(f'up{{job="{ENGINE_JOB}"}} == 1', timeout_s=30)
        stack.wait_for_query(WATERMARK, timeout_s=30)
        assert httpx.get(f"{stack.alertmanager_url}/-/ready").status_code == 200
        amtool_check(stack.alertmanager_config_path)
        assert isinstance(stack.alerts(), list)
        with stack.prometheus() as prometheus:
            rules = prometheus.rule_groups()
        assert {g["name"] for g in rules} >= {"warden-liveness", "warden-memory"}

        post_alert(stack, alertname="WardenTestPage", severity="critical")
        page = stack.wait_for_page(
            lambda p: p["alerts"][0]["labels"]["alertname"] == "WardenTestPage", timeout_s=30
        )
        assert page["status"] == "firing" and page["receiver"] == "pager"
        assert stack.pages_path.read_text().count("WardenTestPage") >= 1

        post_alert(stack, alertname="WardenTestAction", severity="warning", **{ACTION_LABEL: "x"})
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: stand_in.webhook_calls, 30, 0.2, "the webhook call")
        authorization, payload = stand_in.webhook_calls[0]
        assert authorization == f"Bearer {read_token(stack.token_path)}"
        assert payload["alerts"][0]["labels"][ACTION_LABEL] == "x"
        pids = stack.process_ids()
    assert alive(pids) == []


def test_warden_up_stops_every_child_on_ctrl_c_and_sigterm(
    tmp_path: Path, stand_in: StandInEngine
) -> None:
    for number, signum in enumerate((signal.SIGINT, signal.SIGTERM)):
        s = settings(tmp_path / str(number))
        argv = [sys.executable, "-m", "warden.cli", "up", "--engine-url", stand_in.url]
        argv += ["--workdir", str(s.workdir), "--no-grafana"]
        for name in ("prometheus", "alertmanager", "pager"):
            argv += [f"--{name}-port", str(getattr(s, f"{name}_port"))]
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ),
            # As a shell starts a background job: SIGINT ignored. `warden up` must still stop.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        lines = []
        try:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                if line.startswith("try: warden chaos"):
                    break
            output = "".join(lines)
            assert "the warden stack is up" in output, output
            assert f"http://127.0.0.1:{s.prometheus_port}" in output
            assert "grafana" in output and "disabled" in output
            children = psutil.Process(process.pid).children(recursive=True)
            assert len(children) >= 2
            process.send_signal(signum)
            rest, _ = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert process.returncode == 0, rest
        assert "stopped: no child of warden up is running" in rest
        assert alive({c.pid for c in children}) == []


@pytest.mark.engine
def test_native_stack_with_a_real_engine(tmp_path: Path) -> None:
    """`warden up` as a library: tiny model, scraped engine, pages, chaos, clean shutdown."""
    printed: list[str] = []
    stack = NativeStack(settings(tmp_path, inject_faults=True), out=printed.append)
    with stack:
        assert (tmp_path / "tiny-model" / "config.json").exists()
        summary = stack.summary()
        assert stack.engine_url in summary and stack.prometheus_url in summary
        assert "grafana" in summary

        stack.wait_for_query(f'up{{job="{ENGINE_JOB}"}} == 1', timeout_s=60)
        prompt = " ".join(["memory watermark cache block"] * 5)
        response = httpx.post(
            f"{stack.engine_url}/v1/completions",
            json={"model": stack.model, "prompt": prompt, "max_tokens": 8},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        stack.wait_for_query(WATERMARK, timeout_s=30)
        stack.wait_for_query(f"{catalog.VLLM_KV_CACHE_USAGE.name}", timeout_s=30)

        assert httpx.get(f"{stack.alertmanager_url}/-/ready").status_code == 200
        amtool_check(stack.alertmanager_config_path)
        post_alert(stack, alertname="WardenTestPage", severity="critical")
        stack.wait_for_page(
            lambda p: p["alerts"][0]["labels"]["alertname"] == "WardenTestPage", timeout_s=30
        )

        # The stack's tiny model has a NaN token: chaos nan's requests really make NaN logits,
        # all fail (retries exhausted) and are counted.
        lines: list[str] = []
        chaos.inject_nan(stack.engine_url, 2, out=lines.append)
        assert any(f"{catalog.NONFINITE_LOGITS.name} went from" in line for line in lines), lines
        assert not any("nothing counted" in line for line in lines), lines
        assert any("2 requests: completed: 0, refused: 0, failed: 2" in line for line in lines), (
            lines
        )

        pids = stack.process_ids()
        # prometheus, alertmanager, supervisor, API server, engine core, worker
        assert len(pids) >= 6
        core = chaos.crash(stack.engine_url, out=lines.append)
        core.wait(30)

        # The engine stops serving (vLLM's API server sees its core die), its server is down
        # while the supervisor restarts it (a new generation may take a minute to start on a
        # busy machine), or the new one serves: in each, the killed core is not serving.
        def core_gone() -> bool:
            try:
                httpx.get(f"{stack.engine_url}/health", timeout=2)
            except httpx.ConnectError:
                return True  # nothing listens: the killed core's server is gone
            except httpx.HTTPError:
                pass
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{stack.engine_url}/health", timeout=2).status_code != 200:
                    return True
            with contextlib.suppress(chaos.ChaosError, psutil.Error):
                if chaos.engine_core_for(stack.engine_url).pid != core.pid:
                    return True
            return False

        try:
            wait_until(core_gone, 60, 0.2, "the killed core out of service")
        except TimeoutError:
            pytest.fail("the engine kept answering /health after its core was killed")
        pids |= stack.process_ids()
    assert alive(pids) == []
