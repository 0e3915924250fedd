"""``GET /metrics`` where the API server keeps vLLM's own metrics in its memory.

vLLM's ``/metrics`` route reads the multiprocess folder alone once ``PROMETHEUS_MULTIPROC_DIR``
is set; with ``exporter.api_metrics`` installed, vLLM's metrics are not there but in the API
server's memory. The middleware then answers the path itself, from both sources
(``exporter.api_metrics.ApiServerCollector``), in the format vLLM's route answers with:
the text format (prometheus_client's ``CONTENT_TYPE_LATEST``) whatever the client accepts
(Prometheus asks for OpenMetrics first, and a scrape must not change format because warden
is loaded), uncompressed. The families are
gathered on a worker thread, as vLLM's route gathers them: reading the folder takes
milliseconds that the event loop owes to streaming requests.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from exporter.api_metrics import ApiServerCollector
from warden.engine.asgi import Receive, Scope, Send

METRICS_PATHS = frozenset({"/metrics", "/metrics/"})


class MetricsRoute:
    """The ASGI answer to ``GET``/``HEAD /metrics`` from this process's tree."""

    def __init__(self, collector: ApiServerCollector | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector or ApiServerCollector())

    def handles(self, scope: Scope, route: str) -> bool:
        return (
            route in METRICS_PATHS
            and scope.get("type") == "http"
            and scope.get("method") in ("GET", "HEAD")
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await asyncio.to_thread(generate_latest, self.registry)
        headers = [
            (b"content-type", CONTENT_TYPE_LATEST.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )
