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

# The scrape interval of the compose and Kubernetes Prometheus. Grafana sizes
# $__rate_interval from it (at least 4 scrapes); it must not be below the real interval, or
# rate() windows hold too few samples.
SCRAPE_INTERVAL: Final = "5s"


def datasource_ref() -> dict[str, str]:
    """The reference panels, targets, variables and annotations carry (a fresh dict each call)."""
    return {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
