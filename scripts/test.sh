#!/usr/bin/env bash
# The project's test command: lint, types, generated-file drift, then every test (real vLLM
# CPU engines, real Prometheus and Alertmanager). Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
packages=(exporter alerts dashboards warden)
echo "== ruff";   ruff check "${packages[@]}" tests benchmarks
echo "== format"; ruff format --check "${packages[@]}" tests benchmarks
echo "== generated files up to date"; warden generate --check
# mypy (about 20 s of one core on a cold cache) runs beside the suite, which leaves a core idle
# now and then (its engines wait on scrapes and timers); its verdict is printed and counted
# after the suite's, and fails the run the same.
mypy_log="$(mktemp)"
mypy "${packages[@]}" >"$mypy_log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
# Three workers (one per core for the engine modules, on two cores one more for the rest), a
# whole test module per work unit, engine modules first: tests/support/parallel.py.
workers="${WARDEN_TEST_WORKERS:-3}"
echo "== pytest ($workers workers)"
status=0
python -m pytest -p no:cacheprovider -n "$workers" --durations=40 "$@" || status=$?
echo "== mypy"
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
cat "$mypy_log"
if [ "$mypy_status" != 0 ]; then
  echo "mypy: FAILED (exit $mypy_status)" >&2
  [ "$status" != 0 ] || status=$mypy_status
fi
exit "$status"
