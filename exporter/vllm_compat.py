"""Every read of vLLM's unstable internals in one place, and the hook points warden patches.

vLLM documents ``SchedulerStats`` and ``IterationStats`` as unstable; when they change, this
module is the only one to adapt. Missing fields read as "unknown" (None), never as an error.

Version contract: warden's hooks were checked against vLLM 0.32.x (``SUPPORTED_SERIES``; the
``gpu`` extra pins that range). Each hook point is checked where it is installed; a missing one
disables what it feeds, with a logged reason and ``warden_source_available{source}`` 0. vLLM
itself must start whatever warden finds.
"""

from __future__ import annotations

import importlib
import logging
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

log = logging.getLogger("warden.exporter")
SUPPORTED_SERIES = (0, 32)  # major, minor of the vLLM releases the hook points were read in


@dataclass(frozen=True)
class HookPoint:
    """One thing in vLLM that warden imports or patches, and the source it feeds."""

    name: str
    module: str
    attribute: str  # dotted path inside the module
    source: str  # the warden_source_available{source} label it feeds


HOOK_WORKER_INIT = HookPoint(
    "worker_init",
    "vllm.v1.worker.worker_base",
    "WorkerWrapperBase.init_device",
    "device_collectors",
)
HOOK_ENGINE_CORE = HookPoint(
    "engine_core", "vllm.v1.engine.core", "EngineCore.log_error_detail", "engine_errors"
)
HOOK_ENGINE_CONFIG = HookPoint(
    "engine_config", "vllm.engine.arg_utils", "EngineArgs.create_engine_config", "logits"
)
HOOK_LOGITS_V1 = HookPoint(
    "logits_v1", "vllm.v1.sample.logits_processor", "LogitsProcessor", "logits"
)
HOOK_LOGITS_V1_BATCH = HookPoint(
    "logits_v1_batch",
    "vllm.v1.sample.logits_processor.interface",
    "MoveDirectionality.SWAP",
    "logits",
)
HOOK_LOGITS_V2 = HookPoint(
    "logits_v2", "vllm.v1.worker.gpu.sample.logits_processor", "LogitsProcessor", "logits"
)
HOOK_CAPTURE_V1 = HookPoint(
    "capture_v1", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.capture_model", "cudagraph"
)
HOOK_CAPTURE_V2 = HookPoint(
    "capture_v2", "vllm.v1.worker.gpu.model_runner", "GPUModelRunner.capture_model", "cudagraph"
)
HOOK_GRAPH_COUNTER = HookPoint(
    "graph_counter",
    "vllm.compilation.counter",
    "compilation_counter.num_cudagraph_captured",
    "cudagraph",
)
HOOK_POINTS: tuple[HookPoint, ...] = (
    HOOK_WORKER_INIT,
    HOOK_ENGINE_CORE,
    HOOK_ENGINE_CONFIG,
    HOOK_LOGITS_V1,
    HOOK_LOGITS_V1_BATCH,
    HOOK_LOGITS_V2,
    HOOK_CAPTURE_V1,
    HOOK_CAPTURE_V2,
    HOOK_GRAPH_COUNTER,
)


def vllm_version() -> str | None:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:
        return None


def version_supported(version: str | None) -> bool:
    """Whether ``version`` is in the series the hook points were checked against."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return match is not None and (int(match[1]), int(match[2])) == SUPPORTED_SERIES


def version_note() -> str:
    version = vllm_version()
    series = ".".join(map(str, SUPPORTED_SERIES))
    if version_supported(version):
        return f"vLLM {version}"
    return f"vLLM {version} (warden's hooks were checked against {series}.x)"


def missing_hook(point: HookPoint, module: ModuleType | None = None) -> str | None:
    """None when ``point`` exists in this vLLM, else why not (for the log)."""
    try:
        found: Any = module if module is not None else importlib.import_module(point.module)
    except Exception as exc:
        return f"{point.module} cannot be imported ({type(exc).__name__}: {exc}; {version_note()})"
    for part in point.attribute.split("."):
        if not hasattr(found, part):
            return f"{point.module}.{point.attribute} is missing ({version_note()})"
        found = getattr(found, part)
    return None


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


def quiet_step(scheduler_stats: Any, iteration_stats: Any) -> tuple[int, int, float] | None:
    """(running, waiting, KV usage) of a step that finished, preempted and prefilled nothing
    (a prefill's step is not timed as a decode: ``prefills_in_iteration``), read straight
    off vLLM 0.32's fields; None for any other step, or when a field is missing (the full reads
    above then decide). Most steps of a busy engine are such steps, and vLLM calls the stat
    logger on its output loop after each: this is their whole read, a few attribute loads."""
    try:
        if iteration_stats is not None and (
            iteration_stats.finished_requests
            or iteration_stats.num_preempted_reqs
            or iteration_stats.time_to_first_tokens_iter
        ):
            return None
        return (
            scheduler_stats.num_running_reqs,
            scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
            scheduler_stats.kv_cache_usage,
        )
    except (AttributeError, TypeError):
        return None


def preempted_in_iteration(stats: Any) -> int:
    if stats is None:
        return 0
    return int(getattr(stats, "num_preempted_reqs", 0) or 0)


def prefills_in_iteration(stats: Any) -> int:
    """Requests whose prompt this step finished prefilling (their first token came out of it):
    vLLM's ``IterationStats`` notes each one's time to first token. Such a step computes the
    prompts on top of the batch's decodes, so the saturation meter does not time it as a step
    of that batch (exporter/saturation.py, ``StepTimes``)."""
    if stats is None:
        return 0
    first_tokens = getattr(stats, "time_to_first_tokens_iter", None)
    if first_tokens is not None:
        return len(first_tokens)
    return 1 if getattr(stats, "num_prompt_tokens", 0) else 0


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


def unfinished_requests(engine_client: Any) -> int | None:
    """Requests this API process has handed to the engine and not yet seen finish: counted
    when they are added, not at the next step."""
    processor = getattr(engine_client, "output_processor", None)
    try:
        return int(processor.get_num_unfinished_requests())  # type: ignore[union-attr]
    except Exception:
        return None


class EngineRequests(NamedTuple):
    """This API process's unfinished requests as vLLM's own request states hold them: what
    admission forecasts the running batch's ends and the queue's turnover from."""

    # Seconds each started request has been served, oldest first.
    served_ages: tuple[float, ...] = ()
    # The most tokens each of them may generate in all (its ``max_tokens``; None: up to the
    # context), in the same order.
    served_limits: tuple[int | None, ...] = ()
    # The same for each request not scheduled yet (vLLM's queue), in the order they arrived.
    queued_limits: tuple[int | None, ...] = ()


def served_requests(engine_client: Any) -> EngineRequests:
    """Seconds each unfinished request of this API process has been served (since the engine
    first scheduled it), oldest first, and the most tokens each may generate in all (its
    ``max_tokens``; None: up to the context), in the same order; and the limits of those not
    scheduled yet, in the order they arrived; empty when unknown (stats off, nothing in
    flight).

    Both ends are the engine core's own timestamps (its scheduling events, and its latest
    output any request has seen), never this process's clock, which vLLM warns is not to be
    compared with the engine core's. The ages lag by at most the time since that output: too
    young, never too old. A request preempted since is left out of both: it may be back in
    the queue, holding no slot, and its age counts time it was not served."""
    processor = getattr(engine_client, "output_processor", None)
    states = getattr(processor, "request_states", None)
    if not states:
        return EngineRequests()
    scheduled: list[tuple[float, int | None]] = []
    queued: list[tuple[float, int | None]] = []
    latest = 0.0
    try:
        for state in list(states.values()):
            stats = state.stats
            if stats is None:
                continue
            latest = max(latest, stats.last_token_ts, stats.scheduled_ts)
            if stats.num_preemptions:
                continue
            limit = getattr(state, "max_tokens_param", None)
            limit = int(limit) if limit else None
            if stats.scheduled_ts > 0.0:
                scheduled.append((stats.scheduled_ts, limit))
            else:
                queued.append((stats.arrival_time, limit))
    except Exception:
        return EngineRequests()
    scheduled.sort(key=lambda started: started[0])
    queued.sort(key=lambda arrived: arrived[0])
    return EngineRequests(
        tuple(max(0.0, latest - at) for at, _limit in scheduled),
        tuple(limit for _at, limit in scheduled),
        tuple(limit for _at, limit in queued),
    )


def kv_geometry(engine_client: Any) -> tuple[int, int] | None:
    """(total KV blocks, tokens per block) once the engine has profiled its cache."""
    try:
        cache = engine_client.vllm_config.cache_config
        blocks, size = int(cache.num_gpu_blocks or 0), int(cache.block_size or 0)
    except Exception:
        return None
    return (blocks, size) if blocks > 0 and size > 0 else None


def max_num_seqs(engine_client: Any) -> int | None:
    """The batch's size limit (``--max-num-seqs``): requests beyond it wait in vLLM's queue."""
    try:
        seqs = int(engine_client.vllm_config.scheduler_config.max_num_seqs or 0)
    except Exception:
        return None
    return seqs if seqs > 0 else None


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


def finished_requests(stats: Any) -> list[tuple[int, float, float, int, float, float]]:
    """(prompt + generated tokens, seconds queued, seconds served, tokens generated, seconds
    decoding, 1.0 if it stopped before its limit else 0.0) per request finished in an
    IterationStats; served = end to end minus queued (recomputation after preemption
    included), decoding = first token to last. Stopped before its limit: vLLM's finish
    reason says the model ended it (an end-of-sequence token, a stop string, a repetition),
    not ``max_tokens`` or the context; a request aborted by its client is not counted as
    stopping on its own."""
    out = []
    for finished in getattr(stats, "finished_requests", None) or ():
        generated = int(getattr(finished, "num_generation_tokens", 0) or 0)
        tokens = int(getattr(finished, "num_prompt_tokens", 0) or 0) + generated
        queued = float(getattr(finished, "queued_time", 0.0) or 0.0)
        e2e = float(getattr(finished, "e2e_latency", 0.0) or 0.0)
        decode = float(getattr(finished, "decode_time", 0.0) or 0.0)
        stopped = str(getattr(finished, "finish_reason", "")) in STOPPED_ON_ITS_OWN
        out.append(
            (tokens, queued, max(e2e - queued, 0.0), generated, max(decode, 0.0), float(stopped))
        )
    return out


# vLLM's finish reasons (``FinishReason.__str__``) for a request the model ended itself.
STOPPED_ON_ITS_OWN = frozenset({"stop", "repetition"})


def eos_token_id(vllm_config: Any) -> int | None:
    """The model's end-of-sequence token (the first one where the config lists several)."""
    try:
        eos = vllm_config.model_config.hf_config.eos_token_id
    except AttributeError:
        return None
    if isinstance(eos, list | tuple):
        eos = eos[0] if eos else None
    return int(eos) if eos is not None else None


def is_sampling_leader() -> bool:
    """Whether this worker is tensor-parallel rank 0 (every rank samples the same logits)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank()) == 0
    except Exception:  # not initialised (unit tests, offline tools): a lone worker
        return True


def engine_slot(vllm_config: Any) -> int:
    """The signal-board slot of this engine: its local data-parallel rank (0 without DP)."""
    try:
        return int(vllm_config.parallel_config.data_parallel_rank_local or 0)
    except (AttributeError, TypeError, ValueError):
        return 0
