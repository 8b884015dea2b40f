/* Executing a conversion plan (plan.h): tensor by tensor into an artifact through the artifact
 * writer (temporary name, then rename), with bounded memory: one output tensor's encoded rows are
 * produced in batches of a few MiB (an nvfp4 tensor is assembled whole: its scale plane is
 * swizzled across 128-row tiles), and the mapped source pages are dropped after every batch (nvfp4:
 * every source matrix), so the resident set is about one batch, or one nvfp4 tensor's payload. */
#ifndef NF_CONVERT_CONVERT_H
#define NF_CONVERT_CONVERT_H

#include "base/error.h"
#include "convert/plan.h"

typedef struct nf_convert_stats {
    uint64_t bytes_in, bytes_out; /* source bytes read, payload bytes written */
    double seconds;
} nf_convert_stats;

/* Writes the artifact at `out`: model.* metadata from the plan's config, tokenizer.* from the
 * source (tokenizer.json + tokenizer_config.json + generation_config.json, or GGUF tokenizer.ggml.*;
 * a folder without tokenizer.json converts with a warning), provenance.*, then every tensor.
 * Progress goes to stderr unless o->quiet. stats may be NULL. */
nf_status nf_convert_run(const nf_plan *p, const char *out, const nf_convert_opts *o, nf_convert_stats *stats,
                         nf_error *err);

/* One part row decoded to f32 (row r of the part, 0 <= r < part->rows), exactly as the source
 * defines its values. Exposed for tests. */
nf_status nf_convert_part_row(const nf_plan *p, const nf_plan_part *q, uint64_t cols, uint64_t r, float *y,
                              nf_error *err);

#endif
