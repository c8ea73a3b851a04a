#!/usr/bin/env bash
# The whole test suite against the real local stack. Starts the stack if it is not running
# and stops it again on exit (only if this script started it). `--nodes N` first: a stack of
# N Kafka brokers and N Cassandra nodes (docs/operations.md, "A three-node stack"). Extra
# arguments go to both pytest parts.
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
mypy_pid=
cleanup() {
  if [ -n "$mypy_pid" ]; then kill "$mypy_pid" 2>/dev/null || true; fi
  if [ "$started_here" = 1 ]; then
    $NF stack down >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT INT TERM

echo "==> lint"
.venv/bin/ruff check .
echo "==> layers (import-linter)"
.venv/bin/lint-imports
echo "==> local stack, while mypy checks the types"
# a stack started here only serves this run and is stopped cleanly (flushed) at its end, so
# its schema changes may skip their flush (settings: cassandra_flush_schema)
if [ "$started_here" = 1 ]; then export NOTIFLOW_CASSANDRA_FLUSH_SCHEMA=false; fi
mypy_log=$(mktemp)
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
$NF stack up "${nodes[@]}"
echo "==> types (mypy)"
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
cat "$mypy_log"
rm -f "$mypy_log"
if [ "$mypy_rc" != 0 ]; then exit "$mypy_rc"; fi
eval "$($NF stack env)"
# Two pytest sessions share the stack at once (pytest-xdist, a file per worker at a time):
# each session has its own topic prefix, keyspace and ports (tests/conftest.py), and the
# tests that stop shared servers or judge latency wait for the second part, which runs them
# alone. Files are handed out costliest first (tests/file_order.py; xdist's own reordering, by
# number of tests, is off). Exit status 5 is "nothing selected" (arguments that pick only
# one kind of test).
pytest_part() {
  local rc=0
  .venv/bin/python -m pytest -q -p no:cacheprovider "$@" || rc=$?
  if [ "$rc" = 5 ]; then rc=0; fi
  return "$rc"
}
status=0
echo "==> tests, two sessions in parallel"
pytest_part -n 2 --dist loadfile --no-loadscope-reorder \
  -m "not solo and not disruptive" --durations=25 "$@" \
  || status=$?
echo "==> tests that run alone (they judge latency or stop a shared server)"
pytest_part -m "solo or disruptive" --durations=10 "$@" || status=$?
exit "$status"
