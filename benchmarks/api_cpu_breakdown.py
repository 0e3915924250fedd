"""Where warden's CPU in vLLM's API server goes, hook by hook, in a live server under load.

The overload benchmark's default-config figure (API-server CPU per request <= 1.05x plain,
issue #28) is a sum over warden's hooks; side by side (``benchmarks.hook_ablation``) resolves
the sum to about a percent, not its parts. This starts one warden engine (the overload
benchmark's engine arguments and core split) whose ``sitecustomize`` meters each hook's
thread CPU (``benchmarks.api_cpu_probe``), warms it, offers ``vllm bench serve``'s open-loop
load, and reports per hook: calls per completed request, microseconds a call, and its share
of the API server's CPU per request (all threads, psutil). The middleware's own share is its
total less the vLLM app it calls. Garbage collection is metered too, by generation; with
``--variant plain`` it is all there is to meter, for comparison.

Usage:  .venv/bin/python -m benchmarks.api_cpu_breakdown [--variant warden] [--rate 10]
        [--requests 300] [--rounds 2] [--max-num-seqs 8] [--settle-s 5]
        [--hook module:Class.method ...]
        [--model DIR] [--workdir DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import api_cpu_probe
from benchmarks.common import (
    VARIANTS,
    EngineCpu,
    cleanup,
    exit_on_sigterm,
    log,
    machine,
    table,
    tiny_model,
    workdir,
)
from benchmarks.overload import BATCH, bench_serve, cpu_split, engine_args, serving_engine

REPO_ROOT = Path(__file__).resolve().parent.parent
WARM_REQUESTS = 80  # a full batch's worth, as the overload benchmark's warm-up
MIDDLEWARE_OWN = "middleware, its own"


def probe_env(root: Path, hooks: Sequence[str] = ()) -> dict[str, str]:
    """The engine's environment additions: a ``sitecustomize`` that installs the meters,
    and the extra hooks they meter."""
    site = root / "probe-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(api_cpu_probe.sitecustomize_source())
    meters = root / "probe-meters"
    meters.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join([str(site), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    return {
        "PYTHONPATH": path.rstrip(os.pathsep),
        api_cpu_probe.PROBE_DIR_ENV: str(meters),
        api_cpu_probe.EXTRA_HOOKS_ENV: ",".join(hooks),
    }


def add_probe_options(parser: argparse.ArgumentParser, hook_help: str) -> None:
    """``--hook`` and the engine options this command shares with ``hook_ablation``."""
    parser.add_argument("--hook", action="append", default=[], help=hook_help)
    parser.add_argument("--client-cpus", default="auto", help="as benchmarks.overload's")
    parser.add_argument("--model", help="a model folder (default: the tiny model, built)")
    parser.add_argument("--workdir", help="kept after the run (default: a temporary folder)")
    parser.add_argument("--out", help="the results as JSON")


def fresh_meters(directory: Path, pid: int, wait_s: float) -> dict[str, list[int]]:
    """The meters as written after now, at most ``WRITE_EVERY_S`` before the call returns:
    the API server's CPU read right after it spans the same time, to within that."""
    time.sleep(wait_s)
    return api_cpu_probe.read(directory, pid)


def breakdown(
    before: dict[str, list[int]], after: dict[str, list[int]], completed: int, api_ms: float
) -> list[dict[str, Any]]:
    """Per label: calls per request, us a call, ms per request and share of the API CPU."""
    rows = []
    delta = {
        label: [a - b for a, b in zip(entry, before.get(label, [0, 0]), strict=True)]
        for label, entry in after.items()
    }
    total = delta.get(api_cpu_probe.MIDDLEWARE_TOTAL)
    app = delta.get(api_cpu_probe.MIDDLEWARE_APP)
    if total and app:
        delta[MIDDLEWARE_OWN] = [total[0], total[1] - app[1]]
    order = [label for *_, label in api_cpu_probe.HOOKS]
    order += [api_cpu_probe.MIDDLEWARE_TOTAL, api_cpu_probe.MIDDLEWARE_APP, MIDDLEWARE_OWN]
    for label in sorted(delta, key=lambda name: order.index(name) if name in order else 99):
        calls, nanoseconds = delta[label]
        ms_per_request = nanoseconds / 1e6 / completed
        rows.append(
            {
                "hook": label,
                "calls_per_request": calls / completed,
                "us_per_call": nanoseconds / 1e3 / max(calls, 1),
                "ms_per_request": ms_per_request,
                "share": ms_per_request / api_ms if api_ms > 0 else 0.0,
            }
        )
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    root, temporary = workdir(args.workdir, "warden-api-cpu-")
    try:
        model = tiny_model(root, args.model)
        split = cpu_split(args.client_cpus)
        env = probe_env(root, args.hook)
        meters_dir = Path(env[api_cpu_probe.PROBE_DIR_ENV])
        results: dict[str, Any] = {
            "machine": machine(),
            "variant": args.variant,
            "rate": args.rate,
            "max_num_seqs": args.max_num_seqs,
            "rounds": [],
        }
        spec = engine_args(args.max_num_seqs)
        variant = VARIANTS[args.variant]
        with serving_engine(variant, model, root / args.variant, env, split, spec) as engine:
            bench_serve(engine.base_url, model, None, WARM_REQUESTS, root / "warm.json", None, 8)
            time.sleep(args.settle_s)
            cpu, pid = EngineCpu(engine), engine.process.pid
            for index in range(args.rounds):
                before = fresh_meters(meters_dir, pid, 2 * api_cpu_probe.WRITE_EVERY_S)
                api_before = cpu.read()["api"]
                out = root / f"round{index}.json"
                found = bench_serve(engine.base_url, model, args.rate, args.requests, out, None)
                after = fresh_meters(meters_dir, pid, 2 * api_cpu_probe.WRITE_EVERY_S)
                api_after = cpu.read()["api"]  # as just after ``before``: the same span
                completed = max(int(found["completed"]), 1)
                api_ms = (api_after - api_before) * 1e3 / completed
                rows = breakdown(before, after, completed, api_ms)
                results["rounds"].append(
                    {"completed": completed, "failed": found["failed"], "api_ms": api_ms,
                     "hooks": rows}
                )  # fmt: skip
                log(f"round {index + 1}: API {api_ms:.2f} ms/request, {completed} completed")
        return results
    finally:
        cleanup(root, temporary)


def report(results: dict[str, Any]) -> str:
    lines = []
    for index, found in enumerate(results["rounds"]):
        lines.append(
            f"{results.get('variant', 'warden')} round {index + 1}: "
            f"{found['completed']} requests at {results['rate']:g}/s, "
            f"a batch of {results['max_num_seqs']}, "
            f"API server {found['api_ms']:.2f} ms CPU/request"
        )
        rows = [
            [
                row["hook"],
                f"{row['calls_per_request']:.2f}",
                f"{row['us_per_call']:.1f}",
                f"{row['ms_per_request']:.3f}",
                f"{100 * row['share']:.2f}%",
            ]
            for row in found["hooks"]
        ]
        headers = ["hook", "calls/request", "us/call", "ms/request", "of API CPU"]
        lines.append(table(headers, rows))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant",
        choices=("warden", "plain"),
        default="warden",
        help="the engine metered (plain: its garbage collection only)",
    )
    parser.add_argument("--rate", type=float, default=10.0, help="requests/s offered")
    parser.add_argument("--requests", type=int, default=300, help="requests per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=BATCH, help="the engine's batch")
    parser.add_argument("--settle-s", type=float, default=5.0, help="idle after the warm-up")
    add_probe_options(
        parser, "one more to meter: module:function or module:Class.method (repeatable)"
    )
    args = parser.parse_args(argv)
    if min(args.rate, args.requests, args.rounds, args.max_num_seqs) <= 0 or args.settle_s < 0:
        parser.error("--rate, --requests, --rounds, --max-num-seqs must be positive")
    try:
        cpu_split(args.client_cpus)
        for hook in args.hook:
            api_cpu_probe.parse_hook(hook)
    except ValueError as error:
        print(f"api_cpu_breakdown: {error}", file=sys.stderr)
        return 2
    exit_on_sigterm()
    results = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
