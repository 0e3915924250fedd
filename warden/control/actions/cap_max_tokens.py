"""``cap_max_tokens``: lower every request's output token limit to the cap."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter import catalog
from warden.control.actions.base import Action, Defaults, Fields, Param, integer

MAX_TOKENS = Param(
    "max_tokens",
    catalog.PARAM_MAX_TOKENS,
    integer(1, 10_000_000),
    required=True,
    doc="the cap on one request's output tokens (the lowest wins)",
)


def _merge(fields: Fields, params: Mapping[str, Any], _defaults: Defaults) -> None:
    value = int(params[MAX_TOKENS.name])
    current = fields["cap_max_tokens"]
    fields["cap_max_tokens"] = value if current is None else min(current, value)


ACTION = Action(
    "cap_max_tokens",
    "lower every request's output token limit to the cap",
    {"cap_max_tokens": None},
    _merge,
    gauge=lambda f: float(f["cap_max_tokens"] or 0),
    params=(MAX_TOKENS,),
    cap=lambda f: f["cap_max_tokens"],
    reflex=True,
    protection=1,
    extra_params=(),
)
