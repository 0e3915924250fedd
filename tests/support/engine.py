"""Real vLLM CPU engines for tests, started with every warden hook (no fakes here)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from warden.common.metrics_text import parse_samples, sample  # noqa: F401 - re-exported for tests
from warden.common.ports import free_port
from warden.common.tinymodel import TINY_BASE_ARGS
from warden.engine.launch import LaunchSpec
from warden.supervisor.engine import EngineProcess

# Every test engine starts with the tiny model's base arguments; a test adds its own.
BASE_ARGS = TINY_BASE_ARGS
# A KV cache of 10 blocks x 32 tokens: a handful of long requests fills it and forces
# preemption (the tests that need memory pressure add these).
TINY_KV_ARGS = ("--num-gpu-blocks-override", "10", "--max-num-seqs", "8", "--max-model-len", "256")


@contextlib.contextmanager
def running_engine(
    model_dir: Path | str,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    run_dir: Path | None = None,
) -> Iterator[EngineProcess]:
    """A started, ready engine; stopped (with its whole process group) on exit."""
    spec = LaunchSpec(
        str(model_dir),
        port=port or free_port(),
        extra_args=[*BASE_ARGS, *extra_args],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})},
        run_dir=run_dir,
    )
    log_path = (run_dir / "engine.log") if run_dir else None
    with EngineProcess(spec, log_path=log_path) as engine:
        yield engine


def scrape(engine: EngineProcess) -> dict[str, float]:
    """All samples of /metrics as {'name{labels}': value}."""
    return parse_samples(httpx.get(engine.metrics_url, timeout=10).text)


def complete(
    engine: EngineProcess,
    model: str,
    prompt: str,
    max_tokens: int = 16,
    timeout: float = 120.0,
    **body: object,
) -> httpx.Response:
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, **body}
    return httpx.post(f"{engine.base_url}/v1/completions", json=payload, timeout=timeout)


def free_stack_ports() -> dict[str, int]:
    """A free port for each server of a native stack: every ``*_port`` of StackSettings."""
    import dataclasses

    from warden.stack.native import StackSettings

    return {
        f.name: free_port() for f in dataclasses.fields(StackSettings) if f.name.endswith("_port")
    }
