"""Pieces of the native stack that need no server: pager, token, configs, Grafana, arguments."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from alerts.config import ENGINE_JOB
from dashboards.datasource import DATASOURCE_UID
from warden.common.ports import free_port
from warden.common.tinymodel import TINY_BASE_ARGS, TINY_ENGINE_ARGS, tiny_engine_args
from warden.stack import grafana, up
from warden.stack.config import Intervals, prometheus_config
from warden.stack.native import NativeStack, StackError, StackSettings, ensure_port_free
from warden.stack.pager import PagerServer, describe, read_pages
from warden.stack.webhook_token import read_token, write_token

FIRING = {
    "version": "4",
    "receiver": "pager",
    "status": "firing",
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "WardenEngineDown", "severity": "critical", "instance": "e:1"},
            "annotations": {"summary": "Prometheus cannot scrape the engine."},
            "startsAt": "2025-01-01T00:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": "abc",
        }
    ],
    "groupKey": '{}:{alertname="WardenEngineDown"}',
}


# --- Pager ------------------------------------------------------------------------------------
def test_pager_records_each_notification_and_prints_it(tmp_path: Path) -> None:
    printed: list[str] = []
    pages_path = tmp_path / "pages.jsonl"
    with PagerServer(pages_path, port=0, on_page=lambda p: printed.extend(describe(p))) as pager:
        assert httpx.get(pager.url).json() == {"status": "ok", "pages": 0}
        assert httpx.post(pager.url, json=FIRING).status_code == 200
        assert httpx.post(pager.url, json=FIRING).status_code == 200
        assert httpx.get(pager.url).json()["pages"] == 2
    pages = read_pages(pages_path)
    assert len(pages) == 2
    assert pages[0]["alerts"] == FIRING["alerts"] and pages[0]["received_at"] > 0
    assert printed[0].startswith("PAGE FIRING WardenEngineDown [critical] e:1")


def test_a_pager_started_again_on_the_same_file_sees_only_its_own_pages(tmp_path: Path) -> None:
    """`warden demo` run twice in one folder: the second run's checks must not find the first
    run's pages (they stay in the file, for people)."""
    pages_path = tmp_path / "pages.jsonl"
    with PagerServer(pages_path, port=0, on_page=lambda _: None) as first:
        assert httpx.post(first.url, json=FIRING).status_code == 200
        assert len(first.pages()) == 1
    with PagerServer(pages_path, port=0, on_page=lambda _: None) as second:
        assert second.pages() == []
        assert httpx.post(second.url, json=FIRING).status_code == 200
        assert len(second.pages()) == 1
    assert len(read_pages(pages_path)) == 2


def test_pager_refuses_what_is_not_an_alertmanager_payload(tmp_path: Path) -> None:
    with PagerServer(tmp_path / "pages.jsonl", port=0, on_page=lambda _: None) as pager:
        assert httpx.post(pager.url, content=b"not json").status_code == 400
        assert httpx.post(pager.url, json={"alerts": "x"}).status_code == 400
        assert httpx.post(pager.url, json=[1, 2]).status_code == 400
        assert pager.pages() == []


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_pager_command_line_serves_until_interrupted(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    """Started the way a background job of a non-interactive shell starts it (SIGINT
    inherited as ignored), whatever way this suite itself was started: it still stops."""
    port = free_port()
    out = tmp_path / "pages.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "warden.cli", "pager", "--port", str(port), "--out", str(out)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    try:
        assert process.stdout is not None
        assert "pager listening" in process.stdout.readline()
        httpx.post(f"http://127.0.0.1:{port}/", json=FIRING).raise_for_status()
        assert process.stdout.readline().startswith("PAGE FIRING WardenEngineDown")
        process.send_signal(stop_signal)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:  # a stuck pager never outlives its test
            process.kill()
            process.wait(10)
    assert len(read_pages(out)) == 1


# --- Token ------------------------------------------------------------------------------------
def test_webhook_token_is_private_and_fresh(tmp_path: Path) -> None:
    path = write_token(tmp_path / "run" / "token")
    first = read_token(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) == 64 and int(first, 16) >= 0
    assert read_token(write_token(path)) != first


# --- Configs ----------------------------------------------------------------------------------
def test_prometheus_config_scrapes_the_engine_job_at_the_given_intervals() -> None:
    config = prometheus_config(
        ["127.0.0.1:8000"],
        rule_files=["/r.yml"],
        alertmanagers=["127.0.0.1:9093"],
        self_target="127.0.0.1:9090",
        intervals=Intervals("1s", "2s"),
    )
    assert config["global"] == {
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "evaluation_interval": "2s",
    }
    jobs = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]
    }
    assert jobs[ENGINE_JOB] == ["127.0.0.1:8000"]
    assert config["rule_files"] == ["/r.yml"]


def test_port_in_use_is_reported_with_the_option_to_change(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(StackError, match="--prometheus-port"):
            ensure_port_free("127.0.0.1", port, "prometheus")


# --- Grafana ----------------------------------------------------------------------------------
def _fake_grafana(root: Path, name: str) -> Path:
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    (root / "conf").mkdir()
    (root / "conf" / "defaults.ini").write_text("")
    binary = bin_dir / name
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(("name", "server_word"), [("grafana", True), ("grafana-server", False)])
def test_grafana_found_on_path_with_its_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, server_word: bool
) -> None:
    bin_dir = _fake_grafana(tmp_path / "grafana-11", name)
    monkeypatch.setenv("PATH", str(bin_dir))
    install = grafana.find_grafana()
    assert install is not None and install.homepath == (tmp_path / "grafana-11").resolve()
    argv = install.argv()
    assert (argv[1] == "server") is server_word
    assert argv[-1] == f"--homepath={install.homepath}"


def test_no_grafana_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert grafana.find_grafana() is None


def test_grafana_files_provision_the_native_prometheus_and_every_dashboard(tmp_path: Path) -> None:
    env = grafana.grafana_files(tmp_path, "http://127.0.0.1:19090", "127.0.0.1", 13000)
    assert env["GF_SERVER_HTTP_PORT"] == "13000"
    provisioning = Path(env["GF_PATHS_PROVISIONING"])
    datasource = yaml.safe_load((provisioning / "datasources" / "warden.yaml").read_text())
    entry = datasource["datasources"][0]
    assert entry["uid"] == DATASOURCE_UID and entry["url"] == "http://127.0.0.1:19090"
    provider = yaml.safe_load((provisioning / "dashboards" / "warden.yaml").read_text())
    folder = Path(provider["providers"][0]["options"]["path"])
    repo = Path(__file__).resolve().parent.parent
    for committed in (repo / "dashboards" / "generated").glob("*.json"):
        assert json.loads((folder / committed.name).read_text()) == json.loads(
            committed.read_text()
        )


# --- warden up arguments ----------------------------------------------------------------------
def test_up_arguments_become_settings(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    up.add_arguments(parser)
    args = parser.parse_args(
        [
            "--workdir",
            str(tmp_path),
            "--prometheus-port",
            "19090",
            "--scrape-interval",
            "1s",
            "--chaos",
            "--no-grafana",
            "--",
            "--max-model-len",
            "128",
        ]
    )
    settings = up.settings_from_args(args)
    assert settings.prometheus_port == 19090 and settings.alertmanager_port == 9093
    assert settings.intervals == Intervals("1s", "5s")
    assert settings.inject_faults and not settings.with_grafana
    assert settings.engine_args == ["--max-model-len", "128"]
    assert settings.model is None  # the tiny model
    assert settings.supervise and settings.supervisor_port == 8001


def test_engine_runs_under_warden_serve(tmp_path: Path) -> None:
    stack = NativeStack(StackSettings(workdir=tmp_path, engine_port=18000, supervisor_port=18001))
    argv = stack.engine_argv("/models/tiny", ["--max-model-len", "128"])
    assert argv[1:4] == ["-m", "warden.cli", "serve"]
    assert argv[argv.index("--port") + 1] == "18000"
    assert argv[argv.index("--supervisor-port") + 1] == "18001"
    assert argv[-4:] == ["/models/tiny", "--", "--max-model-len", "128"]
    assert stack.supervisor_url == "http://127.0.0.1:18001"
    unsupervised = NativeStack(StackSettings(workdir=tmp_path, supervise=False))
    assert "--no-supervise" in unsupervised.engine_argv("m", [])
    assert unsupervised.supervisor_url is None


def test_summary_says_why_grafana_did_not_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", os.defpath)
    stack = NativeStack(StackSettings(workdir=tmp_path, engine_url="http://127.0.0.1:1"))
    stack.grafana_note = "no grafana-server or grafana binary on PATH"
    text = stack.summary()
    assert "grafana" in text and "no grafana-server or grafana binary on PATH" in text
    assert str(tmp_path / "pages.jsonl") in text


def test_an_open_restart_circuit_from_an_earlier_run_is_reported(tmp_path: Path) -> None:
    from exporter.supervisor_state import STATE_FILE, SupervisorState

    state = SupervisorState()
    state.open_circuit("crash loop", 0.0)
    (tmp_path / "engine").mkdir()
    state.save(tmp_path / "engine" / STATE_FILE)
    stack = NativeStack(StackSettings(workdir=tmp_path))
    with pytest.raises(StackError, match="--reset-circuit"):
        stack._check_restart_circuit()
    reset = NativeStack(StackSettings(workdir=tmp_path, reset_circuit=True))
    reset._check_restart_circuit()
    assert "--reset-circuit" in reset.engine_argv("m", [])


@pytest.mark.parametrize("separator", [["--"], []], ids=["with --", "without --"])
def test_serve_and_up_take_vllm_arguments_the_same_way(
    tmp_path: Path, separator: list[str]
) -> None:
    """``warden up -- ARGS`` and ``warden serve MODEL -- ARGS`` give vLLM the same ARGS, and
    the serve command ``warden up`` runs parses back to them."""
    from warden.cli.main import build_parser

    vllm = ["--dtype", "float32", "--max-model-len", "128"]
    parser = build_parser()
    up_args = parser.parse_args(["up", "--workdir", str(tmp_path), "--", *vllm])
    settings = up.settings_from_args(up_args)
    assert settings.engine_args == vllm
    serve_args = parser.parse_args(["serve", "--port", "9", "/m", *separator, *vllm])
    from warden.engine.launch import vllm_args

    assert vllm_args(serve_args.vllm_args) == vllm
    argv = NativeStack(settings).engine_argv("/m", vllm)
    served = parser.parse_args(argv[argv.index("serve") :])
    assert served.model == "/m" and vllm_args(served.vllm_args) == vllm


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "/m", "--port", "9"], "give it as warden serve's own --port"),
        (["serve", "/m", "--", "--host=0.0.0.0"], "give it as warden serve's own --host"),
        (["serve", "/m", "--model", "x"], "give it as warden serve's own MODEL"),
        (["up", "--", "--port", "9"], "give it as warden up's own --engine-port"),
    ],
)
def test_flags_warden_sets_are_refused_among_vllm_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --port after MODEL would start vLLM on a port nobody supervises: refused at once."""
    from warden.cli.main import build_parser

    args = build_parser().parse_args(argv)
    assert args.func(args) == 2
    captured = capsys.readouterr()
    assert message in captured.out + captured.err


# --- the tiny model's engine arguments --------------------------------------------------------
def test_the_demo_engine_is_the_tiny_base_with_a_small_kv_cache() -> None:
    assert TINY_ENGINE_ARGS == (
        "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--block-size", "32",
        "--max-num-seqs", "8", "--num-gpu-blocks-override", "12",
    )  # fmt: skip
    assert tiny_engine_args() == TINY_BASE_ARGS
    assert tiny_engine_args("--max-model-len", "2048", drop=("--enforce-eager",)) == (
        "--dtype", "float32", "--max-model-len", "2048", "--block-size", "32",
    )  # fmt: skip
    assert tiny_engine_args("--enable-prefix-caching")[-1] == "--enable-prefix-caching"
