"""The compose stack's first-start job (service ``init``): the secrets the stack needs, made
once and kept in Docker volumes, so ``docker compose up`` works with nothing prepared.

- The webhook token Alertmanager sends to the engine (and the engine checks):
  ``WARDEN_WEBHOOK_TOKEN`` from ``compose/.env`` when given, else the one a previous start
  made, else a fresh 256-bit one.
- Grafana's admin password: ``GRAFANA_ADMIN_PASSWORD`` when given (never Grafana's default
  ``admin``: the job fails saying so), else the one a previous start made, else a fresh one.

Each file is written into a volume that only the containers needing it mount (read-only);
those run as different non-root users, so the files are 0644 inside the volume, which is not
reachable from the host but by root. Nothing secret is printed: the job says where to read it.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from warden.common.tokens import read_token_file

TOKEN_NAME = "warden_webhook_token"  # alerts.alertmanager.COMPOSE_TOKEN_FILE's file name
GRAFANA_PASSWORD_NAME = "grafana_admin_password"
GIVEN_TOKEN_ENV = "WARDEN_WEBHOOK_TOKEN"
GIVEN_PASSWORD_ENV = "GRAFANA_ADMIN_PASSWORD"
MIN_PASSWORD_CHARS = 12
FORBIDDEN_PASSWORDS = ("admin",)  # Grafana's default


class InitError(RuntimeError):
    """A given secret is unusable; the message says which and why."""


def _write(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")
    os.chmod(tmp, 0o644)
    tmp.replace(path)


def _existing(path: Path) -> str | None:
    try:
        return read_token_file(path)
    except Exception:
        return None


def ensure_secret(path: Path, given: str | None, fresh: str) -> str:
    """Write ``given`` (when set), else keep what is there, else write ``fresh``; say which."""
    given = (given or "").strip() or None
    current = _existing(path)
    if given is not None:
        if given != current:
            _write(path, given)
        return "as given"
    if current is not None:
        return "kept from an earlier start"
    _write(path, fresh)
    return "generated"


def check_password(password: str | None) -> None:
    if password is None or not password.strip():
        return
    if password.strip() in FORBIDDEN_PASSWORDS:
        raise InitError(
            f"{GIVEN_PASSWORD_ENV}={password.strip()!r} is Grafana's default password: "
            "choose another in compose/.env, or leave it unset to have one generated"
        )
    if len(password.strip()) < MIN_PASSWORD_CHARS:
        raise InitError(
            f"{GIVEN_PASSWORD_ENV} is shorter than {MIN_PASSWORD_CHARS} characters: choose a "
            "longer one in compose/.env, or leave it unset to have one generated"
        )


def run(secrets_dir: Path, grafana_dir: Path, env: Mapping[str, str]) -> list[str]:
    """Make both secrets; the lines to print. InitError when a given one is unusable."""
    password = env.get(GIVEN_PASSWORD_ENV)
    check_password(password)
    token_how = ensure_secret(
        secrets_dir / TOKEN_NAME, env.get(GIVEN_TOKEN_ENV), secrets.token_hex(32)
    )
    password_how = ensure_secret(
        grafana_dir / GRAFANA_PASSWORD_NAME, password, secrets.token_urlsafe(18)
    )
    return [
        f"webhook token {token_how}: read it with "
        f"`docker compose exec engine cat /run/secrets/{TOKEN_NAME}`",
        f"Grafana admin password {password_how}: user admin, password from "
        f"`docker compose exec grafana cat /run/secrets/{GRAFANA_PASSWORD_NAME}`",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m warden.stack.compose_init", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--secrets", type=Path, required=True, help="the webhook token volume")
    parser.add_argument("--grafana", type=Path, required=True, help="Grafana's secret volume")
    args = parser.parse_args(argv)
    try:
        lines = run(args.secrets, args.grafana, os.environ)
    except (InitError, OSError) as exc:
        print(f"warden init: {exc}", file=sys.stderr, flush=True)
        return 1
    for line in lines:
        print(f"warden init: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
