/* What plan.c (storage, codec decisions, the entry) shares with plan_hf.c and plan_gguf.c (the two
 * sources' plans). Not for use outside src/convert/plan*.c. */
#ifndef NF_CONVERT_PLAN_INTERNAL_H
#define NF_CONVERT_PLAN_INTERNAL_H

#include "convert/plan.h"
#include "convert/recipe.h"

/* Appends an output tensor (name, shape; no parts yet, one divisor) to the plan; NULL when out of
 * memory (err set). The pointer is valid until the next call. */
nf_plan_tensor *nf_plan_add_tensor(nf_plan *p, const char *name, uint32_t n_dims, const uint64_t *dims, nf_error *err);
/* Appends a zeroed part to t; NULL when out of memory (err set). */
nf_plan_part *nf_plan_add_part(nf_plan_tensor *t, nf_error *err);
/* Decides codec and action of a tensor whose parts are known: carried-over codecs, else the
 * recipe's (recipe.h) with its row-length fallback. */
nf_status nf_plan_decide(nf_plan *p, nf_plan_tensor *t, nf_role r, int layer, nf_error *err);

/* The plan of the Hugging Face checkpoint directory dir (plan_hf.c). */
nf_status nf_plan_hf(nf_plan *p, const char *dir, nf_error *err);

/* The plan of the GGUF at p->source (plan_gguf.c). */
nf_status nf_plan_gguf(nf_plan *p, nf_error *err);

#endif
