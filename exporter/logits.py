"""A logits processor that counts requests whose logits went NaN or Inf.

It runs in the worker on every step and must not stall the GPU: the per-row flags are computed
on the device, copied to pinned host memory without blocking, and read on a later step once
the copy's event has completed. On CPU the flags are already on the host. vLLM's own check
(``VLLM_COMPUTE_NANS_IN_LOGITS``) counts NaN only; this counts both kinds, once per request.

Containment: a row found non-finite is turned into a certain end-of-sequence on the device
(no sync), so the request stops instead of sampling garbage; its warden request id
(``vllm_xargs.warden_rid``, set by warden's middleware) is written to the shared signal board,
where the middleware finds it and retries or fails the request. On a GPU the flag is read one
step later, so a poisoned request may emit one token before it stops.

Test switch: with ``WARDEN_TEST_INJECT_NONFINITE=1`` in the engine's environment, a request
that carries ``vllm_xargs: {"warden_inject": "nan"|"inf"}`` gets its logits poisoned, so tests
can prove exactly that request is counted. Without the variable the argument is ignored.
``WARDEN_TEST_STEP_DELAY_S`` slows every step that has requests (tests that must catch a
request in flight on a busy two-core machine).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.interface import MoveDirectionality

from exporter import catalog
from exporter.metrics import process_metrics
from exporter.request_args import ATTEMPT_ARG, INJECT_ARG, INJECT_ATTEMPTS_ARG, RID_ARG
from exporter.settings import load_settings
from exporter.signals import SignalBoard

log = logging.getLogger("warden.exporter")
# A request re-sent by warden's retry carries its attempt number; injection hits attempt 1 only
# (unless asked for more), modelling a transient fault that a retry with another seed gets past.
_MAX_REMEMBERED = 65536
_MAX_PENDING = 64


@dataclass
class _Row:
    request_key: int
    inject: str | None
    rid: str | None


class _PendingFlags:
    """Device flags on their way to the host; ready when the copy's event completed."""

    def __init__(
        self, flags: torch.Tensor, keys: list[int], rids: list[str | None], pin: bool
    ) -> None:
        self.keys = keys
        self.rids = rids
        if flags.device.type == "cpu":
            self.host = flags
            self.event: Any = None
        else:
            self.host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=pin)
            self.host.copy_(flags, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())


class NonFiniteLogitsProcessor(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.pin = is_pin_memory
        config = load_settings()
        self.inject_enabled = config.test_inject_nonfinite
        self.step_delay_s = config.test_step_delay_s
        self.rows: dict[int, _Row] = {}
        self._keys = itertools.count(1)
        self._counted: OrderedDict[int, None] = OrderedDict()
        self._pending: deque[_PendingFlags] = deque()
        metrics = process_metrics()
        self._counter = metrics.get(catalog.NONFINITE_LOGITS)
        self._dropped = metrics.get(catalog.COLLECTOR_ERRORS).labels("nonfinite_logits")
        path = config.signal_board
        self.board = SignalBoard(str(path)) if path and path.exists() else None
        self.eos_token_id = _eos_token_id(vllm_config)
        if self.inject_enabled:
            log.warning("warden: WARDEN_TEST_INJECT_NONFINITE is on: test-only logits poisoning")
        if self.step_delay_s:
            log.warning(
                "warden: WARDEN_TEST_STEP_DELAY_S=%s: test-only slow steps", self.step_delay_s
            )

    def is_argmax_invariant(self) -> bool:
        # It must see every batch, greedy ones included.
        return False

    def _injection(self, params: Any) -> str | None:
        if not self.inject_enabled or params is None:
            return None
        extra = getattr(params, "extra_args", None) or {}
        kind = extra.get(INJECT_ARG)
        if kind not in catalog.NONFINITE_KINDS:
            return None
        try:
            attempt = int(extra.get(ATTEMPT_ARG, 1))
            poisoned = int(extra.get(INJECT_ATTEMPTS_ARG, 1))
        except (TypeError, ValueError):
            attempt, poisoned = 1, 1
        return str(kind) if attempt <= poisoned else None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, _output in batch_update.added:
            extra = getattr(params, "extra_args", None) or {}
            rid = extra.get(RID_ARG)
            self.rows[index] = _Row(
                next(self._keys), self._injection(params), rid if isinstance(rid, str) else None
            )
        for source, target, direction in batch_update.moved:
            moving = self.rows.pop(source, None)
            if direction == MoveDirectionality.SWAP:
                other = self.rows.pop(target, None)
                if other is not None:
                    self.rows[source] = other
            if moving is not None:
                self.rows[target] = moving

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        num_rows = logits.shape[0]
        injected = False
        if self.inject_enabled:
            for index, row in self.rows.items():
                if row.inject is not None and index < num_rows:
                    logits[index, :] = float("nan") if row.inject == "nan" else float("inf")
                    injected = True
        # Common path on CPU: one reduction, read without any device sync. Only a batch holding
        # NaN/Inf (or overflowing the sum, harmlessly) pays for the per-row split below.
        if logits.device.type == "cpu" and not injected and bool(torch.isfinite(logits.sum())):
            self._drain()
            return logits
        nan_rows = torch.isnan(logits).any(dim=1)
        inf_rows = torch.isinf(logits).any(dim=1)
        rows = [self.rows.get(i) for i in range(num_rows)]
        keys = [row.request_key if row else 0 for row in rows]
        rids = [row.rid if row else None for row in rows]
        self._pending.append(_PendingFlags(torch.stack((nan_rows, inf_rows)), keys, rids, self.pin))
        if self.eos_token_id is not None:
            # Containment without a sync: bad rows can only sample end-of-sequence.
            bad = (nan_rows | inf_rows).unsqueeze(1)
            logits.masked_fill_(bad, float("-inf"))
            eos = logits[:, self.eos_token_id]
            logits[:, self.eos_token_id] = torch.where(bad.squeeze(1), 0.0, eos)
        self._drain()
        return logits

    def _drain(self) -> None:
        while self._pending and self._pending[0].ready():
            pending = self._pending.popleft()
            nan_flags, inf_flags = pending.host.tolist()
            for key, rid, is_nan, is_inf in zip(
                pending.keys, pending.rids, nan_flags, inf_flags, strict=False
            ):
                if key and (is_nan or is_inf) and key not in self._counted:
                    self._counted[key] = None
                    if len(self._counted) > _MAX_REMEMBERED:
                        self._counted.popitem(last=False)
                    kind = "nan" if is_nan else "inf"
                    self._counter.labels(kind).inc()
                    if rid is not None and self.board is not None:
                        self.board.flag_request(rid, kind)
        while len(self._pending) > _MAX_PENDING:
            # The device is far behind; dropping a sample is better than blocking the step.
            self._pending.popleft()
            self._dropped.inc()


def _eos_token_id(vllm_config: Any) -> int | None:
    try:
        eos = vllm_config.model_config.hf_config.eos_token_id
    except AttributeError:
        return None
    if isinstance(eos, list | tuple):
        eos = eos[0] if eos else None
    return int(eos) if eos is not None else None
