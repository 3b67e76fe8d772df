# Two commands: `make demo` and `make test`. Both create .venv if missing and build jgsess there.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.jgsess-built
SOURCES := setup.py pyproject.toml $(shell find csrc -type f)

.PHONY: demo test build bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) $(SOURCES)
	$(PY) -m pip install --quiet --disable-pip-version-check "setuptools>=64" wheel "pybind11>=2.12" "jax>=0.7"
	$(PY) -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[test,demo]"
	touch $(STAMP)

build: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/optimizer_step.py

clean:
	rm -rf build *.egg-info jgsess/_C*.so
