"""This engine's names, as the alerts about it spell them.

``WARDEN_INSTANCE`` (with ``WARDEN_NAMESPACE`` and ``WARDEN_CLUSTER``) says it outright: in
Kubernetes the manifests set them from the downward API (pod name and namespace), matching the
PodMonitor's ``instance`` relabelling. Without ``WARDEN_INSTANCE``, an alert's ``instance`` is
this engine's when it is what Prometheus calls a target by default, ``host:port``, and it leads
here: the port is the one the webhook request reached, and the host is this machine's name, a
loopback name, the address the request reached, or a name that resolves to that address
(``engine:8000`` in compose).

Name lookups never stall a notification: the names known without one are decided first (the
webhook applies this engine's own alerts with them at once), then the remaining hosts are looked
up concurrently, at most ``MAX_LOOKUPS`` per notification, all within ``RESOLVE_DEADLINE_S`` in
total, off the event loop and cached for a minute (found or not). A host not resolved in time
is not this engine's name for this notification; its lookup still finishes into the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from fastapi import Request

from exporter.settings import WardenSettings, load_settings
from warden.control.alertmanager import AlertEvent
from warden.control.identity import INSTANCE, EngineIdentity

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
RESOLVE_TIMEOUT_S = 2.0  # one lookup
RESOLVE_DEADLINE_S = 2.0  # every lookup of one notification together
RESOLVE_CACHE_S = 60.0
MAX_LOOKUPS = 64  # distinct hosts looked up per notification
_RESOLVE_CACHE_MAX = 1024
_resolved: dict[str, tuple[float, frozenset[str]]] = {}
_in_flight: dict[str, asyncio.Task[frozenset[str]]] = {}


@lru_cache(maxsize=1)
def _settings() -> WardenSettings:
    return load_settings()


def reset() -> None:
    """Read the settings again on next use (tests change the environment)."""
    _settings.cache_clear()
    _resolved.clear()
    _in_flight.clear()


def split_host_port(instance: str) -> tuple[str, int] | None:
    """``host:port`` / ``[v6]:port`` -> (host, port); None when it is not one."""
    host, sep, port = instance.rpartition(":")
    if not sep or not host or not port.isdigit() or len(port) > 5:
        return None
    return host.strip("[]"), int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _cached(host: str) -> frozenset[str] | None:
    cached = _resolved.get(host)
    if cached is not None and time.monotonic() - cached[0] < RESOLVE_CACHE_S:
        return cached[1]
    return None


async def system_addresses(host: str) -> frozenset[str]:
    """The system resolver's addresses for ``host`` (off the event loop)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None)
    return frozenset(str(info[4][0]) for info in infos)


async def _lookup(host: str) -> frozenset[str]:
    found: frozenset[str] = frozenset()
    with contextlib.suppress(OSError, TimeoutError, UnicodeError, ValueError):
        found = await asyncio.wait_for(system_addresses(host), RESOLVE_TIMEOUT_S)
    if len(_resolved) >= _RESOLVE_CACHE_MAX:
        _resolved.clear()
    _resolved[host] = (time.monotonic(), found)
    return found


def _start_lookup(host: str) -> asyncio.Task[frozenset[str]]:
    """One lookup per host at a time, however many notifications ask."""
    task = _in_flight.get(host)
    if task is None:
        task = asyncio.get_running_loop().create_task(_lookup(host))
        _in_flight[host] = task
        task.add_done_callback(lambda _t: _in_flight.pop(host, None))
    return task


async def _addresses(host: str) -> frozenset[str]:
    """Addresses ``host`` resolves to (cached for a minute; empty when it does not)."""
    cached = _cached(host)
    if cached is not None:
        return cached
    return await asyncio.shield(_start_lookup(host))


@dataclass(frozen=True)
class FirstLook:
    """This engine's names known without a lookup, and the candidates that need one."""

    identity: EngineIdentity
    local_host: str = ""
    pending: dict[str, str] | None = None  # candidate instance -> host to look up


def first_look(request: Request, events: Iterable[AlertEvent]) -> FirstLook:
    """The names decided at once: ``WARDEN_INSTANCE``, this machine's name, loopback names and
    the address the request reached, on the port it reached; cached lookups too."""
    settings = _settings()
    labels = {
        label: value
        for label, value in (("namespace", settings.namespace), ("cluster", settings.cluster))
        if value
    }
    if settings.instance:
        return FirstLook(EngineIdentity(frozenset({settings.instance}), labels))
    server = request.scope.get("server")
    if not server or server[1] is None:
        return FirstLook(EngineIdentity(frozenset(), labels))
    local_host, local_port = str(server[0]), int(server[1])
    hostname = socket.gethostname()
    names = {f"{hostname}:{local_port}"}
    pending: dict[str, str] = {}
    for candidate in {e.labels.get(INSTANCE, "") for e in events} - {""}:
        parsed = split_host_port(candidate)
        if parsed is None or parsed[1] != local_port:
            continue
        host = parsed[0]
        if host in LOOPBACK_NAMES or host in (hostname, local_host):
            names.add(candidate)
        elif not _is_ip(host):
            cached = _cached(host)
            if cached is None:
                pending[candidate] = host
            elif local_host in cached:
                names.add(candidate)
    return FirstLook(EngineIdentity(frozenset(names), labels), local_host, pending)


async def resolve(look: FirstLook, deadline_s: float = RESOLVE_DEADLINE_S) -> EngineIdentity:
    """``look``'s identity with its pending names looked up: concurrently, at most
    ``MAX_LOOKUPS`` hosts, within ``deadline_s`` in total."""
    if not look.pending:
        return look.identity
    hosts = sorted(set(look.pending.values()))[:MAX_LOOKUPS]
    tasks = {host: asyncio.ensure_future(_addresses(host)) for host in hosts}
    await asyncio.wait(tasks.values(), timeout=deadline_s)
    found = {
        host: task.result()
        for host, task in tasks.items()
        if task.done() and not task.cancelled() and task.exception() is None
    }
    for task in tasks.values():
        if not task.done():
            task.cancel()  # the shielded lookup itself goes on, into the cache
    names = {
        candidate
        for candidate, host in look.pending.items()
        if look.local_host in found.get(host, frozenset())
    }
    identity = look.identity
    return EngineIdentity(identity.instances | names, identity.labels)


async def engine_identity(request: Request, events: Iterable[AlertEvent]) -> EngineIdentity:
    """This engine's identity for judging ``events``, which arrived in ``request``."""
    events = list(events)
    return await resolve(first_look(request, events))
