"""``warden serve [options] MODEL [--] [vLLM args]``: vLLM with every warden hook, supervised.

The supervisor's options and their defaults come from ``SupervisorConfig``; this module only
adds the serving address, the modes that skip supervision (print the command, run once), and
what a first run needs: vLLM's arguments taken the same way as ``warden up`` takes them (an
optional ``--`` before them), and on a CPU host a KV cache size vLLM can start with.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from warden.engine.launch import LaunchSpec, VllmArgsError, vllm_args
from warden.supervisor import cpu_memory
from warden.supervisor.config import SupervisorConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--print-command", action="store_true", help="print the vLLM command")
    parser.add_argument("--no-supervise", action="store_true", help="run vLLM once, no restarts")
    parser.add_argument("--run-dir", help="state file, metrics folder, caches (default: temp dir)")
    SupervisorConfig.add_arguments(parser)
    parser.add_argument("model")
    parser.add_argument(
        "vllm_args", nargs=argparse.REMAINDER, help="vLLM's arguments (optionally after --)"
    )


def cpu_environment(extra: list[str]) -> dict[str, str]:
    """On a CPU host whose operator did not size vLLM's memory, a KV cache that lets it start
    (said on stderr); raises CpuMemoryError when nothing can."""
    env = os.environ
    if not cpu_memory.is_cpu_build(env) or cpu_memory.sized_by_operator(env, extra):
        return {}
    available, total = cpu_memory.memory_now()
    default = cpu_memory.kv_cache_default(env, extra, available, total)
    if default is None:
        return {}
    print(f"warden serve: {default.reason}", file=sys.stderr, flush=True)
    return {cpu_memory.KV_ENV: str(default.gib)}


def serve(args: argparse.Namespace) -> int:
    from warden.supervisor.loop import Supervisor

    try:
        extra = vllm_args(args.vllm_args)
        env = cpu_environment(extra)
    except VllmArgsError as exc:
        print(exc, file=sys.stderr)
        return 2
    except cpu_memory.CpuMemoryError as exc:
        print(f"warden serve: {exc}", file=sys.stderr)
        return 2
    spec = LaunchSpec(args.model, host=args.host, port=args.port, extra_args=extra, env=env)
    if args.print_command:
        assignments = [f"{name}={shlex.quote(value)}" for name, value in env.items()]
        print(" ".join([*assignments, *map(shlex.quote, spec.argv())]))
        return 0
    if args.no_supervise:
        process = subprocess.Popen(spec.argv(), env=spec.environment())

        def forward(signum: int, _frame: object) -> None:
            process.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        return process.wait()
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
        logging.getLogger("httpx").setLevel(logging.WARNING)
    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="warden-"))
    supervisor = Supervisor(spec, run_dir, SupervisorConfig.from_args(args))
    supervisor.install_signal_handlers()
    return supervisor.run()
