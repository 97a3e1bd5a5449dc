# smelt — top-level entry points. See README.md.
#   make run    install what is missing, build, fetch the default model, start the main job
#   make test   install, build, and run every test (what CI runs)
BUILD    ?= build
JOBS     ?= $(shell nproc)
# The Python test references live in a virtual environment the Makefile makes (Debian's
# own python3 refuses `pip install` outside one: PEP 668). PYTHON=... uses another.
VENV     ?= .venv
PYTHON   ?= $(VENV)/bin/python
PREFIX   ?= /usr/local
CMAKE_FLAGS ?=
export PYTHON

.PHONY: all deps build install run test unit asan tsan fuzz fuzz-build models format clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Installs smelt, libsmelt.so and include/smelt.h under PREFIX (bin/, lib/, include/).
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

models: deps
	@scripts/fetch-test-models.sh

run: build models
	$(BUILD)/smelt serve models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf $(SERVE_ARGS)

# Unit tests (ctest), Python reference tests (pytest), the sanitizer build, bounded fuzzing.
# SMELT_REQUIRE_MODELS=1: a test that needs the test models (or the build, or a package of
# tests/requirements.txt) fails here instead of skipping (tests/unit/t.h, tests/py/conftest.py);
# -rs lists the skips that remain (../shared data, no GPU).
test: export SMELT_REQUIRE_MODELS = 1
test: build models
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	SMELT_BIN=$(abspath $(BUILD))/smelt $(PYTHON) -m pytest -q -rs tests/py
	$(MAKE) asan
	$(MAKE) fuzz

unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# AddressSanitizer + UBSan build (CUDA off: no GPU here): the unit tests, then the server's
# end-to-end suites against its smelt (tests/py/smelt_server.py fails a test whose server
# printed a sanitizer report, LeakSanitizer's at exit included). -O1, as ASan advises: at -O0
# the CPU forward is ~10x slower. Measured on 2 cores: build 3 min (cpu_matmul_avx512.c alone
# takes 140 s at -O1 with both sanitizers), unit tests 11 s, server suites 65 s; at -O0 the
# build takes 23 s but the unit tests 35 s and the server suites 11 min.
SAN_ENV = ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
asan: deps
	@CC=clang cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DSMELT_SANITIZE=ON \
		"-DCMAKE_C_FLAGS_DEBUG=-g -O1" >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && $(SAN_ENV) ctest --output-on-failure -j $(JOBS)
	$(SAN_ENV) SMELT_BIN=$(abspath $(BUILD))-asan/smelt $(PYTHON) -m pytest -q -rs tests/py/test_server_*.py

# ThreadSanitizer build (clang, CUDA off, Debug at -O1): the unit tests, then the server's
# suites against its smelt (tests/py/smelt_server.py fails a test whose server reported a
# race). Not part of `make test`: about 4 min on 2 cores (build 20 s, unit tests 77 s of
# which test_forward_real 75 s, server suites 140 s of which the SDK suite 58 s).
TSAN_CMAKE = -DCMAKE_BUILD_TYPE=Debug -DSMELT_CUDA=OFF "-DCMAKE_C_FLAGS=-fsanitize=thread" \
	"-DCMAKE_C_FLAGS_DEBUG=-g -O1" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
	-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread
tsan: deps
	@CC=clang cmake -S . -B $(BUILD)-tsan $(TSAN_CMAKE) >/dev/null
	@cmake --build $(BUILD)-tsan -j $(JOBS)
	cd $(BUILD)-tsan && TSAN_OPTIONS=second_deadlock_stack=1 ctest --output-on-failure -j $(JOBS)
	TSAN_OPTIONS=second_deadlock_stack=1 SMELT_BIN=$(abspath $(BUILD))-tsan/smelt \
		$(PYTHON) -m pytest -q -rs tests/py/test_server_*.py

fuzz-build: deps
	@CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=Debug -DSMELT_FUZZ=ON >/dev/null
	@cmake --build $(BUILD)-fuzz -j $(JOBS)

# Each fuzz target runs for FUZZ_SECONDS on its committed seed corpus (fuzz/corpus/NAME), JOBS
# targets at a time.
FUZZ_SECONDS ?= 60
fuzz: fuzz-build
	@scripts/run-fuzz.sh $(BUILD)-fuzz $(FUZZ_SECONDS) $(JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-fuzz
