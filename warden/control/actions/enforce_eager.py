"""``enforce_eager``: the supervisor drains and restarts vLLM with --enforce-eager (CUDA graphs
off). Nothing is refused here: the supervisor reads the gauge."""

from __future__ import annotations

from warden.control.actions.base import Action, switch_on

ACTION = Action(
    "enforce_eager",
    "the supervisor drains and restarts vLLM with --enforce-eager (CUDA graphs off)",
    {"enforce_eager": False},
    switch_on("enforce_eager"),
    gauge=lambda f: float(f["enforce_eager"]),
    protection=0,
    extra_params=(),
)
