"""Starts vLLM's OpenAI API server: ``python -m warden.engine.vllm_entry ARGS`` runs what
``python -m vllm.entrypoints.openai.api_server ARGS`` runs.

Why a module of warden's: a process started with the ``spawn`` method (vLLM's engine core and
worker on a CPU host) first imports its parent's ``__main__`` module again. Started as
``-m vllm.entrypoints.openai.api_server``, that is vLLM's whole HTTP server stack, imported
for nothing in every engine process. This module imports nothing until it runs as the main
module, so a spawned child's copy of it is free, and every engine start and supervised restart
is that much shorter.
"""

from __future__ import annotations

import importlib

# vLLM's own entry point behind ``-m vllm.entrypoints.openai.api_server`` (vLLM 0.32); the
# installed vLLM is checked for it by tests/test_vllm_hooks_units.py.
VLLM_SERVER_ENTRY = ("vllm.entrypoints.launchers.api_server.entry", "main")


def main() -> None:
    module, function = VLLM_SERVER_ENTRY
    getattr(importlib.import_module(module), function)()


if __name__ == "__main__":
    main()
