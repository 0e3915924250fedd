"""The demo's load, sized to the engine it runs on: measure, then offer a stated multiple.

How much of a fixed load an engine refuses depends on how fast the machine happens to be: the
same 12 clients were refused 36% of the time on one machine and over half on another, so a page
that needs "most requests refused" fired on one and never on the other. So the demo first
measures what this engine completes per second (``measure_capacity``: a closed loop of one
request per batch slot, so the batch is full and nothing queues), then offers an open-loop load
of ``multiple`` times that (``OpenLoopLoad``: Poisson arrivals, each request sent once, as
independent users do). At most ``1 / multiple`` of the offered requests can complete, whatever
the machine, so at least ``1 - 1 / multiple`` are refused.

Both use one asyncio client in a background thread, a new connection per request (a kept-alive
connection left idle past the server's keep-alive timeout can be closed just as the next request
goes out: a client pooling race, not a request the server dropped), and count every request
with the one rule of warden/common/outcomes.py.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from warden.common.outcomes import COMPLETED, FAILED, REFUSED, OutcomeTally, classify, warden_reason

PRIORITY_HEADER = "X-Request-Priority"
# The most requests one load keeps open at once: a bound on the client, far above what an
# engine with a full batch and a short queue holds (refusals answer at once).
MAX_IN_FLIGHT = 256


@dataclass(frozen=True)
class RequestShape:
    """One completion request: the same for calibration and overload, so the capacity measured
    is the capacity overloaded."""

    prompt: str = " ".join(["the engine queue keeps growing under load"] * 6)
    max_tokens: int = 48

    def body(self, model: str) -> dict[str, object]:
        return {
            "model": model,
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
        }


@dataclass
class Outcomes:
    """What every request ended as, and each refusal's named reason; thread-safe."""

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
        with self.lock:
            return Counter(self.tally.counts)

    @property
    def failed(self) -> list[str]:
        return self.tally.failures

    def refused_share(self) -> float | None:
        counts = self.counts
        total = sum(counts.values())
        return counts[REFUSED] / total if total else None


def judge(response: httpx.Response) -> tuple[str, str, str]:
    """(outcome, failure detail, refusal reason) of one non-streamed completion."""
    outcome = classify(response.status_code, dict(response.headers), response.content)
    if outcome == COMPLETED:
        try:
            finish = response.json()["choices"][0]["finish_reason"]
        except (ValueError, KeyError, IndexError, TypeError):
            finish = None
        if finish not in ("length", "stop"):
            outcome = FAILED
    reason = (warden_reason(response.content) or "") if outcome == REFUSED else ""
    detail = f"{response.status_code}: {response.text[:120]}" if outcome == FAILED else ""
    return outcome, detail, reason


async def _send(
    client: httpx.AsyncClient,
    model: str,
    shape: RequestShape,
    priority: int | None,
    outcomes: Outcomes,
) -> str:
    headers = {PRIORITY_HEADER: str(priority)} if priority is not None else {}
    try:
        response = await client.post("/v1/completions", json=shape.body(model), headers=headers)
    except httpx.HTTPError as exc:
        outcomes.add(FAILED, f"{type(exc).__name__}: {exc}")
        return FAILED
    outcome, detail, reason = judge(response)
    outcomes.add(outcome, detail, reason)
    return outcome


def _client(engine_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=engine_url,
        timeout=120,
        limits=httpx.Limits(max_keepalive_connections=0, max_connections=MAX_IN_FLIGHT),
    )


@dataclass(frozen=True)
class Capacity:
    """What the engine completed per second with its batch full and no queue."""

    concurrency: int
    window_s: float
    completed: int
    refused: int
    failed: int

    @property
    def per_second(self) -> float:
        return self.completed / self.window_s if self.window_s > 0 else 0.0

    def line(self) -> str:
        return (
            f"{self.concurrency} clients, one request each at a time, for {self.window_s:.1f} s: "
            f"{self.completed} completed -> capacity {self.per_second:.1f} requests/s"
        )


def measure_capacity(
    engine_url: str,
    model: str,
    concurrency: int,
    shape: RequestShape = RequestShape(),
    warmup_s: float = 3.0,
    window_s: float = 10.0,
) -> Capacity:
    """Completions per second of ``concurrency`` closed-loop clients (one per batch slot):
    requests that finish in the ``window_s`` after a ``warmup_s`` (the engine's first steps
    are slower) are counted."""

    async def run() -> Capacity:
        outcomes = Outcomes()
        in_window: Counter[str] = Counter()
        start = time.monotonic()
        window_start, window_end = start + warmup_s, start + warmup_s + window_s

        async def one_client(client: httpx.AsyncClient) -> None:
            while time.monotonic() < window_end:
                outcome = await _send(client, model, shape, None, outcomes)
                if window_start <= time.monotonic() <= window_end:
                    in_window[outcome] += 1  # one event loop: no lock needed
                if outcome != COMPLETED:
                    await asyncio.sleep(0.2)

        async with _client(engine_url) as client:
            await asyncio.gather(*(one_client(client) for _ in range(concurrency)))
        return Capacity(
            concurrency, window_s, in_window[COMPLETED], in_window[REFUSED], in_window[FAILED]
        )

    return asyncio.run(run())


class OpenLoopLoad:
    """Requests arriving at ``rate`` per second (Poisson, seeded), each sent once, until
    stopped or ``max_duration_s``; each request's priority drawn from ``priorities`` in turn.
    Runs in its own thread with its own event loop."""

    def __init__(
        self,
        engine_url: str,
        model: str,
        rate: float,
        priorities: Sequence[int],
        outcomes: Outcomes,
        shape: RequestShape = RequestShape(),
        max_duration_s: float = 600.0,
        seed: int = 0,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.engine_url = engine_url
        self.model = model
        self.rate = rate
        self.priorities = list(priorities) or [0]
        self.outcomes = outcomes
        self.shape = shape
        self.max_duration_s = max_duration_s
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.skipped = 0  # arrivals not sent: MAX_IN_FLIGHT requests were already open
        self.started_at = 0.0
        self.stopped_at = 0.0

    def offered_rate(self) -> float:
        """Requests per second actually sent so far (a starved client sends fewer)."""
        end = self.stopped_at or time.monotonic()
        elapsed = end - self.started_at
        return self.sent / elapsed if elapsed > 0 else 0.0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[str]] = set()
        async with _client(self.engine_url) as client:
            deadline = self.started_at + self.max_duration_s
            next_at = self.started_at
            index = 0
            while not self._stop.is_set() and time.monotonic() < deadline:
                next_at += self._random.expovariate(self.rate)
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if len(tasks) >= MAX_IN_FLIGHT:
                    self.skipped += 1
                    continue
                priority = self.priorities[index % len(self.priorities)]
                index += 1
                task = loop.create_task(
                    _send(client, self.model, self.shape, priority, self.outcomes)
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                self.sent += 1
            self.stopped_at = time.monotonic()
            if tasks:
                await asyncio.wait(tasks, timeout=130)

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run()), name="open-loop-load", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=140)
