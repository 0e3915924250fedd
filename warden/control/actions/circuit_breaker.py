"""``circuit_breaker``: refuse all (open) or admit a fraction (half_open) while errors are high."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter import catalog
from warden.control.actions.base import (
    Action,
    ActionError,
    Defaults,
    Fields,
    Gate,
    Param,
    Refusal,
    View,
    fraction,
    param,
)

MODES = ("half_open", "open")
# warden_circuit_breaker_state / warden_degradation_active{action="circuit_breaker"} values.
ORDER = {mode: index for index, mode in enumerate(catalog.CIRCUIT_STATES)}


def _mode(name: str, raw: Any) -> str:
    if raw not in MODES:
        raise ActionError(f"{name}={raw!r}: use half_open or open")
    return str(raw)


CIRCUIT = Param("circuit", catalog.PARAM_CIRCUIT, _mode, default="open", doc="half_open or open")
ADMIT_FRACTION = Param(
    "admit_fraction",
    catalog.PARAM_ADMIT_FRACTION,
    fraction,
    fallback=0.5,
    setting="half_open_admit_fraction",
    doc="half_open: the fraction of requests let through (the smallest wins)",
)


def _merge(fields: Fields, params: Mapping[str, Any], defaults: Defaults) -> None:
    mode = params.get(CIRCUIT.name, CIRCUIT.default)
    if ORDER[mode] > ORDER[fields["circuit"]]:
        fields["circuit"] = mode
    if mode == "half_open":
        share = float(param(params, defaults, ADMIT_FRACTION))
        fields["admit_fraction"] = min(fields["admit_fraction"], share)


def _settle(fields: Fields) -> None:
    if fields["circuit"] != "half_open":
        fields["admit_fraction"] = 0.0 if fields["circuit"] == "open" else 1.0


def _refuse_open(fields: View, _priority: int, _gate: Gate) -> Refusal | None:
    if fields["circuit"] == "open":
        return Refusal(503, "circuit_open", "circuit breaker open: engine error rate too high")
    return None


def _refuse_half_open(fields: View, _priority: int, gate: Gate) -> Refusal | None:
    # Asked last among the refusals: the gate's credit is spent only on requests that every
    # other action would let through.
    if fields["circuit"] == "half_open" and not gate(fields["admit_fraction"]):
        return Refusal(
            503, "circuit_half_open", "circuit breaker half-open: request not let through"
        )
    return None


ACTION = Action(
    "circuit_breaker",
    "refuse all (open) or admit a fraction (half_open) while errors are high",
    {"circuit": "closed", "admit_fraction": 1.0},
    _merge,
    gauge=lambda f: float(ORDER[f["circuit"]]),
    params=(CIRCUIT, ADMIT_FRACTION),
    settle=_settle,
    refuse=_refuse_open,
    refuse_last=_refuse_half_open,
    protection=3,
)
