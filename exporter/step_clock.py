"""The engine core times its own steps, so the stall check knows what "far too long" is here.

A hang inside a step (a collective or a kernel that never returns) looks, from outside, like a
long step. What tells them apart is this engine's own history: steps on a GPU take well under a
second, the largest prefill chunk is bounded by ``max_num_batched_tokens``, so a step running
many times longer than the longest one seen is hung. The engine core's busy loop calls
``EngineCoreProc._process_engine_step`` once per step; warden wraps it to note when the step
started and ended: two clock reads and a few attribute writes, no I/O, no lock, nothing that
waits. The heartbeat thread (``exporter.heartbeat``) publishes the clock with each beat, and the
API process's stall check (``exporter.stall``) turns it into the threshold in force.

The first ``WARDEN_STALL_WARMUP_STEPS`` steps of an engine are timed but not learned: they
include compilation and warm-up, which never come back at that length.

Test switch ``WARDEN_TEST_HANG_STEP`` (off unless set; the container refuses it with a real
model): a step that finds a request carrying ``vllm_xargs: {"warden_hang": true}`` in the
scheduler never ends, as a hung kernel would, while every thread of the process stays alive;
one that finds ``{"warden_busy_s": S}`` first computes for S seconds of its own CPU time, as a
long kernel would, so that a test can starve it of CPU and see a slow step, not a hang.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from exporter import import_hooks
from exporter.request_args import BUSY_ARG, HANG_ARG
from exporter.settings import load_settings

log = logging.getLogger("warden.exporter")
CORE_MODULE = "vllm.v1.engine.core"
CORE_CLASS = "EngineCoreProc"
STEP_METHOD = "_process_engine_step"


@dataclass
class StepClock:
    """This process's step times. Written by the engine core's main thread only; read by the
    heartbeat thread (each field is one attribute: a reader sees old or new, never half)."""

    warmup_steps: int = 50
    started: float | None = None  # unix time the running step started (None: between steps)
    ended: float | None = None  # unix time the last step ended
    steps: int = 0  # steps ended since start
    longest_s: float = 0.0  # the longest step after the warm-up

    def start(self, now: float) -> None:
        self.started = now

    def end(self, now: float) -> None:
        started = self.started
        self.started = None
        self.ended = now
        self.steps += 1
        if started is not None and self.steps > self.warmup_steps:
            self.longest_s = max(self.longest_s, now - started)

    @property
    def learned_steps(self) -> int:
        return max(0, self.steps - self.warmup_steps)


_clock: StepClock | None = None


def process_clock() -> StepClock | None:
    """The step clock of this process (None where no engine core step was wrapped)."""
    return _clock


def install() -> None:
    """Time every engine step, from the moment ``vllm.v1.engine.core`` is imported."""

    def hook(module: ModuleType) -> None:
        patch(module)

    import_hooks.when_imported(CORE_MODULE, hook)


def patch(core_module: ModuleType, clock: Callable[[], float] = time.time) -> bool:
    """Wrap ``EngineCoreProc._process_engine_step``; False (logged) if vLLM lacks it."""
    global _clock
    core = getattr(core_module, CORE_CLASS, None)
    original = getattr(core, STEP_METHOD, None)
    if core is None or original is None:
        log.warning(
            "warden: %s.%s.%s not found: the stall check uses its fixed limit",
            CORE_MODULE,
            CORE_CLASS,
            STEP_METHOD,
        )
        return False
    if getattr(original, "_warden_timed", False):
        return True
    settings = load_settings()
    step_clock = _clock = StepClock(settings.stall_warmup_steps)
    hang = settings.test_hang_step
    if hang:
        log.warning("warden: WARDEN_TEST_HANG_STEP is set: marked requests hang their step")

    def _process_engine_step(self: Any) -> bool:
        step_clock.start(clock())
        try:
            if hang and _hang_requested(self):
                _hang_forever()
            if hang:
                _compute_for(_busy_requested(self))
            result: bool = original(self)
            return result
        finally:
            step_clock.end(clock())

    _process_engine_step._warden_timed = True  # type: ignore[attr-defined]
    setattr(core, STEP_METHOD, _process_engine_step)
    return True


def _marks(engine_core: Any) -> list[dict[str, Any]]:
    """Test switch only: the ``vllm_xargs`` of every request in the scheduler."""
    requests = getattr(getattr(engine_core, "scheduler", None), "requests", None) or {}
    marks = []
    for request in list(requests.values()):
        params = getattr(request, "sampling_params", None)
        marks.append(getattr(params, "extra_args", None) or {})
    return marks


def _hang_requested(engine_core: Any) -> bool:
    """Test switch only: a request in the scheduler carries ``warden_hang``."""
    return any(extra.get(HANG_ARG) for extra in _marks(engine_core))


def _busy_requested(engine_core: Any) -> float:
    """Test switch only: the longest ``warden_busy_s`` of the requests in the scheduler."""
    seconds = [extra.get(BUSY_ARG) for extra in _marks(engine_core)]
    return max((float(s) for s in seconds if isinstance(s, int | float)), default=0.0)


def _compute_for(seconds: float) -> None:
    """Spin until this thread has had ``seconds`` of CPU: slower, not longer, when starved."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def _hang_forever() -> None:
    log.warning("warden: test switch: this engine step hangs (WARDEN_TEST_HANG_STEP)")
    threading.Event().wait()
