"""Fleet: many engines of one job at a glance, and whether warden's alerts reach them.

Built on the fleet recording rules (alerts/fleet.py), which aggregate per job and model, so the
dashboard stays cheap with hundreds of engines. Engines by state (serving, degraded,
unreachable), the worst watermark, error ratio and latency-SLO attainment by model, and the
finish-reason share: a rising ``length`` share is warden's ``max_tokens`` cap as clients see it.
The bottom row is the delivery path: Alertmanager's failed webhooks, notifications engines turn
away, and what warden relay did with each alert.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from alerts import fleet as records
from alerts.config import DASHBOARD_FLEET
from dashboards.layout import Row, warden_dashboard
from dashboards.overview import WATERMARK_NAMES
from dashboards.panels import (
    BAD,
    OK,
    WARN,
    stat,
    state_timeline,
    steps,
    target,
    timeseries,
    value_names,
)
from dashboards.queries import (
    JOB_VAR,
    MODEL_LABEL,
    MODEL_VAR,
    RATE_WINDOW,
    aggregate,
    fleet_matchers,
    mixin,
)
from exporter.catalog import (
    ALERTMANAGER_NOTIFICATIONS_FAILED,
    DEGRADATION_ACTIVE,
    MEMORY_WATERMARK_PEAK,
    RELAY_ALERTS,
    RELAY_DELIVERIES,
    RELAY_ENGINES,
    RELAY_NOTIFICATIONS,
    WEBHOOK_NOTIFICATIONS,
    MetricSpec,
)

UID = DASHBOARD_FLEET
TITLE = "vLLM Warden / Fleet"

ENGINE_STATES = ("serving", "degraded", "unreachable")
STATE_NAMES = value_names(ENGINE_STATES, (OK, WARN, BAD))
TURNED_AWAY = "unauthorized|disabled|malformed|invalid_alert|not_for_this_engine"


def record(name: str, per_model: bool = False) -> str:
    """A fleet record narrowed to the selected fleet, job (and model)."""
    matchers = [*fleet_matchers(), f'job=~"${JOB_VAR}"']
    if per_model:
        matchers.append(f'{MODEL_LABEL}=~"${MODEL_VAR}"')
    return f"{name}{{{', '.join(matchers)}}}"


def engines(spec: MetricSpec | str, extra: str = "") -> str:
    """A raw series of the selected engines (every instance of the selected jobs)."""
    name = spec if isinstance(spec, str) else spec.name
    matchers = [*fleet_matchers(), f'job=~"${JOB_VAR}"']
    if extra:
        matchers.append(extra)
    return f"{name}{{{', '.join(matchers)}}}"


def other(spec: MetricSpec, selector: str, extra: str = "") -> str:
    """A series of another job (Alertmanager, the relay), picked by the config's selector."""
    matchers = ", ".join(m for m in (selector, extra) if m)
    return f"{spec.name}{{{matchers}}}"


def headline_row() -> Row:
    up = stat(
        "Engines up",
        "Engine targets Prometheus scrapes successfully, selected jobs.",
        [target(f"sum({record(records.ENGINES_UP)})")],
        "none",
    )
    unreachable = stat(
        "Unreachable engines",
        "Engine targets Prometheus cannot scrape. Normal: 0.",
        [
            target(
                f"sum({record(records.ENGINES_KNOWN)}) - sum({record(records.ENGINES_UP)})",
            )
        ],
        "none",
        thresholds=steps((OK, None), (BAD, 1)),
    )
    degraded = stat(
        "Degraded engines",
        "Engines with a warden degradation in force (from an alert, the reflex or an "
        "operator). Normal: 0.",
        [target(f"sum({record(records.ENGINES_DEGRADED)})")],
        "none",
        thresholds=steps((OK, None), (WARN, 1)),
    )
    worst = stat(
        "Worst memory watermark",
        "The highest watermark of any selected engine (its 15 s peak). Normal: 'normal'.",
        [target(f"max({record(records.WORST_WATERMARK)})")],
        MEMORY_WATERMARK_PEAK.unit,
        mappings=WATERMARK_NAMES,
        sparkline=False,
    )
    capped = stat(
        "max_tokens capped",
        "Requests per second whose max_tokens warden lowered, selected jobs. Normal: 0.",
        [target(f"sum({record(records.CAPPED_RATE)})")],
        "reqps",
        thresholds=steps((OK, None), (WARN, 0.01)),
    )
    relay = stat(
        "Engines the relay knows",
        "Engine targets in warden relay's last read of Prometheus's target list (all relays, "
        "whole Prometheus). Should equal engines up plus unreachable.",
        [target(f"max({other(RELAY_ENGINES, mixin().relay_selector)})")],
        RELAY_ENGINES.unit,
    )
    return Row(4, [(4, up), (4, unreachable), (4, degraded), (4, worst), (4, capped), (4, relay)])


def state_row() -> Row:
    up = engines("up")
    active = engines(DEGRADATION_ACTIVE)
    by_state = state_timeline(
        "Engines by state",
        "Each engine over time: serving (green), degraded by warden (orange), unreachable "
        "(red). Several engines turning orange together is a fleet problem, not an engine one.",
        [
            target(
                f"max by (instance) (\n  (1 - {up}) * 2\n  or\n  ({active} > bool 0)\n)",
                "{{instance}}",
            )
        ],
        "none",
        mappings=STATE_NAMES,
    )
    counts = timeseries(
        "Engines up, degraded and unreachable",
        "How many engines of the selected jobs are in each state. WardenFleetDegraded pages "
        "when degraded plus unreachable reach the configured share.",
        [
            target(f"sum({record(records.ENGINES_UP)})", "up"),
            target(f"sum({record(records.ENGINES_DEGRADED)})", "degraded"),
            target(
                f"sum({record(records.ENGINES_KNOWN)}) - sum({record(records.ENGINES_UP)})",
                "unreachable",
            ),
        ],
        "none",
    )
    return Row(8, [(14, by_state), (10, counts)])


def model_row() -> Row:
    slo = mixin().thresholds.latency_slo_seconds
    errors = timeseries(
        "Server error ratio by model",
        "Share of served requests that ended in a server error, per job and model. Normal: 0.",
        [
            target(
                aggregate("max", record(records.ERROR_RATIO_BY_MODEL, True), ["job", MODEL_LABEL]),
                "{{model_name}} ({{job}})",
            )
        ],
        "percentunit",
        maximum=1,
        thresholds=steps((OK, None), (WARN, 0.01), (BAD, 0.05)),
    )
    attainment = timeseries(
        "Latency SLO attainment by model",
        f"Share of finished requests that took at most {slo:g} s end to end (the mixin "
        "config's thresholds.latency_slo_seconds), per job and model. Refusals are not in it.",
        [
            target(
                aggregate("min", record(records.SLO_BY_MODEL, True), ["job", MODEL_LABEL]),
                "{{model_name}} ({{job}})",
            )
        ],
        "percentunit",
        maximum=1,
        thresholds=steps((BAD, None), (WARN, 0.95), (OK, 0.99)),
    )
    reasons = timeseries(
        "Finish reasons by model",
        "Why requests finished, as shares: 'stop' (done), 'length' (max_tokens reached). A "
        "rising 'length' share while warden caps max_tokens shows the cap reaching clients.",
        [
            target(
                aggregate(
                    "max",
                    record(records.FINISH_SHARE, True),
                    ["job", MODEL_LABEL, "finished_reason"],
                ),
                "{{model_name}} {{finished_reason}}",
            )
        ],
        "percentunit",
        maximum=1,
        stacked=True,
    )
    return Row(8, [(8, errors), (8, attainment), (8, reasons)])


def delivery_row() -> Row:
    config = mixin()
    webhook_failures = other(
        ALERTMANAGER_NOTIFICATIONS_FAILED, config.alertmanager_selector, 'integration="webhook"'
    )
    turned_away_series = engines(WEBHOOK_NOTIFICATIONS, f'outcome=~"{TURNED_AWAY}"')
    failed = timeseries(
        "Alertmanager webhook failures",
        "Webhook notifications Alertmanager failed to deliver per second (whole Prometheus). "
        "Normal: 0; otherwise engines miss their actions (WardenWebhookDeliveryFailing).",
        [
            target(
                aggregate("sum", f"rate({webhook_failures}[{RATE_WINDOW}])", ["instance"]),
                "{{instance}}",
            )
        ],
        "ops",
    )
    turned_away = timeseries(
        "Notifications engines turned away",
        "Alerts engines did not apply: 'unauthorized'/'disabled' (token problems), "
        "'malformed' and 'invalid_alert' (refused input, WardenWebhookRejected) and "
        "'not_for_this_engine' (an alert about another engine reached this one: a routing "
        "problem).",
        [
            target(
                aggregate(
                    "sum",
                    f"rate({turned_away_series}[{RATE_WINDOW}])",
                    ["outcome"],
                ),
                "{{outcome}}",
            )
        ],
        "ops",
    )
    relay_alerts = timeseries(
        "Relay: alerts by outcome",
        "What warden relay did with each alert: forwarded to its engine, or not forwarded "
        "(fleet_wide: no instance; unresolved: no such engine; ambiguous: several).",
        [
            target(
                aggregate(
                    "sum",
                    f"rate({other(RELAY_ALERTS, config.relay_selector)}[{RATE_WINDOW}])",
                    ["outcome"],
                ),
                "{{outcome}}",
            )
        ],
        "ops",
    )
    relay_deliveries = timeseries(
        "Relay: deliveries and notifications",
        "warden relay's POSTs to engines by outcome (retried, failed and refused need a look), "
        "and the notifications it answered Alertmanager, by outcome.",
        [
            target(
                aggregate(
                    "sum",
                    f"rate({other(RELAY_DELIVERIES, config.relay_selector)}[{RATE_WINDOW}])",
                    ["outcome"],
                ),
                "delivery {{outcome}}",
            ),
            target(
                aggregate(
                    "sum",
                    f"rate({other(RELAY_NOTIFICATIONS, config.relay_selector)}[{RATE_WINDOW}])",
                    ["outcome"],
                ),
                "notification {{outcome}}",
            ),
        ],
        "ops",
    )
    return Row(8, [(6, failed), (6, turned_away), (6, relay_alerts), (6, relay_deliveries)])


def dashboard() -> Dashboard:
    return warden_dashboard(
        UID,
        TITLE,
        "Many engines at once: engines by state, the worst watermark, error ratio, latency SLO "
        "and finish reasons by model, and whether alerts reach the engines.",
        [headline_row(), state_row(), model_row(), delivery_row()],
        per_instance=False,
    )
