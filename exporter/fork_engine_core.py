"""Test switch ``WARDEN_TEST_FORK_ENGINE_CORE=1``: the API server forks vLLM's engine core on a
CPU host, as vLLM itself does on a GPU host, instead of spawning it.

Why: the test suite starts about thirty CPU engines, and its run time is CPU time. A spawned
engine core imports vLLM again (about 9 s of CPU on the project's machines, a quarter of an
engine start); a forked one inherits the API server's imports. It also runs the process model
users run (vLLM forks the engine core on CUDA), with warden's API-side hooks and threads
present at the fork, which a CPU engine otherwise never shows.

Only the engine core: vLLM's CPU platform forces ``spawn`` for every process it starts
(``vllm/platforms/cpu.py``), and its model worker needs a fresh interpreter, since it binds
its OpenMP threads to cores through variables that OpenMP reads once, when torch loads. The
worker is started by the executor (``vllm.v1.executor.multiproc_executor``), which has its own
reference to ``get_mp_context``; only ``vllm.v1.engine.utils``'s is replaced, so the worker is
still spawned and bound as vLLM binds it.

Off unless set; warden's container refuses ``WARDEN_TEST_*`` with a real model.
"""

from __future__ import annotations

import logging
import multiprocessing
from types import ModuleType
from typing import Any

from exporter import import_hooks

log = logging.getLogger("warden.exporter")
SWITCH = "WARDEN_TEST_FORK_ENGINE_CORE"  # WardenSettings.test_fork_engine_core
# Where vLLM 0.32 starts its engine core processes: CoreEngineProcManager calls this module's
# ``get_mp_context`` (checked by tests/test_vllm_hooks_units.py).
LAUNCH_MODULE = "vllm.v1.engine.utils"
CONTEXT_FUNCTION = "get_mp_context"


def install(enabled: bool) -> None:
    """When the switch is on: the engine cores this process launches (the API server's) are
    forked. In the other engine processes the hook is installed and never called."""
    if enabled:
        import_hooks.when_imported(LAUNCH_MODULE, _fork_engine_core)


def _fork_engine_core(module: ModuleType) -> None:
    original = getattr(module, CONTEXT_FUNCTION, None)
    if original is None:
        log.warning("warden: %s is on, but %s has no %s", SWITCH, LAUNCH_MODULE, CONTEXT_FUNCTION)
        return
    if getattr(original, "_warden_fork", False):
        return

    def fork_context() -> Any:
        original()  # vLLM's own checks and environment, as on every launch
        return multiprocessing.get_context("fork")

    fork_context._warden_fork = True  # type: ignore[attr-defined]
    setattr(module, CONTEXT_FUNCTION, fork_context)
    log.warning("warden: %s is on: the engine core is forked (test only)", SWITCH)
