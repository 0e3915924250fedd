"""Shared pieces of the overhead benchmarks: engine variants, the tiny model, statistics.

An engine *variant* is the same vLLM command with some of warden's hooks switched off, so an
A/B run compares exactly one difference. ``warden`` is ``LaunchSpec`` itself (every hook, as
``warden serve`` starts vLLM); ``plain`` is vLLM with none of them: ``VLLM_PLUGINS`` set to an
empty name (vLLM splits it on commas and loads only plugins whose entry-point name is in the
list, so no warden plugin loads), no ``--logits-processors``, ``--worker-extension-cls`` or
``--middleware``, and no ``PROMETHEUS_MULTIPROC_DIR``. The others switch off one hook each, to
attribute a difference.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from warden.common.metrics_text import parse_samples, sample  # noqa: F401 - re-exported
from warden.common.ports import free_port
from warden.common.tinymodel import TINY_BASE_ARGS
from warden.engine.launch import (
    LOGITS_PROCESSOR,
    MIDDLEWARE,
    WORKER_EXTENSION,
    LaunchSpec,
)
from warden.supervisor.engine import EngineProcess

# The tests' engine configuration (the tiny model's base arguments), plus a 1 GiB KV cache.
BASE_ARGS: tuple[str, ...] = TINY_BASE_ARGS
# PYTHONSAFEPATH: an engine started with ``-m`` would import warden from the directory it was
# started in before PYTHONPATH, so an A/B of two checkouts run from one of them would compare
# that one with itself.
BASE_ENV: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONSAFEPATH": "1"}
# Warden's own switches that must not leak from the caller's shell into a plain engine.
WARDEN_ENV_PREFIXES = ("WARDEN_", "PROMETHEUS_MULTIPROC_DIR")


@dataclass(frozen=True)
class Variant:
    """Which of warden's hooks an engine runs with."""

    name: str
    plugins: bool = True  # general + stat logger + endpoint plugins (VLLM_PLUGINS)
    logits: bool = True  # --logits-processors (the non-finite logits counter, every step)
    middleware: bool = True  # --middleware (admission + retries, every request)
    worker_extension: bool = True  # --worker-extension-cls
    multiproc: bool = True  # PROMETHEUS_MULTIPROC_DIR for the process tree

    @property
    def is_full(self) -> bool:
        return all(
            (self.plugins, self.logits, self.middleware, self.worker_extension, self.multiproc)
        )


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("warden"),
        Variant("plain", False, False, False, False, False),
        Variant("plain_mp", False, False, False, False, True),
        # A second plain vLLM: what a comparison reads between two identical engines.
        Variant("plain_control", False, False, False, False, False),
        Variant("warden_no_logits", logits=False),
        Variant("warden_no_middleware", middleware=False),
        Variant("warden_no_plugins", plugins=False),
    )
}


@dataclass
class VariantSpec(LaunchSpec):
    """A LaunchSpec with some of warden's hooks switched off (all on: exactly LaunchSpec)."""

    variant: Variant = field(default_factory=lambda: VARIANTS["warden"])

    def argv(self) -> list[str]:
        argv = super().argv()
        if self.variant.is_full:
            return argv
        drop = {
            "--logits-processors": (LOGITS_PROCESSOR, not self.variant.logits),
            "--worker-extension-cls": (WORKER_EXTENSION, not self.variant.worker_extension),
            "--middleware": (MIDDLEWARE, not self.variant.middleware),
        }
        out: list[str] = []
        skip = False
        for index, arg in enumerate(argv):
            if skip:
                skip = False
                continue
            hook = drop.get(arg)
            if hook is not None and hook[1] and argv[index + 1] == hook[0]:
                skip = True
                continue
            out.append(arg)
        return out

    def environment(self) -> dict[str, str]:
        env = super().environment()
        if self.variant.is_full:
            return env
        if not self.variant.plugins:
            # An allow-list with one empty name: no plugin of any group matches it.
            env["VLLM_PLUGINS"] = ""
        if not self.variant.multiproc:
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        if not (self.variant.plugins or self.variant.middleware):
            for key in list(env):
                if key.startswith(WARDEN_ENV_PREFIXES) and key != "PROMETHEUS_MULTIPROC_DIR":
                    env.pop(key)
        env.update(self.env)
        return env


def exit_on_sigterm() -> None:
    """Turn SIGTERM (``timeout``, a CI cancel) into SystemExit, so ``running_engines`` still
    stops every engine it started (they run in their own sessions and would outlive us)."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def tiny_model(workdir: Path, model: str | None = None) -> str:
    """``model`` if given, else the tiny random-weight Llama built under ``workdir``."""
    if model:
        return model
    from warden.common.tinymodel import build_tiny_model

    return str(build_tiny_model(workdir / "tiny-model"))


def make_engine(
    variant: Variant,
    model: str,
    run_dir: Path,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> EngineProcess:
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = VariantSpec(
        model,
        port=free_port(),
        extra_args=[*BASE_ARGS, *extra_args],
        env={**BASE_ENV, **(env or {})},
        run_dir=run_dir,
        variant=variant,
    )
    return EngineProcess(spec, log_path=run_dir / "engine.log")


@contextlib.contextmanager
def running_engines(
    variants: Sequence[Variant],
    model: str,
    workdir: Path,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout_s: float = 300.0,
) -> Iterator[dict[str, EngineProcess]]:
    """Start one engine per variant (side by side), wait until all serve; stop all on exit."""
    engines = {
        v.name: make_engine(v, model, workdir / f"engine-{v.name}", extra_args, env)
        for v in variants
    }
    try:
        for engine in engines.values():
            engine.start()
        deadline = time.monotonic() + timeout_s
        for name, engine in engines.items():
            took = engine.wait_ready(max(1.0, deadline - time.monotonic()))
            log(f"engine {name} ready on {engine.base_url} ({took:.0f}s after the first check)")
        yield engines
    finally:
        for engine in engines.values():
            engine.stop()


class EngineCpu:
    """CPU seconds (user + system) used so far by each process of one engine, by role."""

    ROLES = ("api", "core", "worker")

    def __init__(self, engine: EngineProcess) -> None:
        assert engine.process is not None
        root = psutil.Process(engine.process.pid)
        self.procs: dict[str, psutil.Process] = {"api": root}
        for child in root.children(recursive=True):
            name = child.name()
            if name == "VLLM::EngineCore":
                self.procs["core"] = child
            elif name.startswith("VLLM::Worker"):
                self.procs["worker"] = child

    def read(self) -> dict[str, float]:
        out = {}
        for role, proc in self.procs.items():
            try:
                times = proc.cpu_times()
                out[role] = times.user + times.system
            except psutil.Error:
                out[role] = float("nan")
        return out


def machine_busy_s() -> float:
    """CPU seconds all processes of the machine have used so far (every core)."""
    t = psutil.cpu_times()
    return float(sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq")))


def own_cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


# --- statistics -------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (q in [0, 1]) of a non-empty sample."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summary(values: Sequence[float], digits: int = 4) -> dict[str, float]:
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), digits),
        "median": round(statistics.median(values), digits),
        "p25": round(quantile(values, 0.25), digits),
        "p75": round(quantile(values, 0.75), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def bootstrap_median_ci(
    values: Sequence[float], rounds: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median (fixed seed: reproducible)."""
    import random

    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


# --- reporting --------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """What the numbers depend on: cores, load when measured, versions."""
    try:
        from importlib.metadata import version

        vllm_version = version("vllm-cpu")
    except Exception:
        vllm_version = "unknown"
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "vllm_cpu": vllm_version,
    }


def workdir(path: str | None, prefix: str) -> tuple[Path, bool]:
    """The work folder, and whether it is a temporary one to delete at the end."""
    if path:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        return out, False
    return Path(tempfile.mkdtemp(prefix=prefix)), True


def cleanup(path: Path, temporary: bool) -> None:
    if temporary:
        shutil.rmtree(path, ignore_errors=True)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; numbers right-aligned."""
    align = [
        "---:" if rows and isinstance(rows[0][i], int | float) else "---"
        for i in range(len(headers))
    ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)


def scrape(base_url: str) -> dict[str, float]:
    """All samples of the server's /metrics as {'name{labels}': value}."""
    import httpx

    return parse_samples(httpx.get(f"{base_url}/metrics", timeout=30).text)
