"""Prometheus durations (``90s``, ``2m``, ``1h30m``): parsing, validation and words.

Shared by the rule model (a rule's ``for``) and the alerts config (every hold a deployment may
override), so both accept and refuse the same spellings.
"""

from __future__ import annotations

import re

DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}


def duration_s(duration: str) -> float:
    """Seconds in a Prometheus duration (``1m``, ``1h30m``)."""
    return sum(int(n) * _UNIT_S[unit] for n, unit in _PART.findall(duration))


def positive_duration(value: str) -> str:
    """``value`` if it is a Prometheus duration longer than zero; ValueError naming it if not."""
    if not DURATION.match(value):
        raise ValueError(f"{value!r} is not a Prometheus duration (such as 90s, 2m or 1h30m)")
    if duration_s(value) <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return value


def spoken(duration: str) -> str:
    """``1m`` -> ``minute``, ``30m`` -> ``30 minutes``; a compound one (``1h30m``) as written."""
    parts = _PART.findall(duration)
    if len(parts) != 1 or parts[0][1] not in _WORDS:
        return duration
    count, unit = int(parts[0][0]), _WORDS[parts[0][1]]
    return unit if count == 1 else f"{count} {unit}s"
