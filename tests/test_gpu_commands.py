"""The GPU suite's own commands work on a GPU machine that has torch, NVML and pytest but no vLLM.

Such a machine is simulated here with ``tests/support/gpu_machine_site`` (an import blocker:
the standard library, torch, nvidia-ml-py, prometheus-client, pytest and this checkout only) and
no pytest plugins. Its CUDA is faked only where a command asks whether torch sees a GPU: the
fake interpreters below answer that probe and nothing else.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import only_gpu_tests_selected

ROOT = Path(__file__).resolve().parents[1]
GPU_MACHINE_SITE = ROOT / "tests" / "support" / "gpu_machine_site"


def gpu_machine_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{GPU_MACHINE_SITE}{os.pathsep}{ROOT}",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }


def test_the_simulated_machine_has_no_vllm() -> None:
    probe = (
        "import torch, prometheus_client, pytest\ntry: import vllm\nexcept ImportError: print('no')"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=gpu_machine_env(), capture_output=True, text=True
    )
    assert done.stdout.strip() == "no", done.stderr[-2000:]


def test_pytest_m_gpu_collects_without_vllm() -> None:
    """A bare ``pytest -m gpu`` from the checkout's root: collection must not import the rest of
    the suite (vLLM, httpx, psutil ...); here every GPU test skips with its reason."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rs"],
        cwd=ROOT,
        env=gpu_machine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ skipped", summary) and "error" not in summary, summary
    assert "needs an NVIDIA GPU" in done.stdout


def uses_gpu_marker(source: str) -> bool:
    """The code (not its strings) marks a test ``gpu`` or imports the GPU suite's marker."""
    for node in ast.walk(ast.parse(source)):
        value = getattr(node, "value", None)
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "gpu"
            and getattr(value, "attr", "") == "mark"
        ):
            return True
        if isinstance(node, ast.ImportFrom) and "gpu_support" in (node.module or ""):
            return True
    return False


def test_every_gpu_test_lives_in_tests_gpu() -> None:
    """``pytest -m gpu`` collects tests/gpu only (tests/conftest.py): a gpu test elsewhere
    would never run there."""
    assert uses_gpu_marker("import pytest\n@pytest.mark.gpu\ndef test_x(): pass\n")
    assert not uses_gpu_marker('TEXT = """@pytest.mark.gpu"""\n')
    outside = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if path.relative_to(ROOT / "tests").parts[0] != "gpu" and uses_gpu_marker(path.read_text())
    ]
    assert outside == []


def fake_python(path: Path, sees_cuda: bool) -> Path:
    """A fake interpreter for the script's probe only: CUDA torch (exit 0) or CPU torch (10)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexit {0 if sees_cuda else 10}\n")
    path.chmod(0o755)
    return path


def which_python(checkout: Path, path_dir: Path, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    environment.update(PATH=f"{path_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", **env)
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "gpu-check.sh"), "--which-python"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_gpu_check_prefers_a_cuda_python_over_the_venvs_cpu_torch(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu-check.sh", checkout / "scripts")
    fake_python(checkout / ".venv" / "bin" / "python", sees_cuda=False)
    machine = tmp_path / "machine-bin"
    cuda = fake_python(machine / "python3", sees_cuda=True)
    assert which_python(checkout, machine) == str(cuda)
    # No CUDA anywhere: the .venv still runs the suite (everything skips, exit 3).
    fake_python(machine / "python3", sees_cuda=False)
    assert which_python(checkout, machine) == ".venv/bin/python"
    # The caller's choice wins.
    assert which_python(checkout, machine, PYTHON="/opt/py/bin/python") == "/opt/py/bin/python"


def test_gpu_check_runs_without_vllm_and_says_not_run_without_a_gpu() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh")],
        env={**gpu_machine_env(), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert "skipped" in done.stdout and "NOT RUN" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("expression", "only_gpu"),
    [("gpu", True), ("gpu and not engine", True), ("gpu or engine", False), ("not gpu", False),
     ("engine", False), ("", False)],
)  # fmt: skip
def test_only_a_gpu_selection_narrows_collection(expression: str, only_gpu: bool) -> None:
    config = SimpleNamespace(option=SimpleNamespace(markexpr=expression))
    assert only_gpu_tests_selected(config) is only_gpu  # type: ignore[arg-type]
