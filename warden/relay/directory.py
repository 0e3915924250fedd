"""Where each engine's webhook is: Prometheus's active targets, or a URL template.

``PrometheusTargets`` reads ``/api/v1/targets?state=active`` and keeps the targets that match the
mixin's engine selector (the same matchers the rules use, so the relay addresses exactly the
engines the alerts are computed from). Each target's labels after relabelling (``instance``,
``namespace``...) are what its alerts carry; its scrape URL gives the address, to which the
webhook path is appended. The list is cached; an alert naming an engine not in it triggers one
early refresh (a pod that just started), at most once per ``min_refresh_s``.

``UrlTemplate`` is for static fleets whose ``instance`` is already ``host:port``
(``http://{instance}/warden/alertmanager``): no lookup at all.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from alerts.config import MixinConfig, parse_matchers
from warden.relay.split import Engine, matching_engines

WEBHOOK_PATH = "/warden/alertmanager"


class DirectoryError(RuntimeError):
    """The engine list cannot be read now (Prometheus down, bad answer): retry later."""


class Directory(Protocol):
    async def lookup(self, alert_labels: Mapping[str, str]) -> list[Engine]:
        """Engines the alert's identity labels match (normally one)."""
        ...

    def known(self) -> int | None:
        """How many engines it knows now (None: it does not list them)."""
        ...

    async def check(self) -> None:
        """Raise DirectoryError when engines cannot be looked up now."""
        ...


def selector_matches(labels: Mapping[str, str], matchers: Sequence[tuple[str, str, str]]) -> bool:
    """PromQL matcher semantics: a missing label is the empty string; regexes are anchored."""
    for name, op, value in matchers:
        actual = labels.get(name, "")
        if op == "=" and actual != value:
            return False
        if op == "!=" and actual == value:
            return False
        if op in ("=~", "!~"):
            hit = re.fullmatch(_unquote(value), actual) is not None
            if hit != (op == "=~"):
                return False
    return True


def _unquote(value: str) -> str:
    """The text of a double-quoted PromQL string (``\\\\.`` -> ``\\.``)."""
    return re.sub(r"\\(.)", r"\1", value)


def webhook_url(scrape_url: str, path: str = WEBHOOK_PATH) -> str:
    parts = urlsplit(scrape_url)
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass
class PrometheusTargets:
    """The engines Prometheus scrapes now, refreshed every ``refresh_s``."""

    prometheus_url: str
    config: MixinConfig
    refresh_s: float = 15.0
    min_refresh_s: float = 2.0
    path: str = WEBHOOK_PATH

    def __post_init__(self) -> None:
        self._matchers = parse_matchers(self.config.engine_selector)
        self._engines: list[Engine] = []
        self._fetched_at: float | None = None
        self._client: httpx.AsyncClient | None = None

    async def refresh(self) -> list[Engine]:
        url = f"{self.prometheus_url.rstrip('/')}/api/v1/targets"
        try:
            if self._client is None:
                self._client = httpx.AsyncClient()
            response = await self._client.get(url, params={"state": "active"}, timeout=5.0)
            response.raise_for_status()
            targets = response.json()["data"]["activeTargets"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise DirectoryError(f"cannot read the engine targets from {url}: {exc}") from None
        engines = [
            Engine(dict(target["labels"]), webhook_url(target["scrapeUrl"], self.path))
            for target in targets
            if selector_matches(target.get("labels", {}), self._matchers)
        ]
        self._engines, self._fetched_at = engines, time.monotonic()
        return engines

    def _age(self) -> float | None:
        return None if self._fetched_at is None else time.monotonic() - self._fetched_at

    async def check(self) -> None:
        age = self._age()
        if age is None or age > self.refresh_s:
            await self.refresh()

    async def lookup(self, alert_labels: Mapping[str, str]) -> list[Engine]:
        age = self._age()
        if age is None or age > self.refresh_s:
            await self.refresh()
        found = matching_engines(alert_labels, self._engines, self.config.identity_labels)
        if not found and age is not None and age > self.min_refresh_s:
            await self.refresh()  # an engine newer than the list
            found = matching_engines(alert_labels, self._engines, self.config.identity_labels)
        return found

    def known(self) -> int | None:
        return len(self._engines) if self._fetched_at is not None else None


@dataclass
class UrlTemplate:
    """``http://{instance}/warden/alertmanager``: the URL written from the alert's labels."""

    template: str

    def __post_init__(self) -> None:
        names = set(re.findall(r"\{(\w+)\}", self.template))
        if "instance" not in names:
            raise ValueError(f"URL template {self.template!r} must use {{instance}}")
        self._names = names

    async def lookup(self, alert_labels: Mapping[str, str]) -> list[Engine]:
        if any(not alert_labels.get(name) for name in self._names):
            return []
        values = {name: alert_labels[name] for name in self._names}
        return [Engine(values, self.template.format(**values))]

    def known(self) -> int | None:
        return None

    async def check(self) -> None:
        return None
