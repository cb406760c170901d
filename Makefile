# snapstore: one entry point for set-up, demo, tests, sanitizers and benchmarks.
#   make demo   install what is needed, build, run the demo (checkpoint, mutate, restore)
#   make test   install what is needed, build, run the whole test suite (what CI runs)
#   make dist-check  build the sdist and wheel, install the sdist in a fresh virtualenv, smoke-test it
PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
# Test processes (pytest-xdist): one per core, at most 4. Most tests wait on fsync or on child
# processes, so the suite ran on one core of two. --dist loadfile: each test file runs whole,
# in order, on one process, as it does serially (module fixtures run once; the README's
# examples build on each other in one working directory).
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
ASAN_LIB := $(shell gcc -print-file-name=libasan.so 2>/dev/null)
UBSAN_LIB := $(shell gcc -print-file-name=libubsan.so 2>/dev/null)
NATIVE_TESTS := tests/unit/test_native.py tests/property/test_native_property.py tests/golden \
  tests/unit/test_dirty.py tests/property/test_dirty_property.py \
  tests/unit/test_planes.py tests/property/test_planes_property.py \
  tests/unit/test_native_records.py tests/property/test_read_chunks_property.py \
  tests/unit/test_native_write_chunks.py tests/property/test_write_chunks_property.py \
  tests/unit/test_native_delta_records.py tests/property/test_delta_records_property.py
ASAN_DIR := build/asan
ASAN_ENV := LD_PRELOAD="$(ASAN_LIB) $(UBSAN_LIB)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

DIST_DIR := build/dist
DIST_VENV := build/dist-venv
PIP_VENV := $(PYTHON) -m pip --disable-pip-version-check --python $(DIST_VENV)/bin/python

.PHONY: deps test-deps build demo test test-fast asan dist dist-check bench clean

deps:  ## system headers + Python packages (idempotent)
	@test -f /usr/include/xxhash.h -a -f /usr/include/zstd.h || { apt-get update -qq && \
	  apt-get install -y -qq libxxhash-dev libzstd-dev; }
	@# strace: tests count the syncs a commit makes (tests/unit/test_unsynced_marks.py)
	@command -v strace >/dev/null || { apt-get update -qq && apt-get install -y -qq strace; }
	@# setup.py build_ext below runs with the environment's setuptools, not pip's isolated
	@# one: install the build requirements of pyproject.toml first (a fresh machine has 65,
	@# which rejects the SPDX `license` string).
	$(PYTHON) -m pip install -q --disable-pip-version-check 'setuptools>=77' 'cffi>=1.16' wheel
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[test]'

test-deps: deps  ## the optional integrations the suite tests (torch: the CPU build, pinned)
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[test,torch]'

build: deps
	$(PYTHON) setup.py -q build_ext --inplace --force
	@# Byte-compile the package and the tests' helpers once. Where PYTHONDONTWRITEBYTECODE
	@# is set (this machine sets it), Python never caches bytecode, so every process that
	@# imports snapstore compiled all of it again: 0.35 s a process, half of what a CLI
	@# command took. The suite starts hundreds of processes (CLI, kill and fork tests).
	@# Stale files are harmless: a .pyc is checked against its source's mtime and size.
	$(PYTHON) -m compileall -q snapstore tests benchmarks examples

demo: build
	$(PYTHON) examples/demo.py

test: build test-deps asan dist-check
	SNAPSTORE_DIST_DIR=$(CURDIR)/$(DIST_DIR) $(PYTEST) -q -n $(TEST_JOBS) --dist loadfile tests

test-fast:  ## tests without re-installing (developer loop)
	$(PYTEST) -q -x tests

asan: deps  ## C core built with AddressSanitizer + UBSan, running the C-core tests
	@# Built out of tree and run from a private copy of the package, so the in-tree
	@# snapstore/_ffi*.so (used by everyone else's test runs meanwhile) is never replaced
	@# by a sanitized build that only loads under LD_PRELOAD.
	rm -rf $(ASAN_DIR)/pkg
	SNAPSTORE_SANITIZE=1 $(PYTHON) setup.py -q build_ext --force \
	  --build-lib $(ASAN_DIR)/lib --build-temp $(ASAN_DIR)/tmp
	mkdir -p $(ASAN_DIR)/pkg/snapstore
	tar -C snapstore -cf - --exclude=__pycache__ --exclude='_ffi*' . | tar -C $(ASAN_DIR)/pkg/snapstore -xf -
	cp $(ASAN_DIR)/lib/snapstore/_ffi*.so $(ASAN_DIR)/pkg/snapstore/
	$(PYTHON) -m compileall -q $(ASAN_DIR)/pkg/snapstore
	cd $(ASAN_DIR)/pkg && $(ASAN_ENV) $(PYTHON) -c \
	  "import snapstore._ffi as m; assert '/$(ASAN_DIR)/pkg/' in m.__file__, m.__file__"
	cd $(ASAN_DIR)/pkg && $(ASAN_ENV) $(PYTEST) -q -p no:cacheprovider \
	  -n $(TEST_JOBS) --dist loadfile --rootdir=$(CURDIR) -c $(CURDIR)/pyproject.toml \
	  $(addprefix $(CURDIR)/,$(NATIVE_TESTS))

dist: deps  ## the sdist, and the wheel pip builds from it, into build/dist
	rm -rf $(DIST_DIR) $(DIST_VENV)
	$(PYTHON) -m build --sdist --outdir $(DIST_DIR) .
	$(PYTHON) -m venv --without-pip $(DIST_VENV)
	$(PIP_VENV) wheel -q --no-deps -w $(DIST_DIR) $(DIST_DIR)/snapstore-*.tar.gz

dist-check: dist  ## the sdist's wheel installed in a fresh virtualenv, smoke-tested outside the tree
	@# What `pip install snapstore-*.tar.gz` does, in two steps so the wheel is kept: pip
	@# builds the wheel from the sdist (isolated build), then installs it with its
	@# dependencies. tests/unit/test_packaging.py checks both files' contents (`make test`
	@# passes it SNAPSTORE_DIST_DIR, so they are built once).
	$(PIP_VENV) install -q $(DIST_DIR)/snapstore-*.whl
	cd $(DIST_VENV) && bin/python $(CURDIR)/tests/dist_smoke.py

bench: build  ## benchmarks (not part of `make test`)
	$(PYTHON) benchmarks/bench_kernels.py

clean:
	rm -rf build snapstore/_ffi*.so snapstore/_ffi.c *.egg-info
