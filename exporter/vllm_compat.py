"""Every read of vLLM's unstable internals in one place.

vLLM documents ``SchedulerStats`` and ``IterationStats`` as unstable; when they change, this
module is the only one to adapt. Missing fields read as "unknown" (None), never as an error.
"""

from __future__ import annotations

from typing import Any


def scheduler_counts(stats: Any) -> tuple[int | None, int | None, float | None]:
    """(running, waiting, kv cache usage 0..1) from a SchedulerStats, or Nones."""
    if stats is None:
        return None, None, None
    running = getattr(stats, "num_running_reqs", None)
    waiting = getattr(stats, "num_waiting_reqs", None)
    skipped = getattr(stats, "num_skipped_waiting_reqs", 0) or 0
    kv = getattr(stats, "kv_cache_usage", None)
    return (
        None if running is None else int(running),
        None if waiting is None else int(waiting) + int(skipped),
        None if kv is None else float(kv),
    )


def preempted_in_iteration(stats: Any) -> int:
    if stats is None:
        return 0
    return int(getattr(stats, "num_preempted_reqs", 0) or 0)


def device_type(vllm_config: Any = None) -> str:
    """'cuda', 'cpu', ... from the engine config, else from vLLM's platform detection."""
    try:
        if vllm_config is not None:
            return str(vllm_config.device_config.device_type)
        from vllm.platforms import current_platform

        return str(current_platform.device_type)
    except Exception:
        return "unknown"
