"""Warden's HTTP surface for control: the Alertmanager webhook, manual overrides, state.

Answers follow Alertmanager's delivery rules: 2xx = applied; 401/400/403/415 = a bad request,
not retried; 5xx only for a transient internal failure, which Alertmanager retries. Every
request is checked (auth, type, size, envelope) before any state changes; within a good
notification each alert stands alone: a malformed one, one past a bound or one whose times this
server's clock cannot believe is refused and named in the 200 answer (``rejected``, counted
``invalid_alert``), and the rest apply, since Alertmanager never retries a 4xx.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from exporter import vllm_compat
from exporter.catalog import WATERMARK_LEVELS
from warden.common.http_input import BodyRules, InputRefused, read_json, read_request
from warden.control import telemetry
from warden.control.actions import ActionError, parse_action
from warden.control.alertmanager import Bounds, PayloadError, parse_payload
from warden.control.controller import EVICTED
from warden.engine import routes, runtime
from warden.engine.identity import first_look, resolve

log = logging.getLogger("warden.control")
router = APIRouter()
# Per-alert outcomes counted in warden_webhook_notifications_total{outcome}, by their label.
PER_ALERT_OUTCOMES = {
    "unknown_action": "unknown_action",
    "not_for_this_engine": "not_for_this_engine",
    "invalid": "invalid_alert",
    EVICTED: EVICTED,
}
MAX_REPORTED = 20  # refused alerts named in an answer
OVERRIDE_MAX_BODY_BYTES = 64 * 1024


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


def _denied(request: Request, rt: runtime.EngineRuntime) -> JSONResponse | None:
    """The runtime's guard's answer to a request that would change the policy."""
    refusal = rt.guard.check(request.headers.get("authorization"), rt.control.config.webhook)
    if refusal is None:
        return None
    return _error(refusal.status, refusal.message, **refusal.headers)


def _body_rules(limit: int) -> BodyRules:
    """JSON only; too large is 400, a bad request Alertmanager does not retry."""
    return BodyRules(limit, json_only=True, too_large_status=400)


@router.post("/warden/alertmanager")
async def alertmanager_webhook(request: Request) -> JSONResponse:
    rt = runtime.of(request)
    control = rt.control
    outcomes = control.notifications
    with telemetry.tracer().start_as_current_span("warden.webhook") as span:
        denied = _denied(request, rt)
        if denied is not None:
            outcome = "disabled" if denied.status_code == 403 else "unauthorized"
            outcomes.labels(outcome).inc()
            span.set_attribute("warden.outcome", outcome)
            return denied
        try:
            body = await read_request(_body_rules(control.config.webhook.max_body_bytes), request)
        except InputRefused as exc:
            outcomes.labels("malformed").inc()
            span.set_attribute("warden.outcome", "malformed")
            return _error(exc.status, str(exc))
        try:
            events = parse_payload(body, Bounds(alerts=control.config.webhook.max_alerts))
        except PayloadError as exc:
            outcomes.labels("malformed").inc()
            span.set_attribute("warden.outcome", "malformed")
            return _error(400, f"malformed notification: {exc}")
        events = control.checked(events)  # times against this server's clock
        span.set_attribute("warden.alertnames", sorted({e.alertname[:64] for e in events})[:32])
        # This engine's own alerts first, with the names known at once; the others after the
        # name lookups they need (concurrent, bounded in total), whatever those cost.
        look = first_look(request, events)
        own = [e for e in events if e.problem is not None or look.identity.accepts(e.labels)]
        rest = [e for e in events if e.problem is None and not look.identity.accepts(e.labels)]
        try:
            counts = control.apply_alerts(own, look.identity)
            identity = look.identity
            if rest:
                identity = await resolve(look)
                for outcome, count in control.apply_alerts(rest, identity).items():
                    counts[outcome] = counts.get(outcome, 0) + count
        except Exception:
            log.exception("warden: applying a notification failed")
            outcomes.labels("error").inc()
            span.set_attribute("warden.outcome", "error")
            return _error(500, "internal error applying the notification; retry")
        outcomes.labels("applied").inc()
        for counted, label in PER_ALERT_OUTCOMES.items():
            if counts.get(counted):
                outcomes.labels(label).inc(counts[counted])
        span.set_attribute("warden.outcome", "applied")
        problems = [e for e in events if e.problem is not None]
        return JSONResponse(
            {
                "status": "applied",
                "alerts": counts,
                # Refused alerts, each with why (the first few; "alerts" counts them all).
                "rejected": [e.problem_json() for e in problems[:MAX_REPORTED]],
                "identity": identity.to_json(),
                **control.state_json(),
            }
        )


@router.get("/warden/degrade")
async def list_overrides(request: Request) -> JSONResponse:
    return JSONResponse({"leases": runtime.of(request).control.state_json()["leases"]})


@router.post("/warden/degrade")
async def set_override(request: Request) -> JSONResponse:
    rt = runtime.of(request)
    control = rt.control
    denied = _denied(request, rt)
    if denied is not None:
        return denied
    try:
        data = await read_json(_body_rules(OVERRIDE_MAX_BODY_BYTES), request)
    except InputRefused as exc:
        return _error(exc.status, str(exc))
    if not isinstance(data, dict):
        return _error(400, "body: expected an object")
    params = data.get("params", {})
    key = data.get("key", data.get("action"))
    leases = control.config.leases
    longest = leases.max_manual_ttl_s
    ttl = data.get("ttl_s", min(leases.ttl_s, longest))
    if not isinstance(params, dict):
        return _error(400, "params: expected an object")
    if not isinstance(key, str) or not key or len(key) > 200:
        return _error(400, "key: expected a non-empty string of at most 200 characters")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= longest:
        return _error(400, f"ttl_s: expected seconds in (0, {longest:g}] (renew to keep it)")
    try:
        action = parse_action(data.get("action"), params)
    except ActionError as exc:
        return _error(400, str(exc))
    lease = control.set_manual(key, action, float(ttl))
    if lease is None:
        return _error(
            429,
            f"too many manual leases (limit {leases.max_per_source}): clear some first",
            **{"Retry-After": "60"},
        )
    return JSONResponse({"lease": lease.to_json(), **control.state_json()})


@router.delete("/warden/degrade")
async def clear_override(request: Request) -> JSONResponse:
    rt = runtime.of(request)
    control = rt.control
    denied = _denied(request, rt)
    if denied is not None:
        return denied
    key = request.query_params.get("key")
    everything = request.query_params.get("all", "").lower() in ("1", "true", "yes")
    if key is None and not everything:
        return _error(400, "name a lease with ?key=KEY, or clear every manual lease with ?all=1")
    cleared = control.clear_manual(None if everything else key)
    return JSONResponse({"cleared": cleared, **control.state_json()})


@router.get("/warden/admission")
async def admission_routes(request: Request) -> JSONResponse:
    """Every route of this server and whether admission applies to it (read-only)."""
    return JSONResponse({"routes": routes.route_table(list(request.app.routes))})


@router.get("/warden/state")
async def warden_state(request: Request) -> JSONResponse:
    rt = runtime.of(request)
    control = rt.control
    state: dict[str, Any] = control.state_json()
    geometry = vllm_compat.kv_geometry(control.engine_client)
    state["kv_cache"] = (
        {"total_blocks": geometry[0], "block_size": geometry[1]} if geometry else None
    )
    monitor = rt.monitor
    if monitor is not None:
        snap = monitor.snapshot
        state.update(
            {
                # The memory watermark: its level, the risk signal that sets it and its value,
                # every risk signal (memory beyond the engine's plan; none on a CPU engine).
                "watermark": WATERMARK_LEVELS[snap.watermark],
                "watermark_source": snap.watermark_source,
                "watermark_value": round(snap.watermark_value, 4),
                "watermark_changed_at": monitor.watermark_changed_at,
                "watermark_transitions": [
                    {
                        "at": at,
                        "level": WATERMARK_LEVELS[level],
                        "signal": source,
                        "value": round(value, 4),
                    }
                    for at, level, source, value in list(monitor.transitions)
                ],
                "signals": snap.signals,
                "engine": {
                    "last_step_timestamp": snap.timestamp,
                    "running": snap.running,
                    "waiting": snap.waiting,
                    "kv_cache_usage": snap.kv_cache_usage,
                },
            }
        )
    else:
        state.update({"watermark": None, "engine": None})
    return JSONResponse(state)
