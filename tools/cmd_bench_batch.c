/* `ninfer bench batch -m model.nf -N 8 -p 512 -n 128`: many sequences at once through the scheduler
 * (engine/sched.h). N sequences of -p pseudo-random prompt ids arrive together; each generates -n
 * tokens greedily (no end-of-generation id: every sequence runs its -n tokens). Reported per N:
 *   agg t/s      all generated tokens over the run's wall time (prompt processing included);
 *   decode t/s   tokens of decode-only steps over those steps' time (the steady state, as
 *                llama-batched-bench's S_TG);
 *   seq t/s      median over sequences of (n - 1) / (last token - first token);
 *   step ms      median decode-only step, and the host's share of it (the step's time outside the
 *                backend's forward and logits fetch: batch building, sampling, stops, bookkeeping);
 *   TTFT ms      median time from arrival to the first token;
 *   pages        the most KV pages held at once (of the pool: --kv-pages, default N full sequences');
 *   preempted    sequences sent back to waiting when decode growth ran the pool dry.
 * --sweep runs N = 1, 2, 4, ... up to -N (default 256). --shared-prefix L gives every prompt the
 * same first L tokens and first runs one sequence with that prefix to completion (a previous
 * conversation with the same system prompt), then measures N with the prefix cache and again
 * without it: the TTFT column shows what the cache saves. Each measurement runs --warmup times
 * untimed first, then -r times; figures are means over the repetitions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "bench_info.h"
#include "cli.h"
#include "commands.h"
#include "engine/engine.h"
#include "engine/sched.h"

typedef struct batch_args {
    long n_seqs, n_prompt, n_gen, shared, reps, warmup, threads, chunk, page_tokens, kv_pages, seed;
    int sweep, kv_bf16, no_graphs, reserve;
    const char *device, *format, *admission;
} batch_args;

typedef struct row {
    long n_seqs;
    int cache; /* prefix cache on */
    double agg_tps, decode_tps, seq_tps, step_ms, host_pct, ttft_ms, preempted;
    uint32_t pages, kv_pages;
} row;

/* Per-sequence clock, filled by the event callback. */
typedef struct seq_clock {
    uint64_t first_ns, last_ns;
    size_t n;
} seq_clock;

static void on_event(void *ctx, const nf_seq_event *ev)
{
    seq_clock *c = ctx;
    if (ev->token < 0) return;
    const uint64_t t = nf_time_ns();
    if (!c->n++) c->first_ns = t;
    c->last_ns = t;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Prompt i: the shared first L ids (the same for all), then ids of its own. */
static void make_prompt(const batch_args *a, uint32_t vocab, long i, int32_t *ids)
{
    uint64_t s = (uint64_t)a->seed * 1000003u + 17, own = s + 1 + (uint64_t)i * 7919u;
    for (long j = 0; j < a->n_prompt; j++) ids[j] = (int32_t)(lcg(j < a->shared ? &s : &own) % vocab);
}

/* Adds sequence i (greedy, -n tokens) with its clock. */
static int add_seq(nf_sched *s, const batch_args *a, uint32_t vocab, long i, int32_t *ids, seq_clock *clk)
{
    nf_seq_params p = {.sampling = nf_sampler_defaults(), .max_new = (size_t)a->n_gen, .emit = on_event, .ctx = clk};
    p.sampling.temp = 0;
    make_prompt(a, vocab, i, ids);
    uint64_t id;
    nf_error err;
    if (nf_sched_add(s, ids, (size_t)a->n_prompt, &p, &id, &err)) return nf_cli_fail("bench batch: %s", err.msg);
    return 0;
}

/* What one run's steps add up to. */
typedef struct run_acc {
    double *step_ms, *host; /* [cap] decode-only steps: time, host share in % */
    size_t n_steps, cap;
    uint64_t dec_tokens;    /* tokens of decode-only steps */
    double dec_s;           /* their time */
    uint32_t peak;          /* KV pages held at most */
    long preempted;
} run_acc;

/* Steps to idle, accumulating into acc. Returns 0 or 1 (error printed). */
static int drive(nf_sched *s, run_acc *acc)
{
    nf_error err;
    while (!nf_sched_idle(s)) {
        nf_sched_step_info st;
        if (nf_sched_step(s, &st, &err)) return nf_cli_fail("bench batch: %s", err.msg);
        if (st.pages_used > acc->peak) acc->peak = st.pages_used;
        acc->preempted += st.n_preempted;
        if (!st.n_tokens || st.n_decode != st.n_seqs) continue;
        acc->dec_tokens += st.n_tokens;
        acc->dec_s += (double)st.total_ns * 1e-9;
        if (acc->n_steps < acc->cap) {
            acc->step_ms[acc->n_steps] = (double)st.total_ns * 1e-6;
            acc->host[acc->n_steps++] = 100.0 * (double)(st.total_ns - st.forward_ns) / (double)st.total_ns;
        }
    }
    return 0;
}

/* One run of N sequences on a fresh scheduler; adds its figures into r (divided by reps later). */
static int run_once(nf_engine *e, const batch_args *a, long N, int cache, int32_t *ids, row *r)
{
    nf_sched *s;
    nf_error err;
    const nf_sched_opts so = {.no_prefix_cache = !cache, .reserve = a->reserve};
    if (nf_sched_create_engine(e, &so, &s, &err)) return nf_cli_fail("bench batch: %s", err.msg);
    const uint32_t vocab = e->model->cfg.vocab;
    seq_clock warm = {0}, *clk = calloc((size_t)N, sizeof *clk);
    run_acc acc = {.cap = (size_t)a->n_gen * 4 + 16};
    acc.step_ms = malloc(acc.cap * sizeof *acc.step_ms);
    acc.host = malloc(acc.cap * sizeof *acc.host);
    double *tt = malloc((size_t)N * sizeof *tt), *stps = malloc((size_t)N * sizeof *stps);
    int rc = clk && acc.step_ms && acc.host && tt && stps ? 0 : nf_cli_fail("out of memory");
    /* shared-prefix mode: a previous sequence with the same prefix leaves its pages in the cache */
    run_acc before = {0};
    if (!rc && a->shared && !(rc = add_seq(s, a, vocab, N, ids, &warm))) rc = drive(s, &before);
    const uint64_t t0 = nf_time_ns();
    for (long i = 0; !rc && i < N; i++) rc = add_seq(s, a, vocab, i, ids, &clk[i]);
    if (!rc) rc = drive(s, &acc);
    const double wall = (double)(nf_time_ns() - t0) * 1e-9;
    for (long i = 0; !rc && i < N; i++) {
        tt[i] = (double)(clk[i].first_ns - t0) * 1e-6;
        const double span = (double)(clk[i].last_ns - clk[i].first_ns) * 1e-9;
        stps[i] = clk[i].n > 1 && span > 0 ? (double)(clk[i].n - 1) / span : 0;
    }
    if (!rc) {
        r->agg_tps += (double)(N * a->n_gen) / wall;
        r->decode_tps += acc.dec_s > 0 ? (double)acc.dec_tokens / acc.dec_s : 0;
        r->seq_tps += median(stps, (size_t)N);
        r->ttft_ms += median(tt, (size_t)N);
        r->host_pct += median(acc.host, acc.n_steps);
        r->step_ms += median(acc.step_ms, acc.n_steps);
        r->preempted += (double)acc.preempted;
        if (acc.peak > r->pages) r->pages = acc.peak;
    }
    free(clk), free(acc.step_ms), free(acc.host), free(tt), free(stps);
    nf_sched_free(s);
    return rc;
}

static int measure(nf_engine *e, const batch_args *a, long N, int cache, int32_t *ids, row *r)
{
    row scratch = {0};
    memset(r, 0, sizeof *r);
    r->n_seqs = N;
    r->cache = cache;
    r->kv_pages = e->opts.kv_pages;
    for (long w = 0; w < a->warmup; w++)
        if (run_once(e, a, N, cache, ids, &scratch)) return 1;
    for (long k = 0; k < a->reps; k++)
        if (run_once(e, a, N, cache, ids, r)) return 1;
    const double d = (double)a->reps;
    r->agg_tps /= d, r->decode_tps /= d, r->seq_tps /= d, r->ttft_ms /= d, r->host_pct /= d, r->step_ms /= d;
    r->preempted /= d;
    return 0;
}

static void print_rows(const batch_args *a, const nf_bench_info *in, const row *r, size_t nr, int threads)
{
    if (!strcmp(a->format, "table")) {
        printf("device: %s, %d threads | model: %s, %s | -p %ld -n %ld, shared prefix %ld, admission %s\n",
               in->device, threads, in->model, in->profile, a->n_prompt, a->n_gen, a->shared, a->admission);
        printf("| N | prefix cache | agg t/s | decode t/s | seq t/s | step ms | host %% | TTFT ms | KV pages | preempted |\n");
        printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for (size_t i = 0; i < nr; i++)
            printf("| %ld | %s | %.2f | %.2f | %.2f | %.3f | %.1f | %.2f | %u / %u | %.1f |\n", r[i].n_seqs,
                   r[i].cache ? "on" : "off", r[i].agg_tps, r[i].decode_tps, r[i].seq_tps, r[i].step_ms, r[i].host_pct,
                   r[i].ttft_ms, r[i].pages, r[i].kv_pages, r[i].preempted);
        return;
    }
    const int csv = !strcmp(a->format, "csv");
    if (csv)
        printf("model,profile,device,threads,admission,n_seqs,n_prompt,n_gen,shared_prefix,prefix_cache,reps,agg_tps,decode_tps,"
               "seq_tps,step_ms,host_pct,ttft_ms,kv_pages_used,kv_pages,preempted\n");
    else
        printf("[\n");
    for (size_t i = 0; i < nr; i++) {
        if (csv) {
            printf("\"%s\",\"%s\",\"%s\",%d,%s,", in->model, in->profile, in->device, threads, a->admission);
        } else {
            printf("  {\"model\": ");
            nf_bench_json_str(stdout, in->model);
            printf(", \"profile\": ");
            nf_bench_json_str(stdout, in->profile);
            printf(", \"device\": ");
            nf_bench_json_str(stdout, in->device);
            printf(", \"threads\": %d, \"admission\": \"%s\", ", threads, a->admission);
        }
        const char *f = csv ? "%ld,%ld,%ld,%ld,%d,%ld,%.4f,%.4f,%.4f,%.4f,%.2f,%.4f,%u,%u,%.1f\n"
                            : "\"n_seqs\": %ld, \"n_prompt\": %ld, \"n_gen\": %ld, \"shared_prefix\": %ld, "
                              "\"prefix_cache\": %d, \"reps\": %ld, \"agg_tps\": %.4f, \"decode_tps\": %.4f, "
                              "\"seq_tps\": %.4f, \"step_ms\": %.4f, \"host_pct\": %.2f, \"ttft_ms\": %.4f, "
                              "\"kv_pages_used\": %u, \"kv_pages\": %u, \"preempted\": %.1f}";
        printf(f, r[i].n_seqs, a->n_prompt, a->n_gen, a->shared, r[i].cache, a->reps, r[i].agg_tps, r[i].decode_tps,
               r[i].seq_tps, r[i].step_ms, r[i].host_pct, r[i].ttft_ms, r[i].pages, r[i].kv_pages, r[i].preempted);
        if (!csv) printf("%s\n", i + 1 < nr ? "," : "");
    }
    if (!csv) printf("]\n");
}

/* The engine for N sequences of -p + -n tokens: N full-length sequences' pages; a forward of at least
 * N tokens (unless --chunk says otherwise), so a decode step carries every sequence. */
static int make_engine(const nf_model *m, const batch_args *a, long N, nf_engine **e)
{
    nf_engine_opts eo = {.device = a->device, .threads = (int)a->threads,
                         .ctx = (uint32_t)(a->n_prompt + a->n_gen), .chunk = (uint32_t)a->chunk,
                         .page_tokens = (uint32_t)a->page_tokens, .max_seqs = (uint32_t)N,
                         .kv_pages = (uint32_t)a->kv_pages,
                         .kv_bf16 = a->kv_bf16, .no_graphs = a->no_graphs};
    nf_error err;
    nf_status st = nf_engine_create(m, &eo, e, &err);
    if (!st && !a->chunk && (*e)->opts.chunk < (uint32_t)N) { /* the backend's default chunk is smaller */
        nf_engine_free(*e);
        eo.chunk = (uint32_t)N;
        st = nf_engine_create(m, &eo, e, &err);
    }
    if (st) return nf_cli_fail("bench batch: N = %ld: %s", N, err.msg);
    return 0;
}

/* Every N of the run (one, or the sweep), each once, or with and without the cache (--shared-prefix). */
static int run_all(const nf_model *m, const batch_args *a)
{
    row rows[2 * 10];
    size_t nr = 0;
    int rc = 0, threads = 0;
    nf_bench_info in;
    int32_t *ids = malloc((size_t)a->n_prompt * sizeof *ids);
    if (!ids) return nf_cli_fail("out of memory");
    for (long N = a->sweep ? 1 : a->n_seqs; !rc && N <= a->n_seqs && nr + 2 <= 20; N *= 2) {
        nf_engine *e = NULL;
        if ((rc = make_engine(m, a, N, &e))) break;
        if (!nr) nf_bench_model_info(m, e, &in);
        threads = e->opts.threads;
        rc = measure(e, a, N, 1, ids, &rows[nr]);
        if (!rc) nr++;
        if (!rc && a->shared && !(rc = measure(e, a, N, 0, ids, &rows[nr]))) nr++;
        nf_engine_free(e);
        if (!a->sweep) break;
    }
    if (!rc) print_rows(a, &in, rows, nr, threads);
    free(ids);
    return rc;
}

static int check_args(const batch_args *a)
{
    if (strcmp(a->format, "table") && strcmp(a->format, "csv") && strcmp(a->format, "json")) {
        fprintf(stderr, "ninfer: error: --format '%s' is not table, csv or json\n", a->format);
        return 2;
    }
    if (strcmp(a->admission, "preempt") && strcmp(a->admission, "reserve")) {
        fprintf(stderr, "ninfer: error: --admission '%s' is not preempt or reserve\n", a->admission);
        return 2;
    }
    if (a->shared >= a->n_prompt) {
        fprintf(stderr, "ninfer: error: --shared-prefix %ld must be below -p %ld (each prompt needs its own tail)\n",
                a->shared, a->n_prompt);
        return 2;
    }
    return 0;
}

int nf_cmd_bench_batch(int argc, char **argv)
{
    const char *model_path = NULL;
    batch_args a = {.n_seqs = 8, .n_prompt = 512, .n_gen = 128, .reps = 1, .warmup = 1, .device = "auto",
                    .format = "table", .admission = "preempt"};
    long n_default = -1;
    a.n_seqs = n_default;
    const nf_opt opts[] = {
        {"--model", 'm', NF_OPT_STRING, &model_path, "FILE", "the .nf model (required)", 0, 0},
        {"--seqs", 'N', NF_OPT_INT, &a.n_seqs, "N", "concurrent sequences (default 8; with --sweep the largest, default 256)", 1, 256},
        {"--n-prompt", 'p', NF_OPT_INT, &a.n_prompt, "N", "prompt tokens of each sequence (default 512)", 1, 1 << 20},
        {"--n-gen", 'n', NF_OPT_INT, &a.n_gen, "N", "tokens each sequence generates (default 128)", 1, 1 << 20},
        {"--sweep", 0, NF_OPT_FLAG, &a.sweep, NULL, "N = 1, 2, 4, ... up to -N", 0, 0},
        {"--shared-prefix", 0, NF_OPT_INT, &a.shared, "L", "prompts share their first L tokens; rows with and without the prefix cache (default 0)", 0, 1 << 20},
        {"--repetitions", 'r', NF_OPT_INT, &a.reps, "N", "timed runs of each measurement, averaged (default 1)", 1, 1000},
        {"--warmup", 0, NF_OPT_INT, &a.warmup, "N", "untimed runs before the timed ones (default 1)", 0, 100},
        {"--device", 0, NF_OPT_STRING, &a.device, "DEV", "cpu, cuda or auto (default: cuda when a GPU is visible)", 0, 0},
        {"--threads", 't', NF_OPT_INT, &a.threads, "N", "CPU worker threads (default: all CPUs)", 0, 4096},
        {"--chunk", 0, NF_OPT_INT, &a.chunk, "N", "tokens per forward (default: the engine's, cpu 128, cuda 2048, or N if larger)", 0, 1 << 20},
        {"--page-tokens", 0, NF_OPT_INT, &a.page_tokens, "N", "positions per KV page (default: the engine's)", 0, 1 << 16},
        {"--kv-pages", 0, NF_OPT_INT, &a.kv_pages, "N", "KV pool size in pages (default: N full-length sequences'; fewer makes the scheduler preempt)", 0, 1 << 24},
        {"--admission", 0, NF_OPT_STRING, &a.admission, "P", "preempt (default: admit on the prompt's pages, preempt the newest when the pool runs dry) or reserve (prompt + -n pages at admission)", 0, 0},
        {"--kv-bf16", 0, NF_OPT_FLAG, &a.kv_bf16, NULL, "keep the KV cache in bf16 (default f32)", 0, 0},
        {"--no-graphs", 0, NF_OPT_FLAG, &a.no_graphs, NULL, "CUDA: decode steps as plain launches", 0, 0},
        {"--seed", 's', NF_OPT_INT, &a.seed, "S", "seed of the prompts' pseudo-random ids (default 0)", 0, 9.0e15},
        {"--format", 'o', NF_OPT_STRING, &a.format, "F", "table (default), csv or json, on stdout", 0, 0},
    };
    const nf_cmd_usage u = {
        "bench batch", "-m MODEL [-N 8 | --sweep] [-p 512] [-n 128] [--shared-prefix L] [--format table|csv|json]",
        "Many sequences at once through the continuous-batching scheduler: N sequences of -p pseudo-random\n"
        "prompt ids arrive together and each generates -n tokens (greedy). Reports aggregate generated t/s\n"
        "(prefill included), decode-only aggregate t/s, per-sequence t/s, the median decode step and the\n"
        "host's share of it (outside the backend's forward), median time to first token and the KV pages\n"
        "held at most. --shared-prefix L first runs one sequence with the shared prefix, then measures with\n"
        "the prefix cache and without it, so TTFT shows the cache's effect.",
        opts, NF_CLI_COUNT(opts), 0, 0};
    int npos = 0;
    int r = nf_cli_parse(&u, argc, argv, NULL, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!model_path) {
        fprintf(stderr, "ninfer: error: bench batch needs -m MODEL\n");
        nf_cli_print_help(&u, stderr);
        return 2;
    }
    if (a.n_seqs == n_default) a.n_seqs = a.sweep ? 256 : 8;
    if ((r = check_args(&a))) return r;
    a.reserve = !strcmp(a.admission, "reserve");
    nf_error err;
    nf_model *m;
    if (nf_model_load(model_path, &m, &err)) return nf_cli_fail("%s", err.msg);
    int rc = run_all(m, &a);
    nf_model_free(m);
    return rc;
}
