"""The effective policy: the most restrictive combination of the live leases."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from warden.control.leases import Lease

CIRCUIT_ORDER = {"closed": 0, "half_open": 1, "open": 2}


@dataclass(frozen=True)
class EffectivePolicy:
    stop_admission: bool = False
    reject_all: bool = False
    cap_max_tokens: int | None = None
    shed_priority_above: int | None = None
    circuit: str = "closed"
    admit_fraction: float = 1.0
    enforce_eager: bool = False
    retry_after_s: int = 5

    @property
    def degraded(self) -> bool:
        return self != EffectivePolicy(retry_after_s=self.retry_after_s)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def active_actions(self) -> list[str]:
        """The degradation actions in force, by name (empty when not degraded)."""
        flags = {
            "stop_admission": self.stop_admission,
            "reject_all": self.reject_all,
            "cap_max_tokens": self.cap_max_tokens is not None,
            "shed_low_priority": self.shed_priority_above is not None,
            "circuit_breaker": self.circuit != "closed",
            "enforce_eager": self.enforce_eager,
        }
        return [action for action, on in flags.items() if on]


def combine(
    leases: Iterable[Lease],
    default_retry_after_s: int = 5,
    default_shed_threshold: int = 0,
    default_admit_fraction: float = 0.5,
) -> EffectivePolicy:
    stop = reject = eager = False
    cap: int | None = None
    shed: int | None = None
    circuit = "closed"
    fraction = 1.0
    retry_after = default_retry_after_s
    for lease in leases:
        params = lease.params
        if "retry_after" in params:
            retry_after = max(retry_after, int(params["retry_after"]))
        if lease.action == "stop_admission":
            stop = True
        elif lease.action == "reject_all":
            reject = True
        elif lease.action == "enforce_eager":
            eager = True
        elif lease.action == "cap_max_tokens":
            value = int(params["max_tokens"])
            cap = value if cap is None else min(cap, value)
        elif lease.action == "shed_low_priority":
            value = int(params.get("priority_threshold", default_shed_threshold))
            shed = value if shed is None else min(shed, value)
        elif lease.action == "circuit_breaker":
            mode = params.get("circuit", "open")
            if CIRCUIT_ORDER[mode] > CIRCUIT_ORDER[circuit]:
                circuit = mode
            if mode == "half_open":
                fraction = min(
                    fraction, float(params.get("admit_fraction", default_admit_fraction))
                )
    if circuit != "half_open":
        fraction = 0.0 if circuit == "open" else 1.0
    return EffectivePolicy(stop, reject, cap, shed, circuit, fraction, eager, retry_after)
