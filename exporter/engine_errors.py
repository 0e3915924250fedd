"""Counts exceptions from model execution by class, in the engine core process.

vLLM wraps every model step in ``EngineCore.log_error_detail``; warden wraps that context
manager to classify the exception (oom / cuda_driver / other) and re-raises it untouched, so
vLLM's own handling is unchanged.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from exporter import catalog
from exporter.errors import classify_exception
from exporter.metrics import WardenMetrics


def install(metrics: WardenMetrics) -> bool:
    """Patch EngineCore if this process has loaded it; return whether it did."""
    core_module = sys.modules.get("vllm.v1.engine.core")
    if core_module is None:
        return False
    engine_core = core_module.EngineCore
    original = engine_core.log_error_detail
    if getattr(original, "_warden_wrapped", False):
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
    return True
