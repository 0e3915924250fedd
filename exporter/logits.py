"""Warden's logits processor for vLLM's V1 model runner: non-finite logits, counted and contained.

vLLM calls ``apply`` in the worker on every step with the float32 logits of the batch, after its
own masks (allowed_token_ids, bad_words, min_tokens, logit bias, grammar bitmask) wrote their
``-inf``. Detection, containment and reporting are the shared core's (``exporter.nonfinite``):
one reduction per step, no host sync on CUDA, a faulty row (NaN or ``+inf``) made to sample
end-of-sequence, its warden request id (``vllm_xargs.warden_rid``, set by the middleware)
flagged on the signal board so the middleware retries or fails that request. A row the
request's own masks left without any finite value is flagged ``masked`` instead: the middleware
fails that request with a 400 naming its constraints, no fault counted, no retry.

This class tracks which request owns which row through vLLM's ``BatchUpdate`` (rows are added,
removed and moved as the batch changes). Model Runner V2 uses ``exporter.logits_v2`` instead; the
plugin picks the one matching the engine's runner (``exporter.logits_select``).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.interface import MoveDirectionality

from exporter.logits_support import LogitsWiring, RequestRow


class NonFiniteLogitsProcessor(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.wiring = LogitsWiring(vllm_config)
        self.detector = self.wiring.detector
        self.rows: list[RequestRow | None] = []  # row index -> owner
        self._switched: dict[int, RequestRow] = {}  # rows a test switch applies to

    def is_argmax_invariant(self) -> bool:
        # It must see every batch, greedy ones included.
        return False

    def _set(self, index: int, row: RequestRow | None) -> None:
        if index >= len(self.rows):
            self.rows.extend([None] * (index + 1 - len(self.rows)))
        self.rows[index] = row
        if row is not None and (row.inject is not None or row.raise_class is not None):
            self._switched[index] = row
        else:
            self._switched.pop(index, None)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._set(index, None)
        for index, params, _prompt, _output in batch_update.added:
            self._set(index, self.wiring.row_for(params))
        for source, target, direction in batch_update.moved:
            moving = self.rows[source] if source < len(self.rows) else None
            other = self.rows[target] if target < len(self.rows) else None
            if direction == MoveDirectionality.SWAP:
                self._set(source, other)
            else:
                self._set(source, None)
            self._set(target, moving)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not any(self.rows):
            return logits
        self.wiring.delay()
        if self._switched:
            self.wiring.before_check(logits, list(self._switched.items()))
        return self.detector.check(logits, self.rows)
