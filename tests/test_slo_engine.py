"""Admission with a latency SLO set, on a real vLLM engine (issue #28).

The forecast's pieces are unit-tested (tests/test_saturation_prediction.py); this module runs
the path they make together in the API server: vLLM's per-step statistics -> the live queue ->
``assess`` -> the body stage -> ``Controller.serving``. The first engine: the tiny model, a batch
of 4 and steps slowed to at least ``STEP_DELAY_S`` (a test switch), so a request lasts at least
``TOKENS`` steps however fast the machine is, and a burst queues several batches deep. Its SLO
is generous: nothing there may be refused, whatever the machine's speed. A second engine, the
same but for an SLO under those steps' floor, admits a long request at a free slot and refuses
it in a burst. No fakes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from exporter import catalog
from exporter.saturation import (
    PACE_MARGIN_MAX,
    PACE_MIN_CHANGES,
    PACE_SETTLED_CHANGES,
    deep_slots_from,
)
from tests.support.engine import complete, running_engine, sample, scrape
from warden.control.offered_load import OFFERED_WINDOW_S, sure_count
from warden.control.saturation import DEEP_FACTOR_MAX, DEEP_FACTOR_MIN, DEEP_RECENT_SHOWN

pytestmark = pytest.mark.engine

BATCH = 4  # --max-num-seqs
SLO_S = 600.0  # far above anything this engine's queue can reach (its forecast included)
STEP_DELAY_S = 0.02
TOKENS = 48  # each request's output (ignore_eos): at least 0.96 s of steps
WARM_UP = 4  # sequential requests first: the forecast needs a drain rate and service times
BURST = 4 * BATCH  # sent together: three batches queue behind the running one


def _engine_with_slo(
    tiny_model: Path, factory: pytest.TempPathFactory, name: str, slo_s: float
) -> Iterator[Any]:
    run_dir = factory.mktemp(name)
    config = run_dir / "warden.yaml"
    config.write_text(f"admission:\n  saturation:\n    latency_slo_s: {slo_s}\n")
    env = {"WARDEN_CONFIG": str(config), "WARDEN_TEST_STEP_DELAY_S": str(STEP_DELAY_S)}
    args = ("--max-num-seqs", str(BATCH))
    with running_engine(tiny_model, extra_args=args, env=env, run_dir=run_dir) as eng:
        yield eng


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from _engine_with_slo(tiny_model, tmp_path_factory, "slo-engine", SLO_S)


def saturation(engine: Any) -> dict[str, Any]:
    return dict(httpx.get(f"{engine.base_url}/warden/state", timeout=10).json()["saturation"])


def admitted_within(engine: Any) -> float:
    return sample(scrape(engine), catalog.ADMITTED_SLO.name, outcome="within")


def test_a_burst_deep_in_a_full_batch_is_admitted_and_teaches_the_deep_slot_calibration(
    engine: Any,
) -> None:
    """A burst four batches deep, well within the SLO, is admitted whole (no refusal the
    engine's state does not justify), and each request admitted behind half a full batch or
    more (a deep slot, ``deep_slots_from``) teaches ``DeepSlotCalibration`` its real latency
    when it is answered: ``/warden/state`` counts them under ``saturation.deep_slots``, and
    the factor that scales those slots' forecasts stays within its bounds. Every admitted
    request is counted against the SLO (``warden_admitted_slo_total``)."""
    served = str(engine.spec.model)
    before = saturation(engine)
    assert before["limits"]["latency_slo_s"] == SLO_S
    assert before["deep_slots"] == {"factor": 1.0, "samples": 0, "recent": []}
    within_before = admitted_within(engine)
    for index in range(WARM_UP):
        response = complete(engine, served, f"warm-up {index}", TOKENS, ignore_eos=True)
        assert response.status_code == 200, response.text
    measured = saturation(engine)["measured"]
    assert measured["drain_rate_per_s"] and measured["service_s"], measured

    with StateReader(engine) as during:
        burst = sent_at_once(engine, served, BURST)
    refused = [r for r in burst if r.status_code != 200]
    assert not refused, [(r.status_code, r.text[:300]) for r in refused]
    assert all(r.json()["usage"]["completion_tokens"] == TOKENS for r in burst)

    after = saturation(engine)
    deep = after["deep_slots"]
    print(f"\ndeep slots after a burst of {BURST} into a batch of {BATCH}: {deep}")
    # Only requests that queued are in it: the first BATCH took free slots. Those that found
    # deep_slots_from(BATCH) or more queued ahead: BURST - BATCH - deep_slots_from(BATCH) when
    # the whole burst is in before anything ends, as here (10); fewer if some ended first.
    assert 1 <= deep["samples"] <= BURST - BATCH, (deep, after)
    assert DEEP_FACTOR_MIN <= deep["factor"] <= DEEP_FACTOR_MAX, deep
    # The engine's pace at a full batch, as the deep slots are scaled by it, shown as admission
    # sees it (with the batch's limit). The burst holds the batch full for 4-8 s, as fast as
    # the machine is: two window changes or not, and a margin only on two or more.
    measured = after["measured"]
    assert measured["capacity"] == BATCH, measured
    if measured["pace_changes"] < PACE_MIN_CHANGES:
        assert measured["pace_margin"] == 1.0, measured
    else:
        assert 1.0 <= measured["pace_margin"] <= PACE_MARGIN_MAX, measured
    # Each deep admission is shown with what it was judged on and what it took: its forecast
    # scaled by the larger of the calibration's factor and the pace margin, within the SLO.
    recent = deep["recent"]
    # (Each sample is forgotten a while after it ended; the list of recent ones is not.)
    assert min(deep["samples"], DEEP_RECENT_SHOWN) <= len(recent) <= DEEP_RECENT_SHOWN, deep
    for admitted in recent:
        assert admitted["slot"] >= deep_slots_from(BATCH), admitted
        scale = max(admitted["deep_factor"], admitted["pace_margin"])
        assert admitted["allowed_s"] == pytest.approx(admitted["forecast_s"] * scale, abs=2e-3)
        assert admitted["allowed_s"] <= SLO_S and admitted["latency_s"] > 0, admitted
    assert admitted_within(engine) - within_before == WARM_UP + BURST

    # Offered load, as admission counts it: the burst, 16 at once where a full batch drains
    # about 4 a second, is an overload while it is within the last seconds (every read in
    # them shows it), and under it, with the last minute holding fewer than
    # ``PACE_SETTLED_CHANGES`` window changes, the last ten minutes' margin is the floor.
    # Sent at once, the burst reaches admission as fast as the API server takes it in: within
    # the window, not always within its short second (1.8 s on a host five times slower than
    # usual, with the suite's other engines beside it: 6.5 a second read, the short second
    # never holding it all), so the largest rate read is at least what the window reads of it
    # whole, less its chance (``OfferedLoad.rate``).
    offered = max(reading["offered_per_s"] or 0.0 for reading in during.readings)
    assert offered >= sure_count(BURST) / OFFERED_WINDOW_S, during.readings
    overloaded = [reading for reading in during.readings if reading["overloaded"]]
    assert overloaded, during.readings
    for reading in overloaded:
        assert reading["pace_changes"] < PACE_SETTLED_CHANGES, reading
        remembered = reading["pace_margin_remembered"]
        assert remembered is not None and 1.0 <= remembered <= PACE_MARGIN_MAX, reading
        assert reading["pace_margin"] >= remembered, reading
    # The burst ended seconds ago: nothing offered since, no overload, no floor.
    assert measured["offered_per_s"] == 0.0 and measured["overloaded"] is False, measured
    assert measured["pace_margin_remembered"] is None, measured
    # The full batch's seconds, each at the pace of steps slowed to at least STEP_DELAY_S.
    paces = measured["full_pace_ms"]
    assert paces, measured
    assert all(pace >= STEP_DELAY_S * 1000 for pace in paces.values()), paces
    assert all(abs(int(second) - time.time()) <= 60 for second in paces), paces


def sent_at_once(engine: Any, served: str, count: int) -> list[httpx.Response]:
    """``count`` completions of ``TOKENS`` sent together: each thread opens its connection
    first, then all send at a barrier. With a connection opened per request, on a machine
    busy with other tests the burst reached admission over more than the offered rate's
    window (5.4 a second read where 16 were sent at once), and it was no burst."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    opened, ready = threading.Barrier(count), threading.Barrier(count)
    with httpx.Client(base_url=engine.base_url, limits=limits, timeout=120) as client:

        def send(index: int) -> httpx.Response:
            opened.wait()  # all at once, so each opens a connection of its own
            assert client.get("/health").status_code == 200
            ready.wait()
            payload = {"model": served, "prompt": f"burst {index}", "max_tokens": TOKENS}
            return client.post("/v1/completions", json={**payload, "ignore_eos": True})

        with ThreadPoolExecutor(count) as pool:
            return list(pool.map(send, range(count)))


class StateReader:
    """``/warden/state``'s ``saturation.measured``, read every ``PERIOD_S`` on a thread while
    the block runs: what admission saw while a burst was arriving."""

    PERIOD_S = 0.05

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.readings: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.readings.append(saturation(self.engine)["measured"])
            self._stop.wait(self.PERIOD_S)

    def __enter__(self) -> StateReader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_the_forecast_knows_what_recent_requests_generated_and_how_long_they_decoded(
    engine: Any,
) -> None:
    """vLLM's per-request statistics reach the meter with the tokens each request generated
    and its seconds decoding, so a request's service time is forecast for its own max_tokens
    (``SaturationState.service_times_for``): ``/warden/state`` shows the recent requests'
    median output (every one here generated ``TOKENS``) and their share of service spent
    decoding (steps of at least ``STEP_DELAY_S``: nearly all of it)."""
    served = str(engine.spec.model)
    for index in range(WARM_UP):
        response = complete(engine, served, f"output {index}", TOKENS, ignore_eos=True)
        assert response.status_code == 200, response.text
    measured = saturation(engine)["measured"]
    assert measured["recent_output_tokens"] == TOKENS, measured
    assert 0.5 < measured["recent_decode_share"] < 1.0, measured


LENGTH_SLO_S = 0.8  # under a TOKENS request's steps alone (>= 0.94 s)
BACKGROUND = 8 * TOKENS  # a request that keeps the engine busy while others are judged


@pytest.fixture(scope="module")
def tight_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The same engine with an SLO that a request of ``TOKENS`` cannot meet on any machine
    (the steps' floor sets it)."""
    yield from _engine_with_slo(tiny_model, tmp_path_factory, "slo-length-engine", LENGTH_SLO_S)


def test_over_http_a_long_request_is_admitted_at_a_free_slot_and_refused_in_a_burst(
    tight_engine: Any,
) -> None:
    """On an engine whose recent requests each took ``TOKENS`` steps (over the SLO), a request
    asking for twice that arrives to a free slot, nothing waiting, on an engine offered less
    than it drains: it is admitted and served, since refusing it shortens no one's wait, its
    own included (run 63: 9 refused at 0.5x so). The same request offered twice a batch at
    once is refused past the free slots with 503 and Retry-After, its basis in
    ``/warden/state`` naming the latency forecast and the length it was forecast for
    (``SaturationState.service_times_for``)."""
    engine = tight_engine
    served = str(engine.spec.model)
    for index in range(WARM_UP):  # sequential: an idle engine admits whatever the forecast
        response = complete(engine, served, f"recent {index}", TOKENS, ignore_eos=True)
        assert response.status_code == 200, response.text
    measured = saturation(engine)["measured"]
    assert measured["recent_output_tokens"] == TOKENS, measured
    assert measured["service_s"] > LENGTH_SLO_S, measured

    def running_at_least(count: int, busy: list[Any]) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while (found := saturation(engine)["measured"])["running"] < count:
            assert time.monotonic() < deadline, f"never {count} running: {found}"
            for request in busy:
                assert not request.done(), request.result().text
            time.sleep(0.02)
        return found

    with ThreadPoolExecutor(2 * BATCH + 1) as pool:
        busy = [pool.submit(complete, engine, served, "background", BACKGROUND, ignore_eos=True)]
        running_at_least(1, busy)
        time.sleep(OFFERED_WINDOW_S)  # the requests offered so far leave the offered rate
        measured = saturation(engine)["measured"]
        assert measured["starts_at_once"] and measured["keeps_up"], measured
        long = complete(engine, served, "long", 2 * TOKENS, ignore_eos=True)
        assert long.status_code == 200, long.text
        assert long.json()["usage"]["completion_tokens"] == 2 * TOKENS
        # The same request offered twice a batch at once: past the free slots it would queue,
        # and requests offered faster than the engine drains are judged on their forecast.
        burst = [
            pool.submit(complete, engine, served, f"burst {n}", 2 * TOKENS, ignore_eos=True)
            for n in range(2 * BATCH)
        ]
        answers = [request.result() for request in burst]
        assert busy[0].result().status_code == 200

    refused = [answer for answer in answers if answer.status_code == 503]
    served_ok = [answer for answer in answers if answer.status_code == 200]
    assert len(refused) + len(served_ok) == len(answers), [a.text for a in answers]
    assert len(refused) >= BATCH, [a.status_code for a in answers]  # at most BATCH free
    for answer in served_ok:
        assert answer.json()["usage"]["completion_tokens"] == 2 * TOKENS
    for answer in refused:
        assert answer.headers.get("retry-after"), answer.headers
        assert answer.json()["error"]["warden_signal"] == "latency_s", answer.text
    refusals = [r for r in state_of(engine)["recent_rejections"] if r["signal"] == "latency_s"]
    assert refusals, state_of(engine)
    for found in refusals:
        # Judged as the shortest request before its body is read (its wait alone over the
        # SLO), or on its own length after: the basis names which.
        basis = found["basis"]
        assert basis["output_tokens"] in (1, 2 * TOKENS), basis
        assert basis["wait_s"] + basis["service_s"] > LENGTH_SLO_S, basis


def state_of(engine: Any) -> dict[str, Any]:
    return dict(httpx.get(f"{engine.base_url}/warden/state", timeout=10).json())
