#!/usr/bin/env bash
# The whole test suite against the real local stack. Starts the stack if it is not running
# and stops it again on exit (only if this script started it). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
NF=.venv/bin/notiflow

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
$NF stack up
echo "==> tests"
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
