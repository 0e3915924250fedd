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
# Two workers, a whole test module per work unit, engine modules first: tests/support/parallel.py.
workers="${WARDEN_TEST_WORKERS:-2}"
echo "== pytest ($workers workers)"
python -m pytest -p no:cacheprovider -n "$workers" --durations=40 "$@"
