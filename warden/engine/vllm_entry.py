"""Starts vLLM's OpenAI API server: ``python -m warden.engine.vllm_entry ARGS`` runs what
``python -m vllm.entrypoints.openai.api_server ARGS`` runs.

Why a module of warden's: a process started with the ``spawn`` method (vLLM's engine core and
worker on a CPU host) first imports its parent's ``__main__`` module again. Started as
``-m vllm.entrypoints.openai.api_server``, that is vLLM's whole HTTP server stack, imported
for nothing in every engine process. This module imports nothing until it runs as the main
module, so a spawned child's copy of it is free, and every engine start and supervised restart
is that much shorter.

It is also where the API server, before vLLM makes a metric, keeps vLLM's own metrics in its
memory instead of the multiprocess folder (``exporter.api_metrics``), when warden's middleware,
which then serves ``/metrics``, is on the command line.
"""

from __future__ import annotations

import importlib

# vLLM's own entry point behind ``-m vllm.entrypoints.openai.api_server`` (vLLM 0.32); the
# installed vLLM is checked for it by tests/test_vllm_hooks_units.py.
VLLM_SERVER_ENTRY = ("vllm.entrypoints.launchers.api_server.entry", "main")


def main() -> None:
    import sys

    from exporter import api_metrics
    from warden.engine.launch import MIDDLEWARE

    if middleware_named(sys.argv[1:], MIDDLEWARE):
        api_metrics.install()
    module, function = VLLM_SERVER_ENTRY
    getattr(importlib.import_module(module), function)()


def middleware_named(argv: list[str], middleware: str) -> bool:
    """Whether vLLM's command line adds ``middleware`` (``--middleware X`` or ``=X``)."""
    for index, arg in enumerate(argv):
        if arg == "--middleware" and argv[index + 1 : index + 2] == [middleware]:
            return True
        if arg == f"--middleware={middleware}":
            return True
    return False


if __name__ == "__main__":
    main()
