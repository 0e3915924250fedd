"""``shed_low_priority``: refuse requests whose priority number is above a threshold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter import catalog
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

PRIORITY_THRESHOLD = Param(
    "priority_threshold",
    catalog.PARAM_PRIORITY_THRESHOLD,
    integer(-(2**31), 2**31),
    fallback=0,
    setting="shed_priority_threshold",
    doc="refuse priority above this (larger = less important; the lowest wins)",
)


def _merge(fields: Fields, params: Mapping[str, Any], defaults: Defaults) -> None:
    value = int(param(params, defaults, PRIORITY_THRESHOLD))
    current = fields["shed_priority_above"]
    fields["shed_priority_above"] = value if current is None else min(current, value)


def _refuse(fields: View, priority: int, _gate: Gate) -> Refusal | None:
    threshold = fields["shed_priority_above"]
    if threshold is not None and priority > threshold:
        return Refusal(
            503,
            "shed_low_priority",
            f"low-priority requests (priority > {threshold}) are being shed",
        )
    return None


ACTION = Action(
    "shed_low_priority",
    "refuse requests whose priority number is above the threshold (larger = less important)",
    {"shed_priority_above": None},
    _merge,
    gauge=lambda f: float(f["shed_priority_above"] is not None),
    params=(PRIORITY_THRESHOLD,),
    refuse=_refuse,
    reflex=True,
    protection=2,
    extra_params=(),
)
