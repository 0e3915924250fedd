"""Engine processes say they are alive and whether a step is running, so that the stall check
can tell one long step from a hung engine.

The stall check (``exporter.stall``) sees steps *end*, in the API process. When none ends for
a while with requests waiting, either a single step is long (a long prefill on a slow CPU, a
huge batch) or the engine is hung. Only the engine processes know which, so each of them (the
engine core, the workers) runs a daemon thread that every second rewrites one small file
named after its pid in a folder next to the signal board:

- the file's modification time is the process's heartbeat: a stopped process (SIGSTOP, a
  frozen host, a thread holding the GIL forever) stops beating;
- its content says whether the process's main thread is inside an engine step now, and since
  when (``step <unix time>``), or ``idle``; in the engine core it adds the step clock
  (``exporter.step_clock``): ``longest=<s> learned=<steps>``, the longest step after the
  warm-up and how many steps that is learned from. Where the clock runs, the step's start is
  the clock's; elsewhere the thread looks at the main thread's stack
  (``sys._current_frames``): nothing is added to the step path for the beat.

A process that exits normally removes its file. Everything happens on the beat thread and on
the API process's collector thread; a failure here is counted and skipped like any collector.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from exporter.step_clock import StepClock, process_clock
from exporter.step_clock import install as time_engine_steps

INTERVAL_S = 1.0
# Frames of vLLM 0.32's engine core that run one engine step (EngineCoreProc and the data
# parallel DPEngineCoreProc both call it from their busy loop); tests check the name exists.
STEP_FUNCTIONS = frozenset({"_process_engine_step"})
STEP_MODULE = "vllm.v1.engine.core"
IDLE = "idle"


def heartbeat_dir(signal_board: Path | str) -> Path:
    """The folder beside the process tree's signal board (both die with the API process)."""
    return Path(f"{signal_board}.heartbeats")


# Frames of a worker process running its part of a step (the model, then sampling), called
# from the worker's busy loop once per step. Between steps a worker waits for the next one, and
# vLLM's message queue spins for a while doing so: that waiting is not a step, and its CPU
# wait must not be taken off a hung step's age (exporter.stall).
WORKER_STEP_FRAMES = frozenset(
    {
        ("execute_model", "vllm.v1.worker.worker_base"),
        ("execute_model", "vllm.v1.worker.gpu_worker"),
        ("sample_tokens", "vllm.v1.worker.gpu_worker"),
    }
)


def _is_step_frame(name: str, module: object) -> bool:
    engine_step = name in STEP_FUNCTIONS and module == STEP_MODULE
    return engine_step or (name, module) in WORKER_STEP_FRAMES


def main_thread_in_step() -> bool:
    """Whether this process's main thread is inside an engine step right now: the engine
    core's step, or a worker's part of one."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None:
        if _is_step_frame(frame.f_code.co_name, frame.f_globals.get("__name__")):
            return True
        frame = frame.f_back
    return False


class Heartbeat:
    """The engine-process side: a daemon thread beating into ``directory/<pid>``."""

    def __init__(
        self,
        directory: Path,
        in_step: Callable[[], bool] = main_thread_in_step,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.time,
        steps: Callable[[], StepClock | None] = process_clock,
    ) -> None:
        self.pid = os.getpid()
        self.path = directory / str(self.pid)
        self.in_step = in_step
        self.steps = steps
        self.interval_s = interval_s
        self.clock = clock
        self.step_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        now = self.clock()
        timed = self.steps()
        if timed is not None:
            # The clock wraps the whole step: its start, not that of a run of back-to-back
            # steps, which the stack cannot tell apart.
            self.step_since = timed.started
        elif self.in_step():
            self.step_since = self.step_since or now
        else:
            self.step_since = None
        text = IDLE if self.step_since is None else f"step {self.step_since:.3f}"
        if timed is not None:
            text += f" longest={timed.longest_s:.3f} learned={timed.learned_steps}"
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(text)
        os.replace(temporary, self.path)  # readers never see half a file

    def start(self) -> None:
        time_engine_steps()  # the engine core's steps, timed for the beat to publish
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="warden-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a full disk must not end the beat for good
                self.beat()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        with contextlib.suppress(OSError):
            self.path.unlink()


def engine_pids(directory: Path | None) -> set[int]:
    """This process and every engine process beating in ``directory``: the engine's own
    processes, whose device memory is this engine's (NVML per process)."""
    pids = {os.getpid()}
    with contextlib.suppress(OSError):
        if directory is not None:
            pids.update(int(entry.name) for entry in os.scandir(directory) if entry.name.isdigit())
    return pids


@dataclass(frozen=True)
class Beat:
    """One engine process as its heartbeat file tells it."""

    pid: int
    age_s: float  # since its last beat
    step_since: float | None  # inside an engine step since then (None: not in a step)
    alive: bool  # the process still exists (and is not a zombie)
    longest_s: float = 0.0  # the engine core's longest step after its warm-up
    learned_steps: int = 0  # how many steps that is learned from (0: no step clock)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def parse_beat(pid: int, age_s: float, text: str, alive: bool) -> Beat:
    """One heartbeat file's text (``idle`` or ``step <since>``, then ``key=value`` fields)."""
    words = text.split()
    since = float(words[1]) if words and words[0] == "step" else None
    fields = dict(word.split("=", 1) for word in words if "=" in word)
    longest = float(fields.get("longest", 0.0))
    learned = int(fields.get("learned", 0))
    return Beat(pid, age_s, since, alive, longest, learned)


def read_beats(directory: Path, now: float) -> list[Beat]:
    """Every engine process's last beat (an empty list when the folder does not exist)."""
    beats = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError):
                age = now - entry.stat().st_mtime
                text = Path(entry.path).read_text().strip()
                pid = int(entry.name)
                beats.append(parse_beat(pid, age, text, _alive(pid)))
    return beats
