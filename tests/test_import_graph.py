"""warden's import graph stays a stack of floors with no circle (docs/architecture.md, "Floors").

Every module of ``warden/`` is parsed (ast, nothing imported); every import of a ``warden.*``
module counts, including those under ``if TYPE_CHECKING:`` and inside functions, since a circle
hidden from the interpreter is still a circle for the reader. An import may go down a floor or
stay in its own package, never up, and never sideways into another package on the same floor.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "warden"
# Lowest first. common: helpers with no warden imports; control: the pure decisions; engine
# and relay: the servers' adapters; supervisor: runs and restarts the engine (so it stands on
# it); stack: the whole stack of processes; cli: the command line over all of them.
FLOORS: dict[str, int] = {
    "common": 0,
    "control": 1,
    "engine": 2,
    "relay": 2,
    "supervisor": 3,
    "stack": 4,
    "cli": 5,
}


def module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imported(name: str, text: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The warden modules ``name`` imports (``from pkg import mod`` names the module)."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # warden.x.y.attr -> warden.x.y
                target = target.rpartition(".")[0]
            if target.startswith("warden.") and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    """Module -> the warden modules it imports."""
    known = module_names()
    return {
        name: set(
            imported(name, path.read_text(encoding="utf-8"), path.name == "__init__.py", set(known))
        )
        for name, path in known.items()
    }


def circle(edges: dict[str, set[str]]) -> list[str]:
    """One import circle of ``edges`` (empty: none)."""
    try:
        TopologicalSorter(edges).prepare()
    except CycleError as exc:
        return list(exc.args[1])
    return []


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_package_has_a_floor() -> None:
    packages = {package_of(m) for m in module_names()} - {None}
    assert packages <= set(FLOORS), sorted(packages - set(FLOORS))


def test_no_import_circle_in_warden() -> None:
    found = circle(graph())
    assert not found, " -> ".join(found)


def test_no_import_climbs_to_a_higher_floor() -> None:
    wrong = []
    for source, target in ((s, t) for s, targets in graph().items() for t in targets):
        home, away = package_of(source), package_of(target)
        if home is None or away is None or home == away:
            continue
        if FLOORS[away] >= FLOORS[home]:
            wrong.append(f"{source} ({home}, floor {FLOORS[home]}) -> {target} ({away})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_graph_sees_a_circle_hidden_behind_type_checking() -> None:
    """The checks can fail: an import under TYPE_CHECKING is an edge like any other."""
    known = {"warden.control.a", "warden.control.b"}
    hidden = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from warden.control import b\n"
    )
    plain = "from warden.control.a import something\n"
    edges = {
        "warden.control.a": set(imported("warden.control.a", hidden, False, known)),
        "warden.control.b": set(imported("warden.control.b", plain, False, known)),
    }
    assert edges == {
        "warden.control.a": {"warden.control.b"},
        "warden.control.b": {"warden.control.a"},
    }
    assert circle(edges)
