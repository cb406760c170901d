# snapstore: one entry point for set-up, demo, tests, sanitizers and benchmarks.
#   make demo   install what is needed, build, run the demo (checkpoint, mutate, restore)
#   make test   install what is needed, build, run the whole test suite (what CI runs)
PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
ASAN_LIB := $(shell gcc -print-file-name=libasan.so 2>/dev/null)
UBSAN_LIB := $(shell gcc -print-file-name=libubsan.so 2>/dev/null)
NATIVE_TESTS := tests/unit/test_native.py tests/property/test_native_property.py tests/golden

.PHONY: deps build demo test test-fast asan bench clean

deps:  ## system header + Python packages (idempotent)
	@test -f /usr/include/xxhash.h || { apt-get update -qq && apt-get install -y -qq libxxhash-dev; }
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[test]'

build: deps
	$(PYTHON) setup.py -q build_ext --inplace --force

demo: build
	$(PYTHON) examples/demo.py

test: build asan
	$(PYTEST) -q tests

test-fast:  ## tests without re-installing (developer loop)
	$(PYTEST) -q -x tests

asan: deps  ## C core built with AddressSanitizer + UBSan, running the C-core tests
	SNAPSTORE_SANITIZE=1 $(PYTHON) setup.py -q build_ext --inplace --force --build-temp build/asan
	LD_PRELOAD="$(ASAN_LIB) $(UBSAN_LIB)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(PYTEST) -q -p no:cacheprovider $(NATIVE_TESTS)
	$(PYTHON) setup.py -q build_ext --inplace --force

bench: build  ## benchmarks (not part of `make test`)
	$(PYTHON) benchmarks/bench_kernels.py

clean:
	rm -rf build snapstore/_ffi*.so snapstore/_ffi.c *.egg-info
