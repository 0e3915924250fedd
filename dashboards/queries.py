"""PromQL building blocks, so every query is scoped and spelled the same way.

Metric names only ever come from ``exporter.catalog`` specs. Every selector is narrowed by the
dashboard variables: the mixin config's fleet labels (``cluster``, ``namespace``), ``job`` and
``instance`` everywhere, ``model`` only on vLLM's own series (warden's series carry no
``model_name`` label; a model filter on them would hide them all).

Dashboards are built for one mixin config (``alerts.config.MixinConfig``, the object the rules
are generated from too): ``using(config)`` sets it while they are built, ``mixin()`` reads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar

from alerts.config import DEFAULT, MixinConfig
from exporter.catalog import MetricSpec

JOB_VAR = "job"
INSTANCE_VAR = "instance"
MODEL_VAR = "model"
# The label vLLM puts the served model name in.
MODEL_LABEL = "model_name"

# Window for rates of steady traffic: Grafana widens it to cover at least four scrapes.
RATE_WINDOW = "$__rate_interval"
# Window for rare events (faults, restarts): a count per five minutes reads better than a rate.
EVENT_WINDOW = "5m"


_config: ContextVar[MixinConfig] = ContextVar("warden_dashboard_mixin", default=DEFAULT)


@contextlib.contextmanager
def using(config: MixinConfig) -> Iterator[MixinConfig]:
    """Build dashboards for ``config`` inside this block."""
    token = _config.set(config)
    try:
        yield config
    finally:
        _config.reset(token)


def mixin() -> MixinConfig:
    """The mixin config the dashboards are being built for."""
    return _config.get()


def fleet_matchers() -> list[str]:
    """``cluster=~"$cluster", namespace=~"$namespace"``: one variable per fleet label."""
    return [f'{label}=~"${label}"' for label in mixin().fleet_labels]


def scope_matchers(spec: MetricSpec, instance: bool = True) -> list[str]:
    """Label matchers that tie a series to the selected fleet, job, instance and (vLLM only)
    model; ``instance=False`` for the fleet dashboard, which has no instance variable."""
    matchers = [*fleet_matchers(), f'job=~"${JOB_VAR}"']
    if instance:
        matchers.append(f'instance=~"${INSTANCE_VAR}"')
    if spec.owner == "vllm":
        matchers.append(f'{MODEL_LABEL}=~"${MODEL_VAR}"')
    return matchers


def label_value(allowed: Sequence[str], value: str) -> str:
    """Return ``value`` after checking it is one the catalog defines for that label."""
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of {tuple(allowed)}")
    return value


def selector(spec: MetricSpec, suffix: str = "", **labels: str) -> str:
    """``name{scope..., label="value"}``; ``suffix`` picks a histogram's _bucket/_sum/_count."""
    unknown = set(labels) - set(spec.labels)
    if unknown:
        raise ValueError(f"{spec.name} has no label(s) {sorted(unknown)}")
    if suffix and spec.kind != "histogram":
        raise ValueError(f"{spec.name} is a {spec.kind}; only histograms have {suffix}")
    matchers = scope_matchers(spec) + [f'{key}="{value}"' for key, value in labels.items()]
    return f"{spec.name}{suffix}{{{', '.join(matchers)}}}"


def aggregate(op: str, expr: str, by: Iterable[str] = ()) -> str:
    """``op by (labels) (expr)``, or ``op(expr)`` when nothing is kept."""
    kept = list(by)
    if kept:
        return f"{op} by ({', '.join(kept)}) ({expr})"
    return f"{op}({expr})"


def _require_counter(spec: MetricSpec) -> None:
    if spec.kind != "counter":
        raise ValueError(f"rate/increase need a counter, {spec.name} is a {spec.kind}")


def rate(spec: MetricSpec, by: Iterable[str] = (), window: str = RATE_WINDOW, **labels: str) -> str:
    """Per-second rate of a counter, summed over everything not in ``by``."""
    _require_counter(spec)
    return aggregate("sum", f"rate({selector(spec, **labels)}[{window}])", by)


def increase(
    spec: MetricSpec, by: Iterable[str] = (), window: str = EVENT_WINDOW, **labels: str
) -> str:
    """Events counted over ``window``, summed over everything not in ``by``."""
    _require_counter(spec)
    return aggregate("sum", f"increase({selector(spec, **labels)}[{window}])", by)


def quantile(q: float, spec: MetricSpec, by: Iterable[str] = (), window: str = RATE_WINDOW) -> str:
    """``histogram_quantile`` over the rate of a histogram's buckets.

    The quantile does not depend on the window's length, only on which observations fall in
    it: pass a long ``window`` for rare events such as restarts.
    """
    if spec.kind != "histogram":
        raise ValueError(f"{spec.name} is a {spec.kind}, not a histogram")
    buckets = aggregate("sum", f"rate({selector(spec, '_bucket')}[{window}])", ["le", *by])
    return f"histogram_quantile({q:g}, {buckets})"
