"""``warden serve`` starts engines that refuse custom logits processors (issue 31, item 2).

``warden serve`` always names warden's logits processor; vLLM refuses any custom processor for a
pooling model (embedding, classification, reward). A real vLLM CPU engine for the tiny model
converted to an embedding model, wired exactly as ``warden serve`` wires it: it starts and
serves, the non-finite check is reported unavailable (``warden_source_available{source=
"logits"}`` 0) and the log says why. The other refused configurations (the V1 runner with
speculative decoding, ``--return-sampling-mask``) are checked through vLLM's own config code in
tests/test_vllm_hooks_units.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exporter import catalog
from tests.support.engine import running_engine, sample, scrape
from warden.supervisor.engine import EngineProcess

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def embedding_engine(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcess]:
    run_dir = tmp_path_factory.mktemp("embedding-engine")
    args = ("--runner", "pooling", "--convert", "embed")
    with running_engine(tiny_model, extra_args=args, run_dir=run_dir) as engine:
        yield engine


def test_a_pooling_model_serves_without_the_logits_check(embedding_engine: EngineProcess) -> None:
    engine = embedding_engine
    answer = httpx.post(
        f"{engine.base_url}/v1/embeddings",
        json={"model": str(engine.spec.model), "input": "memory cache block"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.json()["data"][0]["embedding"]) > 0
    metrics = scrape(engine)
    available = catalog.SOURCE_AVAILABLE.name
    assert metrics.get(f'{available}{{source="logits"}}') == 0  # present, and 0
    assert sample(metrics, available, source="engine_errors") == 1
    assert engine.log_path is not None
    log = engine.log_path.read_text()
    assert "non-finite logits are not checked (processor left out): pooling models" in log
