"""What warden's two logits processors share besides detection: wiring and test switches.

``exporter.logits`` (V1 model runner) and ``exporter.logits_v2`` (Model Runner V2) differ only in
how vLLM tells them which request owns which row; both build a ``LogitsWiring`` once: the
detection core (``exporter.nonfinite``) connected to the counter, the signal board (flags and
progress for the middleware) and the test switches of this process's settings.

Test switches (off in production, each enabled by its own environment variable):
- ``WARDEN_TEST_INJECT_NONFINITE``: a request carrying ``vllm_xargs: {"warden_inject": "nan" |
  "inf"}`` gets that row poisoned (for what a model cannot produce on demand, such as ``+inf``;
  a real NaN source is the tiny model's ``--nan-token``).
- ``WARDEN_TEST_ENGINE_ERROR``: a request carrying ``{"warden_raise": "oom" | "cuda_driver" |
  "other"}`` makes the worker raise an exception of that class in the step, as a real fault
  would (vLLM's engine core then fails the step; warden counts it by class).
- ``WARDEN_TEST_STEP_DELAY_S``: every step that has requests sleeps that long.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from exporter import catalog, vllm_compat
from exporter.errors import CUDA_DRIVER, OOM, OTHER
from exporter.metrics import process_metrics
from exporter.nonfinite import MASKED, NonFiniteDetector, RowOwner
from exporter.request_args import ATTEMPT_ARG, INJECT_ARG, INJECT_ATTEMPTS_ARG, RAISE_ARG, RID_ARG
from exporter.settings import load_settings
from exporter.signals import SignalBoard

log = logging.getLogger("warden.exporter")


@dataclass(frozen=True)
class RequestRow(RowOwner):
    """A request's row or slot: its owner identity plus what the test switches asked for."""

    inject: str | None = None  # "nan" | "inf": poison this row (test switch)
    raise_class: str | None = None  # "oom" | "cuda_driver" | "other": raise (test switch)


_TEST_ERRORS: dict[str, Any] = {
    OOM: lambda: torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB (raised by WARDEN_TEST_ENGINE_ERROR)"
    ),
    CUDA_DRIVER: lambda: RuntimeError(
        "CUDA error: an illegal memory access was encountered (raised by WARDEN_TEST_ENGINE_ERROR)"
    ),
    OTHER: lambda: RuntimeError("engine error of class other (raised by WARDEN_TEST_ENGINE_ERROR)"),
}


class LogitsWiring:
    """The detector, metrics, board and switches of one logits processor instance."""

    def __init__(self, vllm_config: Any) -> None:
        config = load_settings()
        self.inject_enabled = config.test_inject_nonfinite
        self.raise_enabled = config.test_engine_error
        self.step_delay_s = config.test_step_delay_s
        self.check_every_step = config.logits_check_every_step
        self._keys = 0
        # Every tensor-parallel rank computes the same logits: one of them reports.
        self.leader = vllm_compat.is_sampling_leader()
        self.slot = vllm_compat.engine_slot(vllm_config)
        metrics = process_metrics()
        self._counter = metrics.get(catalog.NONFINITE_LOGITS)
        path = config.signal_board
        self.board = SignalBoard(str(path)) if path and path.exists() else None
        progress = self._publish_progress if self.board is not None and self.leader else None
        self.detector = NonFiniteDetector(
            vllm_compat.eos_token_id(vllm_config), self._report, progress
        )
        if self.inject_enabled:
            log.warning("warden: WARDEN_TEST_INJECT_NONFINITE is on: test-only logits poisoning")
        if self.raise_enabled:
            log.warning("warden: WARDEN_TEST_ENGINE_ERROR is on: test-only engine errors")
        if self.step_delay_s:
            log.warning(
                "warden: WARDEN_TEST_STEP_DELAY_S=%s: test-only slow steps", self.step_delay_s
            )

    def row_for(self, params: Any) -> RequestRow:
        """A new owner for a request entering the batch (a fresh key every time)."""
        self._keys += 1
        extra = getattr(params, "extra_args", None) or {}
        rid = extra.get(RID_ARG)
        return RequestRow(
            self._keys,
            rid if isinstance(rid, str) else None,
            self._injection(extra),
            self._raise_class(extra),
        )

    def _injection(self, extra: dict[str, Any]) -> str | None:
        kind = extra.get(INJECT_ARG) if self.inject_enabled else None
        if kind not in catalog.NONFINITE_KINDS:
            return None
        # A request re-sent by warden's retry carries its attempt number; injection hits
        # attempt 1 only (unless asked for more): a transient fault a retry gets past.
        try:
            attempt = int(extra.get(ATTEMPT_ARG, 1))
            poisoned = int(extra.get(INJECT_ATTEMPTS_ARG, 1))
        except (TypeError, ValueError):
            attempt, poisoned = 1, 1
        return str(kind) if attempt <= poisoned else None

    def _raise_class(self, extra: dict[str, Any]) -> str | None:
        wanted = extra.get(RAISE_ARG) if self.raise_enabled else None
        return str(wanted) if wanted in _TEST_ERRORS else None

    def before_check(self, logits: torch.Tensor, rows: list[tuple[int, RequestRow]]) -> None:
        """Test switches for the (row index, owner) pairs of this step that asked for one."""
        for index, row in rows:
            if row.raise_class is not None:
                raise _TEST_ERRORS[row.raise_class]()
            if row.inject is not None and index < logits.shape[0]:
                logits[index, :] = float("nan") if row.inject == "nan" else float("inf")

    def delay(self) -> None:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)

    def _report(self, owner: RowOwner, kind: str) -> None:
        if not self.leader:
            return
        if kind == MASKED:
            # The request's own constraints left nothing to sample: its error, not a fault.
            log.info("warden: request %s has every token masked by its constraints", owner.rid)
        else:
            self._counter.labels(kind).inc()
        if owner.rid is not None and self.board is not None:
            self.board.flag_request(owner.rid, kind)

    def _publish_progress(self, applied: int, resolved: int) -> None:
        assert self.board is not None
        self.board.publish_progress(self.slot, applied, resolved)
