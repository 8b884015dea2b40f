/* The tokenizer.* metadata of an artifact (docs/model_schema.md) from the conversion source:
 * tokenizer.json + tokenizer_config.json + generation_config.json of a Hugging Face folder, or the
 * tokenizer.ggml.* keys of a GGUF. A folder without tokenizer.json converts with a warning and no
 * tokenizer.* keys (test models). */
#ifndef NF_CONVERT_TOKMETA_H
#define NF_CONVERT_TOKMETA_H

#include "base/error.h"
#include "convert/plan.h"
#include "format/artifact.h"

nf_status nf_convert_tokenizer_meta(const nf_plan *p, nf_artifact_writer *w, nf_error *err);

#endif
