"""Turn the dashboard sources into the committed files: dashboard JSON and Grafana provisioning.

``render_all`` is pure and deterministic (sorted keys, fixed ids), so ``warden generate --check``
can compare it byte for byte with the repository.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard

from alerts.config import DEFAULT, MixinConfig
from dashboards import faults, fleet, memory, overview
from dashboards.provisioning import render_provisioning
from dashboards.queries import using

GENERATED_DIR = "dashboards/generated"
REPO_ROOT = Path(__file__).resolve().parent.parent

# Dashboard uid -> builder, in the order Grafana's dashboard list and the renderer use.
BUILDERS: dict[str, Callable[[], Dashboard]] = {
    overview.UID: overview.dashboard,
    memory.UID: memory.dashboard,
    faults.UID: faults.dashboard,
    fleet.UID: fleet.dashboard,
}


def dashboard_models(config: MixinConfig = DEFAULT) -> dict[str, dict[str, Any]]:
    """Dashboard uid -> the JSON model Grafana loads (plain dicts and lists), for ``config``."""
    models: dict[str, dict[str, Any]] = {}
    with using(config):
        for uid, build in BUILDERS.items():
            models[uid] = json.loads(json.dumps(build().to_json_data(), cls=DashboardEncoder))
    return models


def dashboard_path(uid: str) -> str:
    return f"{GENERATED_DIR}/{uid}.json"


def render_dashboards(config: MixinConfig = DEFAULT) -> dict[str, str]:
    """Repo-relative path -> dashboard JSON, for ``config``."""
    return {
        dashboard_path(uid): json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for uid, model in dashboard_models(config).items()
    }


def render_all() -> dict[str, str]:
    """Repo-relative path -> content of every generated file (dashboards and provisioning)."""
    files = render_dashboards()
    files.update(render_provisioning())
    return files


def write_all(root: Path = REPO_ROOT) -> list[Path]:
    """Write every generated file under ``root``; returns the paths written."""
    written = []
    for relative, content in render_all().items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        written.append(path)
    return written


def stale_files(root: Path = REPO_ROOT) -> list[str]:
    """Repo-relative paths whose committed content differs from what the sources produce."""
    stale = []
    for relative, content in render_all().items():
        path = root / relative
        if not path.is_file() or path.read_text(encoding="utf-8") != content:
            stale.append(relative)
    return stale


def main(argv: list[str] | None = None) -> int:
    """``python -m dashboards.generate [--check]``: write the files, or list stale ones."""
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        stale = stale_files()
        for relative in stale:
            print(f"stale: {relative} (run `warden generate`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_all():
        print(path.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
