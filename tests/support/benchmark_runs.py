"""Running a benchmark command as a person would, for the smoke tests of every benchmark
(tests/test_benchmarks_smoke.py, tests/test_benchmarks_offline_smoke.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def result(path: Path) -> dict:
    data = json.loads(path.read_text())
    assert isinstance(data, dict) and data, data
    return data
