"""``warden demo``: the main job a newcomer runs first.

Brings the whole stack up natively (``warden up`` on the tiny model: engine with warden,
Prometheus, Alertmanager, the local pager), runs the closed-loop scenario against it, prints
the timeline with each step's latency and the request outcomes, and leaves PNG pictures of the
dashboards drawn from the run's own Prometheus.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import traceback
from pathlib import Path

import yaml

from alerts.alertmanager import RouteTiming
from alerts.rules import CREEP, TRAFFIC
from exporter.supervisor_state import STATE_FILE
from warden.cli.creep_scenario import STEPS as CREEP_STEPS
from warden.cli.creep_scenario import CreepResult, CreepScenario
from warden.cli.scenario import (
    DEMO_BATCH,
    ClosedLoopScenario,
    ScenarioError,
    demo_control_config,
    metric_names_seen,
)
from warden.common.outcomes import FAILED
from warden.common.tinymodel import tiny_engine_args
from warden.common.waiting import WaitAborted
from warden.stack.config import Intervals
from warden.stack.native import NativeStack, StackError, StackSettings

# Fast loop for a demo: 1 s scrapes and rule evaluations, pages within seconds.
DEMO_INTERVALS = Intervals("1s", "1s")
DEMO_PAGER_TIMING = RouteTiming("1s", "5s", "4h")
# The alerts the demo drives (the traffic group: WardenSaturated) hold 5 s at most before
# firing and after clearing (as generated: minutes), so the whole loop, page and resolution
# included, plays out in under two minutes. Other groups keep their generated holds: an
# engine still starting must not page anyone.
DEMO_ALERT_HOLD_CAPS = {TRAFFIC.name: 5, CREEP.name: 5}
# The second act, memory creep: the engine core's host memory grows (test switch) until it would
# reach a limit declared as its settled footprint plus DEMO_HEADROOM_BYTES, in DEMO_CREEP_S. The
# memory plan settles within DEMO_SETTLE_S, long before the first act ends.
DEMO_HEADROOM_BYTES = 1_200_000_000
DEMO_CREEP_S = 65.0
DEMO_SETTLE_S = 25
DEMO_MEMORY_ENV = {
    "WARDEN_TEST_MEMORY_CREEP": "1",
    "WARDEN_HOST_MEMORY_HEADROOM_BYTES": str(DEMO_HEADROOM_BYTES),
    "WARDEN_MEMORY_SETTLE_S": str(DEMO_SETTLE_S),
    "WARDEN_HOST_MEMORY_INTERVAL_S": "1",
}
# The demo's engine: a batch of DEMO_BATCH and a KV cache that holds all of it (48 blocks of 32
# tokens), so the queue users wait in is the one admission limits, and a full batch is the
# capacity the scenario measures.
DEMO_ENGINE_ARGS = tiny_engine_args(
    "--max-model-len", "256", "--max-num-seqs", str(DEMO_BATCH), "--num-gpu-blocks-override", "48"
)


# What one demo run leaves in its folder that the next run must not read as its own: the
# supervisor's restart history (its memory guard acts earlier on a creep it has seen before),
# Prometheus's and Alertmanager's data (series, notification log, silences), the pages, the
# pictures and the logs. The tiny model and vLLM's cache are kept: only slow to make again.
DEMO_RUN_STATE = (
    f"engine/{STATE_FILE}",
    "prometheus/data",
    "alertmanager/data",
    "pages.jsonl",
    "dashboards",
    "logs",
    "demo-error.txt",
)


def forget_previous_run(workdir: Path) -> None:
    """Each `warden demo` is one run of the show, whatever ran in the folder before."""
    for name in DEMO_RUN_STATE:
        path = workdir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def demo_settings(workdir: Path, **overrides: object) -> StackSettings:
    """The demo's stack: fast intervals and the control config the scenario's overload breaks
    (written to ``workdir/warden.yaml``, handed to the engine as WARDEN_CONFIG)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "warden.yaml"
    config.write_text(yaml.safe_dump(demo_control_config()), encoding="utf-8")
    settings: dict[str, object] = {
        "workdir": workdir,
        "intervals": DEMO_INTERVALS,
        "pager_timing": DEMO_PAGER_TIMING,
        "alert_hold_caps": DEMO_ALERT_HOLD_CAPS,
        "engine_env": {"WARDEN_CONFIG": str(config), **DEMO_MEMORY_ENV},
        "engine_args": DEMO_ENGINE_ARGS,
    }
    settings.update(overrides)
    return StackSettings(**settings)  # type: ignore[arg-type]


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; any failure is one line on stderr (what, why, where the logs are) and a
    non-zero exit, with everything the demo started stopped by the stack's ``with``."""
    workdir = Path(args.workdir)
    forget_previous_run(workdir)
    settings = demo_settings(workdir, engine_port=args.port)
    logs = workdir / "logs"
    try:
        return _play(settings, workdir)
    except ScenarioError as exc:
        _fail(f"{exc}; logs: {logs}")
    except (StackError, TimeoutError, WaitAborted) as exc:
        _fail(f"the stack did not come up: {exc}; logs: {logs}")
    except KeyboardInterrupt:
        _fail("interrupted; everything the demo started is stopped")
        return 130
    except Exception as exc:  # a defect: still one line, the traceback kept in a file
        workdir.mkdir(parents=True, exist_ok=True)
        report = workdir / "demo-error.txt"
        report.write_text(traceback.format_exc(), encoding="utf-8")
        _fail(f"unexpected {type(exc).__name__}: {exc}; traceback in {report}; logs: {logs}")
    return 1


def _fail(line: str) -> None:
    print(f"warden demo: FAILED: {line}", file=sys.stderr, flush=True)


def _play(settings: StackSettings, workdir: Path) -> int:
    with NativeStack(settings) as stack:
        print(stack.summary())
        stack.wait_for_query("up == 1", timeout_s=120)
        print("\nfirst act: overload")
        result = ClosedLoopScenario(stack).run()
        print()
        print(result.report())
        print("\nsecond act: memory creep (the engine core's host memory grows until it would hit")
        print(f"a limit {DEMO_HEADROOM_BYTES / 1e9:.1f} GB above its settled footprint)")
        creep = CreepScenario(stack, reach_limit_s=DEMO_CREEP_S).run()
        print()
        print(creep.report())
        print(_creep_trace(creep))
        seen = metric_names_seen(stack)
        print(f"\n{len(seen)} warden metrics scraped by Prometheus from the engine")
        from dashboards.render import RenderUnavailable, render_dashboards

        try:
            pictures = render_dashboards(stack.prometheus_url, workdir / "dashboards", minutes=10)
        except RenderUnavailable as exc:
            print(f"dashboards not drawn: {exc}")
        else:
            print("dashboards drawn from this run:")
            for picture in pictures:
                print(f"  {picture}")
    failed = [name for name, ok in result.checks.items() if not ok]
    if not creep.passed:
        failed.append("memory creep: " + _creep_problem(creep))
    if failed:
        _fail(f"checks failed: {'; '.join(failed)}; logs: {workdir / 'logs'}")
        return 1
    print("warden demo: passed; everything it started is stopped")
    return 0


def _creep_trace(creep: CreepResult, every_s: float = 10.0) -> str:
    """The host memory risk and WardenTimeToOOM's estimate as they moved, every ``every_s``."""
    lines = ["memory risk and time-to-OOM estimate (seconds since the creep was injected):"]
    next_at = 0.0
    for at, risk, estimate in creep.trace:
        if at < next_at:
            continue
        next_at = at + every_s
        risk_text = "-" if risk is None else f"{risk:.2f}"
        estimate_text = "not firing" if estimate is None else f"{estimate:.0f} s left"
        lines.append(f"  {at:6.1f}s  risk {risk_text:>5}  time-to-OOM {estimate_text}")
    return "\n".join(lines)


def _creep_problem(creep: CreepResult) -> str:
    missing = [name for name in CREEP_STEPS if creep.step(name) is None]
    if missing:
        return f"never saw {', '.join(missing)}"
    if not creep.in_order:
        return "steps out of order"
    if creep.outcomes.counts[FAILED]:
        return f"{creep.outcomes.counts[FAILED]} requests failed"
    peak, limit = creep.peak_used_bytes / 1e9, creep.limit_bytes / 1e9
    return f"host memory peaked at {peak:.2f} of {limit:.2f} GB"
