"""The closed loop, end to end, on a running stack: the scenario ``warden demo`` shows and the
end-to-end test asserts.

pressure -> watermark high -> local reflex -> alert pending -> firing in Prometheus ->
Alertmanager -> webhook -> lease active -> page recorded -> pressure removed -> resolved ->
normal. Every step is observed from outside, through the same HTTP APIs an operator would use,
and stamped with the time since pressure started. Request outcomes are tallied: each request
must finish, or be refused with 503/429 and Retry-After; anything else counts as lost.
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
from alerts.rules import MEMORY
from exporter import catalog
from warden.common.waiting import wait_until
from warden.stack.native import NativeStack, StackError

# The memory alerts, named by the rule definitions themselves (never retyped).
MEMORY_ALERTS = tuple(rule.name for rule in MEMORY.rules if isinstance(rule, AlertRule))
REFLEX_REASONS = ("stop_admission", "reject_all", "shed_low_priority", "kv_headroom")


class ScenarioError(RuntimeError):
    pass


@dataclass
class Step:
    name: str
    at: float  # seconds since pressure started
    detail: str = ""


@dataclass
class Outcomes:
    """What every pressure request ended as."""

    counts: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, problem: str | None = None) -> None:
        with self.lock:
            self.counts[kind] += 1
            if problem is not None:
                self.lost.append(problem)


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
        lines = ["closed-loop timeline (seconds since pressure started):"]
        previous = 0.0
        for step in self.timeline:
            lines.append(
                f"  {step.at:7.1f}s  (+{step.at - previous:5.1f}s)  {step.name:<26} {step.detail}"
            )
            previous = step.at
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.outcomes.counts.items()))
        lines.append(f"request outcomes: {counts}; lost: {len(self.outcomes.lost)}")
        for problem in self.outcomes.lost[:5]:
            lines.append(f"  lost: {problem}")
        lines.append("intervals: " + ", ".join(f"{k} {v}" for k, v in self.intervals.items()))
        for name, ok in self.checks.items():
            lines.append(f"  [{'ok' if ok else 'FAILED'}] {name}")
        return "\n".join(lines)


class Pressure:
    """Concurrent clients sending long prompts in a loop until stopped (bounded in time)."""

    def __init__(
        self,
        engine_url: str,
        model: str,
        outcomes: Outcomes,
        clients: int = 8,
        max_duration_s: float = 600.0,
    ) -> None:
        self.engine_url = engine_url
        self.model = model
        self.outcomes = outcomes
        self.clients = clients
        self.max_duration_s = max_duration_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _client(self) -> None:
        prompt = " ".join(["memory watermark cache block engine request"] * 10)
        deadline = time.monotonic() + self.max_duration_s
        # A new connection per request: a kept-alive one that sat idle past the server's
        # keep-alive timeout (a client thread starved by the engine for seconds) can be closed
        # by the server just as the next request goes out. That is a client pooling race, not a
        # request the server dropped, and must not count as lost.
        fresh = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=self.engine_url, timeout=60, limits=fresh) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                body = {
                    "model": self.model,
                    "prompt": prompt,
                    "max_tokens": 120,
                    "ignore_eos": True,
                }
                try:
                    response = client.post("/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    self.outcomes.add("lost", f"{type(exc).__name__}: {exc}")
                    continue
                self._judge(response)
                if response.status_code != 200:
                    self._stop.wait(0.05)

    def _judge(self, response: httpx.Response) -> None:
        status = response.status_code
        if status == 200:
            try:
                finish = response.json()["choices"][0]["finish_reason"]
            except (ValueError, KeyError, IndexError):
                finish = None
            if finish in ("length", "stop"):
                self.outcomes.add("completed")
            else:
                self.outcomes.add("lost", f"200 without a finished choice: {response.text[:120]}")
        elif status in (429, 503) and response.headers.get("retry-after"):
            self.outcomes.add(f"refused_{status}")
        else:
            self.outcomes.add("lost", f"{status}: {response.text[:120]}")

    def start(self) -> None:
        for index in range(self.clients):
            thread = threading.Thread(target=self._client, name=f"pressure-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=70)


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
            if alert["labels"].get("alertname") in MEMORY_ALERTS and alert["state"] == state:
                return alert
        return None

    def _alertmanager_alerts(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.stack.alertmanager_url}/api/v2/alerts", timeout=10)
        return list(response.json())

    # --- the scenario -----------------------------------------------------------------

    def run(self, clients: int = 8) -> ScenarioResult:
        stack = self.stack
        assert stack.model is not None, "the scenario drives the engine's served model"
        outcomes = Outcomes()
        checks: dict[str, bool] = {}
        pressure = Pressure(stack.engine_url, stack.model, outcomes, clients)
        self.t0 = time.time()
        self.out("closed-loop scenario: pressure on")
        pressure.start()
        self._mark("pressure", f"{clients} clients, long prompts, ignore_eos")
        try:
            crossing = self._wait(
                "watermark above normal",
                lambda: next(
                    (
                        t
                        for t in self._state()["watermark_transitions"]
                        if t["at"] >= self.t0 and t["level"] != "normal"
                    ),
                    None,
                ),
            )
            self._mark("watermark high", f"entered {crossing['level']}", at=crossing["at"])
            reflex = self._wait(
                "a reflex rejection",
                lambda: next(
                    (
                        r
                        for r in self._state()["recent_rejections"]
                        if r["at"] >= self.t0 and r["reason"] in REFLEX_REASONS
                    ),
                    None,
                ),
            )
            self._mark("local reflex", f"first refusal: {reflex['reason']}", at=reflex["at"])
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
                        if a["labels"].get("alertname") in MEMORY_ALERTS
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
                lambda: next((p for p in stack.pages() if p.get("status") == "firing"), None),
            )
            paged = sorted({a["labels"].get("alertname", "") for a in page["alerts"]})
            self._mark("page recorded", ", ".join(paged))
            checks["page reached the pager"] = True
            checks["inhibition held"] = self._check_inhibition()
        finally:
            pressure.stop()
        self._mark("pressure removed")
        self._wait(
            "leases released",
            lambda: not any(x["source"] == "alertmanager" for x in self._state()["leases"]),
            timeout_s=self.step_timeout_s + 120,
        )
        self._mark("resolved", "Alertmanager's resolved notification released the lease")
        self._wait(
            "engine back to normal",
            lambda: (
                self._state()["watermark"] == "normal"
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
        checks["zero requests lost"] = not outcomes.lost
        checks["some requests completed and some were refused"] = (
            outcomes.counts["completed"] > 0
            and outcomes.counts["refused_503"] + outcomes.counts["refused_429"] > 0
        )
        intervals = {
            "scrape": stack.settings.intervals.scrape,
            "evaluation": stack.settings.intervals.evaluation,
        }
        return ScenarioResult(self.timeline, outcomes, checks, intervals)

    def _check_inhibition(self) -> bool:
        """A warning twin of the firing critical alert (same alertname and instance) must be
        suppressed by Alertmanager and never reach a receiver."""
        firing = [
            a
            for a in self._alertmanager_alerts()
            if a["labels"].get("severity") == "critical"
            and a["labels"].get("alertname") in MEMORY_ALERTS
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


def metric_names_seen(stack: NativeStack) -> set[str]:
    """Warden metric names Prometheus has scraped from the engine (for the demo's summary)."""
    result = stack.query('{__name__=~"warden_.+"}')
    return {sample["metric"]["__name__"] for sample in result} & {m.name for m in catalog.ALL}
