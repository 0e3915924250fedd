"""One way to wait for a condition with a deadline, instead of a hand-written loop per caller.

``wait_until`` polls ``condition`` until it returns a truthy value (returned to the caller) or
the deadline passes (``TimeoutError`` naming what was awaited). ``abort`` lets the caller stop
early when waiting has become pointless (the process being waited on exited).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitAborted(RuntimeError):
    """``abort()`` said waiting is pointless; the message names what was awaited."""


def wait_until(
    condition: Callable[[], T | None],
    timeout_s: float,
    interval_s: float = 0.2,
    what: str = "condition",
    abort: Callable[[], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Return ``condition()``'s first truthy value; raise TimeoutError after ``timeout_s``.

    The condition is always evaluated at least once, and once more at the deadline, so a
    starved caller that wakes late still sees a condition that became true meanwhile.
    """
    deadline = clock() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if abort is not None and abort():
            raise WaitAborted(f"gave up waiting for {what}")
        remaining = deadline - clock()
        if remaining <= 0:
            value = condition()
            if value:
                return value
            raise TimeoutError(f"{what}: not reached within {timeout_s:g}s")
        sleep(min(interval_s, remaining))
