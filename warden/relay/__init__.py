"""warden relay: one Alertmanager receiver for a whole fleet of engines.

Alertmanager cannot template a webhook URL from an alert's labels, so a fleet would otherwise
need one receiver per engine, regenerated whenever the fleet changes. The relay is that one
receiver: it reads each alert's identity labels, finds the engine they name in Prometheus's own
list of scrape targets (the same targets the alert was computed from), and forwards the alert
to that engine's webhook with the same bearer token, retrying transient failures a bounded
number of times. Scaling the fleet changes Prometheus's targets, not Alertmanager's config.

- ``directory``: who the engines are and where their webhooks listen (Prometheus targets, or a
  URL template for static fleets).
- ``split``: which alert goes to which engine (pure).
- ``deliver``: one POST per engine, bounded retries.
- ``server``: the HTTP receiver, its auth and metrics; ``warden relay`` runs it.
"""
