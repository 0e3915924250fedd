"""The registry's mechanics: a named, ordered set of actions, and live views of it.

Registry order is the order refusals are checked in (the widest refusal names the reason).
Everything that lists actions reads the registry when it runs, not when it is imported, so an
action registered later (a plugin, a test's toy) is known to the webhook, the reflex's config,
the manual CLI, the gauges and the docs alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

from warden.control.actions.base import PREEMPT, Action, Param, Refuse


class Registry:
    def __init__(self, *actions: Action) -> None:
        self.by_name: dict[str, Action] = {}
        self._ordered: tuple[Action, ...] = ()
        self._checks: tuple[tuple[str, Refuse], ...] = ()
        for action in actions:
            self.register(action)

    def register(self, action: Action) -> Action:
        """Add ``action`` (checked: a new name, fields no other action owns)."""
        if action.name in self.by_name:
            raise ValueError(f"action {action.name!r} is registered already")
        owned = self.field_defaults()
        taken = [name for name in action.fields if name in owned or name == "retry_after_s"]
        if taken:
            raise ValueError(f"action {action.name!r}: fields {taken} belong to another action")
        names = {p.name for p in (*action.params, *action.extra_params)}
        if PREEMPT.name in names:
            raise ValueError(f"action {action.name!r}: {PREEMPT.name} is shared, not a param")
        self.by_name[action.name] = action
        self._changed()
        return action

    def unregister(self, name: str) -> None:
        del self.by_name[name]
        self._changed()

    def _changed(self) -> None:
        # Read on every request: computed once per registration, not per request.
        self._ordered = tuple(self.by_name.values())
        firsts = [(a.name, check) for a in self._ordered if (check := a.refuse) is not None]
        lasts = [(a.name, check) for a in self._ordered if (check := a.refuse_last) is not None]
        self._checks = (*firsts, *lasts)

    def refusal_checks(self) -> tuple[tuple[str, Refuse], ...]:
        """(action, check) in the order a request is judged: every action's ``refuse`` in
        registry order, then every ``refuse_last``."""
        return self._checks

    @contextlib.contextmanager
    def registered(self, action: Action) -> Iterator[Action]:
        """``action`` registered for the block (tests)."""
        self.register(action)
        try:
            yield action
        finally:
            self.unregister(action.name)

    def __iter__(self) -> Iterator[Action]:
        return iter(self._ordered)

    def __len__(self) -> int:
        return len(self.by_name)

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def names(self) -> tuple[str, ...]:
        return tuple(self.by_name)

    def reflex_names(self) -> tuple[str, ...]:
        """The actions the local reflex may take."""
        return tuple(a.name for a in self.by_name.values() if a.reflex)

    def field_defaults(self) -> dict[str, Any]:
        """Every action's policy fields at their values while off."""
        return {name: value for a in self.by_name.values() for name, value in a.fields.items()}

    def params(self) -> dict[str, Param]:
        """Every parameter any action takes, by name."""
        out: dict[str, Param] = {}
        for action in self.by_name.values():
            for spec in (*action.params, *action.extra_params):
                out.setdefault(spec.name, spec)
        return out

    def defaults(self, settings: Any = None) -> dict[str, Any]:
        """Parameter name -> the value a lease that does not say gets: the param's fallback,
        or the ``settings`` (admission config) field that overrides it."""
        out = {}
        for name, spec in self.params().items():
            value = spec.fallback
            if settings is not None and spec.setting is not None:
                value = getattr(settings, spec.setting, value)
            if value is not None:
                out[name] = value
        return out

    def protection(self, name: str) -> int:
        """How protective an action is (higher: more); an action this registry does not know
        (a lease from a newer one) counts as the least."""
        action = self.by_name.get(name)
        return -1 if action is None else action.protection

    def protective(self, name: str) -> bool:
        action = self.by_name.get(name)
        return action is not None and action.protective


class LiveNames(Sequence[str]):
    """A tuple-like view of some of the registry's names, read at each use."""

    def __init__(self, registry: Registry, reflex_only: bool = False) -> None:
        self._registry = registry
        self._reflex_only = reflex_only

    def _names(self) -> tuple[str, ...]:
        registry = self._registry
        return registry.reflex_names() if self._reflex_only else registry.names()

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


class LiveActions(Mapping[str, Action]):
    """The registry as a read-only mapping, name -> action, read at each use."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __getitem__(self, name: str) -> Action:
        return self._registry.by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry.names())

    def __len__(self) -> int:
        return len(self._registry)
