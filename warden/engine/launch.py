"""How a vLLM server is started with every warden hook wired.

One function builds the command line and environment, so ``warden serve``, the supervisor, the
tests and the README's "run vLLM yourself" section all agree on the same flags.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exporter.signals import ENV_VAR as SIGNAL_BOARD_ENV

# How long vLLM's API server keeps an idle keep-alive connection (VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
# uvicorn's timeout_keep_alive; vLLM's default is 5 s). A request a client sends on a connection
# the server is closing is lost ("Server disconnected"), so the server must be the side that waits
# longer: above the idle timeouts of common clients (aiohttp, which `vllm bench serve` uses,
# keeps connections 60 s; Go's net/http 90 s; httpx and the OpenAI SDK 5 s). An idle connection
# costs the server one socket. A value the user sets is kept.
HTTP_KEEP_ALIVE_S = 120
# Every warden plugin must be named: VLLM_PLUGINS is an allow-list for every plugin group.
VLLM_PLUGINS = "warden,warden_stats,warden_endpoints"
LOGITS_PROCESSOR = "exporter.logits:NonFiniteLogitsProcessor"
WORKER_EXTENSION = "warden.engine.worker_extension.WardenWorkerExtension"
MIDDLEWARE = "warden.engine.middleware.WardenMiddleware"
# vLLM's OpenAI API server, through a module that spawned engine processes import for free
# (warden/engine/vllm_entry.py says why).
SERVER_MODULE = "warden.engine.vllm_entry"
# Flags LaunchSpec writes itself from ``warden serve``'s own options (flag -> that option):
# repeated among vLLM's arguments they would win silently (a server on another port than the
# one supervised and probed).
RESERVED_FLAGS = {"--model": "MODEL", "--host": "--host", "--port": "--port"}


class VllmArgsError(ValueError):
    """vLLM arguments that would override what warden sets; the message says what to do."""


def vllm_args(
    values: Sequence[str],
    command: str = "warden serve",
    own_options: Mapping[str, str] = RESERVED_FLAGS,
) -> list[str]:
    """vLLM's arguments as ``warden serve`` and ``warden up`` take them, after an optional
    ``--`` separator (``serve MODEL -- --dtype float32``, ``up -- --dtype float32``).
    ``own_options``: the command's option for each flag warden sets itself."""
    args = list(values)
    if args and args[0] == "--":
        args = args[1:]
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in own_options:
            raise VllmArgsError(
                f"{command}: {flag} among vLLM's arguments would override what warden sets; "
                f"give it as {command}'s own {own_options[flag]} instead"
            )
    return args


@dataclass
class LaunchSpec:
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    run_dir: Path | None = None

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            SERVER_MODULE,
            "--model",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--logits-processors",
            LOGITS_PROCESSOR,
            "--worker-extension-cls",
            WORKER_EXTENSION,
            "--middleware",
            MIDDLEWARE,
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        """The process environment, with a fresh, wiped multiprocess metrics folder."""
        run_dir = self.run_dir or Path(tempfile.mkdtemp(prefix="warden-run-"))
        metrics_dir = run_dir / "prometheus-multiproc"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env = dict(os.environ)
        env.setdefault("VLLM_CACHE_ROOT", str(run_dir / "vllm-cache"))
        # When the engine core dies (a CUDA driver error, say), vLLM would shut its API server
        # down within seconds, taking the evidence with it. Kept alive, the server answers
        # /warden/ready with 503 and why (engine dead, N CUDA driver errors) and serves the
        # error counters on /metrics until the supervisor restarts it.
        env.setdefault("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "1")
        env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(HTTP_KEEP_ALIVE_S))
        env.update(
            {
                "VLLM_PLUGINS": VLLM_PLUGINS,
                "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.pop(SIGNAL_BOARD_ENV, None)  # each engine tree makes its own board
        env.update(self.env)
        return env
