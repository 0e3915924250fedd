"""Rules above one engine: the fleet's recording rules, the fleet alert, and delivery alerts.

Fleet records aggregate per job and model, keeping the config's fleet labels (``cluster``,
``namespace``): how many engines are up, degraded, and how bad the worst one is; error ratio,
latency-SLO attainment and finish-reason share per model (a rising ``length`` share is what
warden's ``max_tokens`` cap looks like from the clients' side). The fleet dashboard reads them;
``WardenFleetDegraded`` pages once for the whole job, however many engines it involves.

Delivery alerts watch the path from Alertmanager to the engines, which warden cannot watch from
inside the engine when it is broken: Alertmanager's failed webhook notifications, engines
turning notifications away (wrong or unreadable token), and the relay failing to deliver.

The per-engine records (alerts/recording.py) lose ``job`` (they aggregate by identity); the fleet
records that need them take ``job`` and ``model_name`` from a per-engine map recorded here
(``INSTANCE_MODEL``), joined on the identity labels.
"""

from __future__ import annotations

from alerts import recording as rec
from alerts.config import DASHBOARD_FLEET, MixinConfig
from alerts.model import AlertRule, RecordingRule, RuleGroup, recorded_name
from exporter.catalog import (
    ALERTMANAGER_NOTIFICATIONS_FAILED,
    DEGRADATION_ACTIVE,
    MAX_TOKENS_CAPPED,
    MEMORY_WATERMARK_PEAK,
    RELAY_DELIVERIES,
    REQUESTS,
    VLLM_E2E_LATENCY,
    VLLM_NUM_REQUESTS_RUNNING,
    VLLM_REQUEST_SUCCESS,
    WEBHOOK_NOTIFICATIONS,
)

MODEL_LABEL = "model_name"  # vLLM's label for the served model
REASON_LABEL = "finished_reason"

ENGINES_UP = recorded_name("job", "up", "sum")
ENGINES_KNOWN = recorded_name("job", "up", "count")
ENGINES_DEGRADED = recorded_name("job", DEGRADATION_ACTIVE, "engines")
WORST_WATERMARK = recorded_name("job", MEMORY_WATERMARK_PEAK, "max")
CAPPED_RATE = recorded_name("job", MAX_TOKENS_CAPPED, "rate5m")
INSTANCE_MODEL = recorded_name("instance_model", VLLM_NUM_REQUESTS_RUNNING, "group")
ERROR_RATIO_BY_MODEL = recorded_name("job_model", REQUESTS, "server_error_ratio_rate5m")
SLO_BY_MODEL = recorded_name("job_model", VLLM_E2E_LATENCY, "slo_ratio_rate5m")
FINISH_SHARE = recorded_name("job_model_reason", VLLM_REQUEST_SUCCESS, "share_rate5m")


def _per_model(c: MixinConfig, per_engine: str) -> str:
    """A per-engine record summed per job and model, through the engine -> model map."""
    return (
        f"sum {c.by_fleet(MODEL_LABEL)} (\n"
        f"  {per_engine}\n"
        f"  * {c.on()} group_left (job, {MODEL_LABEL}) {INSTANCE_MODEL}\n"
        f")"
    )


def _slo_bucket(c: MixinConfig) -> str:
    return repr(float(c.thresholds.latency_slo_seconds))


FLEET_RECORDING = RuleGroup(
    "warden-fleet-recording",
    (
        RecordingRule(ENGINES_UP, lambda c: f"sum {c.by_fleet()} ({c.select('up')})"),
        RecordingRule(ENGINES_KNOWN, lambda c: f"count {c.by_fleet()} ({c.select('up')})"),
        # Engines with any degradation in force (from alerts, the reflex or an operator).
        RecordingRule(
            ENGINES_DEGRADED,
            lambda c: (
                f"sum {c.by_fleet()} (\n"
                f"  max {c.by('job')} ({c.select(DEGRADATION_ACTIVE)}) > bool 0\n)"
            ),
        ),
        RecordingRule(
            WORST_WATERMARK, lambda c: f"max {c.by_fleet()} ({c.select(MEMORY_WATERMARK_PEAK)})"
        ),
        RecordingRule(
            CAPPED_RATE, lambda c: f"sum {c.by_fleet()} (rate({c.select(MAX_TOKENS_CAPPED)}[5m]))"
        ),
        RecordingRule(
            INSTANCE_MODEL,
            lambda c: f"group {c.by('job', MODEL_LABEL)} ({c.select(VLLM_NUM_REQUESTS_RUNNING)})",
        ),
        RecordingRule(
            ERROR_RATIO_BY_MODEL,
            lambda c: (
                _per_model(c, f'{rec.REQUESTS_BY_OUTCOME_RATE}{{outcome="server_error"}}')
                + "\n/\n"
                + _per_model(c, rec.REQUESTS_SERVED_RATE)
            ),
        ),
        RecordingRule(
            SLO_BY_MODEL,
            lambda c: (
                f"sum {c.by_fleet(MODEL_LABEL)} (rate("
                f"{c.select(VLLM_E2E_LATENCY.name + '_bucket', le=_slo_bucket(c))}[5m]))\n"
                f"/\n"
                f"sum {c.by_fleet(MODEL_LABEL)} (rate({c.select(VLLM_E2E_LATENCY.name + '_count')}"
                f"[5m]))"
            ),
        ),
        RecordingRule(
            FINISH_SHARE,
            lambda c: (
                f"sum {c.by_fleet(MODEL_LABEL, REASON_LABEL)} "
                f"(rate({c.select(VLLM_REQUEST_SUCCESS)}[5m]))\n"
                f"/ ignoring ({REASON_LABEL}) group_left\n"
                f"sum {c.by_fleet(MODEL_LABEL)} (rate({c.select(VLLM_REQUEST_SUCCESS)}[5m]))"
            ),
        ),
    ),
)

FLEET = RuleGroup(
    "warden-fleet",
    (
        AlertRule(
            name="WardenFleetDegraded",
            scope="fleet",
            expr=lambda c: (
                f"(\n  ({ENGINES_DEGRADED} or {ENGINES_KNOWN} * 0)\n"
                f"  + ({ENGINES_KNOWN} - {ENGINES_UP})\n"
                f") / {ENGINES_KNOWN}\n"
                f">= {c.thresholds.fleet_degraded_ratio}"
            ),
            for_=lambda c: c.thresholds.fleet_degraded_for,
            severity="critical",
            summary="Much of the fleet is degraded or unreachable: it is short of capacity.",
            description=(
                "{{ $value | humanizePercentage }} of the engines of job {{ $labels.job }} are "
                "degraded by warden or cannot be scraped; the rest carry the load."
            ),
            dashboard=DASHBOARD_FLEET,
        ),
    ),
)

# Outcomes of warden_webhook_notifications_total that mean an engine turned Alertmanager away.
_TURNED_AWAY = "unauthorized|disabled|malformed|invalid_alert"
# Outcomes of warden_relay_deliveries_total that mean an engine did not get its alerts.
_UNDELIVERED = "failed|refused"


def _failed_webhooks(c: MixinConfig) -> str:
    failed = c.select(
        ALERTMANAGER_NOTIFICATIONS_FAILED, c.alertmanager_selector, integration="webhook"
    )
    return f"sum {c.by()} (rate({failed}[5m])) > 0"


def _turned_away(c: MixinConfig) -> str:
    refused = c.select(WEBHOOK_NOTIFICATIONS, matchers=f'outcome=~"{_TURNED_AWAY}"')
    return f"sum {c.by()} (increase({refused}[10m])) > 0"


def _undelivered(c: MixinConfig) -> str:
    failed = c.select(RELAY_DELIVERIES, c.relay_selector, matchers=f'outcome=~"{_UNDELIVERED}"')
    return f"sum {c.by()} (increase({failed}[10m])) > 0"


DELIVERY = RuleGroup(
    "warden-delivery",
    (
        AlertRule(
            name="WardenWebhookDeliveryFailing",
            expr=_failed_webhooks,
            for_="5m",
            severity="critical",
            summary="Alertmanager cannot deliver webhook notifications: engines get no actions.",
            description=(
                "Alertmanager {{ $labels.instance }} fails "
                '{{ printf "%.2f" $value }} webhook notifications per second: engines (or the '
                "relay) do not receive their degradation actions and their resolutions."
            ),
            dashboard=DASHBOARD_FLEET,
        ),
        AlertRule(
            name="WardenWebhookRejected",
            expr=_turned_away,
            for_="1m",
            severity="critical",
            summary="An engine turns Alertmanager's notifications or alerts away.",
            description=(
                "The engine on {{ $labels.instance }} refused "
                '{{ printf "%.0f" $value }} notifications or alerts in 10 minutes (wrong or '
                "unreadable token, malformed notification, or alerts refused one by one): it "
                "will not act on them."
            ),
            dashboard=DASHBOARD_FLEET,
        ),
        AlertRule(
            name="WardenRelayDeliveryFailing",
            expr=_undelivered,
            for_="1m",
            severity="warning",
            summary="warden relay cannot deliver some alerts to their engines.",
            description=(
                "warden relay {{ $labels.instance }} failed "
                '{{ printf "%.0f" $value }} deliveries to engines in 10 minutes (refused, or '
                "unreachable after its retries); its log names the engines."
            ),
            dashboard=DASHBOARD_FLEET,
        ),
    ),
)
