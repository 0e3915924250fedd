"""``GET /metrics`` where the API server keeps vLLM's own metrics in its memory.

vLLM's ``/metrics`` route reads the multiprocess folder alone once ``PROMETHEUS_MULTIPROC_DIR``
is set; with ``exporter.api_metrics`` installed, vLLM's metrics are not there but in the API
server's memory. The middleware then answers the path itself, from both sources
(``exporter.api_metrics.ApiServerCollector``), in the text format Prometheus asks for and
gzipped when the client accepts it, as prometheus_client's own handler does. The families are
gathered on a worker thread, as vLLM's route gathers them: reading the folder takes
milliseconds that the event loop owes to streaming requests.
"""

from __future__ import annotations

import asyncio
import gzip

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.api_metrics import ApiServerCollector
from warden.engine.asgi import Receive, Scope, Send, header_values

METRICS_PATHS = frozenset({"/metrics", "/metrics/"})
_HEADERS = frozenset({b"accept", b"accept-encoding"})


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
        headers = header_values(scope, _HEADERS)
        body, content_type, gzipped = await asyncio.to_thread(
            self.render, headers.get(b"accept", ""), headers.get(b"accept-encoding", "")
        )
        response_headers = [(b"content-type", content_type.encode())]
        if gzipped:
            response_headers.append((b"content-encoding", b"gzip"))
        response_headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    def render(self, accept: str, accept_encoding: str) -> tuple[bytes, str, bool]:
        """(body, content type, gzipped) for a client's Accept and Accept-Encoding."""
        encoder, content_type = choose_encoder(accept)
        body = encoder(self.registry)
        if "gzip" in accept_encoding:
            return gzip.compress(body), content_type, True
        return body, content_type, False
