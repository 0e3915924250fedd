"""Which of warden's hooks costs what under an overload: one hook off at a time, against plain.

The overload benchmark (benchmarks/overload.py) compares warden with all its hooks against
plain vLLM; when warden's default config reads slower, it cannot say which hook it is. Here
one engine per variant of ``benchmarks.common.VARIANTS`` (by default plain, warden, and
warden without its middleware, its logits processor or its plugins), all up, the engines on
the overload benchmark's cores (``--client-cpus``, the same split and OpenMP binding), each
given the same open-loop load in turn (``vllm bench serve``, Poisson arrivals at ``--rate``,
``--requests`` requests), the order moved one place per round so every variant runs in
every place.

Per run: engine tokens/s (the rise of ``vllm:generation_tokens_total`` over the client's
duration) and the API server's, the engine core's and the model worker's CPU per generated
token. Reported per variant: tokens/s against plain's in the same round, and the API
server's CPU over the worker's for the same tokens (its *share*): the host's speed moves all
three processes' CPU per token alike (by a quarter within a minute on the 2-core machine),
so the share stays where the absolute numbers do not, and a hook's cost in the API server
shows in it. Quick check 74 in benchmarks/README.md is this benchmark's first reading.

``--side-by-side``: every variant gets its load at the same time, each its own client at
``--rate``, so all of them run on the same host at the same moment. Run one after another,
two identical plain engines read up to a quarter apart (the host's speed moves within a
minute); side by side, they read within about 1% of each other (``plain_control``: a second
plain vLLM). That resolves the API server's CPU per completed request, the overload
benchmark's figure, to a percent: the column "API CPU/request w/p" is its ratio to plain's in
the same round. Keep ``--rate`` times the number of variants near the engines' capacity on
their shared cores: each engine gets its share of them.

``--hook module:Class.method`` (repeatable): every engine, plain's too, meters that function's
thread CPU in its API server (``benchmarks.api_cpu_probe``, garbage collection included),
and the report gives each one's milliseconds per completed request, variant against plain:
where in vLLM's own code warden's API server spends more than plain's, which the per-hook
breakdown (``benchmarks.api_cpu_breakdown``) cannot see.

Usage:  .venv/bin/python -m benchmarks.hook_ablation [--rounds 4] [--rate 50]
        [--requests 750] [--variants plain,warden,...] [--side-by-side] [--max-num-seqs 8]
        [--hook module:Class.method ...] [--model DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import api_cpu_probe
from benchmarks.api_cpu_breakdown import add_probe_options, breakdown, probe_env
from benchmarks.common import (
    VARIANTS,
    EngineCpu,
    cleanup,
    exit_on_sigterm,
    log,
    machine,
    make_engine,
    sample,
    scrape,
    table,
    tiny_model,
    workdir,
)
from benchmarks.overload import BATCH, bench_serve, cpu_split, engine_args
from exporter import catalog

DEFAULT_VARIANTS = "plain,warden,warden_no_middleware,warden_no_logits,warden_no_plugins"
BASELINE = "plain"
WARM_REQUESTS = 80  # a full batch's worth of warm-up per engine, as the overload benchmark's


def generated_tokens(base_url: str) -> float:
    return sample(scrape(base_url), catalog.VLLM_GENERATION_TOKENS.name) or 0.0


class Measurement:
    """One variant's run, read around its client (``start``, then ``finish`` with the
    client's result): tokens/s, each process's CPU microseconds per generated token, and the
    API server's CPU milliseconds per completed request."""

    def __init__(self, engine: Any, meters_dir: Path | None = None) -> None:
        self.engine = engine
        self.cpu = EngineCpu(engine)
        self.meters_dir = meters_dir
        self.before: dict[str, float] = {}
        self.meters_before: dict[str, list[int]] = {}
        self.tokens_before = 0.0
        self.started_at = 0.0

    def meters(self) -> dict[str, list[int]]:
        """The API server's hook meters as last written (none without ``--hook``)."""
        if self.meters_dir is None:
            return {}
        return api_cpu_probe.read(self.meters_dir, self.engine.process.pid)

    def start(self) -> None:
        self.meters_before = self.meters()
        self.before, self.tokens_before = self.cpu.read(), generated_tokens(self.engine.base_url)
        self.started_at = time.time()

    def finish(self, result: dict[str, Any]) -> dict[str, Any]:
        meters_after = self.meters()
        after = self.cpu.read()
        tokens = max(generated_tokens(self.engine.base_url) - self.tokens_before, 1.0)
        run = {
            "tokens_per_s": tokens / float(result["duration"]),
            "failed": result["failed"],
            # When the run was read: side by side, every variant's spans the others'.
            "started_at": self.started_at,
            "ended_at": time.time(),
        }
        for role in EngineCpu.ROLES:
            run[f"{role}_us_per_token"] = (after[role] - self.before[role]) * 1e6 / tokens
        run["api_share"] = run["api_us_per_token"] / run["worker_us_per_token"]
        completed = max(int(result.get("completed", 0)), 1)
        run["api_ms_per_request"] = (after["api"] - self.before["api"]) * 1e3 / completed
        if self.meters_dir is not None:
            rows = breakdown(self.meters_before, meters_after, completed, 0.0)
            run["hooks"] = {row["hook"]: row["ms_per_request"] for row in rows}
        return run


def settle_meters(meters_dir: Path | None) -> None:
    """Wait until every API server has written its meters since now: what they read then
    spans the same time as the CPU read right after."""
    if meters_dir is not None:
        time.sleep(2 * api_cpu_probe.WRITE_EVERY_S)


def measure(
    engine: Any,
    model: str,
    rate: float,
    requests: int,
    out: Path,
    meters_dir: Path | None = None,
) -> dict[str, Any]:
    """One variant's run on its own (the others idle)."""
    measurement = Measurement(engine, meters_dir)
    settle_meters(meters_dir)
    measurement.start()
    found = bench_serve(engine.base_url, model, rate, requests, out, None)
    settle_meters(meters_dir)
    return measurement.finish(found)


def measure_side_by_side(
    engines: dict[str, Any],
    model: str,
    rate: float,
    requests: int,
    outs: dict[str, Path],
    meters_dir: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Every variant's run at the same time, each with its own client: one host for all."""
    measurements = {name: Measurement(engine, meters_dir) for name, engine in engines.items()}
    results: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def client(name: str) -> None:
        try:
            results[name] = bench_serve(
                engines[name].base_url, model, rate, requests, outs[name], None
            )
        except BaseException as error:  # re-raised below, after every client has ended
            errors.append(error)

    settle_meters(meters_dir)
    for measurement in measurements.values():
        measurement.start()
    clients = [threading.Thread(target=client, args=(name,)) for name in engines]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    if errors:
        raise errors[0]
    settle_meters(meters_dir)
    return {name: m.finish(results[name]) for name, m in measurements.items()}


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def report(results: dict[str, Any]) -> str:
    """Per variant: tokens/s w/p round by round and its median; the API server's share of
    the worker's CPU, its mean and its ratio to plain's."""
    runs: dict[str, list[dict[str, float]]] = results["runs"]
    base = runs[BASELINE]
    base_share = statistics.fmean(r["api_share"] for r in base)
    rows = []
    for name, own in runs.items():
        ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(own, base, strict=True)]
        share = statistics.fmean(r["api_share"] for r in own)
        per_request = [
            r["api_ms_per_request"] / b["api_ms_per_request"]
            for r, b in zip(own, base, strict=True)
            if "api_ms_per_request" in r and b.get("api_ms_per_request")
        ]
        rows.append(
            [
                name,
                " / ".join(f"{x:.3f}" for x in ratios),
                f"{statistics.median(ratios):.3f}",
                f"{share:.3f}",
                f"{share / base_share:.3f}",
                f"{statistics.median(per_request):.3f} "
                f"({min(per_request):.3f}-{max(per_request):.3f})"
                if per_request
                else "-",
                sum(int(r["failed"]) for r in own),
            ]
        )
    head = (
        f"{results['rounds']} rounds, {results['requests']} requests at {results['rate']:g}/s "
        f"per variant and round; engine on cores {results['cpus']['engine']}, client on "
        f"{results['cpus']['client']}"
        if results.get("cpus")
        else f"{results['rounds']} rounds, {results['requests']} requests at "
        f"{results['rate']:g}/s per variant and round; no core split"
    )
    if results.get("side_by_side"):
        head += "; the variants side by side (loaded at the same time)"
    if results.get("max_num_seqs", BATCH) != BATCH:
        head += f"; a batch of {results['max_num_seqs']}"
    return (
        head
        + "\n\n"
        + table(
            [
                "variant",
                "tokens/s w/p, round by round",
                "median",
                "API share of the worker's CPU",
                "share w/p",
                "API CPU/request w/p, median (min-max)",
                "failed",
            ],
            rows,
        )
        + hooks_report(runs)
    )


def hooks_report(runs: dict[str, list[dict[str, Any]]]) -> str:
    """``--hook``: per metered function and variant, its API server's CPU milliseconds per
    completed request (median of the rounds, min-max) and that over plain's, round by round."""
    labels = sorted({label for own in runs.values() for r in own for label in r.get("hooks", {})})
    if not labels:
        return ""
    base = runs[BASELINE]
    rows = []
    for label in labels:
        for name, own in runs.items():
            spent = [r.get("hooks", {}).get(label, 0.0) for r in own]
            ratios = [
                r.get("hooks", {}).get(label, 0.0) / b["hooks"][label]
                for r, b in zip(own, base, strict=True)
                if b.get("hooks", {}).get(label)
            ]
            rows.append(
                [
                    label,
                    name,
                    f"{statistics.median(spent):.3f} ({min(spent):.3f}-{max(spent):.3f})",
                    f"{statistics.median(ratios):.3f}" if ratios else "-",
                ]
            )
    headers = ["metered in the API server", "variant", "ms/request, median (min-max)", "w/p"]
    return "\n\n" + table(headers, rows)


def variant_names(spec: str) -> list[str]:
    """``--variants``: known names, plain among them (every ratio is to plain's run)."""
    names = [n for n in spec.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or BASELINE not in names:
        raise ValueError(f"--variants: {unknown or 'no ' + BASELINE}; known: {sorted(VARIANTS)}")
    return names


def run(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    root, temporary = workdir(args.workdir, "warden-ablation-")
    split = cpu_split(args.client_cpus)
    engines: dict[str, Any] = {}
    try:
        model = tiny_model(root, args.model)
        env = split.engine_env() if split else {}
        meters_dir: Path | None = None
        if args.hook:
            env = {**env, **probe_env(root, args.hook)}
            meters_dir = Path(env[api_cpu_probe.PROBE_DIR_ENV])
        spec = engine_args(args.max_num_seqs)
        for name in names:
            engines[name] = make_engine(VARIANTS[name], model, root / name, spec, env)
        if split:
            os.sched_setaffinity(0, split.engine)  # the engines inherit the engine's cores
        for engine in engines.values():
            engine.start()
        if split:
            os.sched_setaffinity(0, split.client)
        for name, engine in engines.items():
            engine.wait_ready()
            bench_serve(engine.base_url, model, None, WARM_REQUESTS, root / f"warm-{name}.json",
                        None, 8)  # fmt: skip
            log(f"engine {name} ready and warmed")
        results: dict[str, Any] = {
            "machine": machine(),
            "rate": args.rate,
            "requests": args.requests,
            "rounds": args.rounds,
            "max_num_seqs": args.max_num_seqs,
            "cpus": {"engine": sorted(split.engine), "client": sorted(split.client)}
            if split
            else None,
            "side_by_side": args.side_by_side,
            "runs": {name: [] for name in names},
        }
        for index in range(args.rounds):
            if args.side_by_side:
                outs = {name: root / f"round{index}-{name}.json" for name in names}
                found_all = measure_side_by_side(
                    engines, model, args.rate, args.requests, outs, meters_dir
                )
                for name in names:
                    results["runs"][name].append(found_all[name])
                log(f"round {index + 1}: " + ", ".join(
                    f"{name} {found_all[name]['api_ms_per_request']:.2f} API ms/request"
                    for name in names))  # fmt: skip
                continue
            for name in rotated(names, index):
                out = root / f"round{index}-{name}.json"
                found = measure(engines[name], model, args.rate, args.requests, out, meters_dir)
                results["runs"][name].append(found)
                log(f"round {index + 1} {name}: {found['tokens_per_s']:.0f} tokens/s")
        return results
    finally:
        for engine in engines.values():
            engine.stop(30.0)
            engine.close()
        cleanup(root, temporary)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="benchmarks.common.VARIANTS")
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s offered")
    parser.add_argument("--requests", type=int, default=750, help="requests per run")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-num-seqs", type=int, default=BATCH, help="each engine's batch")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="load every variant at the same time (resolves the API server's CPU to ~1%%)",
    )
    add_probe_options(
        parser, "meter it in every API server: module:function or module:Class.method"
    )
    args = parser.parse_args(argv)
    if min(args.rate, args.requests, args.rounds, args.max_num_seqs) <= 0:
        parser.error("--rate, --requests, --rounds and --max-num-seqs must be positive")
    try:
        for hook in args.hook:
            api_cpu_probe.parse_hook(hook)
        names = variant_names(args.variants)
        cpu_split(args.client_cpus)  # an impossible split is refused before any engine starts
    except ValueError as error:
        print(f"hook_ablation: {error}", file=sys.stderr)
        return 2
    exit_on_sigterm()
    started = time.monotonic()
    results = run(args, names)
    results["took_s"] = round(time.monotonic() - started, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
