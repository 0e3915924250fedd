"""``remote_write`` from each Prometheus to a central metrics store (docs/fleets.md).

Beyond one Prometheus, each cluster's Prometheus keeps scraping its engines and evaluating
warden's rules locally (alerts must not depend on a long-haul link), and also streams what it
scrapes and records to a store that keeps every cluster's series (VictoriaMetrics, Mimir,
Thanos Receive: all speak the remote-write protocol and Prometheus's query API, so the
dashboards work on it unchanged). The ``cluster`` external label tells the clusters apart
there; it is one of the mixin's identity labels.

``remote_write_entry`` is the entry to put under ``remote_write:`` in prometheus.yml;
tests/test_remote_write.py runs it against a real VictoriaMetrics.
"""

from __future__ import annotations

from typing import Any

# Only the series warden's dashboards and fleet views read: warden's own, vLLM's, the fleet
# recording rules (``level:metric:operations``) and ``up``. Everything else a Prometheus
# scrapes (node, kube-state...) is not warden's to ship.
WARDEN_SERIES = r"warden_.+|vllm:.+|[a-z_]+:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+|up"


def remote_write_entry(
    url: str, *, keep_names: str | None = WARDEN_SERIES, bearer_token_file: str | None = None
) -> dict[str, Any]:
    """One ``remote_write`` entry. ``keep_names``: a regex on metric names to ship (None:
    everything). Queue settings bound memory when the store is slow or down: Prometheus keeps
    up to ~2 h of WAL and resends from it once the store is back."""
    entry: dict[str, Any] = {
        "url": url,
        "queue_config": {
            "capacity": 10000,
            "max_shards": 10,
            "max_samples_per_send": 2000,
            "batch_send_deadline": "5s",
        },
    }
    if keep_names is not None:
        entry["write_relabel_configs"] = [
            {"source_labels": ["__name__"], "regex": keep_names, "action": "keep"}
        ]
    if bearer_token_file is not None:
        entry["authorization"] = {"type": "Bearer", "credentials_file": bearer_token_file}
    return entry
