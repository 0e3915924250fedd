"""Before a response leaves: was its request's logits flagged non-finite? Waits, boundedly.

The worker's logits processor flags a poisoned request on the signal board (see
``exporter.nonfinite``). On CPU the flag is written in the same step; on a GPU it is read off the
device after the step, without a sync, so the flag of a request poisoned on its *last* step can
arrive just after the response is complete. The board also says how many logits steps the
engine has checked (``applied``) and how many it has resolved on the host (``resolved``): any
step that produced this response was applied before the response ended, so once ``resolved``
reaches the ``applied`` read at that moment, no flag for it can still come.

``nonfinite_flag`` returns at once on a CPU engine (resolved == applied always) and waits at most
``WARDEN_NONFINITE_FLAG_WAIT_S`` (a few GPU step times by default) on a GPU one; every call's
wait is observed in ``warden_nonfinite_flag_wait_seconds``.
"""

from __future__ import annotations

import asyncio
import functools
import time

from prometheus_client import Histogram

from exporter.settings import load_settings
from exporter.signals import SignalBoard

POLL_S = 0.001


@functools.cache
def configured_wait_s() -> float:
    """``WARDEN_NONFINITE_FLAG_WAIT_S``, read once per process."""
    return load_settings().nonfinite_flag_wait_s


def settled(board: SignalBoard, applied: list[int]) -> bool:
    """Every engine slot has resolved at least the steps it had applied in ``applied``."""
    progress = board.progress()
    return all(resolved >= target for (_, resolved), target in zip(progress, applied, strict=True))


async def nonfinite_flag(
    board: SignalBoard | None, rid: str, max_wait_s: float, waits: Histogram
) -> str | None:
    """'nan' or 'inf' when ``rid`` was flagged by the end of its last step, else None; the
    time waited is observed on ``waits`` (the ``NONFINITE_FLAG_WAIT`` histogram)."""
    if board is None:
        return None
    started = time.monotonic()
    unresolved = board.unresolved()
    if unresolved is None:
        # Settled already, as a CPU engine always is (progress read first, flags second).
        kind = board.flagged(rid)
        waits.observe(0.0)
        return kind
    applied = list(unresolved)
    deadline = started + max_wait_s
    done = False
    while True:
        # Progress first, flags second: a flag is written before its step counts as resolved.
        kind = board.flagged(rid)
        if kind is not None or done or time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_S)
        done = settled(board, applied)
    waits.observe(time.monotonic() - started)
    return kind
