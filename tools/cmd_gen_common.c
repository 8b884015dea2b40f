/* Shared by cmd_run.c and cmd_chat.c (see gen_common.h); registers no command itself. */
#include <stdio.h>
#include <string.h>

#include "gpu_bench.h"
#include "engine/spec.h"
#include "engine/text.h"
#include "gen_common.h"

void nf_gen_cli_defaults(nf_gen_cli *g)
{
    nf_sampler_params d = nf_sampler_defaults();
    *g = (nf_gen_cli){.device = "auto", .n_predict = 128, .top_k = d.top_k, .seed = 0, .repeat_last_n = d.repeat_last_n,
                      .temp = d.temp, .top_p = d.top_p, .min_p = d.min_p, .repeat_penalty = d.repeat_penalty};
}

int nf_gen_cli_opts(nf_gen_cli *g, nf_opt *o)
{
    int n = 0;
    o[n++] = (nf_opt){"--model", 'm', NF_OPT_STRING, &g->model_path, "FILE", "the .nf model (required)", 0, 0};
    o[n++] = (nf_opt){"--n-predict", 'n', NF_OPT_INT, &g->n_predict, "N", "tokens to generate at most (default 128)", 0, 1 << 24};
    o[n++] = (nf_opt){"--temp", 0, NF_OPT_FLOAT, &g->temp, "T", "temperature; 0 = greedy (default 0.8)", 0, 100};
    o[n++] = (nf_opt){"--top-k", 0, NF_OPT_INT, &g->top_k, "K", "keep the K most likely tokens; 0 = all (default 40)", 0, 1 << 24};
    o[n++] = (nf_opt){"--top-p", 0, NF_OPT_FLOAT, &g->top_p, "P", "nucleus mass; 1 = off (default 0.95)", 0, 1};
    o[n++] = (nf_opt){"--min-p", 0, NF_OPT_FLOAT, &g->min_p, "P", "drop p < P * p_max; 0 = off (default 0.05)", 0, 1};
    o[n++] = (nf_opt){"--repeat-penalty", 0, NF_OPT_FLOAT, &g->repeat_penalty, "R", "repetition penalty; 1 = off (default 1)", 0.01, 100};
    o[n++] = (nf_opt){"--presence-penalty", 0, NF_OPT_FLOAT, &g->presence_penalty, "P", "subtract P from every id seen (OpenAI); 0 = off (default)", -2, 2};
    o[n++] = (nf_opt){"--frequency-penalty", 0, NF_OPT_FLOAT, &g->frequency_penalty, "F", "subtract F per occurrence (OpenAI); 0 = off (default)", -2, 2};
    o[n++] = (nf_opt){"--repeat-last-n", 0, NF_OPT_INT, &g->repeat_last_n, "N", "tokens the penalties look back (default 64)", 0, 1 << 24};
    o[n++] = (nf_opt){"--seed", 's', NF_OPT_INT, &g->seed, "S", "sampler seed (default 0): the same seed gives the same text", 0, 9.0e15};
    o[n++] = (nf_opt){"--threads", 't', NF_OPT_INT, &g->threads, "N", "worker threads (default: all CPUs)", 0, 1024};
    o[n++] = (nf_opt){"--ctx", 'c', NF_OPT_INT, &g->ctx, "N", "context length (default: the model's, at most 4096)", 0, 1 << 24};
    o[n++] = (nf_opt){"--stop", 0, NF_OPT_STRING, &g->stop, "TEXT", "stop when this text is generated", 0, 0};
    o[n++] = (nf_opt){"--kv-bf16", 0, NF_OPT_FLAG, &g->kv_bf16, NULL, "CPU: keep the KV cache in bf16 (default f32; cuda is always bf16)", 0, 0};
    o[n++] = (nf_opt){"--device", 0, NF_OPT_STRING, &g->device, "DEV", "cpu, cuda or auto (default: cuda when a GPU is visible)", 0, 0};
    o[n++] = (nf_opt){"--spec", 0, NF_OPT_STRING, &g->spec, "ngram:K|mtp:K", "speculative decoding: up to K drafts a step "
                      "by prompt lookup (ngram, K 1..8) or by the model's MTP block (mtp, K 1..3; hybrids with "
                      "mtp.* weights), verified in one forward (greedy: the same text; on CUDA up to the first "
                      "near tie)", 0, 0};
    return n;
}

nf_status nf_gen_session_open(const nf_gen_cli *g, nf_gen_session *s, nf_error *err)
{
    memset(s, 0, sizeof *s);
    uint32_t spec_k = 0;
    nf_spec_mode mode = NF_SPEC_MODE_NGRAM;
    nf_status st = g->spec ? nf_spec_parse(g->spec, &mode, &spec_k, err) : NF_OK;
    if (st || (st = nf_model_load(g->model_path, &s->model, err))) return st;
    nf_engine_opts eo = {.device = g->device, .threads = (int)g->threads, .ctx = (uint32_t)g->ctx, .kv_bf16 = g->kv_bf16,
                         .mtp = spec_k && mode == NF_SPEC_MODE_MTP};
    nf_sampler_params sp = {.temp = (float)g->temp, .top_k = (int)g->top_k, .top_p = (float)g->top_p,
                            .min_p = (float)g->min_p, .repeat_penalty = (float)g->repeat_penalty,
                            .repeat_last_n = (int)g->repeat_last_n, .seed = (uint64_t)g->seed,
                            .presence_penalty = (float)g->presence_penalty,
                            .frequency_penalty = (float)g->frequency_penalty};
    if ((st = nf_text_tokenizer(s->model->art, &s->tok, err)) || (st = nf_engine_create(s->model, &eo, &s->eng, err)) ||
        (st = nf_sampler_create(&sp, s->model->cfg.vocab, &s->sampler, err)) ||
        (spec_k && (st = nf_spec_check(s->eng, mode, spec_k, err)))) {
        nf_gen_session_close(s);
        return st;
    }
    nf_text_eos_ids(s->model->art, &s->params.eos, &s->params.n_eos, &s->eos_one);
    s->params.max_new = (size_t)g->n_predict;
    s->params.spec_k = spec_k;
    s->params.spec_mtp = mode == NF_SPEC_MODE_MTP;
    if (g->stop && *g->stop) {
        s->stops[0] = g->stop;
        s->params.stops = s->stops;
        s->params.n_stops = 1;
    }
    return NF_OK;
}

void nf_gen_session_close(nf_gen_session *s)
{
    nf_sampler_free(s->sampler);
    nf_engine_free(s->eng);
    nf_tok_free(s->tok);
    nf_model_free(s->model);
    memset(s, 0, sizeof *s);
}

/* Bytes of K and V one decoded token reads on average over the generation (the cache grows from
 * prompt to prompt + gen tokens). */
static double kv_bytes_per_token(const nf_gen_stats *st, const nf_engine *e)
{
    const nf_model_config *c = &e->model->cfg;
    const double esz = strcmp(e->ops->name, "cuda") == 0 || e->opts.kv_bf16 ? 2 : 4;
    const double avg_len = (double)st->prompt_tokens + (double)st->gen_tokens / 2;
    return avg_len * c->layers * 2.0 * c->kv_heads * c->head_dim * esz;
}

void nf_gen_print_stats(const nf_gen_stats *st, const nf_engine *e, uint32_t spec_k, int spec_mtp)
{
    static const char *why[] = {"length", "end-of-generation token", "stop string", "context full"};
    /* weights streamed per decoded token: every dense byte, k/E of each expert bank, one embedding row */
    const double gbw = (double)nf_model_bytes_per_token(e->model) * 1e-9, gbkv = kv_bytes_per_token(st, e) * 1e-9;
    const double gen_tps = st->gen_s > 0 ? (double)st->gen_tokens / st->gen_s : 0.0;
    const double gbs = (gbw + gbkv) * gen_tps;
    char peak[96] = "";
    if (strcmp(e->ops->name, "cuda") == 0) {
        const double p = nf_gpu_bench_read_peak(); /* the figure the GB/s is a share of */
        if (p > 0) snprintf(peak, sizeof peak, " = %.1f%% of the %.0f GB/s measured DRAM read peak", 100 * gbs / p, p);
    }
    char dev[48];
    if (strcmp(e->ops->name, "cpu") == 0) snprintf(dev, sizeof dev, "cpu, %d threads", e->opts.threads);
    else snprintf(dev, sizeof dev, "%s", e->ops->name);
    fprintf(stderr, "prompt: %zu tokens in %.3f s (%.1f tokens/s) | generation: %zu tokens in %.3f s (%.1f tokens/s, "
            "%.3f GB of weights + %.3f GB of KV per token = %.1f GB/s%s) | %s | ended by %s\n",
            st->prompt_tokens, st->prompt_s, st->prompt_s > 0 ? (double)st->prompt_tokens / st->prompt_s : 0.0,
            st->gen_tokens, st->gen_s, gen_tps, gbw, gbkv, gbs, peak, dev, why[st->end]);
    if (!spec_k) return;
    /* the prompt's forward picked the first token, so without speculation this is exactly 1 */
    fprintf(stderr, "speculation %s:%u: %zu drafted, %zu accepted (%.1f%%), %.2f tokens per forward (%zu forwards)\n",
            spec_mtp ? "mtp" : "ngram", spec_k, st->drafted, st->accepted, st->drafted ? 100.0 * (double)st->accepted / (double)st->drafted : 0.0,
            (double)st->gen_tokens / (double)(st->forwards + 1), st->forwards + 1);
}
