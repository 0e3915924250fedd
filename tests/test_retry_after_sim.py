"""Retry-After under closed-loop overload, on warden's real admission and a simulated engine
(benchmarks/retry_after.py): clients that honour the computed Retry-After are refused again
far less often than with the constant one, and no client behaviour breaks the latency SLO
promised to the requests admitted."""

from __future__ import annotations

import pytest

from benchmarks.retry_after import Outcome, Scenario, simulate

SHORT = Scenario(duration=40.0, warmup=10.0)


def both(scenario: Scenario, cap_s: float) -> tuple[Outcome, Outcome]:
    return simulate("computed", scenario, cap_s), simulate("constant", scenario, cap_s)


@pytest.mark.parametrize(
    ("clients", "cap_s", "retry_after_max"),
    [
        (24, 60.0, None),  # the OpenAI SDK honours Retry-After up to 60 s
        (48, 60.0, None),  # 6x overload
        (24, 2.0, 2.0),  # clients that wait 2 s at most, and the bound set to match
    ],
)
def test_honouring_the_computed_retry_after_is_refused_again_less_than_a_constant(
    clients: int, cap_s: float, retry_after_max: float | None
) -> None:
    scenario = Scenario(
        clients=clients, retry_after_max=retry_after_max, duration=40.0, warmup=10.0
    )
    computed, constant = both(scenario, cap_s)
    assert computed.repeated_refusals < 0.75 * constant.repeated_refusals, (computed, constant)
    assert computed.retries_admitted >= 0.75 * computed.retries, computed
    # Holding places costs no throughput and no SLO.
    assert computed.completed >= 0.98 * constant.completed, (computed, constant)
    assert computed.within_slo == computed.completed


def test_clients_that_do_not_wait_cannot_break_the_slo() -> None:
    # They come back after 0.5 s whatever they are told: the places booked for them are
    # due when nobody claims them, and a request taking one still needs the SLO forecast.
    computed, constant = both(SHORT, 0.5)
    assert computed.within_slo == computed.completed > 0
    assert computed.completed >= 0.98 * constant.completed, (computed, constant)
