"""The stack around an engine: Prometheus, Alertmanager, Grafana, a trace backend and a pager.

Compose (``compose/``), the native ``warden up`` and the Kubernetes manifests are rendered from
the same Python sources, so a rule, a route or a dashboard means the same thing everywhere.
"""
