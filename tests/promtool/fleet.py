"""The fleet: job-level records, the fleet-wide alert, and the delivery alerts.

Three engines of one job in namespace ``prod``. Expected values and labels are worked out by
hand in the comments, so they check the rules instead of echoing them.
"""

from __future__ import annotations

from alerts import fleet
from alerts.config import ALERTMANAGER_JOB, ENGINE_JOB, RELAY_JOB
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
    MetricSpec,
)
from tests.promtool.model import (
    Expected,
    ExprCheck,
    RecordingScenario,
    Sample,
    Scenario,
    fires,
    healthy,
    pending,
    resolved,
    series_text,
    values_text,
)
from tests.promtool.series import INSTANCE, counter, labels, s

NAMESPACE = "prod"
JOB = {"job": ENGINE_JOB, "namespace": NAMESPACE}
A, B, C = "a:8000", "b:8000", "c:8000"
MODEL = {"model_name": "tiny", "engine": "0"}


def e(metric: MetricSpec | str, instance: str, **extra: str) -> str:
    """A series of one engine of the prod fleet (vLLM's carry model_name and engine)."""
    base = {**JOB, "instance": instance}
    name = metric if isinstance(metric, str) else metric.name
    if name.startswith("vllm:"):
        base.update(MODEL)
    return series_text(metric, {**base, **extra})


def per_minute_counter(per_minute: float, minutes: int) -> str:
    return values_text(counter(lambda _: per_minute, minutes))


def job(record: str, value: float, **extra: str) -> Sample:
    return Sample(series_text(record, {**JOB, **extra}), value)


BUCKET = VLLM_E2E_LATENCY.name + "_bucket"
COUNT = VLLM_E2E_LATENCY.name + "_count"

FLEET_RECORDING_SCENARIOS = (
    RecordingScenario(
        "the fleet of one job: a serving, b degraded, c unreachable",
        {
            e("up", A): "1x10",
            e("up", B): "1x10",
            e("up", C): "0x10",
            # b holds stop_admission; c, unreachable, has no series
            e(DEGRADATION_ACTIVE, A, action="stop_admission"): "0x10",
            e(DEGRADATION_ACTIVE, B, action="stop_admission"): "1x10",
            e(MEMORY_WATERMARK_PEAK, A): "0x10",
            e(MEMORY_WATERMARK_PEAK, B): "2x10",
            e(MAX_TOKENS_CAPPED, A): per_minute_counter(60, 11),  # 1 per second
            e(MAX_TOKENS_CAPPED, B): "0x10",
            e(VLLM_NUM_REQUESTS_RUNNING, A): "1x10",
            e(VLLM_NUM_REQUESTS_RUNNING, B): "3x10",
            # a: 1/s success; b: 0.5/s success, 0.5/s server errors, 1/s refused by warden
            e(REQUESTS, A, outcome="success"): per_minute_counter(60, 11),
            e(REQUESTS, A, outcome="server_error"): "0x10",
            e(REQUESTS, B, outcome="success"): per_minute_counter(30, 11),
            e(REQUESTS, B, outcome="server_error"): per_minute_counter(30, 11),
            e(REQUESTS, B, outcome="rejected"): per_minute_counter(60, 11),
            # within 10 s: all of a's requests (1/s), half of b's (0.5 of 1/s)
            e(BUCKET, A, le="10.0"): per_minute_counter(60, 11),
            e(COUNT, A): per_minute_counter(60, 11),
            e(BUCKET, B, le="10.0"): per_minute_counter(30, 11),
            e(COUNT, B): per_minute_counter(60, 11),
            # finish reasons: a stop 0.5/s + length 0.5/s; b length 1/s
            e(VLLM_REQUEST_SUCCESS, A, finished_reason="stop"): per_minute_counter(30, 11),
            e(VLLM_REQUEST_SUCCESS, A, finished_reason="length"): per_minute_counter(30, 11),
            e(VLLM_REQUEST_SUCCESS, B, finished_reason="stop"): "0x10",
            e(VLLM_REQUEST_SUCCESS, B, finished_reason="length"): per_minute_counter(60, 11),
        },
        (
            ExprCheck("10m", fleet.ENGINES_UP, (job(fleet.ENGINES_UP, 2),)),
            ExprCheck("10m", fleet.ENGINES_KNOWN, (job(fleet.ENGINES_KNOWN, 3),)),
            ExprCheck("10m", fleet.ENGINES_DEGRADED, (job(fleet.ENGINES_DEGRADED, 1),)),
            ExprCheck("10m", fleet.WORST_WATERMARK, (job(fleet.WORST_WATERMARK, 2),)),
            ExprCheck("10m", fleet.CAPPED_RATE, (job(fleet.CAPPED_RATE, 1),)),
            ExprCheck(
                "10m",
                fleet.INSTANCE_MODEL,
                tuple(
                    Sample(
                        series_text(
                            fleet.INSTANCE_MODEL, {**JOB, "instance": i, "model_name": "tiny"}
                        ),
                        1,
                    )
                    for i in (A, B)
                ),
            ),
            # (0 + 0.5) server errors / (1 + 1) served (b's refusals are not served)
            ExprCheck(
                "10m",
                fleet.ERROR_RATIO_BY_MODEL,
                (job(fleet.ERROR_RATIO_BY_MODEL, 0.25, model_name="tiny"),),
            ),
            # (1 + 0.5) within 10 s / (1 + 1) finished
            ExprCheck(
                "10m", fleet.SLO_BY_MODEL, (job(fleet.SLO_BY_MODEL, 0.75, model_name="tiny"),)
            ),
            # stop 0.5 / 2, length (0.5 + 1) / 2
            ExprCheck(
                "10m",
                fleet.FINISH_SHARE,
                (
                    job(fleet.FINISH_SHARE, 0.75, model_name="tiny", finished_reason="length"),
                    job(fleet.FINISH_SHARE, 0.25, model_name="tiny", finished_reason="stop"),
                ),
            ),
        ),
    ),
)

FLEET_CRITICAL = {**JOB, "severity": "critical"}


def fleet_desc(percent: str) -> str:
    return (
        f"{percent} of the engines of job {ENGINE_JOB} are degraded by warden or cannot be "
        "scraped; the rest carry the load."
    )


def degraded(first: int, last: int, minutes: int) -> str:
    """stop_admission in force from minute ``first`` to ``last`` (inclusive)."""
    return values_text([1 if first <= m <= last else 0 for m in range(minutes)])


AM = {"job": ALERTMANAGER_JOB, "instance": "alertmanager:9093"}
RELAY = {"job": RELAY_JOB, "instance": "relay:9095"}


def step(at: int, to: float, minutes: int) -> str:
    """0 until minute ``at``, then ``to`` (a counter that jumped once)."""
    return values_text([0 if m < at else to for m in range(minutes)])


def am_failures_desc() -> str:
    return (
        "Alertmanager alertmanager:9093 fails 0.10 webhook notifications per second: engines "
        "(or the relay) do not receive their degradation actions and their resolutions."
    )


FLEET_SCENARIOS = (
    Scenario(
        "WardenFleetDegraded",
        "two of three engines degraded at once",
        {
            **{e("up", i): "1x20" for i in (A, B, C)},
            e(DEGRADATION_ACTIVE, A, action="stop_admission"): "0x20",
            # b from 5m (1 of 3: not enough), c from 7m (2 of 3), both until 14m
            e(DEGRADATION_ACTIVE, B, action="stop_admission"): degraded(5, 14, 21),
            e(DEGRADATION_ACTIVE, C, action="stop_admission"): degraded(7, 14, 21),
        },
        (
            healthy("6m"),
            pending("8m", FLEET_CRITICAL),
            # one alert for the job, not one per engine
            fires("12m", Expected(FLEET_CRITICAL, fleet_desc("66.67%"))),
            fires("14m", Expected(FLEET_CRITICAL, fleet_desc("66.67%"))),
            resolved("15m"),
        ),
    ),
    Scenario(
        "WardenFleetDegraded",
        "two of three engines cannot be scraped",
        {
            e("up", A): "1x20",
            e("up", B): values_text([0 if 3 <= m <= 12 else 1 for m in range(21)]),
            e("up", C): values_text([0 if 3 <= m <= 12 else 1 for m in range(21)]),
            e(DEGRADATION_ACTIVE, A, action="stop_admission"): "0x20",
        },
        (
            healthy("2m"),
            pending("4m", FLEET_CRITICAL),
            fires("9m", Expected(FLEET_CRITICAL, fleet_desc("66.67%"))),
            resolved("14m"),
        ),
    ),
    Scenario(
        "WardenWebhookDeliveryFailing",
        "Alertmanager's webhook notifications fail for 15 minutes",
        {
            # 6 failures a minute from 5m to 20m; an email receiver failing does not count
            series_text(ALERTMANAGER_NOTIFICATIONS_FAILED, {**AM, "integration": "webhook"}): (
                values_text(counter(lambda m: 6 if 5 < m <= 20 else 0, 40))
            ),
            series_text(ALERTMANAGER_NOTIFICATIONS_FAILED, {**AM, "integration": "email"}): (
                per_minute_counter(6, 40)
            ),
        },
        (
            healthy("5m"),
            pending("8m", labels("critical", instance="alertmanager:9093")),
            fires(
                "15m",
                Expected(labels("critical", instance="alertmanager:9093"), am_failures_desc()),
            ),
            resolved("26m"),
        ),
    ),
    Scenario(
        "WardenWebhookRejected",
        "an engine refuses 6 notifications (its token is not Alertmanager's) and 6 alerts "
        "one by one (their clocks are beyond the skew)",
        {
            s(WEBHOOK_NOTIFICATIONS, outcome="unauthorized"): step(12, 6, 30),
            s(WEBHOOK_NOTIFICATIONS, outcome="invalid_alert"): step(12, 6, 30),
            s(WEBHOOK_NOTIFICATIONS, outcome="applied"): per_minute_counter(3, 30),
        },
        (
            healthy("11m"),
            pending("12m", labels("critical")),
            fires(
                "14m",
                Expected(
                    labels("critical"),
                    f"The engine on {INSTANCE} refused 12 notifications or alerts in 10 minutes "
                    "(wrong or unreadable token, malformed notification, or alerts refused one "
                    "by one): it will not act on them.",
                ),
            ),
            resolved("22m"),
        ),
    ),
    Scenario(
        "WardenRelayDeliveryFailing",
        "the relay cannot reach an engine three times",
        {
            series_text(RELAY_DELIVERIES, {**RELAY, "outcome": "failed"}): step(12, 3, 30),
            series_text(RELAY_DELIVERIES, {**RELAY, "outcome": "delivered"}): per_minute_counter(
                5, 30
            ),
        },
        (
            healthy("11m"),
            pending("12m", labels("warning", instance="relay:9095")),
            fires(
                "14m",
                Expected(
                    labels("warning", instance="relay:9095"),
                    "warden relay relay:9095 failed 3 deliveries to engines in 10 minutes "
                    "(refused, or unreachable after its retries); its log names the engines.",
                ),
            ),
            resolved("22m"),
        ),
    ),
)
