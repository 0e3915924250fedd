"""Health endpoints on the serving port, for load balancers, Kubernetes and the supervisor.

- ``/warden/live``: the API process's event loop answers; nothing more.
- ``/warden/ready``: this engine should get traffic now. 503 lists the failing checks, so the
  probe log says why. Only conditions a restart cannot fix are left to the load balancer
  (memory, error rate, drain); the supervisor restarts on ``engine`` and ``stalled``.
- ``/warden/health``: a JSON view for people: device memory, queue, latency and error numbers
  over recent windows, restarts.

Windows come from the process tree's own metrics, sampled every few seconds on a background
thread (the multiprocess folder when ``PROMETHEUS_MULTIPROC_DIR`` is set, so the engine core's
error counters are included), never from the engine's step path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.settings import SettingsError, load_settings
from exporter.step_monitor import StepMonitor
from exporter.supervisor_state import SupervisorState, read_state_from_env
from warden.common import tokens
from warden.engine import runtime

router = APIRouter()
log = logging.getLogger("warden.health")

OOM_IMMINENT = catalog.WATERMARK_LEVELS.index("oom_imminent")
WINDOWS_S: tuple[int, ...] = (60, 300, 900)
RPC_TIMEOUT_S = 3.0


# --- Metric windows -----------------------------------------------------------------------

_COUNTERS: dict[str, str | None] = {
    catalog.REQUESTS.name: "outcome",
    catalog.ENGINE_ERRORS.name: "class",
    catalog.VLLM_NUM_PREEMPTIONS.name: None,
    catalog.VLLM_REQUEST_SUCCESS.name: None,
    catalog.VLLM_GENERATION_TOKENS.name: None,
}
_HISTOGRAMS: tuple[str, ...] = (catalog.VLLM_TTFT.name, catalog.VLLM_INTER_TOKEN_LATENCY.name)


def flatten(families: Iterable[Any]) -> dict[str, float]:
    """The series warden reports on, summed over labels it does not break down by.

    Keys: ``name`` or ``name|label_value`` for counters, ``name|le`` for histogram buckets
    (cumulative, as Prometheus stores them).
    """
    out: dict[str, float] = {}
    buckets = {f"{h}_bucket": h for h in _HISTOGRAMS}
    for family in families:
        for s in family.samples:
            if s.name in _COUNTERS:
                label = _COUNTERS[s.name]
                key = s.name if label is None else f"{s.name}|{s.labels.get(label, '')}"
            elif s.name in buckets:
                key = f"{buckets[s.name]}|{float(s.labels.get('le', 'inf'))!r}"
            else:
                continue
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


def read_families() -> list[Any]:
    """Every metric of the process tree (multiprocess folder, and vLLM's own in this
    process's memory where ``exporter.api_metrics`` keeps them) or of this process."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path and os.path.isdir(path):
        from exporter.api_metrics import ApiServerCollector

        return list(ApiServerCollector(path).collect())
    from prometheus_client import REGISTRY

    return list(REGISTRY.collect())


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """``histogram_quantile`` over cumulative (upper bound, count) pairs, sorted by bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


@dataclass
class WindowDelta:
    seconds: float
    covered_s: float
    delta: dict[str, float] = field(default_factory=dict)

    def get(self, key: str) -> float:
        return self.delta.get(key, 0.0)

    def by_label(self, name: str) -> dict[str, float]:
        prefix = f"{name}|"
        return {k[len(prefix) :]: v for k, v in self.delta.items() if k.startswith(prefix)}

    def histogram_quantiles(self, name: str) -> dict[str, float | None]:
        pairs = sorted((float(le), n) for le, n in self.by_label(name).items())
        return {"p50": quantile(0.5, pairs), "p99": quantile(0.99, pairs)}


class MetricWindows:
    """Samples the flattened series over time; answers "what changed in the last N s"."""

    def __init__(
        self,
        read: Callable[[], Iterable[Any]] = read_families,
        interval_s: float = 2.0,
        keep_s: float = max(WINDOWS_S) + 60,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.read = read
        self.interval_s = interval_s
        self.clock = clock
        self._samples: deque[tuple[float, dict[str, float]]] = deque()
        self._keep_s = keep_s
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        values = flatten(self.read())
        now = self.clock()
        with self._lock:
            self._samples.append((now, values))
            while self._samples and now - self._samples[0][0] > self._keep_s:
                self._samples.popleft()

    def ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._loop, name="warden-health", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                self.sample()
            time.sleep(self.interval_s)

    def latest(self) -> dict[str, float]:
        with self._lock:
            return dict(self._samples[-1][1]) if self._samples else {}

    def window(self, seconds: float) -> WindowDelta:
        """Change since the oldest sample within the last ``seconds``; ``covered_s`` says how
        long that really is (less than asked right after start or with sparse samples)."""
        with self._lock:
            if not self._samples:
                return WindowDelta(seconds, 0.0)
            now, current = self._samples[-1]
            base_t, base = next((t, v) for t, v in self._samples if now - t <= seconds)
        delta = {k: v - base.get(k, 0.0) for k, v in current.items()}
        return WindowDelta(seconds, now - base_t, delta)


_windows: MetricWindows | None = None


def metric_windows() -> MetricWindows:
    """The API process's windows, sampled at ``WARDEN_HEALTH_SAMPLE_S`` from first use."""
    global _windows
    if _windows is None:
        _windows = MetricWindows(interval_s=load_settings().health_sample_s)
    _windows.ensure_started()
    return _windows


# --- Readiness ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


def _gauge_value(metrics: WardenMetrics, spec: catalog.MetricSpec) -> float:
    """This process's value of a warden gauge (0 when nobody has set it)."""
    for family in metrics.get(spec).collect():
        for s in family.samples:
            return float(s.value)
    return 0.0


async def check_engine(engine_client: Any) -> Check:
    """vLLM's own verdict: the engine client exists and is not dead (and, with fault
    tolerance on, every engine reports healthy)."""
    if engine_client is None:
        return Check("engine", False, "no engine client (model not loaded)")
    try:
        await asyncio.wait_for(engine_client.check_health(), RPC_TIMEOUT_S)
    except Exception as exc:
        return Check("engine", False, f"engine dead: {type(exc).__name__}")
    status = getattr(engine_client, "get_status", None)
    if status is not None:
        with contextlib.suppress(Exception):
            engines = (await asyncio.wait_for(status(), RPC_TIMEOUT_S)).get("engines") or []
            sick = [e for e in engines if e.get("status") != "healthy"]
            if sick:
                return Check("engine", False, f"fault tolerance status: {sick}")
    return Check("engine", True)


def check_stalled(monitor: StepMonitor | None, metrics: WardenMetrics) -> Check:
    if monitor is None:
        return Check("stalled", True, "no step monitor yet")
    if _gauge_value(metrics, catalog.ENGINE_STALLED) >= 1:
        snap = monitor.snapshot
        age = time.time() - snap.timestamp if snap.timestamp else float("inf")
        why = f"; {monitor.stall_reason}" if monitor.stall_reason else ""
        return Check(
            "stalled",
            False,
            f"{monitor.pending_requests()} requests pending, last step {age:.1f}s ago{why}",
        )
    return Check("stalled", True)


def check_memory(monitor: StepMonitor | None) -> Check:
    if monitor is None:
        return Check("memory", True, "no step monitor yet")
    level = monitor.snapshot.watermark
    name = catalog.WATERMARK_LEVELS[level]
    return Check("memory", level < OOM_IMMINENT, f"watermark {name}")


def check_error_rate(windows: MetricWindows, metrics: WardenMetrics) -> Check:
    """Server errors over the last minute below the limit, and warden's admission circuit
    breaker (issue 5's policy, published as a catalog gauge) not open."""
    if _gauge_value(metrics, catalog.CIRCUIT_BREAKER_STATE) >= catalog.CIRCUIT_STATES.index("open"):
        return Check("error_rate", False, "admission circuit breaker open")
    settings = load_settings()
    max_rate, min_requests = settings.ready_max_error_rate, settings.ready_min_requests
    outcomes = windows.window(60).by_label(catalog.REQUESTS.name)
    answered = sum(v for k, v in outcomes.items() if k != "rejected")
    errors = outcomes.get("server_error", 0.0)
    if answered >= min_requests and errors / answered > max_rate:
        return Check("error_rate", False, f"{errors:.0f}/{answered:.0f} server errors in 60s")
    return Check("error_rate", True)


def check_driver_errors(windows: MetricWindows) -> Check:
    """A CUDA driver error poisons the context for good: only a restart helps."""
    count = windows.latest().get(f"{catalog.ENGINE_ERRORS.name}|cuda_driver", 0.0)
    if count > 0:
        return Check("driver_error", False, f"{count:.0f} CUDA driver errors in this engine")
    return Check("driver_error", True)


_token_problem_logged: str | None = None


def check_webhook_token() -> Check:
    """A token that is configured but cannot be read leaves the engine uncontrollable (its
    webhook fails closed): not ready, and said once in the log, so it is found before its
    first alert is refused. No token configured at all is a choice, not a fault."""
    global _token_problem_logged
    try:
        tokens.load_token(load_settings())
    except (tokens.TokenError, SettingsError) as exc:
        problem = str(exc)
        if problem != _token_problem_logged:
            log.error("warden: webhook token cannot be loaded; engine not ready: %s", problem)
            _token_problem_logged = problem
        return Check("webhook_token", False, problem)
    _token_problem_logged = None
    return Check("webhook_token", True)


def check_supervisor(state: SupervisorState | None) -> list[Check]:
    if state is None:
        return []
    circuit = Check("supervisor_circuit", not state.circuit_open, state.circuit_reason)
    draining = state.draining
    return [
        circuit,
        Check("draining", not draining, "draining for a restart" if draining else ""),
    ]


async def readiness(rt: runtime.EngineRuntime, engine_client: Any) -> list[Check]:
    windows = metric_windows()
    engine = await check_engine(engine_client)
    if not windows.latest() or not engine.ok:
        # A dead engine core may have counted its last error a moment ago: read it now.
        with contextlib.suppress(Exception):
            await asyncio.to_thread(windows.sample)
    metrics, monitor = rt.metrics, rt.monitor
    metrics.get(catalog.ENGINE_HEALTHY).set(1 if engine.ok else 0)
    checks = [
        engine,
        check_stalled(monitor, metrics),
        check_memory(monitor),
        check_error_rate(windows, metrics),
        check_driver_errors(windows),
        check_webhook_token(),
        *check_supervisor(read_state_from_env()),
    ]
    metrics.get(catalog.ENGINE_READY).set(1 if all(c.ok for c in checks) else 0)
    return checks


def _engine_client(request: Request) -> Any:
    return getattr(request.app.state, "engine_client", None)


@router.get("/warden/live")
async def live() -> JSONResponse:
    """The API process is up and its event loop answers: nothing more."""
    return JSONResponse({"live": True})


@router.get("/warden/ready")
async def ready(request: Request) -> JSONResponse:
    checks = await readiness(runtime.of(request), _engine_client(request))
    failing = [c.name for c in checks if not c.ok]
    body = {
        "ready": not failing,
        "failing": failing,
        "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in checks},
    }
    return JSONResponse(body, status_code=503 if failing else 200)


# --- Health view --------------------------------------------------------------------------


async def device_memory(engine_client: Any) -> Any:
    if engine_client is None:
        return {"error": "no engine client"}
    try:
        return await asyncio.wait_for(
            engine_client.collective_rpc("warden_device_memory"), RPC_TIMEOUT_S
        )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def window_view(w: WindowDelta, state: SupervisorState | None, now: float) -> dict[str, Any]:
    outcomes = w.by_label(catalog.REQUESTS.name)
    finished = w.get(catalog.VLLM_REQUEST_SUCCESS.name)
    per_s = (lambda n: round(n / w.covered_s, 3)) if w.covered_s > 0 else (lambda n: None)
    return {
        "covered_s": round(w.covered_s, 1),
        "requests": outcomes,
        "requests_per_s": per_s(sum(outcomes.values()) or finished),
        "finished_requests": finished,
        "generation_tokens_per_s": per_s(w.get(catalog.VLLM_GENERATION_TOKENS.name)),
        "ttft_s": w.histogram_quantiles(catalog.VLLM_TTFT.name),
        "inter_token_s": w.histogram_quantiles(catalog.VLLM_INTER_TOKEN_LATENCY.name),
        "errors": {
            "server_error": outcomes.get("server_error", 0.0),
            "engine": w.by_label(catalog.ENGINE_ERRORS.name),
        },
        "preemptions": w.get(catalog.VLLM_NUM_PREEMPTIONS.name),
        "restarts": state.restarts_within(w.seconds, now) if state else {},
    }


@router.get("/warden/health")
async def health(request: Request) -> JSONResponse:
    rt = runtime.of(request)
    engine_client = _engine_client(request)
    checks = await readiness(rt, engine_client)
    windows = metric_windows()
    await asyncio.to_thread(windows.sample)
    state = read_state_from_env()
    monitor = rt.monitor
    snap = monitor.snapshot if monitor is not None else None
    now = time.time()
    body: dict[str, Any] = {
        "ready": all(c.ok for c in checks),
        "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in checks},
        "device_memory": await device_memory(engine_client),
        "engine": None
        if snap is None
        else {
            "running": snap.running,
            "waiting": snap.waiting,
            "kv_cache_usage": snap.kv_cache_usage,
            "watermark": catalog.WATERMARK_LEVELS[snap.watermark],
            "last_step_age_s": round(now - snap.timestamp, 3) if snap.timestamp else None,
        },
        "windows": {f"{s}s": window_view(windows.window(s), state, now) for s in WINDOWS_S},
        "supervisor": None
        if state is None
        else {
            "phase": str(state.phase),
            "generation": state.generation,
            "circuit_open": state.circuit_open,
            "circuit_reason": state.circuit_reason,
            "eager": state.eager,
            "restart_totals": state.all_restart_totals(),
        },
    }
    return JSONResponse(body)
