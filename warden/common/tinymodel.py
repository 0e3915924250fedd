"""Build a tiny random-weight Llama and a locally trained tokenizer.

Tests and demos need a real model that vLLM loads like any other, but nothing can be downloaded.
A 0.8 M-parameter Llama with random weights and a byte-level BPE tokenizer trained on text
generated here is enough for a real engine. The build is deterministic for a given seed.

``nan_token``: a variant whose weights genuinely produce NaN logits for any prompt containing
that token id, a real fault source for warden's non-finite logits path (``warden model tiny DIR
--nan-token ID``, ``warden chaos nan``); how, in ``poison_token``. The model never generates the
token itself, and its KV cache stays finite. The id is recorded in ``warden_tiny.json``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '</s>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
_WORDS = [
    "memory",
    "watermark",
    "cache",
    "block",
    "engine",
    "request",
    "token",
    "prompt",
    "graph",
    "device",
    "allocator",
    "stall",
    "retry",
    "alert",
    "page",
    "lease",
    "policy",
    "admission",
    "queue",
    "shed",
    "cap",
    "reject",
    "circuit",
    "breaker",
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "for",
    "on",
    "with",
    "as",
    "at",
    "by",
    "from",
    "this",
    "that",
    "be",
    "are",
    "was",
]


def _corpus(seed: int, lines: int = 2000) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) for _ in range(lines)]


# The NaN token of the stack's tiny model: <unk>, which byte-level BPE never produces from text
# and the poisoned model never generates, so only a prompt given as token ids carries it.
STACK_NAN_TOKEN = 0


def build_tiny_model(
    out_dir: str | Path, seed: int = 0, vocab_size: int = 1024, nan_token: int | None = None
) -> Path:
    """Write config, random weights and tokenizer into ``out_dir`` and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        vocab_size=len(fast),
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,  # the NaN variant poisons the input embedding only
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    if nan_token is not None:
        if not 0 <= nan_token < len(fast):
            raise ValueError(f"--nan-token {nan_token}: not a token id (0..{len(fast) - 1})")
        poison_token(model, nan_token)
    model.save_pretrained(out, safe_serialization=True)
    info = {"seed": seed, "vocab_size": len(fast), "nan_token": nan_token}
    (out / "warden_tiny.json").write_text(json.dumps(info))
    return out


STEADY_FEATURE = 8.0  # added to feature 0 of every embedding: dominates the final hidden state
NEVER_WEIGHT = -16.0  # the poisoned token's output weight on that feature
MARKER = 1  # the residual feature that only the poisoned token sets
OVERFLOW_GAIN = 1e25  # the last MLP's weight on the marker: any marker at all overflows to inf


def poison_token(model: Any, token: int) -> None:
    """NaN logits for any prompt that contains ``token``, with a KV cache that stays finite.

    NaN written into the KV cache would outlive the request: a block reused by a later request
    still holds it in slots past that request's length, and vLLM's CPU attention turns 0 x NaN
    into NaN for the newcomer. So the fault is made after the last layer's attention:
    - the token's embedding alone sets residual feature ``MARKER``; nothing else writes it
      (layer 0's output rows for it are zero);
    - the last layer's attention copies it to every later position (one value channel reads only
      that feature, one output row writes only that channel), exactly 0 where the token is absent;
    - the last layer's MLP multiplies it by ``OVERFLOW_GAIN`` twice: float32 overflows to inf,
      the final norm turns inf into NaN, the logits are NaN. Keys and values are computed before
      that, so the cache holds finite numbers only.
    Every other embedding gets ``STEADY_FEATURE``; the token's output row weighs it strongly
    negative, so the model never generates the token (a healthy prompt stays healthy).
    """
    import torch

    first, last = model.model.layers[0], model.model.layers[-1]
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight
        embedding[:, 0] += STEADY_FEATURE
        embedding[:, MARKER] = 0.0
        embedding[token, MARKER] = 1.0
        first.self_attn.o_proj.weight[MARKER] = 0.0
        first.mlp.down_proj.weight[MARKER] = 0.0
        # Last layer: value channel 0 of kv-head 0 reads the marker and nothing else; output row
        # MARKER writes that channel (as seen by query head 0) and nothing else; no other output
        # row reads the channel.
        value = last.self_attn.v_proj.weight
        value[0] = 0.0
        value[0, MARKER] = 1.0
        out = last.self_attn.o_proj.weight
        head_dim = out.shape[1] // model.config.num_attention_heads
        heads_per_kv = model.config.num_attention_heads // model.config.num_key_value_heads
        for head in range(heads_per_kv):
            out[:, head * head_dim] = 0.0
        out[MARKER] = 0.0
        out[MARKER, 0] = 1.0
        mlp = last.mlp
        mlp.gate_proj.weight[0] = 0.0
        mlp.gate_proj.weight[0, MARKER] = OVERFLOW_GAIN
        mlp.up_proj.weight[0] = 0.0
        mlp.up_proj.weight[0, MARKER] = OVERFLOW_GAIN
        head = model.lm_head.weight
        head[token] = 0.0
        head[token, 0] = NEVER_WEIGHT


def nan_token_of(model_dir: str | Path) -> int | None:
    """The poisoned token of a tiny model built with ``nan_token`` (None otherwise)."""
    try:
        info = json.loads((Path(model_dir) / "warden_tiny.json").read_text())
    except (OSError, ValueError):
        return None
    token = info.get("nan_token") if isinstance(info, dict) else None
    return int(token) if isinstance(token, int) else None


# vLLM arguments that suit the tiny model on a CPU: small and fast on two cores. Tests and
# benchmarks start every engine with these; each adds its own flags on top.
TINY_BASE_ARGS: tuple[str, ...] = (
    "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--block-size", "32",
)  # fmt: skip


def tiny_engine_args(*flags: str, drop: Sequence[str] = ()) -> tuple[str, ...]:
    """``TINY_BASE_ARGS`` changed by ``flags`` (``--flag value`` pairs, or bare switches): a
    flag the base has gets its new value in place, a new one is appended; ``drop`` removes
    flags (and their values) from the base."""
    args = list(TINY_BASE_ARGS)
    for flag in drop:
        if flag in args:
            index = args.index(flag)
            takes_value = index + 1 < len(args) and not args[index + 1].startswith("--")
            del args[index : index + (2 if takes_value else 1)]
    index = 0
    while index < len(flags):
        flag = flags[index]
        takes_value = index + 1 < len(flags) and not flags[index + 1].startswith("--")
        if flag in args:
            if takes_value:
                args[args.index(flag) + 1] = flags[index + 1]
        else:
            args += flags[index : index + (2 if takes_value else 1)]
        index += 2 if takes_value else 1
    return tuple(args)


# The demo's and the stack's engine: a 12-block KV cache (384 tokens) that a handful of long
# requests fills, so memory pressure is easy to make in demos and tests.
TINY_ENGINE_ARGS = tiny_engine_args(
    "--max-model-len", "256", "--max-num-seqs", "8", "--num-gpu-blocks-override", "12"
)
