"""A real HAProxy (Debian's) in front of a fleet of engines, for fleet tests.

Round robin over the engines, health-checked on warden's readiness endpoint; a request an engine
refuses with 503 (warden's admission) is retried once on another engine (``retry-on 503`` with
``option redispatch``; ``option http-buffer-request`` so the whole request, body included, is
in HAProxy's buffer before it is sent, which a layer-7 retry needs: without it the 503 came
back to the client), which is how a load balancer keeps a fleet serving while one engine
degrades. Every answer names the engine that gave it in ``X-Served-By``.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from warden.common.ports import free_port
from warden.common.processes import ChildProcess

HAPROXY_BINARY = "haproxy"
SERVED_BY = "X-Served-By"
HEALTH_PATH = "/haproxy-health"


def haproxy_available() -> bool:
    return shutil.which(HAPROXY_BINARY) is not None


def haproxy_config(port: int, servers: Mapping[str, str]) -> str:
    """``servers``: engine name -> ``host:port``."""
    lines = [
        "global",
        "  maxconn 512",
        "defaults",
        "  mode http",
        "  timeout connect 2s",
        "  timeout client 300s",
        "  timeout server 300s",
        "  timeout check 3s",
        "  retries 2",
        "  option redispatch 1",
        "  retry-on 503 conn-failure empty-response",
        "frontend fleet",
        f"  bind 127.0.0.1:{port}",
        f"  monitor-uri {HEALTH_PATH}",
        "  default_backend engines",
        "backend engines",
        "  balance roundrobin",
        "  option http-buffer-request",
        "  option httpchk GET /warden/ready",
        "  http-check expect status 200",
        f"  http-response set-header {SERVED_BY} %s",
    ]
    lines += [
        f"  server {name} {address} check inter 2s fall 2 rise 1"
        for name, address in servers.items()
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def running_haproxy(servers: Mapping[str, str], workdir: Path) -> Iterator[str]:
    """HAProxy balancing ``servers`` until the block ends; yields its base URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = workdir / "haproxy.cfg"
    config.write_text(haproxy_config(port, servers))
    url = f"http://127.0.0.1:{port}"
    child = ChildProcess(
        "haproxy",
        [HAPROXY_BINARY, "-db", "-f", str(config)],
        workdir / "haproxy.log",
        f"{url}{HEALTH_PATH}",
    )
    child.start()
    try:
        child.wait_ready(30)
        yield url
    finally:
        child.stop(timeout_s=10)
