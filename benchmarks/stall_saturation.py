"""No false stall verdict on a saturated engine: the engine container, long prompts, minutes.

Runs the engine container's entrypoint natively (``python -m warden.stack.container``, the
environment ``docker-compose config`` gives the engine, the tiny model with room for long
prompts), then keeps it saturated: more closed-loop clients than the batch holds, each always
with one request in flight (a 1200-token prompt, 256 generated tokens), so the batch stays
full, steps mix prefill chunks and decodes, and a queue waits behind them. Each busy step is
slowed by 20 ms (``WARDEN_TEST_STEP_DELAY_S``): the tiny model's steps take microseconds, and
on a CPU the API process would otherwise be the bottleneck, leaving the engine idle between
requests. Every half second
it reads ``/metrics`` (the stall gauge, the hang threshold in force, vLLM's running and waiting
counts) and ``/warden/ready``. At the end: the stall verdicts seen (must be 0), restarts (must
be 0), how often the batch was full, the threshold's range, requests and their latency. The
CI test (tests/test_container_engine.py) runs the same for 75 s.

Usage:  .venv/bin/python -m benchmarks.stall_saturation --seconds 300 [--clients 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from exporter import catalog
from tests.support.container import compose_engine_environment, start_container, stop_container
from warden.common.metrics_text import parse_samples, sample
from warden.common.tinymodel import tiny_engine_args
from warden.common.waiting import wait_until

MAX_NUM_SEQS = 8
VLLM_ARGS = " ".join(
    tiny_engine_args("--max-model-len", "2048", "--max-num-seqs", str(MAX_NUM_SEQS))
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--clients", type=int, default=MAX_NUM_SEQS + 2)
    parser.add_argument("--prompt-words", type=int, default=1200)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--step-delay-s",
        default="0.02",
        help="WARDEN_TEST_STEP_DELAY_S: slows each busy step so that the engine, not the API "
        "process, is the bottleneck on a CPU, as on a GPU (0: off)",
    )
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="warden-stall-saturation-"))
    env = compose_engine_environment(data_dir / "compose.env", {"WARDEN_VLLM_ARGS": VLLM_ARGS})
    token = data_dir / "token"
    token.write_text("benchmark-token")
    token.chmod(0o600)
    env["WARDEN_WEBHOOK_TOKEN_FILE"] = str(token)
    for name in [k for k in env if k.startswith("OTEL_")]:
        del env[name]  # no Tempo here
    env["WARDEN_TEST_STEP_DELAY_S"] = args.step_delay_s
    container = start_container(data_dir, env)
    model = str(data_dir / "tiny-model")
    url = container.url
    try:
        wait_until(
            lambda: (
                container.state().phase == "running"
                and httpx.get(f"{url}/health", timeout=5).status_code == 200
            ),
            600,
            1.0,
            "the engine serving",
        )
        generation = container.state().generation
        prompt = " ".join(["the"] * args.prompt_words)  # one token each
        deadline = time.monotonic() + args.seconds
        latencies: list[float] = []
        statuses: list[int | str] = []
        in_flight = [0]  # requests the clients have sent and not yet had answered
        lock = threading.Lock()

        def client(index: int) -> None:
            while time.monotonic() < deadline:
                started = time.monotonic()
                body = {
                    "model": model,
                    "prompt": f"{index} {prompt}",
                    "max_tokens": args.max_tokens,
                    "ignore_eos": True,
                }
                with lock:
                    in_flight[0] += 1
                try:
                    response = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
                    statuses.append(response.status_code)
                except httpx.HTTPError as exc:
                    statuses.append(type(exc).__name__)
                finally:
                    with lock:
                        in_flight[0] -= 1
                latencies.append(time.monotonic() - started)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for thread in threads:
            thread.start()
        readings: list[dict[str, Any]] = []
        failing_seen: set[str] = set()
        started = time.monotonic()
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                samples = parse_samples(httpx.get(f"{url}/metrics", timeout=10).text)
                ready = httpx.get(f"{url}/warden/ready", timeout=10).json()
                failing_seen.update(ready.get("failing", []))
                readings.append(
                    {
                        "t": round(time.monotonic() - started, 1),
                        "stalled": sample(samples, catalog.ENGINE_STALLED.name),
                        "threshold": sample(samples, catalog.ENGINE_HANG_THRESHOLD.name),
                        "running": sample(samples, catalog.VLLM_NUM_REQUESTS_RUNNING.name),
                        "waiting": sample(samples, catalog.VLLM_NUM_REQUESTS_WAITING.name),
                        "client_in_flight": in_flight[0],
                    }
                )
            time.sleep(0.5)
        for thread in threads:
            thread.join()
        thresholds = [r["threshold"] for r in readings]
        full = [r for r in readings if r["running"] + r["waiting"] >= MAX_NUM_SEQS]
        result = {
            "seconds": args.seconds,
            "clients": args.clients,
            "prompt_words": args.prompt_words,
            "max_tokens": args.max_tokens,
            "step_delay_s": float(args.step_delay_s),
            "requests": len(statuses),
            "statuses": {str(s): statuses.count(s) for s in set(statuses)},
            "latency_s": {
                "p50": round(statistics.median(latencies), 2) if latencies else None,
                "max": round(max(latencies), 2) if latencies else None,
            },
            "readings": len(readings),
            "batch_full_readings": len(full),
            "client_in_flight_median": statistics.median(r["client_in_flight"] for r in readings)
            if readings
            else None,
            "stall_verdicts": sum(1 for r in readings if r["stalled"] == 1),
            "readiness_failing_seen": sorted(failing_seen),
            "restarts": container.state().generation - generation,
            "hang_threshold_s": {"min": min(thresholds), "max": max(thresholds)}
            if thresholds
            else None,
        }
        print(json.dumps(result, indent=2))
        ok = result["stall_verdicts"] == 0 and result["restarts"] == 0
        return 0 if ok else 1
    finally:
        stop_container(container, set())


if __name__ == "__main__":
    sys.exit(main())
