#!/usr/bin/env bash
# The whole test suite against the real local stack. Starts the stack if it is not running
# and stops it again on exit (only if this script started it). `--nodes N` first: a stack of
# N Kafka brokers and N Cassandra nodes (docs/operations.md, "A three-node stack"). Extra
# arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
NF=.venv/bin/notiflow
nodes=()
if [ "${1:-}" = "--nodes" ]; then
  nodes=(--nodes "$2")
  shift 2
fi

started_here=0
if ! $NF stack status >/dev/null 2>&1; then
  started_here=1
fi
cleanup() {
  if [ "$started_here" = 1 ]; then
    $NF stack down >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT INT TERM

echo "==> lint"
.venv/bin/ruff check .
echo "==> layers (import-linter)"
.venv/bin/lint-imports
echo "==> types (mypy)"
.venv/bin/mypy
echo "==> local stack"
$NF stack up "${nodes[@]}"
eval "$($NF stack env)"
echo "==> tests"
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
