"""warden's packages are floors: a module imports its own package and the floors below it,
never one above (the stack does not reach into the CLI, control does not reach into the
engine). Read from the source with ``ast``, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

WARDEN = Path(__file__).resolve().parents[1] / "warden"
# Lowest first. A package may import itself and any package before it.
FLOORS = ("common", "control", "engine", "supervisor", "relay", "stack", "cli")


def _imported_packages(path: Path) -> set[tuple[str, int]]:
    """(warden package, line) for every ``warden.<package>`` this module imports."""
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "warden":
                names = [f"warden.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "warden" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return found


def test_every_package_has_a_floor() -> None:
    packages = {p.name for p in WARDEN.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(FLOORS), "name the new package's floor in FLOORS"


@pytest.mark.parametrize("package", FLOORS)
def test_no_import_climbs_to_a_higher_floor(package: str) -> None:
    allowed = set(FLOORS[: FLOORS.index(package) + 1])
    climbs = [
        f"{path.relative_to(WARDEN.parent)}:{line} imports warden.{imported}"
        for path in sorted((WARDEN / package).rglob("*.py"))
        for imported, line in sorted(_imported_packages(path))
        if imported in FLOORS and imported not in allowed
    ]
    assert not climbs, "\n".join(climbs)
