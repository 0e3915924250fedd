"""A local pager: an Alertmanager webhook receiver that records every page and prints it.

Stands in for PagerDuty or Opsgenie on one machine and in tests: each notification Alertmanager
sends to the ``pager`` receiver becomes one JSON line (the payload plus ``received_at``) in the
pages file, and a short line per alert on stdout. ``GET /`` answers 200 for health checks.

Run it alone with ``warden pager --port 9099 --out pages.jsonl``; ``warden up`` runs it in
process and compose runs it in the warden image.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

Page = dict[str, Any]
DEFAULT_PORT = 9099
# Alertmanager payloads are small; anything bigger is not a page.
MAX_BODY_BYTES = 4 * 1024 * 1024


def read_pages(path: Path) -> list[Page]:
    """Every page recorded in ``path`` so far, oldest first (an absent file has none)."""
    if not path.exists():
        return []
    pages = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            pages.append(json.loads(line))
    return pages


def describe(page: Page) -> list[str]:
    """One human line per alert in a notification."""
    lines = []
    for alert in page.get("alerts", []):
        labels = alert.get("labels", {})
        summary = alert.get("annotations", {}).get("summary", "")
        where = labels.get("instance", "")
        status = alert.get("status", page.get("status", "?")).upper()
        name = labels.get("alertname", "?")
        severity = labels.get("severity", "")
        lines.append(f"PAGE {status} {name} [{severity}] {where} {summary}".rstrip())
    return lines


class PageLog:
    """Appends pages to a JSONL file; one writer lock, a flush per page."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, page: Page) -> None:
        line = json.dumps(page, sort_keys=True) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(line)

    def read(self) -> list[Page]:
        return read_pages(self.path)


def _handler(log: PageLog, on_page: Callable[[Page], None]) -> type[BaseHTTPRequestHandler]:
    class PagerHandler(BaseHTTPRequestHandler):
        server_version = "warden-pager"

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._answer(HTTPStatus.OK, {"status": "ok", "pages": len(log.read())})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY_BYTES:
                self._answer(HTTPStatus.BAD_REQUEST, {"error": "body size"})
                return
            try:
                payload = json.loads(self.rfile.read(length))
            except ValueError:
                self._answer(HTTPStatus.BAD_REQUEST, {"error": "not JSON"})
                return
            if not isinstance(payload, dict) or not isinstance(payload.get("alerts"), list):
                self._answer(HTTPStatus.BAD_REQUEST, {"error": "not an Alertmanager payload"})
                return
            page = {"received_at": time.time(), "path": self.path, **payload}
            log.append(page)
            on_page(page)
            self._answer(HTTPStatus.OK, {"status": "recorded"})

        def _answer(self, status: HTTPStatus, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Quiet: the page lines are the output that matters."""

    return PagerHandler


def print_page(page: Page) -> None:
    for line in describe(page):
        print(line, flush=True)


class PagerServer:
    """The receiver on ``host:port`` in a background thread; ``port=0`` picks a free one."""

    def __init__(
        self,
        pages_path: Path,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        on_page: Callable[[Page], None] = print_page,
    ) -> None:
        self.log = PageLog(pages_path)
        # The file keeps every run's pages (appended); this server's are those since it started:
        # a second `warden demo` in the same folder must not find the first one's pages.
        self.started_at = time.time()
        self.host = host
        self._server = ThreadingHTTPServer((host, port), _handler(self.log, on_page))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def pages_path(self) -> Path:
        return self.log.path

    def pages(self) -> list[Page]:
        """The pages this server received (the file may hold earlier runs' before them)."""
        return [p for p in self.log.read() if float(p.get("received_at", 0)) >= self.started_at]

    def start(self) -> PagerServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="warden-pager", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> PagerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--out", default="pages.jsonl", help="JSONL file every page goes to")


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run(args: argparse.Namespace) -> int:
    """Serve in the foreground until SIGINT (Ctrl-C) or SIGTERM.

    Both handlers are installed explicitly: a process started in the background by a
    non-interactive shell inherits SIGINT *ignored*, and would otherwise never stop on it.
    """
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    server = PagerServer(Path(args.out), host=args.host, port=args.port)
    print(f"pager listening on {server.url}, pages to {server.pages_path}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warden.stack.pager", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
