"""Alerts as code: recording rules, alert rules and the Alertmanager configuration, generated
from one mixin config (``alerts.config.MixinConfig``); ``alerts.generate.render_all()`` renders
the repository's files from the default config.

``ENGINE_JOB`` is the Prometheus job name of the engine target in the stacks this repository
ships; the default config selects it (``engine_selector``), so their scrape configs must use it.
"""

from alerts.config import ENGINE_JOB

__all__ = ["ENGINE_JOB"]
