"""vLLM endpoint plugin: warden's routes on the API server's own port.

Registered under ``vllm.endpoint_plugins`` (it must be named in VLLM_PLUGINS). vLLM builds it
with no arguments, so it is a composition root: it takes the process's ``EngineRuntime`` and
gives it to the routes (``app.state``). ``init_state`` is where warden gets the engine client:
the stall detector reads its in-flight request count, the controller uses it to preempt, and
the local reflex and the saturation watch are attached to the step monitor.
"""

from __future__ import annotations

import asyncio
import contextlib
from argparse import Namespace
from typing import Any

from fastapi import FastAPI

from exporter import vllm_compat
from warden.control.reflex import Reflex
from warden.control.saturation import SaturationWatch
from warden.engine import runtime

# Background tasks live here so they are not garbage-collected while the server runs.
_tasks: set[asyncio.Task[None]] = set()


async def _tick_forever(rt: runtime.EngineRuntime, interval_s: float = 0.25) -> None:
    """Between engine steps: expire leases, and once the engine has gone quiet (an idle engine
    makes no steps) refresh the memory watermark and let the step listeners (the reflex, the
    saturation watch) see it, so they act on and release what they hold."""
    control = rt.control
    while True:
        with contextlib.suppress(Exception):
            monitor = rt.monitor
            quiet = monitor is not None and (
                control.clock() - monitor.snapshot.timestamp >= interval_s
            )
            if monitor is not None and quiet:
                monitor.refresh_memory()
            control.policy()
        await asyncio.sleep(interval_s)


class WardenEndpoints:
    name = "warden_endpoints"
    required_tasks = None

    def __init__(self, rt: runtime.EngineRuntime | None = None) -> None:
        """vLLM passes nothing: the process's runtime (the one its middleware has), taken
        when the plugin is first used. Tests pass a runtime of their own."""
        self._runtime = rt

    @property
    def runtime(self) -> runtime.EngineRuntime:
        if self._runtime is None:
            self._runtime = runtime.process_runtime()
        return self._runtime

    def attach_router(self, app: FastAPI) -> None:
        from warden.engine import health, webhook

        runtime.install(app, self.runtime)
        app.include_router(webhook.router)
        app.include_router(health.router)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        rt = self.runtime
        control = rt.control
        rt.attach_engine(engine_client)
        monitor = rt.monitor
        if monitor is not None and engine_client is not None:
            if vllm_compat.unfinished_requests(engine_client) is not None:
                monitor.inflight = lambda: vllm_compat.unfinished_requests(engine_client) or 0
            judged = control.config.admission.saturation.enabled
            if judged:
                # Read only where admission decides on them: the default config pays nothing.
                monitor.served_requests = lambda: vllm_compat.served_requests(engine_client)
            # Without a saturation limit nothing decides on the state at each step: it is
            # summed up for the gauges and /warden/state only.
            monitor.saturation_every_step = judged
            monitor.add_listener(Reflex(control.config.reflex, control))
            monitor.add_listener(SaturationWatch(control.config.admission.saturation, control))
        task = asyncio.get_running_loop().create_task(_tick_forever(rt))
        _tasks.add(task)
