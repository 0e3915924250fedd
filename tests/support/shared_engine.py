"""Engine starts shared across test modules (a pytest plugin, loaded by ``tests/conftest.py``).

A vLLM CPU engine takes about a minute to start on two busy cores: three spawned processes,
each importing vLLM. Three things here cut the starts' cost without changing what any test sees:

- ``shared_vllm_cache``: one ``VLLM_CACHE_ROOT`` for the whole session. warden gives each run
  directory its own cache (warden/engine/launch.py), so every test engine inspected the model
  class again in a subprocess that imports vLLM (about 15 s of CPU per start); shared, the
  first start writes vLLM's model-info cache and every later start reads it.
- ``forked_engine_processes``: every engine's engine core and model worker are forked, where
  vLLM's CPU build spawns them (``exporter/fork_engine_processes.py``): each spawned one imports
  vLLM and torch again, and an engine start took about 30 s of CPU, 15 forked. The forked
  worker binds itself to the cores and thread count vLLM chose for it, as spawned.
  ``WARDEN_TEST_FORK_ENGINE_PROCESSES=0`` in the environment runs the suite with vLLM's spawn.
- ``plain_engine``: one engine for the modules that test warden exactly as ``warden serve``
  wires it (default settings, no test switch, no webhook token). Its tests measure deltas
  (before/after), so they do not depend on which module ran first. A session fixture would
  otherwise live until the end of the run, beside the engines later modules start: this
  plugin stops it as soon as the last collected test that uses it is done.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from warden.supervisor.engine import EngineProcess

PLAIN_ENGINE = "plain_engine"
# The nodeid of the last collected test that uses each shared engine fixture.
_LAST_USER = pytest.StashKey[dict[str, str]]()
# The open engines, by fixture name: closed after their last user (or at the session's end).
_OPEN = pytest.StashKey[dict[str, contextlib.ExitStack]]()


@pytest.fixture(scope="session", autouse=True)
def shared_vllm_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every engine the tests start, directly or through ``warden serve`` and ``warden up``,
    inherits this ``VLLM_CACHE_ROOT`` (launch.py keeps one already set)."""
    if "VLLM_CACHE_ROOT" in os.environ:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def forked_engine_processes() -> Iterator[None]:
    """Every engine the tests start inherits ``WARDEN_TEST_FORK_ENGINE_PROCESSES=1``, unless
    the environment already says."""
    from exporter.fork_engine_processes import SWITCH

    if SWITCH in os.environ:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SWITCH, "1")
        yield


@pytest.fixture(scope="session")
def plain_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcess]:
    """warden as ``warden serve`` wires it, default settings: no test switch, no webhook token.
    The model is the stack's tiny model, whose token ``STACK_NAN_TOKEN`` makes real NaN logits
    (warden/common/tinymodel.py); a prompt without it is an ordinary prompt. Users read counters
    as deltas and leave no lease or request behind."""
    # Imported here: tests/gpu loads this plugin where only torch is installed.
    from tests.support.engine import running_engine
    from warden.common.tinymodel import STACK_NAN_TOKEN, build_tiny_model

    model = build_tiny_model(
        tmp_path_factory.mktemp("nan-model"), seed=0, nan_token=STACK_NAN_TOKEN
    )
    run_dir = tmp_path_factory.mktemp("plain-engine")
    with contextlib.ExitStack() as stack:
        request.config.stash.setdefault(_OPEN, {})[PLAIN_ENGINE] = stack
        yield stack.enter_context(
            running_engine(model, extra_args=("--max-num-seqs", "8"), run_dir=run_dir)
        )


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only tests that will run count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    last: dict[str, str] = {}
    for item in items:
        if PLAIN_ENGINE in getattr(item, "fixturenames", ()):
            last[PLAIN_ENGINE] = item.nodeid
    config.stash[_LAST_USER] = last


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the item's fixtures
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop a shared engine right after its last user (pytest would keep it to the end)."""
    for name, nodeid in item.config.stash.get(_LAST_USER, {}).items():
        if nodeid == item.nodeid:
            stack = item.config.stash.get(_OPEN, {}).pop(name, None)
            if stack is not None:
                stack.close()
