"""Where each vLLM endpoint reads a request's output-token limit, so a cap can only lower it.

A cap that reads the wrong field is a bypass, and one that writes a limit where the client gave
none can raise it. These rules follow vLLM 0.32's protocol classes (``tests`` check them
against vLLM):

- completions: ``max_tokens``; absent or null means 16 (``CompletionRequest``'s default);
- chat completions (and their batch form): ``max_completion_tokens`` when it is not null,
  else ``max_tokens``; neither means "up to the context length";
- responses: ``max_output_tokens``; Anthropic messages and Cohere chat: ``max_tokens``;
- token-in/token-out generate: ``sampling_params.max_tokens``;
- SageMaker ``/invocations``: vLLM runs the body as a chat completion when it validates as one,
  else as a completion; warden does not guess which: it applies both rules (the larger limit
  counts, and a cap is written where either kind reads it).

A limit bounds each sequence; a request runs several when it asks for ``n`` (or ``best_of``)
choices, several prompts (a completion's list of prompts) or several conversations (the batch
route): ``sequences`` is their number, and a cap bounds the request's total.

Values are read with pydantic in lax mode, the way vLLM's request models read them: ``100.0``,
``"100"``, ``" 100 "`` and ``"000…0100"`` (any number of zeros) are all 100. A value pydantic
refuses is ``Unreadable``; the middleware then refuses the request itself while a cap is in
force (fail closed) rather than trust vLLM to refuse it. Pure: no vLLM import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from warden.common.jsonbody import BadRequest, lax_int

# vLLM's CompletionRequest.max_tokens default (tests/test_admission_routes.py checks it).
COMPLETION_DEFAULT_MAX_TOKENS = 16


class Unreadable(BadRequest):
    """A field warden must read is not something vLLM's models accept; the message names it."""


def _read(holder: Mapping[str, Any], name: str) -> int | None:
    try:
        return lax_int(holder.get(name))
    except BadRequest as exc:
        raise Unreadable(f"{name}: {exc}") from None


def _count(value: Any) -> int:
    """How many prompts (or conversations) a list field holds; 1 for anything else (a single
    prompt, or a shape vLLM refuses anyway)."""
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        return len(value)
    return 1


class Limit(Protocol):
    def requested(self, body: Mapping[str, Any]) -> int | None: ...

    def sequences(self, body: Mapping[str, Any]) -> int: ...

    def write_cap(self, body: dict[str, Any], cap: int) -> None: ...


@dataclass(frozen=True)
class TokenLimit:
    """One endpoint's output-token limit: its fields in vLLM's order of precedence (the first
    one that is not null counts), the default when none is given (None: up to the context
    length), the sub-object the fields live in, if any, the fields that ask for several
    choices per prompt (``n``, ``best_of``), and the list field whose length multiplies them
    (a completion's prompts, the batch route's conversations)."""

    fields: tuple[str, ...]
    default: int | None = None
    container: str | None = None
    choices: tuple[str, ...] = ()
    fan_out: str | None = None

    def _holder(self, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        if self.container is None:
            return body
        holder = body.get(self.container)
        return holder if isinstance(holder, Mapping) else None

    def requested(self, body: Mapping[str, Any]) -> int | None:
        """The limit vLLM will apply to each sequence (None: up to the context length);
        Unreadable when vLLM's models would not read it."""
        holder = self._holder(body)
        if holder is None:
            raise Unreadable(f"{self.container}: expected an object")
        for name in self.fields:
            value = _read(holder, name)
            if value is not None:
                return value
        return self.default

    def sequences(self, body: Mapping[str, Any]) -> int:
        """How many sequences the request generates (at least 1); Unreadable when a field that
        says so is not something vLLM's models would read."""
        holder = self._holder(body) or {}
        width = 1
        for name in self.choices:
            value = _read(holder, name)
            if value is not None:
                width = max(width, value)
        prompts = _count(body.get(self.fan_out)) if self.fan_out is not None else 1
        return width * prompts

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


@dataclass(frozen=True)
class EitherOf:
    """A route whose body vLLM runs as one of several kinds, decided by which request model
    validates it first (``/invocations``). Warden applies every kind's rule: the larger limit
    and sequence count, and a cap written where each kind reads it, so whichever kind vLLM
    picks, the cap holds."""

    kinds: tuple[TokenLimit, ...]

    def requested(self, body: Mapping[str, Any]) -> int | None:
        limits = [kind.requested(body) for kind in self.kinds]
        return None if None in limits else max(x for x in limits if x is not None)

    def sequences(self, body: Mapping[str, Any]) -> int:
        return max(kind.sequences(body) for kind in self.kinds)

    def write_cap(self, body: dict[str, Any], cap: int) -> None:
        for kind in self.kinds:
            limit = kind.requested(body)
            if limit is None or limit > cap:
                kind.write_cap(body, cap)


CHOICES = ("n", "best_of")
COMPLETION = TokenLimit(
    ("max_tokens",), default=COMPLETION_DEFAULT_MAX_TOKENS, choices=CHOICES, fan_out="prompt"
)
CHAT = TokenLimit(("max_completion_tokens", "max_tokens"), choices=CHOICES)
BATCH_CHAT = TokenLimit(
    ("max_completion_tokens", "max_tokens"), choices=CHOICES, fan_out="messages"
)
RESPONSES = TokenLimit(("max_output_tokens",))
MAX_TOKENS = TokenLimit(("max_tokens",))
SAMPLING_PARAMS = TokenLimit(("max_tokens",), container="sampling_params", choices=CHOICES)
INVOCATION = EitherOf((CHAT, COMPLETION))

BY_ROUTE: dict[str, Limit] = {
    "/v1/completions": COMPLETION,
    "/v1/chat/completions": CHAT,
    "/v1/chat/completions/batch": BATCH_CHAT,
    "/v1/responses": RESPONSES,
    "/v1/messages": MAX_TOKENS,
    "/cohere/v2/chat": MAX_TOKENS,
    "/inference/v1/generate": SAMPLING_PARAMS,
    "/invocations": INVOCATION,
}
INVOCATIONS = "/invocations"


def limit_for(route: str, body: Mapping[str, Any] | None = None) -> Limit | None:
    """The rule for a request to ``route`` (the path without vLLM's --root-path)."""
    return BY_ROUTE.get(route)


def reads_json_body(route: str) -> bool:
    """Whether requests to ``route`` carry a JSON body with a token limit warden enforces."""
    return route in BY_ROUTE
