"""Run a function right after a module is imported (at once, if it already is).

vLLM loads warden's plugin early in the API process, before it imports the modules warden
patches (``vllm.v1.engine.core``, for one). On CUDA the engine core is then *forked* from the
API process: the child inherits the parent's classes as they are at fork time and never runs the
plugin again. Patching on import, in the API process, makes the patch part of what the child
inherits; under spawn the child imports the module itself and the same hook patches it there.

A meta-path finder wraps the module's loader; the hook runs once, after the module body, and an
exception in it is logged, never raised into the import (vLLM must start regardless).
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger("warden.exporter")
Hook = Callable[[ModuleType], None]
_hooks: dict[str, list[Hook]] = {}
_lock = threading.Lock()


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is imported: now, or right after its import."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _PostImportFinder())
            return
    _run(hook, module)


def pending(name: str) -> bool:
    """Whether hooks still wait for ``name`` to be imported."""
    return bool(_hooks.get(name))


def _run(hook: Hook, module: ModuleType) -> None:
    try:
        hook(module)
    except Exception:
        log.exception("warden: hook on import of %s failed; vLLM is unaffected", module.__name__)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, fullname)
                return spec
        return None


class _HookedLoader(importlib.abc.Loader):
    """The module's own loader, plus the hooks after ``exec_module``."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            hooks = _hooks.pop(self._name, [])
        for hook in hooks:
            _run(hook, module)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, is_package...: answered by the real loader.
        return getattr(self._loader, name)
