"""The stack on one machine without Docker: what ``warden up`` runs, and what tests drive.

``NativeStack`` starts the engine with ``warden serve`` (vLLM with every warden hook, under the
supervisor), Prometheus and Alertmanager from the PATH, Grafana when a binary is installed, and
the local pager in process. Their configs are
rendered into the run directory from the same sources as the compose files (rules, routes,
dashboards, provisioning), with loopback addresses instead of service names::

    with NativeStack(StackSettings(workdir=tmp, intervals=Intervals("1s", "1s"))) as stack:
        stack.wait_for_query('up{job="vllm-warden"} == 1')
        ...
        stack.pages()

Every server runs in its own process group; ``stop()`` (or leaving the ``with`` block) ends
all of them and anything they forked.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from alerts.alertmanager import (
    ENGINE_TIMING,
    PAGER_TIMING,
    RouteTiming,
    render_alertmanager_config,
)
from alerts.rules_file import render_rules
from dashboards.promapi import PrometheusAPI, QueryError
from exporter.settings import env_name
from warden.common.processes import ChildProcess, ChildStartError, descendants, wait_http_ok
from warden.common.waiting import wait_until
from warden.stack.config import (
    DEFAULT_WORKDIR,
    ENGINE_WEBHOOK_PATH,
    Intervals,
    prometheus_config,
    render_prometheus_config,
)
from warden.stack.grafana import GrafanaInstall, find_grafana, grafana_files
from warden.stack.pager import Page, PagerServer, print_page
from warden.stack.traces import OTLP_PROTOCOL, otlp_traces_endpoint
from warden.stack.webhook_token import TOKEN_FILE_ENV, write_token

PROMETHEUS_BINARIES = ("prometheus",)
# Debian names it prometheus-alertmanager; upstream tarballs call it alertmanager.
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")
# Small KV cache and short context for the tiny model (see warden/cli/demo.py): pressure is easy
# to produce, and the engine starts in about 25 s on two cores.
TINY_ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
INJECT_ENV = env_name("test_inject_nonfinite")
# Alertmanager's API takes alerts from anyone who reaches it and relays those carrying
# warden_action to the engine with the real token: it listens on loopback only, whatever
# address the rest of the stack uses (docs/security.md).
ALERTMANAGER_HOST = "127.0.0.1"


class StackError(RuntimeError):
    """The stack cannot start: a binary is missing, a port is taken, a server failed."""


@dataclass
class StackSettings:
    """Everything ``warden up`` can be told. Ports default to each server's usual one.

    ``model`` None builds and serves the tiny model with small-KV-cache engine arguments.
    ``engine_url`` points the stack at an engine that is already running (none is started).
    ``inject_faults`` sets WARDEN_TEST_INJECT_NONFINITE=1 so ``warden chaos nan --inject`` works.
    ``supervise`` False runs ``warden serve --no-supervise`` (no restarts, no control port);
    ``reset_circuit`` closes a restart circuit a previous run left open in the same workdir.
    ``engine_timing``/``pager_timing`` override Alertmanager's route timings (tests use short
    ones); None keeps the alerts' defaults.
    """

    workdir: Path = DEFAULT_WORKDIR
    model: str | None = None
    engine_args: Sequence[str] | None = None
    host: str = "127.0.0.1"
    engine_port: int = 8000
    supervisor_port: int = 8001
    prometheus_port: int = 9090
    alertmanager_port: int = 9093
    grafana_port: int = 3000
    pager_port: int = 9099
    intervals: Intervals = field(default_factory=Intervals)
    # A demo's alert timings: rule group name -> seconds; every alert of that group has its
    # `for` and `keep_firing_for` cut to that (empty: the rules exactly as generated).
    alert_hold_caps: Mapping[str, int] = field(default_factory=dict)
    engine_timing: RouteTiming | None = None
    pager_timing: RouteTiming | None = None
    inject_faults: bool = False
    engine_env: Mapping[str, str] = field(default_factory=dict)
    otlp_endpoint: str | None = None
    with_grafana: bool = True
    supervise: bool = True
    reset_circuit: bool = False
    engine_url: str | None = None
    engine_ready_timeout_s: float = 600.0
    server_ready_timeout_s: float = 60.0


def find_binary(candidates: Sequence[str]) -> str | None:
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure_port_free(host: str, port: int, what: str) -> None:
    """Fail with a message that says which option to change, before anything starts."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise StackError(
                f"{what}: {host}:{port} is in use ({exc.strerror}); "
                f"choose another with --{what}-port"
            ) from None


class NativeStack:
    """The running stack: URLs, the pages received, Prometheus queries, and ``stop()``."""

    def __init__(self, settings: StackSettings, out: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.out = out
        self.workdir = settings.workdir.resolve()
        self.logs_dir = self.workdir / "logs"
        self.token_path = self.workdir / "webhook-token"
        self.pages_path = self.workdir / "pages.jsonl"
        self.pager: PagerServer | None = None
        self.servers: dict[str, ChildProcess] = {}
        self.grafana_install: GrafanaInstall | None = None
        self.grafana_note = ""
        self.model: str | None = None
        self._started_pids: set[int] = set()

    # --- Addresses ---------------------------------------------------------------------------
    @property
    def engine_url(self) -> str:
        if self.settings.engine_url:
            return self.settings.engine_url.rstrip("/")
        return f"http://{self.settings.host}:{self.settings.engine_port}"

    @property
    def supervisor_url(self) -> str | None:
        """The supervisor's control and liveness server, when this stack runs one."""
        if self.settings.engine_url is not None or not self.settings.supervise:
            return None
        return f"http://{self.settings.host}:{self.settings.supervisor_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://{ALERTMANAGER_HOST}:{self.settings.alertmanager_port}"

    @property
    def grafana_url(self) -> str | None:
        if "grafana" not in self.servers:
            return None
        return f"http://{self.settings.host}:{self.settings.grafana_port}"

    @property
    def pager_url(self) -> str:
        if self.pager is None:
            raise StackError("the pager is not running")
        return self.pager.url

    @property
    def alertmanager_config_path(self) -> Path:
        return self.workdir / "alertmanager" / "alertmanager.yml"

    @property
    def prometheus_config_path(self) -> Path:
        return self.workdir / "prometheus" / "prometheus.yml"

    @property
    def rules_path(self) -> Path:
        return self.workdir / "prometheus" / "rules.yml"

    # --- Lifecycle ---------------------------------------------------------------------------
    def start(self) -> NativeStack:
        """Start everything and wait until each server answers; on failure stop what started."""
        try:
            self._check_ports()
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._start_pager()
            write_token(self.token_path)
            if self.settings.engine_url is None:
                self._start_engine()
            self._write_configs()
            self._start_servers()
            for name, child in self.servers.items():
                if name != "engine":
                    child.wait_ready(self.settings.server_ready_timeout_s)
            self._wait_engine()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every child and its descendants; safe to call more than once."""
        self.process_ids()  # remember every PID, so callers can check none survives
        leftovers: list[psutil.Process] = []
        for pid in list(self._roots()):
            leftovers.extend(descendants(pid))
        for name in ("prometheus", "alertmanager", "grafana", "engine"):
            child = self.servers.pop(name, None)
            if child is not None:
                # The supervisor drains and stops vLLM on SIGTERM; give it the time to.
                child.stop(timeout_s=60.0 if name == "engine" else 15.0)
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                if process.is_running():
                    process.kill()
        if self.pager is not None:
            self.pager.stop()
            self.pager = None

    def __enter__(self) -> NativeStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- What tests and scenarios read --------------------------------------------------------
    def process_ids(self) -> set[int]:
        """PIDs of every started server and all their descendants, seen now or earlier."""
        for pid in self._roots():
            self._started_pids.add(pid)
            self._started_pids.update(p.pid for p in descendants(pid))
        return set(self._started_pids)

    def exited(self) -> list[str]:
        """Names of started children that are no longer running."""
        return [name for name, child in self.servers.items() if not child.running()]

    def pages(self) -> list[Page]:
        return self.pager.pages() if self.pager is not None else []

    def wait_for_page(
        self, predicate: Callable[[Page], bool] = lambda _: True, timeout_s: float = 60.0
    ) -> Page:
        def matching() -> Page | None:
            return next((page for page in self.pages() if predicate(page)), None)

        try:
            return wait_until(matching, timeout_s, 0.2, what="a matching page")
        except TimeoutError:
            raise TimeoutError(
                f"no matching page after {timeout_s:.0f}s in {self.pages_path}"
            ) from None

    def prometheus(self) -> PrometheusAPI:
        """A client for this stack's Prometheus HTTP API (use it in a ``with``)."""
        return PrometheusAPI(self.prometheus_url, timeout=10.0)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Prometheus instant query: the result list (vector samples)."""
        with self.prometheus() as api:
            try:
                return api.query(expr)
            except QueryError as exc:
                raise StackError(str(exc)) from exc

    def series(self, match: str) -> list[dict[str, str]]:
        """Label sets of every series matching ``match`` that Prometheus holds, whenever
        scraped (an instant query sees only those with a sample in the last 5 minutes, and
        none of a target marked stale since)."""
        with self.prometheus() as api:
            try:
                return api.series(match)
            except QueryError as exc:
                raise StackError(str(exc)) from exc

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts Prometheus holds now, pending or firing, with their labels and state."""
        with self.prometheus() as api:
            try:
                return api.alerts()
            except QueryError as exc:
                raise StackError(str(exc)) from exc

    def wait_for_query(self, expr: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Poll until the query returns at least one sample."""
        try:
            return wait_until(lambda: self.query(expr), timeout_s, 0.5, what=repr(expr))
        except TimeoutError:
            raise TimeoutError(f"{expr!r} returned nothing for {timeout_s:.0f}s") from None

    def summary(self) -> str:
        """Where everything is, for people."""
        rows = [
            ("engine", f"{self.engine_url}  (OpenAI API, /metrics, /warden/state)"),
            ("supervisor", self.supervisor_url or "-"),
            ("prometheus", self.prometheus_url),
            ("alertmanager", self.alertmanager_url),
            ("grafana", self.grafana_url or f"not started: {self.grafana_note}"),
            ("pager", f"{self.pager.url if self.pager else '-'}  pages: {self.pages_path}"),
            ("model", self.model or "-"),
            ("webhook token", str(self.token_path)),
            ("configs", str(self.workdir)),
            ("logs", str(self.logs_dir)),
        ]
        if self.settings.inject_faults:
            rows.append(
                ("fault injection", f"on ({INJECT_ENV}=1): warden chaos nan --inject nan|inf works")
            )
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"  {name.ljust(width)}  {value}" for name, value in rows)

    # --- Steps --------------------------------------------------------------------------------
    def _roots(self) -> list[int]:
        return [child.pid for child in self.servers.values() if child.pid is not None]

    def _check_ports(self) -> None:
        s = self.settings
        ensure_port_free(ALERTMANAGER_HOST, s.alertmanager_port, "alertmanager")
        wanted = [("prometheus", s.prometheus_port), ("pager", s.pager_port)]
        if s.engine_url is None:
            wanted.append(("engine", s.engine_port))
            if s.supervise:
                wanted.append(("supervisor", s.supervisor_port))
        if s.with_grafana:
            wanted.append(("grafana", s.grafana_port))
        for what, port in wanted:
            ensure_port_free(s.host, port, what)

    def _start_pager(self) -> None:
        def on_page(page: Page) -> None:
            print_page(page)

        self.pager = PagerServer(
            self.pages_path, self.settings.host, self.settings.pager_port, on_page
        ).start()

    def _resolve_model(self) -> tuple[str, list[str], dict[str, str]]:
        s = self.settings
        if s.model is not None:
            return s.model, list(s.engine_args or []), {}
        from warden.common.tinymodel import STACK_NAN_TOKEN, TINY_ENGINE_ARGS, build_tiny_model

        model_dir = self.workdir / "tiny-model"
        if not (model_dir / "config.json").exists():
            self.out(f"building the tiny model in {model_dir}")
            # with a NaN token, so `warden chaos nan` shows a real NaN on the default stack
            build_tiny_model(model_dir, nan_token=STACK_NAN_TOKEN)
        args = TINY_ENGINE_ARGS if s.engine_args is None else s.engine_args
        return str(model_dir), list(args), dict(TINY_ENGINE_ENV)

    def engine_argv(self, model: str, vllm_args: Sequence[str]) -> list[str]:
        """``warden serve`` for this stack: supervised unless told otherwise, one log per start."""
        s = self.settings
        argv = [sys.executable, "-m", "warden.cli", "serve", "--host", s.host]
        argv += ["--port", str(s.engine_port), "--run-dir", str(self.workdir / "engine")]
        if s.supervise:
            argv += ["--supervisor-port", str(s.supervisor_port)]
            argv += ["--engine-log-dir", str(self.logs_dir / "vllm")]
            if s.reset_circuit:
                argv.append("--reset-circuit")
        else:
            argv.append("--no-supervise")
        return [*argv, model, "--", *vllm_args]

    def _check_restart_circuit(self) -> None:
        """The supervisor keeps an open circuit across runs and then never starts vLLM: say so
        now rather than wait out the start timeout."""
        from exporter.supervisor_state import STATE_FILE, SupervisorState

        state = SupervisorState.load(self.workdir / "engine" / STATE_FILE)
        if state.circuit_open and not self.settings.reset_circuit:
            raise StackError(
                f"the engine's restart circuit is open from an earlier run in {self.workdir} "
                f"({state.circuit_reason or 'too many restarts'}); read {self.logs_dir}, then "
                "start with --reset-circuit"
            )

    def _start_engine(self) -> None:
        s = self.settings
        if s.supervise:
            self._check_restart_circuit()
        model, args, env = self._resolve_model()
        self.model = model
        env[TOKEN_FILE_ENV] = str(self.token_path)
        if s.inject_faults:
            env[INJECT_ENV] = "1"
        if s.otlp_endpoint:
            env.update(otlp_environment(s.otlp_endpoint))
            args = [*args, "--otlp-traces-endpoint", otlp_traces_endpoint(s.otlp_endpoint)]
        env.update(s.engine_env)
        self._add(
            "engine",
            self.engine_argv(model, args),
            f"{self.engine_url}/health",
            env={**env, "PYTHONUNBUFFERED": "1"},
        )

    def _wait_engine(self) -> None:
        engine = self.servers.get("engine")
        if engine is not None:
            engine.wait_ready(self.settings.engine_ready_timeout_s)
            return
        wait_http_ok(f"{self.engine_url}/health", self.settings.server_ready_timeout_s)

    def _write_configs(self) -> None:
        s = self.settings
        engine_address = self.engine_url.split("://", 1)[1]
        self.rules_path.parent.mkdir(parents=True, exist_ok=True)
        self.rules_path.write_text(render_rules(hold_caps=s.alert_hold_caps), encoding="utf-8")
        config = prometheus_config(
            [engine_address],
            rule_files=[str(self.rules_path)],
            alertmanagers=[f"{ALERTMANAGER_HOST}:{s.alertmanager_port}"],
            self_target=f"{s.host}:{s.prometheus_port}",
            intervals=s.intervals,
        )
        self.prometheus_config_path.write_text(
            render_prometheus_config(config, "`warden up`"), encoding="utf-8"
        )
        self.alertmanager_config_path.parent.mkdir(parents=True, exist_ok=True)
        self.alertmanager_config_path.write_text(self.alertmanager_config(), encoding="utf-8")

    def alertmanager_config(self) -> str:
        """The Alertmanager config for this stack: loopback URLs, the run's token file."""
        return render_alertmanager_config(
            self.engine_url + ENGINE_WEBHOOK_PATH,
            str(self.token_path),
            self.pager_url,
            engine_timing=self.settings.engine_timing or ENGINE_TIMING,
            pager_timing=self.settings.pager_timing or PAGER_TIMING,
        )

    def _start_servers(self) -> None:
        s = self.settings
        prometheus = find_binary(PROMETHEUS_BINARIES)
        alertmanager = find_binary(ALERTMANAGER_BINARIES)
        if prometheus is None or alertmanager is None:
            missing = "prometheus" if prometheus is None else "alertmanager"
            raise StackError(
                f"no {missing} binary on PATH (Debian: apt-get install prometheus "
                "prometheus-alertmanager; or run scripts/setup.sh)"
            )
        self._add(
            "alertmanager", self.alertmanager_argv(alertmanager), f"{self.alertmanager_url}/-/ready"
        )
        self._add("prometheus", self.prometheus_argv(prometheus), f"{self.prometheus_url}/-/ready")
        if not s.with_grafana:
            self.grafana_note = "disabled (--no-grafana)"
            return
        install = find_grafana()
        if install is None:
            self.grafana_note = (
                "no grafana-server or grafana binary on PATH; install Grafana to get the "
                "dashboards here, or use the compose stack (compose/)"
            )
            return
        self.grafana_install = install
        grafana_dir = self.workdir / "grafana"
        env = grafana_files(grafana_dir, self.prometheus_url, s.host, s.grafana_port)
        self._add(
            "grafana",
            install.argv(),
            f"http://{s.host}:{s.grafana_port}/api/health",
            env=env,
        )

    def alertmanager_argv(self, binary: str) -> list[str]:
        """Alertmanager on loopback only, one instance (no gossip port)."""
        data = self.alertmanager_config_path.parent / "data"
        return [
            binary,
            f"--config.file={self.alertmanager_config_path}",
            f"--storage.path={data}",
            f"--web.listen-address={ALERTMANAGER_HOST}:{self.settings.alertmanager_port}",
            f"--web.external-url={self.alertmanager_url}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]

    def prometheus_argv(self, binary: str) -> list[str]:
        """Prometheus without --web.enable-lifecycle: an unauthenticated /-/quit would stop
        the closed loop (it still reloads its files on SIGHUP)."""
        data = self.prometheus_config_path.parent / "data"
        return [
            binary,
            f"--config.file={self.prometheus_config_path}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address={self.settings.host}:{self.settings.prometheus_port}",
            f"--web.external-url={self.prometheus_url}",
            "--log.level=warn",
        ]

    def _add(
        self, name: str, argv: list[str], ready_url: str, env: Mapping[str, str] | None = None
    ) -> None:
        child = ChildProcess(
            name, argv, self.logs_dir / f"{name}.log", ready_url, env={**os.environ, **(env or {})}
        )
        self.servers[name] = child
        try:
            child.start()
        except OSError as exc:
            raise ChildStartError(f"{name}: cannot start {argv[0]}: {exc}") from exc


def otlp_environment(endpoint: str) -> dict[str, str]:
    """Standard OpenTelemetry variables for an OTLP/HTTP collector at ``endpoint``."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": OTLP_PROTOCOL,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": OTLP_PROTOCOL,
        "OTEL_SERVICE_NAME": "vllm-warden",
    }
