# The two self-bootstrapping entry points of a fresh clone:
#   make demo   install what the demo runs (no Go builds), start Kafka, Cassandra and Redis
#               and run `notiflow demo`
#   make test   install everything, start the local stack and run the whole test suite
.PHONY: demo test test-cluster bootstrap bootstrap-demo lint fuzz stack-up stack-down clean

VENV := .venv

bootstrap:
	@ops/bootstrap.sh

bootstrap-demo:
	@ops/bootstrap.sh --demo

demo: bootstrap-demo
	$(VENV)/bin/notiflow demo

test: bootstrap
	@ops/run-tests.sh

# the integration tier on three Kafka brokers and three Cassandra nodes (127.0.0.1-3, RF 3),
# in a stack directory of its own; stop the one-node stack first (same ports). The
# benchmarks' smoke tests stay out: the benchmarks measure the one-node stack.
test-cluster: bootstrap
	@NOTIFLOW_STACK_DIR=.stack-cluster ops/run-tests.sh --nodes 3 tests/integration \
	  --ignore=tests/integration/test_bench_smoke.py \
	  --ignore=tests/integration/test_bench_api_smoke.py $(PYTEST_ARGS)

lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

fuzz: bootstrap
	NOTIFLOW_FUZZ_EXAMPLES=$${NOTIFLOW_FUZZ_EXAMPLES:-10000} $(VENV)/bin/pytest -q tests/unit/test_fuzz_parsers.py

stack-up: bootstrap
	$(VENV)/bin/notiflow stack up

stack-down:
	$(VENV)/bin/notiflow stack down

clean: stack-down
	rm -rf .stack $(VENV)
