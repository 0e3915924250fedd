"""This engine's names, as the alerts about it spell them.

``WARDEN_INSTANCE`` (with ``WARDEN_NAMESPACE`` and ``WARDEN_CLUSTER``) says it outright: in
Kubernetes the manifests set them from the downward API (pod name and namespace), matching the
PodMonitor's ``instance`` relabelling. Without ``WARDEN_INSTANCE``, an alert's ``instance`` is
this engine's when it is what Prometheus calls a target by default, ``host:port``, and it leads
here: the port is the one the webhook request reached, and the host is this machine's name, a
loopback name, the address the request reached, or a name that resolves to that address
(``engine:8000`` in compose). Name lookups run off the event loop, bounded and cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Iterable
from functools import lru_cache

from fastapi import Request

from exporter.settings import WardenSettings, load_settings
from warden.control.alertmanager import AlertEvent
from warden.control.identity import INSTANCE, EngineIdentity

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
RESOLVE_TIMEOUT_S = 2.0
RESOLVE_CACHE_S = 60.0
_RESOLVE_CACHE_MAX = 256
_resolved: dict[str, tuple[float, frozenset[str]]] = {}


@lru_cache(maxsize=1)
def _settings() -> WardenSettings:
    return load_settings()


def reset() -> None:
    """Read the settings again on next use (tests change the environment)."""
    _settings.cache_clear()
    _resolved.clear()


def split_host_port(instance: str) -> tuple[str, int] | None:
    """``host:port`` / ``[v6]:port`` -> (host, port); None when it is not one."""
    host, sep, port = instance.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _addresses(host: str) -> frozenset[str]:
    """Addresses ``host`` resolves to (cached for a minute; empty when it does not)."""
    now = time.monotonic()
    cached = _resolved.get(host)
    if cached is not None and now - cached[0] < RESOLVE_CACHE_S:
        return cached[1]
    found: frozenset[str] = frozenset()
    with contextlib.suppress(OSError, TimeoutError, UnicodeError):
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, None), RESOLVE_TIMEOUT_S
        )
        found = frozenset(str(info[4][0]) for info in infos)
    if len(_resolved) >= _RESOLVE_CACHE_MAX:
        _resolved.clear()
    _resolved[host] = (now, found)
    return found


async def _names_this_engine(candidate: str, local: tuple[str, int]) -> bool:
    parsed = split_host_port(candidate)
    if parsed is None:
        return False
    host, port = parsed
    local_host, local_port = local
    if port != local_port:
        return False
    if host in LOOPBACK_NAMES or host in (socket.gethostname(), local_host):
        return True
    if _is_ip(host):
        return False
    return local_host in await _addresses(host)


async def engine_identity(request: Request, events: Iterable[AlertEvent]) -> EngineIdentity:
    """This engine's identity for judging ``events``, which arrived in ``request``."""
    settings = _settings()
    labels = {
        label: value
        for label, value in (("namespace", settings.namespace), ("cluster", settings.cluster))
        if value
    }
    if settings.instance:
        return EngineIdentity(frozenset({settings.instance}), labels)
    server = request.scope.get("server")
    if not server or server[1] is None:
        return EngineIdentity(frozenset(), labels)
    local = (str(server[0]), int(server[1]))
    names = {f"{socket.gethostname()}:{local[1]}"}
    for candidate in {e.labels.get(INSTANCE, "") for e in events} - {""}:
        if await _names_this_engine(candidate, local):
            names.add(candidate)
    return EngineIdentity(frozenset(names), labels)
