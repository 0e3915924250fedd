"""Series budget per engine (#12 item 6): how many series one engine adds to Prometheus.

Starts one engine with warden (the tiny model), serves a mix of requests so the label values
a working engine shows appear (finish reasons ``stop`` and ``length``, a refused request, an
aborted one), lets warden's collectors run, then counts the series on its ``/metrics``: warden's
own (``warden_*``), vLLM's (``vllm:*``), and the rest (process and Python collectors). Each
histogram bucket, ``_sum``, ``_count`` and ``_created`` is one series, as Prometheus stores it.
Multiply by the engines a Prometheus scrapes (or a remote-write store receives) for its budget.

    .venv/bin/python -m benchmarks.series_budget
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import VARIANTS, exit_on_sigterm, log, running_engines, tiny_model
from warden.common.metrics_text import iter_samples

GROUPS = (("warden", "warden_"), ("vllm", "vllm:"))


def group_of(name: str) -> str:
    return next((group for group, prefix in GROUPS if name.startswith(prefix)), "other")


def count_series(text: str) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for sample in iter_samples(text):
        counts[group_of(sample.name)] += 1
    return dict(counts)


def families(text: str) -> dict[str, int]:
    """Series per metric family (name without the histogram/counter suffixes)."""
    out: collections.Counter[str] = collections.Counter()
    for sample in iter_samples(text):
        name = sample.name
        for suffix in ("_bucket", "_sum", "_count", "_created", "_total"):
            name = name.removesuffix(suffix)
        out[name] += 1
    return dict(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", help="model path (default: the tiny model, built)")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--json", type=Path, help="write the counts here")
    args = parser.parse_args()
    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="warden-series-") as tmp:
        work = Path(tmp)
        model = tiny_model(work, args.model)
        with running_engines([VARIANTS["warden"]], model, work) as engines:
            engine = engines["warden"]
            url = f"{engine.base_url}/v1/completions"
            with httpx.Client(timeout=120) as client:
                for index in range(args.requests):
                    body = {"model": model, "prompt": f"series {index}", "max_tokens": 4 + index}
                    client.post(url, json=body)  # short ones finish by length
                client.post(url, json={"model": model, "prompt": "x", "max_tokens": 10**9})
                client.post(url, json={"model": model, "prompt": "ok", "max_tokens": 2})
                time.sleep(6)  # a few collector ticks
                text = client.get(f"{engine.base_url}/metrics").text
    counts = count_series(text)
    total = sum(counts.values())
    by_family = families(text)
    result = {"series": counts, "total": total, "families": by_family}
    log(f"series on one engine's /metrics: {counts} (total {total})")
    top = sorted(by_family.items(), key=lambda kv: -kv[1])[:15]
    for name, count in top:
        log(f"  {count:5d}  {name}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
