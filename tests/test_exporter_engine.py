"""The exporter inside a real vLLM CPU engine on the tiny model: no fakes in this module."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.mmap_dict import MmapedDict

from exporter import catalog
from tests.support.engine import TINY_KV_ARGS, complete, running_engine, sample, scrape
from warden.common.metrics_text import parse_samples
from warden.common.waiting import wait_until
from warden.supervisor.engine import EngineProcess

pytestmark = pytest.mark.engine

LONG_PROMPT = " ".join(["memory watermark cache block engine request"] * 12)


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    run_dir = tmp_path_factory.mktemp("exporter-engine")
    # This module fills the cache on purpose (what happens when it fills: preemption, and no
    # memory alarm); admission's own limits are tested in test_control_engine.py.
    config = run_dir / "warden.yaml"
    config.write_text("admission:\n  forecast:\n    enabled: false\nreflex:\n  enabled: false\n")
    env = {
        "WARDEN_TEST_INJECT_NONFINITE": "1",
        "WARDEN_TEST_FAILING_COLLECTOR": "1",
        "WARDEN_CONFIG": str(config),
        # Slow steps (test switch): a flood request lasts >= 1.8 s, so requests overlap even
        # when the engine starves the test process that sends them.
        "WARDEN_TEST_STEP_DELAY_S": "0.01",
    }
    with running_engine(tiny_model, extra_args=TINY_KV_ARGS, env=env, run_dir=run_dir) as eng:
        yield eng


def test_every_cpu_metric_is_on_vllms_own_metrics_endpoint(engine: EngineProcess) -> None:
    complete(engine, str(engine.spec.model), "hello", max_tokens=4).raise_for_status()
    names = {key.partition("{")[0] for key in scrape(engine)}
    expected = {
        catalog.MEMORY_WATERMARK,
        catalog.WATERMARK_TRANSITIONS,
        catalog.SOURCE_AVAILABLE,
        catalog.NONFINITE_LOGITS,
        catalog.ENGINE_ERRORS,
        catalog.ENGINE_LAST_STEP,
        catalog.ENGINE_STALLED,
        catalog.COLLECTOR_ERRORS,
        catalog.EXPORTER_INFO,
        catalog.REQUESTS,
        catalog.VLLM_KV_CACHE_USAGE,
        catalog.VLLM_NUM_PREEMPTIONS,
    }
    missing = {spec.name for spec in expected} - names
    assert not missing, f"missing on /metrics: {sorted(missing)}"


def test_cpu_engine_says_which_gpu_sources_are_unavailable(engine: EngineProcess) -> None:
    samples = scrape(engine)
    for source in ("torch_allocator", "nvml", "cudagraph"):
        assert sample(samples, catalog.SOURCE_AVAILABLE.name, source=source) == 0.0
    assert sample(samples, catalog.SOURCE_AVAILABLE.name, source="kv_cache") == 1.0
    assert sample(samples, catalog.EXPORTER_INFO.name, device="cpu") == 1.0
    # The host memory source works everywhere: a finite risk, within the plan while settling.
    assert sample(samples, catalog.SOURCE_AVAILABLE.name, source="host_memory") == 1.0
    host_risk = [v for k, v in samples.items() if k.startswith(f"{catalog.MEMORY_RISK.name}{{")]
    assert host_risk and all(v == 0.0 for v in host_risk), host_risk
    assert sample(samples, catalog.HOST_MEMORY_USED.name) > 0


def test_a_full_kv_cache_preempts_and_leaves_the_watermark_normal(engine: EngineProcess) -> None:
    """Do no harm (#10.2): a tiny KV cache filled to preemption is vLLM queueing as designed,
    not memory pressure. Every request completes, and the memory watermark (memory beyond the
    engine's plan; on a CPU engine nothing) never leaves normal."""
    before = scrape(engine)
    peak = {"kv": 0.0, "level": 0.0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            samples = scrape(engine)
            peak["kv"] = max(peak["kv"], sample(samples, catalog.VLLM_KV_CACHE_USAGE.name) or 0.0)
            # The peak gauge holds a level for 15 s, so polling cannot miss a short one.
            peak["level"] = max(peak["level"], sample(samples, catalog.MEMORY_WATERMARK_PEAK.name))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    statuses: list[int] = []
    preemptions = 0.0
    try:
        # 8 blocks each (a 72-token prompt + 180): any two at once overflow the 9 usable. On two
        # busy cores the sender can be starved into sending one request at a time; slow steps
        # make that unlikely, and the flood is repeated (at most 3 times) until two overlap.
        for _ in range(3):
            with ThreadPoolExecutor(8) as pool:
                futures = [
                    pool.submit(
                        complete,
                        engine,
                        str(engine.spec.model),
                        LONG_PROMPT,
                        180,
                        ignore_eos=True,
                    )
                    for _ in range(12)
                ]
                statuses += [f.result().status_code for f in futures]
            preemptions = sample(scrape(engine), catalog.VLLM_NUM_PREEMPTIONS.name) - sample(
                before, catalog.VLLM_NUM_PREEMPTIONS.name
            )
            if preemptions > 0:
                break
    finally:
        stop.set()
        watcher.join()
    after = scrape(engine)
    assert set(statuses) == {200}
    assert preemptions > 0  # the cache really overflowed
    assert peak["level"] == 0, peak
    transitions_up = sum(
        (sample(after, catalog.WATERMARK_TRANSITIONS.name, to=level) or 0.0)
        - (sample(before, catalog.WATERMARK_TRANSITIONS.name, to=level) or 0.0)
        for level in catalog.WATERMARK_LEVELS[1:]
    )
    assert transitions_up == 0
    assert sample(after, catalog.MEMORY_WATERMARK.name) == 0.0


@pytest.mark.parametrize("kind", catalog.NONFINITE_KINDS)
def test_injected_nonfinite_logits_count_exactly_that_request(
    engine: EngineProcess, kind: str
) -> None:
    before = scrape(engine)
    model = str(engine.spec.model)
    with ThreadPoolExecutor(4) as pool:
        clean = [pool.submit(complete, engine, model, "cache block", 24) for _ in range(3)]
        poisoned = pool.submit(
            complete, engine, model, "cache block", 24, vllm_xargs={"warden_inject": kind}
        )
        assert all(f.result().status_code == 200 for f in clean)
        poisoned.result()
    counted: dict[str, float] = {}

    def any_counted() -> bool:
        nonlocal counted
        after = scrape(engine)
        counted = {
            k: sample(after, catalog.NONFINITE_LOGITS.name, kind=k)
            - sample(before, catalog.NONFINITE_LOGITS.name, kind=k)
            for k in catalog.NONFINITE_KINDS
        }
        return sum(counted.values()) >= 1

    with contextlib.suppress(TimeoutError):
        wait_until(any_counted, 10, 0.2, "a non-finite logits count")
    assert counted == {k: (1.0 if k == kind else 0.0) for k in catalog.NONFINITE_KINDS}


def test_failing_collector_is_counted_while_requests_succeed(engine: EngineProcess) -> None:
    first = sample(scrape(engine), catalog.COLLECTOR_ERRORS.name, collector="test_failing")
    time.sleep(2.5)
    response = complete(engine, str(engine.spec.model), "engine request", max_tokens=8)
    assert response.status_code == 200
    assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")
    later = sample(scrape(engine), catalog.COLLECTOR_ERRORS.name, collector="test_failing")
    assert later >= first + 2
    # The other collector on the same thread keeps running: the stall check reports "not stalled".
    assert sample(scrape(engine), catalog.ENGINE_STALLED.name) == 0.0


def test_warden_state_reports_the_watermark(engine: EngineProcess) -> None:
    state = httpx.get(f"{engine.base_url}/warden/state", timeout=10).json()
    # A CPU engine has no device memory: its one memory risk signal is host memory, within
    # the plan here, so the watermark stays normal (the KV cache is a saturation signal,
    # reported under "engine", not a memory one).
    assert state["watermark"] == "normal"
    assert set(state["signals"]) == {"host"} and state["signals"]["host"] < 0.05, state
    assert 0.0 <= state["engine"]["kv_cache_usage"] <= 1.0


def test_vllms_own_metrics_stay_in_the_api_servers_memory_and_reach_metrics_once(
    engine: EngineProcess,
) -> None:
    """exporter.api_metrics: vLLM's metrics are written in the API server's memory, not the
    multiprocess folder, and /metrics (served by warden's middleware) has them, counting,
    beside warden's metrics from every engine process, each family once, in the text format
    vLLM's own route serves."""
    name = catalog.VLLM_GENERATION_TOKENS.name
    before = sum(v for k, v in scrape(engine).items() if k.partition("{")[0] == name)
    complete(engine, str(engine.spec.model), "hello", max_tokens=5).raise_for_status()
    after_text = httpx.get(engine.metrics_url, timeout=10)
    samples = parse_samples(after_text.text)
    after = sum(v for k, v in samples.items() if k.partition("{")[0] == name)
    assert after - before >= 5
    types = [line for line in after_text.text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a family twice on /metrics"
    assert sample(samples, catalog.ENGINE_LAST_STEP.name) is not None  # API server, folder
    assert sample(samples, catalog.SOURCE_AVAILABLE.name, source="host_memory") == 1.0
    assert engine.spec.run_dir is not None
    folder = engine.spec.run_dir / "prometheus-multiproc"
    written: set[str] = set()
    for path in folder.glob("*.db"):
        written |= {json.loads(row[0])[0] for row in MmapedDict(str(path), True).read_all_values()}
    assert not {n for n in written if n.startswith("vllm:")}, "vLLM's metrics in the folder"
    assert catalog.ENGINE_LAST_STEP.name in written  # warden's stay there
    head = httpx.head(engine.metrics_url, timeout=10)
    assert head.status_code == 200 and head.content == b""
    # What vLLM's own route answers: the text format, whatever Prometheus asks for first.
    scrape_like_prometheus = httpx.get(
        engine.metrics_url,
        headers={"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"},
        timeout=10,
    )
    assert scrape_like_prometheus.headers["content-type"] == CONTENT_TYPE_LATEST
    assert name in scrape_like_prometheus.text
