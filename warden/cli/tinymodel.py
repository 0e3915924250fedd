"""Build a tiny random-weight Llama and a locally trained tokenizer.

Tests and demos need a real model that vLLM loads like any other, but nothing can be downloaded.
A 0.8 M-parameter Llama with random weights and a byte-level BPE tokenizer trained on text
generated here is enough for a real engine. The build is deterministic for a given seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

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


def build_tiny_model(out_dir: str | Path, seed: int = 0, vocab_size: int = 1024) -> Path:
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
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "warden_tiny.json").write_text(json.dumps({"seed": seed, "vocab_size": len(fast)}))
    return out


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
