"""What warden's V2 logits processor costs a batch that vLLM would not otherwise process.

Model Runner V2 calls logits processors only in its processing stage, which starts by copying
the logits to a new float32 tensor (``torch.empty_like(logits, dtype=torch.float32)
.copy_(logits)`` in ``vllm/v1/worker/gpu/sample/sampler.py``). A batch whose every request
samples plainly (greedy, or temperature 1 without top-k/top-p/min-p) skips that stage, unless a
processor's ``add_request`` asked for it: warden's does while ``WARDEN_LOGITS_CHECK_EVERY_STEP``
is on (the default), so on such a batch warden costs that copy plus its own check (one row
maximum, ``exporter.nonfinite``). On any other batch the copy is vLLM's own and warden adds only
the check.

Per shape (logits dtype as the model produces it, rows, vocabulary), the median time of: V2's
copy, warden's check on the copy, and both (what a plain batch pays per step with the setting
on), with the bytes the copy writes. On CPU (the default where CUDA is missing) the times are
wall-clock per call; on CUDA (``--device cuda``) device time from CUDA events. CPU figures are
memory-bandwidth figures of this host, not a GPU's: an H100 moves the same bytes about two
orders of magnitude faster.

Usage:  .venv/bin/python -m benchmarks.logits_copy [--device cpu|cuda] [--iterations 9]
        [--rows 8,64,256] [--vocab 32000,128256] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from exporter.nonfinite import NonFiniteDetector, RowOwner

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
EOS = 2


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_name() -> str:
    """(This module needs torch and the checkout only, so it runs on a bare GPU machine too.)"""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def v2_copy(logits: torch.Tensor) -> torch.Tensor:
    """Exactly what V2's ``Sampler.apply_sampling_params`` does before any processor runs."""
    return torch.empty_like(logits, dtype=torch.float32).copy_(logits)


def median_ms(fn: Callable[[], object], device: str, iterations: int) -> float:
    fn()  # warm-up (allocator, kernels)
    samples = []
    for _ in range(iterations):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def measure(device: str, dtype: torch.dtype, rows: int, vocab: int, iterations: int) -> dict:
    logits = torch.randn(rows, vocab, device=device, dtype=dtype)
    copied = v2_copy(logits)
    owners = [RowOwner(i) for i in range(rows)]
    # Small shapes take microseconds: more samples, so a busy host's hiccups stay outliers.
    iterations = max(iterations, min(201, 400_000_000 // (rows * vocab * 4)))
    detector = NonFiniteDetector(EOS, lambda owner, kind: None)
    try:
        copy_ms = median_ms(lambda: v2_copy(logits), device, iterations)
        check_ms = median_ms(lambda: detector.check(copied, owners), device, iterations)
        both_ms = median_ms(lambda: detector.check(v2_copy(logits), owners), device, iterations)
        if device == "cuda":
            detector.wait_resolved(60)
    finally:
        detector.close()
    return {
        "copy_mib": round(rows * vocab * 4 / 2**20, 1),
        "v2_copy_ms": round(copy_ms, 3),
        "check_ms": round(check_ms, 3),
        "copy_and_check_ms": round(both_ms, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cpu", "cuda"), default=default_device)
    parser.add_argument("--iterations", type=int, default=9)
    parser.add_argument("--rows", default="8,64,256")
    parser.add_argument("--vocab", default="32000,128256")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for dtype_name, dtype in DTYPES.items():
        for vocab in map(int, args.vocab.split(",")):
            for rows in map(int, args.rows.split(",")):
                log(f"{dtype_name} rows={rows} vocab={vocab}")
                figures = measure(args.device, dtype, rows, vocab, args.iterations)
                results.append({"dtype": dtype_name, "rows": rows, "vocab": vocab, **figures})
    where = (
        torch.cuda.get_device_name(0)
        if args.device == "cuda"
        else f"CPU {cpu_name()}, {torch.get_num_threads()} torch threads, load {os.getloadavg()}"
    )
    print(f"device: {where}; torch {torch.__version__}; median of {args.iterations}")
    columns = ["dtype", "rows", "vocab", "copy_mib", "v2_copy_ms", "check_ms", "copy_and_check_ms"]
    print("| " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * (len(columns) - 1))
    for r in results:
        print("| " + " | ".join(str(r[c]) for c in columns) + " |")
    if args.json:
        args.json.write_text(json.dumps({"device": where, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
