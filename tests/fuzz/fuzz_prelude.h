/* Force-included into every C file of the fuzz build (NF_FUZZ=ON): clang 14 rejects
 * __builtin_cpu_supports("f16c"), which codec.c uses for its run-time SIMD check, so the fuzz
 * build answers "no" and runs the scalar paths. */
#define __builtin_cpu_supports(x) 0
