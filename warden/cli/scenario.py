"""The closed loop, end to end, on a running stack: the scenario ``warden demo`` shows and the
end-to-end test asserts.

calibrate -> overload -> saturated -> local reflex (admission refuses within a step) ->
WardenSaturated pending -> firing in Prometheus -> Alertmanager -> webhook lease
(shed_low_priority) -> page (critical: most requests refused) -> overload removed -> resolved
-> normal.

Why overload and not memory: a CPU engine's memory does not creep, and the KV cache filling up
is vLLM working as designed (it queues), so neither is an honest memory signal. What the CPU
engine really produces is a queue users wait in, against the stack's limit of
``DEMO_MAX_QUEUE_DEPTH`` waiting requests (``admission.saturation.max_queue_depth``, set by the
demo's control config).

Calibrated, so it pages on every machine: the scenario first measures what this engine completes
per second with its batch full (warden/cli/load.py), then offers ``OVERLOAD_MULTIPLE`` times that
as independent arrivals. At most one in ``OVERLOAD_MULTIPLE`` can be served, so the refused share
lands above the critical alert's threshold (the alerts config's ``saturated_refused_ratio``) by a
margin that does not depend on the machine's speed; the scenario prints both.

Every step is observed from outside, through the same HTTP APIs an operator would use, and
stamped with the time it happened (the engine's, Prometheus's or the pager's own timestamp where
one exists, else the moment it was seen), in seconds since the overload started. A step that does
not happen in time raises ``ScenarioError`` naming the step, what it waited for and the last value
seen of the signal it depends on. Request outcomes are counted with the one rule
(warden/common/outcomes.py): completed, refused (429/503 with Retry-After), failed; the scenario
requires failed = 0.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from alerts import recording as rec
from alerts.config import DEFAULT as ALERTS_CONFIG
from alerts.model import AlertRule
from alerts.rules import TRAFFIC
from exporter import catalog
from warden.cli.load import Capacity, OpenLoopLoad, Outcomes, measure_capacity
from warden.common.outcomes import COMPLETED, FAILED, REFUSED
from warden.common.waiting import wait_until
from warden.stack.native import NativeStack, StackError

# The saturation alert (the traffic alert that sheds), named by the rule definitions themselves.
SATURATION_ALERTS = tuple(
    sorted(
        {
            rule.name
            for rule in TRAFFIC.rules
            if isinstance(rule, AlertRule) and rule.action == "shed_low_priority"
        }
    )
)
# Requests waiting beyond this many are refused (the demo's control config).
DEMO_MAX_QUEUE_DEPTH = 4
# How long the engine keeps reporting saturated once the queue is back under its limit (the
# demo's control config; 20 s by default, enough for a 15 s scrape to see it). The demo scrapes
# every second, so 5 s is seen all the same, and the resolution comes 15 s sooner.
DEMO_SATURATION_HOLD_S = 5.0
# The demo engine's batch (--max-num-seqs, warden/cli/demo.py): calibration keeps it full.
DEMO_BATCH = 8
# Offered load, as a multiple of the measured capacity: at most 1/4 can be served, so at least
# 3/4 are refused, far enough above the paging threshold (0.5 by default) that a capacity
# measured 1.4x too low still pages.
OVERLOAD_MULTIPLE = 4.0
# Requests' priorities in turn: important ones (priority 0, kept while low priority is shed)
# and batch ones, two to one.
IMPORTANT_PRIORITY, BATCH_PRIORITY = 0, 5
PRIORITY_MIX = (IMPORTANT_PRIORITY, IMPORTANT_PRIORITY, BATCH_PRIORITY)


class ScenarioError(RuntimeError):
    """A step did not happen in time; ``str()`` is the one line a person reads."""

    def __init__(self, step: str, waited_for: str, timeout_s: float, last_seen: str) -> None:
        self.step, self.waited_for, self.last_seen = step, waited_for, last_seen
        super().__init__(
            f"step '{step}' did not happen within {timeout_s:.0f} s: waited for {waited_for}; "
            f"last seen: {last_seen}"
        )


@dataclass
class Step:
    name: str
    at: float  # seconds since the overload started, when it happened
    detail: str = ""


@dataclass
class Calibration:
    """What the engine completes per second here, the load offered, and the margins."""

    capacity: Capacity
    multiple: float
    threshold: float  # the critical alert's refused share

    @property
    def offered_rate(self) -> float:
        return self.capacity.per_second * self.multiple

    @property
    def expected_refused_share(self) -> float:
        return 1.0 - 1.0 / self.multiple

    def lines(self) -> list[str]:
        return [
            f"calibration: {self.capacity.line()}",
            f"overload: {self.multiple:g}x capacity = {self.offered_rate:.1f} requests/s offered; "
            f"at most 1/{self.multiple:g} can be served, so the refused share should be at "
            f"least {self.expected_refused_share:.2f}, against the page threshold "
            f"{self.threshold:.2f} (margin {self.expected_refused_share - self.threshold:+.2f})",
        ]


@dataclass
class ScenarioResult:
    timeline: list[Step]
    outcomes: Outcomes
    checks: dict[str, bool]
    intervals: dict[str, str]
    calibration: Calibration | None = None
    offered_rate: float = 0.0

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def step(self, name: str) -> Step:
        return next(s for s in self.timeline if s.name == name)

    def report(self) -> str:
        lines = []
        if self.calibration is not None:
            lines += self.calibration.lines()
            share = self.outcomes.refused_share()
            lines.append(
                f"observed: {self.offered_rate:.1f} requests/s sent, refused share "
                + (f"{share:.2f}" if share is not None else "-")
                + f" (page threshold {self.calibration.threshold:.2f})"
            )
        lines.append("closed-loop timeline (seconds since the overload started):")
        previous = 0.0
        for step in sorted(self.timeline, key=lambda s: s.at):
            lines.append(
                f"  {step.at:7.1f}s  (+{step.at - previous:5.1f}s)  {step.name:<26} {step.detail}"
            )
            previous = step.at
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.by_reason.items()))
        lines.append(f"request outcomes: {self.outcomes.tally.line()} (refused by: {reasons})")
        for problem in self.outcomes.failed[:5]:
            lines.append(f"  failed: {problem}")
        lines.append("intervals: " + ", ".join(f"{k} {v}" for k, v in self.intervals.items()))
        for name, ok in self.checks.items():
            lines.append(f"  [{'ok' if ok else 'FAILED'}] {name}")
        return "\n".join(lines)


def _parse_time(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time as Prometheus and Alertmanager write it."""
    try:
        whole, _, fraction = text.rstrip("Z").partition(".")
        base = calendar.timegm(time.strptime(whole[:19], "%Y-%m-%dT%H:%M:%S"))
        digits = "".join(ch for ch in fraction if ch.isdigit())
        return base + (float(f"0.{digits}") if digits else 0.0)
    except (ValueError, TypeError):
        return None


class ClosedLoopScenario:
    def __init__(
        self,
        stack: NativeStack,
        out: Callable[[str], None] = print,
        step_timeout_s: float = 240.0,
        multiple: float = OVERLOAD_MULTIPLE,
    ) -> None:
        self.stack = stack
        self.out = out
        self.step_timeout_s = step_timeout_s
        self.multiple = multiple
        self.timeline: list[Step] = []
        self.t0 = 0.0
        self.outcomes = Outcomes()

    # --- observation helpers ----------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return httpx.get(f"{self.stack.engine_url}/warden/state", timeout=10).json()

    def _mark(self, name: str, detail: str = "", at: float | None = None) -> Step:
        """A step that happened at ``at`` (the time's own source), else now."""
        step = Step(name, (at if at is not None else time.time()) - self.t0, detail)
        self.timeline.append(step)
        self.out(f"  {step.at:7.1f}s  {name:<26} {detail}")
        return step

    def _wait(
        self,
        step: str,
        what: str,
        probe: Callable[[], Any],
        signal: Callable[[], str],
        timeout_s: float | None = None,
    ) -> Any:
        """``probe()``'s first truthy value; on timeout a ScenarioError with ``signal()``, the
        last value seen of what the step depends on."""

        def found() -> Any:
            try:
                return probe()
            except (httpx.HTTPError, ValueError, KeyError, StackError):
                return None  # not answering yet: keep waiting

        limit = timeout_s or self.step_timeout_s
        try:
            return wait_until(found, limit, 0.25, what=what)
        except TimeoutError:
            try:
                seen = signal()
            except (httpx.HTTPError, ValueError, KeyError, StackError) as exc:
                seen = f"(could not read it: {type(exc).__name__}: {exc})"
            raise ScenarioError(step, what, limit, seen) from None

    def _prometheus_value(self, expr: str) -> str:
        samples = self.stack.query(expr)
        if not samples:
            return "no sample"
        return ", ".join(f"{float(s['value'][1]):.3g}" for s in samples)

    def _prometheus_alert(self, state: str, severity: str | None = None) -> dict[str, Any] | None:
        for alert in self.stack.alerts():
            labels = alert["labels"]
            if (
                labels.get("alertname") in SATURATION_ALERTS
                and alert["state"] == state
                and (severity is None or labels.get("severity") == severity)
            ):
                return alert
        return None

    def _firing_since(self, alert: dict[str, Any]) -> float | None:
        """The evaluation at which ``alert`` started firing: the first sample of its ALERTS
        series (Prometheus's own clock), not the moment the scenario happened to look."""
        labels = alert["labels"]
        selector = ", ".join(
            f'{k}="{labels[k]}"' for k in ("alertname", "severity", "instance") if k in labels
        )
        samples = self.stack.query(f'ALERTS{{{selector}, alertstate="firing"}}[10m]')
        times = [float(t) for sample in samples for t, _ in sample.get("values", [])]
        return min(times) if times else None

    def _alert_states(self) -> str:
        states = [
            f"{a['labels'].get('alertname')}/{a['labels'].get('severity')} {a['state']}"
            for a in self.stack.alerts()
            if a["labels"].get("alertname") in SATURATION_ALERTS
        ]
        return ", ".join(states) or "no saturation alert in Prometheus"

    def _alertmanager_alerts(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.stack.alertmanager_url}/api/v2/alerts", timeout=10)
        return list(response.json())

    def _saturation_signal(self) -> str:
        saturation = self._state()["saturation"]
        return f"saturation state {saturation.get('state')!r}, queue {saturation.get('queue')}"

    def _saturated_signal(self) -> str:
        return f"{rec.SATURATED_1M} = {self._prometheus_value(rec.SATURATED_1M)}"

    def _refused_signal(self) -> str:
        share = self.outcomes.refused_share()
        client = f"{share:.2f}" if share is not None else "-"
        return (
            f"{rec.REJECTED_RATIO} = {self._prometheus_value(rec.REJECTED_RATIO)} "
            f"(clients saw {client}; the critical alert needs > {self.threshold:g}); "
            f"{self._alert_states()}"
        )

    @property
    def threshold(self) -> float:
        return ALERTS_CONFIG.thresholds.saturated_refused_ratio

    # --- the scenario -----------------------------------------------------------------

    def calibrate(self) -> Calibration:
        assert self.stack.model is not None, "the scenario drives the engine's served model"
        self.out(f"calibration: {DEMO_BATCH} clients fill the batch for 13 s ...")
        capacity = measure_capacity(self.stack.engine_url, self.stack.model, DEMO_BATCH)
        if capacity.completed == 0:
            raise ScenarioError(
                "calibration",
                "completed requests with the batch full",
                capacity.window_s,
                f"{capacity.refused} refused, {capacity.failed} failed, 0 completed",
            )
        calibration = Calibration(capacity, self.multiple, self.threshold)
        for line in calibration.lines():
            self.out(line)
        return calibration

    def run(self) -> ScenarioResult:
        stack = self.stack
        assert stack.model is not None, "the scenario drives the engine's served model"
        calibration = self.calibrate()
        outcomes = self.outcomes
        checks: dict[str, bool] = {}
        load = OpenLoopLoad(
            stack.engine_url, stack.model, calibration.offered_rate, PRIORITY_MIX, outcomes
        )
        self.out("closed-loop timeline (seconds since the overload started):")
        self.t0 = time.time()
        load.start()
        self._mark(
            "overload",
            f"{calibration.offered_rate:.1f} requests/s ({self.multiple:g}x capacity), "
            f"1 in {len(PRIORITY_MIX)} low priority, queue limit {DEMO_MAX_QUEUE_DEPTH}",
            at=self.t0,
        )
        try:
            self._overloaded(load, checks)
        finally:
            load.stop()
        self._mark("overload removed")
        self._wait(
            "resolved",
            "Alertmanager's resolved notification to release the webhook lease",
            lambda: not any(x["source"] == "alertmanager" for x in self._state()["leases"]),
            lambda: (
                f"leases {[x['action'] for x in self._state()['leases']]}; " + self._alert_states()
            ),
            timeout_s=self.step_timeout_s + 120,
        )
        self._mark("resolved", "Alertmanager's resolved notification released the lease")

        def normal() -> bool:
            state = self._state()
            return (
                state["saturation"]["state"] == "normal"
                and not state["leases"]
                and state["policy"]["stop_admission"] is False
                and state["policy"]["reject_all"] is False
            )

        self._wait(
            "normal",
            "saturation back to normal, no lease, admission open",
            normal,
            lambda: f"{self._saturation_signal()}; policy {self._state()['policy']}",
        )
        probe = httpx.post(
            f"{stack.engine_url}/v1/completions",
            json={"model": stack.model, "prompt": "hello", "max_tokens": 4},
            timeout=60,
        )
        self._mark("normal", f"new request answered {probe.status_code}")
        counts = outcomes.counts
        share = outcomes.refused_share() or 0.0
        checks["engine serves again after resolution"] = probe.status_code == 200
        checks["failed = 0"] = counts[FAILED] == 0
        checks["some requests completed and some were refused"] = (
            counts[COMPLETED] > 0 and counts[REFUSED] > 0
        )
        checks["saturation refusals name their signal"] = outcomes.by_reason["saturated"] > 0
        checks[f"refused share {share:.2f} above the page threshold {self.threshold:g}"] = (
            share > self.threshold
        )
        intervals = {
            "scrape": stack.settings.intervals.scrape,
            "evaluation": stack.settings.intervals.evaluation,
            "alert holds": ", ".join(
                f"{group} at most {cap}s" for group, cap in stack.settings.alert_hold_caps.items()
            )
            or "as generated",
        }
        return ScenarioResult(
            self.timeline, outcomes, checks, intervals, calibration, load.offered_rate()
        )

    def _overloaded(self, load: OpenLoopLoad, checks: dict[str, bool]) -> None:
        """The steps while the overload is on: reflex, alert, Alertmanager, lease, page."""
        reaction = self._wait(
            "saturated",
            "the engine's saturation judge to cross and admission to refuse",
            lambda: next(
                (
                    r
                    for r in self._state()["reactions"]
                    if r["kind"] == "saturation"
                    and r["crossed_at"] >= self.t0
                    and r["first_refusal_at"] is not None
                ),
                None,
            ),
            lambda: (
                f"{self._saturation_signal()}; {load.sent} requests sent, "
                f"outcomes {dict(self.outcomes.counts)}"
            ),
        )
        self._mark(
            "saturated", f"{reaction['signal']} = {reaction['value']}", reaction["crossed_at"]
        )
        self._mark(
            "local reflex",
            f"first refusal: {reaction['first_refusal']} after {reaction['reaction_s']}s",
            reaction["first_refusal_at"],
        )
        pending = self._wait(
            "alert pending",
            f"{'/'.join(SATURATION_ALERTS)} pending in Prometheus",
            lambda: self._prometheus_alert("pending") or self._prometheus_alert("firing"),
            self._saturated_signal,
        )
        self._mark(
            "alert pending",
            pending["labels"]["alertname"],
            _parse_time(pending.get("activeAt", "")),
        )
        firing = self._wait(
            "alert firing",
            f"{'/'.join(SATURATION_ALERTS)} firing in Prometheus",
            lambda: self._prometheus_alert("firing"),
            lambda: f"{self._saturated_signal()}; {self._alert_states()}",
        )
        self._mark("alert firing", firing["labels"]["alertname"], self._firing_since(firing))
        in_am = self._wait(
            "alertmanager",
            "the firing alert in Alertmanager",
            lambda: next(
                (
                    a
                    for a in self._alertmanager_alerts()
                    if a["labels"].get("alertname") in SATURATION_ALERTS
                ),
                None,
            ),
            lambda: (
                "Alertmanager holds "
                f"{[a['labels'].get('alertname') for a in self._alertmanager_alerts()]}"
            ),
        )
        self._mark(
            "alertmanager",
            f"{in_am['labels']['alertname']} received",
            _parse_time(in_am.get("updatedAt", "")),
        )
        lease = self._wait(
            "webhook lease",
            "a lease from Alertmanager's webhook on the engine",
            lambda: next(
                (x for x in self._state()["leases"] if x["source"] == "alertmanager"), None
            ),
            lambda: (
                f"engine leases {[(x['source'], x['action']) for x in self._state()['leases']]}"
            ),
        )
        # Seen, not stamped: a lease's started_at is the alert's own start, not the lease's.
        self._mark("webhook lease active", f"{lease['action']} from {lease['alertname']}")
        page = self._wait(
            "page",
            f"a page of {'/'.join(SATURATION_ALERTS)} (critical) at the pager",
            lambda: next(
                (
                    p
                    for p in self.stack.pages()
                    if p.get("status") == "firing"
                    and any(a["labels"].get("alertname") in SATURATION_ALERTS for a in p["alerts"])
                ),
                None,
            ),
            self._refused_signal,
        )
        paged = sorted({a["labels"].get("alertname", "") for a in page["alerts"]})
        self._mark(
            "page recorded",
            f"{', '.join(paged)}: {self._prometheus_value(rec.REJECTED_RATIO)} of requests "
            f"refused over 5 min (threshold {self.threshold:g})",
            page.get("received_at"),
        )
        checks["page reached the pager"] = True
        checks["the lease shed low-priority requests"] = bool(
            self._wait(
                "shed",
                "a low-priority request shed by the lease",
                lambda: self.outcomes.by_reason["shed_low_priority"] > 0 or None,
                lambda: f"refusals by reason {dict(self.outcomes.by_reason)}",
                timeout_s=30,
            )
        )
        checks["inhibition held"] = self._check_inhibition()

    def _check_inhibition(self) -> bool:
        """A warning twin of the firing critical alert (same alertname and instance) must be
        suppressed by Alertmanager and never reach a receiver."""
        firing = [
            a
            for a in self._alertmanager_alerts()
            if a["labels"].get("severity") == "critical"
            and a["labels"].get("alertname") in SATURATION_ALERTS
        ]
        if not firing:
            return False
        critical = firing[0]["labels"]
        twin = {k: v for k, v in critical.items() if k in ("alertname", "instance", "job")}
        twin.update({"severity": "warning", "warden_scenario": "inhibition-probe"})
        httpx.post(
            f"{self.stack.alertmanager_url}/api/v2/alerts",
            timeout=10,
            json=[{"labels": twin, "annotations": {"summary": "inhibition probe"}}],
        )
        probe = self._wait(
            "inhibition",
            "the inhibition probe in Alertmanager",
            lambda: next(
                (
                    a
                    for a in self._alertmanager_alerts()
                    if a["labels"].get("warden_scenario") == "inhibition-probe"
                ),
                None,
            ),
            lambda: f"Alertmanager holds {len(self._alertmanager_alerts())} alerts",
            timeout_s=30,
        )
        suppressed = probe["status"]["state"] == "suppressed" and bool(
            probe["status"]["inhibitedBy"]
        )
        ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        httpx.post(
            f"{self.stack.alertmanager_url}/api/v2/alerts",
            timeout=10,
            json=[
                {"labels": twin, "annotations": {"summary": "inhibition probe"}, "endsAt": ended}
            ],
        )
        self._mark("inhibition", "warning twin suppressed" if suppressed else "NOT suppressed")
        return suppressed


def demo_control_config() -> dict[str, Any]:
    """The control config the demo's engine runs with: the queue limit the overload breaks, the
    saturation hold its 1 s scrapes allow, and loopback trusted to name a request's priority
    (the scenario's clients do)."""
    return {
        "admission": {
            "saturation": {
                "max_queue_depth": DEMO_MAX_QUEUE_DEPTH,
                "hold_s": DEMO_SATURATION_HOLD_S,
            },
            "priority": {"trusted_networks": ["127.0.0.1/32"]},
        }
    }


def metric_names_seen(stack: NativeStack) -> set[str]:
    """Warden metric names Prometheus has scraped from the engine over the run (for the demo's
    summary). Its series, not an instant query: read right after the second act's restart,
    before the new engine's first scrape, the old engine's samples were stale and an
    instant query counted 0 (2 of 8 demos on 2026-11-29)."""
    found = stack.series('{__name__=~"warden_.+"}')
    return {labels["__name__"] for labels in found} & {m.name for m in catalog.ALL}
