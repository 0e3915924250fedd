"""Latency and throughput of warden's Alertmanager webhook on a real vLLM server.

Starts one engine on the tiny CPU model with every warden hook and a webhook token, and posts
Alertmanager v4 notifications to ``POST /warden/alertmanager`` the way Alertmanager does
(bearer token, ``application/json``, a group of ``--alerts`` alerts per notification, label
sets and annotations of warden's generated rules in alerts/generated/rules.yml, RFC 3339
times with nanoseconds). Every fingerprint of a pool (rules x instances) goes through
firing, firing again (Alertmanager's repeat) and resolved, then fires again with a newer
``startsAt``: leases are applied, renewed and released the whole time.

Phases, each bounded by ``--phase-s``:
  health      GET /health, one client, sequential: the HTTP stack's floor on this server
  sequential  one client, one notification at a time: latency p50/p90/p99
  c8, c32     8 and 32 concurrent clients (asyncio, one process), each on its own
              fingerprints so each alert's order holds: notifications/s and latency
  unique      --unique N (0 skips it): fingerprints never seen before, each firing then
              resolved; latency per block as resolved-alert memory (tombstones) grows
Finally ``warden_webhook_notifications_total{outcome="applied"}`` on /metrics must have grown
by exactly the number of notifications answered 200, and no other outcome may have grown.
The client runs on the same cores as the server: at high concurrency it competes for them.

Usage:  .venv/bin/python -m benchmarks.webhook_latency [--count 3000] [--alerts 1]
        [--fingerprints 64] [--unique 10000] [--phase-s 90] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.common import (
    VARIANTS,
    EngineCpu,
    cleanup,
    exit_on_sigterm,
    log,
    machine,
    own_cpu_s,
    quantile,
    running_engines,
    sample,
    scrape,
    table,
    tiny_model,
    workdir,
)

TOKEN = "bench-webhook-token-0123456789abcdef"
RULES = Path(__file__).resolve().parents[1] / "alerts" / "generated" / "rules.yml"
HEADERS = {
    "Authorization": f"Bearer {TOKEN}",
    "Content-Type": "application/json",
    "User-Agent": "Alertmanager/0.27.0",
}
OUTCOME_METRIC = "warden_webhook_notifications_total"
ZERO_TIME = "0001-01-01T00:00:00Z"


def warden_rules() -> list[dict[str, Any]]:
    """The generated alert rules that carry a warden_action (labels and annotations)."""
    data = yaml.safe_load(RULES.read_text())
    rules = []
    for group in data["groups"]:
        for rule in group["rules"]:
            if "alert" in rule and "warden_action" in rule.get("labels", {}):
                rules.append(rule)
    return rules


def rfc3339(at: float) -> str:
    """Alertmanager's form: UTC with nanoseconds."""
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}123Z"


class Alert:
    """One alert's identity and where it is in its firing / repeat / resolved cycle."""

    def __init__(self, rule: dict[str, Any], instance: str, salt: str = "") -> None:
        self.labels = {"alertname": rule["alert"], "instance": instance, **rule["labels"]}
        annotations = rule.get("annotations", {})
        self.annotations = {
            k: str(v).replace("{{ $labels.instance }}", instance) for k, v in annotations.items()
        }
        identity = json.dumps(self.labels, sort_keys=True) + salt
        self.fingerprint = hashlib.sha256(identity.encode()).hexdigest()[:16]
        self.step = 0
        self.starts_at = time.time() - 3600.0

    def next_status(self) -> tuple[str, float]:
        """firing, firing (repeat), resolved; then a new incarnation (newer startsAt)."""
        status = ("firing", "firing", "resolved")[self.step % 3]
        if self.step % 3 == 0 and self.step:
            self.starts_at += 1.0
        self.step += 1
        return status, self.starts_at

    def json(self, status: str, starts_at: float) -> dict[str, Any]:
        return {
            "status": status,
            "labels": self.labels,
            "annotations": self.annotations,
            "startsAt": rfc3339(starts_at),
            "endsAt": ZERO_TIME if status == "firing" else rfc3339(starts_at + 30.0),
            "generatorURL": "http://prometheus:9090/graph?g0.expr=instance%3Awarden&g0.tab=1",
            "fingerprint": self.fingerprint,
        }


def envelope(alerts: list[dict[str, Any]], group: list[Alert]) -> bytes:
    """The Alertmanager v4 webhook body around some alerts of one group."""
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    common = {k: v for k, v in group[0].labels.items() if all(a.labels.get(k) == v for a in group)}
    group_labels = {k: common[k] for k in ("alertname", "instance", "severity") if k in common}
    body = {
        "receiver": "warden-engine",
        "status": status,
        "alerts": alerts,
        "groupLabels": group_labels,
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": '{}/{warden_action=~".+"}:' + json.dumps(group_labels, sort_keys=True),
        "truncatedAlerts": 0,
    }
    return json.dumps(body).encode()


# The engine's identity: every alert is about it, so every one does lease work (#12).
INSTANCE = "engine:8000"


def notification(group: list[Alert]) -> bytes:
    """The next notification for a group of alerts, each at its next step."""
    return envelope([alert.json(*alert.next_status()) for alert in group], group)


def alert_pool(size: int, salt: str = "") -> list[Alert]:
    """Alerts about the measured engine (WARDEN_INSTANCE), each rule many times over: one
    fingerprint per copy, so every alert takes its own lease."""
    rules = warden_rules()
    return [
        Alert(rules[i % len(rules)], INSTANCE, f"{salt}/{i // len(rules)}") for i in range(size)
    ]


def groups(pool: list[Alert], per_group: int) -> Iterator[list[Alert]]:
    """Endless groups of ``per_group`` alerts going round the pool."""
    index = 0
    while True:
        yield [pool[(index + k) % len(pool)] for k in range(per_group)]
        index = (index + per_group) % len(pool)


def latency_stats(latencies_s: list[float], elapsed_s: float) -> dict[str, float]:
    ms = [1000 * x for x in latencies_s]
    return {
        "n": len(ms),
        "per_s": round(len(ms) / elapsed_s, 1),
        "p50_ms": round(quantile(ms, 0.5), 3),
        "p90_ms": round(quantile(ms, 0.9), 3),
        "p99_ms": round(quantile(ms, 0.99), 3),
        "max_ms": round(max(ms), 3),
    }


def check(response: httpx.Response) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"webhook answered {response.status_code}: {response.text[:300]}")


def sequential(
    url: str, bodies: Iterator[bytes] | None, count: int, limit_s: float
) -> tuple[dict[str, float], int]:
    """One client, one request at a time; GET when ``bodies`` is None."""
    latencies = []
    sent = 0
    with httpx.Client(timeout=30) as client:
        started = time.perf_counter()
        deadline = started + limit_s
        for _ in range(count):
            if time.perf_counter() > deadline:
                break
            t0 = time.perf_counter()
            if bodies is None:
                response = client.get(url)
            else:
                response = client.post(url, content=next(bodies), headers=HEADERS)
                sent += 1
            latencies.append(time.perf_counter() - t0)
            check(response)
        elapsed = time.perf_counter() - started
    return latency_stats(latencies, elapsed), sent


async def concurrent(
    url: str, per_group: int, pool_size: int, clients: int, count: int, limit_s: float
) -> tuple[dict[str, float], int]:
    """``clients`` concurrent senders, each cycling through its own alerts."""
    latencies: list[float] = []
    per_client = max(1, count // clients)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        started = time.perf_counter()
        deadline = started + limit_s

        async def sender(index: int) -> None:
            pool = alert_pool(max(per_group, pool_size // clients), salt=f"c{clients}-{index}")
            bodies = groups(pool, per_group)
            for _ in range(per_client):
                if time.perf_counter() > deadline:
                    return
                t0 = time.perf_counter()
                response = await client.post(
                    url, content=notification(next(bodies)), headers=HEADERS
                )
                latencies.append(time.perf_counter() - t0)
                check(response)

        await asyncio.gather(*(sender(i) for i in range(clients)))
        elapsed = time.perf_counter() - started
    return latency_stats(latencies, elapsed), len(latencies)


def unique_phase(
    url: str, total: int, block: int, limit_s: float
) -> tuple[list[dict[str, Any]], int]:
    """Never-seen fingerprints, firing then resolved: latency as the tombstones pile up."""
    rules = warden_rules()
    blocks = []
    sent = 0
    deadline = time.perf_counter() + limit_s
    with httpx.Client(timeout=30) as client:
        for start in range(0, total, block):
            if time.perf_counter() > deadline:
                break
            latencies = []
            t_block = time.perf_counter()
            for i in range(start, min(total, start + block)):
                alert = Alert(rules[i % len(rules)], INSTANCE, salt=f"unique-{i}")
                for status in ("firing", "resolved"):
                    body = envelope([alert.json(status, alert.starts_at)], [alert])
                    t0 = time.perf_counter()
                    response = client.post(url, content=body, headers=HEADERS)
                    latencies.append(time.perf_counter() - t0)
                    check(response)
                    sent += 1
            stats = latency_stats(latencies, time.perf_counter() - t_block)
            blocks.append({"resolved_fingerprints_before": start, **stats})
            log(f"unique: {start + block} fingerprints resolved, p50 {stats['p50_ms']} ms")
    return blocks, sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3000, help="notifications per phase")
    parser.add_argument("--alerts", type=int, default=1, help="alerts per notification")
    parser.add_argument("--fingerprints", type=int, default=64, help="alert identities in play")
    parser.add_argument("--clients", default="8,32", help="concurrency levels")
    parser.add_argument("--unique", type=int, default=10000, help="unique fingerprints (0: skip)")
    parser.add_argument("--phase-s", type=float, default=90.0, help="time limit per phase")
    parser.add_argument("--model", help="model dir (default: build the tiny model)")
    parser.add_argument("--workdir", help="keep the engine log here")
    parser.add_argument("--out", help="write the JSON result here")
    args = parser.parse_args()
    exit_on_sigterm()

    work, temporary = workdir(args.workdir, "warden-webhook-bench-")
    log(f"work folder (engine log): {work}")
    model = tiny_model(work, args.model)
    token_file = work / "webhook-token"
    token_file.write_text(TOKEN + "\n")
    env = {"WARDEN_WEBHOOK_TOKEN_FILE": str(token_file), "WARDEN_INSTANCE": INSTANCE}
    before = machine()
    phases: dict[str, Any] = {}
    with running_engines([VARIANTS["warden"]], model, work, env=env) as engines:
        engine = engines["warden"]
        url = f"{engine.base_url}/warden/alertmanager"
        counts_before = scrape(engine.base_url)
        sent = 0
        # Warm-up, not measured: first requests build the router's and parser's caches.
        _, n = sequential(url, (notification(g) for g in groups(alert_pool(8, "warm"), 1)), 50, 30)
        sent += n
        cpu = EngineCpu(engine)

        def timed(name: str, run: Callable[[], tuple[dict[str, float], int]]) -> int:
            """Run a phase; add the server's and this client's CPU time per request."""
            server, client = cpu.read()["api"], own_cpu_s()
            stats, n = run()
            stats["server_cpu_us_per_req"] = round(1e6 * (cpu.read()["api"] - server) / stats["n"])
            stats["client_cpu_us_per_req"] = round(1e6 * (own_cpu_s() - client) / stats["n"])
            phases[name] = stats
            log(f"{name}: {stats}")
            return n

        timed(
            "health",
            lambda: sequential(f"{engine.base_url}/health", None, args.count, args.phase_s),
        )
        pool = alert_pool(args.fingerprints, "seq")
        bodies = (notification(g) for g in groups(pool, args.alerts))
        sent += timed("sequential", lambda: sequential(url, bodies, args.count, args.phase_s))

        def concurrent_phase(clients: int) -> tuple[dict[str, float], int]:
            return asyncio.run(
                concurrent(url, args.alerts, args.fingerprints, clients, args.count, args.phase_s)
            )

        for clients in (int(c) for c in args.clients.split(",")):
            sent += timed(f"c{clients}", functools.partial(concurrent_phase, clients))
        if args.unique:
            phases["unique"], n = unique_phase(
                url, args.unique, max(1, args.unique // 10), args.phase_s * 2
            )
            sent += n
        counts_after = scrape(engine.base_url)
    outcomes = {}
    for key in set(counts_before) | set(counts_after):
        if key.startswith(OUTCOME_METRIC + "{"):
            delta = counts_after.get(key, 0.0) - counts_before.get(key, 0.0)
            if delta:
                outcomes[key] = delta
    applied = sample(counts_after, OUTCOME_METRIC, outcome="applied") - sample(
        counts_before, OUTCOME_METRIC, outcome="applied"
    )
    result = {
        "machine": before,
        "loadavg_at_end": machine()["loadavg"],
        "settings": {
            "count": args.count,
            "alerts_per_notification": args.alerts,
            "fingerprints": args.fingerprints,
            "rules": len(warden_rules()),
        },
        "phases": phases,
        "sent_200": sent,
        "applied_counter_delta": applied,
        "outcome_deltas": outcomes,
        "counter_matches": applied == sent and len(outcomes) == 1,
    }
    cleanup(work, temporary)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    rows = [
        [
            name,
            s["n"],
            s["per_s"],
            s["p50_ms"],
            s["p90_ms"],
            s["p99_ms"],
            s["max_ms"],
            s["server_cpu_us_per_req"],
            s["client_cpu_us_per_req"],
        ]
        for name, s in phases.items()
        if name != "unique"
    ]
    headers = ["phase", "requests", "per s", "p50 ms", "p90 ms", "p99 ms", "max ms"]
    print(table([*headers, "server CPU us/req", "client CPU us/req"], rows))
    if "unique" in phases:
        rows = [
            [b["resolved_fingerprints_before"], b["n"], b["p50_ms"], b["p99_ms"]]
            for b in phases["unique"]
        ]
        print(table(["tombstones before", "requests", "p50 ms", "p99 ms"], rows))
    return 0 if result["counter_matches"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
