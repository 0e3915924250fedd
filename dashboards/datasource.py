"""The one Prometheus datasource every dashboard panel and the Grafana provisioning share.

Panels reference the datasource by a fixed uid instead of by name or a ``${datasource}``
variable, so the provisioned dashboards work on first load and a test can check that every
query is bound to the datasource Grafana actually has.
"""

from __future__ import annotations

from typing import Final

DATASOURCE_UID: Final = "warden-prometheus"
DATASOURCE_TYPE: Final = "prometheus"
DATASOURCE_NAME: Final = "Prometheus (warden)"

# Where Grafana reaches Prometheus inside the compose network.
COMPOSE_PROMETHEUS_URL: Final = "http://prometheus:9090"

# Grafana's guess at the scrape interval, used for $__rate_interval (at least 4 scrapes).
# Keep it at or above the real scrape interval, or rate() windows hold too few samples.
SCRAPE_INTERVAL: Final = "15s"


def datasource_ref() -> dict[str, str]:
    """The reference panels, targets, variables and annotations carry (a fresh dict each call)."""
    return {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
