"""``warden relay``: run the fleet's Alertmanager receiver (see warden/relay/__init__.py)."""

from __future__ import annotations

import argparse
import sys

from alerts.config import DEFAULT, ConfigError, load_config
from exporter.settings import load_settings
from warden.common import tokens

DEFAULT_PORT = 9095


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--prometheus",
        metavar="URL",
        help="find engines in this Prometheus's active scrape targets (fleets that change)",
    )
    where.add_argument(
        "--engine-url-template",
        metavar="TEMPLATE",
        help="engine webhook URL from the alert's labels, e.g. "
        "'http://{instance}/warden/alertmanager' (static fleets, instance = host:port)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the mixin config the rules were generated from (engine_selector, identity_labels)",
    )
    parser.add_argument(
        "--refresh-s", type=float, default=15.0, help="how often to re-read the target list"
    )
    parser.add_argument("--attempts", type=int, default=3, help="tries per engine delivery")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=6.0,
        help="time for one notification's deliveries (keep it under Alertmanager's 10 s)",
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from prometheus_client import CollectorRegistry

    from warden.relay.deliver import DeliveryPolicy
    from warden.relay.directory import Directory, PrometheusTargets, UrlTemplate
    from warden.relay.server import Relay, build_app

    settings = load_settings()
    try:
        token = tokens.load_token(settings)
        config = load_config(args.config) if args.config else DEFAULT
    except (tokens.TokenError, ConfigError) as exc:
        print(f"warden relay: {exc}", file=sys.stderr)
        return 2
    if token is None and not settings.webhook_insecure:
        print(
            f"warden relay: no token: set {tokens.TOKEN_FILE_ENV} (the engines' webhook token; "
            f"or {tokens.INSECURE_ENV}=1 to relay without one)",
            file=sys.stderr,
        )
        return 2
    directory: Directory
    if args.prometheus:
        directory = PrometheusTargets(args.prometheus, config, refresh_s=args.refresh_s)
        where = f"engines: targets of {{{config.engine_selector}}} in {args.prometheus}"
    else:
        try:
            directory = UrlTemplate(args.engine_url_template)
        except ValueError as exc:
            print(f"warden relay: {exc}", file=sys.stderr)
            return 2
        where = f"engines: {args.engine_url_template}"
    policy = DeliveryPolicy(attempts=args.attempts, deadline_s=args.deadline_s)
    relay = Relay(directory, token, CollectorRegistry(), policy)
    print(
        f"warden relay on http://{args.host}:{args.port}/warden/alertmanager; {where}", flush=True
    )
    uvicorn.run(build_app(relay), host=args.host, port=args.port, log_level="warning")
    return 0
