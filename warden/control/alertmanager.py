"""Alertmanager webhook payloads (version 4), validated alert by alert with pydantic models.

``Notification`` is the envelope of Alertmanager 0.25's webhook payload and ``Alert`` one of its
alerts. A notification whose envelope is malformed (not JSON, not an object, not version 4, no
list of alerts, a field of the wrong type) raises ``PayloadError`` (answered 400, nothing
applied). Within a good envelope each
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
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from exporter import catalog
from warden.common.jsonbody import BadRequest, load_json
from warden.control.actions import ACTIONS, ActionError, ActionRequest, parse_action

# Alertmanager's zero time: a firing alert's endsAt.
_ZERO_TIME_PREFIX = "0001-01-01"
INVALID = "invalid"  # the status of an alert that failed its checks
_PATH_PART_CHARS = 128  # a key named in a problem is cut to this


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


def _timestamp(value: Any) -> float | None:
    """An RFC 3339 time as seconds since the epoch; None for Alertmanager's zero time."""
    if not isinstance(value, str) or not value:
        raise _problem("expected an RFC 3339 time string")
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
        raise _problem(f"not an RFC 3339 time: {value[:64]!r}") from None


def _problem(message: str) -> PydanticCustomError:
    """A validation error whose message is ours, word for word (no "Value error, " prefix)."""
    return PydanticCustomError("warden_alert", message)


def _bounds(info: ValidationInfo) -> Bounds:
    context = info.context or {}
    bounds = context.get("bounds", BOUNDS)
    return bounds if isinstance(bounds, Bounds) else BOUNDS


def _bounded_map(value: Any, most: int) -> Any:
    """Count a map's entries before its entries are validated one by one."""
    if isinstance(value, dict) and len(value) > most:
        raise _problem(f"{len(value)} entries, at most {most}")
    return value


def _label_name(name: str, info: ValidationInfo) -> str:
    most = _bounds(info).label_name_chars
    if len(name) > most:
        raise _problem(f"a name of {len(name)} characters, at most {most}")
    return name


def _label_value(value: str, info: ValidationInfo) -> str:
    most = _bounds(info).label_value_chars
    if len(value) > most:
        raise _problem(f"a value of {len(value)} characters, at most {most}")
    return value


def _annotation_value(value: str, info: ValidationInfo) -> str:
    most = _bounds(info).annotation_chars
    if len(value) > most:
        raise _problem(f"a value of {len(value)} characters, at most {most}")
    return value


LabelName = Annotated[str, AfterValidator(_label_name)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
AnnotationValue = Annotated[str, AfterValidator(_annotation_value)]


class Alert(BaseModel):
    """One alert of an Alertmanager 0.25 webhook notification, every field bounded."""

    model_config = ConfigDict(strict=True, frozen=True, populate_by_name=True)

    status: Literal["firing", "resolved"]
    fingerprint: str = Field(min_length=1)
    labels: dict[LabelName, LabelValue]
    annotations: dict[LabelName, AnnotationValue] = Field(default_factory=dict)
    starts_at: float = Field(alias="startsAt")
    # A firing alert carries Alertmanager's zero time: None.
    ends_at: float | None = Field(None, alias="endsAt")
    generator_url: str = Field("", alias="generatorURL")

    @field_validator("fingerprint")
    @classmethod
    def _fingerprint_bounded(cls, value: str, info: ValidationInfo) -> str:
        most = _bounds(info).fingerprint_chars
        if len(value) > most:
            raise _problem(f"{len(value)} characters, at most {most}")
        return value

    @field_validator("labels", mode="before")
    @classmethod
    def _few_labels(cls, value: Any, info: ValidationInfo) -> Any:
        return _bounded_map(value, _bounds(info).labels)

    @field_validator("annotations", mode="before")
    @classmethod
    def _few_annotations(cls, value: Any, info: ValidationInfo) -> Any:
        return _bounded_map(value, _bounds(info).annotations)

    @field_validator("starts_at", mode="before")
    @classmethod
    def _real_start(cls, value: Any) -> float:
        moment = _timestamp(value)
        if moment is None:
            raise _problem("must be a real time")
        return moment

    @field_validator("ends_at", mode="before")
    @classmethod
    def _end(cls, value: Any) -> float | None:
        return _timestamp(value)


class Notification(BaseModel):
    """The envelope of an Alertmanager 0.25 webhook notification (payload version "4").

    ``alerts`` stays raw here: each alert is validated on its own (``Alert``), so one bad alert
    does not drop the others."""

    model_config = ConfigDict(strict=True, frozen=True, populate_by_name=True)

    version: Literal["4"]
    alerts: list[Any]
    receiver: str = ""
    status: Literal["firing", "resolved"] | None = None
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field("", alias="externalURL")
    group_key: str = Field("", alias="groupKey")
    truncated_alerts: int = Field(0, ge=0, alias="truncatedAlerts")


def _first_error(exc: ValidationError, where: str) -> str:
    """``where.field.key: what is wrong``, for the first problem pydantic found; every part of
    the path is cut short, so a hostile key cannot make the message large."""
    error = exc.errors(include_url=False)[0]
    path = ".".join([where] * bool(where) + [str(p)[:_PATH_PART_CHARS] for p in error["loc"]])
    return f"{path}: {error['msg']}" if path else str(error["msg"])


def _alert(index: int, alert: Any, bounds: Bounds) -> AlertEvent:
    where = f"alerts[{index}]"
    if not isinstance(alert, dict):
        raise AlertProblem(f"{where}: expected an object")
    try:
        valid = Alert.model_validate(alert, context={"bounds": bounds})
    except ValidationError as exc:
        raise AlertProblem(_first_error(exc, where)) from None
    labels = valid.labels
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
        fingerprint=valid.fingerprint,
        status=valid.status,
        starts_at=valid.starts_at,
        ends_at=valid.ends_at,
        alertname=labels.get("alertname", ""),
        request=request,
        unknown_action=unknown,
        labels=dict(labels),
        annotations=dict(valid.annotations),
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
    try:
        notification = Notification.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(_first_error(exc, "")) from None
    events = []
    for index, alert in enumerate(notification.alerts):
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
