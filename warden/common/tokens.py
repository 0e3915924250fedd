"""The bearer token that guards every control surface: one loader, one comparison.

The engine's webhook and override routes, the supervisor's control port, the CLI and the
stack all read the token the same way: ``WARDEN_WEBHOOK_TOKEN_FILE`` (preferred: it never
shows on a command line, and rotation needs no restart of Alertmanager) or
``WARDEN_WEBHOOK_TOKEN``. An unreadable or empty file is an error, never "no token": a
misconfigured deployment must fail closed, not open. Comparison is constant-time. Where no
token is configured, the supervisor makes one (``load_or_generate``) rather than run open.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from exporter.settings import WardenSettings, env_name

TOKEN_FILE_ENV = env_name("webhook_token_file")
TOKEN_ENV = env_name("webhook_token")
INSECURE_ENV = env_name("webhook_insecure")


class TokenError(RuntimeError):
    """The token file is unreadable or empty; the message names it."""


def read_token_file(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenError(f"{TOKEN_FILE_ENV}={path}: cannot read: {exc}") from None
    if not token:
        raise TokenError(f"{TOKEN_FILE_ENV}={path}: file is empty")
    return token


def load_token(settings: WardenSettings) -> str | None:
    """The configured token; None when none is configured; TokenError when it cannot be read."""
    if settings.webhook_token_file is not None:
        return read_token_file(settings.webhook_token_file)
    if settings.webhook_token is not None:
        return settings.webhook_token.get_secret_value().strip() or None
    return None


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries exactly ``Bearer <token>``."""
    if not header:
        return False
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.strip().encode(), token.encode())


def bearer_header(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def write_token(path: Path, mode: int = 0o600) -> Path:
    """Write a fresh 256-bit token to ``path`` (created with ``mode``) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32) + "\n")
    os.chmod(path, mode)  # the umask may have narrowed it
    return path


def load_or_generate(settings: WardenSettings, fallback: Path) -> tuple[str, Path | None]:
    """The configured token, or a fresh one written to ``fallback`` (mode 0600) when none is
    configured: (token, the generated file or None). TokenError when the configured file
    cannot be read: a broken configuration stops the caller, it never falls back to open."""
    token = load_token(settings)
    if token is not None:
        return token, None
    path = write_token(fallback)
    return read_token_file(path), path
