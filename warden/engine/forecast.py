"""The KV forecast's inputs for one request: the prompt's length in tokens and the cache's state.

The prompt is counted the way ``len(tokenizer.encode(prompt))`` counts it: a long one (over
``INLINE_TOKENIZE_CHARS``) on a worker thread, so it cannot stall every stream and /health; a
short one on the event loop, where counting takes less than the hop to a thread.

Counting is skipped where it cannot change the decision: when even ``token_bound`` (more tokens
than the prompt can have) fits in the KV cache's free blocks, the prompt neither "never fits"
nor lacks blocks, and admission decides as it would with the count; without a saturation limit
only "never fits" reads the count, so the bound is weighed against the whole cache
(``deciding_blocks``). Tokenizing every prompt a
second time (vLLM does it again) cost the API server about 4% of its CPU per request at 10
requests/s on the tiny model (benchmarks/README.md, #28).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from exporter import vllm_compat
from warden.control import token_limits
from warden.control.admission import KvState
from warden.engine.runtime import EngineRuntime

log = logging.getLogger("warden.control")
# Prompts longer than this are not tokenized for the forecast (vLLM refuses them anyway).
MAX_FORECAST_PROMPT_CHARS = 1 << 20
# Prompts up to this long are tokenized on the event loop: a thread hop costs more than they.
INLINE_TOKENIZE_CHARS = 2048
# Special tokens a tokenizer may add around a prompt (BOS, EOS, a dummy prefix), at most.
SPECIAL_TOKENS_BOUND = 16


def token_bound(prompt: str | list[int]) -> int:
    """More tokens than ``prompt`` can encode to: a token holds at least one byte of the text
    (byte-level BPE, SentencePiece with byte fallback, WordPiece), doubled for normalizers that
    expand a character (NFKC), plus the special tokens."""
    if isinstance(prompt, list):
        return len(prompt)
    return 2 * len(prompt.encode("utf-8", "surrogatepass")) + SPECIAL_TOKENS_BOUND


def prompt_text(route: str, body: dict[str, Any]) -> str | list[int] | None:
    """The prompt the forecast counts: a completion's, or a chat's message contents."""
    if route == token_limits.INVOCATIONS:
        chat = isinstance(body.get("messages"), list)
        route = "/v1/chat/completions" if chat else "/v1/completions"
    if route == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return prompt
        return None
    messages = body.get("messages") if route == "/v1/chat/completions" else None
    if isinstance(messages, list):
        parts = [m.get("content") for m in messages if isinstance(m, dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return None


def count_tokens(tokenizer: Any, prompt: str) -> int:
    """What ``len(tokenizer.encode(prompt))`` counts. A Hugging Face fast tokenizer's Rust
    backend is asked directly when no truncation or padding is left set on it (a call of
    vLLM's may leave one, which ``encode`` would reset first): the same tokens, without the
    batch path (a thread-pool hop per prompt) and its Python wrapping."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        return len(backend.encode(prompt).ids)
    return len(tokenizer.encode(prompt))


class Forecast:
    def __init__(self, rt: EngineRuntime) -> None:
        self.runtime = rt
        self._tokenizer: Any = None

    async def prompt_tokens(
        self, route: str, body: dict[str, Any], kv: KvState | None = None, room_blocks: int = 0
    ) -> int | None:
        """The prompt's tokens; None when not known, or (``kv`` given) when even its bound fits
        in ``room_blocks`` (``deciding_blocks``), where the count cannot change admission's
        decision."""
        prompt = prompt_text(route, body)
        if prompt is None or len(prompt) > MAX_FORECAST_PROMPT_CHARS:
            return None
        if isinstance(prompt, list):
            return len(prompt)
        if kv is not None and kv.blocks_for(token_bound(prompt) + 1) <= room_blocks:
            return None
        client = self.runtime.engine_client
        if client is None:
            return None
        try:
            if self._tokenizer is None:
                tokenizer = client.get_tokenizer()  # sync in vLLM 0.32, async in older ones
                if inspect.isawaitable(tokenizer):
                    tokenizer = await tokenizer
                self._tokenizer = tokenizer
            if len(prompt) <= INLINE_TOKENIZE_CHARS:
                return count_tokens(self._tokenizer, prompt)
            # Off the event loop: a long prompt must not stall every stream and /health.
            return await asyncio.to_thread(count_tokens, self._tokenizer, prompt)
        except Exception:
            log.debug("warden: prompt not tokenized; forecast skipped", exc_info=True)
            return None

    def kv_state(self) -> KvState | None:
        geometry = vllm_compat.kv_geometry(self.runtime.engine_client)
        monitor = self.runtime.monitor
        if geometry is None or monitor is None:
            return None
        return KvState(geometry[0], geometry[1], monitor.snapshot.kv_cache_usage)


def deciding_blocks(kv: KvState, margin_blocks: int, saturation_judged: bool) -> int:
    """The blocks a prompt's count is weighed against: the free ones when saturation is
    judged (the blocks a prompt lacks lengthen its predicted wait), else the whole cache (a
    prompt that can never fit is refused). Without a saturation limit a full cache, the normal
    state of a busy engine, would otherwise have every prompt tokenized a second time for a
    count no decision reads (issue #28)."""
    if saturation_judged:
        return kv.free_blocks(margin_blocks)
    return kv.total_blocks - margin_blocks
