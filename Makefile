# Thin wrapper over CMake. `make` builds Release into build/; `make test` builds and runs ctest;
# `make asan` builds build-asan/ with ASan+UBSan (no CUDA) and runs the CPU tests.
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
BUILD ?= build
GENERATOR := $(if $(shell command -v ninja),Ninja,Unix Makefiles)

.PHONY: all build test asan clean gpu-bundle

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

build-asan/CMakeCache.txt:
	cmake -S . -B build-asan -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug -DNF_SANITIZE=ON -DNF_CUDA=OFF

asan: build-asan/CMakeCache.txt
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS) -L cpu

# A self-contained folder to carry to the GPU machine: ninfer, the cuda-labelled tests and a
# CTestTestfile with relative paths, so `ctest --test-dir gpu-bundle` runs there as here.
gpu-bundle: build
	cmake --build $(BUILD) --target gpu-bundle

clean:
	rm -rf build build-asan gpu-bundle
