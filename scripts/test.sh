#!/usr/bin/env bash
# The project's test command: lint, types, generated-file drift, then every test (real vLLM
# CPU engines, real Prometheus and Alertmanager). Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
packages=(exporter alerts dashboards warden)
echo "== ruff";   ruff check "${packages[@]}" tests benchmarks
echo "== format"; ruff format --check "${packages[@]}" tests benchmarks
echo "== mypy";   mypy "${packages[@]}"
echo "== generated files up to date"; warden generate --check
echo "== pytest"; python -m pytest -p no:cacheprovider --durations=25 "$@"
