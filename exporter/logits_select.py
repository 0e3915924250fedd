"""Pick warden's logits processor for the model runner the engine's config uses.

vLLM 0.32 runs Model Runner V2 wherever Triton is present (every CUDA install) unless a feature
it lacks is on, and V1 elsewhere (``VllmConfig.use_v2_model_runner``). The two runners take
processors of different base classes and each refuses the other's, at start-up in the API server.
``warden serve`` passes ``--logits-processors exporter.logits:NonFiniteLogitsProcessor`` (the
V1 class, valid on a V1 engine even without warden's plugin); the plugin wraps
``EngineArgs.create_engine_config`` in the API process, before any engine process exists, and
swaps warden's entry for the class of the runner the finished config will use. The swapped
config is what the engine core and workers receive (pickled under spawn, inherited under fork).

Warden's entry is dropped instead, with the reason logged and
``warden_source_available{source="logits"}`` 0, wherever vLLM would refuse to start with a custom
logits processor, so the engine serves without the check rather than not at all:

- a pooling model (embedding, classification, reward; ``runner_type`` "pooling", whether from
  ``--runner pooling``, ``--convert`` or the model's architecture): both runners' loaders raise;
- the V1 runner with speculative decoding (``build_logitsprocs`` raises; V2 accepts it);
- ``--return-sampling-mask`` (sampling distribution replay): ``VllmConfig`` refuses it while it
  is built, so this one is dropped from the ``EngineArgs`` before the config is made;
- this vLLM lacks the interface of the runner in use.

The decision is made here, on the finished config, rather than from ``warden serve``'s command
line: a pooling model is often recognised from its architecture alone.
"""

from __future__ import annotations

import logging
from typing import Any

from exporter import catalog, vllm_compat
from exporter.metrics import process_metrics

log = logging.getLogger("warden.exporter")

V1_PROCESSOR = "exporter.logits:NonFiniteLogitsProcessor"
V2_PROCESSOR = "exporter.logits_v2:NonFiniteLogitsProcessorV2"
_OURS = {V1_PROCESSOR, V2_PROCESSOR}


def processor_for(uses_v2: bool) -> str:
    return V2_PROCESSOR if uses_v2 else V1_PROCESSOR


def _name(entry: Any) -> str:
    if isinstance(entry, str):
        return entry
    return f"{getattr(entry, '__module__', '')}:{getattr(entry, '__qualname__', '')}"


def _leave_out(entries: list[Any], reason: str) -> list[Any] | None:
    """``entries`` without warden's processor; the reason logged, the source exported as 0."""
    log.warning("warden: non-finite logits are not checked (processor left out): %s", reason)
    process_metrics().get(catalog.SOURCE_AVAILABLE).labels("logits").set(0)
    return [e for e in entries if _name(e) not in _OURS] or None


def refusal(vllm_config: Any) -> str | None:
    """Why vLLM would refuse a custom logits processor with this finished config, or None."""
    model_config: Any = vllm_config.model_config
    if getattr(model_config, "runner_type", None) == "pooling":
        return "pooling models (embedding, classification, reward) take no logits processor"
    if getattr(vllm_config, "speculative_config", None) and not vllm_config.use_v2_model_runner:
        return "the V1 model runner takes no custom logits processor with speculative decoding"
    if getattr(model_config, "return_sampling_mask", False):
        return RETURN_SAMPLING_MASK
    return None


RETURN_SAMPLING_MASK = "--return-sampling-mask takes no custom logits processor"


def select_logits_processor(vllm_config: Any) -> str | None:
    """Swap warden's processor in ``vllm_config`` for the one its runner takes; return the
    name now configured (None when warden's processor is not configured, or left out)."""
    model_config: Any = getattr(vllm_config, "model_config", None)
    entries = list(getattr(model_config, "logits_processors", None) or [])
    if not any(_name(entry) in _OURS for entry in entries):
        return None
    refused = refusal(vllm_config)
    if refused is not None:
        model_config.logits_processors = _leave_out(entries, refused)
        return None
    uses_v2 = bool(vllm_config.use_v2_model_runner)
    wanted = processor_for(uses_v2)
    points = (
        (vllm_compat.HOOK_LOGITS_V2,)
        if uses_v2
        else (vllm_compat.HOOK_LOGITS_V1, vllm_compat.HOOK_LOGITS_V1_BATCH)
    )
    missing = next((m for m in map(vllm_compat.missing_hook, points) if m is not None), None)
    if missing is not None:
        model_config.logits_processors = _leave_out(entries, missing)
        return None
    swapped = [wanted if _name(entry) in _OURS else entry for entry in entries]
    if swapped != entries:
        log.info("warden: logits processor %s for this engine's model runner", wanted)
        model_config.logits_processors = swapped
    process_metrics().get(catalog.SOURCE_AVAILABLE).labels("logits").set(1)
    return wanted


def leave_out_before_config(engine_args: Any) -> None:
    """What ``VllmConfig`` itself refuses while it is built: drop warden's entry from the
    ``EngineArgs`` first (the other cases need the finished config)."""
    entries = list(getattr(engine_args, "logits_processors", None) or [])
    if getattr(engine_args, "return_sampling_mask", False) and any(
        _name(entry) in _OURS for entry in entries
    ):
        engine_args.logits_processors = _leave_out(entries, RETURN_SAMPLING_MASK)


def install() -> None:
    """Wrap ``EngineArgs.create_engine_config`` (idempotent; raises if the hook is missing)."""
    missing = vllm_compat.missing_hook(vllm_compat.HOOK_ENGINE_CONFIG)
    if missing is not None:
        raise RuntimeError(missing)
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config
    if getattr(original, "_warden_wrapped", False):
        return

    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            leave_out_before_config(self)
        except Exception:
            log.exception("warden: logits processor check failed; the arguments are unchanged")
        config = original(self, *args, **kwargs)
        try:
            select_logits_processor(config)
        except Exception:
            log.exception("warden: logits processor selection failed; the config is unchanged")
        return config

    create_engine_config._warden_wrapped = True  # type: ignore[attr-defined]
    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]
