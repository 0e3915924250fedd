"""Non-finite logits: which rows are faults, how they are contained, how the host learns of them.

Shared by warden's two logits processors (``exporter.logits`` for vLLM's V1 model runner,
``exporter.logits_v2`` for Model Runner V2). Torch only, no vLLM: the GPU acceptance suite
(``tests/gpu``) runs this module on any CUDA machine.

What is a fault. vLLM writes ``-inf`` into logits on purpose to mask tokens (allowed_token_ids,
bad_words, min_tokens, logit_bias, grammar bitmasks of structured outputs), so ``-inf`` alone is
normal. A row is a fault when it holds NaN anywhere or ``+inf`` anywhere. One reduction tells
the cases apart: the row maximum. NaN propagates through max, ``+inf`` is the max when present,
a row with at least one finite value and otherwise ``-inf`` has a finite max, and a row with
every token at ``-inf`` has max ``-inf``. That last row is not the model's fault: the request's
own constraints (allowed_token_ids against bad_words, a grammar that admits nothing) masked
every token, so nothing can be sampled. It is reported as ``masked``, which the middleware turns
into a clear error for that request, never a fault count or a retry.

Per step, on CPU: the row maxima are read on the host (no device to wait for); a batch without
fault ends there. On CUDA, nothing waits for the device on the step path: the maxima are copied
to pinned host memory without blocking, an event is recorded after the copy, and a resolver
thread sleeps on that event and reports the faulty rows (off the step path). Meanwhile the
faulty rows are contained on the device in the same step: every token is set to ``-inf`` but
end-of-sequence, so a poisoned (or wholly masked) request stops instead of sampling garbage (and
no sampler sees a NaN distribution). Each report names the row's owner (a request key and
warden's request id), once per request.

``StepProgress`` says how far flags are resolved: steps checked (``applied``) and steps whose
flags the host has read (``resolved``). The API server's middleware waits until ``resolved``
reaches the ``applied`` it saw when a response ended: the flag of a request poisoned on its last
step is then known before the response leaves (see ``warden.engine.flag_wait``).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

log = logging.getLogger("warden.exporter")

NAN = "nan"
INF = "inf"
MASKED = "masked"  # every token masked by the request's own constraints: not a fault
_MAX_REMEMBERED = 65536  # request keys already reported (each request is reported once)


@dataclass(frozen=True)
class RowOwner:
    """The request a logits row belongs to: a process-unique key and warden's request id."""

    key: int
    rid: str | None = None


Owners = Sequence["RowOwner | None"]  # slot (or row) -> the request that holds it
# row -> slot: a host array (V2's idx_mapping_np), a tensor (V2's expanded mapping), or None
# when rows are slots. Anything indexable: this module needs no numpy.
Slots = Any
Report = Callable[[RowOwner, str], None]  # (owner, "nan" | "inf" | "masked"), once per request


class StepProgress(Protocol):
    def __call__(self, applied: int, resolved: int) -> None: ...


def row_maxima(logits: torch.Tensor) -> torch.Tensor:
    """The one reduction per step: each row's maximum (not finite exactly for faulty rows)."""
    return logits.amax(dim=-1)


def fault_kind(row_max: float) -> str | None:
    """'nan', 'inf' (``+inf`` present), 'masked' (every token ``-inf``) or None (healthy)."""
    if math.isnan(row_max):
        return NAN
    if math.isinf(row_max):
        return INF if row_max > 0 else MASKED
    return None


def contain_rows(logits: torch.Tensor, bad: torch.Tensor, eos_token_id: int | None) -> None:
    """Make the rows where ``bad`` is true sample end-of-sequence only (in place, no sync)."""
    if eos_token_id is None or not 0 <= eos_token_id < logits.shape[-1]:
        return
    logits.masked_fill_(bad.unsqueeze(-1), float("-inf"))
    logits[:, eos_token_id].masked_fill_(bad, 0.0)


def contain_on_device(
    logits: torch.Tensor, row_max: torch.Tensor, eos_token_id: int | None
) -> None:
    """Containment on CUDA without knowing on the host which rows are bad.

    With Triton, one kernel whose programs return at once for healthy rows (a read of one
    float per row); without it, a masked write over the whole tensor.
    """
    if eos_token_id is None or not 0 <= eos_token_id < logits.shape[-1]:
        return
    kernel = triton_containment()
    if kernel is not None and logits.is_contiguous():
        kernel(logits, row_max, eos_token_id)
        return
    contain_rows(logits, ~torch.isfinite(row_max), eos_token_id)


_triton_kernel: Any = None
_triton_checked = False


def triton_containment() -> Callable[[torch.Tensor, torch.Tensor, int], None] | None:
    """The Triton containment kernel, or None where Triton is missing or broken."""
    global _triton_kernel, _triton_checked
    if _triton_checked:
        return _triton_kernel
    _triton_checked = True
    try:
        import triton
        import triton.language as tl
    except Exception:
        return None

    @triton.jit
    def _contain(logits_ptr, max_ptr, stride, vocab, eos, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0)
        row_max = tl.load(max_ptr + row).to(tl.float32)
        # Not finite: NaN (x != x), +inf, or -inf (every token masked: nothing to sample).
        if (row_max != row_max) | (tl.abs(row_max) == float("inf")):
            for start in range(0, vocab, BLOCK):
                offsets = start + tl.arange(0, BLOCK)
                values = tl.where(offsets == eos, 0.0, float("-inf"))
                values = values.to(logits_ptr.dtype.element_ty)
                tl.store(logits_ptr + row * stride + offsets, values, mask=offsets < vocab)

    def launch(logits: torch.Tensor, row_max: torch.Tensor, eos: int) -> None:
        rows, vocab = logits.shape
        _contain[(rows,)](logits, row_max, logits.stride(0), vocab, eos, BLOCK=1024)

    _triton_kernel = launch
    return launch


@dataclass
class _Pending:
    """One CUDA step's row maxima on their way to the host."""

    seq: int
    maxima: torch.Tensor  # pinned host memory, filled by a non-blocking copy
    slots: Slots  # row -> slot (host array, or pinned copy)
    owners: Owners
    event: Any  # torch.cuda.Event recorded after the copies
    applied_at: float


class NonFiniteDetector:
    """Finds faulty logits rows each step, contains them, and reports them once per request.

    ``report(owner, kind)`` is called on the host: inline on CPU, from the resolver thread on
    CUDA. ``progress(applied, resolved)`` is called after every change of either count.
    ``on_latency(seconds)``, if given, receives the delay from a CUDA step's check to its flags
    being resolved (the GPU acceptance suite measures it).
    """

    def __init__(
        self,
        eos_token_id: int | None,
        report: Report,
        progress: StepProgress | None = None,
        on_latency: Callable[[float], None] | None = None,
    ) -> None:
        self.eos_token_id = eos_token_id
        self._report = report
        self._progress = progress
        self._on_latency = on_latency
        self._reported: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()
        self.applied = 0
        self.resolved = 0
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    # --- the step path ---------------------------------------------------------------------

    def check(
        self,
        logits: torch.Tensor,
        owners: Owners,
        slots: Slots = None,
    ) -> torch.Tensor:
        """Check ``logits`` [rows, vocab] in place. ``owners[slot]`` is the request holding a
        slot, ``slots[row]`` the slot of a row (the row itself when None). Returns ``logits``."""
        row_max = row_maxima(logits)
        with self._lock:
            self.applied += 1
        if logits.device.type != "cuda":
            self._check_on_host(logits, row_max, owners, slots)
            return logits
        contain_on_device(logits, row_max, self.eos_token_id)
        # The owners table changes as requests come and go: resolve against this step's copy.
        self._enqueue(row_max, list(owners), slots)
        return logits

    def _check_on_host(
        self,
        logits: torch.Tensor,
        row_max: torch.Tensor,
        owners: Owners,
        slots: Slots,
    ) -> None:
        healthy = torch.isfinite(row_max)
        if not bool(healthy.all()):
            contain_rows(logits, ~healthy, self.eos_token_id)
            self._resolve(row_max, slots, owners)
        self._resolved_through(self.applied)

    def _enqueue(
        self,
        row_max: torch.Tensor,
        owners: Owners,
        slots: Slots,
    ) -> None:
        maxima = torch.empty(row_max.shape, dtype=row_max.dtype, pin_memory=True)
        maxima.copy_(row_max, non_blocking=True)
        if isinstance(slots, torch.Tensor) and slots.device.type == "cuda":
            host = torch.empty(slots.shape, dtype=slots.dtype, pin_memory=True)
            host.copy_(slots, non_blocking=True)
            slots = host
        elif isinstance(slots, torch.Tensor):
            slots = slots.clone()
        elif slots is not None:
            slots = slots.copy()  # a host array: vLLM reuses its buffers step to step
        event = torch.cuda.Event(blocking=True)  # the resolver sleeps on it, no spinning
        event.record()
        self._queue.put(_Pending(self.applied, maxima, slots, owners, event, time.monotonic()))
        self._publish()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._resolve_loop, name="warden-nonfinite-flags", daemon=True
            )
            self._thread.start()

    # --- the resolver (CUDA) ---------------------------------------------------------------

    def _resolve_loop(self) -> None:
        while True:
            pending = self._queue.get()
            if pending is None:
                return
            try:
                pending.event.synchronize()  # this thread only; the GIL is released meanwhile
                self._resolve(pending.maxima, pending.slots, pending.owners)
                if self._on_latency is not None:
                    self._on_latency(time.monotonic() - pending.applied_at)
            except Exception:
                log.exception("warden: non-finite flags of a step could not be resolved")
            self._resolved_through(pending.seq)

    def wait_resolved(self, timeout_s: float) -> bool:
        """Block until every step checked so far is resolved (tests and benchmarks only)."""
        deadline = time.monotonic() + timeout_s
        while self.resolved < self.applied:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)
        return True

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    # --- shared ----------------------------------------------------------------------------

    def _resolve(self, maxima: torch.Tensor, slots: Slots, owners: Owners) -> None:
        """Report the faulty rows of one step (``maxima`` on the host)."""
        maxima = maxima.float()
        bad_rows = torch.nonzero(~torch.isfinite(maxima)).flatten().tolist()
        for row in bad_rows:
            slot = int(slots[row]) if slots is not None and row < len(slots) else int(row)
            owner = owners[slot] if 0 <= slot < len(owners) else None
            kind = fault_kind(float(maxima[row]))
            if owner is None or kind is None:
                continue
            with self._lock:
                if owner.key in self._reported:
                    continue
                self._reported[owner.key] = None
                if len(self._reported) > _MAX_REMEMBERED:
                    self._reported.popitem(last=False)
            self._report(owner, kind)

    def _resolved_through(self, seq: int) -> None:
        with self._lock:
            self.resolved = max(self.resolved, seq)
        self._publish()

    def _publish(self) -> None:
        # Under the lock: the step thread and the resolver must not publish a stale pair.
        if self._progress is not None:
            with self._lock:
                self._progress(self.applied, self.resolved)
