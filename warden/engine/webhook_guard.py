"""Who may change an engine's policy over HTTP: the bearer token (or insecure mode).

One guard per ``EngineRuntime``: the token is read once, at the first guarded request, so a
token file that cannot be read is found then (and by ``/warden/ready`` before that) without
being read again for every alert.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.settings import SettingsError, load_settings
from warden.common import tokens
from warden.control.config import WebhookSettings


@dataclass(frozen=True)
class Refusal:
    status: int  # 403: the webhook is disabled; 401: the wrong token
    message: str
    headers: dict[str, str] = field(default_factory=dict)


class WebhookGuard:
    def __init__(self) -> None:
        self.token: str | None = None
        self.loaded = False
        self.problem: str | None = None
        self.insecure = False

    def check(self, authorization: str | None, webhook: WebhookSettings) -> Refusal | None:
        """None when a request with this ``Authorization`` header may change the policy."""
        if not self.loaded:
            try:
                settings = load_settings()
                self.token = tokens.load_token(settings)
                self.insecure = settings.webhook_insecure
            except (tokens.TokenError, SettingsError) as exc:
                self.problem = str(exc)
            self.loaded = True
        if self.token is None:
            if self.problem is None and (self.insecure or webhook.allow_insecure):
                return None
            reason = self.problem or (
                f"no token configured: set {tokens.TOKEN_FILE_ENV} or {tokens.TOKEN_ENV} "
                f"(or {tokens.INSECURE_ENV}=1 to run without one)"
            )
            return Refusal(403, f"warden webhook disabled: {reason}")
        if not tokens.bearer_matches(authorization, self.token):
            return Refusal(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        return None
