"""The one client for Prometheus' HTTP API, with errors that say which call failed.

The renderer, the native stack, the scenario and the tests all read Prometheus through it:
instant and range queries, series, alerts, targets and rule groups. Waiting for a condition is
the caller's business (dashboards import nothing from warden; the callers use
``warden.common.waiting``).
"""

from __future__ import annotations

from typing import Any

import httpx

Sample = dict[str, Any]  # one query result item: {"metric": {...}, "value"|"values": ...}


class QueryError(RuntimeError):
    """Prometheus refused a call (bad PromQL, timeout) or could not be reached."""


class PrometheusAPI:
    """A thin client for ``/api/v1/*``; one connection pool until ``close()``."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PrometheusAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; ``QueryError`` on any failure."""
        what = params.get("query") or params.get("match[]") or f"/api/v1/{path}"
        try:
            response = self._http.get(f"/api/v1/{path}", params=params)
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise QueryError(f"{what!r}: {exc}") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error", body) if isinstance(body, dict) else body
            raise QueryError(f"{what!r}: {error}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """Instant query: vector items ``{"metric": {labels}, "value": [t, "v"]}`` (a scalar or
        string result as one item without labels)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(
        self, expr: str, start: float, end: float, step: float | str = 1.0
    ) -> list[Sample]:
        """Series as ``{"metric": {labels}, "values": [[t, "v"], ...]}``."""
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        return list(data["result"])

    def series(self, match: str) -> list[dict[str, str]]:
        """Label sets of the series matching a selector."""
        return list(self.api("series", **{"match[]": match}))

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts Prometheus holds now, pending or firing, with their labels and state."""
        return list(self.api("alerts")["alerts"])

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets, with their health and last error."""
        return list(self.api("targets")["activeTargets"])

    def rule_groups(self) -> list[dict[str, Any]]:
        """The loaded recording and alerting rule groups."""
        return list(self.api("rules")["groups"])
