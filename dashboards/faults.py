"""Faults and recovery: what went wrong in the engine, and how warden and the supervisor coped.

Degradation changes and restarts also appear as markers on every time series (see
``annotations``), so a spike here lines up with the action taken.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from dashboards.layout import Row, warden_dashboard
from dashboards.panels import (
    BAD,
    IDLE,
    OK,
    WARN,
    stat,
    state_timeline,
    steps,
    target,
    timeseries,
    value_names,
)
from dashboards.queries import aggregate, increase, quantile, rate, selector
from exporter.catalog import (
    CIRCUIT_BREAKER_STATE,
    CIRCUIT_STATES,
    COLLECTOR_ERRORS,
    ENGINE_CPU_WAIT,
    ENGINE_EAGER_MODE,
    ENGINE_ERRORS,
    ENGINE_HANG_THRESHOLD,
    ENGINE_HEALTHY,
    ENGINE_LAST_STEP,
    ENGINE_READY,
    ENGINE_RESTART_DURATION,
    ENGINE_RESTARTS,
    ENGINE_STALLED,
    NONFINITE_LOGITS,
    REQUEST_RETRIES,
    REQUEST_RETRIES_EXHAUSTED,
    SUPERVISOR_CIRCUIT_OPEN,
    VLLM_CORRUPTED_REQUESTS,
    WEBHOOK_NOTIFICATIONS,
)

UID = "warden-faults"
TITLE = "vLLM Warden / Faults and recovery"

# Restarts are rare: their durations are summarised over a long window.
RESTART_WINDOW = "1h"

CIRCUIT_NAMES = value_names(CIRCUIT_STATES, (OK, WARN, BAD))
STALL_NAMES = value_names(("stepping", "stalled"), (OK, BAD))
YES_NO = value_names(("no", "yes"), (BAD, OK))
SUPERVISOR_NAMES = value_names(("restarting", "gave up"), (OK, BAD))
EAGER_NAMES = value_names(("graphs on", "eager"), (OK, WARN))
ANY_IS_BAD = steps((OK, None), (BAD, 1))


def seconds_since_last_step(by: list[str] | None = None) -> str:
    """Age of the newest engine step; grows while idle, which is only a fault under load."""
    return f"time() - {aggregate('max', selector(ENGINE_LAST_STEP), by or [])}"


def headline_row() -> Row:
    stalled = stat(
        "Engine stalled",
        "'stalled' when requests are queued or running and no step finished within the stall "
        "timeout. Normal: 'stepping'.",
        [target(aggregate("max", selector(ENGINE_STALLED)))],
        ENGINE_STALLED.unit,
        mappings=STALL_NAMES,
        sparkline=False,
    )
    last_step = stat(
        "Time since last step",
        "Age of the last engine step that produced output. Small under load; it grows while "
        "the engine is idle, which is fine as long as 'Engine stalled' says 'stepping'.",
        [target(seconds_since_last_step())],
        "s",
        thresholds=steps((IDLE, None)),
    )
    breaker = stat(
        "Admission circuit",
        "warden's admission circuit breaker. Normal: 'closed'; 'half_open' admits a fraction "
        "of requests, 'open' refuses all.",
        [target(aggregate("max", selector(CIRCUIT_BREAKER_STATE)))],
        CIRCUIT_BREAKER_STATE.unit,
        mappings=CIRCUIT_NAMES,
        sparkline=False,
    )
    supervisor = stat(
        "Supervisor",
        "'gave up' when restarts hit the limit for the window and the supervisor stopped "
        "restarting the engine: a human is needed. Normal: 'restarting' (i.e. armed).",
        [target(aggregate("max", selector(SUPERVISOR_CIRCUIT_OPEN)))],
        SUPERVISOR_CIRCUIT_OPEN.unit,
        mappings=SUPERVISOR_NAMES,
        sparkline=False,
    )
    eager = stat(
        "CUDA graphs",
        "'eager' when warden restarted the engine with --enforce-eager after CUDA graph "
        "trouble: slower decoding, less memory. Normal: 'graphs on'.",
        [target(aggregate("max", selector(ENGINE_EAGER_MODE)))],
        ENGINE_EAGER_MODE.unit,
        mappings=EAGER_NAMES,
        sparkline=False,
    )
    restarts = stat(
        f"Restarts ({RESTART_WINDOW})",
        f"Engine restarts by the supervisor in the last {RESTART_WINDOW}. Normal: 0.",
        [target(increase(ENGINE_RESTARTS, window=RESTART_WINDOW))],
        ENGINE_RESTARTS.unit,
        thresholds=steps((OK, None), (WARN, 1), (BAD, 3)),
        decimals=0,
    )
    errors = stat(
        f"Engine errors ({RESTART_WINDOW})",
        f"Exceptions from model execution in the last {RESTART_WINDOW}, all classes. Normal: 0.",
        [target(increase(ENGINE_ERRORS, window=RESTART_WINDOW))],
        ENGINE_ERRORS.unit,
        thresholds=ANY_IS_BAD,
        decimals=0,
    )
    return Row(
        4,
        [
            (3, stalled),
            (4, last_step),
            (4, breaker),
            (3, supervisor),
            (3, eager),
            (3, restarts),
            (4, errors),
        ],
    )


def liveness_row() -> Row:
    ready = state_timeline(
        "Engine ready and healthy",
        "Readiness (every warden check passes) and vLLM's own health. Normal: both 'yes'; "
        "short 'no' bands line up with restarts.",
        [
            target(aggregate("min", selector(ENGINE_READY)), "ready"),
            target(aggregate("min", selector(ENGINE_HEALTHY)), "healthy"),
        ],
        ENGINE_READY.unit,
        mappings=YES_NO,
    )
    stalls = state_timeline(
        "Stalls",
        "Per engine: 'stalled' while work is pending and no step completes. Normal: "
        "'stepping' throughout.",
        [target(aggregate("max", selector(ENGINE_STALLED), ["instance"]), "{{instance}}")],
        ENGINE_STALLED.unit,
        mappings=STALL_NAMES,
    )
    cpu_wait = timeseries(
        "Engine CPU wait",
        "Per engine, the share of time its processes were ready to run but waited for a CPU "
        "(another process on its cores, a CPU limit). Steps slow down by this share, and the "
        "stall check does not count it against a step. Normal: near 0.",
        [target(rate(ENGINE_CPU_WAIT, ["instance"]), "{{instance}}")],
        "percentunit",
    )
    return Row(6, [(8, ready), (8, stalls), (8, cpu_wait)])


def errors_row() -> Row:
    last_step = timeseries(
        "Time since last engine step",
        "Per engine, with the hang threshold in force (learned from the engine's longest "
        "steps). A sawtooth near 0 under load; a straight climb while requests wait is a stall: "
        "past the threshold inside a step, or past the stall timeout, it is 'stalled'.",
        [
            target(seconds_since_last_step(["instance"]), "{{instance}}"),
            target(
                aggregate("max", selector(ENGINE_HANG_THRESHOLD), ["instance"]),
                "hang threshold {{instance}}",
            ),
        ],
        "s",
    )
    errors = timeseries(
        "Engine errors by class (5 min)",
        "Model execution exceptions: oom (recoverable), cuda_driver (context poisoned, restart "
        "needed), other. Normal: none.",
        [target(increase(ENGINE_ERRORS, ["class"]), "{{class}}")],
        ENGINE_ERRORS.unit,
        bars=True,
    )
    nonfinite = timeseries(
        "Non-finite logits (5 min)",
        "Requests whose logits held NaN or Inf, as seen by warden, and vLLM's own NaN count "
        "(when VLLM_COMPUTE_NANS_IN_LOGITS=1). Normal: 0; any means bad weights or overflow.",
        [
            target(increase(NONFINITE_LOGITS, ["kind"]), "warden {{kind}}"),
            target(increase(VLLM_CORRUPTED_REQUESTS), "vLLM NaN"),
        ],
        NONFINITE_LOGITS.unit,
        bars=True,
    )
    return Row(8, [(8, last_step), (8, errors), (8, nonfinite)])


def recovery_row() -> Row:
    retries = timeseries(
        "Retries by reason (5 min)",
        "Requests warden retried after a transient failure, and those still failing after the "
        "last retry (exhausted). Normal: 0; retries without exhaustion means recovery works.",
        [
            target(increase(REQUEST_RETRIES, ["reason"]), "retried {{reason}}"),
            target(increase(REQUEST_RETRIES_EXHAUSTED, ["reason"]), "exhausted {{reason}}"),
        ],
        REQUEST_RETRIES.unit,
        bars=True,
    )
    restarts = timeseries(
        "Engine restarts by reason (5 min)",
        "Restarts by the supervisor: exit, crash, stalled, enforce_eager... Normal: none.",
        [target(increase(ENGINE_RESTARTS, ["reason"]), "{{reason}}")],
        ENGINE_RESTARTS.unit,
        bars=True,
    )
    duration = timeseries(
        "Restart duration",
        f"Time from engine failure to ready again, median and p99 over the restarts of the "
        f"last {RESTART_WINDOW}. No line when nothing restarted; normal is under a minute.",
        [
            target(quantile(0.5, ENGINE_RESTART_DURATION, window=RESTART_WINDOW), "p50"),
            target(quantile(0.99, ENGINE_RESTART_DURATION, window=RESTART_WINDOW), "p99"),
        ],
        ENGINE_RESTART_DURATION.unit,
    )
    return Row(8, [(8, retries), (8, restarts), (8, duration)])


def control_row() -> Row:
    breaker = state_timeline(
        "Admission circuit breaker",
        "closed / half_open / open over time. Normal: 'closed' throughout.",
        [target(aggregate("max", selector(CIRCUIT_BREAKER_STATE), ["instance"]), "{{instance}}")],
        CIRCUIT_BREAKER_STATE.unit,
        mappings=CIRCUIT_NAMES,
    )
    webhook = timeseries(
        "Webhook notifications by outcome (5 min)",
        "Alertmanager notifications received by the engine webhook. Non-zero only around "
        "alerts; rejected or failed notifications mean alerts are not reaching the engine.",
        [target(increase(WEBHOOK_NOTIFICATIONS, ["outcome"]), "{{outcome}}")],
        WEBHOOK_NOTIFICATIONS.unit,
        bars=True,
    )
    collectors = timeseries(
        "Collector errors (5 min)",
        "Exceptions in warden's metric collectors, by collector. The engine is unaffected but "
        "that collector's metrics go stale. Normal: 0.",
        [target(increase(COLLECTOR_ERRORS, ["collector"]), "{{collector}}")],
        COLLECTOR_ERRORS.unit,
        bars=True,
    )
    return Row(8, [(8, breaker), (8, webhook), (8, collectors)])


def dashboard() -> Dashboard:
    return warden_dashboard(
        UID,
        TITLE,
        "Engine faults (errors, non-finite logits, stalls) and recovery (retries, restarts, "
        "circuit breakers, alert-driven actions).",
        [headline_row(), liveness_row(), errors_row(), recovery_row(), control_row()],
    )
