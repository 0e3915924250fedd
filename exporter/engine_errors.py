"""Counts exceptions from model execution by class, in the engine core process.

vLLM wraps every model step in ``EngineCore.log_error_detail``; warden wraps that context
manager to classify the exception (oom / cuda_driver / other) into
``warden_engine_errors_total{class}`` and re-raises it untouched, so vLLM's own handling is
unchanged. The API server's readiness reads the counter (a CUDA driver error fails it).

Where the patch happens matters. On CUDA vLLM *forks* the engine core from the API process; the
child inherits the classes as they are and does not run the plugin again. CPU engines *spawn* it:
the child imports ``vllm.v1.engine.core`` itself, then runs the plugin. ``install`` covers both:
it patches the class right after ``vllm.v1.engine.core`` is imported (``exporter.import_hooks``),
in whichever process that happens first, so a forked child inherits a patched class.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from exporter import catalog, import_hooks, memory_creep, vllm_compat
from exporter.errors import classify_exception
from exporter.metrics import WardenMetrics

log = logging.getLogger("warden.exporter")
CORE_MODULE = "vllm.v1.engine.core"
SOURCE = "engine_errors"


def install(metrics: WardenMetrics) -> None:
    """Patch ``EngineCore.log_error_detail`` now or as soon as its module is imported."""

    def hook(module: ModuleType) -> None:
        patch(module, metrics)

    import_hooks.when_imported(CORE_MODULE, hook)
    # The engine core's test switch (off unless WARDEN_TEST_MEMORY_CREEP=1) patches the same
    # module at the same moment.
    memory_creep.install()


def patch(core_module: ModuleType, metrics: WardenMetrics) -> bool:
    """Wrap the context manager in ``core_module``; False (logged, source 0) if it is missing."""
    available = metrics.get(catalog.SOURCE_AVAILABLE).labels(SOURCE)
    missing = vllm_compat.missing_hook(vllm_compat.HOOK_ENGINE_CORE, core_module)
    if missing is not None:
        log.warning("warden: engine errors are not counted: %s", missing)
        available.set(0)
        return False
    engine_core = core_module.EngineCore
    original = engine_core.log_error_detail
    if getattr(original, "_warden_wrapped", False):
        available.set(1)
        return True
    errors = metrics.get(catalog.ENGINE_ERRORS)

    @contextlib.contextmanager
    def log_error_detail(self: Any, scheduler_output: Any) -> Iterator[None]:
        with original(self, scheduler_output):
            try:
                yield
            except Exception as exc:
                errors.labels(classify_exception(exc)).inc()
                raise

    log_error_detail._warden_wrapped = True  # type: ignore[attr-defined]
    engine_core.log_error_detail = log_error_detail
    available.set(1)
    return True
