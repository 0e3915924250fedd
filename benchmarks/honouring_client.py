"""A client that honours Retry-After, for the overload benchmark.

vLLM's own client (``vllm bench serve``) sends each request once: to it a refused request is
simply refused, as to any client that ignores Retry-After. Whether warden's Retry-After is
right shows only with clients that come back when told: a refused request whose client waits
the Retry-After should then be admitted. This client sends the same kind of requests as the
benchmark's ``vllm bench serve`` runs (vLLM's random dataset, same lengths, same seed), open
loop with Poisson arrivals, and when refused (503 or 429) waits the Retry-After and sends the
request again, up to ``max_returns`` times. Like vLLM's client it keeps connections alive
(aiohttp, 60 s), so a connection the server drops shows as a lost request.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from benchmarks.common import quantile

REFUSAL_STATUSES = (429, 503)
# Lengths and spread of the benchmark's requests (benchmarks/overload.py, bench_serve).
INPUT_LEN, OUTPUT_LEN, RANGE_RATIO = 64, 96, 0.5


@dataclass
class RequestRecord:
    """One request's life: its refusals, the waits it honoured, and how it ended."""

    refusals: int = 0
    returns: int = 0  # times sent again after waiting a Retry-After
    waited_s: float = 0.0
    outcome: str = "pending"  # completed, gave_up, no_retry_after, failed, lost
    latency_s: float | None = None  # the admitted attempt's, sent to answered
    # Seconds into the run it first came back, and whether that return was refused again.
    first_return_s: float | None = None
    refused_on_first_return: bool = False
    output_tokens: int = 0
    detail: str = ""


@dataclass(frozen=True)
class Prompt:
    text: str
    output_len: int


def sample_prompts(model: str, count: int, seed: int) -> list[Prompt]:
    """Prompts from vLLM's random dataset with the lengths ``vllm bench serve`` is given."""
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import RandomDataset

    tokenizer = AutoTokenizer.from_pretrained(model)
    samples = RandomDataset(random_seed=seed, dataset_path=None).sample(
        tokenizer=tokenizer,
        num_requests=count,
        prefix_len=0,
        range_ratio=RANGE_RATIO,
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
    )
    return [Prompt(str(s.prompt), int(s.expected_output_len)) for s in samples]


def retry_after_s(header: str | None) -> float | None:
    """The wait a refusal asks for, in seconds; None when it names none a client can use."""
    if header is None:
        return None
    try:
        wait = float(header.strip())
    except ValueError:
        return None
    return wait if wait >= 0 else None


async def send_until_admitted(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    record: RequestRecord,
    max_returns: int,
    started: float = 0.0,
) -> None:
    """Sends the request; each refusal's Retry-After is waited, then it is sent again
    (``started``: the run's start on ``time.perf_counter``)."""
    for attempt in range(max_returns + 1):
        sent = time.perf_counter()
        if attempt == 1:
            record.first_return_s = sent - started
        try:
            async with session.post(url, json=body) as response:
                payload = await response.json(content_type=None)
                status, header = response.status, response.headers.get("Retry-After")
        except (TimeoutError, aiohttp.ClientError) as error:
            record.outcome, record.detail = "lost", f"{type(error).__name__}: {error}"
            return
        except ValueError as error:  # an answer that is not JSON
            record.outcome, record.detail = "failed", f"unreadable answer: {error}"
            return
        if status in REFUSAL_STATUSES:
            record.refusals += 1
            record.refused_on_first_return = record.refused_on_first_return or attempt == 1
            wait = retry_after_s(header)
            if wait is None:
                record.outcome, record.detail = "no_retry_after", f"{status} without Retry-After"
                return
            if attempt == max_returns:
                record.outcome = "gave_up"
                return
            record.waited_s += wait
            await asyncio.sleep(wait)
            record.returns += 1
            continue
        if status != 200:
            record.outcome, record.detail = "failed", f"HTTP {status}: {str(payload)[:200]}"
            return
        record.latency_s = time.perf_counter() - sent
        usage = (payload.get("usage") or {}) if isinstance(payload, dict) else {}
        record.output_tokens = int(usage.get("completion_tokens") or 0)
        record.outcome = "completed"
        return


async def _run(
    base_url: str,
    model: str,
    prompts: Sequence[Prompt],
    rate: float,
    seed: int,
    max_returns: int,
) -> tuple[list[RequestRecord], float]:
    url = base_url.rstrip("/") + "/v1/completions"
    arrivals = random.Random(seed)
    records = [RequestRecord() for _ in prompts]
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=6 * 3600)
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        for prompt, record in zip(prompts, records, strict=True):
            body = {
                "model": model,
                "prompt": prompt.text,
                "max_tokens": prompt.output_len,
                "ignore_eos": True,
            }
            tasks.append(
                asyncio.create_task(
                    send_until_admitted(session, url, body, record, max_returns, started)
                )
            )
            await asyncio.sleep(arrivals.expovariate(rate))
        await asyncio.gather(*tasks)
    return records, time.perf_counter() - started


def run_honouring(
    base_url: str,
    model: str,
    rate: float,
    count: int,
    slo_s: float,
    seed: int = 0,
    max_returns: int = 5,
    prompts: Sequence[Prompt] | None = None,
) -> dict[str, Any]:
    """One open-loop run of clients that honour Retry-After; its summary."""
    prompts = sample_prompts(model, count, seed) if prompts is None else prompts
    records, duration = asyncio.run(_run(base_url, model, prompts, rate, seed, max_returns))
    return summarize(records, duration, slo_s)


def summarize(records: Sequence[RequestRecord], duration_s: float, slo_s: float) -> dict[str, Any]:
    """The figures the overload benchmark reports, in the keys of ``vllm bench serve``'s result
    where there is one (completed, failed, duration, request_goodput, p99_e2el_ms)."""
    completed = [r for r in records if r.outcome == "completed"]
    latencies = sorted(r.latency_s for r in completed if r.latency_s is not None)
    within = sum(1 for latency in latencies if latency <= slo_s)
    refused = [r for r in records if r.refusals]
    returned = [r for r in refused if r.returns]
    admitted_first_return = sum(1 for r in returned if r.refusals == 1 and r.outcome == "completed")
    waits = [r.waited_s / r.returns for r in returned]
    failures = [r for r in records if r.outcome != "completed"]
    return {
        "completed": len(completed),
        "failed": len(failures),
        "duration": duration_s,
        "request_goodput": within / duration_s if duration_s > 0 else None,
        "p99_e2el_ms": 1000 * quantile(latencies, 0.99) if latencies else None,
        "refused_requests": len(refused),
        "refusals": sum(r.refusals for r in records),
        "returned": len(returned),
        "admitted_on_first_return": admitted_first_return,
        "admitted_on_first_return_share": (
            admitted_first_return / len(returned) if returned else None
        ),
        "eventually_admitted": sum(1 for r in refused if r.outcome == "completed"),
        "gave_up": sum(1 for r in records if r.outcome == "gave_up"),
        "no_retry_after": sum(1 for r in records if r.outcome == "no_retry_after"),
        "lost": sum(1 for r in records if r.outcome == "lost"),
        "other_failures": sum(1 for r in records if r.outcome == "failed"),
        "median_retry_after_s": statistics.median(waits) if waits else None,
        "failure_examples": sorted({r.detail for r in failures if r.detail})[:5],
        "first_returns_by_time": first_returns_by_time(returned),
    }


# The width of the bins the first returns are counted in, seconds into the run.
RETURN_BIN_S = 10.0


def first_returns_by_time(returned: Sequence[RequestRecord]) -> list[list[int]]:
    """Per ``RETURN_BIN_S`` of the run, by when they came back: the first returns and how
    many of them were refused again. Refused while new arrivals still come, the returns lost
    their slots to them; refused in one bin late in the run, they came back together (a
    Retry-After at its bound); refused at the start, the server did not yet expect them."""
    bins: list[list[int]] = []
    for record in returned:
        if record.first_return_s is None:
            continue
        index = int(record.first_return_s // RETURN_BIN_S)
        while len(bins) <= index:
            bins.append([0, 0])
        bins[index][0] += 1
        bins[index][1] += int(record.refused_on_first_return)
    return bins
