# `make demo`, `make example` and `make test` create .venv if missing and build jgsess there
# (`make test` and `make bench` also build the test-only extension tests/native/_testing: the
# SIMT emulator of the CUDA kernels, host test hooks, bandwidth probes); `make lint` checks the
# Python (ruff) and C++/CUDA (clang-format) style and the types (mypy, `make typecheck`); `make
# test-oldest-jax` runs the type check and the tests on the oldest jax jgsess supports; `make
# test-peer` runs JAX's own jit tests with jax.jit swapped for jgsess.jit (tests/peer); `make
# test-device-jax` rehearses the GPU check on the GPU machine's jax (.ci/device-jax).
# .ci/run is all of them.
PYTHON ?= python3
VENV ?= .venv
JAX ?= "jax>=0.7"
# the oldest jax jgsess supports (pyproject.toml: jax>=0.7), tested in a copy of the tree
TESTS ?= tests
OLDEST_JAX ?= jax==0.7.2 jaxlib==0.7.2
OLDEST_DIR ?= .ci/oldest-jax
OLDEST_TESTS ?= tests
# the kernels' numbers (the `kernels` fixture's cpu and simt tests, vmap's aside) are C++'s
# alone: checked on the newest jax; on the oldest, the malformed calls, the batching and
# partitioning rules and the fusion suites check the FFI boundary
OLDEST_PYTEST_ARGS ?= -k 'not (kernels and (simt or (cpu and not batching)))'
LINT_TOOLS := ruff==0.17.6 clang-format==23.1.5
TYPECHECK_TOOLS := mypy==2.4.1
PY := $(VENV)/bin/python
STAMP := $(VENV)/.jgsess-built
TESTING_STAMP := $(VENV)/.jgsess-testing-built
SOURCES := setup.py pyproject.toml $(shell find csrc -type f)
CSRC := $(shell find csrc examples -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh')

.PHONY: demo example test test-peer test-public-road build build-testing bench tools lint typecheck \
	test-oldest-jax test-device-jax clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) $(SOURCES)
	$(PY) -m pip install --quiet --disable-pip-version-check "setuptools>=64" wheel "pybind11>=2.12" $(JAX)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[test,demo]" $(JAX)
	touch $(STAMP)

build: $(STAMP)

# the test-only extension (the CUDA sources compiled as C++ for the SIMT emulator, csrc/testing/checks,
# csrc/testing/bench), never in the wheel
$(TESTING_STAMP): $(STAMP) tests/native/build.py
	$(PY) tests/native/build.py
	touch $(TESTING_STAMP)

build-testing: $(TESTING_STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# a kernel of your own in unmodified flax and jnp models: examples/rmsnorm (builds its C++ FFI
# kernel against jax's headers, registers it, trains three models under jax.jit and jgsess.jit)
example: $(STAMP)
	$(PY) examples/rmsnorm/train.py

test: $(STAMP) $(TESTING_STAMP)
	$(PY) -m pytest -q $(TESTS) $(PYTEST_ARGS)

# jgsess.jit's public road (jax's public API alone, JGSESS_ROAD=public) through the fusion,
# jit-parity and composition suites; tests marked hook_road are strict xfails there
PUBLIC_ROAD_TESTS ?= tests/passes tests/test_jit_parity.py tests/test_compositions.py \
	tests/test_jit.py tests/test_roads.py tests/test_user_kernels.py
test-public-road: $(STAMP) $(TESTING_STAMP)
	JGSESS_ROAD=public $(PY) -m pytest -q $(PUBLIC_ROAD_TESTS)

# JAX's jit tests (api_test.py, jax_jit_test.py of jax $(PEER_JAX)), read in place from PEER, run
# with every jax.jit they write swapped for jgsess.jit (PEER_JIT=jax: the baseline, nothing
# swapped). They test that jax release: skipped, saying why, where PEER or that jax is missing;
# PEER_REQUIRED=1 (CI) makes a skip an error.
PEER ?= ../shared/peer/jax-$(PEER_JAX)/tests
PEER_JAX := 0.10.2
PEER_JIT ?= jgsess
PEER_REQUIRED ?= 0
PEER_SKIP = echo "test-peer: skipped, $(1)"; [ "$(PEER_REQUIRED)" != 1 ]
test-peer: $(STAMP)
	@if [ ! -d "$(PEER)" ]; then $(call PEER_SKIP,no JAX tests at $(PEER)); \
	elif [ "$$($(PY) -c 'import jax; print(jax.__version__)')" != "$(PEER_JAX)" ]; then \
	  $(call PEER_SKIP,JAX's tests at $(PEER) are jax $(PEER_JAX)'s: .venv has another); \
	else $(PY) -m pytest -q -p no:cacheprovider -p tests.peer.swap --jit=$(PEER_JIT) -c /dev/null \
	  --rootdir "$(abspath $(PEER))/.." "$(PEER)/api_test.py" "$(PEER)/jax_jit_test.py"; fi

bench: $(STAMP) $(TESTING_STAMP)
	$(PY) benchmarks/optimizer_step.py

# the linters and the type checker, installed in .venv (CI installs them before its legs run)
tools: $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check $(LINT_TOOLS) $(TYPECHECK_TOOLS)

lint: $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check $(LINT_TOOLS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/clang-format --dry-run -Werror $(CSRC)
	$(MAKE) typecheck

# mypy over the package (pyproject.toml), against the jax installed in $(VENV)
typecheck: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TYPECHECK_TOOLS)
	$(VENV)/bin/mypy

test-oldest-jax:
	.ci/copy-tree $(OLDEST_DIR)/src
	JGSESS_CUDA=0 $(MAKE) -C $(OLDEST_DIR)/src typecheck test VENV=$(abspath $(OLDEST_DIR))/venv \
		JAX="$(OLDEST_JAX)" TESTS="$(OLDEST_TESTS)" PYTEST_ARGS="$(OLDEST_PYTEST_ARGS)"

# the GPU check's rehearsal on the GPU machine's jax (0.11.2, Python 3.13 in a Debian 13 chroot
# made by debootstrap: as root), the CUDA kernels built where nvcc is
test-device-jax:
	.ci/device-jax

clean:
	rm -rf build *.egg-info jgsess/_C*.so tests/native/_testing*.so $(OLDEST_DIR)
