"""What warden's admission/retry middleware adds to each request, in-process and end to end.

(a) In-process. The real ``WardenMiddleware`` wrapped around a trivial ASGI app that reads the
request body and answers a fixed completion JSON (or, streaming, 16 SSE chunks), against the
trivial app alone, both called directly as ASGI callables (no server, no sockets): blocks of
requests alternate between the two, and the per-request time difference is the middleware's
own cost. The middleware builds its runtime through ``warden.engine.runtime.process_runtime()``
from ``WARDEN_CONFIG`` (unset here: the defaults, forecast on). No engine client is attached,
so the KV forecast is skipped (no tokenizer call, no KV arithmetic): on a real server a
completion's prompt is also tokenized once per request when the forecast is on. Each registry
mode runs in its own child process, since prometheus_client picks its value store at import:
``memory`` (plain vLLM's global registry) and ``multiproc`` (``PROMETHEUS_MULTIPROC_DIR`` set,
as ``warden serve`` runs vLLM: every counter increment writes to an mmap'ed file).

Scenarios: a completion; a chat completion; a streamed completion (16 chunks); a completion
under a max_tokens cap lease (the body is rewritten); ``forecast``, a completion with the KV
forecast on as on a server (the tiny model's real tokenizer counts the prompt; the engine
client and the step monitor that report the cache's geometry and use are stand-ins, so only
the forecast's own work is timed); GET /health (passes straight through);
and, last, a completion while 1 000 and then 10 000 resolved alerts are remembered (the lease
table keeps a tombstone per resolved fingerprint for ``webhook.tombstone_ttl_s``, 24 h by
default; until commit ad0a25d every policy read scanned them all).

(b) End to end (``--e2e``, on by default). Real engines on the tiny CPU model, side by side:
``plain`` vLLM, ``warden_no_middleware`` (every warden hook except the middleware) and
``warden``; sequential ``max_tokens: 1`` completions, engines taking turns in small blocks;
latency p50/p90 per engine.

Usage:  .venv/bin/python -m benchmarks.middleware_overhead [--rounds 40] [--block 500]
        [--clock wall|cpu] [--no-e2e] [--e2e-rounds 40] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    VARIANTS,
    EngineCpu,
    cleanup,
    exit_on_sigterm,
    log,
    machine,
    quantile,
    running_engines,
    summary,
    table,
    tiny_model,
    workdir,
)

Message = dict[str, Any]
App = Callable[[dict[str, Any], Callable[[], Awaitable[Message]], Any], Awaitable[None]]

COMPLETION = json.dumps(
    {
        "id": "cmpl-0123456789abcdef",
        "object": "text_completion",
        "created": 1763770000,
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "text": " cache block engine request token prompt graph device allocator stall",
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 12, "total_tokens": 140, "completion_tokens": 128},
    }
).encode()
CHUNK = (
    b'data: {"id":"cmpl-0123456789abcdef","object":"text_completion","created":1763770000,'
    b'"model":"tiny","choices":[{"index":0,"text":" cache","logprobs":null,'
    b'"finish_reason":null}]}\n\n'
)
PROMPT = "memory watermark cache block engine request token prompt graph device"


async def trivial_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Stands in for vLLM: reads the body, answers a fixed completion (or a 16-chunk stream)."""
    if scope["method"] == "POST":
        more = True
        body = b""
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if b'"stream": true' in body:
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for _ in range(16):
                await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(COMPLETION)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": COMPLETION})


def request(path: str, body: dict[str, Any] | None) -> tuple[dict[str, Any], bytes]:
    payload = json.dumps(body).encode() if body is not None else b""
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"user-agent", b"python-httpx/0.28.1"),
        (b"accept", b"*/*"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST" if body is not None else "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    return scope, payload


SCENARIOS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "completion": (
        "/v1/completions",
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 128, "temperature": 0},
    ),
    "chat": (
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": PROMPT},
            ],
            "max_tokens": 128,
        },
    ),
    "stream": (
        "/v1/completions",
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 16, "stream": True},
    ),
    "capped": (
        "/v1/completions",
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 4096, "temperature": 0},
    ),
    "forecast": (
        "/v1/completions",
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 128, "temperature": 0},
    ),
    "health": ("/health", None),
}
# Resolved alerts remembered (one tombstone per fingerprint): run last, in this order.
TOMBSTONES = {"tombstones_1k": 1_000, "tombstones_10k": 10_000}
for _name in TOMBSTONES:
    SCENARIOS[_name] = SCENARIOS["completion"]


async def call(app: App, scope: dict[str, Any], payload: bytes) -> int:
    sent = False
    status = 0

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await asyncio.sleep(3600)  # a client that stays connected
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    await app(scope, receive, send)
    return status


# The in-process part's clock: wall time, or the process's CPU time (every thread's), which
# preemption by other processes on a busy machine does not inflate.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


async def time_block(app: App, scope: dict[str, Any], payload: bytes, count: int) -> float:
    """Microseconds per request over ``count`` sequential requests."""
    started = clock()
    for _ in range(count):
        status = await call(app, scope, payload)
        if status != 200:
            raise RuntimeError(f"{scope['path']} answered {status}")
    return 1e6 * (clock() - started) / count


class StandInEngine:
    """What the forecast asks of vLLM's engine client: its tokenizer and the cache geometry."""

    def __init__(self, tokenizer: Any) -> None:
        from types import SimpleNamespace

        self.tokenizer = tokenizer
        cache = SimpleNamespace(num_gpu_blocks=48, block_size=16)
        self.vllm_config = SimpleNamespace(cache_config=cache, scheduler_config=None)

    def get_tokenizer(self) -> Any:
        return self.tokenizer


def attach_forecast(control: Any) -> None:
    """The tiny model's tokenizer behind a stand-in engine, and a step monitor's snapshot."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    import exporter.step_monitor as step_monitor
    from warden.common.tinymodel import build_tiny_model

    folder = tempfile.mkdtemp(prefix="warden-mw-bench-model-")
    tokenizer = AutoTokenizer.from_pretrained(str(build_tiny_model(Path(folder) / "tiny")))
    control.engine_client = StandInEngine(tokenizer)
    monitor = SimpleNamespace(snapshot=SimpleNamespace(kv_cache_usage=0.1))
    step_monitor._monitor = monitor  # type: ignore[assignment]


def setup_scenario(name: str, middleware: Any) -> None:
    from warden.control.actions import parse_action
    from warden.control.controller import ALERTMANAGER

    control = middleware.control
    if name == "forecast":
        attach_forecast(control)
    elif name == "capped":
        control.set_manual("bench-cap", parse_action("cap_max_tokens", {"max_tokens": 256}), 3600)
    elif name in TOMBSTONES:
        now = time.time()
        for index in range(TOMBSTONES[name]):  # cumulative: the same keys are only renewed
            control.leases.release(ALERTMANAGER, f"fp-{index:016x}", now, started_at=now - 60)
        control.policy()


def teardown_scenario(name: str, middleware: Any) -> None:
    if name == "forecast":
        import exporter.step_monitor as step_monitor

        middleware.control.engine_client = None
        step_monitor._monitor = None
    elif name == "capped":
        middleware.control.clear_manual("bench-cap")


async def inprocess(rounds: int, block: int) -> dict[str, Any]:
    from warden.engine.middleware import WardenMiddleware

    warden = WardenMiddleware(trivial_app)
    assert warden.control.engine_client is None  # hence: no KV forecast but in "forecast"
    results: dict[str, Any] = {}
    for name, (path, body) in SCENARIOS.items():
        scope, payload = request(path, body)
        setup_scenario(name, warden)
        apps: dict[str, App] = {"bare": trivial_app, "warden": warden}
        for app in apps.values():  # warm-up
            await time_block(app, scope, payload, max(50, block // 10))
        times: dict[str, list[float]] = {"bare": [], "warden": []}
        for index in range(rounds):
            order = ["bare", "warden"] if index % 2 == 0 else ["warden", "bare"]
            for which in order:
                times[which].append(await time_block(apps[which], scope, payload, block))
        teardown_scenario(name, warden)
        deltas = [w - b for w, b in zip(times["warden"], times["bare"], strict=True)]
        results[name] = {
            "bare_us": summary(times["bare"], 2),
            "warden_us": summary(times["warden"], 2),
            "delta_us_per_round": summary(deltas, 2),
            "ratio": round(
                statistics.median(times["warden"]) / statistics.median(times["bare"]), 2
            ),
        }
    return results


def run_child(registry: str, rounds: int, block: int, clock_name: str = "wall") -> dict[str, Any]:
    """The in-process part in a fresh interpreter, with the chosen prometheus value store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with tempfile.TemporaryDirectory(prefix="warden-mw-bench-") as folder:
        if registry == "multiproc":
            env["PROMETHEUS_MULTIPROC_DIR"] = folder
        command = [sys.executable, "-m", "benchmarks.middleware_overhead", "--child"]
        command += ["--rounds", str(rounds), "--block", str(block), "--clock", clock_name]
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(
            command, env=env, cwd=root, capture_output=True, text=True, timeout=600, check=True
        )
    return dict(json.loads(out.stdout))


# --- end to end ---------------------------------------------------------------------------


def e2e(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import httpx

    names = args.e2e_variants.split(",")
    model = tiny_model(work, args.model)
    latencies: dict[str, list[float]] = {n: [] for n in names}
    medians: dict[str, list[float]] = {n: [] for n in names}
    api_cpu_s = {n: 0.0 for n in names}
    with running_engines([VARIANTS[n] for n in names], model, work) as engines:
        cpus = {n: EngineCpu(engines[n]) for n in names}
        body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
        with httpx.Client(timeout=60) as client:

            def one(name: str) -> float:
                started = time.perf_counter()
                response = client.post(f"{engines[name].base_url}/v1/completions", json=body)
                took = time.perf_counter() - started
                response.raise_for_status()
                return took

            for name in names:  # warm-up
                for _ in range(20):
                    one(name)
            deadline = time.monotonic() + args.e2e_budget_s
            for index in range(args.e2e_rounds):
                if time.monotonic() > deadline:
                    log(f"e2e: time budget reached after {index} rounds")
                    break
                shift = index % len(names)
                for name in names[shift:] + names[:shift]:
                    before = cpus[name].read()["api"]
                    block = [one(name) for _ in range(args.e2e_block)]
                    api_cpu_s[name] += cpus[name].read()["api"] - before
                    latencies[name].extend(block)
                    medians[name].append(statistics.median(block))
    base = names[0]
    out: dict[str, Any] = {}
    for name in names:
        ms = [1000 * x for x in latencies[name]]
        entry: dict[str, Any] = {
            "n": len(ms),
            "p50_ms": round(quantile(ms, 0.5), 3),
            "p90_ms": round(quantile(ms, 0.9), 3),
            "p99_ms": round(quantile(ms, 0.99), 3),
            "api_cpu_us_per_request": round(1e6 * api_cpu_s[name] / len(ms), 1),
        }
        if name != base:
            deltas = [1000 * (m - b) for m, b in zip(medians[name], medians[base], strict=False)]
            entry["delta_ms_vs_" + base + "_per_round"] = summary(deltas, 3)
        out[name] = entry
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="in-process: blocks per side")
    parser.add_argument("--block", type=int, default=500, help="in-process: requests per block")
    parser.add_argument("--registries", default="memory,multiproc", help="empty: skip (a)")
    parser.add_argument("--no-e2e", dest="e2e", action="store_false")
    parser.add_argument("--e2e-variants", default="plain,warden_no_middleware,warden")
    parser.add_argument("--e2e-rounds", type=int, default=40)
    parser.add_argument("--e2e-block", type=int, default=25, help="requests per engine turn")
    parser.add_argument("--e2e-budget-s", type=float, default=300.0)
    parser.add_argument("--model", help="model dir (default: build the tiny model)")
    parser.add_argument("--workdir", help="keep engine logs here")
    parser.add_argument("--out", help="write the JSON result here")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="in-process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    global clock
    clock = CLOCKS[args.clock]
    if args.child:
        print(json.dumps(asyncio.run(inprocess(args.rounds, args.block))))
        return 0
    exit_on_sigterm()

    result: dict[str, Any] = {"machine": machine(), "inprocess": {}}
    for registry in filter(None, args.registries.split(",")):
        log(f"in-process, {registry} registry: {args.rounds} x {args.block} requests per side")
        result["inprocess"][registry] = run_child(registry, args.rounds, args.block, args.clock)
    if args.e2e:
        work, temporary = workdir(args.workdir, "warden-middleware-bench-")
        log(f"work folder (engine logs): {work}")
        result["e2e"] = e2e(args, work)
        cleanup(work, temporary)
    result["loadavg_at_end"] = machine()["loadavg"]
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    rows = []
    for registry, scenarios in result["inprocess"].items():
        for name, s in scenarios.items():
            d = s["delta_us_per_round"]
            rows.append(
                [
                    registry,
                    name,
                    s["bare_us"]["median"],
                    s["warden_us"]["median"],
                    f"{d['median']} ({d['p25']}-{d['p75']})",
                    s["ratio"],
                ]
            )
    headers = ["registry", "scenario", "bare us/req", "warden us/req", "delta us (IQR)", "ratio"]
    print(table(headers, rows))
    if "e2e" in result:
        rows = []
        for name, s in result["e2e"].items():
            delta = next((v for k, v in s.items() if k.startswith("delta_ms")), None)
            rows.append(
                [
                    name,
                    s["n"],
                    s["p50_ms"],
                    s["p90_ms"],
                    s["p99_ms"],
                    "" if delta is None else f"{delta['median']:+.3f}",
                    s["api_cpu_us_per_request"],
                ]
            )
        headers = ["engine", "requests", "p50 ms", "p90 ms", "p99 ms", "delta p50 ms"]
        print(table([*headers, "API server CPU us/request"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
