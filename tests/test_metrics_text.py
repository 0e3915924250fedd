import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter import catalog
from exporter.metrics import WardenMetrics
from warden.common.metrics_text import (
    family_names,
    parse_samples,
    sample,
    series_key,
    sum_samples,
    value,
)


def test_samples_are_parsed_and_summed_by_label() -> None:
    name = catalog.NONFINITE_LOGITS.name
    text = f'# HELP x\n{name}{{kind="nan"}} 2.0\n{name}{{kind="inf"}} 3\nvllm:x{{a="b"}} 1e3\n'
    samples = parse_samples(text)
    assert sample(samples, name) == 5
    assert sample(samples, name, kind="inf") == 3
    assert sample(samples, "vllm:x", a="b") == 1000
    assert sample(samples, "missing") == 0


def _real_page() -> str:
    """A page written by prometheus_client itself, as the engine's /metrics is."""
    registry = CollectorRegistry()
    metrics = WardenMetrics(registry)
    metrics.get(catalog.NONFINITE_LOGITS).labels("nan").inc(2)
    metrics.get(catalog.NONFINITE_LOGITS).labels("inf").inc()
    metrics.get(catalog.ENGINE_RESTART_DURATION).observe(20.0)
    metrics.get(catalog.MEMORY_WATERMARK).set(2)
    return generate_latest(registry).decode()


def test_a_real_page_keeps_the_sample_names_of_the_page() -> None:
    text = _real_page()
    samples = parse_samples(text)
    counter = catalog.NONFINITE_LOGITS.name
    assert counter.endswith("_total")
    assert samples[f'{counter}{{kind="nan"}}'] == 2  # the sample keeps _total ...
    assert counter.removesuffix("_total") in family_names(text)  # ... the family does not
    assert samples[catalog.MEMORY_WATERMARK.name] == 2  # no labels: the bare name
    duration = catalog.ENGINE_RESTART_DURATION.name
    assert samples[f"{duration}_count"] == 1
    assert samples[f'{duration}_bucket{{le="+Inf"}}'] == 1
    assert sum_samples(text, counter) == 3
    assert sum_samples(text, counter, kind="inf") == 1
    assert sum_samples(text, counter, kind="other") is None
    assert value(text, counter, kind="nan") == 2
    assert value(text, counter) is None  # one sample with exactly these labels
    assert value(text, catalog.MEMORY_WATERMARK.name) == 2


def test_sum_counts_only_the_exact_name() -> None:
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running_other{engine="0"} 7.0\n'
    )
    assert sum_samples(text, "vllm:num_requests_running") == 2
    assert sample(parse_samples(text), "vllm:num_requests_running") == 2
    assert sum_samples(text, "vllm:absent") is None


def test_label_values_are_escaped_as_on_the_page() -> None:
    text = 'm{a="x\\"y",b="z\\\\w",c="1,b=\\"2\\""} 4\n'
    samples = parse_samples(text)
    assert list(samples) == [text.split(" ")[0]]
    assert series_key("m", {"a": 'x"y', "b": "z\\w", "c": '1,b="2"'}) in samples
    assert sample(samples, "m", b="z\\w") == 4
    assert sample(samples, "m", b="2") == 0  # a look-alike inside another value
    assert value(text, "m", a='x"y', b="z\\w", c='1,b="2"') == 4


def test_a_page_that_is_not_prometheus_text_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_samples("<html>not metrics</html>\n")
