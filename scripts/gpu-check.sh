#!/usr/bin/env bash
# The GPU acceptance suite and a one-screen report: the real allocator, NVML and CUDA-graph
# adapters and warden's non-finite logits detection on a real NVIDIA GPU (tests/gpu).
# Needs Python 3.11+ with torch (CUDA build), nvidia-ml-py, prometheus-client and pytest; no vLLM,
# no network. Under 10 minutes on an H100/H200. Exit status: pytest's, or 3 when every test was
# skipped (no GPU here): a check that did not run never reads as passed.
#   bash scripts/gpu-check.sh [REPORT.json]     (the raw figures go there; default: a temp file)
#   bash scripts/gpu-check.sh --which-python    (only print the Python it would use)
# The Python: $PYTHON if set; else the first of .venv/bin/python, python3, python on PATH whose
# torch sees a CUDA device (a GPU machine's own Python, not a CPU-torch .venv); else the first
# with torch and pytest (every test then skips, exit 3).
set -uo pipefail
cd "$(dirname "$0")/.."
pick_python() {
  [ -n "${PYTHON:-}" ] && { echo "$PYTHON"; return; }
  local candidates=() name fallback=""
  [ -x .venv/bin/python ] && candidates+=(.venv/bin/python)
  for name in python3 python; do
    command -v "$name" >/dev/null 2>&1 && candidates+=("$(command -v "$name")")
  done
  local probe='import sys, pytest, torch; sys.exit(0 if torch.cuda.is_available() else 10)'
  for name in "${candidates[@]}"; do
    "$name" -c "$probe" >/dev/null 2>&1
    case $? in
      0) echo "$name"; return ;;
      10) [ -z "$fallback" ] && fallback=$name ;;
    esac
  done
  echo "${fallback:-python3}"
}
python=$(pick_python)
if [ "${1:-}" = "--which-python" ]; then echo "$python"; exit 0; fi
report=${1:-$(mktemp -t warden-gpu-XXXXXX.json)}
log=$(mktemp -t warden-gpu-log-XXXXXX.txt)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" WARDEN_GPU_REPORT="$report"
started=$(date +%s)
# --confcutdir: only tests/gpu's own conftest; -p no:cacheprovider: nothing written to the tree.
"$python" -m pytest -m gpu tests/gpu -p no:cacheprovider --confcutdir=tests/gpu -q -rs \
  -o addopts="" >"$log" 2>&1
status=$?
"$python" - "$report" "$log" "$status" "$(( $(date +%s) - started ))" <<'PY'
import json, sys
from pathlib import Path

report_path, log_path, status, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
lines = Path(log_path).read_text(errors="replace").splitlines()
summary = next((l for l in reversed(lines) if " in " in l and ("passed" in l or "failed" in l or "skipped" in l or "error" in l)), "no pytest summary")
print(f"warden GPU acceptance: {summary.strip('= ')} ({seconds} s)")
try:
    r = json.loads(Path(report_path).read_text())
except (OSError, ValueError):
    r = {}
if r:
    print(f"  device {r.get('device')}  torch {r.get('torch')}  CUDA {r.get('cuda')}  python {r.get('python')} ({sys.executable})")
if "allocator" in r:
    a = r["allocator"]
    print(f"  allocator: {a.get('total_gib')} GiB; forced OOM after {a.get('blocks_of_1gib_before_oom')} x 1 GiB: "
          f"ooms +{a.get('ooms_counted')}, retries +{a.get('retries_counted')}")
if "nvml" in r:
    n = r["nvml"]
    print(f"  NVML: {n.get('devices')} device(s), {n.get('total_gib')} GiB; a 4 GiB tensor seen as {n.get('seen_gib_for_a_4gib_tensor')} GiB")
    if "engine_view" in n:
        print(f"  NVML per process (the device risk's engine scope): {n['engine_view']}")
if "cuda_graph" in r:
    g = r["cuda_graph"]
    print(f"  CUDA graph: pool {g['pool_bytes_free_delta'] / 2**20:.1f} MiB (free-memory delta), "
          f"reserved +{g['reserved_delta'] / 2**20:.1f} MiB, replay {g['replay_us']} us")
if "flag_latency_s" in r:
    f = r["flag_latency_s"]
    print(f"  non-finite flag latency (check -> resolved on host): p50 {f['p50'] * 1e3:.3f} ms, "
          f"p99 {f['p99'] * 1e3:.3f} ms (n={f['n']})")
if "host_us_per_check_back_to_back" in r:
    print(f"  host time per check, back to back: {r['host_us_per_check_back_to_back']} us; containment: {r.get('containment')}")
if r.get("cost_per_step"):
    print("  cost per step (median us): dtype batch vocab | check gpu | check host | amax gpu | one copy gpu | V2 fp32 copy gpu")
    for c in r["cost_per_step"]:
        print(f"    {c['dtype']:>4} {c['batch']:>4} {c['vocab']:>7} | {c['check_gpu_us']:>9} | {c['check_host_us']:>10} | "
              f"{c['amax_gpu_us']:>8} | {c['one_copy_gpu_us']:>12} | {c.get('v2_fp32_copy_gpu_us', '-'):>16}")
skips = sorted({l.split(": ", 1)[-1] for l in lines if l.startswith("SKIPPED")})
for line in [l for l in lines if l.startswith(("FAILED", "ERROR"))][:8]:
    print("  " + line[:160])
for reason in skips[:3]:
    print("  skipped: " + reason[:300])
print(f"  raw figures: {report_path}; pytest output: {log_path}")
ran = any(word in summary for word in ("passed", "failed", "error"))
if status == 0 and not ran:
    print("  NOT RUN: every test was skipped; this check needs an NVIDIA GPU")
    sys.exit(3)
sys.exit(status)
PY
