"""Static checks of the alert definitions: names, labels, metrics, runbooks, test coverage.

These read the Python definitions and the generated files; promtool and Alertmanager themselves
run in test_alerts_promtool.py and test_alerts_alertmanager.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import alerts
from alerts import recording as rec
from alerts.alertmanager import (
    ENGINE_RECEIVER,
    PAGER_RECEIVER,
    QUEUE_RECEIVER,
    build_alertmanager_config,
)
from alerts.config import (
    DASHBOARD_UIDS,
    DEFAULT,
    ENGINE_JOB,
    GRAFANA_BASE_URL,
    RUNBOOK_BASE_URL,
    ConfigError,
    MixinConfig,
    load_config,
)
from alerts.fleet import FLEET_RECORDING
from alerts.generate import render_all
from alerts.model import AlertRule, RecordingRule
from alerts.recording import RECORDING_RULES, TORCH_CACHED_GAP
from alerts.rules import ALERT_NAMES, ALERT_RULES
from exporter import catalog
from tests.promtool import TEST_FILES
from tests.promtool.fleet import FLEET_RECORDING_SCENARIOS
from tests.promtool.model import Scenario
from tests.promtool.recording import RECORDING_SCENARIOS

ROOT = Path(__file__).resolve().parents[1]
RUNBOOKS = ROOT / "alerts" / "runbooks.md"

REQUIRED_ALERTS = {
    "WardenMemoryWatermarkHigh",
    "WardenMemoryWatermarkCritical",
    "WardenOOMImminent",
    "WardenTimeToOOM",
    "WardenAllocatorCacheGrowth",
    "WardenMemoryCreepWithCudaGraphs",
    "WardenPreemptionStorm",
    "WardenNonFiniteLogits",
    "WardenRequestRetriesHigh",
    "WardenErrorRateHigh",
    "WardenSaturated",
    "WardenQueueWaitHigh",
    "WardenEngineStalled",
    "WardenEngineDown",
    "WardenRestartLoop",
    "WardenEngineUnhealthy",
    "WardenCollectorErrors",
    "WardenFleetDegraded",
    "WardenWebhookDeliveryFailing",
    "WardenWebhookRejected",
    "WardenRelayDeliveryFailing",
}

# --- PromQL identifiers ---------------------------------------------------------------------
PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"offset", "bool", "inf", "nan"}
)
_STRINGS_AND_COMMENTS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|#[^\n]*')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_SELECTOR = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"")


def metric_names(expr: str) -> set[str]:
    """Series names an expression reads: identifiers that are not functions, keywords, label
    names in matchers or grouping clauses, durations or strings."""
    text = _STRINGS_AND_COMMENTS.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    return {
        match.group(1)
        for match in _IDENTIFIER.finditer(text)
        if match.group(2) is None and match.group(1).lower() not in PROMQL_KEYWORDS
    }


def selector_labels(expr: str) -> list[tuple[str, str]]:
    """(series name, label name) for every label matcher in the expression."""
    text = re.sub(r"#[^\n]*", "", expr)
    return [
        (name, label) for name, body in _SELECTOR.findall(text) for label in _MATCHER.findall(body)
    ]


def test_metric_name_parser_finds_what_it_should() -> None:
    expr = (
        'sum by (instance, outcome) (rate(warden_bogus_total{outcome!="x"}[5m]))\n'
        "# a comment naming not_a_metric\n"
        "/ on (instance) group_left () vllm:num_requests_waiting offset 1h > 1e3\n"
        'and absent(up{job="a b"}) * 0 > bool 0 or label_replace(foo, "dst", "v", "", "")'
    )
    assert metric_names(expr) == {
        "warden_bogus_total",
        "vllm:num_requests_waiting",
        "up",
        "foo",
    }
    assert selector_labels(expr) == [("warden_bogus_total", "outcome"), ("up", "job")]


RECORDED = {
    rule.record: rule
    for group in (RECORDING_RULES, FLEET_RECORDING)
    for rule in group.rules
    if isinstance(rule, RecordingRule)
}
ALL_EXPRESSIONS = [(rule.name, rule.render_expr()) for rule in ALERT_RULES] + [
    (name, rule.render_expr()) for name, rule in RECORDED.items()
]


@pytest.mark.parametrize(("owner", "expr"), ALL_EXPRESSIONS, ids=[n for n, _ in ALL_EXPRESSIONS])
def test_expressions_read_only_known_series(owner: str, expr: str) -> None:
    allowed = catalog.KNOWN_SERIES | catalog.PROMETHEUS_BUILTINS | RECORDED.keys()
    names = metric_names(expr)
    assert names, f"{owner}: no series found in {expr!r}"
    assert names <= allowed, f"{owner} reads unknown series {sorted(names - allowed)}"


def _recorded_labels(record: str) -> set[str]:
    labels: set[str] = set()
    for clause in re.findall(r"\bby\s*\(([^)]*)\)", RECORDED[record].render_expr()):
        labels |= {label.strip() for label in clause.split(",") if label.strip()}
    return labels


@pytest.mark.parametrize(("owner", "expr"), ALL_EXPRESSIONS, ids=[n for n, _ in ALL_EXPRESSIONS])
def test_label_matchers_use_labels_the_series_has(owner: str, expr: str) -> None:
    for name, label in selector_labels(expr):
        if name in RECORDED:
            known = _recorded_labels(name)
        elif name in catalog.PROMETHEUS_BUILTINS:
            known = {"job", "instance"}
        elif name.endswith("_bucket") and name.removesuffix("_bucket") in catalog.BY_NAME:
            known = set(catalog.BY_NAME[name.removesuffix("_bucket")].labels) | {"le"}
        else:
            spec = catalog.BY_NAME.get(name) or catalog.BY_NAME[name.rsplit("_", 1)[0]]
            known = set(spec.labels)
        known |= {"job", "instance"}
        assert label in known, f"{owner}: {name} has no label {label!r}"


def test_recording_rules_follow_naming_and_are_used() -> None:
    """level:metric:operations, with the level naming what the series is per: an engine
    (``instance``...) or a fleet (``job``...); every record read by a rule or a dashboard."""
    from dashboards.generate import dashboard_models

    metrics = {spec.base.replace(":", "_") for spec in catalog.ALL} | {TORCH_CACHED_GAP, "up"}
    used = " ".join(rule.render_expr() for rule in ALERT_RULES) + " ".join(
        rule.render_expr() for rule in RECORDED.values()
    )
    used += json.dumps(dashboard_models())
    tested = {
        check.expr
        for scenario in (*RECORDING_SCENARIOS, *FLEET_RECORDING_SCENARIOS)
        for check in scenario.checks
    }
    for name in RECORDED:
        level, metric, operations = name.split(":")
        assert level.split("_")[0] in ("instance", "job"), name
        assert metric in metrics, f"{name}: {metric} is not a catalog metric"
        assert not metric.endswith("_total"), f"{name}: strip _total"
        assert operations, name
        assert name in used, f"{name} is recorded but no rule reads it"
        assert name in tested, f"{name} has no promql_expr_test"


# --- Conventions ----------------------------------------------------------------------------
def test_required_alerts_exist_and_nothing_else() -> None:
    assert set(ALERT_NAMES) == REQUIRED_ALERTS


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda r: f"{r.name}-{r.severity}")
def test_alert_conventions(rule: AlertRule) -> None:
    assert re.fullmatch(r"Warden[A-Z][A-Za-z0-9]+", rule.name)
    assert rule.severity in ("critical", "warning", "info")
    assert "{{" not in rule.summary, "summary is static"
    description = rule.render_description()
    subject = "$labels.job" if rule.scope == "fleet" else "$labels.instance"
    assert subject in description and "$value" in description
    annotations = rule.annotations()
    assert annotations["runbook_url"] == f"{RUNBOOK_BASE_URL}#{rule.name.lower()}"
    uid = annotations["dashboard_url"].removeprefix(f"{GRAFANA_BASE_URL}/d/")
    assert uid in DASHBOARD_UIDS
    assert rule.render_for() not in ("0s", "0m"), (
        "every alert has a for, and a tested pending state"
    )
    if rule.scope == "fleet":
        assert rule.action is None, "fleet-wide alerts page people; no engine applies them"
        assert "job" in rule.render_expr()
    else:
        assert "instance" in rule.render_expr() or "up{" in rule.render_expr()


def test_severity_is_consistent_within_a_name() -> None:
    by_name: dict[str, list[AlertRule]] = {}
    for rule in ALERT_RULES:
        by_name.setdefault(rule.name, []).append(rule)
    for name, rules in by_name.items():
        variants = [tuple(sorted(rule.labels.items())) for rule in rules]
        assert len(set(variants)) == len(variants), f"{name}: two rules with identical labels"
        summaries = {rule.summary for rule in rules if rule.severity == rules[0].severity}
        assert len(summaries) == 1, name


# --- Action label contract (shared with the engine webhook) -----------------------------------
ACTION_RULES = [rule for rule in ALERT_RULES if rule.action is not None]


def test_actions_named_in_the_issue_are_wired() -> None:
    actions = {(rule.name, rule.action) for rule in ACTION_RULES}
    assert ("WardenSaturated", "shed_low_priority") in actions
    assert ("WardenMemoryWatermarkCritical", "shed_low_priority") in actions
    assert ("WardenOOMImminent", "reject_all") in actions
    assert ("WardenMemoryCreepWithCudaGraphs", "enforce_eager") in actions
    assert ("WardenErrorRateHigh", "circuit_breaker") in actions
    critical = next(r for r in ACTION_RULES if r.name == "WardenMemoryWatermarkCritical")
    assert critical.labels[catalog.PARAM_PREEMPT] == "1"
    oom = next(r for r in ACTION_RULES if r.name == "WardenOOMImminent")
    assert int(oom.labels[catalog.PARAM_RETRY_AFTER]) > 0
    circuits = {
        r.labels[catalog.PARAM_CIRCUIT]: r for r in ACTION_RULES if r.name == "WardenErrorRateHigh"
    }
    assert circuits["half_open"].severity == "warning"
    assert 0 < float(circuits["half_open"].labels[catalog.PARAM_ADMIT_FRACTION]) <= 1
    assert circuits["open"].severity == "critical"


@pytest.mark.parametrize("rule", ACTION_RULES, ids=lambda r: f"{r.name}-{r.severity}")
def test_action_labels_parse_in_the_engine(rule: AlertRule) -> None:
    """The engine webhook's own parser accepts each alert's labels, parameters included."""
    from warden.control.actions import parse_action

    labels = rule.labels
    assert labels[catalog.ACTION_LABEL] in catalog.DEGRADATION_ACTIONS
    request = parse_action(labels[catalog.ACTION_LABEL], labels)
    for label in catalog.ACTION_PARAM_LABELS:
        if label in labels and label != catalog.PARAM_PREEMPT:
            assert request.params, f"{rule.name}: {label} was not picked up"
    assert request.preempt == int(labels.get(catalog.PARAM_PREEMPT, "0"))
    assert set(labels) <= {"severity", catalog.ACTION_LABEL, *catalog.ACTION_PARAM_LABELS}


def test_a_full_engine_alone_never_refuses_or_pages() -> None:
    """Do no harm: no alert reads the KV cache or the raw queue length (a saturated engine is
    vLLM at its most efficient), and none that fires at mere saturation refuses everything."""
    for rule in ALERT_RULES:
        expr = rule.render_expr()
        assert catalog.VLLM_KV_CACHE_USAGE.name not in expr, rule.name
        assert catalog.VLLM_NUM_REQUESTS_WAITING.name not in expr, rule.name
        if rule.name in ("WardenSaturated", "WardenQueueWaitHigh", "WardenPreemptionStorm"):
            assert rule.action in (None, "shed_low_priority"), rule.name
    high = next(rule for rule in ALERT_RULES if rule.name == "WardenMemoryWatermarkHigh")
    assert high.action is None, "high warns: a creep takes hours and refusing early costs users"


def test_engine_job_is_one_shared_constant() -> None:
    assert alerts.ENGINE_JOB == ENGINE_JOB == "vllm-warden"
    down = next(rule for rule in ALERT_RULES if rule.name == "WardenEngineDown")
    assert down.render_expr().count(f'up{{job="{ENGINE_JOB}"}}') == 2


# --- Runbooks -------------------------------------------------------------------------------
RUNBOOK_FIELDS = (
    "**What it means:**",
    "**User impact:**",
    "**What warden does:**",
    "**What to do:**",
    "**How to tune:**",
)


def _runbook_sections() -> dict[str, str]:
    text = RUNBOOKS.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    return {part.splitlines()[0].strip(): part for part in parts}


def test_every_alert_has_a_complete_runbook_section() -> None:
    sections = _runbook_sections()
    for name in ALERT_NAMES:
        assert name in sections, f"runbooks.md lacks '## {name}'"
        for field in RUNBOOK_FIELDS:
            assert field in sections[name], f"{name}: runbook lacks {field}"
    orphans = {title for title in sections if title.startswith("Warden")} - set(ALERT_NAMES)
    assert not orphans, f"runbook sections for no alert: {orphans}"


def test_runbook_mentions_the_engine_actions() -> None:
    sections = _runbook_sections()
    for rule in ACTION_RULES:
        assert f"warden_action={rule.action}" in sections[rule.name] or (
            f"`{rule.action}`" in sections[rule.name]
        ), f"{rule.name}: runbook does not say it triggers {rule.action}"


# --- Promtool scenario coverage -------------------------------------------------------------
def _alert_scenarios() -> list[Scenario]:
    return [s for f in TEST_FILES for s in f.scenarios if isinstance(s, Scenario)]


def _to_seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", duration))


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda r: f"{r.name}-{r.severity}")
def test_scenarios_cover_every_rule(rule: AlertRule) -> None:
    """Each rule fires, is seen pending inside its for, resolves; its name stays quiet on
    healthy input."""
    kinds: set[str] = set()

    def mine(labels: object) -> bool:
        return all(dict(labels).get(k) == v for k, v in rule.labels.items())  # type: ignore[call-overload]

    for scenario in _alert_scenarios():
        fired_at: float | None = None
        for alertname, check in sorted(scenario.checks_for(), key=lambda c: _to_seconds(c[1].at)):
            if alertname != rule.name:
                continue
            if check.kind == "fires" and any(mine(e.labels) for e in check.firing):
                kinds.add("fires")
                fired_at = _to_seconds(check.at) if fired_at is None else fired_at
            if check.kind == "pending" and any(mine(labels) for labels in check.pending):
                kinds.add("pending")
            if check.kind == "healthy":
                kinds.add("healthy")
            if check.kind == "resolved" and fired_at is not None:
                kinds.add("resolved")
    assert kinds == {"fires", "pending", "healthy", "resolved"}, f"missing {rule.name}"


def test_expected_alerts_spell_out_every_label() -> None:
    """Expected label sets name instance (or job) and every static label of their rule."""
    for scenario in _alert_scenarios():
        for _, check in scenario.checks_for():
            for expected in check.firing:
                assert "severity" in expected.labels
                assert "instance" in expected.labels or "job" in expected.labels
                assert expected.description and "{{" not in expected.description


# --- Generated files and the Alertmanager configuration ------------------------------------
def test_render_all_is_deterministic_and_committed() -> None:
    first, second = render_all(), render_all()
    assert first == second
    assert "alerts/generated/rules.yml" in first
    assert "alerts/generated/alertmanager.yml" in first
    for path, text in first.items():
        on_disk = ROOT / path
        assert on_disk.exists(), f"{path} not generated; run `warden generate`"
        assert on_disk.read_text(encoding="utf-8") == text, f"{path} is stale"


def test_generated_rules_match_definitions() -> None:
    rules = yaml.safe_load(render_all()["alerts/generated/rules.yml"])
    alerts_in_file = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts_in_file) == len(ALERT_RULES)
    assert rules["groups"][0]["name"] == RECORDING_RULES.name
    for entry in alerts_in_file:
        assert all(isinstance(v, str) for v in entry["labels"].values())


def test_alertmanager_routes() -> None:
    from warden.control.config import LeaseSettings

    config = build_alertmanager_config("http://e/hook", "/run/token", "http://p/")
    routes = config["route"]["routes"]
    engine, pager, queue = routes
    assert engine["receiver"] == ENGINE_RECEIVER and engine["continue"] is True
    assert engine["matchers"] == [f'{catalog.ACTION_LABEL}=~".+"']
    identity = set(DEFAULT.identity_labels)
    assert set(engine["group_by"]) >= {"alertname", catalog.ACTION_LABEL} | identity
    assert set(engine["group_by"]) >= set(catalog.ACTION_PARAM_LABELS)
    lease_ttl = LeaseSettings().ttl_s
    assert _to_seconds(engine["repeat_interval"]) * 2 <= lease_ttl
    assert _to_seconds(engine["group_interval"]) <= 10
    assert pager["receiver"] == PAGER_RECEIVER and pager["matchers"] == ['severity="critical"']
    # People get one page per alert and fleet, not one per engine.
    assert pager["group_by"] == queue["group_by"] == ["alertname", "cluster", "namespace"]
    assert queue["receiver"] == QUEUE_RECEIVER and queue["matchers"] == ['severity="warning"']
    assert config["route"]["receiver"] not in (ENGINE_RECEIVER, PAGER_RECEIVER, QUEUE_RECEIVER)
    receivers = {r["name"]: r for r in config["receivers"]}
    hook = receivers[ENGINE_RECEIVER]["webhook_configs"][0]
    assert hook == {
        "url": "http://e/hook",
        "send_resolved": True,
        "http_config": {"authorization": {"type": "Bearer", "credentials_file": "/run/token"}},
    }
    assert receivers[PAGER_RECEIVER]["webhook_configs"][0]["send_resolved"] is True
    assert "webhook_configs" not in receivers[QUEUE_RECEIVER], "queue is a placeholder"
    assert config["inhibit_rules"] == [
        {
            "source_matchers": ['severity="critical"'],
            "target_matchers": ['severity="warning"'],
            "equal": ["alertname", "cluster", "namespace", "instance"],
        }
    ]


def test_committed_alertmanager_config_uses_compose_defaults() -> None:
    text = render_all()["alerts/generated/alertmanager.yml"]
    config = yaml.safe_load(text)
    receivers = {r["name"]: r for r in config["receivers"]}
    hook = receivers[ENGINE_RECEIVER]["webhook_configs"][0]
    assert hook["url"] == "http://engine:8000/warden/alertmanager"
    assert hook["http_config"]["authorization"]["credentials_file"] == (
        "/run/secrets/warden_webhook_token"
    )
    assert receivers[PAGER_RECEIVER]["webhook_configs"][0]["url"] == "http://pager:9099/"
    for receiver in receivers.values():
        live = set(receiver) - {"name", "webhook_configs"}
        assert not live, f"{receiver['name']}: real integrations are documented, not configured"


def test_recording_names_are_module_constants() -> None:
    assert rec.WATERMARK_PEAK in RECORDED and rec.SATURATED_1M in RECORDED


def test_memory_alerts_outlast_the_peak_window() -> None:
    """The watermark alerts read the exporter's peak gauge (a spike between scrapes still shows)
    over a window that spans several scrapes, and wait longer than that window plus the gauge's
    own, so one spike (which holds the record up for both) never fires."""
    from exporter.settings import WardenSettings
    from warden.stack.config import Intervals

    window_text = rec.WATERMARK_PEAK_WINDOW
    window = _to_seconds(window_text)
    scrape = _to_seconds(Intervals().scrape)
    gauge_window = WardenSettings().watermark_peak_window_s
    assert window >= 3 * scrape
    assert gauge_window >= scrape, "a spike between two scrapes would fall out of the peak gauge"
    peak_over_window = (
        f"max_over_time({DEFAULT.select(catalog.MEMORY_WATERMARK_PEAK)}[{window_text}])"
    )
    assert peak_over_window in RECORDED[rec.WATERMARK_PEAK].render_expr()
    assert rec.WATERMARK_PEAK.split(":")[1] == catalog.MEMORY_WATERMARK_PEAK.name
    memory = [rule for rule in ALERT_RULES if rec.WATERMARK_PEAK in rule.render_expr()]
    assert {rule.name for rule in memory} == {
        "WardenMemoryWatermarkHigh",
        "WardenMemoryWatermarkCritical",
        "WardenOOMImminent",
    }
    for rule in memory:
        assert _to_seconds(rule.render_for()) > window + gauge_window, (
            f"{rule.name}: a single spike would fire it"
        )


# --- The mixin config: every selector and aggregation comes from it ---------------------------
CUSTOM = MixinConfig(
    engine_selector='job="my-vllm", namespace=~"prod-.*"',
    identity_labels=("region", "namespace", "instance"),
    alertmanager_selector='job="am", namespace="monitoring"',
    relay_selector='job="my-relay"',
)
_RULES = [*ALERT_RULES, *RECORDED.values()]


@pytest.mark.parametrize("rule", _RULES, ids=lambda r: getattr(r, "name", getattr(r, "record", "")))
def test_every_raw_selector_and_grouping_comes_from_the_config(
    rule: AlertRule | RecordingRule,
) -> None:
    expr = re.sub(r"#[^\n]*", "", rule.render_expr(CUSTOM))
    for name in metric_names(expr) - RECORDED.keys():
        owner = catalog.BY_NAME.get(name, catalog.BY_NAME.get(name.rsplit("_", 1)[0]))
        selector = {
            "alertmanager": CUSTOM.alertmanager_selector,
            "relay": CUSTOM.relay_selector,
        }.get(
            "relay" if name.startswith("warden_relay_") else getattr(owner, "owner", ""),
            CUSTOM.engine_selector,
        )
        occurrences = re.findall(rf"(?<![\w:]){re.escape(name)}(?![\w:])(\{{[^}}]*\}})?", expr)
        for matchers in occurrences:
            assert matchers.startswith("{" + selector), f"{name} read without its selector"
    fleet = ", ".join((*CUSTOM.fleet_labels, "job"))
    for clause in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
        assert clause.startswith((CUSTOM.identity, fleet)), f"grouping ({clause}) names no engine"
    assert "vllm-warden" not in expr


def test_mixin_config_rejects_what_would_generate_broken_rules(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="instance"):
        MixinConfig(identity_labels=("namespace",))
    with pytest.raises(ValueError, match="matchers"):
        MixinConfig(engine_selector="job=vllm")
    config_file = tmp_path / "mixin.yaml"
    config_file.write_text("engine_selector: 'job=\"x\"'\nidentity_lables: [instance]\n")
    with pytest.raises(ConfigError, match="identity_lables"):
        load_config(config_file)
    config_file.write_text("engine_selector: 'job=\"x\"'\n")
    assert load_config(config_file).select("up") == 'up{job="x"}'


def test_a_demo_caps_alert_holds_of_the_groups_it_names_and_changes_nothing_else() -> None:
    """The demo's rules: in the named group every `for`/`keep_firing_for` above the cap is cut
    to it, shorter ones and every expression, label and annotation stay, and other groups are
    as generated; without caps the rules are as generated; an unknown group is refused."""
    from alerts.model import duration_s
    from alerts.rules import TRAFFIC
    from alerts.rules_file import render_rules, rule_groups

    assert render_rules() == render_rules(hold_caps={})
    with pytest.raises(ValueError, match="no such rule group"):
        rule_groups(hold_caps={"warden-nonesuch": 30})
    plain_groups, capped_groups = rule_groups(), rule_groups(hold_caps={TRAFFIC.name: 30})
    assert [g["name"] for g in capped_groups] == [g["name"] for g in plain_groups]
    shortened = 0
    for plain_group, capped_group in zip(plain_groups, capped_groups, strict=True):
        if plain_group["name"] != TRAFFIC.name:
            assert capped_group == plain_group
            continue
        for rule, cut in zip(plain_group["rules"], capped_group["rules"], strict=True):
            for key in ("for", "keep_firing_for"):
                if key not in rule:
                    assert key not in cut, rule
                    continue
                assert duration_s(cut[key]) == min(duration_s(rule[key]), 30), (rule, key)
                shortened += duration_s(rule[key]) > 30
            holds = ("for", "keep_firing_for")
            assert {k: v for k, v in cut.items() if k not in holds} == {
                k: v for k, v in rule.items() if k not in holds
            }
    assert shortened, "no traffic alert holds longer than 30 s: the cap is not exercised"
    assert duration_s("1h30m") == 5400 and duration_s("2m") == 120 and duration_s("500ms") == 0.5


# --- Thresholds and holds: the config's, overridable per deployment ------------------------------
def _rules_by_key(config: MixinConfig) -> dict[tuple[str, str], dict[str, object]]:
    from alerts.rules_file import rule_groups

    rules: dict[tuple[str, str], dict[str, object]] = {}
    for group in rule_groups(config):
        for rule in group["rules"]:
            key = (str(rule.get("alert", rule.get("record"))), json.dumps(rule.get("labels")))
            rules[key] = rule
    return rules


def test_a_threshold_override_changes_its_rules_and_nothing_else(tmp_path: Path) -> None:
    config_file = tmp_path / "mixin.yaml"
    config_file.write_text(
        "thresholds:\n  queue_time_p90_seconds: 30\n  saturated_for: 2m30s\n"
        "  error_ratio_open: 0.6\n"
    )
    config = load_config(config_file)
    default, tuned = _rules_by_key(DEFAULT), _rules_by_key(config)
    assert default.keys() == tuned.keys()
    changed = {key: tuned[key] for key in default if default[key] != tuned[key]}
    by_name = {
        (name, json.loads(labels)["severity"]): rule for (name, labels), rule in changed.items()
    }
    assert set(by_name) == {
        ("WardenQueueWaitHigh", "warning"),
        ("WardenSaturated", "warning"),
        ("WardenErrorRateHigh", "critical"),
    }
    assert str(by_name["WardenQueueWaitHigh", "warning"]["expr"]).endswith(" > 30.0")
    assert by_name["WardenSaturated", "warning"]["for"] == "2m30s"
    assert f"{rec.SERVER_ERROR_RATIO} > 0.6\n" in str(
        by_name["WardenErrorRateHigh", "critical"]["expr"]
    )


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("saturated_refused_ratio: -0.1", "thresholds.saturated_refused_ratio"),
        ("error_ratio_open: 1.5", "thresholds.error_ratio_open"),
        ("error_ratio_open: 0.1", "error_ratio_half_open"),
        ("queue_time_p90_seconds: -5", "thresholds.queue_time_p90_seconds"),
        ("saturated_for: soon", "thresholds.saturated_for"),
        ("oom_imminent_for: 0s", "thresholds.oom_imminent_for"),
        ("restarts_per_hour: 0", "thresholds.restarts_per_hour"),
        ("queue_time_p90_s: 30", "thresholds.queue_time_p90_s"),
    ],
)
def test_an_absurd_threshold_is_refused_naming_the_file_and_field(
    tmp_path: Path, override: str, named: str
) -> None:
    config_file = tmp_path / "mixin.yaml"
    config_file.write_text(f"thresholds:\n  {override}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(config_file)
    message = str(refused.value)
    assert str(config_file) in message and named in message, message


def test_every_hold_of_an_engine_alert_comes_from_the_thresholds() -> None:
    """Doubling every hold in the config doubles every engine alert's ``for`` and
    ``keep_firing_for``: none is left spelled in a rule."""
    from alerts.durations import duration_s
    from alerts.thresholds import Thresholds

    holds = {
        name: f"{int(duration_s(value) * 2)}s"
        for name, value in Thresholds().model_dump().items()
        if name.endswith("_for")
    }
    doubled = MixinConfig(thresholds=Thresholds(**holds))
    for rule in ALERT_RULES:
        if rule.scope == "fleet" or rule.name in {
            "WardenWebhookDeliveryFailing",
            "WardenWebhookRejected",
            "WardenRelayDeliveryFailing",
        }:
            continue
        for hold in ("render_for", "render_keep_firing_for"):
            before, after = getattr(rule, hold)(DEFAULT), getattr(rule, hold)(doubled)
            if before is not None:
                assert duration_s(after) == 2 * duration_s(before), (rule.name, hold)
