"""The meters benchmarks.api_cpu_breakdown installs in a live API server: what they count.

A meter that counts the wrong stretches would put warden's cost in the wrong hook, or vLLM's
in warden's: each case burns known CPU on one side and checks where it lands."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
import types
from pathlib import Path

import pytest

from benchmarks import api_cpu_probe
from benchmarks.api_cpu_breakdown import MIDDLEWARE_OWN, breakdown
from benchmarks.api_cpu_probe import (
    MIDDLEWARE_APP,
    MIDDLEWARE_TOTAL,
    MeteredAwaitable,
    Meters,
    meter_middleware,
    metered,
)

MS = 1_000_000  # nanoseconds


def burn(cpu_ms: float) -> None:
    """Spin until this thread has used ``cpu_ms`` of CPU."""
    until = time.thread_time_ns() + int(cpu_ms * MS)
    while time.thread_time_ns() < until:
        pass


def test_a_metered_call_counts_its_own_cpu_and_its_exceptions() -> None:
    meters = Meters()

    def work(cpu_ms: float, fail: bool = False) -> str:
        burn(cpu_ms)
        if fail:
            raise ValueError("boom")
        return "done"

    call = metered(work, "work", meters)
    assert call(20) == "done"
    calls, first = meters.readings["work"]
    assert calls == 1 and 20 * MS <= first < 40 * MS
    with pytest.raises(ValueError):
        call(10, fail=True)
    calls, nanoseconds = meters.readings["work"]
    assert calls == 2
    assert 10 * MS <= nanoseconds - first < 20 * MS


def test_an_awaited_coroutine_counts_its_stretches_not_its_waits() -> None:
    meters = Meters()

    async def handler() -> int:
        burn(15)
        await asyncio.sleep(0.2)  # suspended: a wait costs this thread nothing of its own
        burn(15)
        return 7

    async def main() -> int:
        return int(await MeteredAwaitable(handler(), "handler", meters))

    assert asyncio.run(main()) == 7
    calls, nanoseconds = meters.readings["handler"]
    assert calls == 1
    assert 30 * MS <= nanoseconds < 60 * MS  # 200 ms of waiting left out


def test_an_exception_thrown_into_a_metered_coroutine_reaches_it() -> None:
    """Cancellation arrives through ``throw``: the coroutine must see it, and the call count."""
    meters = Meters()
    seen: list[str] = []

    async def handler() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        task = asyncio.ensure_future(MeteredAwaitable(handler(), "handler", meters))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen == ["cancelled"]
    assert meters.readings["handler"][0] == 1


def test_the_middleware_s_own_cpu_is_its_total_less_the_app_it_calls() -> None:
    """The shape of warden's middleware: stages holding the app it wraps."""
    meters = Meters()

    class Stage:
        def __init__(self, app: object) -> None:
            self.app = app

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        burn(40)
        await asyncio.sleep(0.05)
        burn(40)

    class Middleware:
        def __init__(self, app: object) -> None:
            self.app = app
            self.stage = Stage(app)

        async def __call__(self, scope: dict[str, object], receive: object, send: object) -> None:
            burn(20)
            await self.stage.app(scope, receive, send)  # type: ignore[operator]

    meter_middleware(Middleware, meters)
    middleware = Middleware(app)

    async def main() -> None:
        for _ in range(2):
            await middleware({}, None, None)

    asyncio.run(main())
    total, inside = meters.readings[MIDDLEWARE_TOTAL], meters.readings[MIDDLEWARE_APP]
    assert total[0] == inside[0] == 2
    assert 160 * MS <= inside[1] < 240 * MS  # the app's 80 ms, twice
    own = total[1] - inside[1]
    assert 40 * MS <= own < 80 * MS  # the middleware's 20 ms, twice; the app's left out
    rows = {r["hook"]: r for r in breakdown({}, meters.snapshot(), completed=2, api_ms=200.0)}
    assert rows[MIDDLEWARE_OWN]["ms_per_request"] == pytest.approx(own / MS / 2)
    assert rows[MIDDLEWARE_OWN]["share"] == pytest.approx(own / MS / 2 / 200.0)


def test_the_hooks_metered_are_methods_warden_still_has() -> None:
    """A hook renamed in warden would go unmetered, and its cost unreported, without this."""
    for cls, method in api_cpu_probe.hook_targets():
        assert callable(getattr(cls, method)), f"{cls.__name__}.{method}"
    from warden.engine.middleware import WardenMiddleware

    assert callable(WardenMiddleware.__call__)


def test_meters_written_by_one_process_are_read_back_by_pid(tmp_path: Path) -> None:
    meters = Meters()
    meters.add("record", 5_000)
    api_cpu_probe.write(meters, tmp_path)
    assert api_cpu_probe.read(tmp_path, os.getpid()) == {"record": [1, 5_000]}
    assert api_cpu_probe.read(tmp_path, os.getpid() + 1) == {}


def test_a_named_hook_is_parsed_or_refused() -> None:
    assert api_cpu_probe.parse_hook("warden.engine.routes:verdict_of") == (
        "warden.engine.routes",
        "",
        "verdict_of",
        "warden.engine.routes:verdict_of",
    )
    assert api_cpu_probe.parse_hook(" a.b:Cls.meth ")[:3] == ("a.b", "Cls", "meth")
    for bad in ("nocolon", ":f", "m:", "m:a.b.c", "m:a."):
        with pytest.raises(ValueError):
            api_cpu_probe.parse_hook(bad)
    assert api_cpu_probe.extra_hooks(None) == ()
    assert len(api_cpu_probe.extra_hooks("m:f, m:C.g ,")) == 2


def test_a_named_coroutine_function_is_metered_by_its_stretches() -> None:
    """A module-level coroutine function, patched where its module looks it up."""
    module = types.ModuleType("probe_target")

    async def handle() -> str:
        burn(10)
        await asyncio.sleep(0.1)
        burn(10)
        return "ok"

    module.handle = handle  # type: ignore[attr-defined]
    meters = Meters()
    sys.modules["probe_target"] = module
    try:
        hooks = api_cpu_probe.extra_hooks("probe_target:handle")
        done: set[str] = set()
        # Not warden's middleware: this process's class is shared with the other tests.
        api_cpu_probe.patch_loaded(meters, done, hooks, middleware=False)
        api_cpu_probe.patch_loaded(meters, done, hooks, middleware=False)  # metered once
        assert asyncio.run(module.handle()) == "ok"
    finally:
        del sys.modules["probe_target"]
    calls, nanoseconds = meters.readings["probe_target:handle"]
    assert calls == 1
    assert 20 * MS <= nanoseconds < 40 * MS
    from warden.engine.middleware import WardenMiddleware

    assert WardenMiddleware.__call__.__qualname__ == "WardenMiddleware.__call__"  # untouched


def test_garbage_collection_is_metered_by_generation_on_the_collecting_thread() -> None:
    meters = Meters()
    full_label, young_label = api_cpu_probe.GC_LABEL.format(2), api_cpu_probe.GC_LABEL.format(0)
    callback = api_cpu_probe.meter_garbage_collection(meters)
    was_enabled = gc.isenabled()
    try:
        cycles = []
        for _ in range(200_000):
            node: list[object] = []
            node.append(node)  # a cycle: only the collector frees it
            cycles.append(node)
        del cycles, node
        gc.disable()  # no automatic collection, on any thread, between the reads below
        full_before = meters.entry(full_label).copy()
        gc.collect(2)
        young_before = meters.entry(young_label).copy()
        gc.collect(0)
    finally:
        if was_enabled:
            gc.enable()
        gc.callbacks.remove(callback)
    full = [a - b for a, b in zip(meters.readings[full_label], full_before, strict=True)]
    young = [a - b for a, b in zip(meters.readings[young_label], young_before, strict=True)]
    # Exactly the collections asked for (the allocations above made more before).
    assert full[0] == 1 and young[0] == 1
    # 200,000 cycles take a full collection milliseconds; a young one right after, far less.
    assert full[1] > 1 * MS and young[1] < full[1]
    before = meters.snapshot()
    gc.collect(2)
    assert meters.snapshot() == before  # removed: nothing counted any more
