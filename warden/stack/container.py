"""The engine container's entrypoint: pick the model, then become vLLM with warden's hooks.

Compose sets the knobs as environment (from compose/.env): ``WARDEN_MODEL`` (a model name or
path, or ``tiny`` for the random-weight test model built on first start), ``WARDEN_VLLM_ARGS``
(extra vLLM flags, shell-quoted), the port, and the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``,
which also turns on vLLM's request tracing. The process ``exec``s vLLM, so the container's
init delivers stop signals straight to the server.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from exporter.settings import load_settings
from warden.engine.launch import LaunchSpec
from warden.stack.traces import otlp_traces_endpoint

TINY = "tiny"


def engine_spec(env: Mapping[str, str]) -> tuple[LaunchSpec, Path | None]:
    """The LaunchSpec the container runs, from its environment (a pure function for tests),
    and the tiny model's folder when that is the model (built on first start)."""
    settings = load_settings(env)
    data_dir = settings.data_dir
    model = settings.model.strip() or TINY
    args = shlex.split(settings.vllm_args)
    tiny_dir = None
    if model == TINY:
        from warden.cli.tinymodel import TINY_ENGINE_ARGS

        tiny_dir = data_dir / "tiny-model"
        model = str(tiny_dir)
        args = args or list(TINY_ENGINE_ARGS)
    otlp = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if otlp and "--otlp-traces-endpoint" not in args:
        args += ["--otlp-traces-endpoint", otlp_traces_endpoint(otlp)]
    spec = LaunchSpec(
        model,
        host=settings.host,
        port=settings.port,
        extra_args=args,
        run_dir=data_dir / "run",
    )
    return spec, tiny_dir


def main() -> None:
    spec, tiny_dir = engine_spec(os.environ)
    if tiny_dir is not None and not (tiny_dir / "config.json").exists():
        from warden.cli.tinymodel import build_tiny_model

        print(f"building the tiny model in {tiny_dir}", flush=True)
        build_tiny_model(tiny_dir)
    argv = spec.argv()
    print("exec " + shlex.join(argv), flush=True)
    os.execve(argv[0], argv, spec.environment())


if __name__ == "__main__":
    main()
