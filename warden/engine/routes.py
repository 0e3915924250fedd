"""Which requests pass admission: all of them, except an explicit allow-list.

Admission is by default: every request that can start work (any method but GET, HEAD and
OPTIONS, and every WebSocket) passes the policy, whatever vLLM names its route, so a route a
new vLLM adds is admitted from its first day. Exempt are only the paths below, each with the
reason it must stay reachable while the engine refuses work: probes and metrics, tokenizing
and rendering (no generation), warden's own control routes, and vLLM's operator controls
(which an operator needs most while the engine is degraded). Paths are matched exactly, on
the route path the router itself matches (``--root-path`` removed the way Starlette does), so
neither a prefix nor a trailing variation can slip a generation request through.
"""

from __future__ import annotations

import functools
import re
from typing import Any

# The router's own function (private in Starlette, hence the wrapper): warden and vLLM see the
# same path, the request's without the app's --root-path.
from starlette._utils import get_route_path as _router_path


def get_route_path(scope: Any) -> str:
    """The path the router matches for this request."""
    return _router_path(scope)


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

EXEMPT: dict[str, str] = {
    # probes and metrics
    "/health": "health probe",
    "/ping": "SageMaker health probe",
    "/metrics": "Prometheus scrape",
    # no generation
    "/tokenize": "tokenizes, generates nothing",
    "/detokenize": "detokenizes, generates nothing",
    "/v1/messages/count_tokens": "counts tokens, generates nothing",
    "/v1/chat/completions/render": "renders a prompt, generates nothing",
    "/v1/completions/render": "renders a prompt, generates nothing",
    "/v1/messages/render": "renders a prompt, generates nothing",
    "/v1/responses/render": "renders a prompt, generates nothing",
    "/v1/chat/completions/derender": "decodes tokens, generates nothing",
    "/v1/completions/derender": "decodes tokens, generates nothing",
    # warden's own control routes (authenticated; needed to end a degradation)
    "/warden/alertmanager": "warden: Alertmanager webhook",
    "/warden/degrade": "warden: manual overrides",
    # vLLM's operator controls: they free, pause or repair the engine, never add load
    "/abort_requests": "vLLM: aborts requests",
    "/inference/v1/abort_requests": "vLLM: aborts requests",
    "/pause": "vLLM: pauses generation",
    "/resume": "vLLM: operator control",
    "/sleep": "vLLM: operator control",
    "/wake_up": "vLLM: operator control",
    "/release_kv_cache_memory": "vLLM: frees KV cache memory",
    "/reset_prefix_cache": "vLLM: operator control",
    "/reset_mm_cache": "vLLM: operator control",
    "/reset_encoder_cache": "vLLM: operator control",
    "/start_profile": "vLLM: operator control",
    "/stop_profile": "vLLM: operator control",
    "/collective_rpc": "vLLM: operator control",
    "/v1/load_lora_adapter": "vLLM: operator control",
    "/v1/unload_lora_adapter": "vLLM: operator control",
    "/scale_elastic_ep": "vLLM: operator control",
    "/is_scaling_elastic_ep": "vLLM: operator status",
    "/fault_tolerance/apply": "vLLM: fault recovery (the supervisor uses it)",
    "/init_weight_transfer_engine": "vLLM: weight updates (RL)",
    "/shutdown_weight_transfer_engine": "vLLM: weight updates (RL)",
    "/start_weight_update": "vLLM: weight updates (RL)",
    "/start_draft_weight_update": "vLLM: weight updates (RL)",
    "/update_weights": "vLLM: weight updates (RL)",
    "/finish_weight_update": "vLLM: weight updates (RL)",
    "/update_weight_version": "vLLM: weight updates (RL)",
    "/weight_checker": "vLLM: weight updates (RL)",
}
# Exempt routes that still work on what the client sends (tokenize, count, render): their
# bodies are bounded like any other, and ``reject_all`` closes them too.
WORKING_EXEMPT = frozenset(
    {
        "/tokenize",
        "/detokenize",
        "/v1/messages/count_tokens",
        "/v1/chat/completions/render",
        "/v1/completions/render",
        "/v1/messages/render",
        "/v1/responses/render",
        "/v1/chat/completions/derender",
        "/v1/completions/derender",
    }
)
# Routes with a path parameter, matched whole.
EXEMPT_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/v1/responses/[^/]+/cancel"), "cancels a response, generates nothing"),
)


def exempt_reason(route: str) -> str | None:
    """Why requests to ``route`` skip admission; None when they pass it."""
    reason = EXEMPT.get(route)
    if reason is not None:
        return reason
    for pattern, why in EXEMPT_PATTERNS:
        if pattern.fullmatch(route):
            return why
    return None


# What the middleware does with a request, by its type, method and route path.
PASS = "pass"  # not admission's: straight to vLLM
EXEMPT_BOUNDED = "exempt_bounded"  # exempt, but works on the body: bounded, closed by reject_all
ADMITTED = "admitted"  # passes the admission policy


@functools.lru_cache(maxsize=1024)  # bounded: the path is the client's to choose
def verdict(kind: str | None, method: str | None, route: str) -> str:
    """``PASS``, ``EXEMPT_BOUNDED`` or ``ADMITTED``, decided once per route and method."""
    if kind not in ("http", "websocket") or (kind == "http" and method in SAFE_METHODS):
        return PASS
    if exempt_reason(route) is None:
        return ADMITTED
    return EXEMPT_BOUNDED if kind == "http" and route in WORKING_EXEMPT else PASS


def verdict_of(scope: dict[str, Any]) -> tuple[str, str]:
    """This request's verdict and its route path."""
    kind = scope.get("type")
    if kind not in ("http", "websocket"):
        return PASS, ""
    route = get_route_path(scope)
    return verdict(kind, scope.get("method"), route), route


def admitted(scope: dict[str, Any]) -> bool:
    """Whether this ASGI request passes the admission policy."""
    return verdict_of(scope)[0] == ADMITTED


def bounded_exempt(scope: dict[str, Any]) -> bool:
    """Whether this request skips admission but is still bounded (``WORKING_EXEMPT``)."""
    return verdict_of(scope)[0] == EXEMPT_BOUNDED


def route_table(routes: list[Any]) -> list[dict[str, Any]]:
    """The app's routes with what admission does to each (``GET /warden/admission``)."""
    table = []
    for route in routes:
        path = getattr(route, "path", None)
        if not isinstance(path, str):
            continue
        methods = sorted(getattr(route, "methods", None) or ())
        websocket = not methods and type(route).__name__.endswith("WebSocketRoute")
        if not methods and not websocket:
            continue  # a mount: its inner routes are not vLLM's API
        acting = [m for m in methods if m not in SAFE_METHODS]
        reason = exempt_reason(path)
        table.append(
            {
                "path": path,
                "methods": ["WEBSOCKET"] if websocket else methods,
                "admission": "exempt" if reason or not (acting or websocket) else "admitted",
                "reason": reason or ("" if acting or websocket else "read-only method"),
            }
        )
    return table
