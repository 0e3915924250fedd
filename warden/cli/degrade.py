"""``warden degrade list|set|clear``: manual overrides on a running engine, authenticated.

A manual lease is held like any other: it lapses after its TTL unless set again, and the
effective policy is the most restrictive of all live leases.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

from exporter.settings import SettingsError, load_settings
from warden.common.tokens import (
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    TokenError,
    bearer_header,
    load_token,
    read_token_file,
)
from warden.control.actions import REGISTRY


def _headers(args: argparse.Namespace) -> dict[str, str]:
    try:
        if args.token_file:
            token: str | None = read_token_file(Path(args.token_file))
        else:
            token = load_token(load_settings())
    except (TokenError, SettingsError) as exc:
        raise SystemExit(f"warden degrade: {exc}") from None
    if token is None:
        raise SystemExit(
            f"warden degrade: no token: pass --token-file or set {TOKEN_FILE_ENV} / {TOKEN_ENV}"
        )
    return bearer_header(token)


def _params(pairs: list[str]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"warden degrade: --param takes KEY=VALUE, got {pair!r}")
        params[key] = value
    return params


def _show(response: httpx.Response) -> int:
    try:
        body = response.json()
    except ValueError:
        body = {"error": response.text}
    if response.status_code >= 400:
        print(f"warden degrade: {response.status_code}: {body.get('error', body)}", file=sys.stderr)
        return 1
    leases = body.get("leases", [])
    if not leases:
        print("no live leases")
    for lease in leases:
        params = json.dumps(lease["params"]) if lease["params"] else ""
        print(f"{lease['source']:<12} {lease['key']:<36} {lease['action']:<18} {params}")
    if "policy" in body:
        active = {k: v for k, v in body["policy"].items() if v not in (False, None, "closed")}
        print(f"effective policy: {json.dumps(active)}")
    return 0


def run(args: argparse.Namespace) -> int:
    url = f"{args.engine_url.rstrip('/')}/warden/degrade"
    if args.degrade_command == "list":
        return _show(httpx.get(f"{args.engine_url.rstrip('/')}/warden/state", timeout=10))
    headers = _headers(args)
    if args.degrade_command == "set":
        body = {"action": args.action, "params": _params(args.param), "ttl_s": args.ttl}
        if args.key:
            body["key"] = args.key
        return _show(httpx.post(url, json=body, headers=headers, timeout=10))
    query = {"all": "1"} if args.all else {"key": args.key or ""}
    if not args.all and not args.key:
        raise SystemExit("warden degrade clear: name --key KEY, or --all")
    return _show(httpx.delete(url, params=query, headers=headers, timeout=10))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-url", default=load_settings().engine_url)
    parser.add_argument("--token-file", help=f"bearer token file (default ${TOKEN_FILE_ENV})")
    sub = parser.add_subparsers(dest="degrade_command", required=True)
    sub.add_parser("list", help="live leases and the effective policy")
    set_ = sub.add_parser("set", help="take a manual lease")
    # The actions and their parameters as registered when the command line is built.
    set_.add_argument("action", choices=REGISTRY.names())
    set_.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the action's parameters: " + ", ".join(sorted(REGISTRY.params())),
    )
    set_.add_argument("--ttl", type=float, default=300.0, help="seconds (default 300)")
    set_.add_argument("--key", help="lease name (default: the action)")
    clear = sub.add_parser("clear", help="release a manual lease, or all of them")
    clear.add_argument("--key")
    clear.add_argument("--all", action="store_true")
    parser.set_defaults(func=run)
