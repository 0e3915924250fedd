"""A free TCP port on loopback, for servers started by tests and benchmarks.

Why not the kernel's choice (``bind(("", 0))``): that port comes from the ephemeral range,
the same range the kernel draws every outgoing connection's source port from. Between the
moment a port is found free and the moment a server binds it, any client on the machine (a
load generator, Prometheus scraping, vLLM's own ``get_open_port``) can take it, and the
server dies with "Address already in use". Ports below the ephemeral range are never handed
out that way, so they are chosen from there instead. Each pytest-xdist worker scans a slice
of its own, so two test workers never race for the same port either.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
FIRST_PORT = 20000
"""Lowest port handed out: above the usual fixed service ports (8000, 9090, 9093, 3000)."""
SLICE_PORTS = 1000
"""Ports in each process's slice."""

_lock = threading.Lock()
_cursor: itertools.count[int] | None = None


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux's default otherwise)."""
    try:
        low, high = (int(part) for part in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def slice_index(slices: int, environ: dict[str, str] | None = None, pid: int | None = None) -> int:
    """Which slice this process scans: its xdist worker number, else its pid."""
    env = os.environ if environ is None else environ
    worker = re.fullmatch(r"gw(\d+)", env.get("PYTEST_XDIST_WORKER", ""))
    number = int(worker.group(1)) if worker else (os.getpid() if pid is None else pid)
    return number % slices


def port_slice(ephemeral_low: int, environ: dict[str, str] | None = None) -> range | None:
    """This process's ports below the ephemeral range; None when that range leaves no room."""
    slices = (ephemeral_low - FIRST_PORT) // SLICE_PORTS
    if slices < 1:
        return None
    index = slice_index(slices, environ)
    start = FIRST_PORT + index * SLICE_PORTS
    return range(start, start + SLICE_PORTS)


def _bindable(host: str, port: int) -> bool:
    """Whether a server could bind the port now (no listener, no connection lingering on it)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_choice(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to now, below the ephemeral range, never handed out twice.

    Within a process the slice is walked in order, so one port is not returned twice while
    its first server may still be starting; the walk wraps around after the whole slice.
    """
    global _cursor
    ports = port_slice(ephemeral_range()[0])
    if ports is None:
        return _kernel_choice(host)
    with _lock:
        if _cursor is None:
            _cursor = itertools.count()
        for _ in range(len(ports)):
            port = ports[next(_cursor) % len(ports)]
            if _bindable(host, port):
                return port
    return _kernel_choice(host)
