"""The bearer credential that guards the webhook and manual overrides."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

TOKEN_FILE_ENV = "WARDEN_WEBHOOK_TOKEN_FILE"
TOKEN_ENV = "WARDEN_WEBHOOK_TOKEN"
INSECURE_ENV = "WARDEN_WEBHOOK_INSECURE"


class TokenError(RuntimeError):
    pass


def load_token() -> str | None:
    """The token from $WARDEN_WEBHOOK_TOKEN_FILE (preferred) or $WARDEN_WEBHOOK_TOKEN."""
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise TokenError(f"{TOKEN_FILE_ENV}={path}: cannot read: {exc}") from None
        if not token:
            raise TokenError(f"{TOKEN_FILE_ENV}={path}: file is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def insecure_requested() -> bool:
    return os.environ.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes")


def authorized(header: str | None, token: str) -> bool:
    if not header:
        return False
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.strip().encode(), token.encode())
