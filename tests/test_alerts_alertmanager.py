"""A real Alertmanager with a config from render_alertmanager_config, delivering to a local
recorder: routing, the bearer token, intact action labels, resolution, paging, inhibition.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from alerts.alertmanager import RouteTiming, render_alertmanager_config
from exporter import catalog
from warden.common.ports import free_port
from warden.common.waiting import wait_until

BINARY = "prometheus-alertmanager"
TOKEN = "s3cret-webhook-token"
FAST = RouteTiming("300ms", "1s", "1m")

pytestmark = pytest.mark.skipif(shutil.which(BINARY) is None, reason=f"{BINARY} not installed")


@dataclass
class Delivery:
    path: str
    authorization: str | None
    body: dict[str, Any]


@dataclass
class Recorder:
    """Every webhook request received, by path (/engine, /pager, /queue)."""

    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def at(self, path: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.path == path]

    def alerts_at(self, path: str, **labels: str) -> list[tuple[Delivery, dict[str, Any]]]:
        """(delivery, alert) pairs at ``path`` whose alert has all ``labels``."""
        return [
            (d, a)
            for d in self.at(path)
            for a in d.body["alerts"]
            if all(a["labels"].get(k) == v for k, v in labels.items())
        ]


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            with recorder.lock:
                recorder.deliveries.append(
                    Delivery(self.path, self.headers.get("authorization"), body)
                )
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

    return Handler


@pytest.fixture(scope="module")
def recorder() -> Iterator[tuple[Recorder, str]]:
    record = Recorder()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(record))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield record, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def alertmanager(
    recorder: tuple[Recorder, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Alertmanager on a free 127.0.0.1 port, clustering off; killed whatever happens."""
    _, base = recorder
    work = tmp_path_factory.mktemp("alertmanager")
    token_file = work / "token"
    token_file.write_text(TOKEN + "\n")
    config = work / "alertmanager.yml"
    config.write_text(
        render_alertmanager_config(
            f"{base}/engine",
            str(token_file),
            f"{base}/pager",
            queue_url=f"{base}/queue",
            engine_timing=FAST,
            pager_timing=FAST,
            queue_timing=FAST,
        )
    )
    port = free_port()
    log = (work / "alertmanager.log").open("w")
    process = subprocess.Popen(
        [
            BINARY,
            f"--config.file={config}",
            f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _ready(url, process), 20, "Alertmanager did not become ready", work)
        yield url
    finally:
        process.kill()
        process.wait(timeout=10)
        log.close()


def _ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"Alertmanager exited with {process.returncode}")
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(condition: Callable[[], object], timeout: float, message: str, logs: Path | None = None):
    try:
        return wait_until(condition, timeout, 0.1, message)
    except TimeoutError:
        detail = (logs / "alertmanager.log").read_text()[-3000:] if logs else ""
        raise AssertionError(f"{message}\n{detail}") from None


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def post(url: str, *alerts: dict[str, Any]) -> None:
    response = httpx.post(f"{url}/api/v2/alerts", json=list(alerts), timeout=5)
    assert response.status_code == 200, response.text


def alert(labels: dict[str, str], *, resolved: bool = False) -> dict[str, Any]:
    now = datetime.now(UTC)
    body: dict[str, Any] = {
        "labels": labels,
        "annotations": {"summary": "test", "description": f"test {labels['instance']}"},
        "startsAt": _iso(now - timedelta(minutes=5)),
        "generatorURL": "http://prometheus.test/graph",
    }
    body["endsAt"] = _iso(now - timedelta(seconds=1) if resolved else now + timedelta(minutes=5))
    return body


CAP_2048 = {
    "alertname": "WardenQueueBacklog",
    "instance": "engine-a:8000",
    "severity": "warning",
    catalog.ACTION_LABEL: "cap_max_tokens",
    catalog.PARAM_MAX_TOKENS: "2048",
}
REJECT_ALL = {
    "alertname": "WardenOOMImminent",
    "instance": "engine-b:8000",
    "severity": "critical",
    catalog.ACTION_LABEL: "reject_all",
    catalog.PARAM_RETRY_AFTER: "30",
}


def test_engine_gets_actions_with_token_then_the_resolution(
    alertmanager: str, recorder: tuple[Recorder, str]
) -> None:
    record, _ = recorder
    post(alertmanager, alert(CAP_2048))
    pairs = _wait(
        lambda: record.alerts_at("/engine", instance="engine-a:8000"), 10, "no engine webhook"
    )
    delivery, firing = pairs[0]
    assert delivery.authorization == f"Bearer {TOKEN}"
    assert firing["status"] == "firing"
    assert firing["labels"] == CAP_2048, "action and parameters must arrive intact"
    assert delivery.body["version"] == "4"
    assert delivery.body["groupLabels"][catalog.ACTION_LABEL] == "cap_max_tokens"
    # a warning also goes to the queue, never to the pager
    _wait(lambda: record.alerts_at("/queue", instance="engine-a:8000"), 10, "no queue delivery")
    assert not record.alerts_at("/pager", instance="engine-a:8000")

    post(alertmanager, alert(CAP_2048, resolved=True))
    resolved = _wait(
        lambda: [
            (d, a)
            for d, a in record.alerts_at("/engine", instance="engine-a:8000")
            if a["status"] == "resolved"
        ],
        10,
        "no resolved notification to the engine",
    )
    delivery, gone = resolved[0]
    assert gone["labels"] == CAP_2048
    assert delivery.authorization == f"Bearer {TOKEN}"
    assert gone["endsAt"] != "0001-01-01T00:00:00Z"


def test_critical_action_reaches_engine_and_pager(
    alertmanager: str, recorder: tuple[Recorder, str]
) -> None:
    record, _ = recorder
    post(alertmanager, alert(REJECT_ALL))
    pages = _wait(lambda: record.alerts_at("/pager", instance="engine-b:8000"), 10, "no page")
    engine = _wait(lambda: record.alerts_at("/engine", instance="engine-b:8000"), 10, "no hook")
    assert pages[0][1]["labels"] == REJECT_ALL
    assert engine[0][1]["labels"] == REJECT_ALL
    assert engine[0][0].authorization == f"Bearer {TOKEN}"
    assert pages[0][0].authorization is None, "the token is for the engine only"
    assert not record.alerts_at("/queue", instance="engine-b:8000")


def test_critical_inhibits_warning_of_same_alert_and_instance(
    alertmanager: str, recorder: tuple[Recorder, str]
) -> None:
    record, _ = recorder
    base = {"alertname": "WardenTimeToOOM", "source": "device"}
    critical = {**base, "instance": "engine-c:8000", "severity": "critical"}
    inhibited = {**base, "instance": "engine-c:8000", "severity": "warning"}
    control = {**base, "instance": "engine-d:8000", "severity": "warning"}
    # The source first: Alertmanager's inhibitor and dispatcher consume new alerts
    # concurrently, so a target arriving in the same instant can be flushed before the
    # inhibitor has seen its source (unlikely with production group_wait values).
    post(alertmanager, alert(critical))
    _wait(lambda: record.alerts_at("/pager", instance="engine-c:8000"), 10, "critical not paged")
    post(alertmanager, alert(inhibited), alert(control))
    # the warning on another instance is delivered, so the queue route has flushed...
    _wait(lambda: record.alerts_at("/queue", instance="engine-d:8000"), 10, "control not queued")
    time.sleep(2.5)  # ...and a couple of group intervals later still nothing for engine-c
    assert not record.alerts_at("/queue", instance="engine-c:8000")
    assert all(
        a["labels"]["severity"] == "critical"
        for _, a in record.alerts_at("/pager", instance="engine-c:8000")
    )
    # no warden_action: the engine hears about none of them
    assert not record.alerts_at("/engine", alertname="WardenTimeToOOM")


def test_info_routes_nowhere(alertmanager: str, recorder: tuple[Recorder, str]) -> None:
    record, _ = recorder
    info = {"alertname": "WardenSomethingToKnow", "instance": "engine-e:8000", "severity": "info"}
    control = {**info, "instance": "engine-f:8000", "severity": "warning"}
    post(alertmanager, alert(info), alert(control))
    _wait(lambda: record.alerts_at("/queue", instance="engine-f:8000"), 10, "control not queued")
    time.sleep(1.5)
    assert not [d for d in record.deliveries if "engine-e:8000" in json.dumps(d.body)]


def test_the_engine_models_accept_what_alertmanager_sends(
    alertmanager: str, recorder: tuple[Recorder, str]
) -> None:
    """The webhook's pydantic models (warden/control/alertmanager.py) validate every
    notification this Alertmanager delivered, firing and resolved, envelope fields included."""
    from warden.control.alertmanager import Notification, parse_payload

    record, _ = recorder
    labels = {**CAP_2048, "instance": "engine-m:8000"}
    post(alertmanager, alert(labels))
    _wait(lambda: record.alerts_at("/engine", instance="engine-m:8000"), 10, "not delivered")
    post(alertmanager, alert(labels, resolved=True))
    _wait(
        lambda: (
            [a for _, a in record.alerts_at("/engine", instance="engine-m:8000")]
            and any(
                a["status"] == "resolved"
                for _, a in record.alerts_at("/engine", instance="engine-m:8000")
            )
        ),
        10,
        "resolution not delivered",
    )
    with record.lock:
        bodies = [d.body for d in record.deliveries]
    for body in bodies:
        envelope = Notification.model_validate(body)
        assert envelope.version == "4" and envelope.receiver and envelope.group_key
        events = parse_payload(json.dumps(body).encode())
        assert len(events) == len(body["alerts"])
        assert all(event.problem is None for event in events), [e.problem for e in events]
    mine = [
        event
        for body in bodies
        for event in parse_payload(json.dumps(body).encode())
        if event.labels.get("instance") == "engine-m:8000"
    ]
    assert {event.status for event in mine} == {"firing", "resolved"}
    assert all(event.request is not None for event in mine)
