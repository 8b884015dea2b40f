/* Text side of a model artifact: its tokenizer from the `tokenizer.*` metadata
 * (docs/model_schema.md) and the ids that end generation. */
#ifndef NF_ENGINE_TEXT_H
#define NF_ENGINE_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "format/artifact.h"
#include "tokenizer/tokenizer.h"

/* Builds the tokenizer; NF_ERR_UNSUPPORTED naming the file when the artifact has none (a test
 * model), so commands that need text can say so. */
nf_status nf_text_tokenizer(const nf_artifact *a, nf_tokenizer **out, nf_error *err);

/* The ids that end generation: tokenizer.eos_ids, else tokenizer.eos_id; *n = 0 when none.
 * *ids points into the artifact (or at *one). */
void nf_text_eos_ids(const nf_artifact *a, const int32_t **ids, size_t *n, int32_t *one);

#endif
