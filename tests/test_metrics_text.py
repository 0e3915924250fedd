from exporter import catalog
from warden.common.metrics_text import parse_samples, sample


def test_samples_are_parsed_and_summed_by_label() -> None:
    name = catalog.NONFINITE_LOGITS.name
    text = f'# HELP x\n{name}{{kind="nan"}} 2.0\n{name}{{kind="inf"}} 3\nvllm:x{{a="b"}} 1e3\n'
    samples = parse_samples(text)
    assert sample(samples, name) == 5
    assert sample(samples, name, kind="inf") == 3
    assert sample(samples, "vllm:x", a="b") == 1000
    assert sample(samples, "missing") == 0
