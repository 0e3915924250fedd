"""Pick warden's logits processor for the model runner the engine's config uses.

vLLM 0.32 runs Model Runner V2 wherever Triton is present (every CUDA install) unless a feature
it lacks is on, and V1 elsewhere (``VllmConfig.use_v2_model_runner``). The two runners take
processors of different base classes and each refuses the other's, at start-up in the API server.
``warden serve`` passes ``--logits-processors exporter.logits:NonFiniteLogitsProcessor`` (the
V1 class, valid on a V1 engine even without warden's plugin); the plugin wraps
``EngineArgs.create_engine_config`` in the API process, before any engine process exists, and
swaps warden's entry for the class of the runner the finished config will use. The swapped
config is what the engine core and workers receive (pickled under spawn, inherited under fork).

If this vLLM lacks the interface of the runner in use, warden's entry is dropped instead, with
the reason logged and ``warden_source_available{source="logits"}`` 0: vLLM starts without it.
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


def select_logits_processor(vllm_config: Any) -> str | None:
    """Swap warden's processor in ``vllm_config`` for the one its runner takes; return the
    name now configured (None when warden's processor is not configured at all)."""
    model_config: Any = getattr(vllm_config, "model_config", None)
    entries = list(getattr(model_config, "logits_processors", None) or [])
    if not any(_name(entry) in _OURS for entry in entries):
        return None
    uses_v2 = bool(vllm_config.use_v2_model_runner)
    wanted = processor_for(uses_v2)
    points = (
        (vllm_compat.HOOK_LOGITS_V2,)
        if uses_v2
        else (vllm_compat.HOOK_LOGITS_V1, vllm_compat.HOOK_LOGITS_V1_BATCH)
    )
    missing = next((m for m in map(vllm_compat.missing_hook, points) if m is not None), None)
    available = process_metrics().get(catalog.SOURCE_AVAILABLE).labels("logits")
    if missing is not None:
        log.warning("warden: non-finite logits are not checked (processor left out): %s", missing)
        model_config.logits_processors = [e for e in entries if _name(e) not in _OURS] or None
        available.set(0)
        return None
    swapped = [wanted if _name(entry) in _OURS else entry for entry in entries]
    if swapped != entries:
        log.info("warden: logits processor %s for this engine's model runner", wanted)
        model_config.logits_processors = swapped
    available.set(1)
    return wanted


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
        config = original(self, *args, **kwargs)
        try:
            select_logits_processor(config)
        except Exception:
            log.exception("warden: logits processor selection failed; the config is unchanged")
        return config

    create_engine_config._warden_wrapped = True  # type: ignore[attr-defined]
    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]
