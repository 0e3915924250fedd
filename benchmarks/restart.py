"""Crash-to-ready time of a supervised vLLM engine, and what it is spent on.

Starts ``warden serve``'s supervisor in-process on a real vLLM CPU engine, then, run after run,
SIGKILLs the engine core and waits until the restarted engine is ready again. The total is the
supervisor's own ``warden_engine_restart_duration_seconds`` observation (failure detected to
/health 200); the phases come from the moment each start-up milestone first appears in the
engine's log, tailed every 20 ms:

  detect       kill -9 until the supervisor noticed (process tree poll)
  respawn      noticed until the new vLLM process was started (kill group, backoff: 0 s)
  api_import   new process until the API server parsed its arguments (Python + vLLM imports)
  core_start   until the EngineCore process logged its config (spawn + imports)
  worker_start until the worker began loading the model (spawn + imports, device init)
  load         model weights loaded
  kv_warmup    KV cache allocated and the model warmed up (torch.compile when not eager)
  serve        until the API server said it serves (routes, plugins, tokenizer)
  ready        until /health answered the supervisor

Usage:  .venv/bin/python -m benchmarks.restart --runs 5 [--no-eager] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from exporter.supervisor_state import SupervisorState
from warden.common.ports import free_port
from warden.common.tinymodel import tiny_engine_args
from warden.common.waiting import wait_until
from warden.engine.launch import LaunchSpec
from warden.supervisor.config import SupervisorConfig
from warden.supervisor.engine import engine_children
from warden.supervisor.loop import Supervisor

MILESTONES: tuple[tuple[str, str], ...] = (
    ("api_import", "non-default args"),
    ("core_start", "Initializing a V1 LLM engine"),
    ("worker_start", "Starting to load model"),
    ("load", "Loading weights took"),
    ("kv_warmup", "init engine (profile, create kv cache, warmup model) took"),
    ("serve", "Starting vLLM server on"),
)
PHASES = ("detect", "respawn", *(name for name, _ in MILESTONES), "ready")


class LogTail:
    """First wall-clock time each milestone's text appears in a growing log file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        offset = 0
        buffer = ""
        while not self._stop.is_set():
            if self.path.exists():
                with open(self.path, errors="replace") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                    offset = handle.tell()
                buffer = (buffer + chunk)[-20000:]
                now = time.time()
                for name, text in MILESTONES:
                    if name not in self.seen and text in buffer:
                        self.seen[name] = now
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="warden-restart-bench-"))
    model = args.model
    if model is None:
        from warden.common.tinymodel import build_tiny_model

        model = str(build_tiny_model(work / "tiny-model"))
    engine_args = list(tiny_engine_args(drop=("--enforce-eager",) if args.no_eager else ()))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    spec = LaunchSpec(model, port=free_port(), extra_args=engine_args)
    config = SupervisorConfig(
        max_restarts=args.runs + 1,
        backoff_base_s=1.0,
        backoff_max_s=1.0,
        backoff_reset_s=0.0,
        control_port=None,
        poll_s=0.1,
        log_dir=work / "logs",
        eager_fallback=False,
    )
    supervisor = Supervisor(spec, work / "run", config)
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    state_path = supervisor.state_path
    runs: list[dict[str, float]] = []
    try:
        started = time.time()
        wait_until(supervisor.engine_ready, 900, 0.02, "first start")
        first_start_s = time.time() - started
        print(f"first start: {first_start_s:.1f}s", file=sys.stderr)
        for n in range(args.runs):
            generation = SupervisorState.load(state_path).generation
            server = supervisor.engine.pid if supervisor.engine else None
            assert server is not None
            core = next(p for p, r in engine_children(server).items() if r == "EngineCore")
            tail = LogTail(work / "logs" / f"engine-{generation + 1}.log")
            killed = time.time()
            os.kill(core, signal.SIGKILL)

            def restarted(generation: int = generation) -> bool:
                state = SupervisorState.load(state_path)
                return (
                    state.generation == generation + 1
                    and bool(state.restarts)
                    and state.restarts[-1].duration_s is not None
                )

            wait_until(restarted, 900, 0.1, f"restart {n + 1}")
            tail.stop()
            event = SupervisorState.load(state_path).restarts[-1]
            assert event.duration_s is not None
            ready_at = event.failed_at + event.duration_s
            marks = [event.failed_at, event.restarted_at]
            marks += [tail.seen.get(name, float("nan")) for name, _ in MILESTONES]
            marks.append(ready_at)
            phases = {"detect": event.failed_at - killed}
            pairs = zip(marks, marks[1:], strict=False)
            for name, (a, b) in zip(PHASES[1:], pairs, strict=True):
                phases[name] = b - a
            runs.append({"crash_to_ready_s": ready_at - killed, **phases})
            print(
                f"run {n + 1}: crash to ready {ready_at - killed:.1f}s "
                f"(supervisor's histogram: {event.duration_s:.1f}s)",
                file=sys.stderr,
            )
    finally:
        supervisor.stop()
        thread.join(60)
    return {
        "eager": not args.no_eager,
        "runs": runs,
        "first_start_s": round(first_start_s, 1),
        "cpus": os.cpu_count(),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "summary": summarize(runs),
    }


def summarize(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for key in ("crash_to_ready_s", *PHASES):
        values = [r[key] for r in runs if r[key] == r[key]]  # drop NaN (milestone missed)
        if values:
            out[key] = {
                "median": round(statistics.median(values), 2),
                "min": round(min(values), 2),
                "max": round(max(values), 2),
            }
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = ["| phase | median s | min s | max s |", "|---|---:|---:|---:|"]
    for key, stats in result["summary"].items():
        lines.append(f"| {key} | {stats['median']} | {stats['min']} | {stats['max']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", help="model dir (default: build the tiny model)")
    parser.add_argument("--no-eager", action="store_true", help="measure with torch.compile")
    parser.add_argument("--workdir", help="keep logs and state here")
    parser.add_argument("--out", help="write the JSON result here")
    args = parser.parse_args()
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
