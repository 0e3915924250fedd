"""What made warden act: a signal and its value, carried by every lease and every decision.

A refusal's answer, ``/warden/state`` and the spans name the cause so that a false intervention
is visible where it happens; it travels as a field (of the lease, of the effective policy, of
the decision), never looked up afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

CAUSE_VALUE_CHARS = 256  # a lease keeps at most this much of a value (an alert's description)


@dataclass(frozen=True)
class Cause:
    """A signal and its value (``value`` may be a level or a text)."""

    signal: str
    value: float | str | None = None

    def kept(self) -> Cause:
        """The cause as a lease keeps it: the value as bounded text ("" when there is none)."""
        value = "" if self.value is None else str(self.value)[:CAUSE_VALUE_CHARS]
        return Cause(self.signal, value)


NO_CAUSE = Cause("unknown")
