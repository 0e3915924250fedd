"""The GPU acceptance suite's report: each test adds its figures; written as JSON at the end of
the session to ``$WARDEN_GPU_REPORT`` (scripts/gpu-check.sh prints it)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.fixture(scope="session")
def gpu_report() -> Iterator[dict[str, Any]]:
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    yield report
    path = os.environ.get("WARDEN_GPU_REPORT")
    if path:
        Path(path).write_text(json.dumps(report, indent=1, default=str) + "\n")
