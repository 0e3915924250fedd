"""vLLM's own metrics in the API server's memory (exporter.api_metrics), in a process of their
own: installing changes prometheus_client's value class for the whole process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from warden.engine.vllm_entry import middleware_named

SCRIPT = r"""
import json, os, sys
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.mmap_dict import MmapedDict
from exporter import api_metrics
import glob

def folder_names():
    names = {}
    for path in glob.glob(os.path.join(os.environ.get("PROMETHEUS_MULTIPROC_DIR", "/-"), "*.db")):
        pid = path.rsplit("_", 1)[1][:-3]
        for row in MmapedDict(path, read_mode=True).read_all_values():
            names.setdefault(json.loads(row[0])[0], set()).add(pid)
    return {k: sorted(v) for k, v in names.items()}

registry = CollectorRegistry()
before = Counter("vllm:made_before", "made before install", ["engine"], registry=registry)
before.labels("0").inc(2)
installed = api_metrics.install()
tokens = Counter("vllm:generation_tokens", "tokens", ["engine"], registry=registry)
latency = Histogram("vllm:e2e", "latency", ["engine"], buckets=[0.5, 1.0], registry=registry)
running = Gauge("vllm:num_requests_running", "running", ["engine"], registry=registry,
                multiprocess_mode="mostrecent")
ours = Counter("warden_requests", "ours", ["outcome"], registry=registry)
tokens.labels("0").inc(7)
latency.labels("0").observe(0.7)
running.labels("0").set(3)
ours.labels("success").inc()
child = os.fork()
if child == 0:  # a forked engine process: its vllm: metrics go to the folder
    Counter("vllm:in_child", "child", registry=CollectorRegistry()).inc(5)
    os._exit(0)
os.waitpid(child, 0)
out = CollectorRegistry(auto_describe=False)
out.register(api_metrics.ApiServerCollector(registry=registry))
text = generate_latest(out).decode()
print(json.dumps({
    "installed": installed,
    "serves": api_metrics.serves_metrics(),
    "folder": folder_names(),
    "text": text,
    "me": str(os.getpid()),
    "child": str(child),
}))
"""


def run_script(tmp_path: Path, with_folder: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    if with_folder:
        folder = tmp_path / "mp"
        folder.mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def type_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("# TYPE ")]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_vllm_metrics_stay_in_memory_and_are_served_once_with_the_folder(tmp_path: Path) -> None:
    result = run_script(tmp_path)
    assert result["installed"] and result["serves"]
    folder, me, child = result["folder"], result["me"], result["child"]
    # This process wrote warden's metric, and the one made before install, to the folder, and
    # no vllm: metric made after install; the forked child wrote its own to the folder (and,
    # as prometheus_client does after a fork, zeros for the folder's values it inherited).
    assert me in folder["warden_requests"]
    assert me in folder["vllm:made_before"]
    assert folder["vllm:in_child"] == [child]
    for name in ("vllm:generation_tokens", "vllm:e2e", "vllm:num_requests_running"):
        assert name not in folder
    text = result["text"]
    types = type_lines(text)
    assert len(types) == len(set(types)), types
    lines = set(text.splitlines())
    assert 'vllm:generation_tokens_total{engine="0"} 7.0' in lines
    assert 'vllm:e2e_bucket{engine="0",le="1.0"} 1.0' in lines
    assert 'vllm:e2e_bucket{engine="0",le="0.5"} 0.0' in lines
    assert 'vllm:e2e_sum{engine="0"} 0.7' in lines
    assert 'vllm:num_requests_running{engine="0"} 3.0' in lines
    assert 'warden_requests_total{outcome="success"} 1.0' in lines
    assert 'vllm:made_before_total{engine="0"} 2.0' in lines
    assert "vllm:in_child_total 5.0" in lines
    assert "_created" not in text  # as the folder gives them: no extra series


def test_without_the_folder_nothing_is_installed(tmp_path: Path) -> None:
    result = run_script(tmp_path, with_folder=False)
    assert not result["installed"] and not result["serves"]
    assert result["folder"] == {}


def test_the_switch_needs_warden_middleware_on_the_command_line() -> None:
    mw = "warden.engine.middleware.WardenMiddleware"
    assert middleware_named(["--model", "m", "--middleware", mw], mw)
    assert middleware_named([f"--middleware={mw}", "--port", "1"], mw)
    assert not middleware_named(["--model", "m"], mw)
    assert not middleware_named(["--middleware", "other.Middleware"], mw)
    assert not middleware_named(["--middleware"], mw)  # a dangling flag: vLLM refuses it
