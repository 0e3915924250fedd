"""Moved to ``warden.common.tinymodel`` (the stack below the CLI builds tiny models too).

Kept only so that importers not yet updated keep working; import from
``warden.common.tinymodel``.
"""

from warden.common.tinymodel import (
    CHAT_TEMPLATE,
    STACK_NAN_TOKEN,
    TINY_BASE_ARGS,
    TINY_ENGINE_ARGS,
    build_tiny_model,
    nan_token_of,
    tiny_engine_args,
)

__all__ = [
    "CHAT_TEMPLATE",
    "STACK_NAN_TOKEN",
    "TINY_BASE_ARGS",
    "TINY_ENGINE_ARGS",
    "build_tiny_model",
    "nan_token_of",
    "tiny_engine_args",
]
