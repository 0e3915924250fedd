"""Just enough PromQL reading to check and run the dashboards' queries outside Grafana.

``metric_names`` finds the series names an expression reads (so tests can hold every query to
the metric catalog); ``grouping_labels`` finds the labels it aggregates on; ``expand`` fills in
Grafana's template variables so Prometheus itself can run the query (renderer, live tests).
"""

from __future__ import annotations

import re
from collections.abc import Mapping


def _words(text: str) -> frozenset[str]:
    """Word lists kept as prose: easier to compare with the PromQL docs than a long column."""
    return frozenset(text.split())


FUNCTIONS = _words(
    """
    abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes
    clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year
    days_in_month deg delta deriv double_exponential_smoothing exp floor histogram_avg
    histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar
    histogram_sum holt_winters hour idelta increase irate label_join label_replace
    last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi
    predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin
    sinh sort sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time
    stdvar_over_time sum_over_time tan tanh time timestamp vector year
    """
)
AGGREGATIONS = _words(
    """
    avg bottomk count count_values group limit_ratio limitk max min quantile stddev stdvar sum
    topk
    """
)
# Words that are never series names: modifiers, set operators, special numbers.
KEYWORDS = _words(
    """
    and atan2 bool by end group_left group_right ignoring inf nan offset on or start unless
    without
    """
)
_GROUPING = r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)"

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?)"
)
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


class PromQLScanError(ValueError):
    """The expression calls something that is not a PromQL function."""


def _strip(expr: str) -> str:
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = re.sub(_GROUPING, " ", text)
    return _NUMBER.sub(" ", text)


def metric_names(expr: str) -> set[str]:
    """Series names an expression selects, e.g. ``{"vllm:prompt_tokens_total"}``.

    Strings, label matchers, range and subquery windows, grouping lists and numbers are removed
    first; of the identifiers left, function calls and keywords are not names. An unknown
    function raises ``PromQLScanError`` rather than being mistaken for a metric.
    """
    text = _strip(expr)
    names: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        if word in KEYWORDS:
            continue
        if text[match.end() :].lstrip().startswith("("):
            if word not in FUNCTIONS and word not in AGGREGATIONS:
                raise PromQLScanError(f"unknown function {word!r} in {expr!r}")
            continue
        names.add(word)
    return names


def grouping_labels(expr: str) -> set[str]:
    """Labels named in ``by``/``without``/``on``/``ignoring``/``group_*`` lists."""
    text = _STRING.sub('""', expr)
    labels: set[str] = set()
    for _, listed in re.findall(_GROUPING, text):
        labels.update(label.strip() for label in listed.split(",") if label.strip())
    return labels


def matcher_labels(expr: str) -> set[str]:
    """Label names used in ``{label="value"}`` matchers."""
    text = _STRING.sub('""', expr)
    labels: set[str] = set()
    for block in _MATCHERS.findall(text):
        labels.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", block))
    return labels


def variables(expr: str) -> set[str]:
    """Grafana template variables an expression uses (``$job``, ``${job}``, ``[[job]]``)."""
    return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(expr)}


def expand(expr: str, values: Mapping[str, str]) -> str:
    """Fill in template variables; a variable without a value raises ``KeyError``."""

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(value, expr)


def all_values(rate_interval: str = "1m") -> dict[str, str]:
    """Values that make a dashboard query cover every engine, as "All" does in Grafana."""
    return {
        "cluster": ".*",
        "namespace": ".*",
        "job": ".*",
        "instance": ".*",
        "model": ".*",
        "__rate_interval": rate_interval,
        "__interval": rate_interval,
        "__range": rate_interval,
    }


_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


def parse_label_values(query: str) -> tuple[str | None, str]:
    """Split Grafana's ``label_values(selector, label)`` variable query into its parts."""
    match = _LABEL_VALUES.match(query)
    if not match:
        raise ValueError(f"not a label_values() query: {query!r}")
    return match.group(1), match.group(2)
