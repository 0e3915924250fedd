"""Fixtures and plugins every test module shares."""

from __future__ import annotations

from pathlib import Path

import pytest

try:  # pytest's own -m parser (private: a GPU machine's pytest may differ, see below)
    from _pytest.mark.expression import Expression
except ImportError:  # pragma: no cover - other pytest versions
    Expression = None  # type: ignore[assignment,misc]

GPU_SUITE = Path(__file__).parent / "gpu"

# skip_policy: under CI a skip fails the run unless tests/skips.py lists it (see there).
# shared_engine: one vLLM cache for every engine, one plain engine for several modules.
# parallel: whole modules per xdist worker, engine modules first (scripts/test.sh runs -n 2).
# pytester: the skip policy's own tests run small pytest sessions.
pytest_plugins = (
    "tests.support.skip_policy",
    "tests.support.shared_engine",
    "tests.support.parallel",
    "pytester",
)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama with a locally trained tokenizer (no network)."""
    # Imported here: tests/gpu runs where only torch is installed, and this file loads there too.
    from warden.common.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


def only_gpu_tests_selected(config: pytest.Config) -> bool:
    """Whether ``-m`` selects nothing but ``gpu``-marked tests (``pytest -m gpu``)."""
    expression = (config.option.markexpr or "").strip()
    if not expression or Expression is None:
        return expression == "gpu"
    selects = Expression.compile(expression).evaluate
    # A test marked gpu is selected; one without it is not, whether it has no other marker or
    # every other one ("gpu or engine" selects engine tests too).
    without_gpu = (lambda name: False, lambda name: name != "gpu")
    return selects(lambda name: name == "gpu") and not any(map(selects, without_gpu))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``pytest -m gpu`` collects tests/gpu only: every ``gpu`` test lives there (a CPU test
    checks it), and the rest of the suite imports vLLM and the project's other dependencies,
    which a GPU machine with only torch, NVML and pytest lacks (collection would fail there)."""
    if only_gpu_tests_selected(config) and collection_path.suffix == ".py":
        inside = collection_path.is_relative_to(GPU_SUITE)
        if not inside and collection_path.name.startswith("test_"):
            return True
    return None
