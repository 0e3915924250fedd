"""``warden serve``'s supervisor: keeps one vLLM server serving, or says loudly why it cannot.

It starts vLLM (``LaunchSpec``, all warden hooks), waits until it is ready, then watches it:
the process tree (a vanished engine core is a crash), ``/warden/ready`` (stalled, engine dead,
driver error), the engine's policy (``enforce_eager``) and, with ``--enable-fault-tolerance``,
vLLM's fault tolerance status. A failure is answered with a restart after a backoff; planned
restarts (eager switch, manual) drain first. More restarts than the limit within the window open
a circuit: no more restarts, readiness false, a log line and a metric, so a person is paged
instead of a restart loop running. Restart history and the circuit live in a state file that
every engine mirrors into its metrics (see ``exporter.supervisor_state``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from exporter.settings import load_settings
from exporter.supervisor_state import (
    STATE_ENV_VAR,
    STATE_FILE,
    Phase,
    RestartEvent,
    SupervisorState,
)
from warden.common import tokens
from warden.engine.launch import LaunchSpec
from warden.supervisor import fault_tolerance as ft
from warden.supervisor import first_start
from warden.supervisor.config import SupervisorConfig
from warden.supervisor.cpu_memory import is_cpu_build
from warden.supervisor.drain import Drainer
from warden.supervisor.engine import EngineProcess
from warden.supervisor.http import HttpServer
from warden.supervisor.memory_guard import MemoryGuard, engine_signals
from warden.supervisor.policy import (
    ENFORCE_EAGER,
    MANUAL,
    MEMORY,
    UNCOUNTED_REASONS,
    UNHEALTHY,
    RestartWindow,
    classify_exit,
    describe_returncode,
)
from warden.supervisor.probes import (
    Failure,
    ProbeTimers,
    engine_state,
    evaluate,
    last_words,
    policy_wants_eager,
)

log = logging.getLogger("warden.supervisor")
EAGER_FLAG = "--enforce-eager"
STOPPING = "stop"  # the drain before the supervisor stops (not a restart reason)
# How long a server whose engine process vanished is given to exit by itself before the
# vanishing is judged a crash under it (``classify_exit``). A self-inflicted exit takes
# milliseconds after its children on an idle host, but a second and more on a loaded one
# (a 1 s grace called a server's own exit 3 a crash under CI load); vLLM's own shutdown
# after a dead engine core exits 0, a crash whenever it comes. Waiting longer only delays
# the restart of a server that stays up without its engine core.
OWN_EXIT_GRACE_S = 5.0


EngineFactory = Callable[[LaunchSpec, Path | None], EngineProcess]
CONTROL_TOKEN_FILE = "control-token"  # generated here when no token is configured


class Supervisor:
    def __init__(
        self,
        spec: LaunchSpec,
        run_dir: Path,
        config: SupervisorConfig | None = None,
        engine_factory: EngineFactory = EngineProcess,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config or SupervisorConfig()
        self.run_dir = run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.spec = dataclasses.replace(spec, run_dir=run_dir)
        self.state_path = run_dir / STATE_FILE
        self.engine_factory = engine_factory
        self.clock = clock
        self.state = SupervisorState.load(self.state_path)
        self.window = RestartWindow(
            self.config.max_restarts, self.config.restart_window_s, list(self.state.window)
        )
        self.token = self._control_token()
        self.drainer = Drainer(self.token, self.config.drain_timeout_s)
        self.fault_tolerance = ft.fault_tolerance_enabled(spec.extra_args)
        self.memory = MemoryGuard(
            self.config.memory_restart_risk,
            self.config.memory_early_restart_risk,
            self.config.memory_remember_s,
            cpu_engine=is_cpu_build({**os.environ, **spec.env}),
            eager_allowed=self.config.eager_fallback and EAGER_FLAG not in spec.extra_args,
        )
        self.engine: EngineProcess | None = None
        self.control: HttpServer | None = None
        self._ready = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._hurry = threading.Event()  # a second stop signal: do not wait for the drain
        self._wake = threading.Event()
        self._requests: queue.SimpleQueue[str] = queue.SimpleQueue()

    def _control_token(self) -> str:
        """The token that guards this supervisor's control port and the engine's control
        routes (the drain lease) alike. Closed by default: with none configured, one is
        generated into the run directory (0600) and given to the engine too, unless the engine
        was told to run its routes without one. An unreadable token file stops the supervisor
        here (TokenError), never opens it."""
        settings = load_settings({**os.environ, **self.spec.env})
        token, generated = tokens.load_or_generate(settings, self.run_dir / CONTROL_TOKEN_FILE)
        if generated is not None:
            log.warning(
                "supervisor: no %s or %s set; generated a control token in %s (mode 0600): "
                "the control port and the engine's /warden routes require it",
                tokens.TOKEN_FILE_ENV,
                tokens.TOKEN_ENV,
                generated,
            )
            if not settings.webhook_insecure:
                env = {**self.spec.env, tokens.TOKEN_FILE_ENV: str(generated)}
                self.spec = dataclasses.replace(self.spec, env=env)
        return token

    # --- the control surface (HTTP thread, signal handlers) ---------------------------

    def status(self) -> dict[str, Any]:
        with self._lock:
            data = self.state.to_json()
        data["engine_ready"] = self._ready
        data["serving_url"] = f"http://{self.spec.host}:{self.spec.port}"
        data["state_file"] = str(self.state_path)
        data["restart_limit"] = {
            "max_restarts": self.window.limit,
            "window_s": self.window.window_s,
        }
        return data

    def state_snapshot(self) -> SupervisorState:
        with self._lock:
            return SupervisorState.from_json(self.state.to_json())

    def engine_ready(self) -> bool:
        return self._ready

    def request(self, action: str) -> str:
        self._requests.put(action)
        self._wake.set()
        return "queued"

    def stop(self) -> None:
        """Drain the engine, stop it and return from ``run``; called again, skip the rest of
        the drain."""
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT drain the engine, stop it and the supervisor (a second one skips
        the rest of the drain); SIGHUP restarts the engine."""

        def on_stop(signum: int, _frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if self._stop.is_set():
                log.warning("supervisor: %s received again, not waiting for the drain", name)
            else:
                log.info("supervisor: %s received, draining and stopping", name)
            self.stop()

        def on_hup(_signum: int, _frame: FrameType | None) -> None:
            self.request("restart")

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)

    # --- run ----------------------------------------------------------------------------

    def run(self) -> int:
        self._prepare()
        if self.config.control_port is not None:
            self.control = HttpServer(
                self.config.control_host, self.config.control_port, self, stand_in=False
            )
            log.info(
                "supervisor: control on http://%s:%d/supervisor/state",
                self.config.control_host,
                self.control.port,
            )
        status = 0
        try:
            status = self._loop()
        finally:
            engine = self.engine
            serving = self._ready and engine is not None and engine.returncode() is None
            if serving and engine is not None and self.config.drain_on_stop:
                self._drain(engine, Failure(STOPPING, "supervisor stopping", self.clock()))
            self._ready = False
            if engine is not None:
                engine.stop(self.config.stop_timeout_s)
                engine.close()
            with self._lock:
                self.state.phase = Phase.STOPPED
                self.state.draining = False
                self.state.engine_pid = None
                self._save()
            if self.control is not None:
                self.control.close()
        return status

    def _prepare(self) -> None:
        with self._lock:
            if self.config.reset_circuit and self.state.circuit_open:
                log.warning("supervisor: restart circuit closed by --reset-circuit")
                self.state.close_circuit()
                self.window.history = []
            if (self.config.clear_eager or not self.config.eager_fallback) and self.state.eager:
                log.warning("supervisor: leaving eager mode (--clear-eager/--no-eager-fallback)")
                self.state.set_eager(False, "", self.clock())
            self.state.draining = False
            self.state.memory_restart_risk = self.memory.thresholds(self.state, self.clock())
            self._save()

    def _save(self) -> None:
        with self._lock:
            self.state.window = list(self.window.history)
            self.state.save(self.state_path)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _loop(self) -> int:
        """Keep vLLM serving until stopped; the exit status of ``warden serve``."""
        next_start: Failure | None = None  # why the coming start is a restart
        down_since: float | None = None  # when the engine last stopped serving
        ready_at: float | None = None
        attempt = 0  # consecutive unplanned failures (backoff)
        ever_ready = False  # some engine of this supervisor process was ready
        if self.state.circuit_open and not self._hold_circuit_open():
            return 0
        while not self._stop.is_set():
            event = self._record_restart(next_start) if next_start is not None else None
            engine = self._start_engine()
            failure = self._wait_ready(engine)
            if self._stop.is_set():
                return 0
            if failure is None:
                ever_ready = True
                ready_at = self.clock()
                self._on_ready(engine, event, down_since, ready_at)
                down_since = None
                failure = self._watch_until_restart(engine)
                if failure is None:
                    return 0
            elif next_start is None and not ever_ready and engine.returncode() is not None:
                return self._refuse_failed_first_start(engine)
            self._ready = False
            self._take_down(engine, failure)
            if down_since is None:
                down_since = failure.at
            if not failure.planned:
                # Only an engine that served long enough ends the episode; failed starts
                # after it keep backing off.
                if ready_at is not None and failure.at - ready_at >= self.config.backoff.stable_s:
                    attempt = 0
                attempt += 1
            ready_at = None
            counted = failure.reason not in UNCOUNTED_REASONS
            if self.state.circuit_open or (counted and not self.window.allows(self.clock())):
                self._open_circuit(failure)
                if not self._hold_circuit_open():
                    return 0
                next_start = Failure(MANUAL, "restart circuit reset by an operator", self.clock())
                down_since, attempt = self.clock(), 0
                continue
            delay = 0.0 if failure.planned else self.config.backoff.delay(attempt)
            if delay > 0:
                log.warning("supervisor: waiting %.1fs before restart (attempt %d)", delay, attempt)
                with self._lock:
                    self.state.phase = Phase.BACKOFF
                    self._save()
                self._sleep(delay)
            next_start = failure
        return 0

    def _refuse_failed_first_start(self, engine: EngineProcess) -> int:
        """vLLM exited on the first start, before it was ever ready: a deterministic failure
        (bad flag, missing model, not enough memory) that restarts would only repeat. Stop and
        say why, with vLLM's own error line and a hint."""
        engine.kill()  # anything of its tree still running
        if engine.tail is not None:
            engine.tail.wait_closed(5.0)  # its last lines are still in the pipe
        where = (
            f"Full output: {engine.log_path}"
            if engine.log_path is not None
            else "Full output: above."
        )
        exit_detail = describe_returncode(engine.returncode())
        message = first_start.explain(engine.output_lines(), exit_detail, where)
        engine.close()
        log.critical("supervisor: %s", message)
        with self._lock:
            self.state.engine_pid = None
            self._save()
        return first_start.EXIT_FIRST_START_FAILED

    # --- steps ----------------------------------------------------------------------------

    def _record_restart(self, failure: Failure) -> RestartEvent:
        now = self.clock()
        with self._lock:
            event = self.state.record_restart(failure.reason, failure.at, now, failure.detail)
            if failure.reason not in UNCOUNTED_REASONS:
                self.window.record(now)
            self._save()
        log.warning(
            "supervisor: restarting vLLM, reason=%s (%s); %s",
            failure.reason,
            failure.detail,
            self.window.explain(now),
        )
        return event

    def _start_engine(self) -> EngineProcess:
        args = list(self.spec.extra_args)
        if self.state.eager and EAGER_FLAG not in args:
            args.append(EAGER_FLAG)
        spec = dataclasses.replace(
            self.spec, extra_args=args, env={**self.spec.env, STATE_ENV_VAR: str(self.state_path)}
        )
        with self._lock:
            self.state.generation += 1
            generation = self.state.generation
            log_dir = self.config.log_dir
            log_path = log_dir / f"engine-{generation}.log" if log_dir is not None else None
            engine = self.engine_factory(spec, log_path)
            engine.start()
            self.engine = engine
            self.state.engine_pid = engine.pid
            self.state.phase = Phase.STARTING
            self._save()
        log.info(
            "supervisor: started vLLM generation %d (pid %s%s%s)",
            generation,
            engine.pid,
            ", eager" if EAGER_FLAG in args else "",
            f", log {log_path}" if log_path else "",
        )
        return engine

    def _wait_ready(self, engine: EngineProcess) -> Failure | None:
        started = self.clock()
        while not self._stop.is_set():
            self._handle_requests(engine_running=False)
            returncode = engine.returncode()
            if returncode is not None:
                reason = classify_exit(returncode, engine.vanished_children())
                return Failure(
                    reason,
                    f"vLLM {describe_returncode(returncode)} before it was ready",
                    self.clock(),
                )
            engine.refresh_children()
            if engine.get("/health").status == 200:
                return None
            if self.clock() - started > self.config.start_timeout_s:
                return Failure(
                    UNHEALTHY,
                    f"not ready after {self.config.start_timeout_s:.0f}s",
                    self.clock(),
                )
            self._sleep(self.config.poll_s)
        return None

    def _on_ready(
        self,
        engine: EngineProcess,
        event: RestartEvent | None,
        down_since: float | None,
        now: float,
    ) -> None:
        engine.refresh_children()
        with self._lock:
            if event is not None and down_since is not None:
                self.state.record_ready(event, down_since, now)
            self.state.phase = Phase.RUNNING
            self._save()
        self._ready = True
        took = f" {event.duration_s:.1f}s after the failure" if event and event.duration_s else ""
        log.info(
            "supervisor: vLLM ready (generation %d, pid %s, children %s)%s",
            self.state.generation,
            engine.pid,
            sorted(engine.children.values()),
            took,
        )

    def _watch_until_restart(self, engine: EngineProcess) -> Failure | None:
        """Watch a ready engine; a planned restart the circuit forbids keeps it running."""
        while True:
            failure = self._watch(engine)
            if failure is None:
                return None
            counted = failure.reason not in UNCOUNTED_REASONS
            if failure.planned and counted and not self.window.allows(self.clock()):
                self._open_circuit(failure, engine_kept=True)
                continue
            return failure

    def _watch(self, engine: EngineProcess) -> Failure | None:
        timers = ProbeTimers()
        next_probe = next_policy = next_children = 0.0
        while not self._stop.is_set():
            now = self.clock()
            planned = self._handle_requests(engine_running=True)
            if planned is not None:
                return planned
            returncode = engine.returncode()
            vanished = engine.vanished_children()
            if vanished and returncode is None:
                # A server shutting itself down takes its engine processes down first: its
                # exit code, a moment later, says whether the failure was its own.
                returncode = engine.returncode_within(OWN_EXIT_GRACE_S)
                # Named as they are after the wait: an engine core that failed takes its
                # worker down before it exits itself, and the first look saw only the worker.
                vanished = engine.vanished_children() or vanished
            if returncode is not None or vanished:
                detail = f"vLLM server {describe_returncode(returncode)}"
                if vanished and returncode is None:
                    detail = f"{', '.join(vanished)} vanished under the running vLLM server"
                    detail += last_words(engine)  # e.g. the engine error class that killed it
                elif vanished:
                    detail = f"{', '.join(vanished)} vanished; {detail}"
                return Failure(classify_exit(returncode, vanished), detail, now)
            if now >= next_children:
                engine.refresh_children()
                next_children = now + self.config.children_poll_s
            if now >= next_probe:
                next_probe = now + self.config.probe_s
                failure = self._probe(engine, timers, now)
                if failure is not None:
                    return failure
            if now >= next_policy:
                next_policy = now + self.config.policy_poll_s
                state = engine_state(engine)
                if self._may_switch_to_eager() and policy_wants_eager(state):
                    return Failure(ENFORCE_EAGER, "engine policy enforce_eager", now, planned=True)
                if not self.state.circuit_open:
                    with self._lock:
                        memory = self.memory.check(engine_signals(state), self.state, now)
                    if memory is not None:
                        return memory
            self._wake.wait(self.config.poll_s)
            self._wake.clear()
        return None

    def _may_switch_to_eager(self) -> bool:
        return (
            self.config.eager_fallback
            and not self.state.eager
            and not self.state.circuit_open
            and EAGER_FLAG not in self.spec.extra_args
        )

    def _probe(self, engine: EngineProcess, timers: ProbeTimers, now: float) -> Failure | None:
        if self.fault_tolerance:
            status = ft.engine_status(engine)
            if status == ft.DEAD:
                return Failure(UNHEALTHY, "fault tolerance: engine reported dead", now)
            if status == ft.UNHEALTHY:
                recovered, detail = self._recover_in_place(engine)
                if not recovered:
                    return Failure(UNHEALTHY, f"fault tolerance: {detail}", self.clock())
                return None
        return evaluate(engine, timers, self.clock, self.config)

    def _recover_in_place(self, engine: EngineProcess) -> tuple[bool, str]:
        """vLLM fault tolerance: a retry instruction, under the same restart circuit."""
        failed_at = self.clock()
        if self.state.circuit_open:
            return True, "circuit open: no retry"
        if not self.window.allows(failed_at):
            self._open_circuit(Failure(UNHEALTHY, "fault tolerance retry", failed_at), True)
            return True, "circuit opened"
        event = self._record_restart(
            Failure(UNHEALTHY, "fault tolerance: in-place retry", failed_at)
        )
        recovered, detail = ft.retry(engine, self.config.ft_recovery_timeout_s)
        if recovered:
            with self._lock:
                self.state.record_ready(event, failed_at, self.clock())
                self._save()
            log.info("supervisor: engine %s", detail)
        return recovered, detail

    def _handle_requests(self, engine_running: bool) -> Failure | None:
        """Apply queued operator requests; return a planned restart if one was asked for."""
        planned: Failure | None = None
        while True:
            try:
                action = self._requests.get_nowait()
            except queue.Empty:
                return planned
            now = self.clock()
            if action == "reset":
                self._close_circuit("operator request")
            elif action == "clear_eager":
                with self._lock:
                    self.state.set_eager(False, "", now)
                    self._save()
                log.warning("supervisor: eager mode cleared; the next start captures graphs")
            elif action == "clear_memory":
                with self._lock:
                    left_eager = self.memory.forget(self.state, now)
                    self._save()
                log.warning(
                    "supervisor: memory creeps forgotten: restarting at risk %.2f again%s",
                    self.memory.restart_risk,
                    "; eager mode set for the creep left at the next start" if left_eager else "",
                )
            elif action == "restart" and engine_running:
                planned = Failure(MANUAL, "operator request", now, planned=True)
            elif action == "eager" and engine_running and not self.state.eager:
                planned = Failure(ENFORCE_EAGER, "operator request", now, planned=True)

    def _take_down(self, engine: EngineProcess, failure: Failure) -> None:
        log.error(
            "supervisor: vLLM generation %d down, reason=%s: %s",
            self.state.generation,
            failure.reason,
            failure.detail,
        )
        if failure.reason == ENFORCE_EAGER:
            # Decided before the drain: memory is creeping, and whatever ends this engine (the
            # drain, a crash meanwhile, a supervisor restart) the next start is eager.
            with self._lock:
                self.state.set_eager(True, failure.detail, self.clock())
                self._save()
        elif failure.reason == MEMORY:
            # Remembered before the drain too: the creep's record must survive whatever ends
            # this engine; a creep that came back makes the next start eager (on a GPU).
            with self._lock:
                if self.memory.learn(self.state, failure, self.clock()):
                    self.state.set_eager(True, self.memory.eager_reason(failure), self.clock())
                self._save()
            log.warning("supervisor: %s", self.state.memory_remediation)
        if failure.planned and engine.returncode() is None:
            self._drain(engine, failure)
            engine.stop(self.config.stop_timeout_s)
        else:
            engine.kill()
        engine.close()
        with self._lock:
            self.state.draining = False
            self.state.phase = Phase.RESTARTING
            self.state.engine_pid = None
            self._save()

    def _drain(self, engine: EngineProcess, failure: Failure) -> None:
        with self._lock:
            self.state.draining = True
            self.state.phase = Phase.DRAINING
            self._save()
        # A drain for a restart ends early on a stop; the stop's own drain on a second signal.
        cancelled = self._hurry.is_set if failure.reason == STOPPING else self._stop.is_set
        result = self.drainer.drain(engine, cancelled)
        log.warning(
            "supervisor: drained for %s in %.1fs: admission stopped=%s (%s), %s in flight left",
            failure.reason,
            result.waited_s,
            result.admission_stopped,
            result.detail,
            result.left_inflight,
        )

    def _open_circuit(self, failure: Failure, engine_kept: bool = False) -> None:
        now = self.clock()
        reason = f"{self.window.explain(now)}; last failure: {failure.reason} ({failure.detail})"
        with self._lock:
            already = self.state.circuit_open
            if not already:
                self.state.open_circuit(reason, now)
            self.state.phase = Phase.RUNNING if engine_kept else Phase.CIRCUIT_OPEN
            self._save()
        if not already:
            log.critical(
                "supervisor: RESTART CIRCUIT OPEN - %s. Not restarting; readiness is false "
                "until an operator resets it (POST /supervisor/reset, or warden serve "
                "--reset-circuit). %s",
                reason,
                "The running engine is kept." if engine_kept else "The engine stays down.",
            )

    def _close_circuit(self, why: str) -> None:
        with self._lock:
            if not self.state.circuit_open:
                return
            self.state.close_circuit()
            self.window.history = []
            if self._ready:
                self.state.phase = Phase.RUNNING
            self._save()
        log.warning("supervisor: restart circuit closed (%s)", why)

    def _hold_circuit_open(self) -> bool:
        """Stay down with the circuit open; True once an operator resets it, False on stop."""
        log.critical(
            "supervisor: engine down with the restart circuit open (%s); answering the "
            "serving port with 503 until an operator resets it",
            self.state.circuit_reason,
        )
        with self._lock:
            self.state.phase = Phase.CIRCUIT_OPEN
            self.state.engine_pid = None
            self._save()
        stand_in: HttpServer | None = None
        try:
            stand_in = HttpServer(self.spec.host, self.spec.port, self, stand_in=True)
        except OSError as exc:
            log.warning("supervisor: no stand-in on the serving port: %s", exc)
        try:
            while not self._stop.is_set():
                self._handle_requests(engine_running=False)
                if not self.state.circuit_open:
                    return True
                self._wake.wait(self.config.poll_s)
                self._wake.clear()
            return False
        finally:
            if stand_in is not None:
                stand_in.close()
