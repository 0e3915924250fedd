"""The engine container's entrypoint: pick the model, then run vLLM under warden's supervisor.

Compose and the Kubernetes manifests set the knobs as environment (compose from compose/.env):
``WARDEN_MODEL`` (a model name or path, or ``tiny`` for the random-weight test model built on
first start), ``WARDEN_VLLM_ARGS`` (extra vLLM flags, shell-quoted), the port, the supervisor's
port (``WARDEN_SUPERVISOR_PORT``, 8001) and the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``, which
also turns on vLLM's request tracing.

The same supervisor as ``warden serve`` (``warden.supervisor.loop``) keeps vLLM serving inside
the container: crash and stall restarts, drained restarts for the eager remediation, the
restart circuit, its state in ``<data dir>/run``. Restarts stay in the container, which is
faster than the container runtime's and keeps the circuit's count; the container ends only
when the supervisor does. The stop signal (SIGTERM from the container's init) drains vLLM
(readiness false, new requests refused, those in flight finished, up to the drain timeout),
then stops it; a second signal skips the rest of the drain.

Test switches (``WARDEN_TEST_*``) are refused unless the model is the tiny test model: a
deployment that serves a real model never runs with one.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from exporter.settings import WardenSettings, env_name, load_settings
from warden.engine.launch import LaunchSpec
from warden.stack.traces import otlp_traces_endpoint
from warden.supervisor.config import SupervisorConfig

TINY = "tiny"
TEST_SWITCH_PREFIX = "test_"


def engine_spec(env: Mapping[str, str]) -> tuple[LaunchSpec, Path | None]:
    """The LaunchSpec the container runs, from its environment (a pure function for tests),
    and the tiny model's folder when that is the model (built on first start)."""
    settings = load_settings(env)
    data_dir = settings.data_dir
    model = settings.model.strip() or TINY
    args = shlex.split(settings.vllm_args)
    tiny_dir = None
    if model == TINY:
        from warden.common.tinymodel import TINY_ENGINE_ARGS

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


def test_switches_on(settings: WardenSettings) -> list[str]:
    """The ``WARDEN_TEST_*`` variables that are set to something other than off."""
    return [
        env_name(name)
        for name, field in WardenSettings.model_fields.items()
        if name.startswith(TEST_SWITCH_PREFIX) and getattr(settings, name) != field.default
    ]


def refuse_test_switches(env: Mapping[str, str]) -> str | None:
    """Why the container must not start (a test switch with a real model), or None."""
    settings = load_settings(env)
    switches = test_switches_on(settings)
    if switches and (settings.model.strip() or TINY) != TINY:
        return (
            f"{', '.join(switches)} set with {env_name('model')}={settings.model}: test "
            f"switches break requests on purpose and run only with {env_name('model')}={TINY}"
        )
    return None


def supervisor_config(env: Mapping[str, str]) -> SupervisorConfig:
    """The supervisor's settings in the container: its port on the container's address, so
    the kubelet's liveness probe reaches it; every other setting as ``warden serve``'s."""
    settings = load_settings(env)
    return SupervisorConfig(control_host=settings.host, control_port=settings.supervisor_port)


def main() -> None:
    from warden.supervisor.loop import Supervisor

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    refusal = refuse_test_switches(os.environ)
    if refusal is not None:
        sys.exit(f"warden container: {refusal}")
    spec, tiny_dir = engine_spec(os.environ)
    if tiny_dir is not None and not (tiny_dir / "config.json").exists():
        from warden.common.tinymodel import build_tiny_model

        print(f"building the tiny model in {tiny_dir}", flush=True)
        build_tiny_model(tiny_dir)
    assert spec.run_dir is not None
    print("supervising " + shlex.join(spec.argv()), flush=True)
    supervisor = Supervisor(spec, spec.run_dir, supervisor_config(os.environ))
    supervisor.install_signal_handlers()
    sys.exit(supervisor.run())


if __name__ == "__main__":
    main()
