/* What `ninfer run` and `ninfer chat` share: the model/engine/sampler flags and opening a session
 * (model, engine, tokenizer, sampler, end-of-generation ids) from them. */
#ifndef NF_TOOLS_GEN_COMMON_H
#define NF_TOOLS_GEN_COMMON_H

#include "cli.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

enum { NF_GEN_CLI_MAX_OPTS = 18 };

typedef struct nf_gen_cli {
    const char *model_path, *stop, *device, *spec;
    long n_predict, threads, ctx, top_k, seed, repeat_last_n;
    double temp, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int kv_bf16;
} nf_gen_cli;

void nf_gen_cli_defaults(nf_gen_cli *g);
/* Fills opts (room for NF_GEN_CLI_MAX_OPTS) with the shared flags; returns how many. */
int nf_gen_cli_opts(nf_gen_cli *g, nf_opt *opts);

typedef struct nf_gen_session {
    nf_model *model;
    nf_engine *eng;
    nf_tokenizer *tok;
    nf_sampler *sampler;
    nf_gen_params params;
    const char *stops[1];
    int32_t eos_one;
} nf_gen_session;

nf_status nf_gen_session_open(const nf_gen_cli *g, nf_gen_session *s, nf_error *err);
void nf_gen_session_close(nf_gen_session *s);
/* "prompt: N tokens in X s (Y tokens/s) | generation: ..." on stderr, and with speculation a second
 * line: drafts, accepted, acceptance rate, tokens per forward. */
void nf_gen_print_stats(const nf_gen_stats *st, const nf_engine *e, uint32_t spec_k, int spec_mtp);

#endif
