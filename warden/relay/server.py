"""The relay's HTTP side: Alertmanager posts here, engines get what is theirs.

``POST /warden/alertmanager`` (the engines' path, so an Alertmanager config points at the relay
by changing only the host) takes an Alertmanager v4 notification with the fleet's bearer token,
checks it whole before doing anything (401 wrong token, 415 not JSON, 400 malformed or too
large: none forwarded), looks up the engine each alert names, and forwards each engine its own
alerts. Answers follow Alertmanager's delivery rules:

- 200 when every alert for an engine was delivered (alerts for no engine are counted: fleet-wide,
  unresolved, ambiguous);
- 503 when the engine list cannot be read (Prometheus down): Alertmanager retries;
- 502 when an engine refused or could not be reached after the retries: Alertmanager retries the
  notification (idempotent at the engines) and counts a failed notification
  (``alertmanager_notifications_failed_total{integration="webhook"}``), which
  ``WardenWebhookDeliveryFailing`` watches.

``GET /metrics`` (the catalog's ``warden_relay_*``), ``GET /-/healthy``, ``GET /-/ready`` (the
engine list was read).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from exporter import catalog
from exporter.metrics import WardenMetrics
from warden.common import tokens
from warden.common.http_input import BodyRules, InputRefused, read_request
from warden.control.alertmanager import PayloadError, parse_payload
from warden.relay.deliver import FAILED, REFUSED, RETRIED, Delivery, DeliveryPolicy, deliver
from warden.relay.directory import WEBHOOK_PATH, Directory, DirectoryError
from warden.relay.split import INVALID, Engine, engine_notification, plan

log = logging.getLogger("warden.relay")
MAX_BODY_BYTES = 4 * 1024 * 1024
(
    N_FORWARDED,
    N_FAILED,
    N_UNAUTHORIZED,
    N_MALFORMED,
    N_RESOLVER_ERROR,
) = catalog.RELAY_NOTIFICATION_OUTCOMES
MAX_REPORTED = 20  # refused alerts named in an answer


@dataclass
class Relay:
    """The relay's state: where engines are, the token, the metrics, one HTTP client."""

    directory: Directory
    token: str | None
    registry: CollectorRegistry
    policy: DeliveryPolicy = DeliveryPolicy()
    engine_token: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES

    def __post_init__(self) -> None:
        self.metrics = WardenMetrics(self.registry)
        self.metrics.ensure(
            [
                catalog.RELAY_NOTIFICATIONS,
                catalog.RELAY_ALERTS,
                catalog.RELAY_DELIVERIES,
                catalog.RELAY_ENGINES,
            ]
        )
        self._client: httpx.AsyncClient | None = None
        self.ready = False

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient()
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _count(self, spec: catalog.MetricSpec, outcome: str, n: int = 1) -> None:
        if n:
            self.metrics.get(spec).labels(outcome).inc(n)

    def _answer(self, status: int, outcome: str, **body: Any) -> JSONResponse:
        self._count(catalog.RELAY_NOTIFICATIONS, outcome)
        return JSONResponse({"status": outcome, **body}, status_code=status)

    async def handle(self, request: Request) -> JSONResponse:
        if self.token is not None and not tokens.bearer_matches(
            request.headers.get("authorization"), self.token
        ):
            return self._answer(401, N_UNAUTHORIZED, error="missing or wrong bearer token")
        # What the engines accept (415 not JSON, 400 too large), so nothing is forwarded that
        # an engine would refuse.
        rules = BodyRules(self.max_body_bytes, json_only=True, too_large_status=400)
        try:
            body = await read_request(rules, request)
        except InputRefused as exc:
            return self._answer(exc.status, N_MALFORMED, error=str(exc))
        try:
            # The engines' own validation: nothing bad is forwarded. A bad envelope is refused
            # whole; a bad alert alone, named in the answer and counted, as engines do.
            events = parse_payload(body)
            envelope = json.loads(body)
        except PayloadError as exc:
            return self._answer(400, N_MALFORMED, error=f"malformed notification: {exc}")
        except (ValueError, RecursionError) as exc:
            return self._answer(400, N_MALFORMED, error=f"malformed notification: {exc}")
        rejected = [e for e in events if e.problem is not None]
        if rejected:
            self._count(catalog.RELAY_ALERTS, INVALID, len(rejected))
            for event in rejected[:MAX_REPORTED]:
                log.warning("warden relay: alert not forwarded: %s", str(event.problem)[:300])
            bad = {e.index for e in rejected}
            kept = [a for i, a in enumerate(envelope["alerts"]) if i not in bad]
            envelope = {**envelope, "alerts": kept}
        return await self.forward(envelope, [e.problem_json() for e in rejected[:MAX_REPORTED]])

    async def forward(
        self, envelope: dict[str, Any], rejected: list[dict[str, Any]] | None = None
    ) -> JSONResponse:
        alerts: list[dict[str, Any]] = envelope["alerts"]
        matches: dict[int, list[Engine]] = {}
        try:
            for index, alert in enumerate(alerts):
                labels = alert["labels"]
                if labels.get("instance"):
                    matches[index] = await self.directory.lookup(labels)
        except DirectoryError as exc:
            log.warning("warden relay: %s", exc)
            return self._answer(503, N_RESOLVER_ERROR, error=str(exc))
        finally:
            self._publish_known()
        self.ready = True
        routed = plan(alerts, matches)
        for outcome, n in routed.outcomes.items():
            self._count(catalog.RELAY_ALERTS, outcome, n)
        self._log_dropped(alerts, matches)
        deliveries: list[Delivery] = await asyncio.gather(
            *(
                deliver(
                    self.client,
                    url,
                    engine_notification(envelope, engine_alerts),
                    len(engine_alerts),
                    self.engine_token or self.token,
                    self.policy,
                    on_retry=lambda: self._count(catalog.RELAY_DELIVERIES, RETRIED),
                )
                for url, engine_alerts in routed.by_engine.items()
            )
        )
        for delivery in deliveries:
            self._count(catalog.RELAY_DELIVERIES, delivery.outcome)
            if delivery.outcome in (FAILED, REFUSED):
                log.warning(
                    "warden relay: %s %s after %d attempts (status %s): %s",
                    delivery.url,
                    delivery.outcome,
                    delivery.attempts,
                    delivery.status,
                    delivery.detail,
                )
        failed = any(d.outcome in (FAILED, REFUSED) for d in deliveries)
        return self._answer(
            502 if failed else 200,
            N_FAILED if failed else N_FORWARDED,
            alerts=routed.outcomes,
            rejected=rejected or [],
            deliveries=[d.to_json() for d in deliveries],
        )

    def _publish_known(self) -> None:
        known = self.directory.known()
        if known is not None:
            self.metrics.get(catalog.RELAY_ENGINES).set(known)

    def _log_dropped(self, alerts: list[dict[str, Any]], matches: dict[int, list[Engine]]) -> None:
        for index, engines in matches.items():
            if len(engines) == 1:
                continue
            labels = alerts[index]["labels"]
            what = "no engine" if not engines else f"{len(engines)} engines"
            log.warning(
                "warden relay: %s for alert %s %s: not forwarded",
                what,
                labels.get("alertname", "?"),
                {k: v for k, v in labels.items() if k in ("instance", "namespace", "cluster")},
            )


def build_app(relay: Relay) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await relay.close()

    app = FastAPI(
        title="warden relay", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )

    @app.post(WEBHOOK_PATH)
    async def notification(request: Request) -> JSONResponse:
        return await relay.handle(request)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(relay.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/-/healthy")
    async def healthy() -> JSONResponse:
        return JSONResponse({"healthy": True})

    @app.get("/-/ready")
    async def ready() -> JSONResponse:
        """Ready once the engine list was read (Prometheus answered)."""
        if not relay.ready:
            try:
                await relay.directory.check()
                relay.ready = True
            except DirectoryError as exc:
                return JSONResponse({"ready": False, "error": str(exc)}, status_code=503)
            finally:
                relay._publish_known()
        return JSONResponse({"ready": True, "engines": relay.directory.known()})

    return app
