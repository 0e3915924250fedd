"""The memory creep, played on a live stack: injected, seen, paged, drained restart before the
limit, served again.

``CreepScenario`` drives a ``NativeStack`` whose engine runs with the creep test switch
(``WARDEN_TEST_MEMORY_CREEP=1``, exporter/memory_creep.py) and a host memory limit it can reach
(a cgroup's, or one declared with ``WARDEN_HOST_MEMORY_HEADROOM_BYTES``). Steady traffic runs
throughout. ``quiet`` watches the engine without a creep and records any memory action (there
must be none); ``run`` sets the creep to reach the limit in ``reach_limit_s`` and records each
step of the answer with its time since the injection:

    creep injected      rate, limit, the time the limit would be reached
    risk climbing       the host risk in Prometheus
    alert firing        WardenTimeToOOM (horizon 10m) with its estimate of the time left
    page recorded       the pager got WardenTimeToOOM
    watermark high / watermark critical   the engine's transitions, deciding signal host
    local reflex        the policy change after the critical crossing, and its delay
    draining            the supervisor decided the memory restart and drains the engine
    restarted           the engine stopped and a new one starts: reason memory, with its cause
    served again        a request answered 200 by the new engine

Two chains must each be in order (``CHAINS``): the alert path (risk, alert, page, before the
drain) and the engine path (risk, watermark, reflex, drain, restart, served again). Between
them there is no order to demand: the fast time-to-OOM rule reads the rate, so on a creep that
fills the headroom in about a minute it pages before the watermark even reaches ``high``.

The engine's own record (its watermark transitions, the reflex's policy changes, on
``GET /warden/state``) lives in the engine and goes with it at the restart. ``EngineRecord``
reads it every ``RECORD_EVERY_S`` on a thread of its own and keeps what it saw, so the steps
between the critical crossing and the drain's restart (a second or two) are seen however slowly
the main look at Prometheus, the pager and the supervisor goes round on a loaded machine.

Requests are counted by warden/common/outcomes.py: completed, refused (503/429 with
Retry-After), failed. The clients sit behind a balancer that routes to ready engines only, as
production traffic does: while the supervisor has the engine out of rotation (draining,
restarting, starting: readiness is false from the drain's first moment) they hold their next
request (counted apart as ``unreachable``, never sent, never failed). Without a balancer, a
client reusing a keep-alive connection while the engine shuts down can meet a reset: HTTP
servers close idle connections on shutdown.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from alerts.recording import MEMORY_RISK_MAX
from alerts.rules import FAST_HORIZON
from exporter import catalog
from warden.common.metrics_text import sum_samples
from warden.common.outcomes import COMPLETED, FAILED, OutcomeTally, classify
from warden.stack import chaos
from warden.stack.native import NativeStack

Out = Callable[[str], None]
TIME_TO_OOM = "WardenTimeToOOM"
PROMPT = "memory creeps until the engine is restarted before the limit"
# Phases in which the supervisor has the engine out of rotation (exporter.supervisor_state).
OUT_OF_ROTATION = frozenset({"draining", "restarting", "starting", "backoff"})
RECORD_EVERY_S = 0.2  # how often EngineRecord reads the engine's own record
STEPS = (
    "creep injected",
    "risk climbing",
    "alert firing",
    "page recorded",
    "watermark high",
    "watermark critical",
    "local reflex",
    "draining",
    "restarted",
    "served again",
)
# The orders the design guarantees. The reflex (the watermark reaching critical, in the engine's
# step) and the supervisor's drain (polling the same risk every 2 s) both act at risk 0.9, each on
# its own: either may come first, so neither chain orders one after the other. The drain comes
# after the watermark is high (0.8): the risk reaches 0.9 only after it passed 0.8.
CHAINS = (
    ("creep injected", "risk climbing", "alert firing", "page recorded", "draining"),
    ("creep injected", "risk climbing", "watermark high", "watermark critical", "local reflex"),
    ("watermark high", "draining", "restarted", "served again"),
)


@dataclass
class Step:
    name: str
    at: float  # seconds since the creep was injected
    detail: str = ""


@dataclass
class CreepResult:
    steps: list[Step] = field(default_factory=list)
    outcomes: OutcomeTally = field(default_factory=OutcomeTally)
    unreachable: int = 0
    limit_bytes: float = 0.0
    peak_used_bytes: float = 0.0
    limit_at: float = 0.0  # seconds after the injection at which the creep reaches the limit
    estimate_s: float | None = None  # WardenTimeToOOM's value when it fired
    estimate_left_s: float | None = None  # the real time left then
    reflex_delay_s: float | None = None
    restart: dict[str, Any] | None = None
    restart_risk_after: dict[str, float] = field(default_factory=dict)
    # (seconds since the injection, host risk, WardenTimeToOOM's estimate of the time left)
    # at each look until the restart: the timeline of the risk and the estimate as they moved.
    trace: list[tuple[float, float | None, float | None]] = field(default_factory=list)

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def add(self, name: str, at: float, detail: str = "") -> bool:
        if self.step(name) is not None:
            return False
        self.steps.append(Step(name, at, detail))
        return True

    @property
    def in_order(self) -> bool:
        """Each chain of steps happened in its order (missing steps are checked apart)."""
        for chain in CHAINS:
            times = [s.at for name in chain if (s := self.step(name)) is not None]
            if any(a > b for a, b in zip(times, times[1:], strict=False)):
                return False
        return True

    @property
    def passed(self) -> bool:
        return (
            all(self.step(name) is not None for name in STEPS)
            and self.in_order
            and self.outcomes.counts[FAILED] == 0
            and 0 < self.peak_used_bytes < self.limit_bytes
        )

    def report(self) -> str:
        lines = [f"{s.at:7.1f}s  {s.name:<20} {s.detail}" for s in self.steps]
        lines.append(
            f"request outcomes: {self.outcomes.line()}; held back while out of rotation: "
            f"{self.unreachable}"
        )
        lines.append(
            f"host memory peak {self.peak_used_bytes / 1e9:.2f} GB of a "
            f"{self.limit_bytes / 1e9:.2f} GB limit (reached at {self.limit_at:.0f}s at the "
            "creep's rate)"
        )
        for failure in self.outcomes.failures[:5]:
            lines.append(f"failed: {failure}")
        return "\n".join(lines)


class SteadyTraffic:
    """A few clients sending short completions one after another, honouring Retry-After."""

    def __init__(self, stack: NativeStack, model: str, clients: int = 2) -> None:
        self.stack = stack
        self.model = model
        self.clients = clients
        self.outcomes = OutcomeTally()
        self.unreachable = 0
        self.completed_after: float | None = None  # first completion after this time
        self.completed_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._in_rotation = threading.Event()
        self._in_rotation.set()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> SteadyTraffic:
        balancer = threading.Thread(target=self._balancer, daemon=True)
        balancer.start()
        self._threads.append(balancer)
        for index in range(self.clients):
            thread = threading.Thread(target=self._client, args=(index,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(150)

    def _out_of_rotation(self) -> bool:
        url = self.stack.supervisor_url
        if url is None:
            return False
        with contextlib.suppress(httpx.HTTPError, ValueError):
            state = httpx.get(f"{url}/supervisor/state", timeout=5).json()
            return str(state.get("phase")) in OUT_OF_ROTATION or not state.get("engine_ready")
        return False

    def _balancer(self) -> None:
        """Readiness as a balancer sees it, every 0.25 s."""
        while not self._stop.is_set():
            if self._out_of_rotation():
                self._in_rotation.clear()
            else:
                self._in_rotation.set()
            self._stop.wait(0.25)

    def _client(self, index: int) -> None:
        body = {"model": self.model, "prompt": f"{index} {PROMPT}", "max_tokens": 16}
        url = f"{self.stack.engine_url}/v1/completions"
        with httpx.Client(timeout=120.0) as client:
            while not self._stop.is_set():
                if not self._in_rotation.is_set():
                    with self._lock:
                        self.unreachable += 1
                    self._in_rotation.wait(0.5)
                    continue
                try:
                    response = client.post(url, json=body)
                except httpx.ConnectError as exc:
                    if self._out_of_rotation():
                        with self._lock:
                            self.unreachable += 1
                        self._stop.wait(0.5)
                        continue
                    self._record(FAILED, f"{type(exc).__name__}: {exc}")
                    continue
                except httpx.HTTPError as exc:
                    self._record(FAILED, f"{type(exc).__name__}: {exc}")
                    continue
                outcome = classify(response.status_code, response.headers, response.content)
                self._record(outcome, f"HTTP {response.status_code}: {response.text[:160]}")
                if outcome != COMPLETED:
                    retry_after = float(response.headers.get("retry-after") or 1)
                    self._stop.wait(min(max(retry_after, 0.2), 2.0))
                else:
                    self._stop.wait(0.2)

    def _record(self, outcome: str, detail: str) -> None:
        now = time.time()
        with self._lock:
            self.outcomes.add(outcome, detail)
            after = self.completed_after
            if outcome == COMPLETED and after is not None and now > after:
                self.completed_at = self.completed_at or now


class EngineRecord:
    """The engine's watermark transitions and policy changes, read every ``every_s`` on a thread
    of its own and kept (the engine forgets them at its restart): each entry once, by its time."""

    def __init__(self, engine_url: str, every_s: float = RECORD_EVERY_S) -> None:
        self.engine_url = engine_url
        self.every_s = every_s
        self._transitions: dict[tuple[float, str], dict[str, Any]] = {}
        self._policy_changes: dict[float, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> EngineRecord:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Keep what was seen; read no more (the engine after a restart is another one)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _watch(self) -> None:
        with httpx.Client(timeout=max(1.0, 4 * self.every_s)) as client:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    response = client.get(f"{self.engine_url}/warden/state")
                    if response.status_code == 200:
                        self._keep(response.json())
                self._stop.wait(self.every_s)

    def _keep(self, state: Any) -> None:
        if not isinstance(state, dict) or self._stop.is_set():
            return
        with self._lock:
            for change in state.get("watermark_transitions", []):
                self._transitions[(change["at"], str(change.get("level")))] = change
            for change in state.get("policy_changes", []):
                self._policy_changes[change["at"]] = change

    def transitions(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted(self._transitions.values(), key=lambda c: c["at"])

    def policy_changes(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted(self._policy_changes.values(), key=lambda c: c["at"])


def host_numbers(engine_url: str) -> tuple[float, float, float] | None:
    """(used, settled, limit) host bytes from the engine's /metrics, None without them."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        text = httpx.get(f"{engine_url}/metrics", timeout=5).text
        used = sum_samples(text, catalog.HOST_MEMORY_USED.name)
        planned = sum_samples(text, catalog.HOST_MEMORY_PLANNED.name)
        limit = sum_samples(text, catalog.HOST_MEMORY_LIMIT.name)
        if used and planned and limit:
            return used, planned, limit
    return None


def _get_json(url: str) -> Any:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = httpx.get(url, timeout=5)
        if response.status_code == 200:
            return response.json()
    return None


class CreepScenario:
    def __init__(
        self,
        stack: NativeStack,
        out: Out = print,
        reach_limit_s: float = 80.0,
        clients: int = 2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.stack = stack
        self.out = out
        self.reach_limit_s = reach_limit_s
        self.clients = clients
        self.clock = clock

    def _model(self) -> str:
        with httpx.Client(timeout=30) as client:
            return chaos.served_model(self.stack.engine_url, client).name

    def _supervisor(self) -> dict[str, Any]:
        url = self.stack.supervisor_url
        state = _get_json(f"{url}/supervisor/state") if url else None
        return state if isinstance(state, dict) else {}

    def quiet(self, seconds: float) -> dict[str, Any]:
        """Steady traffic for ``seconds`` without a creep; what warden did about memory (all
        of it must be nothing): restarts, watermark transitions, memory alerts, the worst host
        risk Prometheus saw, and the request outcomes."""
        before = self._supervisor().get("restart_totals", {})
        with SteadyTraffic(self.stack, self._model(), self.clients) as traffic:
            time.sleep(seconds)
        state = _get_json(f"{self.stack.engine_url}/warden/state") or {}
        worst = self.stack.query(
            f'max_over_time({MEMORY_RISK_MAX}{{source="host"}}[{seconds:.0f}s])'
        )
        memory_alerts = [
            a
            for a in self.stack.alerts()
            if a["labels"]
            .get("alertname", "")
            .startswith(("WardenMemory", "WardenOOM", TIME_TO_OOM))
        ]
        return {
            "restarts": {
                k: v - before.get(k, 0)
                for k, v in self._supervisor().get("restart_totals", {}).items()
                if v != before.get(k, 0)
            },
            "watermark_transitions": state.get("watermark_transitions", []),
            "memory_leases": [
                lease for lease in state.get("leases", []) if lease.get("source") == "reflex"
            ],
            "memory_alerts": memory_alerts,
            "worst_host_risk": max((float(r["value"][1]) for r in worst), default=None),
            "outcomes": traffic.outcomes,
            "unreachable": traffic.unreachable,
        }

    def run(self, timeout_s: float = 300.0) -> CreepResult:
        result = CreepResult()
        numbers = host_numbers(self.stack.engine_url)
        if numbers is None:
            raise RuntimeError("the engine exports no host memory (warden_host_memory_*)")
        used, _planned, limit = numbers
        rate_mb_s = (limit - used) / self.reach_limit_s / 1e6
        generation = int(self._supervisor().get("generation", 0))
        restarts_before = int(self._supervisor().get("restart_totals", {}).get("memory", 0))
        result.limit_bytes, result.peak_used_bytes = limit, used
        with (
            SteadyTraffic(self.stack, self._model(), self.clients) as traffic,
            EngineRecord(self.stack.engine_url) as record,
        ):
            time.sleep(2.0)  # traffic flowing before the creep
            chaos.creep(self.stack.engine_url, rate_mb_s, out=self.out)
            t0 = self.clock()
            result.limit_at = self.reach_limit_s
            result.add(
                "creep injected",
                0.0,
                f"{rate_mb_s:.1f} MB/s, {(limit - used) / 1e9:.2f} GB from a "
                f"{limit / 1e9:.2f} GB limit: reached in {self.reach_limit_s:.0f}s",
            )
            deadline = t0 + timeout_s
            while self.clock() < deadline:
                self._observe(result, traffic, record, t0, generation, restarts_before)
                if result.step("served again") is not None:
                    break
                time.sleep(0.5)
        result.outcomes = traffic.outcomes
        result.unreachable = traffic.unreachable
        result.steps.sort(key=lambda s: s.at)
        return result

    def _observe(
        self,
        result: CreepResult,
        traffic: SteadyTraffic,
        record: EngineRecord,
        t0: float,
        generation: int,
        restarts_before: int,
    ) -> None:
        now = self.clock()
        t = now - t0
        restarted = result.step("restarted") is not None
        if not restarted:
            numbers = host_numbers(self.stack.engine_url)
            if numbers is not None:
                result.peak_used_bytes = max(result.peak_used_bytes, numbers[0])
            self._engine_steps(result, record, t0)
        host_risk: float | None = None
        estimate: float | None = None
        with contextlib.suppress(Exception):
            risk = self.stack.query(f'{MEMORY_RISK_MAX}{{source="host"}}')
            if risk:
                host_risk = float(risk[0]["value"][1])
            if host_risk is not None and host_risk > 0.1:
                result.add("risk climbing", t, f"host risk {host_risk:.2f}")
        with contextlib.suppress(Exception):
            for alert in self.stack.alerts():
                labels = alert["labels"]
                if labels.get("alertname") != TIME_TO_OOM or labels.get("horizon") != FAST_HORIZON:
                    continue
                estimate = float(alert["value"])
                if alert.get("state") == "firing" and result.add("alert firing", t):
                    result.estimate_s = estimate
                    result.estimate_left_s = result.limit_at - t
                    result.step("alert firing").detail = (  # type: ignore[union-attr]
                        f"{TIME_TO_OOM} (critical, {labels.get('source')}): {estimate:.0f}s left "
                        f"by its estimate, {result.limit_at - t:.0f}s at the creep's rate"
                    )
        if not restarted:
            result.trace.append((round(t, 1), host_risk, estimate))
        for page in self.stack.pages():
            for alert in page.get("alerts", []):
                if alert.get("labels", {}).get("alertname") == TIME_TO_OOM:
                    result.add("page recorded", t, f"{TIME_TO_OOM} [critical]")
        state = self._supervisor()
        if state.get("phase") == "draining":
            result.add("draining", t, "admission stopped, in-flight requests finishing")
        if int(state.get("restart_totals", {}).get("memory", 0)) > restarts_before:
            event = next(
                (e for e in reversed(state.get("restarts", [])) if e.get("reason") == "memory"),
                None,
            )
            if event is not None and result.add(
                "restarted",
                event["restarted_at"] - t0,
                f"reason memory: {event.get('detail', '')}",
            ):
                record.stop()  # what the old engine recorded is kept; the new one is not it
                self._engine_steps(result, record, t0)
                result.restart = event
                draining = result.step("draining")
                if draining is None or draining.at > event["failed_at"] - t0:
                    result.steps = [s for s in result.steps if s.name != "draining"]
                    result.add(
                        "draining", event["failed_at"] - t0, "admission stopped by the drain lease"
                    )
                traffic.completed_after = now
        if (
            restarted
            and state.get("engine_ready")
            and int(state.get("generation", 0)) > generation
            and traffic.completed_at is not None
        ):
            result.restart_risk_after = dict(state.get("memory_restart_risk", {}))
            result.add("served again", traffic.completed_at - t0, "a request answered 200")

    def _engine_steps(self, result: CreepResult, record: EngineRecord, t0: float) -> None:
        """Watermark crossings and the reflex's policy change, from the engine's own record."""
        for change in record.transitions():
            if change.get("signal") == "host" and change.get("level") in ("high", "critical"):
                result.add(
                    f"watermark {change['level']}",
                    change["at"] - t0,
                    f"host risk {change.get('value', 0):.3f}",
                )
        critical = result.step("watermark critical")
        if critical is None or result.step("local reflex") is not None:
            return
        crossed = critical.at + t0
        for change in record.policy_changes():
            if change["at"] >= crossed - 1e-3 and "stop_admission" in change.get("active", []):
                result.reflex_delay_s = max(0.0, change["at"] - crossed)
                result.add(
                    "local reflex",
                    change["at"] - t0,
                    f"{', '.join(change['active'])} {result.reflex_delay_s * 1000:.0f} ms after "
                    "the crossing",
                )
                return
