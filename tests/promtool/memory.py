"""The memory watermark alerts: levels from the peak gauge, their for, blips and spikes.

Expected labels and descriptions are spelled out by hand, so they check the rules instead of
echoing them.
"""

from __future__ import annotations

from exporter.catalog import (
    ACTION_LABEL,
    MEMORY_WATERMARK,
    MEMORY_WATERMARK_PEAK,
    PARAM_PREEMPT,
    PARAM_PRIORITY_THRESHOLD,
    PARAM_RETRY_AFTER,
)
from tests.promtool.model import (
    Check,
    Expected,
    Scenario,
    fires,
    healthy,
    pending,
    resolved,
)
from tests.promtool.series import (
    INSTANCE,
    labels,
    s,
)

# high warns and acts on nothing: a creep takes hours, and refusing before critical would
# sacrifice healthy traffic.
WATERMARK_HIGH = labels("warning")
WATERMARK_CRITICAL = labels(
    "critical",
    **{ACTION_LABEL: "shed_low_priority", PARAM_PRIORITY_THRESHOLD: "0", PARAM_PREEMPT: "1"},
)
OOM_IMMINENT = labels("critical", **{ACTION_LABEL: "reject_all", PARAM_RETRY_AFTER: "30"})
_LEVELS = "(1 high, 2 critical, 3 oom_imminent)"


def _reached(level: int) -> str:
    return (
        f"Memory on {INSTANCE} beyond the engine's plan reached watermark level {level} "
        f"{_LEVELS} within the last minute; "
    )


def high_desc(level: int) -> str:
    return _reached(level) + (
        "most of the headroom its plan left on the device is used. Nothing is refused yet; "
        "find the growth before it reaches critical."
    )


def critical_desc(level: int) -> str:
    return _reached(level) + (
        "warden refuses low-priority requests and preempts the largest running one."
    )


def oom_desc(level: int) -> str:
    return _reached(level) + (
        "warden rejects every new request with Retry-After to avoid an out-of-memory crash."
    )


MEMORY_ALERTS = (
    ("WardenMemoryWatermarkHigh", WATERMARK_HIGH),
    ("WardenMemoryWatermarkCritical", WATERMARK_CRITICAL),
    ("WardenOOMImminent", OOM_IMMINENT),
)


def duration(seconds: int) -> str:
    """Seconds as a promtool duration: 135 -> ``2m15s``."""
    minutes, rest = divmod(seconds, 60)
    text = (f"{minutes}m" if minutes else "") + (f"{rest}s" if rest else "")
    return text or "0s"


def never_fires(until: int, pending_from: int, pending_until: int) -> tuple[Check, ...]:
    """At every 15s evaluation up to ``until`` seconds, no memory alert fires: each is pending
    from ``pending_from`` to ``pending_until`` (the peak holds the condition), quiet otherwise."""
    return tuple(
        pending(duration(at), labels, alertname=name)
        if pending_from <= at <= pending_until
        else healthy(duration(at), alertname=name)
        for at in range(0, until + 1, 15)
        for name, labels in MEMORY_ALERTS
    )


# The input is the exporter's peak gauge, warden_memory_watermark_peak, scraped every 15s: the
# highest level of its last 15s, so a spike the reflex absorbs within a second shows in one or
# two scrapes. The alerts read its max over the last minute (range selectors include both ends in
# the promtool here), so a level the gauge shows at T keeps their condition true from T to T + 1m.
PEAK = s(MEMORY_WATERMARK_PEAK)
LEVEL = s(MEMORY_WATERMARK)

# 15s samples: 0 until 45s, 1 from 1m, 2 from 3m, 3 from 5m, back to 0 from 8m. The record is
# >= 1 from 1m, >= 2 from 3m, 3 from 5m, and drops to 0 at 9m.
CLIMB_TO_OOM = {PEAK: "0x3 1x7 2x7 3x11 0x8"}
# 15s samples: level 1 from 2m to 5m45s; the record is 1 from 2m to 6m45s.
HIGH_FOR_4M = {PEAK: "0x7 1x15 0x15"}
# 15s samples: 1 at 2m, 2 at 2m15s and 2m30s, 3 at 2m45s, then 0: the reflex brought it back in
# 45s. Record >= 1 from 2m, >= 2 from 2m15s, 3 from 2m45s, all until 3m45s: 105s, 90s and 60s.
BLIP = {PEAK: "0x7 1 2x1 3 0x20"}
# 15s samples: 3 at 2m and 2m15s, else 0: one spike the reflex handled within a second, held by
# the gauge for its 15s window and so seen by two scrapes. Record 3 from 2m to 3m15s (75s).
SPIKE = {PEAK: "0x7 3x1 0x20"}
# 15s samples: the reflex fights a persistent overload. The gauge shows 3 at 1m, 2m, 3m, 4m and
# 5m, 0 in between (3, 0, 0, 0 repeated), then 0 from 5m15s: a spike once a minute, the peak gauge
# is 0 three scrapes out of four, the record over the last minute is 3 from 1m to 6m.
OSCILLATING = {PEAK: " ".join(["0x3", *["3 0x2"] * 5, "0x16"])}
# 15s samples: the engine hits oom_imminent every few seconds from 1m to 5m45s and the reflex
# absorbs each spike within a second, so the current level reads 0 at every scrape while the peak
# gauge reads 3 at every one of them. Record 3 from 1m to 6m45s.
BETWEEN_SCRAPES = {LEVEL: "0x40", PEAK: "0x3 3x19 0x17"}
NORMAL = {LEVEL: "0x40", PEAK: "0x40"}

MEMORY_SCENARIOS = (
    Scenario(
        "WardenMemoryWatermarkHigh",
        "level 1 for 4 minutes",
        HIGH_FOR_4M,
        (
            healthy("1m45s"),
            pending("3m45s", WATERMARK_HIGH),
            fires("4m", Expected(WATERMARK_HIGH, high_desc(1))),
            healthy("5m", alertname="WardenMemoryWatermarkCritical"),
            # back at 0 since 6m; level 1 was reached within the last minute
            fires("6m30s", Expected(WATERMARK_HIGH, high_desc(1))),
            resolved("7m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkHigh",
        "a 45s excursion up to level 3 fires nothing",
        BLIP,
        (
            healthy("1m45s"),
            # the last evaluation before the peak drops: every level pending, none fired
            pending("3m45s", WATERMARK_HIGH),
            pending("3m45s", WATERMARK_CRITICAL, alertname="WardenMemoryWatermarkCritical"),
            pending("3m45s", OOM_IMMINENT, alertname="WardenOOMImminent"),
            healthy("4m"),
            healthy("4m", alertname="WardenMemoryWatermarkCritical"),
            healthy("4m", alertname="WardenOOMImminent"),
            healthy("7m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "a 15s spike to oom_imminent fires nothing",
        SPIKE,
        never_fires(until=300, pending_from=120, pending_until=195),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "level 0 for 10 minutes",
        NORMAL,
        tuple(
            healthy(at, alertname=name) for at in ("1m", "5m", "9m45s") for name, _ in MEMORY_ALERTS
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkHigh",
        "climb to oom_imminent and recover",
        CLIMB_TO_OOM,
        (
            pending("2m45s", WATERMARK_HIGH),
            fires("3m", Expected(WATERMARK_HIGH, high_desc(2))),
            fires("6m", Expected(WATERMARK_HIGH, high_desc(3))),
            # back at 0 since 8m
            fires("8m30s", Expected(WATERMARK_HIGH, high_desc(3))),
            resolved("9m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkCritical",
        "climb to oom_imminent and recover",
        CLIMB_TO_OOM,
        (
            healthy("2m45s"),
            pending("4m45s", WATERMARK_CRITICAL),
            fires("5m", Expected(WATERMARK_CRITICAL, critical_desc(3))),
            fires("8m30s", Expected(WATERMARK_CRITICAL, critical_desc(3))),
            resolved("9m"),
            resolved("9m45s"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "climb to oom_imminent and recover",
        CLIMB_TO_OOM,
        (
            healthy("4m45s"),
            pending("5m15s", OOM_IMMINENT),
            pending("6m15s", OOM_IMMINENT),
            fires("6m30s", Expected(OOM_IMMINENT, oom_desc(3))),
            fires("8m30s", Expected(OOM_IMMINENT, oom_desc(3))),
            resolved("9m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "the reflex knocks level 3 back to 0 every minute for 5 minutes",
        OSCILLATING,
        (
            healthy("45s"),
            pending("1m", OOM_IMMINENT),
            pending("2m15s", OOM_IMMINENT),
            fires("2m30s", Expected(OOM_IMMINENT, oom_desc(3))),
            # the peak gauge reads 0 here (it last showed a spike at 4m)
            fires("4m45s", Expected(OOM_IMMINENT, oom_desc(3))),
            fires("5m45s", Expected(OOM_IMMINENT, oom_desc(3))),
            resolved("6m15s"),
            resolved("9m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkHigh",
        "the reflex knocks level 3 back to 0 every minute for 5 minutes",
        OSCILLATING,
        (
            healthy("45s"),
            pending("2m45s", WATERMARK_HIGH),
            fires("3m", Expected(WATERMARK_HIGH, high_desc(3))),
            fires("4m45s", Expected(WATERMARK_HIGH, high_desc(3))),
            resolved("6m15s"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "level 3 every few seconds, back to 0 before every scrape",
        BETWEEN_SCRAPES,
        (
            healthy("45s"),
            pending("1m", OOM_IMMINENT),
            pending("2m15s", OOM_IMMINENT),
            fires("2m30s", Expected(OOM_IMMINENT, oom_desc(3))),
            fires("6m45s", Expected(OOM_IMMINENT, oom_desc(3))),
            resolved("7m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkCritical",
        "the reflex knocks level 3 back to 0 every minute for 5 minutes",
        OSCILLATING,
        (
            healthy("45s"),
            pending("2m45s", WATERMARK_CRITICAL),
            fires("3m", Expected(WATERMARK_CRITICAL, critical_desc(3))),
            fires("5m45s", Expected(WATERMARK_CRITICAL, critical_desc(3))),
            resolved("6m15s"),
        ),
        interval="15s",
    ),
)
