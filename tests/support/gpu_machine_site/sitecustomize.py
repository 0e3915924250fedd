"""A lent GPU machine's Python, simulated: only the standard library, torch (and what it imports),
nvidia-ml-py, prometheus-client, pytest and this checkout can be imported; vLLM and every other
dependency of the project cannot. Put this folder first on ``PYTHONPATH`` (Python imports
``sitecustomize`` at start-up); ``tests/test_gpu_commands.py`` runs the GPU suite's commands so.
"""

from __future__ import annotations

import importlib.abc
import sys

ALLOWED = {
    # what the GPU machine has installed
    "torch", "torchgen", "functorch", "triton", "pynvml", "prometheus_client", "pytest",
    "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments", "exceptiongroup", "tomli",
    # torch's own dependencies
    "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock", "fsspec",
    "typing_extensions", "numpy", "nvidia", "setuptools", "pkg_resources", "_distutils_hack",
    # this checkout
    "exporter", "tests", "warden", "alerts", "dashboards", "benchmarks",
}  # fmt: skip


class GpuMachineOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        top = name.partition(".")[0]
        if top in ALLOWED or top in sys.stdlib_module_names or top in sys.builtin_module_names:
            return None  # the normal finders decide
        raise ModuleNotFoundError(f"No module named {top!r} (simulated GPU machine)", name=top)


sys.meta_path.insert(0, GpuMachineOnly())
