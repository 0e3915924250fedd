"""``warden demo``: the main job a newcomer runs first.

Builds the tiny model, starts a real vLLM engine with every warden hook, sends a few requests
(one of them long enough to fill the tiny KV cache) and prints the warden metrics the engine
now exports on its own /metrics.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from exporter import catalog
from warden.engine_process import EngineProcess
from warden.launch import LaunchSpec
from warden.tinymodel import build_tiny_model

DEMO_ENGINE_ARGS = [
    "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--block-size", "32",
    "--max-num-seqs", "8", "--num-gpu-blocks-override", "12",
]  # fmt: skip


def run_demo(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir)
    model_dir = workdir / "tiny-model"
    if not (model_dir / "config.json").exists():
        print(f"building the tiny model in {model_dir}")
        build_tiny_model(model_dir)
    spec = LaunchSpec(
        str(model_dir),
        port=args.port,
        extra_args=DEMO_ENGINE_ARGS,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        run_dir=workdir,
    )
    engine = EngineProcess(spec, log_path=workdir / "engine.log")
    print(f"starting vLLM with warden on {engine.base_url} (log: {engine.log_path})")
    with engine:
        prompt = " ".join(["memory watermark cache block"] * 15)
        body = {"model": str(model_dir), "prompt": prompt, "max_tokens": 100}
        with ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda _: (
                        httpx.post(
                            f"{engine.base_url}/v1/completions", json=body, timeout=300
                        ).status_code
                    ),
                    range(8),
                )
            )
        print(f"8 concurrent long requests -> statuses {results}")
        text = httpx.get(engine.metrics_url, timeout=10).text
        names = tuple(spec.name for spec in catalog.WARDEN) + (catalog.VLLM_NUM_PREEMPTIONS.name,)
        print("\nwarden metrics on the engine's /metrics:")
        for line in text.splitlines():
            if line.startswith(names):
                print("  " + line)
    return 0 if all(status == 200 for status in results) else 1
