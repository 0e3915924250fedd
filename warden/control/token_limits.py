"""Where each vLLM endpoint reads a request's output-token limit, so a cap can only lower it.

A cap that reads the wrong field is a bypass, and one that writes a limit where the client gave
none can raise it. These rules follow vLLM 0.32's protocol classes (``tests`` check them
against vLLM):

- completions: ``max_tokens``; absent or null means 16 (``CompletionRequest``'s default);
- chat completions (and their batch form): ``max_completion_tokens`` when it is not null,
  else ``max_tokens``; neither means "up to the context length";
- responses: ``max_output_tokens``; Anthropic messages and Cohere chat: ``max_tokens``;
- token-in/token-out generate: ``sampling_params.max_tokens``;
- SageMaker ``/invocations``: the chat rule when the body has ``messages``, else completions.

Values are read the way vLLM's pydantic models read them (lax: ``100.0`` and ``"100"`` are
100); a value vLLM would refuse is left alone, since vLLM answers it with a 400 anyway.
Pure: no vLLM import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warden.common.jsonbody import BadRequest, lax_int

# vLLM's CompletionRequest.max_tokens default (tests/test_admission_routes.py checks it).
COMPLETION_DEFAULT_MAX_TOKENS = 16


class Unreadable(BadRequest):
    """The request's limit is not something vLLM accepts; vLLM will refuse the request."""


@dataclass(frozen=True)
class TokenLimit:
    """One endpoint's output-token limit: its fields in vLLM's order of precedence (the first
    one that is not null counts), the default when none is given (None: up to the context
    length), and the sub-object the fields live in, if any."""

    fields: tuple[str, ...]
    default: int | None = None
    container: str | None = None

    def _holder(self, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        if self.container is None:
            return body
        holder = body.get(self.container)
        return holder if isinstance(holder, Mapping) else None

    def requested(self, body: Mapping[str, Any]) -> int | None:
        """The limit vLLM will apply (None: up to the context length); Unreadable when vLLM
        will refuse the request for it."""
        holder = self._holder(body)
        if holder is None:
            raise Unreadable(f"{self.container}: expected an object")
        for name in self.fields:
            try:
                value = lax_int(holder.get(name))
            except BadRequest as exc:
                raise Unreadable(f"{name}: {exc}") from None
            if value is not None:
                return value
        return self.default

    def write_cap(self, body: dict[str, Any], cap: int) -> None:
        """Lower the limit to ``cap`` in the field vLLM reads first, and in any other that
        names a larger limit."""
        holder = body.get(self.container) if self.container is not None else body
        if not isinstance(holder, dict):
            return
        holder[self.fields[0]] = cap
        for name in self.fields[1:]:
            try:
                value = lax_int(holder.get(name))
            except BadRequest:
                continue
            if value is not None and value > cap:
                holder[name] = cap


COMPLETION = TokenLimit(("max_tokens",), default=COMPLETION_DEFAULT_MAX_TOKENS)
CHAT = TokenLimit(("max_completion_tokens", "max_tokens"))
RESPONSES = TokenLimit(("max_output_tokens",))
MAX_TOKENS = TokenLimit(("max_tokens",))
SAMPLING_PARAMS = TokenLimit(("max_tokens",), container="sampling_params")

BY_ROUTE: dict[str, TokenLimit] = {
    "/v1/completions": COMPLETION,
    "/v1/chat/completions": CHAT,
    "/v1/chat/completions/batch": CHAT,
    "/v1/responses": RESPONSES,
    "/v1/messages": MAX_TOKENS,
    "/cohere/v2/chat": MAX_TOKENS,
    "/inference/v1/generate": SAMPLING_PARAMS,
}
INVOCATIONS = "/invocations"


def limit_for(route: str, body: Mapping[str, Any]) -> TokenLimit | None:
    """The rule for a request to ``route`` (the path without vLLM's --root-path)."""
    if route == INVOCATIONS:
        return CHAT if "messages" in body else COMPLETION
    return BY_ROUTE.get(route)


def reads_json_body(route: str) -> bool:
    """Whether requests to ``route`` carry a JSON body with a token limit warden enforces."""
    return route == INVOCATIONS or route in BY_ROUTE
