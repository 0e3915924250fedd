"""Thread-CPU meters for warden's hooks, installed inside a live API server.

``benchmarks.api_cpu_breakdown`` starts a warden engine whose ``sitecustomize`` calls
``install()``: a daemon thread wraps each hook of ``HOOKS`` as soon as its module is imported
and writes what the meters read to ``<API_CPU_PROBE_DIR>/<pid>.json`` twice a second. A
sampling profiler could not say this: py-spy sampled warden's API server 1.2x as often as
plain's for 1.08x the CPU and aliased the 4 Hz tick (benchmarks/README.md, quick check 84).

- A plain function or method: the thread CPU time of each call (``time.thread_time_ns``).
- Any other function or method named in ``API_CPU_PROBE_HOOKS`` (``--hook``): comma-separated
  ``module:attribute`` or ``module:Class.method``, patched where the module looks it up (a
  name imported with ``from x import f`` is metered as ``importing_module:f``). A coroutine
  function's calls are metered as their stretches, children awaited inside included.
- Garbage collection, by generation: in every process, plain vLLM's too.
- The middleware (an ASGI coroutine): the CPU of every stretch the coroutine runs between two
  suspensions, less the same for the vLLM app it calls, which runs inside those stretches
  (``MeteredAwaitable``). What is left is the middleware's own CPU, chunk forwarding excepted
  (the app calls it, so it is counted as the app's).

Each meter costs about a microsecond a call (two clock reads): a figure of a few
microseconds a call is mostly the meter's.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import Any

PROBE_DIR_ENV = "API_CPU_PROBE_DIR"
EXTRA_HOOKS_ENV = "API_CPU_PROBE_HOOKS"
# (module, class, method, label): the hooks metered, each a plain call on the API server.
HOOKS: tuple[tuple[str, str, str, str], ...] = (
    ("exporter.stat_logger", "WardenStatLogger", "record", "stat logger: record"),
    ("exporter.step_monitor", "StepMonitor", "on_step", "  of it: full steps"),
    ("exporter.step_monitor", "StepMonitor", "refresh_memory", "tick: refresh between steps"),
    ("warden.control.controller", "Controller", "policy", "tick and answers: policy"),
    ("exporter.collectors", "CollectorRunner", "run_once", "collector thread"),
    ("exporter.stall", "StallCollector", "collect", "  of it: stall"),
    ("exporter.host_memory", "HostMemoryCollector", "collect", "  of it: host memory"),
)
MIDDLEWARE = ("warden.engine.middleware", "WardenMiddleware")
MIDDLEWARE_TOTAL = "middleware with the app"
MIDDLEWARE_APP = "  the app inside it"
GC_LABEL = "garbage collection, generation {}"
WRITE_EVERY_S = 0.5


class Meters:
    """Per label: calls and CPU nanoseconds."""

    def __init__(self) -> None:
        self.readings: dict[str, list[int]] = {}

    def entry(self, label: str) -> list[int]:
        return self.readings.setdefault(label, [0, 0])

    def add(self, label: str, nanoseconds: int) -> None:
        entry = self.entry(label)
        entry[0] += 1
        entry[1] += nanoseconds

    def snapshot(self) -> dict[str, list[int]]:
        return {label: list(entry) for label, entry in self.readings.items()}


def metered(function: Callable[..., Any], label: str, meters: Meters) -> Callable[..., Any]:
    """``function`` with each call's thread CPU time added to ``label`` (a coroutine
    function's: each stretch its coroutine runs, ``MeteredAwaitable``)."""
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def start(*args: Any, **kwargs: Any) -> Any:
            # A coroutine, as the function's callers expect (create_task takes no other).
            return await MeteredAwaitable(function(*args, **kwargs), label, meters)

        return start

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            meters.add(label, time.thread_time_ns() - started)

    return call


class MeteredAwaitable:
    """Awaits ``coroutine``, adding the CPU of each stretch it runs (each ``send``/``throw``)
    to ``label``; one call is counted when it ends."""

    __slots__ = ("coroutine", "label", "meters")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], label: str, meters: Meters) -> None:
        self.coroutine = coroutine
        self.label = label
        self.meters = meters

    def __await__(self) -> Generator[Any, Any, Any]:
        entry = self.meters.entry(self.label)
        value: Any = None
        error: BaseException | None = None
        try:
            while True:
                started = time.thread_time_ns()
                try:
                    if error is None:
                        suspended = self.coroutine.send(value)
                    else:
                        suspended = self.coroutine.throw(error)
                except StopIteration as stop:
                    return stop.value
                finally:
                    entry[1] += time.thread_time_ns() - started
                try:
                    value, error = (yield suspended), None
                except BaseException as thrown:  # handed to the coroutine, as await would
                    value, error = None, thrown
        finally:
            entry[0] += 1


def meter_middleware(cls: Any, meters: Meters) -> None:
    """Meter ``cls.__call__`` and, inside it, the app each instance wraps (its stages hold the
    same app: each reference is swapped on the instance's first call)."""
    original = cls.__call__

    def call(self: Any, scope: Any, receive: Any, send: Any) -> Any:
        if not getattr(self, "_probe_metered", False):
            self._probe_metered = True
            app = self.app

            def metered_app(scope: Any, receive: Any, send: Any) -> Any:
                # An awaitable, not a coroutine of its own: a frame here would add its resumes
                # (one per streamed chunk) to the middleware's own figure.
                return MeteredAwaitable(app(scope, receive, send), MIDDLEWARE_APP, meters)

            for holder in [self, *(v for v in vars(self).values() if hasattr(v, "__dict__"))]:
                for name, value in list(vars(holder).items()):
                    if value is app:
                        setattr(holder, name, metered_app)
        return MeteredAwaitable(original(self, scope, receive, send), MIDDLEWARE_TOTAL, meters)

    cls.__call__ = call


def meter_garbage_collection(meters: Meters) -> Callable[[str, dict[str, int]], None]:
    """Add the thread CPU of each garbage collection, by generation, to ``meters``: the
    interpreter's own cost of the objects a process allocates, in no hook's figure (a
    collection falls in whichever call allocated past the threshold). The callback is
    returned; it is registered in ``gc.callbacks``."""
    started: dict[int, int] = {}

    def callback(phase: str, info: dict[str, int]) -> None:
        thread = threading.get_ident()
        if phase == "start":
            started[thread] = time.thread_time_ns()
        elif thread in started:
            spent = time.thread_time_ns() - started.pop(thread)
            meters.add(GC_LABEL.format(info.get("generation", "?")), spent)

    gc.callbacks.append(callback)
    return callback


def parse_hook(spec: str) -> tuple[str, str, str, str]:
    """``module:attribute`` or ``module:Class.method`` as a HOOKS entry (its label the spec);
    ValueError for anything else."""
    module, sep, path = spec.strip().partition(":")
    parts = path.split(".")
    if not sep or not module or not path or len(parts) > 2 or not all(parts):
        raise ValueError(f"hook {spec!r}: module:function or module:Class.method")
    owner, attribute = (parts[0], parts[1]) if len(parts) == 2 else ("", parts[0])
    return module, owner, attribute, spec.strip()


def extra_hooks(value: str | None) -> tuple[tuple[str, str, str, str], ...]:
    return tuple(parse_hook(spec) for spec in (value or "").split(",") if spec.strip())


def patch_loaded(
    meters: Meters,
    done: set[str],
    hooks: tuple[tuple[str, str, str, str], ...] = HOOKS,
    middleware: bool = True,
) -> None:
    """Meter every hook whose module is imported by now and is not metered yet (and warden's
    middleware, unless ``middleware`` is False)."""
    for module_name, class_name, method, label in hooks:
        key = f"{module_name}.{class_name}.{method}"
        module = sys.modules.get(module_name)
        if key in done or module is None:
            continue
        owner = getattr(module, class_name) if class_name else module
        setattr(owner, method, metered(getattr(owner, method), label, meters))
        done.add(key)
    module = sys.modules.get(MIDDLEWARE[0])
    if middleware and module is not None and "middleware" not in done:
        meter_middleware(getattr(module, MIDDLEWARE[1]), meters)
        done.add("middleware")


def write(meters: Meters, directory: Path) -> None:
    path = directory / f"{os.getpid()}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"at": time.time(), "meters": meters.snapshot()}))
    temporary.replace(path)


def install() -> None:
    """From ``sitecustomize``: meter this process's hooks where ``API_CPU_PROBE_DIR`` is set."""
    target = os.environ.get(PROBE_DIR_ENV)
    if not target:
        return
    directory = Path(target)
    hooks = HOOKS + extra_hooks(os.environ.get(EXTRA_HOOKS_ENV))
    meters = Meters()
    meter_garbage_collection(meters)
    done: set[str] = set()

    def loop() -> None:
        while True:
            time.sleep(WRITE_EVERY_S)
            with contextlib.suppress(Exception):
                patch_loaded(meters, done, hooks)
                if meters.readings:
                    write(meters, directory)

    threading.Thread(target=loop, name="api-cpu-probe", daemon=True).start()


def read(directory: Path, pid: int) -> dict[str, list[int]]:
    """The meters process ``pid`` last wrote (empty before its first write)."""
    with contextlib.suppress(OSError, ValueError):
        found = json.loads((directory / f"{pid}.json").read_text())
        return {k: [int(x) for x in v] for k, v in found["meters"].items()}
    return {}


def sitecustomize_source() -> str:
    """The ``sitecustomize`` the engine under test imports at start-up."""
    return f"import {__name__}\n{__name__}.install()\n"


def hook_targets() -> list[tuple[Any, str]]:
    """(class, method) of each hook: a test holds ``HOOKS`` to names that still exist."""
    return [(getattr(importlib.import_module(m), c), f) for m, c, f, _ in HOOKS]
