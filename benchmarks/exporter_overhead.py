"""Generation throughput of vLLM with and without warden, on the same engine configuration.

Starts engines side by side on the tiny CPU model with identical engine arguments (the tests'
configuration plus ``--max-num-seqs 8``): by default ``plain`` vLLM with no warden hook at all
and ``warden`` with every hook ``warden serve`` wires (plugins, logits processor, worker
extension, middleware, multiprocess metrics; see benchmarks/common.py). Each is idle while
another is measured, so runs alternate: every round sends one batch of ``--concurrency``
concurrent completions (fixed prompt, ``max_tokens``, ``ignore_eos``, temperature 0) to each
engine, which engine goes first rotating from round to round, then a single request to each.

Per run: tokens/s = generated tokens / wall time; wall time / max_tokens (the engine's step
time, prefill and HTTP included); the CPU time of the API server, engine core and worker
processes per generated token; and how many cores everything else on the machine kept busy
meanwhile. Reported per engine: medians and quartiles; per round, the ratio of each engine's
tokens/s to the first engine's (median, IQR, a bootstrap 95% interval of the median), the
same over the quiet rounds only (others kept under a quarter of a core busy during both
runs), and the ratio of the fast runs (90th percentile of tokens/s).

On a shared 2-core machine the A/B cannot resolve a few percent, so warden's per-step work is
also timed in isolation first (in child processes, with and without multiprocess metrics):
the logits processor at the engine's batch and vocabulary (and at realistic vocabularies), the
stat logger with the reflex attached, and vLLM's own Prometheus logger, whose cost
``PROMETHEUS_MULTIPROC_DIR`` changes. Set against the plain engine's step time, that bounds
the loss from below.

With ``--profile S`` each engine is then driven alone for S seconds while py-spy samples its
three processes: busy samples per 1000 tokens per process, and the shares inside warden's own
code and inside prometheus_client's value store (multiprocess metrics).

Usage:  .venv/bin/python -m benchmarks.exporter_overhead [--rounds 80] [--max-tokens 128]
        [--variants plain,warden] [--profile 20] [--model DIR] [--budget-s 360]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import (
    VARIANTS,
    EngineCpu,
    bootstrap_median_ci,
    cleanup,
    exit_on_sigterm,
    log,
    machine,
    machine_busy_s,
    own_cpu_s,
    quantile,
    running_engines,
    summary,
    table,
    tiny_model,
    workdir,
)
from warden.supervisor.engine import EngineProcess

PROMPT = "memory watermark cache block engine request token prompt graph device"
METRICS = (
    "tok_s",
    "ms_per_step",
    "cpu_us_tok_api",
    "cpu_us_tok_core",
    "cpu_us_tok_worker",
    "foreign_cores",
)
QUIET_CORES = 0.25  # a round is quiet when others kept less than this many cores busy


def completion_body(model: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }


async def run_batch(
    client: httpx.AsyncClient,
    engine: EngineProcess,
    cpu: EngineCpu,
    model: str,
    concurrency: int,
    max_tokens: int,
) -> dict[str, float]:
    """``concurrency`` identical completions at once: throughput, step time, CPU per token."""
    body = completion_body(model, max_tokens)
    url = f"{engine.base_url}/v1/completions"
    cpu_before = cpu.read()
    busy_before, own_before = machine_busy_s(), own_cpu_s()
    started = time.perf_counter()
    responses = await asyncio.gather(*(client.post(url, json=body) for _ in range(concurrency)))
    wall = time.perf_counter() - started
    cpu_after = cpu.read()
    busy, own = machine_busy_s() - busy_before, own_cpu_s() - own_before
    tokens = 0
    for response in responses:
        response.raise_for_status()
        tokens += int(response.json()["usage"]["completion_tokens"])
    if tokens != concurrency * max_tokens:
        raise RuntimeError(f"expected {concurrency * max_tokens} tokens, got {tokens}")
    result = {"tok_s": tokens / wall, "ms_per_step": 1000 * wall / max_tokens}
    engine_cpu = 0.0
    for role in EngineCpu.ROLES:
        used = cpu_after.get(role, float("nan")) - cpu_before.get(role, float("nan"))
        result[f"cpu_us_tok_{role}"] = 1e6 * used / tokens
        engine_cpu += used
    # Cores kept busy by everything else on the machine meanwhile (other users' work).
    result["foreign_cores"] = max(0.0, busy - engine_cpu - own) / wall
    return result


async def measure(
    engines: dict[str, EngineProcess], model: str, args: argparse.Namespace
) -> dict[str, dict[str, list[dict[str, float]]]]:
    names = list(engines)
    cpus = {name: EngineCpu(engine) for name, engine in engines.items()}
    sizes = [args.concurrency] + ([1] if args.single else [])
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        str(c): {n: [] for n in names} for c in sizes
    }
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def one(name: str, c: int) -> dict[str, float]:
            return await run_batch(client, engines[name], cpus[name], model, c, args.max_tokens)

        for _ in range(args.warmup):
            for name in names:
                for c in sizes:
                    await one(name, c)
        deadline = time.monotonic() + args.budget_s
        for round_index in range(args.rounds):
            if time.monotonic() > deadline:
                log(f"time budget reached after {round_index} rounds")
                break
            shift = round_index % len(names)
            order = names[shift:] + names[:shift]
            for c in sizes:
                for name in order:
                    runs[str(c)][name].append(await one(name, c))
            if (round_index + 1) % 10 == 0:
                line = "; ".join(
                    f"c{c} " + " ".join(f"{n} {runs[str(c)][n][-1]['tok_s']:.0f}" for n in names)
                    for c in sizes
                )
                log(f"round {round_index + 1}: tok/s {line}")
    return runs


def analyse(runs: dict[str, dict[str, list[dict[str, float]]]], base: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size, by_name in runs.items():
        entry: dict[str, Any] = {"variants": {}, "vs_base": {}}
        for name, results in by_name.items():
            stats = {key: summary([r[key] for r in results]) for key in METRICS}
            stats["tok_s"]["p90"] = round(quantile([r["tok_s"] for r in results], 0.9), 1)
            entry["variants"][name] = stats
        baseline = by_name[base]
        for name, results in by_name.items():
            if name == base:
                continue
            pairs = list(zip(results, baseline, strict=False))
            ratios = [b["tok_s"] / a["tok_s"] for b, a in pairs]
            low, high = bootstrap_median_ci(ratios)
            quiet = [
                b["tok_s"] / a["tok_s"]
                for b, a in pairs
                if max(a["foreign_cores"], b["foreign_cores"]) < QUIET_CORES
            ]
            base_stats = entry["variants"][base]
            stats = entry["variants"][name]
            entry["vs_base"][name] = {
                "tok_s_ratio_per_round": summary(ratios),
                "tok_s_ratio_ci95": [round(low, 4), round(high, 4)],
                "tok_s_ratio_quiet_rounds": summary(quiet) if quiet else None,
                "tok_s_ratio_of_medians": round(
                    stats["tok_s"]["median"] / base_stats["tok_s"]["median"], 4
                ),
                "tok_s_ratio_fast_runs_p90": round(
                    stats["tok_s"]["p90"] / base_stats["tok_s"]["p90"], 4
                ),
                "step_delta_us_per_round": summary(
                    [1000 * (b["ms_per_step"] - a["ms_per_step"]) for b, a in pairs], 1
                ),
                # Means: CPU times come in 10 ms clock ticks, so per-run values are coarse.
                "cpu_delta_us_tok_mean": {
                    role: round(
                        stats[f"cpu_us_tok_{role}"]["mean"]
                        - base_stats[f"cpu_us_tok_{role}"]["mean"],
                        1,
                    )
                    for role in EngineCpu.ROLES
                },
            }
        out[size] = entry
    return out


def estimate(
    analysis: dict[str, Any], micro: dict[str, Any], size: str, base: str
) -> dict[str, float]:
    """Warden's per-step work at this batch size, timed in isolation, against the base engine's
    step time in its fast runs (90th percentile of tokens/s). Worker side: the logits
    processor, on the step's critical path. API side: warden's stat logger plus what
    multiprocess metrics add to vLLM's own logger; on 2 cores it takes CPU from the engine."""
    batch = int(size)
    on = micro["multiproc"]
    logits = on["logits_processor_apply_us"][f"{batch}x{on['vocab']}"]
    api = on["warden_stat_logger_record_us"] + (
        on["vllm_prometheus_record_us"] - micro["memory"]["vllm_prometheus_record_us"]
    )
    step_us = 1e6 * batch / analysis[size]["variants"][base]["tok_s"]["p90"]
    return {
        "base_step_us_fast_runs": round(step_us, 1),
        "worker_logits_processor_us": logits,
        "api_stat_loggers_us": round(api, 1),
        "worker_share_of_step": round(logits / step_us, 4),
        "all_share_of_step": round((logits + api) / step_us, 4),
    }


def markdown(analysis: dict[str, Any], base: str) -> str:
    rows = []
    for size, entry in analysis.items():
        for name, stats in entry["variants"].items():
            versus = entry["vs_base"].get(name)
            if versus is None:
                ratio = fast = quiet = "1 (base)"
                delta = ""
            else:
                r, ci = versus["tok_s_ratio_per_round"], versus["tok_s_ratio_ci95"]
                ratio = (
                    f"{r['median']:.3f} (IQR {r['p25']:.3f}-{r['p75']:.3f}; "
                    f"CI {ci[0]:.3f}-{ci[1]:.3f})"
                )
                fast = f"{versus['tok_s_ratio_fast_runs_p90']:.3f}"
                q = versus["tok_s_ratio_quiet_rounds"]
                quiet = "no quiet round" if q is None else f"{q['median']:.3f} (n={q['n']})"
                delta = f"{versus['step_delta_us_per_round']['median']:+.0f}"
            rows.append(
                [
                    size,
                    name,
                    round(stats["tok_s"]["median"]),
                    f"{round(stats['tok_s']['p25'])}-{round(stats['tok_s']['p75'])}",
                    round(stats["tok_s"]["p90"]),
                    ratio,
                    fast,
                    quiet,
                    round(stats["ms_per_step"]["median"], 3),
                    delta,
                    " / ".join(
                        str(round(stats[f"cpu_us_tok_{role}"]["mean"])) for role in EngineCpu.ROLES
                    ),
                    round(stats["foreign_cores"]["median"], 2),
                ]
            )
    headers = [
        "concurrent",
        "engine",
        "tok/s median",
        "tok/s IQR",
        "tok/s p90",
        f"ratio to {base}, per round: median (IQR; 95% CI)",
        "ratio of p90s",
        f"ratio, quiet rounds (others < {QUIET_CORES} cores)",
        "ms/step",
        "step delta us",
        "CPU us/token (mean) api / core / worker",
        "others' cores busy",
    ]
    return table(headers, rows)


# --- profile ------------------------------------------------------------------------------

_OURS = re.compile(r"\((exporter|warden)/")
# Frames of the server warden wraps: below the middleware, the whole request is vLLM's work.
_APP = re.compile(r"\((vllm|fastapi|starlette|uvicorn|prometheus_fastapi_instrumentator)/")
_METRICS_STORE = re.compile(r"\(prometheus_client/(values|mmap_dict)\.py")
# Leaf frames of a thread that waits (py-spy can count a timed wait as active).
_WAITING = ("Event.wait", "Condition.wait", "time.sleep", "select", "poll", "epoll")


def profile(engine: EngineProcess, model: str, seconds: float, out: Path) -> dict[str, Any]:
    """Drive ``engine`` at batch 8 while py-spy samples it (50 Hz): per process, busy samples
    per 1000 generated tokens, warden's own share, and prometheus_client's value store share
    (where multiprocess metrics spend their time)."""
    spy = shutil.which("py-spy") or str(Path(__file__).resolve().parents[1] / ".venv/bin/py-spy")
    if not Path(spy).exists():
        return {"error": "py-spy not installed (pip install py-spy)"}
    assert engine.process is not None
    command = [spy, "record", "-p", str(engine.process.pid), "--subprocesses", "-r", "50"]
    command += ["-d", str(int(seconds)), "-f", "raw", "-o", str(out)]
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    tokens = [0]

    async def drive() -> None:
        body = completion_body(model, 128)
        url = f"{engine.base_url}/v1/completions"
        end = time.monotonic() + seconds
        async with httpx.AsyncClient(timeout=300) as client:

            async def loop() -> None:
                while time.monotonic() < end:
                    (await client.post(url, json=body)).raise_for_status()
                    tokens[0] += 128

            await asyncio.gather(*(loop() for _ in range(8)))

    time.sleep(1.0)  # py-spy attaches first
    asyncio.run(drive())
    try:
        recorder.wait(seconds + 60)
    except subprocess.TimeoutExpired:
        recorder.kill()
        return {"error": "py-spy did not finish"}
    result = summarize_profile(out)
    for role in result.values():
        role["samples_per_1k_tokens"] = round(1000 * role["samples"] / max(1, tokens[0]), 2)
    return {"tokens": tokens[0], "processes": result}


def summarize_profile(path: Path) -> dict[str, Any]:
    samples: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    metrics_store: collections.Counter[str] = collections.Counter()
    where: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        marks = [i for i, f in enumerate(frames) if f.startswith("process ")]
        if not marks or frames[-1].split(" ")[0] in _WAITING:
            continue
        head = frames[marks[-1]]
        title = head.partition(":")[2]
        role = {'"VLLM::EngineCore"': "core", '"VLLM::Worker"': "worker"}.get(title, "api")
        frames = frames[marks[-1] + 1 :]
        samples[role] += int(count)
        # Warden's own work: the innermost warden frame, unless it called back into the app.
        hits = [i for i, f in enumerate(frames) if _OURS.search(f)]
        if hits and not any(_APP.search(f) for f in frames[hits[-1] + 1 :]):
            ours[role] += int(count)
            where[role][re.sub(r" \(.*", "", frames[hits[-1]])] += int(count)
        if any(_METRICS_STORE.search(f) for f in frames):
            metrics_store[role] += int(count)
    return {
        role: {
            "samples": total,
            "warden_samples": ours[role],
            "warden_share": round(ours[role] / total, 4) if total else None,
            "warden_top": dict(where[role].most_common(6)),
            "prometheus_value_store_share": round(metrics_store[role] / total, 4)
            if total
            else None,
        }
        for role, total in samples.items()
    }


# --- warden's per-step work, timed in isolation ----------------------------------------------


def best_us(fn: Any, count: int, repeats: int = 7) -> float:
    """Microseconds per call: the best of ``repeats`` timed loops (least disturbed by others)."""
    for _ in range(max(10, count // 10)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(count):
            fn()
        best = min(best, (time.perf_counter() - started) / count)
    return round(1e6 * best, 2)


def micro(model: str, vocab: int, batch: int) -> dict[str, Any]:
    """Per-step costs of the step hooks, in this process (metrics as its environment says)."""
    import types

    import torch
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats
    from vllm.v1.sample.logits_processor import BatchUpdate

    from exporter.logits import NonFiniteLogitsProcessor
    from exporter.signals import SignalBoard
    from exporter.stat_logger import WardenStatLogger
    from warden.control.reflex import Reflex
    from warden.engine import runtime

    # One engine step at batch 8: scheduler numbers, 8 tokens, their inter-token latencies.
    stats = SchedulerStats(num_running_reqs=8, num_waiting_reqs=0, kv_cache_usage=0.3)
    iteration = IterationStats()
    iteration.num_generation_tokens = 8
    iteration.inter_token_latencies_iter = [0.002] * 8
    out: dict[str, Any] = {}

    # vLLM's own Prometheus logger, which PROMETHEUS_MULTIPROC_DIR makes write to mmap files.
    config = EngineArgs(
        model=model, dtype="float32", max_model_len=512, enforce_eager=True, block_size=32
    ).create_engine_config()
    vllm_logger = PrometheusStatLogger(config, engine_indexes=[0])
    out["vllm_prometheus_record_us"] = best_us(lambda: vllm_logger.record(stats, iteration), 5000)
    # A step that finishes one request (its latency histograms are observed once).
    done = IterationStats()
    done.num_generation_tokens = 1
    done.finished_requests = [
        FinishedRequestStats(
            FinishReason.LENGTH, "r", 0.2, 12, 0, 128, 128, 0.001, 0.002, 0.2, 0.19, 0.0015
        )
    ]
    out["vllm_prometheus_record_finished_request_us"] = best_us(
        lambda: vllm_logger.record(stats, done), 3000
    )

    board = SignalBoard.create_for_process_tree()
    try:
        logger = WardenStatLogger(None)
        control = runtime.process_runtime().control
        assert logger.monitor is not None
        logger.monitor.add_listener(Reflex(control.config.reflex, control))
        out["warden_stat_logger_record_us"] = best_us(
            lambda: logger.record(stats, iteration), 20000
        )
        board.write(0, 0.5, 0.4, time.time())  # a fresh device sample, as a GPU worker writes
        out["warden_stat_logger_record_with_device_signal_us"] = best_us(
            lambda: logger.record(stats, iteration), 20000
        )
    finally:
        board.unlink()

    torch.set_num_threads(1)  # vLLM's CPU worker here: one OpenMP thread on its bound core
    out["torch_threads"] = 1
    out["vocab"] = vocab
    hf = types.SimpleNamespace(eos_token_id=2)
    fake = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf))
    params = SamplingParams(max_tokens=16, extra_args={"warden_rid": "warden-" + "0" * 32})
    shapes = {(1, vocab), (8, vocab), (batch, vocab), (8, 32000), (8, 128256), (64, 128256)}
    for rows, width in sorted(shapes):
        processor = NonFiniteLogitsProcessor(fake, torch.device("cpu"), False)
        added: list[Any] = [(i, params, [1, 2, 3], []) for i in range(rows)]
        processor.update_state(BatchUpdate(batch_size=rows, removed=[], added=added, moved=[]))
        logits = torch.randn(rows, width)
        count = max(20, int(2e7 / (rows * width)))
        key = f"{rows}x{width}"
        out.setdefault("logits_processor_apply_us", {})[key] = best_us(
            lambda p=processor, x=logits: p.apply(x), count
        )
        # vLLM's masks at work (allowed_token_ids, bad_words, a grammar bitmask): -inf in every
        # row but the last. Normal, so the same one-reduction path must hold.
        masked = logits.clone()
        masked[:-1, : max(1, width - 8)] = float("-inf")
        out.setdefault("logits_processor_apply_masked_us", {})[key] = best_us(
            lambda p=processor, x=masked: p.apply(x), count
        )
        # For scale: one pass over the same logits (a row sum), and the one reduction the
        # processor's common path is made of (row maxima, finiteness read on the host).
        out.setdefault("row_sum_us", {})[key] = best_us(lambda x=logits: x.sum(dim=1), count)
        out.setdefault("row_amax_isfinite_us", {})[key] = best_us(
            lambda x=logits: bool(torch.isfinite(x.amax(dim=-1)).all()), count
        )
    return out


def run_micro(model: str, batch: int) -> dict[str, Any]:
    """``micro`` in fresh interpreters: multiprocess metrics on (as on a warden server) and off."""
    import os
    import sys
    import tempfile

    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "benchmarks.exporter_overhead", "--micro-child"]
    command += ["--model", model, "--vocab", str(vocab), "--concurrency", str(batch)]
    out: dict[str, Any] = {}
    for mode in ("multiproc", "memory"):
        with tempfile.TemporaryDirectory(prefix="warden-micro-") as folder:
            child_env = {**env, "PROMETHEUS_MULTIPROC_DIR": folder} if mode == "multiproc" else env
            done = subprocess.run(
                command,
                env=child_env,
                cwd=root,
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds first")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--no-single",
        dest="single",
        action="store_false",
        help="skip the single-request (batch 1) runs",
    )
    parser.add_argument(
        "--variants",
        default="plain,warden",
        help=f"engines to compare, the first is the base; known: {', '.join(VARIANTS)}",
    )
    parser.add_argument("--profile", type=float, default=0.0, help="py-spy seconds (0: none)")
    parser.add_argument("--model", help="model dir (default: build the tiny model)")
    parser.add_argument("--budget-s", type=float, default=360.0, help="measurement time limit")
    parser.add_argument("--workdir", help="keep engine logs here")
    parser.add_argument("--out", help="write the JSON result here")
    parser.add_argument(
        "--omp-bind",
        default=None,
        help="VLLM_CPU_OMP_THREADS_BIND for every engine (e.g. 1: the worker on core 1)",
    )
    parser.add_argument("--no-micro", dest="micro", action="store_false")
    parser.add_argument(
        "--micro-only", action="store_true", help="only the per-step timings (no engines)"
    )
    parser.add_argument("--micro-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, default=1024, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.micro_child:
        print(json.dumps(micro(args.model, args.vocab, args.concurrency)))
        return 0
    exit_on_sigterm()

    variants = [VARIANTS[name] for name in args.variants.split(",")]
    base = variants[0].name
    work, temporary = workdir(args.workdir, "warden-exporter-bench-")
    log(f"work folder (engine logs): {work}")
    model = tiny_model(work, args.model)
    before = machine()
    extra = ["--max-num-seqs", str(max(8, args.concurrency))]
    spy: dict[str, Any] | None = None
    env = {"VLLM_CPU_OMP_THREADS_BIND": args.omp_bind} if args.omp_bind else None
    micro_result = run_micro(model, args.concurrency) if args.micro else None
    if args.micro_only:
        print(json.dumps({"machine": before, "per_step_micro": micro_result}, indent=1))
        cleanup(work, temporary)
        return 0
    with running_engines(variants, model, work, extra_args=extra, env=env) as engines:
        started = time.monotonic()
        runs = asyncio.run(measure(engines, model, args))
        measured_s = time.monotonic() - started
        after = machine()["loadavg"]
        if args.profile > 0:
            spy = {}
            for name in engines:
                log(f"profiling {name} for {args.profile:.0f}s")
                folder = Path(args.out).parent if args.out else work
                raw = folder / f"py-spy-{name}.txt"
                spy[name] = profile(engines[name], model, args.profile, raw)
    analysis = analyse(runs, base)
    estimates = {}
    if micro_result is not None:
        estimates = {size: estimate(analysis, micro_result, size, base) for size in analysis}
    result = {
        "machine": before,
        "loadavg_at_end": after,
        "measured_s": round(measured_s),
        "settings": {
            "rounds": len(next(iter(next(iter(runs.values())).values()))),
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "engine_args": ["<tests' BASE_ARGS>", *extra],
            "omp_bind": args.omp_bind or "auto",
        },
        "per_step_micro": micro_result,
        "analysis": analysis,
        "per_step_estimate": estimates,
        "profile": spy,
        "runs": runs,
    }
    cleanup(work, temporary)  # kept when something failed: the engine logs are there
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    print(markdown(result["analysis"], base))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
