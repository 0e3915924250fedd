"""``reject_all``: refuse every new request with 503 + Retry-After (also the exempt routes that
do work: tokenizing, counting, rendering)."""

from __future__ import annotations

from warden.control.actions.base import Action, refuse_if, switch_on

ACTION = Action(
    "reject_all",
    "refuse every new request with 503 + Retry-After",
    {"reject_all": False},
    switch_on("reject_all"),
    gauge=lambda f: float(f["reject_all"]),
    refuse=refuse_if("reject_all", "reject_all", "server is rejecting all new requests"),
    reflex=True,
    protection=5,
    protective=True,
)
