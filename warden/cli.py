"""The ``warden`` command line."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATORS = ("alerts.generate", "dashboards.generate", "warden.stack.generate")


def cmd_model_tiny(args: argparse.Namespace) -> int:
    from warden.tinymodel import build_tiny_model

    out = build_tiny_model(args.dir, seed=args.seed)
    print(out)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import logging
    import tempfile

    from warden.launch import LaunchSpec
    from warden.supervisor import Supervisor, SupervisorConfig
    from warden.supervisor_policy import Backoff

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
    control_port = None if args.supervisor_port < 0 else args.supervisor_port
    config = SupervisorConfig(
        max_restarts=args.max_restarts,
        window_s=args.restart_window_s,
        backoff=Backoff(args.backoff_base_s, args.backoff_max_s, args.backoff_reset_s),
        stall_grace_s=args.stall_grace_s,
        unhealthy_grace_s=args.unhealthy_grace_s,
        start_timeout_s=args.start_timeout_s,
        drain_timeout_s=args.drain_timeout_s,
        eager_fallback=not args.no_eager_fallback,
        reset_circuit=args.reset_circuit,
        clear_eager=args.clear_eager,
        control_host=args.supervisor_host,
        control_port=control_port,
        log_dir=Path(args.engine_log_dir) if args.engine_log_dir else None,
    )
    supervisor = Supervisor(spec, run_dir, config)
    supervisor.install_signal_handlers()
    return supervisor.run()


def render_generated() -> dict[str, str]:
    """Every generated file of the repo: path relative to the repo root -> content."""
    files: dict[str, str] = {}
    for module_name in GENERATORS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        files.update(module.render_all())
    return files


def cmd_generate(args: argparse.Namespace) -> int:
    root = Path(args.root)
    stale = []
    for relative, content in sorted(render_generated().items()):
        path = root / relative
        current = path.read_text() if path.exists() else None
        if current == content:
            continue
        if args.check:
            stale.append(relative)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(f"wrote {relative}")
    if stale:
        print("out of date (run `warden generate`):\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    return 0


def cmd_dashboards_render(args: argparse.Namespace) -> int:
    from dashboards.render import render_dashboards

    for path in render_dashboards(args.prometheus, Path(args.out), minutes=args.minutes):
        print(path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from warden.demo import run_demo

    return run_demo(args)


def cmd_up(args: argparse.Namespace) -> int:
    from warden.stack.up import run

    return run(args)


def cmd_chaos(args: argparse.Namespace) -> int:
    from warden.stack.chaos import run

    return run(args)


def cmd_pager(args: argparse.Namespace) -> int:
    from warden.stack.pager import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warden", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="build models for tests and demos")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    tiny = model_sub.add_parser("tiny", help="tiny random-weight Llama + local tokenizer")
    tiny.add_argument("dir")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=cmd_model_tiny)

    serve = sub.add_parser(
        "serve",
        help="run vLLM's OpenAI server with every warden hook, supervised",
        description="Warden options go before MODEL; everything after MODEL goes to vLLM.",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--print-command", action="store_true", help="print the vLLM command")
    serve.add_argument("--no-supervise", action="store_true", help="run vLLM once, no restarts")
    serve.add_argument("--run-dir", help="state file, metrics folder, caches (default: temp dir)")
    serve.add_argument("--engine-log-dir", help="write each vLLM start's output to a file here")
    serve.add_argument("--max-restarts", type=int, default=5, help="per window, then circuit")
    serve.add_argument("--restart-window-s", type=float, default=3600.0)
    serve.add_argument("--backoff-base-s", type=float, default=1.0)
    serve.add_argument("--backoff-max-s", type=float, default=60.0)
    serve.add_argument(
        "--backoff-reset-s", type=float, default=600.0, help="ready this long: backoff resets"
    )
    serve.add_argument(
        "--stall-grace-s", type=float, default=10.0, help="stalled this long: restart"
    )
    serve.add_argument(
        "--unhealthy-grace-s", type=float, default=15.0, help="engine dead this long: restart"
    )
    serve.add_argument("--start-timeout-s", type=float, default=900.0)
    serve.add_argument("--drain-timeout-s", type=float, default=120.0)
    serve.add_argument(
        "--no-eager-fallback",
        action="store_true",
        help="never restart with --enforce-eager (and leave eager mode kept from before)",
    )
    serve.add_argument("--clear-eager", action="store_true", help="leave kept eager mode")
    serve.add_argument("--reset-circuit", action="store_true", help="close an open circuit")
    serve.add_argument("--supervisor-host", default="127.0.0.1")
    serve.add_argument(
        "--supervisor-port",
        type=int,
        default=8001,
        help="supervisor control/liveness port (0: any free port, -1: none)",
    )
    serve.add_argument("model")
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, help="vLLM arguments")
    serve.set_defaults(func=cmd_serve)

    generate = sub.add_parser("generate", help="write rules, Alertmanager config, dashboards")
    generate.add_argument("--check", action="store_true", help="fail if a file is out of date")
    generate.add_argument("--root", default=str(REPO_ROOT))
    generate.set_defaults(func=cmd_generate)

    dashboards = sub.add_parser("dashboards", help="dashboard tools")
    dash_sub = dashboards.add_subparsers(dest="dashboards_command", required=True)
    render = dash_sub.add_parser("render", help="draw dashboards to PNG from a live Prometheus")
    render.add_argument(
        "--prometheus", default=os.environ.get("WARDEN_PROMETHEUS_URL", "http://127.0.0.1:9090")
    )
    render.add_argument("--out", default="dashboards/png")
    render.add_argument("--minutes", type=int, default=15)
    render.set_defaults(func=cmd_dashboards_render)

    degrade = sub.add_parser("degrade", help="manual degradation overrides on a running engine")
    from warden import degrade_cli

    degrade_cli.add_arguments(degrade)

    demo = sub.add_parser("demo", help="the main job: a real engine with warden, end to end")
    demo.add_argument("--workdir", default=str(REPO_ROOT / "run" / "demo"))
    demo.add_argument("--port", type=int, default=8000)
    demo.set_defaults(func=cmd_demo)

    from warden.stack import chaos, pager, up

    up_parser = sub.add_parser("up", help="the whole stack on this machine, until Ctrl-C")
    up.add_arguments(up_parser)
    up_parser.set_defaults(func=cmd_up)

    chaos_parser = sub.add_parser("chaos", help="break a local engine on purpose")
    chaos.add_arguments(chaos_parser)
    chaos_parser.set_defaults(func=cmd_chaos)

    pager_parser = sub.add_parser("pager", help="a local Alertmanager receiver that records pages")
    pager.add_arguments(pager_parser)
    pager_parser.set_defaults(func=cmd_pager)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
