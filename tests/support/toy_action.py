"""A toy degradation action, written the way a new action is: one module, ``ACTION``.

``toy_hold`` refuses requests whose priority number is at or above its level (503, reason
``toy_hold``); two leases combine to the lowest level. tests/test_toy_action.py registers it
with one line and shows that the webhook, the reflex, the manual CLI, the gauges and the docs
all take it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warden.control.actions.base import (
    Action,
    Defaults,
    Fields,
    Gate,
    Param,
    Refusal,
    View,
    integer,
    param,
)

LEVEL = Param(
    "level", "warden_toy_level", integer(0, 100), fallback=7, doc="refuse priority >= this"
)


def _merge(fields: Fields, params: Mapping[str, Any], defaults: Defaults) -> None:
    level = int(param(params, defaults, LEVEL))
    current = fields["toy_level"]
    fields["toy_level"] = level if current is None else min(current, level)


def _refuse(fields: View, priority: int, _gate: Gate) -> Refusal | None:
    level = fields["toy_level"]
    if level is not None and priority >= level:
        return Refusal(503, "toy_hold", f"toy hold: priority {priority} >= {level}")
    return None


ACTION = Action(
    "toy_hold",
    "a test's toy: refuse requests whose priority is at or above the level",
    {"toy_level": None},
    _merge,
    gauge=lambda f: float(f["toy_level"] is not None),
    params=(LEVEL,),
    refuse=_refuse,
    reflex=True,
)
