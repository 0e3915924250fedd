"""Saturation and overload: plain vLLM against ``warden serve``, identical engine arguments.

Both engines run the tiny model with the same vLLM arguments (the tests' base arguments,
``--max-num-seqs``, a small KV cache of ``--kv-blocks`` blocks). By default only the engine
being measured is up: each is started for its round and stopped after it, because on a small
host an idle engine beside a loaded one is noise (its threads, its pages reclaimed and read
back); ``--no-isolate`` keeps them all up side by side, each idle while another is measured.
``plain`` is vLLM with no warden hook at all (benchmarks/common.py);
``warden`` is ``warden serve`` (supervisor included) with a control config that sets the
latency SLO admission protects (``admission.saturation.latency_slo_s``) to the benchmark's own
SLO, and the longest Retry-After (``retry_after_max_s``) to what its clients honour;
``warden_constant`` (at overload only, ``--no-constant`` to skip) is the same with
``retry_after: constant`` (the old fixed Retry-After of 5 s), to show what the computed one is
worth.

Load is closed-loop: each client sends one completion (fixed prompt, ``--max-tokens``,
``ignore_eos``) and, when it ends, the next. A refusal (429/503 with Retry-After, as
warden/common/outcomes.py counts it) is retried after the server's ``retry-after-ms`` or
``Retry-After``, capped at ``--retry-cap`` seconds, as the OpenAI SDK honours them. Loads are
multiples of ``--max-num-seqs`` clients: 1x just saturates the batch, 3x is three times more.
Engines are interleaved (plain, warden, warden_constant, then the next round in rotated order),
``--rounds`` rounds; in its turn an engine runs every load, each phase ``--warmup`` seconds
unmeasured then ``--duration`` seconds measured.

The SLO is ``--slo-factor`` times the unloaded latency (one request alone on the idle plain
engine, median of five). Per engine and load: completed requests, generated tok/s, p50/p99
latency of completed requests (the attempt that was admitted, and end to end with refusals
and waits), refusals, repeated refusals (a retry refused again), failures, memory watermark and
saturation transitions per minute (warden's own counters), and requests completed within the
SLO. Targets (issue #10): at 1x, warden/plain tok/s >= 0.97 and no refusal; at 3x, >= 99% of
the requests warden admits finish within the SLO, tok/s >= 0.90 of plain, and more requests
within the SLO than plain.

Usage:  .venv/bin/python -m benchmarks.saturation [--duration 45] [--warmup 10] [--rounds 2]
        [--loads 1,3] [--slo-factor 4] [--max-num-seqs 8] [--kv-blocks 40] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import (
    BASE_ARGS,
    BASE_ENV,
    VARIANTS,
    cleanup,
    exit_on_sigterm,
    log,
    machine,
    make_engine,
    quantile,
    scrape,
    table,
    tiny_model,
    workdir,
)
from exporter import catalog
from warden.common.outcomes import COMPLETED, FAILED, REFUSED, classify
from warden.common.ports import free_port
from warden.common.processes import ChildProcess

PROMPT = "memory watermark cache block engine request token prompt graph device"
MAX_WAIT_AFTER_S = 60.0  # a phase's clients finish their request in flight within this


def prompt(words: int) -> str:
    """The same prompt of about ``words`` words for every request (about as many tokens)."""
    vocabulary = PROMPT.split()
    return " ".join(vocabulary[i % len(vocabulary)] for i in range(words))


@dataclass
class Attempt:
    """One HTTP attempt of a logical request."""

    started: float
    ended: float
    outcome: str
    tokens: int = 0
    detail: str = ""  # why it failed: the HTTP error, or the status and the body's start


@dataclass
class PhaseResult:
    engine: str
    load: int
    clients: int
    round: int
    duration_s: float
    completed: int = 0
    tokens: int = 0
    refusals: int = 0
    repeated_refusals: int = 0
    failures: int = 0
    within_slo: int = 0
    latencies: list[float] = field(default_factory=list)  # admitted attempt, completed only
    e2e: list[float] = field(default_factory=list)  # first attempt to completion
    watermark_transitions: float = 0.0
    saturation_transitions: float = 0.0
    failure_examples: list[str] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.duration_s


class Engine:
    """One engine under test: its URL, the model name it serves, and (warden) its metrics."""

    def __init__(self, name: str, process: Any, base_url: str, model: str) -> None:
        self.name = name
        self.process = process
        self.base_url = base_url
        self.model = model

    def counters(self) -> dict[str, float]:
        """Warden's transition counters (zero for plain vLLM, which has none)."""
        if self.name == "plain":
            return {"watermark": 0.0, "saturation": 0.0}
        samples = scrape(self.base_url)

        def total(spec: catalog.MetricSpec) -> float:
            return sum(v for k, v in samples.items() if k.split("{")[0] == spec.name)

        return {
            "watermark": total(catalog.WATERMARK_TRANSITIONS),
            "saturation": total(catalog.SATURATION_TRANSITIONS),
        }

    def idle(self, timeout_s: float = 120.0) -> None:
        """Wait until nothing runs or waits (the previous phase's requests are gone)."""
        deadline = time.monotonic() + timeout_s
        names = (catalog.VLLM_NUM_REQUESTS_RUNNING.name, catalog.VLLM_NUM_REQUESTS_WAITING.name)
        while time.monotonic() < deadline:
            samples = scrape(self.base_url)
            if sum(v for k, v in samples.items() if k.split("{")[0] in names) == 0:
                return
            time.sleep(0.5)


def retry_delay(response: httpx.Response, attempt: int, cap_s: float) -> float:
    """What the OpenAI SDK waits before retrying: retry-after-ms, else Retry-After, else its
    exponential backoff; capped."""
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = response.headers.get(header)
        if raw is not None:
            try:
                return min(cap_s, max(0.0, float(raw) * scale))
            except ValueError:
                continue
    return min(cap_s, 0.5 * 2 ** min(attempt, 4))


def client_loop(
    engine: Engine,
    body: dict[str, Any],
    stop: threading.Event,
    cap_s: float,
    out: list[list[Attempt]],
) -> None:
    """Closed loop: one logical request after the other; refused ones retried as told."""
    with httpx.Client(base_url=engine.base_url, timeout=300) as client:
        while not stop.is_set():
            attempts: list[Attempt] = []
            while True:
                started = time.time()
                try:
                    response = client.post("/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    detail = f"{type(exc).__name__}: {exc}"
                    attempts.append(Attempt(started, time.time(), FAILED, detail=detail))
                    break
                ended = time.time()
                outcome = classify(response.status_code, dict(response.headers), response.content)
                tokens, detail = 0, ""
                if outcome == COMPLETED:
                    tokens = int(response.json()["usage"]["completion_tokens"])
                elif outcome == FAILED:
                    detail = f"HTTP {response.status_code}: {response.text[:200]}"
                attempts.append(Attempt(started, ended, outcome, tokens, detail))
                if outcome != REFUSED or stop.is_set():
                    break
                stop.wait(retry_delay(response, len(attempts), cap_s))
            out.append(attempts)


def run_phase(
    engine: Engine,
    load: int,
    clients: int,
    round_index: int,
    args: argparse.Namespace,
    slo_s: float,
) -> PhaseResult:
    body = {
        "model": engine.model,
        "prompt": prompt(args.prompt_words),
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    engine.idle()
    before = engine.counters()
    stop = threading.Event()
    logs: list[list[list[Attempt]]] = [[] for _ in range(clients)]
    threads = [
        threading.Thread(
            target=client_loop, args=(engine, body, stop, args.retry_cap, logs[i]), daemon=True
        )
        for i in range(clients)
    ]
    phase_start = time.time()
    for thread in threads:
        thread.start()
    window_start = phase_start + args.warmup
    window_end = window_start + args.duration
    time.sleep(max(0.0, window_end - time.time()))
    stop.set()
    for thread in threads:
        thread.join(MAX_WAIT_AFTER_S)
    elapsed_min = (time.time() - phase_start) / 60
    after = engine.counters()
    result = PhaseResult(engine.name, load, clients, round_index, args.duration)
    result.watermark_transitions = (after["watermark"] - before["watermark"]) / elapsed_min
    result.saturation_transitions = (after["saturation"] - before["saturation"]) / elapsed_min
    for per_client in logs:
        for attempts in per_client:
            for index, attempt in enumerate(attempts):
                if not window_start <= attempt.ended < window_end:
                    continue
                if attempt.outcome == REFUSED:
                    result.refusals += 1
                    result.repeated_refusals += int(index > 0)
                elif attempt.outcome == FAILED:
                    result.failures += 1
                    if len(result.failure_examples) < 5:
                        result.failure_examples.append(attempt.detail)
                elif attempt.outcome == COMPLETED:
                    latency = attempt.ended - attempt.started
                    result.completed += 1
                    result.tokens += attempt.tokens
                    result.latencies.append(latency)
                    result.e2e.append(attempt.ended - attempts[0].started)
                    result.within_slo += int(latency <= slo_s)
    return result


# --- engines ----------------------------------------------------------------------------


def engine_args(args: argparse.Namespace) -> list[str]:
    return [
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--num-gpu-blocks-override",
        str(args.kv_blocks),
        "--max-model-len",
        "512",
    ]


def start_plain(model: str, work: Path, args: argparse.Namespace, run_dir: str) -> Engine:
    process = make_engine(VARIANTS["plain"], model, work / run_dir, engine_args(args))
    process.start()
    took = process.wait_ready(600)
    log(f"plain vLLM ready on {process.base_url} ({took:.0f}s)")
    return Engine("plain", process, process.base_url, model)


def start_warden(
    name: str, model: str, work: Path, args: argparse.Namespace, config: dict[str, Any], run: str
) -> Engine:
    """``warden serve`` with the same vLLM arguments, supervised, with ``config``."""
    run_dir = work / run
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "warden.yaml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    argv = [sys.executable, "-m", "warden.cli", "serve", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--run-dir", str(run_dir)]
    if args.supervise:
        argv += ["--supervisor-port", str(free_port())]
        argv += ["--unresponsive-grace-s", str(args.unresponsive_grace_s)]
    else:
        argv.append("--no-supervise")
    argv += [model, *BASE_ARGS, *engine_args(args)]
    # The caller's WARDEN_* switches must not leak in: the config file is the only difference.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    env.update({**BASE_ENV, "WARDEN_CONFIG": str(config_path)})
    url = f"http://127.0.0.1:{port}"
    process = ChildProcess(name, argv, run_dir / "serve.log", f"{url}/health", env=env)
    process.start()
    took = process.wait_ready(600)
    log(f"{name} (warden serve) ready on {url} ({took:.0f}s)")
    return Engine(name, process, url, model)


def unloaded_latency(engine: Engine, args: argparse.Namespace) -> float:
    body = {
        "model": engine.model,
        "prompt": prompt(args.prompt_words),
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    times = []
    with httpx.Client(base_url=engine.base_url, timeout=300) as client:
        for index in range(7):
            started = time.time()
            client.post("/v1/completions", json=body).raise_for_status()
            if index >= 2:  # the first two warm the engine up
                times.append(time.time() - started)
    return statistics.median(times)


# --- report -----------------------------------------------------------------------------


def aggregate(results: Sequence[PhaseResult]) -> dict[str, Any]:
    latencies = [x for r in results for x in r.latencies]
    e2e = [x for r in results for x in r.e2e]
    completed = sum(r.completed for r in results)

    def q(values: list[float], p: float) -> float | None:
        return round(quantile(values, p), 3) if values else None

    return {
        "phases": len(results),
        "completed": completed,
        "tok_s": round(statistics.fmean(r.tok_s for r in results), 1),
        "p50_s": q(latencies, 0.5),
        "p99_s": q(latencies, 0.99),
        "e2e_p50_s": q(e2e, 0.5),
        "e2e_p99_s": q(e2e, 0.99),
        "refusals": sum(r.refusals for r in results),
        "repeated_refusals": sum(r.repeated_refusals for r in results),
        "failures": sum(r.failures for r in results),
        "within_slo": sum(r.within_slo for r in results),
        "within_slo_share": round(sum(r.within_slo for r in results) / completed, 4)
        if completed
        else None,
        "watermark_transitions_per_min": round(max(r.watermark_transitions for r in results), 2),
        "saturation_transitions_per_min": round(max(r.saturation_transitions for r in results), 2),
    }


def verdicts(summary: dict[int, dict[str, dict[str, Any]]]) -> list[tuple[str, bool, str]]:
    out = []
    for load, engines in sorted(summary.items()):
        plain, warden = engines.get("plain"), engines.get("warden")
        if not plain or not warden:
            continue
        ratio = warden["tok_s"] / plain["tok_s"] if plain["tok_s"] else 0.0
        if load == 1:
            out.append(("1x: warden/plain tok/s >= 0.97", ratio >= 0.97, f"{ratio:.3f}"))
            out.append(("1x: no refusal", warden["refusals"] == 0, str(warden["refusals"])))
        else:
            share = warden["within_slo_share"] or 0.0
            out.append((f"{load}x: >= 99% admitted within SLO", share >= 0.99, f"{share:.4f}"))
            out.append((f"{load}x: warden/plain tok/s >= 0.90", ratio >= 0.90, f"{ratio:.3f}"))
            more = warden["within_slo"] > plain["within_slo"]
            out.append(
                (
                    f"{load}x: more within SLO than plain",
                    more,
                    f"{warden['within_slo']} vs {plain['within_slo']}",
                )
            )
        failed = warden["failures"] + plain["failures"]
        out.append((f"{load}x: no failed request", failed == 0, str(failed)))
    return out


def markdown(summary: dict[int, dict[str, dict[str, Any]]]) -> str:
    headers = [
        "load",
        "engine",
        "completed",
        "tok/s",
        "p50 s",
        "p99 s",
        "e2e p99 s",
        "refusals",
        "repeated",
        "failed",
        "within SLO",
        "WM trans/min",
        "sat trans/min",
    ]
    rows = []
    for load, engines in sorted(summary.items()):
        for name, s in engines.items():
            rows.append(
                [
                    f"{load}x",
                    name,
                    s["completed"],
                    s["tok_s"],
                    s["p50_s"],
                    s["p99_s"],
                    s["e2e_p99_s"],
                    s["refusals"],
                    s["repeated_refusals"],
                    s["failures"],
                    f"{s['within_slo']} ({(s['within_slo_share'] or 0) * 100:.1f}%)",
                    s["watermark_transitions_per_min"],
                    s["saturation_transitions_per_min"],
                ]
            )
    return table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=45.0, help="measured seconds/phase")
    parser.add_argument("--warmup", type=float, default=10.0, help="unmeasured seconds/phase")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per load")
    parser.add_argument("--loads", default="1,3", help="multiples of --max-num-seqs clients")
    parser.add_argument("--slo-factor", type=float, default=4.0, help="SLO / unloaded latency")
    parser.add_argument("--slo-s", type=float, help="the SLO in seconds (overrides the factor)")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=40, help="KV cache blocks of 32 tokens")
    parser.add_argument("--prompt-words", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--retry-cap", type=float, default=2.0, help="longest honoured wait (s)")
    parser.add_argument("--no-constant", action="store_true", help="skip warden_constant")
    parser.add_argument("--supervise", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="only the measured engine is up (default); --no-isolate keeps all up side by side",
    )
    parser.add_argument(
        "--unresponsive-grace-s",
        type=float,
        default=300.0,
        help="the supervisor's grace for an engine whose probes time out (default 45 s): on a "
        "2-core host, an engine idle between its phases can answer late while another one is "
        "loaded, and a restart there would load the phase being measured",
    )
    parser.add_argument("--model", help="model dir (default: the tiny model, built)")
    parser.add_argument("--workdir", help="keep engine logs here (default: a temp dir)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    loads = [int(x) for x in args.loads.split(",")]
    work, temporary = workdir(args.workdir, "warden-saturation-")
    engines: dict[str, Engine] = {}
    try:
        model = tiny_model(work, args.model)
        engines["plain"] = start_plain(model, work, args, "engine-plain-1")
        unloaded = unloaded_latency(engines["plain"], args)
        slo = args.slo_s or args.slo_factor * unloaded
        log(f"unloaded latency {unloaded:.3f}s; SLO {slo:.3f}s")
        # Retry-After bounded by what the clients honour (--retry-cap), as an operator sets it.
        saturation = {
            "latency_slo_s": round(slo, 3),
            "retry_after_max_s": max(args.retry_cap, 0.5),
        }
        constant = {"admission": {"saturation": {**saturation, "retry_after": "constant"}}}
        # Each start gets its own folder (engine-NAME-ROUND), so every run's log is kept.
        starters: dict[str, Callable[[str], Engine]] = {
            "plain": lambda run: start_plain(model, work, args, run),
            "warden": lambda run: start_warden(
                "warden", model, work, args, {"admission": {"saturation": saturation}}, run
            ),
        }
        if not args.no_constant and any(load > 1 for load in loads):
            starters["warden_constant"] = lambda run: start_warden(
                "warden_constant", model, work, args, constant, run
            )
        if not args.isolate:
            for name, start in starters.items():
                if name not in engines:  # plain is up already (it measured the SLO)
                    engines[name] = start(f"engine-{name}-1")
        results: list[PhaseResult] = []
        names = list(starters)
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                if name not in engines:
                    engines[name] = starters[name](f"engine-{name}-{round_index + 1}")
                for load in loads:
                    if name == "warden_constant" and load == 1:
                        continue
                    result = run_phase(
                        engines[name], load, load * args.max_num_seqs, round_index, args, slo
                    )
                    results.append(result)
                    log(
                        f"{load}x {name} round {round_index + 1}: {result.completed} done, "
                        f"{result.tok_s:.0f} tok/s, {result.refusals} refused, "
                        f"{result.failures} failed, {result.within_slo} within SLO"
                    )
                if args.isolate:
                    engines.pop(name).process.stop()
        summary: dict[int, dict[str, dict[str, Any]]] = {}
        for load in loads:
            for name in starters:
                mine = [r for r in results if r.load == load and r.engine == name]
                if mine:
                    summary.setdefault(load, {})[name] = aggregate(mine)
        checks = verdicts(summary)
        print(f"\nunloaded latency {unloaded:.3f} s, SLO {slo:.3f} s ({args.slo_factor:g}x)")
        print(markdown(summary))
        print()
        for name, ok, detail in checks:
            print(f"  [{'ok' if ok else 'MISSED'}] {name}: {detail}")
        if args.out:
            Path(args.out).write_text(
                json.dumps(
                    {
                        "machine": machine(),
                        "args": vars(args),
                        "unloaded_latency_s": unloaded,
                        "slo_s": slo,
                        "summary": summary,
                        "checks": [{"check": n, "ok": ok, "value": d} for n, ok, d in checks],
                        "phases": [
                            {k: v for k, v in asdict(r).items() if k not in ("latencies", "e2e")}
                            for r in results
                        ],
                    },
                    indent=2,
                )
            )
        return 0
    finally:
        for engine in engines.values():
            engine.process.stop()
        cleanup(work, temporary)


if __name__ == "__main__":
    raise SystemExit(main())
