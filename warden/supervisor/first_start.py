"""Why vLLM could not start: its own error line picked out of its output, and what to do.

A vLLM that exits before it was ever ready on the supervisor's first start fails for a reason
that a restart with the same arguments will meet again (a bad flag, a missing model, too little
memory). The supervisor then stops instead of restarting, and says why with the line vLLM
printed (``error_line``) and a hint for that kind of failure (``hint``). Pure functions on text
lines, so every vLLM message we have seen has a unit test.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# The exit status of ``warden serve`` when vLLM's first start failed.
EXIT_FIRST_START_FAILED = 3

# vLLM prefixes lines from its processes: "(EngineCore_DP0 pid=12) ERROR 11-23 14:18:28
# [file.py:953] ..."; the message is what follows.
_PROCESS_PREFIX = re.compile(r"^\([\w:-]+ pid=\d+\)\s*")
_LOG_PREFIX = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d [\d:.]+\s+\[[^\]]*\]\s*"
)
# A Python exception's last line: "ValueError: ...", "torch.OutOfMemoryError: ...".
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt): \S")
# argparse: "api_server.py: error: unrecognized arguments: --x".
_ARGPARSE = re.compile(r"^[\w.\-]+: error: \S")
# Wrappers that point elsewhere for the cause.
_WRAPPERS = ("see root cause above", "engine core initialization failed", "see stack trace above")


def _message(line: str) -> str:
    text = _PROCESS_PREFIX.sub("", line.strip())
    return _LOG_PREFIX.sub("", text).strip()


def error_line(lines: Sequence[str]) -> str | None:
    """The line that says why vLLM failed: the last exception or argument error that is not a
    wrapper pointing at an earlier one (a root cause printed by the engine core or worker
    comes before the API server's "Engine core initialization failed")."""
    found: list[str] = []
    for line in lines:
        message = _message(line)
        if _EXCEPTION.match(message) or _ARGPARSE.match(message):
            found.append(message)
    causes = [m for m in found if not any(w in m.lower() for w in _WRAPPERS)]
    if causes:
        return causes[-1]
    return found[-1] if found else None


_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("cpu memory", "cpu backend", "vllm_cpu_kvcache_space", "on kv cache allocation"),
        "vLLM on CPU reserves --gpu-memory-utilization (0.92 by default) of the node's memory "
        "unless VLLM_CPU_KVCACHE_SPACE (GiB of KV cache) is set: set VLLM_CPU_KVCACHE_SPACE=1, "
        "or give vLLM a smaller --gpu-memory-utilization",
    ),
    (
        ("unrecognized arguments", "error: argument", "invalid choice", "expected one argument"),
        "vLLM refused its arguments: put warden serve's own options before MODEL and vLLM's "
        "after it (optionally after --); `warden serve --print-command MODEL ...` shows the "
        "exact command",
    ),
    (
        ("out of memory", "outofmemory", "no available memory for the cache blocks"),
        "the model, its KV cache and CUDA graphs do not fit: lower --gpu-memory-utilization "
        "or --max-model-len, free the GPU, or try --enforce-eager",
    ),
    (
        ("address already in use",),
        "the serving port is taken: stop what listens there, or choose another --port",
    ),
    (
        (
            "repo id",
            "does not appear to have a file named",
            "no such file or directory",
            "is not a local folder",
            "not a valid model identifier",
            "can't load the configuration",
        ),
        "vLLM cannot load the model: check the model path or name (and network access or "
        "HF_TOKEN for a hub model)",
    ),
)


def hint(line: str | None) -> str:
    """What to do about the failure ``line`` describes."""
    text = (line or "").lower()
    for needles, advice in _HINTS:
        if any(needle in text for needle in needles):
            return advice
    return (
        "a start with the same arguments fails the same way; fix the cause in vLLM's output "
        "above and start again"
    )


def explain(lines: Sequence[str], exit_detail: str, output_hint: str) -> str:
    """The supervisor's one message for a failed first start."""
    line = error_line(lines)
    said = f"vLLM said: {line.rstrip('.')}" if line else "vLLM printed no error line"
    return (
        f"vLLM stopped ({exit_detail}) on its first start, before it was ever ready: not "
        f"restarting (the same arguments would fail the same way). {said}. Hint: {hint(line)}. "
        f"{output_hint}"
    )
