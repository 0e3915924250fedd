"""The supervisor's settings: the single source of their defaults, help texts and CLI flags.

``warden serve`` builds its supervisor options from these fields (``add_arguments``) and reads
them back (``from_args``), so a default changed here is the default everywhere. Fields without
a ``flag`` are internal cadences that tests shorten and operators have no reason to touch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warden.supervisor.engine import PROBE_TIMEOUT_S
from warden.supervisor.policy import Backoff


def _option(default: Any, help: str, flag: str | None = None, **extra: Any) -> Any:
    """A field with its CLI flag (``--name-with-dashes`` unless given) and help text."""
    return field(default=default, metadata={"help": help, "flag": flag, **extra})


def _internal(default: Any) -> Any:
    return field(default=default, metadata={"flag": None})


def _bounded(kind: type, minimum: float, maximum: float | None) -> Any:
    """An argparse type: a finite ``kind`` within bounds, else a clear usage error (a negative
    grace or a NaN backoff would make the supervisor restart at once, or never)."""

    def parse(text: str) -> Any:
        try:
            number = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(number) or number < minimum:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {minimum:g}: {text}")
        if maximum is not None and number > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}: {text}")
        return number

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


@dataclass(frozen=True)
class SupervisorConfig:
    max_restarts: int = _option(5, "restarts allowed per window; one more opens the circuit")
    restart_window_s: float = _option(3600.0, "the restart-limit window, seconds")
    backoff_base_s: float = _option(1.0, "wait before the 2nd consecutive restart (doubles)")
    backoff_max_s: float = _option(60.0, "longest wait between restarts")
    backoff_reset_s: float = _option(600.0, "ready this long: the next failure restarts at once")
    stall_grace_s: float = _option(3.0, "engine stalled this long: restart")
    unhealthy_grace_s: float = _option(
        15.0, "engine dead, or its port refusing connections, this long: restart"
    )
    unresponsive_grace_s: float = _option(
        45.0,
        f"engine taking connections but answering no probe within {PROBE_TIMEOUT_S:.0f} s "
        "this long (slow, not gone): restart",
    )
    start_timeout_s: float = _option(900.0, "not ready this long after a start: restart")
    drain_timeout_s: float = _option(120.0, "longest wait for in-flight requests on a drain")
    drain_on_stop: bool = _option(
        True,
        "on SIGTERM/SIGINT stop vLLM at once, without draining in-flight requests first",
        flag="--no-drain-on-stop",
        invert=True,
    )
    eager_fallback: bool = _option(
        True,
        "never restart with --enforce-eager (and leave eager mode kept from before)",
        flag="--no-eager-fallback",
        invert=True,
    )
    clear_eager: bool = _option(False, "leave eager mode kept from an earlier run")
    memory_restart_risk: float = _option(
        0.9,
        "drain and restart the engine when a memory risk (beyond its plan; 1 = out of memory) "
        "reaches this",
        minimum=0.05,
        maximum=1.0,
    )
    memory_early_restart_risk: float = _option(
        0.6,
        "the same, while a memory creep that made it restart before is remembered",
        minimum=0.05,
        maximum=1.0,
    )
    memory_remember_s: float = _option(86400.0, "how long such a memory creep is remembered")
    reset_circuit: bool = _option(False, "close a restart circuit left open by an earlier run")
    control_host: str = _option("127.0.0.1", "supervisor control port address", "--supervisor-host")
    control_port: int | None = _option(
        8001,
        "supervisor control/liveness port (0: any free port, -1: none)",
        "--supervisor-port",
        minimum=-1,
        maximum=65535,
    )
    log_dir: Path | None = _option(
        None, "write each vLLM start's output to a file here", "--engine-log-dir"
    )
    # Internal cadences (tests shorten them).
    poll_s: float = _internal(0.5)
    probe_s: float = _internal(1.0)
    children_poll_s: float = _internal(1.0)
    policy_poll_s: float = _internal(2.0)
    stop_timeout_s: float = _internal(30.0)
    ft_recovery_timeout_s: float = _internal(60.0)

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.backoff_base_s, self.backoff_max_s, self.backoff_reset_s)

    # --- the command line -----------------------------------------------------------------

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add one option per settable field, with this class's default and help."""
        for f in dataclasses.fields(cls):
            if "help" not in f.metadata:
                continue
            flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
            if f.type in ("bool", bool):
                action = "store_false" if f.metadata.get("invert") else "store_true"
                parser.add_argument(flag, dest=f.name, action=action, help=f.metadata["help"])
                parser.set_defaults(**{f.name: f.default})
                continue
            kind: Any = str if f.name in ("control_host", "log_dir") else None
            if kind is None:
                number = int if isinstance(f.default, int) else float
                kind = _bounded(number, f.metadata.get("minimum", 0), f.metadata.get("maximum"))
            parser.add_argument(
                flag,
                dest=f.name,
                type=kind,
                default=f.default,
                help=f"{f.metadata['help']} (default {f.default})",
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SupervisorConfig:
        values = {
            f.name: getattr(args, f.name)
            for f in dataclasses.fields(cls)
            if "help" in f.metadata and hasattr(args, f.name)
        }
        if values.get("control_port") is not None and values["control_port"] < 0:
            values["control_port"] = None
        if values.get("log_dir") is not None:
            values["log_dir"] = Path(values["log_dir"])
        return cls(**values)
