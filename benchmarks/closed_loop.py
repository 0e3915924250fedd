"""Closed-loop reaction times: pressure -> local reflex, and pressure -> webhook lease.

Runs the same scenario as ``warden demo`` (warden/cli/scenario.py) on the native stack with the
tiny model, ``--runs`` times, and reports per run the seconds from the overload's start to each
step of the loop: saturation, the reflex's first refusal, the alert firing, the
Alertmanager-driven lease, the page, and the resolution. Bounded: each run stops its stack; a step
that never happens fails the run. tests/test_closed_loop_e2e.py checks that ``STEPS`` are steps
the scenario records, so this command cannot go stale.

    .venv/bin/python -m benchmarks.closed_loop --runs 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from warden.cli.demo import demo_settings
from warden.cli.scenario import ClosedLoopScenario
from warden.stack.native import NativeStack

STEPS = (
    "saturated",
    "local reflex",
    "alert firing",
    "webhook lease active",
    "page recorded",
    "resolved",
)


def one_run(workdir: Path) -> dict[str, float]:
    settings = demo_settings(workdir, with_grafana=False)
    with NativeStack(settings, out=lambda _: None) as stack:
        stack.wait_for_query("up == 1", timeout_s=120)
        result = ClosedLoopScenario(stack, out=lambda _: None).run()
    if not result.passed:
        raise SystemExit("scenario failed:\n" + result.report())
    return {name: result.step(name).at for name in STEPS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    runs = []
    for index in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="warden-closed-loop-") as tmp:
            runs.append(one_run(Path(tmp)))
        print(f"run {index + 1}: " + ", ".join(f"{k} {v:.1f}s" for k, v in runs[-1].items()))
    print("\nmedian seconds after pressure started (scrape 1s, evaluation 1s):")
    for name in STEPS:
        print(f"  {name:<22} {statistics.median(r[name] for r in runs):7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
