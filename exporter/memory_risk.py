"""Memory risk against the engine's own plan: what the watermark measures on a device.

vLLM plans its memory at start-up: it takes ``gpu_memory_utilization`` of the device (0.92 by
default) for weights, activations and a KV cache sized to fill the rest, and keeps to it. NVML
"used" and PyTorch "reserved" then sit near that fraction on an idle engine and a saturated one
alike, so a raw used/total ratio says nothing about the risk of running out. What does is memory
in use *beyond the plan*, measured against the headroom the plan left on the device:

    risk = (in use - planned) / (device total - planned)        clamped to [0, 1]

0 while the engine stays within its plan, 1 when the device is full. It is computed twice per
device: ``device`` from NVML (this engine's own processes where NVML gives per-process usage, so
a neighbour on a shared GPU does not count; every process on the GPU where it does not, see
``exporter.device_collectors``) and ``allocator`` from PyTorch's reserved bytes (this engine's
caching allocator: fragmentation and leaks in the cache count). The watermark reads the worst.

The plan is the larger of vLLM's budget (its requested memory, on top of what was in use on the
device before it allocated anything) and the peak the engine actually reached while it settled
(the first ``settle_s`` after the collectors start: weights, KV cache, CUDA graphs, the first
batches). The second covers engines whose real footprint exceeds the budget (``kv_cache_memory
_bytes``, or memory vLLM does not account for) and engines whose budget cannot be read. Pure
arithmetic, no device access: the device collectors feed it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The smallest headroom a plan is measured against, as a fraction of the device: an engine
# planned at 100% of the device still gets a finite, meaningful risk.
MIN_MARGIN_FRACTION = 0.01


@dataclass(frozen=True)
class MemoryBudget:
    """What vLLM planned for one device at start-up, where it can be read (None: unknown)."""

    budget_bytes: int | None = None  # vLLM's requested memory (gpu_memory_utilization x total)
    baseline_used_bytes: int | None = None  # in use before vLLM allocated (context, neighbours)


@dataclass(frozen=True)
class MemoryRisk:
    """One device's memory against its plan. Risks are None where the input is unavailable."""

    device: float | None
    allocator: float | None
    planned_used_bytes: int
    planned_reserved_bytes: int
    margin_bytes: int
    settled: bool

    def signals(self) -> dict[str, float]:
        """The available risks by watermark source name."""
        out = {}
        if self.device is not None:
            out["device"] = self.device
        if self.allocator is not None:
            out["allocator"] = self.allocator
        return out


def risk_ratio(in_use: float, planned: float, margin: float) -> float:
    """Share of the margin beyond the plan that ``in_use`` has consumed, in [0, 1]."""
    if margin <= 0:
        return 1.0 if in_use > planned else 0.0
    return min(1.0, max(0.0, (in_use - planned) / margin))


class MemoryPlanner:
    """Learns one device's planned footprint and turns each sample into a MemoryRisk.

    ``observe`` is called by the device collectors with the latest bytes; ``used_bytes`` is
    NVML's view of the whole device (None without NVML), ``reserved_bytes`` PyTorch's.
    """

    def __init__(self, budget: MemoryBudget, settle_s: float, started_at: float) -> None:
        self.budget = budget
        self.settle_s = settle_s
        self.started_at = started_at
        self._baseline_used = budget.baseline_used_bytes
        self._peak_used = 0
        self._peak_reserved = 0

    def settled(self, now: float) -> bool:
        return now - self.started_at >= self.settle_s

    def observe(
        self, used_bytes: int | None, reserved_bytes: int | None, total_bytes: int, now: float
    ) -> MemoryRisk:
        settled = self.settled(now)
        if self._baseline_used is None:
            # The first sample is taken right after the device is initialised, before vLLM
            # loads anything: what is in use then is not the engine's.
            self._baseline_used = int(used_bytes or 0)
        if not settled:
            self._peak_used = max(self._peak_used, int(used_bytes or 0))
            self._peak_reserved = max(self._peak_reserved, int(reserved_bytes or 0))
        budget = self.budget.budget_bytes
        planned_used = self._peak_used
        planned_reserved = self._peak_reserved
        if budget is not None:
            planned_used = max(planned_used, self._baseline_used + budget)
            planned_reserved = max(planned_reserved, budget)
        planned_used = min(planned_used, total_bytes)
        margin = max(total_bytes - planned_used, int(MIN_MARGIN_FRACTION * total_bytes))
        device = None if used_bytes is None else risk_ratio(used_bytes, planned_used, margin)
        allocator = (
            None if reserved_bytes is None else risk_ratio(reserved_bytes, planned_reserved, margin)
        )
        return MemoryRisk(device, allocator, planned_used, planned_reserved, margin, settled)
