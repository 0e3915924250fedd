"""``warden generate --config FILE --out DIR``: the mixin for a user's own Prometheus.

The repository's files come from the default mixin config; a user whose scrape job, identity
labels, thresholds, links or receivers differ writes a mixin config (YAML, the fields of
``alerts.config.MixinConfig``) and gets the same set of files for it: rules (recording and
alerting), the Alertmanager config, and the dashboards. docs/fleets.md has an example.
"""

from __future__ import annotations

import json

from alerts.alertmanager import render_compose_alertmanager_config
from alerts.config import MixinConfig
from alerts.rules_file import render_rules
from dashboards.generate import dashboard_models

RULES_FILE = "rules.yml"
ALERTMANAGER_FILE = "alertmanager.yml"
DASHBOARDS_DIR = "dashboards"


def render_mixin(config: MixinConfig) -> dict[str, str]:
    """Path relative to the output folder -> content, for ``config``."""
    files = {
        RULES_FILE: render_rules(config),
        ALERTMANAGER_FILE: render_compose_alertmanager_config(config),
    }
    for uid, model in dashboard_models(config).items():
        text = json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        files[f"{DASHBOARDS_DIR}/{uid}.json"] = text
    return files
