"""Test switch ``WARDEN_TEST_FORK_ENGINE_PROCESSES=1``: on a CPU host, vLLM's engine core and
model worker are forked from the process that starts them, not spawned.

Why: the test suite starts about thirty CPU engines, and on two cores its run time is CPU
time. vLLM's CPU platform spawns every engine process (``vllm/platforms/cpu.py``), and each
spawned one imports vLLM and torch again: on the project's machines an engine start took about
30 s of CPU, 15 with both forked (the engine core from the API server, as vLLM itself does on
CUDA; the worker from the engine core, as vLLM does with several GPUs). The forked processes
also run warden's fork paths (heartbeat, error counting, the plugin's state) on a real engine,
which a spawned CPU engine never shows.

What spawn gave the worker, a fork must give it here: vLLM binds the model worker's OpenMP
threads through variables OpenMP reads once, when torch loads (``GOMP_CPU_AFFINITY`` and
``OMP_NUM_THREADS``, set around the worker's start by ``OMPProcessManager``). A forked worker
inherits torch already loaded, so right after the fork it binds itself to those cores and
sets that thread count (``_bind_like_spawn``), before its first parallel region: the threads
OpenMP then creates inherit the binding. Measured: the same cores, the same 47 threads and the
same decode speed as the spawned worker.

Off unless set; warden's container refuses ``WARDEN_TEST_*`` with a real model.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
from types import ModuleType
from typing import Any

from exporter import import_hooks

log = logging.getLogger("warden.exporter")
SWITCH = "WARDEN_TEST_FORK_ENGINE_PROCESSES"  # WardenSettings.test_fork_engine_processes
# Where vLLM 0.32 starts engine processes, each module with its own ``get_mp_context``:
# CoreEngineProcManager (the engine core) and MultiprocExecutor (the model workers). Checked
# by tests/test_vllm_hooks_units.py.
LAUNCH_MODULES = ("vllm.v1.engine.utils", "vllm.v1.executor.multiproc_executor")
CONTEXT_FUNCTION = "get_mp_context"
# The OpenMP binding vLLM sets for a worker it starts (vllm/utils/ompmultiprocessing.py).
AFFINITY_VARIABLE = "GOMP_CPU_AFFINITY"
THREADS_VARIABLE = "OMP_NUM_THREADS"


def install(enabled: bool) -> None:
    """When the switch is on, on a CPU host: the engine processes this process starts are
    forked, and a forked worker binds itself as spawn would have bound it. On CUDA vLLM chooses
    itself (it forks the engine core, and spawns a worker once CUDA is initialised, which a
    forked one could not use): the switch is ignored there, and says so."""
    if not enabled:
        return
    if not _cpu_host():
        log.warning("warden: %s is on, but only a CPU host's engine is forked: ignored", SWITCH)
        return
    for name in LAUNCH_MODULES:
        import_hooks.when_imported(name, _fork_from)
    multiprocessing.util.register_after_fork(_bind_like_spawn, _call)


def _cpu_host() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _call(function: Any) -> None:
    function()


def _fork_from(module: ModuleType) -> None:
    original = getattr(module, CONTEXT_FUNCTION, None)
    if original is None:
        log.warning("warden: %s is on, but %s has no %s", SWITCH, module.__name__, CONTEXT_FUNCTION)
        return
    if getattr(original, "_warden_fork", False):
        return

    def fork_context() -> Any:
        original()  # vLLM's own checks and environment, as on every launch
        return multiprocessing.get_context("fork")

    fork_context._warden_fork = True  # type: ignore[attr-defined]
    setattr(module, CONTEXT_FUNCTION, fork_context)
    log.warning("warden: %s is on: %s forks (test only)", SWITCH, module.__name__)


def _bind_like_spawn() -> None:
    """In a process just forked: where vLLM set a worker's OpenMP binding for it, take it."""
    cpus = os.environ.get(AFFINITY_VARIABLE, "").split()
    if not cpus:
        return  # not a worker vLLM binds (the engine core, or binding off)
    os.sched_setaffinity(0, {int(cpu) for cpu in cpus})
    threads = os.environ.get(THREADS_VARIABLE)
    if threads:
        import torch

        torch.set_num_threads(int(threads))
