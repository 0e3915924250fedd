"""``warden demo`` fails in one plain line, exits non-zero, and leaves nothing running.

The first run is the product: a newcomer whose demo cannot finish must read what failed and why
in one line, not a traceback, and find no engine or Prometheus left behind."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from alerts import recording as rec
from warden.cli import demo
from warden.cli.scenario import ScenarioError

REPO_ROOT = Path(__file__).resolve().parents[1]


def _processes_under(workdir: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(str(workdir) in part for part in process.info["cmdline"] or ()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_a_taken_port_is_one_line_and_nothing_runs(tmp_path: Path) -> None:
    """The engine's port is taken: the demo says so in one line before starting anything."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "warden.cli", "demo", "--workdir", str(tmp_path)]
            + ["--port", str(port)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("warden demo: FAILED: the stack did not come up: engine:"), lines
    assert f"127.0.0.1:{port} is in use" in lines[0] and "--engine-port" in lines[0], lines
    assert "Traceback" not in done.stderr + done.stdout
    assert not _processes_under(tmp_path)


def _args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(workdir=str(tmp_path), port=8000)


def test_a_step_that_never_happens_names_step_signal_and_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def play(settings: object, workdir: Path) -> int:
        raise ScenarioError(
            "page",
            "a page of WardenSaturated (critical) at the pager",
            240,
            f"{rec.REJECTED_RATIO} = 0.36",
        )

    monkeypatch.setattr(demo, "_play", play)
    assert demo.run_demo(_args(tmp_path)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "warden demo: FAILED: step 'page' did not happen within 240 s: waited for a page of "
        "WardenSaturated (critical) at the pager; last seen: "
        f"{rec.REJECTED_RATIO} = 0.36; logs: {tmp_path / 'logs'}"
    ]


def test_ctrl_c_is_one_line_and_exit_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def play(settings: object, workdir: Path) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_play", play)
    assert demo.run_demo(_args(tmp_path)) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "warden demo: FAILED: interrupted; everything the demo started is stopped"
    ]


def test_a_defect_is_one_line_with_the_traceback_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def play(settings: object, workdir: Path) -> int:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(demo, "_play", play)
    assert demo.run_demo(_args(tmp_path)) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("warden demo: FAILED: unexpected ZeroDivisionError: division by zero")
    assert "ZeroDivisionError" in (tmp_path / "demo-error.txt").read_text()


def test_a_second_demo_in_the_same_folder_forgets_the_first_runs_state(tmp_path: Path) -> None:
    """The supervisor's restart history, Prometheus's and Alertmanager's data and the pages of
    an earlier run made a second `warden demo` in the same folder fail its checks; the model
    and vLLM's cache stay (slow to make again)."""
    for name in demo.DEMO_RUN_STATE:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if "." in path.name:
            path.write_text("from the first run")
        else:
            (path / "inner").mkdir(parents=True)
    kept = [tmp_path / "tiny-model" / "config.json", tmp_path / "engine" / "vllm-cache" / "x"]
    for path in kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("kept")
    demo.forget_previous_run(tmp_path)
    assert not any((tmp_path / name).exists() for name in demo.DEMO_RUN_STATE)
    assert all(path.exists() for path in kept)
    demo.forget_previous_run(tmp_path / "never-used")  # nothing there: nothing to do
