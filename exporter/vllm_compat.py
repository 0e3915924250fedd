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


def inflight_requests(engine_client: Any) -> list[tuple[str, int]]:
    """(external request id, tokens held = prompt + generated) of every request in flight."""
    processor = getattr(engine_client, "output_processor", None)
    states = getattr(processor, "request_states", None) or {}
    result = []
    for state in list(states.values()):
        external = getattr(state, "external_req_id", None) or getattr(state, "request_id", "")
        prompt = int(getattr(state, "prompt_len", 0) or 0)
        detokenizer = getattr(state, "detokenizer", None)
        generated = 0
        if detokenizer is not None and hasattr(detokenizer, "num_output_tokens"):
            generated = int(detokenizer.num_output_tokens())
        result.append((str(external), prompt + generated))
    return result


def kv_geometry(engine_client: Any) -> tuple[int, int] | None:
    """(total KV blocks, tokens per block) once the engine has profiled its cache."""
    try:
        cache = engine_client.vllm_config.cache_config
        blocks, size = int(cache.num_gpu_blocks or 0), int(cache.block_size or 0)
    except Exception:
        return None
    return (blocks, size) if blocks > 0 and size > 0 else None


def uses_priority_scheduling(engine_client: Any) -> bool:
    try:
        return str(engine_client.vllm_config.scheduler_config.policy) == "priority"
    except Exception:
        return False


def memory_budget(worker: Any) -> tuple[int | None, int | None]:
    """(vLLM's requested device memory, bytes in use before it allocated) of a GPU worker.

    vLLM's GPU worker takes a memory snapshot once the device is up and derives the memory it
    may use from ``gpu_memory_utilization`` (``requested_memory``); both exist right after
    ``init_device``. Falls back to utilisation x total from the cache config; None where unknown.
    """
    snapshot = getattr(worker, "init_snapshot", None)
    total = getattr(snapshot, "total_memory", None)
    free = getattr(snapshot, "free_memory", None)
    baseline = int(total - free) if total is not None and free is not None else None
    requested = getattr(worker, "requested_memory", None)
    if requested is None and total is not None:
        try:
            requested = float(worker.cache_config.gpu_memory_utilization) * total
        except Exception:
            requested = None
    return (None if requested is None else int(requested)), baseline


def finished_requests(stats: Any) -> list[tuple[int, float, float]]:
    """(prompt + generated tokens, seconds queued, seconds served) per request finished in an
    IterationStats; served = end to end minus queued (recomputation after preemption included)."""
    out = []
    for finished in getattr(stats, "finished_requests", None) or ():
        tokens = int(getattr(finished, "num_prompt_tokens", 0) or 0) + int(
            getattr(finished, "num_generation_tokens", 0) or 0
        )
        queued = float(getattr(finished, "queued_time", 0.0) or 0.0)
        e2e = float(getattr(finished, "e2e_latency", 0.0) or 0.0)
        out.append((tokens, queued, max(e2e - queued, 0.0)))
    return out
