"""Request bodies and headers from untrusted clients, read so that bad input is a clear 4xx.

Python's own parsers raise more than ``JSONDecodeError`` on hostile input: a JSON integer over
4,300 digits raises a plain ``ValueError`` (int parsing's length limit), deep nesting raises
``RecursionError``, and ``str.isdigit`` accepts digits ``int()`` then refuses. Every surface
warden serves (the admission middleware, the webhook and override routes, the supervisor's
control port) reads through these helpers, so each of those becomes ``BadRequest`` with a
message naming the problem, answered 400 and never a 500.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

# Deeper than any real request (OpenAI tool schemas nest a dozen levels); shallow enough that
# re-encoding the body for vLLM can never hit the interpreter's recursion limit.
MAX_DEPTH = 128
_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII only; 18 digits always fit an int64
_LAX_INT: TypeAdapter[int | None] = TypeAdapter(int | None)
_LAX_BOOL: TypeAdapter[bool | None] = TypeAdapter(bool | None)


class BadRequest(ValueError):
    """The input is malformed; ``str()`` names the problem for the client."""


def load_json(body: bytes) -> Any:
    """Parse a JSON body, refusing with ``BadRequest`` whatever Python's parser would raise."""
    try:
        data = json.loads(body)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"body is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise BadRequest(f"body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string ..."
        raise BadRequest(f"body has a value Python cannot read: {exc}") from None
    # Fewer brackets than the limit cannot nest past it: skip the walk (the common case).
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and depth(data) > MAX_DEPTH:
        raise BadRequest(f"body nests deeper than {MAX_DEPTH} levels")
    return data


def depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level) for child in children)
    return deepest


def content_length(raw: str | None) -> int | None:
    """A Content-Length header's value; None when absent; ``BadRequest`` when malformed."""
    if raw is None:
        return None
    text = raw.strip()
    if not _DIGITS.fullmatch(text):
        raise BadRequest(f"Content-Length {raw[:40]!r} is not a byte count")
    return int(text)


# vLLM reads request fields with pydantic in lax mode (``100.0`` and ``"100"`` are the integer
# 100, ``"true"`` is True). A field warden acts on is read by the same pydantic, with no rule
# of warden's own (no length limit: ``"000…0300"`` with a million zeros is 300 to vLLM), or a
# client could spell a value so that vLLM honours it and warden misses it. pydantic bounds the
# work itself (it refuses integers past its own size limit, linear-time either way).


def lax_int(value: Any) -> int | None:
    """An integer field as vLLM's request models read it; BadRequest when they would not."""
    try:
        return _LAX_INT.validate_python(value)
    except ValidationError:
        raise BadRequest(f"{_preview(value)}: not an integer") from None


def lax_bool(value: Any) -> bool | None:
    """A boolean field as vLLM's request models read it; BadRequest when they would not."""
    try:
        return _LAX_BOOL.validate_python(value)
    except ValidationError:
        raise BadRequest(f"{_preview(value)}: not a boolean") from None


def _preview(value: Any) -> str:
    """A value for an error message: at most 40 characters of it, never a whole list."""
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    return repr(value)[:40]
