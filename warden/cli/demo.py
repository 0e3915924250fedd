"""``warden demo``: the main job a newcomer runs first.

Brings the whole stack up natively (``warden up`` on the tiny model: engine with warden,
Prometheus, Alertmanager, the local pager), runs the closed-loop scenario against it, prints
the timeline with each step's latency and the request outcomes, and leaves PNG pictures of the
dashboards drawn from the run's own Prometheus.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from alerts.alertmanager import RouteTiming
from alerts.rules import TRAFFIC
from warden.cli.scenario import ClosedLoopScenario, demo_control_config, metric_names_seen
from warden.stack.config import Intervals
from warden.stack.native import NativeStack, StackSettings

# Fast loop for a demo: 1 s scrapes and rule evaluations, pages within seconds.
DEMO_INTERVALS = Intervals("1s", "1s")
DEMO_PAGER_TIMING = RouteTiming("1s", "5s", "4h")
# The alerts the demo drives (the traffic group: WardenSaturated) hold 30 s at most before
# firing and after clearing (as generated: minutes), so the whole loop, page and resolution
# included, plays out in about three minutes. Other groups keep their generated holds: an
# engine still starting must not page anyone.
DEMO_ALERT_HOLD_CAPS = {TRAFFIC.name: 30}


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
        "engine_env": {"WARDEN_CONFIG": str(config)},
    }
    settings.update(overrides)
    return StackSettings(**settings)  # type: ignore[arg-type]


def run_demo(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir)
    settings = demo_settings(workdir, engine_port=args.port)
    with NativeStack(settings) as stack:
        print(stack.summary())
        stack.wait_for_query("up == 1", timeout_s=120)
        result = ClosedLoopScenario(stack).run()
        print()
        print(result.report())
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
    return 0 if result.passed else 1
