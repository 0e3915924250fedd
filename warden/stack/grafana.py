"""Grafana for the native stack, when a Grafana binary is installed.

Grafana is configured entirely through ``GF_*`` variables and a provisioning folder in the run
directory: the Prometheus datasource (fixed uid, pointing at the native Prometheus) and the
dashboard JSON, both rendered by the dashboards package, as compose mounts them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from dashboards.generate import render_all as render_dashboards
from dashboards.provisioning import dashboard_provider_config, datasource_config, to_yaml

# Newer releases ship one `grafana` binary (`grafana server`), older ones `grafana-server`.
GRAFANA_BINARIES = ("grafana", "grafana-server")
HOMEPATH_CANDIDATES = (Path("/usr/share/grafana"), Path("/usr/local/share/grafana"))


@dataclass(frozen=True)
class GrafanaInstall:
    binary: Path
    homepath: Path

    def argv(self) -> list[str]:
        if self.binary.name == "grafana":
            return [str(self.binary), "server", f"--homepath={self.homepath}"]
        return [str(self.binary), f"--homepath={self.homepath}"]


def _homepath(binary: Path) -> Path | None:
    """Where conf/defaults.ini is: next to bin/ in a tarball, /usr/share/grafana in packages."""
    for candidate in (binary.resolve().parent.parent, *HOMEPATH_CANDIDATES):
        if (candidate / "conf" / "defaults.ini").is_file():
            return candidate
    return None


def find_grafana() -> GrafanaInstall | None:
    """The first Grafana binary on PATH with a usable home, or None."""
    for name in GRAFANA_BINARIES:
        found = shutil.which(name)
        if found is None:
            continue
        home = _homepath(Path(found))
        if home is not None:
            return GrafanaInstall(Path(found), home)
    return None


def grafana_files(root: Path, prometheus_url: str, host: str, port: int) -> dict[str, str]:
    """Write provisioning and dashboards under ``root``; return the ``GF_*`` environment."""
    provisioning = root / "provisioning"
    dashboards_dir = root / "dashboards"
    for sub in ("datasources", "dashboards", "plugins", "alerting"):
        (provisioning / sub).mkdir(parents=True, exist_ok=True)
    dashboards_dir.mkdir(parents=True, exist_ok=True)
    (provisioning / "datasources" / "warden.yaml").write_text(
        to_yaml(datasource_config(prometheus_url)), encoding="utf-8"
    )
    (provisioning / "dashboards" / "warden.yaml").write_text(
        to_yaml(dashboard_provider_config(str(dashboards_dir))), encoding="utf-8"
    )
    for relative, content in render_dashboards().items():
        if relative.endswith(".json"):
            (dashboards_dir / Path(relative).name).write_text(content, encoding="utf-8")
    return grafana_environment(root, host, port)


def grafana_environment(root: Path, host: str, port: int) -> dict[str, str]:
    """The same settings compose gives its Grafana, with paths in the run directory."""
    return {
        "GF_PATHS_DATA": str(root / "data"),
        "GF_PATHS_LOGS": str(root / "logs"),
        "GF_PATHS_PLUGINS": str(root / "plugins"),
        "GF_PATHS_PROVISIONING": str(root / "provisioning"),
        "GF_SERVER_HTTP_ADDR": host,
        "GF_SERVER_HTTP_PORT": str(port),
        "GF_AUTH_ANONYMOUS_ENABLED": "true",
        "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
        "GF_ANALYTICS_REPORTING_ENABLED": "false",
        "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
    }
