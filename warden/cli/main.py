"""The ``warden`` command line."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from exporter.settings import SettingsError, load_settings

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATORS = (
    "alerts.generate",
    "dashboards.generate",
    "warden.stack.generate",
    "warden.cli.readme",
    "warden.cli.actions_doc",
)


def cmd_model_tiny(args: argparse.Namespace) -> int:
    from warden.common.tinymodel import build_tiny_model

    out = build_tiny_model(args.dir, seed=args.seed, nan_token=args.nan_token)
    print(out)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from warden.cli.serve import serve

    return serve(args)


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
    if args.config is not None:
        return generate_for_config(args)
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


def generate_for_config(args: argparse.Namespace) -> int:
    """Rules, Alertmanager config and dashboards for a user's mixin config, into --out."""
    from alerts.config import ConfigError, load_config
    from warden.cli.generate import render_mixin

    if args.out is None or args.check:
        print("warden generate: --config needs --out DIR (and no --check)", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"warden generate: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    for relative, content in sorted(render_mixin(config).items()):
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(f"wrote {path}")
    return 0


def cmd_dashboards_render(args: argparse.Namespace) -> int:
    from dashboards.render import RenderUnavailable, render_dashboards

    try:
        paths = render_dashboards(args.prometheus, Path(args.out), minutes=args.minutes)
    except RenderUnavailable as exc:
        print(f"warden dashboards render: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from warden.cli.demo import run_demo

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


def cmd_relay(args: argparse.Namespace) -> int:
    from warden.relay.cli import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warden", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="build models for tests and demos")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    tiny = model_sub.add_parser("tiny", help="tiny random-weight Llama + local tokenizer")
    tiny.add_argument("dir")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--nan-token",
        type=int,
        metavar="ID",
        help="weights that make NaN logits for any prompt containing this token id",
    )
    tiny.set_defaults(func=cmd_model_tiny)

    serve = sub.add_parser(
        "serve",
        help="run vLLM's OpenAI server with every warden hook, supervised",
        description="Warden options go before MODEL; everything after MODEL goes to vLLM.",
    )
    from warden.cli.serve import add_arguments as add_serve_arguments

    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)

    generate = sub.add_parser("generate", help="write rules, Alertmanager config, dashboards")
    generate.add_argument("--check", action="store_true", help="fail if a file is out of date")
    generate.add_argument("--root", default=str(REPO_ROOT))
    generate.add_argument(
        "--config",
        metavar="FILE",
        help="a mixin config (YAML: engine_selector, identity_labels, thresholds, links, "
        "receivers): generate rules, Alertmanager config and dashboards for it into --out",
    )
    generate.add_argument("--out", metavar="DIR", help="where --config writes its files")
    generate.set_defaults(func=cmd_generate)

    dashboards = sub.add_parser("dashboards", help="dashboard tools")
    dash_sub = dashboards.add_subparsers(dest="dashboards_command", required=True)
    render = dash_sub.add_parser("render", help="draw dashboards to PNG from a live Prometheus")
    render.add_argument("--prometheus", default=load_settings().prometheus_url)
    render.add_argument("--out", default="dashboards/png")
    render.add_argument("--minutes", type=int, default=15)
    render.set_defaults(func=cmd_dashboards_render)

    degrade = sub.add_parser("degrade", help="manual degradation overrides on a running engine")
    from warden.cli import degrade as degrade_cli

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

    from warden.relay import cli as relay_cli

    relay_parser = sub.add_parser(
        "relay", help="one Alertmanager receiver for a fleet: each alert to its own engine"
    )
    relay_cli.add_arguments(relay_parser)
    relay_parser.set_defaults(func=cmd_relay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except SettingsError as exc:  # a bad WARDEN_* variable: say which, no traceback
        print(f"warden: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
