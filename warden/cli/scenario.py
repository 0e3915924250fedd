"""The closed loop, end to end, on a running stack: the scenario ``warden demo`` shows and the
end-to-end test asserts.

overload -> saturated -> local reflex (admission refuses within a step) -> WardenSaturated
pending -> firing in Prometheus -> Alertmanager -> webhook lease (shed_low_priority) -> page
(critical: most requests refused) -> overload removed -> resolved -> normal.

Why overload and not memory: a CPU engine's memory does not creep, and the KV cache filling up
is vLLM working as designed (it queues), so neither is an honest memory signal. What the CPU
engine really produces is a queue users wait in: more clients than the tiny engine can serve
(``--max-num-seqs 8`` and a 12-block KV cache) against the stack's limit of
``DEMO_MAX_QUEUE_DEPTH`` waiting requests (``admission.saturation.max_queue_depth``, set by the
demo's control config). A queue-depth limit, unlike a latency SLO, does not depend on how fast
two busy cores happen to be, so the loop runs the same on every machine.

Every step is observed from outside, through the same HTTP APIs an operator would use, and
stamped with the time since the overload started. Request outcomes are counted with the one
rule (warden/common/outcomes.py): completed, refused (429/503 with Retry-After), failed; the
scenario requires failed = 0.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from alerts.model import AlertRule
from alerts.rules import TRAFFIC
from exporter import catalog
from warden.common.outcomes import COMPLETED, FAILED, REFUSED, OutcomeTally, classify
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
# Requests the overload's clients send: waiting beyond this many refuses (the demo's config).
DEMO_MAX_QUEUE_DEPTH = 4
# Clients: important ones (priority 0, kept while low priority is shed) and batch ones.
IMPORTANT_CLIENTS, BATCH_CLIENTS = 8, 4
IMPORTANT_PRIORITY, BATCH_PRIORITY = 0, 5


class ScenarioError(RuntimeError):
    pass


@dataclass
class Step:
    name: str
    at: float  # seconds since the overload started
    detail: str = ""


@dataclass
class Outcomes:
    """What every overload request ended as (warden/common/outcomes.py), thread-safe."""

    tally: OutcomeTally = field(default_factory=OutcomeTally)
    by_reason: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str, detail: str = "", reason: str = "") -> None:
        with self.lock:
            self.tally.add(outcome, detail)
            if outcome == REFUSED:
                self.by_reason[reason or "unnamed"] += 1

    @property
    def counts(self) -> Counter[str]:
        return self.tally.counts

    @property
    def failed(self) -> list[str]:
        return self.tally.failures


@dataclass
class ScenarioResult:
    timeline: list[Step]
    outcomes: Outcomes
    checks: dict[str, bool]
    intervals: dict[str, str]

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def step(self, name: str) -> Step:
        return next(s for s in self.timeline if s.name == name)

    def report(self) -> str:
        lines = ["closed-loop timeline (seconds since the overload started):"]
        previous = 0.0
        for step in self.timeline:
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


class Pressure:
    """Concurrent clients sending requests in a loop until stopped (bounded in time). Impatient
    ones: a refused client tries again after 50 ms instead of its Retry-After, the retry storm
    an overloaded service sees. ``priorities``: one client per entry, sent as the request's
    priority header (the demo's config trusts loopback to name one)."""

    def __init__(
        self,
        engine_url: str,
        model: str,
        outcomes: Outcomes,
        priorities: list[int],
        max_duration_s: float = 600.0,
        priority_header: str = "X-Request-Priority",
    ) -> None:
        self.engine_url = engine_url
        self.model = model
        self.outcomes = outcomes
        self.priorities = priorities
        self.max_duration_s = max_duration_s
        self.priority_header = priority_header
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _client(self, priority: int) -> None:
        prompt = " ".join(["the engine queue keeps growing under load"] * 6)
        deadline = time.monotonic() + self.max_duration_s
        # A new connection per request: a kept-alive one that sat idle past the server's
        # keep-alive timeout (a client thread starved by the engine for seconds) can be closed
        # by the server just as the next request goes out. That is a client pooling race, not a
        # request the server dropped, and must not count as failed.
        fresh = httpx.Limits(max_keepalive_connections=0)
        headers = {self.priority_header: str(priority)}
        with httpx.Client(
            base_url=self.engine_url, timeout=120, limits=fresh, headers=headers
        ) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                body = {"model": self.model, "prompt": prompt, "max_tokens": 48, "ignore_eos": True}
                try:
                    response = client.post("/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    self.outcomes.add(FAILED, f"{type(exc).__name__}: {exc}")
                    continue
                self._judge(response)
                if response.status_code != 200:
                    self._stop.wait(0.05)

    def _judge(self, response: httpx.Response) -> None:
        outcome = classify(response.status_code, dict(response.headers), response.content)
        if outcome == COMPLETED:
            try:
                finish = response.json()["choices"][0]["finish_reason"]
            except (ValueError, KeyError, IndexError, TypeError):
                finish = None
            if finish not in ("length", "stop"):
                outcome = FAILED
        reason = ""
        if outcome == REFUSED:
            try:
                reason = str(response.json()["error"]["warden_reason"])
            except (ValueError, KeyError, TypeError):
                reason = ""
        detail = f"{response.status_code}: {response.text[:120]}" if outcome == FAILED else ""
        self.outcomes.add(outcome, detail, reason)

    def start(self) -> None:
        for index, priority in enumerate(self.priorities):
            thread = threading.Thread(
                target=self._client, args=(priority,), name=f"pressure-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=130)


class ClosedLoopScenario:
    def __init__(
        self, stack: NativeStack, out: Callable[[str], None] = print, step_timeout_s: float = 240.0
    ) -> None:
        self.stack = stack
        self.out = out
        self.step_timeout_s = step_timeout_s
        self.timeline: list[Step] = []
        self.t0 = 0.0

    # --- observation helpers ----------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return httpx.get(f"{self.stack.engine_url}/warden/state", timeout=10).json()

    def _mark(self, name: str, detail: str = "", at: float | None = None) -> Step:
        step = Step(name, (at if at is not None else time.time()) - self.t0, detail)
        self.timeline.append(step)
        self.out(f"  {step.at:7.1f}s  {name:<26} {detail}")
        return step

    def _wait(self, what: str, probe: Callable[[], Any], timeout_s: float | None = None) -> Any:
        def found() -> Any:
            try:
                return probe()
            except (httpx.HTTPError, ValueError, KeyError, StackError):
                return None  # not answering yet: keep waiting

        try:
            return wait_until(found, timeout_s or self.step_timeout_s, 0.25, what=what)
        except TimeoutError:
            raise ScenarioError(f"timed out waiting for: {what}") from None

    def _prometheus_alert(self, state: str) -> dict[str, Any] | None:
        for alert in self.stack.alerts():
            if alert["labels"].get("alertname") in SATURATION_ALERTS and alert["state"] == state:
                return alert
        return None

    def _alertmanager_alerts(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.stack.alertmanager_url}/api/v2/alerts", timeout=10)
        return list(response.json())

    # --- the scenario -----------------------------------------------------------------

    def run(self) -> ScenarioResult:
        stack = self.stack
        assert stack.model is not None, "the scenario drives the engine's served model"
        outcomes = Outcomes()
        checks: dict[str, bool] = {}
        priorities = [IMPORTANT_PRIORITY] * IMPORTANT_CLIENTS + [BATCH_PRIORITY] * BATCH_CLIENTS
        pressure = Pressure(stack.engine_url, stack.model, outcomes, priorities)
        self.t0 = time.time()
        self.out("closed-loop scenario: overload on")
        pressure.start()
        self._mark(
            "overload",
            f"{IMPORTANT_CLIENTS} important + {BATCH_CLIENTS} batch clients, queue limit "
            f"{DEMO_MAX_QUEUE_DEPTH}",
        )
        try:
            reaction = self._wait(
                "saturation and the first refusal after it",
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
            )
            self._mark(
                "saturated",
                f"{reaction['signal']} = {reaction['value']}",
                at=reaction["crossed_at"],
            )
            self._mark(
                "local reflex",
                f"first refusal: {reaction['first_refusal']} after {reaction['reaction_s']}s",
                at=reaction["first_refusal_at"],
            )
            pending = self._wait("alert pending", lambda: self._prometheus_alert("pending"))
            self._mark("alert pending", pending["labels"]["alertname"])
            firing = self._wait("alert firing", lambda: self._prometheus_alert("firing"))
            self._mark("alert firing", firing["labels"]["alertname"])
            in_am = self._wait(
                "alert in Alertmanager",
                lambda: next(
                    (
                        a
                        for a in self._alertmanager_alerts()
                        if a["labels"].get("alertname") in SATURATION_ALERTS
                    ),
                    None,
                ),
            )
            self._mark("alertmanager", f"{in_am['labels']['alertname']} received")
            lease = self._wait(
                "webhook lease",
                lambda: next(
                    (x for x in self._state()["leases"] if x["source"] == "alertmanager"), None
                ),
            )
            self._mark("webhook lease active", f"{lease['action']} from {lease['alertname']}")
            page = self._wait(
                "page",
                lambda: next(
                    (
                        p
                        for p in stack.pages()
                        if p.get("status") == "firing"
                        and any(
                            a["labels"].get("alertname") in SATURATION_ALERTS for a in p["alerts"]
                        )
                    ),
                    None,
                ),
            )
            paged = sorted({a["labels"].get("alertname", "") for a in page["alerts"]})
            self._mark("page recorded", ", ".join(paged))
            checks["page reached the pager"] = True
            checks["the lease shed low-priority requests"] = self._wait(
                "a low-priority request shed by the lease",
                lambda: outcomes.by_reason["shed_low_priority"] > 0 or None,
                timeout_s=30,
            )
            checks["inhibition held"] = self._check_inhibition()
        finally:
            pressure.stop()
        self._mark("overload removed")
        self._wait(
            "leases released",
            lambda: not any(x["source"] == "alertmanager" for x in self._state()["leases"]),
            timeout_s=self.step_timeout_s + 120,
        )
        self._mark("resolved", "Alertmanager's resolved notification released the lease")
        self._wait(
            "engine back to normal",
            lambda: (
                self._state()["saturation"]["state"] == "normal"
                and not self._state()["leases"]
                and self._state()["policy"]["stop_admission"] is False
                and self._state()["policy"]["reject_all"] is False
            ),
        )
        probe = httpx.post(
            f"{stack.engine_url}/v1/completions",
            json={"model": stack.model, "prompt": "hello", "max_tokens": 4},
            timeout=60,
        )
        self._mark("normal", f"new request answered {probe.status_code}")
        checks["engine serves again after resolution"] = probe.status_code == 200
        checks["failed = 0"] = outcomes.counts[FAILED] == 0
        checks["some requests completed and some were refused"] = (
            outcomes.counts[COMPLETED] > 0 and outcomes.counts[REFUSED] > 0
        )
        checks["saturation refusals name their signal"] = outcomes.by_reason["saturated"] > 0
        intervals = {
            "scrape": stack.settings.intervals.scrape,
            "evaluation": stack.settings.intervals.evaluation,
            "alert holds": ", ".join(
                f"{group} at most {cap}s" for group, cap in stack.settings.alert_hold_caps.items()
            )
            or "as generated",
        }
        return ScenarioResult(self.timeline, outcomes, checks, intervals)

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
            "inhibition probe in Alertmanager",
            lambda: next(
                (
                    a
                    for a in self._alertmanager_alerts()
                    if a["labels"].get("warden_scenario") == "inhibition-probe"
                ),
                None,
            ),
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
    """The control config the demo's engine runs with: the queue limit the overload breaks, and
    loopback trusted to name a request's priority (the scenario's clients do)."""
    return {
        "admission": {
            "saturation": {"max_queue_depth": DEMO_MAX_QUEUE_DEPTH},
            "priority": {"trusted_networks": ["127.0.0.1/32"]},
        }
    }


def metric_names_seen(stack: NativeStack) -> set[str]:
    """Warden metric names Prometheus has scraped from the engine (for the demo's summary)."""
    result = stack.query('{__name__=~"warden_.+"}')
    return {sample["metric"]["__name__"] for sample in result} & {m.name for m in catalog.ALL}
