"""Fixtures and plugins every test module shares."""

from __future__ import annotations

from pathlib import Path

import pytest

# skip_policy: under CI a skip fails the run unless tests/skips.py lists it (see there).
# shared_engine: one vLLM cache for every engine, one plain engine for several modules.
# pytester: the skip policy's own tests run small pytest sessions.
pytest_plugins = ("tests.support.skip_policy", "tests.support.shared_engine", "pytester")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama with a locally trained tokenizer (no network)."""
    # Imported here: tests/gpu runs where only torch is installed, and this file loads there too.
    from warden.cli.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
