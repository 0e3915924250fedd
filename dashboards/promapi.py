"""The two Prometheus HTTP API calls the renderer needs, with errors that say which query."""

from __future__ import annotations

from typing import Any

import httpx


class QueryError(RuntimeError):
    """Prometheus refused a query (bad PromQL, timeout) or could not be reached."""


class PrometheusAPI:
    """A thin client for ``/api/v1/query_range`` and ``/api/v1/query``."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PrometheusAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        try:
            response = self._http.get(path, params=params)
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise QueryError(f"{params.get('query')!r}: {exc}") from exc
        if body.get("status") != "success":
            raise QueryError(f"{params.get('query')!r}: {body.get('error', body)}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Series as ``{"metric": {labels}, "values": [[t, "v"], ...]}``."""
        data = self._get(
            "/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step}
        )
        return list(data["result"])

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant vector as ``{"metric": {labels}, "value": [t, "v"]}`` items."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])
