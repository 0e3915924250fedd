"""Retry-After under closed-loop overload: computed from the drain rate against a constant.

Issue #10.4 asks that clients honouring the computed Retry-After see fewer repeated refusals
than with a constant. On a real engine this host's noise drowns the difference (see
benchmarks/README.md, the saturation runs), so this benchmark drives warden's real admission
(``Controller.decide`` and ``serving``, the ``StepMonitor`` and ``SaturationWatch`` that feed it)
with a simulated engine on a simulated clock: deterministic, and seconds to run.

The engine: ``--slots`` requests run at once (max_num_seqs), each takes ``--service`` seconds
(give or take ``--jitter``, so the batch does not stay in lockstep), admitted requests beyond
the slots wait in FIFO order; every ``--step`` seconds it reports a
step (running, waiting, the requests it finished) as vLLM's stat logger does. The clients:
``--clients`` closed loops, each sending its next request the moment the last one finishes;
a refused one waits the Retry-After, capped at ``--cap`` seconds, and tries again. Every send
takes up to 20 ms to arrive, and the clients arriving in one step are taken in a random order
(seeded: ``--seed``), so no client wins every race by its position. The SLO is
``--slo`` seconds (``admission.saturation.latency_slo_s``). ``constant`` is
``retry_after: constant`` (admission.retry_after_s, 5 s).

Per mode: completed requests, refusals, repeated refusals (a retry refused again), requests
admitted within the SLO, and the share of retries admitted.

Usage:  .venv/bin/python -m benchmarks.retry_after [--clients 24] [--slots 8] [--service 1.0]
        [--slo 2.5] [--cap 2 --cap 60] [--duration 120] [--warmup 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from benchmarks.common import table
from exporter.metrics import WardenMetrics
from exporter.settings import WardenSettings
from exporter.step_monitor import StepMonitor
from warden.control.admission import RequestFacts
from warden.control.config import AdmissionSettings, ControlConfig, SaturationSettings
from warden.control.controller import Controller
from warden.control.saturation import SaturationWatch

TOKENS_PER_REQUEST = 136  # a 40-token prompt and 96 generated: only the KV forecast reads it


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SimulatedEngineClient:
    """What admission reads from vLLM's engine client: max_num_seqs and the unfinished count."""

    def __init__(self, slots: int, unfinished: int = 0) -> None:
        self.unfinished = unfinished
        scheduler = type("SchedulerConfig", (), {"max_num_seqs": slots})()
        self.vllm_config = type("VllmConfig", (), {"scheduler_config": scheduler})()
        self.output_processor = self

    def get_num_unfinished_requests(self) -> int:
        return self.unfinished


@dataclass(frozen=True)
class Scenario:
    """The simulated engine, its clients and admission's settings (see the module docstring)."""

    clients: int = 24
    slots: int = 8
    service: float = 1.0
    jitter: float = 0.1
    step: float = 0.01
    seed: int = 1
    slo: float = 2.5
    retry_after_max: float | None = None  # admission.saturation.retry_after_max_s (None: 30)
    duration: float = 120.0
    warmup: float = 20.0


@dataclass
class Outcome:
    mode: str
    cap_s: float
    completed: int = 0
    within_slo: int = 0
    refusals: int = 0
    repeated_refusals: int = 0
    retries: int = 0
    retries_admitted: int = 0


@dataclass
class InEngine:
    client: int
    admitted_at: float
    service_s: float
    served_s: float
    answered: contextlib.ExitStack  # leaves Controller.serving() when the request finishes


def simulate(mode: str, args: Scenario, cap_s: float) -> Outcome:
    rng = random.Random(args.seed)
    clock = SimulatedClock()
    saturation = SaturationSettings(
        latency_slo_s=args.slo, retry_after=mode, retry_after_max_s=args.retry_after_max or 30.0
    )
    config = ControlConfig(admission=AdmissionSettings(saturation=saturation))
    controller = Controller(config, WardenMetrics(CollectorRegistry()), clock=clock)
    engine = SimulatedEngineClient(args.slots)
    controller.engine_client = engine
    monitor = StepMonitor(WardenSettings(), WardenMetrics(CollectorRegistry()), None, clock=clock)
    monitor.add_listener(SaturationWatch(saturation, controller, clock=clock))
    sends_at: list[float | None] = [clock.now + rng.uniform(0, 0.02) for _ in range(args.clients)]
    refused_before = [False] * args.clients
    waiting: deque[InEngine] = deque()
    running: list[InEngine] = []
    outcome = Outcome(mode, cap_s)
    measured_from = clock.now + args.warmup
    ends_at = measured_from + args.duration
    while clock.now < ends_at:
        measuring = clock.now >= measured_from
        order = list(range(args.clients))
        rng.shuffle(order)
        for client in order:
            due = sends_at[client]
            if due is None or due > clock.now:
                continue
            decision = controller.decide(RequestFacts(prompt_tokens=40))
            retry = refused_before[client]
            if measuring:
                outcome.retries += retry
            if decision.admit:
                answered = contextlib.ExitStack()
                answered.enter_context(controller.serving())
                service = args.service * rng.uniform(1 - args.jitter, 1 + args.jitter)
                waiting.append(InEngine(client, clock.now, service, 0.0, answered))
                sends_at[client] = None
                refused_before[client] = False
                if measuring:
                    outcome.retries_admitted += retry
                continue
            if measuring:
                outcome.refusals += 1
                outcome.repeated_refusals += retry
            refused_before[client] = True
            wait = min(cap_s, decision.retry_after_s)
            sends_at[client] = clock.now + wait + rng.uniform(0, 0.02)
        while waiting and len(running) < args.slots:
            running.append(waiting.popleft())
        clock.now += args.step
        finished = []
        for request in list(running):
            request.served_s += args.step
            if request.served_s < request.service_s:
                continue
            running.remove(request)
            request.answered.close()
            latency = clock.now - request.admitted_at
            finished.append((TOKENS_PER_REQUEST, latency - request.served_s, request.served_s))
            sends_at[request.client] = clock.now + rng.uniform(0, 0.02)
            if measuring:
                outcome.completed += 1
                outcome.within_slo += int(latency <= args.slo + 1e-9)
        engine.unfinished = len(waiting) + len(running)
        monitor.on_step(len(running), len(waiting), 0.5, finished=finished)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Scenario()
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--slots", type=int, default=defaults.slots)
    parser.add_argument(
        "--service", type=float, default=defaults.service, help="seconds per request"
    )
    parser.add_argument(
        "--jitter", type=float, default=defaults.jitter, help="service time +- share"
    )
    parser.add_argument("--step", type=float, default=defaults.step, help="seconds per engine step")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--retry-after-max",
        type=float,
        dest="retry_after_max",
        help="retry_after_max_s (default 30)",
    )
    parser.add_argument("--slo", type=float, default=defaults.slo, help="latency SLO (s)")
    parser.add_argument("--cap", type=float, action="append", help="longest honoured wait (s)")
    parser.add_argument(
        "--duration", type=float, default=defaults.duration, help="measured seconds"
    )
    parser.add_argument("--warmup", type=float, default=defaults.warmup, help="unmeasured seconds")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    fields = {k: v for k, v in vars(args).items() if k in Scenario.__dataclass_fields__}
    scenario = Scenario(**fields)
    caps = args.cap or [2.0, 60.0]
    outcomes = [simulate(mode, scenario, cap) for cap in caps for mode in ("computed", "constant")]
    rows: list[list[Any]] = [
        [
            o.mode,
            o.cap_s,
            o.completed,
            o.within_slo,
            o.refusals,
            o.repeated_refusals,
            f"{o.retries_admitted / o.retries:.0%}" if o.retries else "-",
        ]
        for o in outcomes
    ]
    headers = [
        "Retry-After",
        "cap s",
        "completed",
        "within SLO",
        "refusals",
        "repeated",
        "retries admitted",
    ]
    print(table(headers, rows))
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "scenario": asdict(scenario),
                    "caps": caps,
                    "outcomes": [asdict(o) for o in outcomes],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
