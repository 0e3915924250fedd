"""Alerts as code: recording rules, alert rules, the Alertmanager configuration, and the
promtool tests that pin them down. ``alerts.generate.render_all()`` renders every file.

``ENGINE_JOB`` is the Prometheus job name of the engine target: the scrape config must use it,
since ``WardenEngineDown`` watches ``up`` of that job.
"""

from alerts.config import ENGINE_JOB

__all__ = ["ENGINE_JOB"]
