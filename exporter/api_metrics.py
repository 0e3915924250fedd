"""vLLM's own metrics kept in the API server's memory, not in the multiprocess folder.

Warden sets ``PROMETHEUS_MULTIPROC_DIR`` so that what the engine core and the workers measure
reaches ``/metrics``. In that mode prometheus_client backs every value of every process with
a memory-mapped file: each ``inc``, ``set`` and ``observe`` also asks the kernel for the pid
and writes the file. vLLM's own metrics are all written in the API server (its stat logger
runs there, after every engine step: one histogram observation per generated token, a dozen
per finished request), and plain vLLM, without the folder, keeps them in plain floats. In the
folder they cost the API server about 3 us more per observation, a few percent of its CPU per
request, on the core it shares with the engine.

So, in the API server only, a metric whose name starts with ``vllm:`` gets prometheus_client's
in-memory value (``install``); warden's own metrics stay in the folder, where the same name
written by several processes is merged. ``/metrics`` then has two sources, merged by
``ApiServerCollector``: the folder, less those names, and this process's registry, for them.
vLLM's own ``/metrics`` route reads the folder only, so warden's middleware serves the path
when ``serves_metrics()`` says so (warden/engine/middleware.py).

Installed only where it is safe: in the first process of the engine's tree (the API server;
never a forked engine process, which inherits the patched class but checks the pid), when the
folder is set and warden's middleware is on vLLM's command line. Where vLLM runs several API
servers, their launcher is the first process and each API server keeps the folder: they all
write the same names there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

IN_MEMORY_PREFIX = "vllm:"
# Suffixes of the samples a family may have (counter, histogram, gauge histogram, info).
_SAMPLE_SUFFIXES = ("", "_total", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")

_lock = threading.Lock()
_state: dict[str, Any] = {}
_local_names: set[str] = set()  # families whose values live in this process's memory


def install(pid: int | None = None) -> bool:
    """From now on, in process ``pid`` (default: this one), metrics named ``vllm:...`` keep
    their values in memory. True once installed (again: a no-op)."""
    with _lock:
        if "pid" in _state:
            return True
        path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        folder_class = values.ValueClass
        if not path or not getattr(folder_class, "_multiprocess", False):
            return False
        owner = os.getpid() if pid is None else pid

        def value_class(typ: str, metric_name: str, name: str, *args: Any, **kwargs: Any) -> Any:
            if metric_name.startswith(IN_MEMORY_PREFIX) and os.getpid() == owner:
                _local_names.add(metric_name)
                return values.MutexValue(typ, metric_name, name, *args, **kwargs)
            return folder_class(typ, metric_name, name, *args, **kwargs)

        values.ValueClass = value_class  # type: ignore[misc]
        _state.update(pid=owner, path=path, folder_class=folder_class)
        return True


def serves_metrics() -> bool:
    """True in the process whose ``/metrics`` must merge its memory with the folder."""
    return _state.get("pid") == os.getpid()


class ApiServerCollector(Collector):
    """The folder's families, less those this process keeps in memory, then those."""

    def __init__(self, path: str | None = None, registry: Any = REGISTRY) -> None:
        self.path = path or _state.get("path") or os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        local = frozenset(_local_names) if serves_metrics() else frozenset()
        if self.path and os.path.isdir(self.path):
            for family in MultiProcessCollector(None, path=self.path).collect():
                if family.name not in local:
                    yield family
        if local:
            yield from _restricted(self.registry, local)


def _restricted(registry: Any, families: Iterable[str]) -> Iterator[Any]:
    """This process's families named in ``families``, as the folder would give them: no
    ``_created`` samples (the folder has none, and they would only add series)."""
    names = [f"{family}{suffix}" for family in families for suffix in _SAMPLE_SUFFIXES]
    yield from registry.restricted_registry(names).collect()
