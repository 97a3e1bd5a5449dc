# smelt — top-level entry points. See README.md.
#   make run    install what is missing, build, fetch the default model, start the main job
#   make test   install, build, and run every test (what CI runs)
BUILD    ?= build
JOBS     ?= $(shell nproc)
PYTHON   ?= python3
CMAKE_FLAGS ?=

.PHONY: all deps build run test unit asan fuzz fuzz-build models format clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

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

# AddressSanitizer + UBSan build of the library and unit tests (CUDA off: no GPU here).
asan: deps
	@CC=clang cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DSMELT_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

fuzz-build: deps
	@CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=Debug -DSMELT_FUZZ=ON >/dev/null
	@cmake --build $(BUILD)-fuzz -j $(JOBS)

# Each fuzz target runs for FUZZ_SECONDS on its committed seed corpus (fuzz/corpus/NAME).
FUZZ_SECONDS ?= 60
fuzz: fuzz-build
	@scripts/run-fuzz.sh $(BUILD)-fuzz $(FUZZ_SECONDS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
