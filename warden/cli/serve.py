"""``warden serve MODEL [vLLM args]``: vLLM with every warden hook, under the supervisor.

The supervisor's options and their defaults come from ``SupervisorConfig``; this module only
adds the serving address and the modes that skip supervision (print the command, run once).
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import tempfile
from pathlib import Path

from warden.engine.launch import LaunchSpec
from warden.supervisor.config import SupervisorConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--print-command", action="store_true", help="print the vLLM command")
    parser.add_argument("--no-supervise", action="store_true", help="run vLLM once, no restarts")
    parser.add_argument("--run-dir", help="state file, metrics folder, caches (default: temp dir)")
    SupervisorConfig.add_arguments(parser)
    parser.add_argument("model")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="vLLM arguments")


def serve(args: argparse.Namespace) -> int:
    from warden.supervisor.loop import Supervisor

    extra = list(args.vllm_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    spec = LaunchSpec(args.model, host=args.host, port=args.port, extra_args=extra)
    if args.print_command:
        print(" ".join(spec.argv()))
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
