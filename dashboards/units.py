"""Grafana unit ids turned into text, so rendered charts read like the Grafana panels."""

from __future__ import annotations

import math
from datetime import datetime

_SHORT = ("", " K", " Mil", " Bil", " Tri")
_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI_BYTES = ("B", "kB", "MB", "GB", "TB", "PB")
_RATES = {"cps": "c/s", "ops": "ops/s", "reqps": "req/s", "cpm": "c/min", "opm": "ops/min"}
_BOOLEANS = {
    "bool": ("False", "True"),
    "bool_yes_no": ("No", "Yes"),
    "bool_on_off": ("Off", "On"),
}
_SECONDS_PER = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _number(value: float, decimals: int | None) -> str:
    if decimals is not None:
        return f"{value:.{decimals}f}"
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def _scaled(value: float, base: float, suffixes: tuple[str, ...], decimals: int | None) -> str:
    index = 0
    while abs(value) >= base and index < len(suffixes) - 1:
        value /= base
        index += 1
    return f"{_number(value, decimals)}{suffixes[index]}"


def _duration(seconds: float, decimals: int | None) -> str:
    magnitude = abs(seconds)
    if magnitude == 0:
        return "0 s"
    for limit, divisor, suffix in (
        (1e-3, 1e-6, " µs"),
        (1.0, 1e-3, " ms"),
        (60.0, 1.0, " s"),
        (3600.0, 60.0, " min"),
        (86400.0, 3600.0, " hour"),
        (604800.0, 86400.0, " day"),
    ):
        if magnitude < limit:
            return f"{_number(seconds / divisor, decimals)}{suffix}"
    return f"{_number(seconds / 604800.0, decimals)} week"


def format_value(value: float, unit: str | None, decimals: int | None = None) -> str:
    """``value`` as Grafana would print it for ``unit`` (a subset of Grafana's unit ids)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    unit = unit or "none"
    if unit in _BOOLEANS:
        return _BOOLEANS[unit][1 if value else 0]
    if unit == "percentunit":
        return f"{_number(value * 100, decimals)}%"
    if unit == "percent":
        return f"{_number(value, decimals)}%"
    if unit == "bytes":
        return _scaled(value, 1024, tuple(f" {u}" for u in _IEC), decimals)
    if unit == "decbytes":
        return _scaled(value, 1000, tuple(f" {u}" for u in _SI_BYTES), decimals)
    if unit in _SECONDS_PER:
        return _duration(value * _SECONDS_PER[unit], decimals)
    if unit == "dateTimeAsIso":
        return datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")
    if unit in _RATES:
        return f"{_scaled(value, 1000, _SHORT, decimals)} {_RATES[unit]}"
    if unit == "short":
        return _scaled(value, 1000, _SHORT, decimals)
    return _number(value, decimals)
