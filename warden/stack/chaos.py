"""``warden chaos``: break a running local engine on purpose, to watch warden react.

- ``pressure``: long prompts kept in flight to fill the KV cache (bounded count and time).
- ``nan``: requests whose logits really go NaN: prompts holding the poisoned token of a tiny
  model built with ``warden model tiny DIR --nan-token ID`` (the id is read from the served
  model's folder, or given with ``--token-id``). ``--inject nan|inf`` asks the test hook instead
  (the engine must run with ``WARDEN_TEST_INJECT_NONFINITE=1``, e.g. ``warden up --chaos``), for
  what no model produces on demand, such as ``+inf``.
- ``stall``: SIGSTOP the engine core for a while, then SIGCONT (unless told not to).
- ``crash``: SIGKILL the engine core.
- ``creep``: the engine core's host memory grows at ``--rate`` MB/s until ``--off`` (the engine
  must run with the test switch ``WARDEN_TEST_MEMORY_CREEP=1``; exporter/memory_creep.py).

Only loopback engines: this is a tool for a stack on your own machine, and the signals can only
reach local processes anyway. The engine core is found from the engine's port: the process
listening there is the API server, and the engine core is its descendant whose process title
(set by vLLM) contains ``EngineCore``.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from exporter import memory_creep
from exporter.catalog import NONFINITE_LOGITS
from exporter.settings import load_settings
from warden.common.metrics_text import sum_samples
from warden.common.outcomes import FAILED, OutcomeTally, classify

DEFAULT_ENGINE_URL = load_settings().engine_url
ENGINE_CORE_MARK = "EngineCore"
PROMPT_WORDS = ("memory", "watermark", "cache", "block", "engine", "request", "token", "prompt")

Out = Callable[[str], None]


class ChaosError(RuntimeError):
    """The chaos action cannot run: not a loopback engine, no engine core found, ..."""


# --- Argument checks --------------------------------------------------------------------------
def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """argparse type: an int in [low, high], so a typo cannot start an unbounded flood."""

    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value

    return parse


def bounded_float(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value

    return parse


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_loopback(url: str) -> None:
    if not is_loopback(url):
        raise ChaosError(f"{url}: chaos only targets engines on this machine (loopback)")


def engine_port(url: str) -> int:
    parts = urlsplit(url)
    if parts.port is not None:
        return parts.port
    return 443 if parts.scheme == "https" else 80


# --- Process discovery ------------------------------------------------------------------------
def listening_process(port: int) -> psutil.Process:
    """The process listening on ``port``; the outermost one if several share the socket.

    A forked child inherits its parent's listening socket: vLLM's engine core, forked from
    the API server on CUDA, holds the server's port, and so does a worker forked from it.
    psutil names one holder of a shared socket, the youngest: climbing from it to the
    outermost ancestor that holds the port finds the server."""
    pids = {
        conn.pid
        for conn in psutil.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid
    }
    if not pids:
        raise ChaosError(f"no process of yours listens on port {port}: is the engine running?")
    process = psutil.Process(min(pids))
    while (parent := _parent(process)) is not None and _listens_on(parent, port):
        process = parent
    return process


def _parent(process: psutil.Process) -> psutil.Process | None:
    with contextlib.suppress(psutil.Error):
        return process.parent()
    return None


def _listens_on(process: psutil.Process, port: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return any(
            conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
            for conn in process.net_connections(kind="inet")
        )
    return False


def _title(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join([process.name(), *process.cmdline()])
    return ""


def is_engine_core(process: psutil.Process) -> bool:
    """vLLM sets the core's process title (argv[0], and the kernel's 15-character comm)."""
    with contextlib.suppress(psutil.Error):
        argv = process.cmdline()
        return ENGINE_CORE_MARK in process.name() or bool(argv and ENGINE_CORE_MARK in argv[0])
    return False


def find_engine_core(server: psutil.Process) -> psutil.Process:
    """The engine core below the API server (vLLM titles it ``VLLM::EngineCore``)."""
    if is_engine_core(server):
        return server
    cores = [p for p in server.children(recursive=True) if is_engine_core(p)]
    if not cores:
        raise ChaosError(
            f"no {ENGINE_CORE_MARK} process below PID {server.pid} ({_title(server)[:80]})"
        )
    # With data parallelism there is one core per rank; the first is enough to break it.
    return min(cores, key=lambda p: p.pid)


def engine_core_for(engine_url: str, server_pid: int | None = None) -> psutil.Process:
    server = (
        psutil.Process(server_pid) if server_pid else listening_process(engine_port(engine_url))
    )
    return find_engine_core(server)


# --- Actions ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int


def served_model(engine_url: str, client: httpx.Client) -> ModelInfo:
    """The first model the engine serves, and its context length (from /v1/models)."""
    data = client.get(f"{engine_url}/v1/models").raise_for_status().json()["data"]
    if not data:
        raise ChaosError(f"{engine_url} serves no model")
    return ModelInfo(data[0]["id"], int(data[0].get("max_model_len") or 2048))


def long_prompt(words: int) -> str:
    return " ".join(PROMPT_WORDS[i % len(PROMPT_WORDS)] for i in range(words))


def pressure(
    engine_url: str,
    requests: int,
    concurrency: int,
    duration_s: float,
    out: Out = print,
) -> OutcomeTally:
    """Keep ``concurrency`` long completions in flight until ``duration_s`` has passed or
    ``requests`` were sent, whichever comes first; returns the outcomes (completed, refused,
    failed: warden.common.outcomes). Sustained, so a scrape every few seconds sees the cache
    full."""
    require_loopback(engine_url)
    outcomes = OutcomeTally()
    lock = threading.Lock()
    sent = 0
    with httpx.Client(timeout=httpx.Timeout(duration_s + 5.0)) as client:
        model = served_model(engine_url, client)
        # A third of the context as prompt, a third generated, EOS ignored: every request holds
        # its KV blocks for as long as possible.
        budget = max(8, model.max_model_len // 3)
        body: dict[str, Any] = {
            "model": model.name,
            "prompt": long_prompt(budget),
            "max_tokens": budget,
            "ignore_eos": True,
        }
        out(
            f"pressure: {concurrency} concurrent requests of ~{budget} prompt words + {budget} "
            f"tokens for {duration_s:g}s (at most {requests} requests) against {engine_url}"
        )
        # The time counts from the first request, not from before the model lookup: on a
        # loaded machine the lookup alone took a 1 s pressure's whole time, and none was sent.
        deadline = time.monotonic() + duration_s

        def worker() -> None:
            nonlocal sent
            while True:
                with lock:
                    remaining = deadline - time.monotonic()
                    if sent >= requests or remaining <= 0:
                        return
                    sent += 1
                outcome = _send(
                    client, f"{engine_url}/v1/completions", body, timeout=max(1.0, remaining)
                )
                with lock:
                    outcomes.add(*outcome)

        with ThreadPoolExecutor(concurrency) as pool:
            for future in [pool.submit(worker) for _ in range(concurrency)]:
                future.result()
    out(f"pressure: done, {sent} requests: {outcomes.line()}")
    _print_failures(outcomes, "pressure", out)
    return outcomes


def _send(
    client: httpx.Client, url: str, body: dict[str, Any], timeout: float | None = None
) -> tuple[str, str]:
    """One completion's outcome (completed / refused / failed) and a line saying what came."""
    try:
        if timeout is None:
            response = client.post(url, json=body)
        else:
            response = client.post(url, json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        return FAILED, f"{type(exc).__name__}: {exc}"
    outcome = classify(response.status_code, response.headers, response.content)
    return outcome, f"HTTP {response.status_code}: {response.text[:200]}"


def _print_failures(outcomes: OutcomeTally, command: str, out: Out) -> None:
    for detail in outcomes.failures[:5]:
        out(f"{command}: failed: {detail}")


def _metric_total(engine_url: str, name: str, client: httpx.Client) -> float | None:
    """Sum of a metric's samples on the engine's /metrics, or None when it is absent."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        return sum_samples(client.get(f"{engine_url}/metrics").text, name)
    return None


def nan_prompt(engine_url: str, model: str, token: int, client: httpx.Client) -> list[int]:
    """Token ids of an ordinary prompt with ``token`` in the middle (vLLM's /tokenize)."""
    ids: list[int] = []
    with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
        answer = client.post(
            f"{engine_url}/tokenize",
            json={"model": model, "prompt": long_prompt(8), "add_special_tokens": False},
        ).raise_for_status()
        ids = [int(t) for t in answer.json()["tokens"]]
    middle = len(ids) // 2
    return [*ids[:middle], token, *ids[middle:]]


def inject_nan(
    engine_url: str,
    count: int,
    out: Out = print,
    token_id: int | None = None,
    inject: str | None = None,
) -> OutcomeTally:
    """Send ``count`` requests whose logits go non-finite and report what warden counted.

    By default the prompts carry the served tiny model's NaN token (``token_id`` overrides it):
    the weights produce the NaN. With ``inject`` ("nan" or "inf") the engine's test hook
    poisons the logits instead."""
    require_loopback(engine_url)
    from exporter.request_args import INJECT_ARG
    from warden.common.tinymodel import nan_token_of

    outcomes = OutcomeTally()
    with httpx.Client(timeout=120.0) as client:
        model = served_model(engine_url, client)
        body: dict[str, Any] = {"model": model.name, "max_tokens": 8}
        if inject is not None:
            body.update(prompt=long_prompt(8), vllm_xargs={INJECT_ARG: inject})
            how = f"vllm_xargs {{{INJECT_ARG!r}: {inject!r}}} (test hook)"
        else:
            token = token_id if token_id is not None else nan_token_of(model.name)
            if token is None:
                raise ChaosError(
                    f"{model.name} has no NaN token: serve a model built with `warden model tiny "
                    "DIR --nan-token ID`, pass --token-id, or use --inject nan|inf"
                )
            body["prompt"] = nan_prompt(engine_url, model.name, token, client)
            how = f"token {token} in the prompt (the model's weights make NaN)"
        before = _metric_total(engine_url, NONFINITE_LOGITS.name, client)
        out(f"nan: {count} requests with {how} to {engine_url}")
        for _ in range(count):
            outcomes.add(*_send(client, f"{engine_url}/v1/completions", body))
        after = _metric_total(engine_url, NONFINITE_LOGITS.name, client)
    out(f"nan: {count} requests: {outcomes.line()}")
    _print_failures(outcomes, "nan", out)
    if before is not None and after is not None:
        out(f"nan: {NONFINITE_LOGITS.name} went from {before:g} to {after:g}")
        if after == before:
            hint = (
                "is the engine running with WARDEN_TEST_INJECT_NONFINITE=1?"
                if inject is not None
                else "does the served model really carry that NaN token?"
            )
            out(f"nan: nothing counted: {hint}")
    return outcomes


def stall(
    engine_url: str,
    seconds: float,
    resume: bool = True,
    server_pid: int | None = None,
    out: Out = print,
    sleep: Callable[[float], None] = time.sleep,
) -> psutil.Process:
    """SIGSTOP the engine core; after ``seconds`` SIGCONT it, unless ``resume`` is False.

    An interrupted wait still resumes the engine: a stall should not outlive the command by
    accident, only on request."""
    require_loopback(engine_url)
    core = engine_core_for(engine_url, server_pid)
    core.send_signal(signal.SIGSTOP)
    out(f"stall: SIGSTOP sent to engine core PID {core.pid} ({_title(core)[:60]})")
    if not resume:
        out(f"stall: left stopped; resume it with: kill -CONT {core.pid}")
        return core
    try:
        sleep(seconds)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            core.send_signal(signal.SIGCONT)
            out(f"stall: SIGCONT sent to PID {core.pid} after {seconds:g}s")
    return core


def crash(engine_url: str, server_pid: int | None = None, out: Out = print) -> psutil.Process:
    """SIGKILL the engine core; vLLM's API server notices and shuts down (or a supervisor
    restarts it)."""
    require_loopback(engine_url)
    core = engine_core_for(engine_url, server_pid)
    core.send_signal(signal.SIGKILL)
    out(f"crash: SIGKILL sent to engine core PID {core.pid} ({_title(core)[:60]})")
    return core


def creep(
    engine_url: str, rate_mb_s: float, server_pid: int | None = None, out: Out = print
) -> Path:
    """Set the engine core's memory creep to ``rate_mb_s`` MB/s (0: stop it and free what it
    grew); returns the control file written. The file exists only when the engine core runs
    with the test switch."""
    require_loopback(engine_url)
    core = engine_core_for(engine_url, server_pid)
    path = memory_creep.control_path(core.pid)
    if not path.exists():
        raise ChaosError(
            f"engine core PID {core.pid} runs without the test switch {memory_creep.SWITCH_ENV}=1 "
            f"(no {path}): start the engine with it ({memory_creep.SWITCH_ENV}=1 warden serve ...)"
        )
    memory_creep.write_rate(path, rate_mb_s)
    if rate_mb_s > 0:
        out(f"creep: engine core PID {core.pid} grows its memory at {rate_mb_s:g} MB/s ({path})")
    else:
        out(f"creep: off for engine core PID {core.pid}; the memory it grew is freed")
    return path


# --- Command line -----------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="chaos_command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--engine-url", default=DEFAULT_ENGINE_URL, help="a loopback engine")
        return p

    p = command("pressure", "keep long prompts in flight to fill the KV cache")
    p.add_argument("--requests", type=bounded_int(1, 5000), default=500, help="at most this many")
    p.add_argument("--concurrency", type=bounded_int(1, 64), default=8, help="in flight at once")
    p.add_argument("--duration", type=bounded_float(1, 600), default=30.0, help="seconds")
    p = command("nan", "requests whose logits go NaN (the tiny model's --nan-token, or --inject)")
    p.add_argument("--count", type=bounded_int(1, 100), default=3)
    p.add_argument("--token-id", type=bounded_int(0, 10_000_000), help="the poisoned token")
    p.add_argument(
        "--inject",
        choices=("nan", "inf"),
        help="ask the engine's test hook instead (WARDEN_TEST_INJECT_NONFINITE=1)",
    )
    p = command("stall", "SIGSTOP the engine core, SIGCONT it after --seconds")
    p.add_argument("--seconds", type=bounded_float(0, 3600), default=10.0)
    p.add_argument("--no-resume", action="store_true", help="leave it stopped")
    p.add_argument("--pid", type=int, help="API server PID (default: found from the port)")
    p = command("crash", "SIGKILL the engine core")
    p.add_argument("--pid", type=int, help="API server PID (default: found from the port)")
    p = command(
        "creep", "grow the engine core's memory at --rate MB/s (WARDEN_TEST_MEMORY_CREEP=1)"
    )
    rate = p.add_mutually_exclusive_group(required=True)
    rate.add_argument(
        "--rate", type=bounded_float(0, memory_creep.MAX_RATE_MB_S), help="MB/s (0: off)"
    )
    rate.add_argument("--off", action="store_true", help="stop the creep, free what it grew")
    p.add_argument("--pid", type=int, help="API server PID (default: found from the port)")


def run(args: argparse.Namespace, out: Out = print) -> int:
    try:
        if args.chaos_command == "pressure":
            pressure(args.engine_url, args.requests, args.concurrency, args.duration, out)
        elif args.chaos_command == "nan":
            inject_nan(args.engine_url, args.count, out, args.token_id, args.inject)
        elif args.chaos_command == "stall":
            stall(args.engine_url, args.seconds, not args.no_resume, args.pid, out)
        elif args.chaos_command == "crash":
            crash(args.engine_url, args.pid, out)
        elif args.chaos_command == "creep":
            creep(args.engine_url, 0.0 if args.off else args.rate, args.pid, out)
        else:  # pragma: no cover - argparse restricts the choices
            raise ChaosError(f"unknown chaos command {args.chaos_command!r}")
    except (ChaosError, psutil.Error, httpx.HTTPError, OSError, ValueError) as exc:
        out(f"warden chaos {args.chaos_command}: {exc}")
        return 1
    return 0
