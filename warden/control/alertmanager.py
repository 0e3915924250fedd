"""Alertmanager webhook payloads (version 4), checked alert by alert.

A notification whose envelope is malformed (not JSON, not an object, not version 4, no list of
alerts) raises ``PayloadError`` (answered 400, nothing applied). Within a good envelope each
alert stands alone: one that is malformed or past a bound becomes an ``AlertEvent`` with a
``problem`` (reported and counted, never applied) and the others still apply, since
Alertmanager never retries a 4xx and one bad alert must not drop the rest.

Every field is bounded (``Bounds``) so that nothing a sender writes can grow warden's state:
fingerprints, label names and values, the number of labels, annotations, and alerts per
notification. An alert without a ``warden_action`` label is not ours and is skipped; an alert
naming an action warden does not know is reported as unknown (counted, logged, ignored), so a
newer rule set cannot wedge an older engine. Times are checked against the server's clock by
the controller (``check_times``), which owns the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from exporter import catalog
from warden.common.jsonbody import BadRequest, load_json
from warden.control.actions import ACTIONS, ActionError, ActionRequest, parse_action

# Alertmanager's zero time: a firing alert's endsAt.
_ZERO_TIME_PREFIX = "0001-01-01"
INVALID = "invalid"  # the status of an alert that failed its checks


@dataclass(frozen=True)
class Bounds:
    """What one alert may carry. Alertmanager's fingerprints are 16 hex digits; Prometheus
    label names are short identifiers; the rest leaves room for any real rule set."""

    fingerprint_chars: int = 128
    labels: int = 64
    label_name_chars: int = 128
    label_value_chars: int = 1024
    annotations: int = 64
    annotation_chars: int = 16 * 1024
    alerts: int = 1000  # per notification (Alertmanager's webhook_config.max_alerts)


BOUNDS = Bounds()


class PayloadError(ValueError):
    """The notification is malformed; the message says where."""


class AlertProblem(ValueError):
    """One alert is malformed or past a bound; the message says where."""


@dataclass(frozen=True)
class AlertEvent:
    fingerprint: str
    status: str  # firing | resolved | invalid (see ``problem``)
    starts_at: float
    ends_at: float | None
    alertname: str
    request: ActionRequest | None  # None: no warden_action, or unknown action
    unknown_action: str | None
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)  # description names the value
    problem: str | None = None  # why this alert is not applied (it failed its checks)
    index: int = 0  # its place in the notification

    @classmethod
    def invalid(cls, index: int, alert: Any, problem: str) -> AlertEvent:
        """A stand-in for an alert that failed its checks, carrying a bounded preview."""
        fingerprint = alert.get("fingerprint") if isinstance(alert, dict) else None
        preview = fingerprint[: BOUNDS.fingerprint_chars] if isinstance(fingerprint, str) else ""
        return cls(preview, INVALID, 0.0, None, "", None, None, {}, problem=problem, index=index)

    def problem_json(self) -> dict[str, Any]:
        return {"index": self.index, "fingerprint": self.fingerprint, "problem": self.problem}


def _parse_time(text: str) -> float:
    """Seconds since the epoch; ValueError for anything Python cannot place on the time line
    (``timestamp()`` of a year-1 time overflows, a zone-less time is refused)."""
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            raise ValueError("no time zone")
        return moment.timestamp()
    except (OverflowError, OSError) as exc:
        raise ValueError(str(exc)) from None


def _timestamp(value: Any, where: str) -> float | None:
    if not isinstance(value, str) or not value:
        raise AlertProblem(f"{where}: expected an RFC 3339 time string")
    if value.startswith(_ZERO_TIME_PREFIX):
        return None
    text = value.replace("Z", "+00:00")
    try:
        return _parse_time(text)
    except ValueError:
        # Alertmanager writes nanoseconds; Python parses at most microseconds.
        head, dot, tail = text.partition(".")
        if dot:
            digits = tail[: len(tail) - len(tail.lstrip("0123456789"))]
            zone = tail[len(digits) :]
            try:
                return _parse_time(f"{head}.{digits[:6]}{zone}")
            except ValueError:
                pass
        raise AlertProblem(f"{where}: not an RFC 3339 time: {value[:64]!r}") from None


def _string_map(
    value: Any, where: str, most: int, name_chars: int, value_chars: int
) -> dict[str, str]:
    if not isinstance(value, dict):
        raise AlertProblem(f"{where}: expected an object of strings")
    if len(value) > most:
        raise AlertProblem(f"{where}: {len(value)} entries, at most {most}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise AlertProblem(f"{where}.{str(key)[:name_chars]}: expected a string value")
        if len(key) > name_chars:
            raise AlertProblem(f"{where}: a name of {len(key)} characters, at most {name_chars}")
        if len(item) > value_chars:
            raise AlertProblem(
                f"{where}.{key}: a value of {len(item)} characters, at most {value_chars}"
            )
    return dict(value)


def _alert(index: int, alert: Any, bounds: Bounds) -> AlertEvent:
    where = f"alerts[{index}]"
    if not isinstance(alert, dict):
        raise AlertProblem(f"{where}: expected an object")
    status = alert.get("status")
    if status not in ("firing", "resolved"):
        raise AlertProblem(f"{where}.status: expected firing or resolved, got {str(status)[:20]!r}")
    fingerprint = alert.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise AlertProblem(f"{where}.fingerprint: expected a non-empty string")
    if len(fingerprint) > bounds.fingerprint_chars:
        raise AlertProblem(
            f"{where}.fingerprint: {len(fingerprint)} characters, at most "
            f"{bounds.fingerprint_chars}"
        )
    labels = _string_map(
        alert.get("labels"),
        f"{where}.labels",
        bounds.labels,
        bounds.label_name_chars,
        bounds.label_value_chars,
    )
    annotations = _string_map(
        alert.get("annotations", {}),
        f"{where}.annotations",
        bounds.annotations,
        bounds.label_name_chars,
        bounds.annotation_chars,
    )
    starts_at = _timestamp(alert.get("startsAt"), f"{where}.startsAt")
    if starts_at is None:
        raise AlertProblem(f"{where}.startsAt: must be a real time")
    ends_at = _timestamp(alert.get("endsAt", _ZERO_TIME_PREFIX + "T00:00:00Z"), f"{where}.endsAt")
    action = labels.get(catalog.ACTION_LABEL)
    request: ActionRequest | None = None
    unknown: str | None = None
    if action is not None:
        if action not in ACTIONS:
            unknown = action
        else:
            try:
                request = parse_action(action, labels)
            except ActionError as exc:
                raise AlertProblem(f"{where}.labels: {exc}") from None
    return AlertEvent(
        fingerprint=fingerprint,
        status=status,
        starts_at=starts_at,
        ends_at=ends_at,
        alertname=labels.get("alertname", ""),
        request=request,
        unknown_action=unknown,
        labels=labels,
        annotations=annotations,
        index=index,
    )


def parse_payload(body: bytes, bounds: Bounds = BOUNDS) -> list[AlertEvent]:
    """Every alert of a notification, in order; those that fail their checks carry a
    ``problem``. ``PayloadError`` only when the envelope itself is malformed."""
    try:
        data = load_json(body)
    except BadRequest as exc:
        raise PayloadError(str(exc)) from None
    if not isinstance(data, dict):
        raise PayloadError("body: expected a JSON object")
    version = data.get("version")
    if version != "4":
        raise PayloadError(f'version: expected "4", got {str(version)[:20]!r}')
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts: expected a list")
    events = []
    for index, alert in enumerate(alerts):
        if index >= bounds.alerts:
            problem = (
                f"alerts[{index}]: past {bounds.alerts} alerts in one notification "
                "(set max_alerts in the webhook_config)"
            )
            events.append(AlertEvent.invalid(index, alert, problem))
            continue
        try:
            events.append(_alert(index, alert, bounds))
        except AlertProblem as exc:
            events.append(AlertEvent.invalid(index, alert, str(exc)))
    return events


def check_times(event: AlertEvent, now: float, skew_s: float, max_age_s: float) -> str | None:
    """Why an alert's times cannot be believed against this server's clock (None: they can).
    ``startsAt`` may be at most ``skew_s`` ahead of now and ``max_age_s`` behind it; a resolved
    alert's ``endsAt`` may not be ahead of now by more than the skew, nor before its start.
    A resolution is remembered by its ``startsAt``: one dated in the future would stale every
    real firing until then."""
    where = f"alerts[{event.index}]"
    ahead = f"ahead of this server's clock (at most {skew_s:g} s)"
    if event.starts_at > now + skew_s:
        return f"{where}.startsAt: {event.starts_at - now:.0f} s {ahead}"
    if event.starts_at < now - max_age_s:
        return f"{where}.startsAt: {now - event.starts_at:.0f} s old (at most {max_age_s:g} s)"
    if event.status == "resolved" and event.ends_at is not None:
        if event.ends_at > now + skew_s:
            return f"{where}.endsAt: {event.ends_at - now:.0f} s {ahead}"
        if event.ends_at < event.starts_at:
            return f"{where}.endsAt: before its startsAt"
    return None
