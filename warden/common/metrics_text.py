"""Reading a Prometheus /metrics page: the one reader for tests, benchmarks, the supervisor and
the chaos commands, built on prometheus_client's own text parser.

Series are named the way the page writes them: ``name{label="value",...}`` with the labels in
page order, or a bare ``name`` without labels. Names are the *sample* names (a counter's
``_total``, a histogram's ``_bucket``/``_count``/``_sum``), not the family names the parser
reports (it strips a counter's ``_total``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def series_key(name: str, labels: Mapping[str, str]) -> str:
    """``name{a="x",b="y"}`` as the page writes it (``name`` alone when there are no labels)."""
    if not labels:
        return name
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())
    return f"{name}{{{inner}}}"


def iter_samples(text: str) -> Iterator[Sample]:
    """Every sample of a page (``ValueError`` when the page is not Prometheus text)."""
    for family in text_string_to_metric_families(text):
        yield from family.samples


def parse_samples(text: str) -> dict[str, float]:
    """All samples of a Prometheus text page as {'name{labels}': value}."""
    return {series_key(s.name, s.labels): float(s.value) for s in iter_samples(text)}


def sample(samples: Mapping[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when there are none).

    ``samples`` comes from ``parse_samples``: a label is matched as ``,key="value"`` in the
    series' label text, which escaping keeps unambiguous (a quote inside a value is ``\\"``).
    """
    wanted = [f',{key}="{_escape(value)}"' for key, value in labels.items()]
    total = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric == name and all(w in "," + rest for w in wanted):
            total += value
    return total


def sum_samples(text: str, name: str, **labels: str) -> float | None:
    """Sum of the samples of ``name`` on a page whose labels include ``labels`` (None when the
    page has none)."""
    values = [
        float(s.value)
        for s in iter_samples(text)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(values) if values else None


def value(text: str, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` with exactly ``labels`` (None when absent)."""
    for s in iter_samples(text):
        if s.name == name and s.labels == labels:
            return float(s.value)
    return None


def family_names(text: str) -> set[str]:
    """The metric family names of a page, as the parser reports them (a counter without
    ``_total``)."""
    return {family.name for family in text_string_to_metric_families(text)}
