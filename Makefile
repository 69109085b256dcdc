# Two targets do all the set-up on a fresh machine with Python 3.11+:
#   make run    the main job on the bundled example KB
#   make test   lint, the import-linter layer contracts and the whole test suite
#               (what .ci/run runs)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("reviewq needs Python 3.11+") if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The sweep exits 1 when a job failed or waits; the morning report is written either way.
run: $(STAMP)
	$(BIN)/reviewq sweep --reviewer offline --fix; status=$$?; \
	$(BIN)/reviewq report --html .reviewq/report.html && exit $$status

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

# Three test processes on two cores: most tests wait on real processes (agents, consumers,
# servers) rather than compute; serially the suite took 34 min, in three 14.
test: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 3

bench: $(STAMP)
	$(BIN)/python bench/selector.py

clean:
	rm -rf $(VENV) .reviewq build *.egg-info
