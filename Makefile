# The two self-bootstrapping entry points of a fresh clone:
#   make demo   install everything, start the local stack and run `notiflow demo`
#   make test   install everything, start the local stack and run the whole test suite
.PHONY: demo test bootstrap lint fuzz stack-up stack-down clean

VENV := .venv

bootstrap:
	@ops/bootstrap.sh

demo: bootstrap
	$(VENV)/bin/notiflow demo

test: bootstrap
	@ops/run-tests.sh

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
