"""``stop_admission``: admit nothing new; requests in flight finish (the supervisor's drain
before a planned restart is one of these)."""

from __future__ import annotations

from warden.control.actions.base import Action, refuse_if, switch_on

ACTION = Action(
    "stop_admission",
    "admit nothing new; requests in flight finish",
    {"stop_admission": False},
    switch_on("stop_admission"),
    gauge=lambda f: float(f["stop_admission"]),
    refuse=refuse_if("stop_admission", "stop_admission", "server is not admitting new requests"),
    reflex=True,
    protection=4,
    protective=True,
)
