"""Warden's logits processor for vLLM's Model Runner V2 (the default on CUDA in vLLM 0.32).

V2 loads custom processors through ``vllm.v1.worker.gpu.sample.logits_processor.loader``, which
accepts only subclasses of V2's ``LogitsProcessor``; the API server runs the same check at
start-up. Detection, containment and reporting are the shared core's (``exporter.nonfinite``),
exactly as in the V1 processor (``exporter.logits``).

V2 keys per-request state by a persistent slot: ``add_request(slot, params)`` (re)initialises a
slot, with no removal call (slots are recycled through a free list), and ``apply(logits, ctx)``
maps rows to slots with ``ctx.idx_mapping_np`` (host, one row per request) or
``ctx.expanded_idx_mapping`` (device, several rows per request under speculative decoding). V2
skips the processing stage for a batch where no processor asked for it, so ``add_request``
answers True for every request: each row must be checked.

The import of this module stays light (V2's interface module imports no torch at import time,
and the API server imports this class only to validate requests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor

if TYPE_CHECKING:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState

    from exporter.logits_support import RequestRow


class NonFiniteLogitsProcessorV2(LogitsProcessor):
    def __init__(self, vllm_config: Any, req_states: LogitsProcRequestState) -> None:
        from exporter.logits_support import LogitsWiring

        self.wiring = LogitsWiring(vllm_config)
        self.detector = self.wiring.detector
        self.slots: list[RequestRow | None] = [None] * int(req_states.max_num_reqs)
        self._switched: dict[int, RequestRow] = {}  # slots a test switch applies to

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        row = self.wiring.row_for(sampling_params)
        if req_idx >= len(self.slots):
            self.slots.extend([None] * (req_idx + 1 - len(self.slots)))
        self.slots[req_idx] = row
        if row.inject is not None or row.raise_class is not None:
            self._switched[req_idx] = row
        else:
            self._switched.pop(req_idx, None)
        return self.wiring.check_every_step or row.inject is not None or row.raise_class is not None

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        self.wiring.delay()
        one_row_per_request = logits.shape[0] == len(ctx.idx_mapping_np)
        slots = ctx.idx_mapping_np if one_row_per_request else ctx.expanded_idx_mapping
        if self._switched and one_row_per_request:
            switched = [
                (row, self._switched[int(slot)])
                for row, slot in enumerate(ctx.idx_mapping_np)
                if int(slot) in self._switched
            ]
            if switched:
                self.wiring.before_check(logits, switched)
        return self.detector.check(logits, self.slots, slots)
