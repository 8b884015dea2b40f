# The fuzz targets: tests/fuzz/fuzz_<name>.c, the library it links, and its input list
# tests/fuzz/inputs/<name>.txt (seed files and folders plus the regress folder, relative to tests/).
# Every target's body also runs as a plain ctest, test_fuzz_regress_<name> (label cpu, so `make asan`
# runs it), over its input list: the fuzzer and CI share one source of truth for each harness.
set(NF_FUZZ_TARGETS artifact gguf safetensors hf_config tokenizer_json)
set(NF_FUZZ_LIB_artifact nf_format)
set(NF_FUZZ_LIB_gguf nf_format)
set(NF_FUZZ_LIB_safetensors nf_format)
set(NF_FUZZ_LIB_hf_config nf_convert)
set(NF_FUZZ_LIB_tokenizer_json nf_tokenizer)

# Absolute paths of a target's inputs, for the regress test's command line.
function(nf_fuzz_inputs name out)
  file(STRINGS ${CMAKE_SOURCE_DIR}/tests/fuzz/inputs/${name}.txt lines REGEX "^[^#]")
  set(paths "")
  foreach(l ${lines})
    list(APPEND paths ${CMAKE_SOURCE_DIR}/tests/${l})
  endforeach()
  set(${out} ${paths} PARENT_SCOPE)
endfunction()
