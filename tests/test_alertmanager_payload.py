"""The Alertmanager 0.25 webhook payload models: a notification as Alertmanager sends it parses
whole; an envelope field of the wrong type is a ``PayloadError`` naming the field (answered 400
before anything is applied); one alert's problem names its place and field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.alertmanager import webhook_notification
from warden.control.alertmanager import Bounds, Notification, PayloadError, parse_payload


def firing(**labels: str) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {"alertname": "WardenOOMImminent", "instance": "e:8000", **labels},
        "annotations": {"summary": "s", "description": "d"},
        "startsAt": "2026-11-21T10:00:00.123456789Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": "0123456789abcdef",
    }


def test_a_notification_as_alertmanager_sends_it_parses_whole() -> None:
    body = webhook_notification(firing(warden_action="reject_all", warden_retry_after="30"))
    envelope = Notification.model_validate(body)
    assert (envelope.version, envelope.receiver, envelope.status) == ("4", "engine", "firing")
    assert envelope.external_url == "http://alertmanager" and envelope.truncated_alerts == 0
    (event,) = parse_payload(json.dumps(body).encode())
    assert event.problem is None and event.request is not None
    assert event.ends_at is None and event.labels["instance"] == "e:8000"
    assert event.annotations == {"summary": "s", "description": "d"}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"version": 4}, "version"),
        ({"alerts": None}, "alerts"),
        ({"groupLabels": {"a": 1}}, "groupLabels.a"),
        ({"truncatedAlerts": "3"}, "truncatedAlerts"),
        ({"truncatedAlerts": -1}, "truncatedAlerts"),
        ({"status": "weird"}, "status"),
        ({"receiver": ["x"]}, "receiver"),
    ],
)
def test_a_malformed_envelope_is_refused_naming_the_field(
    change: dict[str, Any], named: str
) -> None:
    body = {**webhook_notification(firing(warden_action="reject_all")), **change}
    with pytest.raises(PayloadError) as refused:
        parse_payload(json.dumps(body).encode())
    assert str(refused.value).startswith(f"{named}:"), refused.value


def test_a_hostile_key_is_cut_short_in_the_problem() -> None:
    alert = firing()
    alert["labels"] = {"k" * 100_000: "v"}
    (event,) = parse_payload(json.dumps(webhook_notification(alert)).encode())
    assert event.problem is not None and "characters, at most 128" in event.problem
    assert len(event.problem) < 400


def test_bounds_come_from_the_caller() -> None:
    body = json.dumps(webhook_notification(firing(team="x" * 40))).encode()
    (default,) = parse_payload(body)
    (tight,) = parse_payload(body, Bounds(label_value_chars=32))
    assert default.problem is None
    assert tight.problem == "alerts[0].labels.team: a value of 40 characters, at most 32"
