"""``warden up``: the stack in the foreground until Ctrl-C (or SIGTERM) stops all of it."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from warden.engine.launch import vllm_args
from warden.stack.config import DEFAULT_WORKDIR, Intervals

if TYPE_CHECKING:
    from warden.stack.native import StackSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model dir or name (default: build the tiny model)")
    parser.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help="configs, data, logs")
    parser.add_argument("--host", default="127.0.0.1", help="address every server binds")
    parser.add_argument("--engine-port", type=int, default=8000)
    parser.add_argument("--supervisor-port", type=int, default=8001, help="warden serve control")
    parser.add_argument(
        "--no-supervise", action="store_true", help="run vLLM once: no restarts after a crash"
    )
    parser.add_argument(
        "--reset-circuit", action="store_true", help="close a restart circuit left open before"
    )
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--alertmanager-port", type=int, default=9093)
    parser.add_argument("--grafana-port", type=int, default=3000)
    parser.add_argument("--pager-port", type=int, default=9099)
    parser.add_argument("--scrape-interval", default=Intervals.scrape, help="e.g. 5s, 1s")
    parser.add_argument("--evaluation-interval", default=Intervals.evaluation)
    parser.add_argument(
        "--chaos",
        action="store_true",
        help="let `warden chaos nan --inject nan|inf` poison logits "
        "(WARDEN_TEST_INJECT_NONFINITE=1); test only",
    )
    parser.add_argument("--otlp-endpoint", help="OTLP/HTTP collector for vLLM's request traces")
    parser.add_argument("--no-grafana", action="store_true", help="do not start Grafana")
    parser.add_argument(
        "--engine-url", help="use an engine that is already running instead of starting one"
    )
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then vLLM's arguments")


# warden up's option for each flag warden sets on vLLM itself.
UP_OWN_OPTIONS = {"--model": "--model", "--host": "--host", "--port": "--engine-port"}


def settings_from_args(args: argparse.Namespace) -> StackSettings:
    from warden.stack.native import StackSettings

    extra = vllm_args(args.vllm_args, "warden up", UP_OWN_OPTIONS)
    return StackSettings(
        workdir=Path(args.workdir),
        model=args.model,
        engine_args=extra or None,
        host=args.host,
        engine_port=args.engine_port,
        supervisor_port=args.supervisor_port,
        supervise=not args.no_supervise,
        reset_circuit=args.reset_circuit,
        prometheus_port=args.prometheus_port,
        alertmanager_port=args.alertmanager_port,
        grafana_port=args.grafana_port,
        pager_port=args.pager_port,
        intervals=Intervals(args.scrape_interval, args.evaluation_interval),
        inject_faults=args.chaos,
        otlp_endpoint=args.otlp_endpoint,
        with_grafana=not args.no_grafana,
        engine_url=args.engine_url,
    )


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run(args: argparse.Namespace) -> int:
    """Start, report where everything is, watch the children, stop all on a signal."""
    from warden.engine.launch import VllmArgsError
    from warden.stack.native import NativeStack, StackError

    try:
        settings = settings_from_args(args)
    except VllmArgsError as exc:
        print(exc)
        return 2
    stack = NativeStack(settings)
    # Both explicitly: a shell starting us in the background may have set SIGINT to ignored.
    previous = {signum: signal.signal(signum, _interrupt) for signum in STOP_SIGNALS}
    status = 0
    try:
        print(f"starting the warden stack in {stack.workdir} (Ctrl-C stops everything)")
        stack.start()
        print("\nthe warden stack is up:\n" + stack.summary() + "\n", flush=True)
        print(f"try: warden chaos pressure --engine-url {stack.engine_url}", flush=True)
        while True:
            dead = stack.exited()
            if dead:
                print(f"{', '.join(dead)} exited; stopping the stack (logs: {stack.logs_dir})")
                status = 1
                break
            time.sleep(1.0)
    except KeyboardInterrupt:
        print("\nstopping the warden stack ...", flush=True)
    except StackError as exc:
        print(f"warden up: {exc}")
        status = 2
    except Exception as exc:  # a child failed to start: say which and where its log is
        print(f"warden up: {exc}")
        status = 1
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup
        try:
            stack.stop()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    print("stopped: no child of warden up is running")
    return status
