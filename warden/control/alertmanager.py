"""Alertmanager webhook payloads (version 4), validated whole before anything is applied.

A payload is parsed into ``AlertEvent``s; any structural problem raises ``PayloadError``
(answered 400, nothing applied). An alert without a ``warden_action`` label is not ours and is
skipped; an alert naming an action warden does not know is reported as unknown (counted,
logged, ignored) rather than failing the notification, so a newer rule set cannot wedge an
older engine.
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


class PayloadError(ValueError):
    """The notification is malformed; the message says where."""


@dataclass(frozen=True)
class AlertEvent:
    fingerprint: str
    status: str  # firing | resolved
    starts_at: float
    ends_at: float | None
    alertname: str
    request: ActionRequest | None  # None: no warden_action, or unknown action
    unknown_action: str | None
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)  # description names the value


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
        raise PayloadError(f"{where}: expected an RFC 3339 time string")
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
        raise PayloadError(f"{where}: not an RFC 3339 time: {value[:64]!r}") from None


def _string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PayloadError(f"{where}: expected an object of strings")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise PayloadError(f"{where}.{key}: expected a string value")
    return dict(value)


def parse_payload(body: bytes) -> list[AlertEvent]:
    try:
        data = load_json(body)
    except BadRequest as exc:
        raise PayloadError(str(exc)) from None
    if not isinstance(data, dict):
        raise PayloadError("body: expected a JSON object")
    version = data.get("version")
    if version != "4":
        raise PayloadError(f'version: expected "4", got {version!r}')
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts: expected a list")
    events = []
    for index, alert in enumerate(alerts):
        where = f"alerts[{index}]"
        if not isinstance(alert, dict):
            raise PayloadError(f"{where}: expected an object")
        status = alert.get("status")
        if status not in ("firing", "resolved"):
            raise PayloadError(f"{where}.status: expected firing or resolved, got {status!r}")
        labels = _string_map(alert.get("labels"), f"{where}.labels")
        annotations = _string_map(alert.get("annotations", {}), f"{where}.annotations")
        fingerprint = alert.get("fingerprint")
        if not isinstance(fingerprint, str) or not fingerprint:
            raise PayloadError(f"{where}.fingerprint: expected a non-empty string")
        starts_at = _timestamp(alert.get("startsAt"), f"{where}.startsAt")
        if starts_at is None:
            raise PayloadError(f"{where}.startsAt: must be a real time")
        ends_at = _timestamp(
            alert.get("endsAt", _ZERO_TIME_PREFIX + "T00:00:00Z"), f"{where}.endsAt"
        )
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
                    raise PayloadError(f"{where}.labels: {exc}") from None
        events.append(
            AlertEvent(
                fingerprint=fingerprint,
                status=status,
                starts_at=starts_at,
                ends_at=ends_at,
                alertname=labels.get("alertname", ""),
                request=request,
                unknown_action=unknown,
                labels=labels,
                annotations=annotations,
            )
        )
    return events
