/* `ninfer bench serve`: a load generator for any OpenAI-compatible server (ninfer's, llama-server,
 * vLLM). C client threads each send one streaming /v1/completions request at a time, of random
 * token-id prompts of --input-len tokens (or the lines of --prompt-file, as text) and --output-len
 * tokens out (ignore_eos, so every request runs to its length where the server honours it), after
 * --warmup requests that are not counted.
 *
 * The figures follow vLLM's `vllm bench serve` (vllm/benchmarks/serve.py, calculate_metrics):
 * TTFT = send to first content chunk; TPOT = (latency - TTFT) / (output tokens - 1), per request
 * with more than one token; ITL = the gaps between consecutive content chunks, over all requests;
 * E2EL = send to the last byte; request throughput = completed / duration, output throughput =
 * output tokens / duration. Percentiles interpolate linearly between order statistics, as numpy's
 * default does. Plain sockets over HTTP/1.0 (the body ends when the server closes, no chunking).
 * A server with ninfer's speculation counters on /metrics (`serve --spec`) also gets a line with the
 * drafts accepted per verification over the timed requests.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/timer.h"
#include "cli.h"
#include "commands.h"

typedef struct bench_cfg {
    const char *url, *model, *key, *prompt_file;
    char **prompts; /* [n_prompts] lines of --prompt-file, or none (random ids) */
    size_t n_prompts;
    char host[256], port[16];
    long conc, requests, warmup, in_len, out_len, id_max, seed;
    int no_ignore_eos;
} bench_cfg;

/* One request's measurements. */
typedef struct req_result {
    int ok, status; /* status: the HTTP status, 0 when no response came */
    double ttft, e2el;
    long out_tokens, in_tokens; /* from the usage chunk (0: none came) */
    double *itl; /* gaps between content chunks */
    size_t n_itl;
} req_result;

typedef struct shared {
    const bench_cfg *c;
    pthread_mutex_t mu;
    long next, total;      /* the next request index, how many in all (warm-up first) */
    req_result *res;       /* [total] */
} shared;

static int parse_url(bench_cfg *c)
{
    const char *u = c->url;
    if (strncmp(u, "http://", 7) != 0) return 0;
    u += 7;
    size_t h = strcspn(u, ":/");
    if (!h || h >= sizeof c->host) return 0;
    memcpy(c->host, u, h);
    c->host[h] = 0;
    snprintf(c->port, sizeof c->port, "%s", "80");
    if (u[h] == ':') {
        size_t p = strcspn(u + h + 1, "/");
        if (!p || p >= sizeof c->port) return 0;
        memcpy(c->port, u + h + 1, p);
        c->port[p] = 0;
    }
    return 1;
}

static int dial(const bench_cfg *c)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(c->host, c->port, &hints, &res)) return -1;
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen)) close(fd), fd = -1;
    freeaddrinfo(res);
    return fd;
}

/* s as a JSON string body (no quotes) at out, which has room for 6 bytes a byte of s; returns the end. */
static char *json_escape(const char *s, char *out)
{
    for (; *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') *out++ = '\\', *out++ = (char)ch;
        else if (ch < 0x20) out += sprintf(out, "\\u%04x", ch);
        else *out++ = (char)ch; /* UTF-8 passes as it is; a server refuses a line that is not */
    }
    return out;
}

/* The prompt of request idx: line idx (cycling) of --prompt-file as a JSON string, else random
 * token ids (splitmix64 of seed and index). */
static size_t prompt_json(const bench_cfg *c, long idx, char *body, size_t n, size_t cap)
{
    if (c->n_prompts) {
        body[n++] = '"';
        n = (size_t)(json_escape(c->prompts[(size_t)idx % c->n_prompts], body + n) - body);
        body[n++] = '"';
        return n;
    }
    body[n++] = '[';
    uint64_t z = (uint64_t)c->seed * 0x9E3779B97F4A7C15ull + (uint64_t)idx;
    for (long i = 0; i < c->in_len; i++) {
        z += 0x9E3779B97F4A7C15ull;
        uint64_t r = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        r = (r ^ (r >> 27)) * 0x94D049BB133111EBull;
        n += (size_t)snprintf(body + n, cap - n, "%s%llu", i ? "," : "", (unsigned long long)((r ^ (r >> 31)) % (uint64_t)c->id_max));
    }
    body[n++] = ']';
    return n;
}

/* The request: a JSON body with the prompt_json of idx. */
static char *request_text(const bench_cfg *c, long idx, size_t *len)
{
    size_t cap = 512 + (c->n_prompts ? 6 * strlen(c->prompts[(size_t)idx % c->n_prompts]) : (size_t)c->in_len * 12);
    char *body = malloc(cap), *req = malloc(cap + 1024);
    if (!body || !req) return free(body), free(req), NULL;
    size_t n = (size_t)snprintf(body, cap, "{\"model\":\"%s\",\"max_tokens\":%ld,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"temperature\":0,%s\"prompt\":",
                                c->model, c->out_len, c->no_ignore_eos ? "" : "\"ignore_eos\":true,");
    n = prompt_json(c, idx, body, n, cap);
    n += (size_t)snprintf(body + n, cap - n, "}");
    char auth[600] = "";
    if (c->key) snprintf(auth, sizeof auth, "Authorization: Bearer %.500s\r\n", c->key);
    *len = (size_t)snprintf(req, cap + 1024,
                            "POST /v1/completions HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\n%s"
                            "Content-Length: %zu\r\n\r\n%s", c->host, auth, n, body);
    free(body);
    return req;
}

static void add_itl(req_result *r, double gap)
{
    double *p = realloc(r->itl, (r->n_itl + 1) * sizeof *p);
    if (!p) return;
    r->itl = p;
    r->itl[r->n_itl++] = gap;
}

/* Reads the SSE body; a chunk whose text is non-empty is one arrival (a token, or a few). */
static void read_stream(int fd, double t0, req_result *r)
{
    char buf[65536], line[1 << 16];
    size_t ln = 0;
    double last = 0;
    int status = 0, in_body = 0;
    ssize_t k;
    while ((k = recv(fd, buf, sizeof buf, 0)) > 0) {
        double now = nf_time_s();
        for (ssize_t i = 0; i < k; i++) {
            if (buf[i] != '\n') {
                if (ln < sizeof line - 1) line[ln++] = buf[i];
                continue;
            }
            line[ln] = 0;
            ln = 0;
            if (!status) sscanf(line, "HTTP/%*s %d", &status);
            if (!in_body) {
                in_body = line[0] == '\r' || line[0] == 0;
                continue;
            }
            const char *u = strstr(line, "\"completion_tokens\":");
            if (u) r->out_tokens = atol(u + 20);
            const char *pt = strstr(line, "\"prompt_tokens\":");
            if (pt) r->in_tokens = atol(pt + 16);
            const char *t = strstr(line, "\"text\":\"");
            if (strncmp(line, "data: {", 7) != 0 || !t || t[8] == '"') continue;
            if (r->ttft == 0) r->ttft = now - t0;
            else add_itl(r, now - last);
            last = now;
        }
    }
    r->e2el = nf_time_s() - t0;
    r->status = status;
    r->ok = status == 200 && r->ttft > 0;
}

static void *client(void *arg)
{
    shared *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        long idx = s->next < s->total ? s->next++ : -1;
        pthread_mutex_unlock(&s->mu);
        if (idx < 0) return NULL;
        size_t len;
        char *req = request_text(s->c, idx, &len);
        int fd = req ? dial(s->c) : -1;
        req_result *r = &s->res[idx];
        double t0 = nf_time_s();
        if (fd >= 0 && send(fd, req, len, MSG_NOSIGNAL) == (ssize_t)len) read_stream(fd, t0, r);
        if (fd >= 0) close(fd);
        free(req);
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy.percentile's default (linear) on sorted v[n]. */
static double pct(const double *v, size_t n, double p)
{
    if (!n) return NAN;
    double at = p / 100 * (double)(n - 1);
    size_t lo = (size_t)at;
    return lo + 1 < n ? v[lo] + (v[lo + 1] - v[lo]) * (at - (double)lo) : v[lo];
}

static void report_line(const char *name, double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_d);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    printf("%-5s ms  mean %9.2f  p50 %9.2f  p90 %9.2f  p99 %9.2f  (n=%zu)\n", name, n ? 1e3 * sum / (double)n : NAN,
           1e3 * pct(v, n, 50), 1e3 * pct(v, n, 90), 1e3 * pct(v, n, 99), n);
}

static void report(const bench_cfg *c, req_result *res, long from, long to, double dur)
{
    size_t n_itl = 0, done = 0, n_tpot = 0;
    long out = 0, in = 0;
    for (long i = from; i < to; i++) n_itl += res[i].ok ? res[i].n_itl : 0;
    double *ttft = calloc((size_t)(to - from) + 1, sizeof *ttft), *tpot = calloc((size_t)(to - from) + 1, sizeof *tpot),
           *e2el = calloc((size_t)(to - from) + 1, sizeof *e2el), *itl = calloc(n_itl + 1, sizeof *itl);
    if (!ttft || !tpot || !e2el || !itl) return (void)(free(ttft), free(tpot), free(e2el), free(itl));
    n_itl = 0;
    for (long i = from; i < to; i++) {
        req_result *r = &res[i];
        if (!r->ok) continue;
        if (!r->out_tokens) r->out_tokens = (long)r->n_itl + 1; /* no usage chunk: one token per chunk */
        ttft[done] = r->ttft, e2el[done++] = r->e2el;
        out += r->out_tokens;
        in += r->in_tokens ? r->in_tokens : c->n_prompts ? 0 : c->in_len; /* no usage: the ids sent */
        if (r->out_tokens > 1) tpot[n_tpot++] = (r->e2el - r->ttft) / (double)(r->out_tokens - 1);
        memcpy(itl + n_itl, r->itl, r->n_itl * sizeof *itl);
        n_itl += r->n_itl;
    }
    if (c->n_prompts)
        printf("ninfer bench serve: %s, concurrency %ld, %ld requests (+%ld warm-up), prompts: the %zu lines of %s, %ld "
               "out\n", c->url, c->conc, c->requests, c->warmup, c->n_prompts, c->prompt_file, c->out_len);
    else
        printf("ninfer bench serve: %s, concurrency %ld, %ld requests (+%ld warm-up), %ld tokens in, %ld out\n", c->url,
               c->conc, c->requests, c->warmup, c->in_len, c->out_len);
    printf("completed %zu, failed %zu, duration %.3f s, output tokens %ld\n", done, (size_t)(to - from) - done, dur, out);
    for (long i = from; i < to; i++) /* why the first failure failed: a server's bug or the client's */
        if (!res[i].ok) {
            if (res[i].status == 0) printf("first failure: request %ld: no HTTP response (refused, reset or closed)\n", i);
            else if (res[i].status != 200) printf("first failure: request %ld: HTTP %d\n", i, res[i].status);
            else printf("first failure: request %ld: HTTP 200 without a chunk of text (%.3f s)\n", i, res[i].e2el);
            break;
        }
    printf("request throughput %.3f req/s, output %.1f tokens/s, total %.1f tokens/s\n", (double)done / dur,
           (double)out / dur, (double)(out + in) / dur);
    report_line("TTFT", ttft, done);
    report_line("TPOT", tpot, n_tpot);
    report_line("ITL", itl, n_itl);
    report_line("E2EL", e2el, done);
    free(ttft), free(tpot), free(e2el), free(itl);
}

/* The non-empty lines of --prompt-file (a trailing \r dropped), or a clear error. */
static int load_prompts(bench_cfg *c)
{
    FILE *f = fopen(c->prompt_file, "rb");
    if (!f) return nf_cli_fail("--prompt-file %s: cannot open it", c->prompt_file);
    char *line = NULL;
    size_t cap = 0, n_cap = 0;
    ssize_t k;
    int st = 0;
    while (!st && (k = getline(&line, &cap, f)) >= 0) {
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r')) line[--k] = 0;
        if (!k) continue;
        if ((size_t)k != strlen(line)) {
            st = nf_cli_fail("--prompt-file %s: line %zu holds a NUL byte", c->prompt_file, c->n_prompts + 1);
            break;
        }
        if (c->n_prompts == n_cap) {
            n_cap = n_cap ? 2 * n_cap : 64;
            char **p = realloc(c->prompts, n_cap * sizeof *p);
            if (!p) st = nf_cli_fail("out of memory");
            else c->prompts = p;
        }
        if (!st && !(c->prompts[c->n_prompts] = strdup(line))) st = nf_cli_fail("out of memory");
        if (!st) c->n_prompts++;
    }
    free(line);
    fclose(f);
    if (!st && !c->n_prompts) st = nf_cli_fail("--prompt-file %s: no prompts (every line is empty)", c->prompt_file);
    return st;
}

/* ninfer's speculation counters from GET /metrics: verifications, drafts, accepted (1 when all three
 * were there). */
static int scrape_spec(const bench_cfg *c, unsigned long long v[3])
{
    static const char *const names[3] = {"\nninfer_spec_verifications_total ", "\nninfer_spec_drafts_total ",
                                         "\nninfer_spec_accepted_total "}; /* a line's start, not the HELP line */
    int fd = dial(c);
    if (fd < 0) return 0;
    char req[800], auth[600] = "";
    if (c->key) snprintf(auth, sizeof auth, "Authorization: Bearer %.500s\r\n", c->key);
    const int n = snprintf(req, sizeof req, "GET /metrics HTTP/1.0\r\nHost: %s\r\n%s\r\n", c->host, auth);
    size_t len = 0, cap = 1 << 16;
    char *body = malloc(cap + 1);
    ssize_t k = body && write(fd, req, (size_t)n) == n ? 1 : -1;
    while (k > 0 && len < cap && (k = read(fd, body + len, cap - len)) > 0) len += (size_t)k;
    close(fd);
    int found = 0;
    if (body) {
        body[len] = 0;
        for (int i = 0; i < 3; i++) {
            const char *at = strstr(body, names[i]);
            found += at && sscanf(at + strlen(names[i]), "%llu", &v[i]) == 1;
        }
    }
    free(body);
    return found == 3;
}

static int run(bench_cfg *c)
{
    shared s = {.c = c, .total = c->warmup + c->requests};
    s.res = calloc((size_t)s.total, sizeof *s.res);
    pthread_t *th = calloc((size_t)c->conc, sizeof *th);
    if (!s.res || !th) return free(s.res), free(th), nf_cli_fail("out of memory");
    pthread_mutex_init(&s.mu, NULL);
    /* warm-up first, at the same concurrency, then the measured requests */
    double t0 = 0;
    unsigned long long sp0[3] = {0}, sp1[3] = {0};
    int spec = 0;
    for (int phase = 0; phase < 2; phase++) {
        s.total = phase ? c->warmup + c->requests : c->warmup;
        if (phase) spec = scrape_spec(c, sp0);
        t0 = nf_time_s();
        long started = 0;
        for (long i = 0; i < c->conc; i++) started += pthread_create(&th[i], NULL, client, &s) == 0;
        for (long i = 0; i < started; i++) pthread_join(th[i], NULL);
    }
    double dur = nf_time_s() - t0;
    report(c, s.res, c->warmup, c->warmup + c->requests, dur);
    if (spec && scrape_spec(c, sp1) && sp1[0] > sp0[0])
        printf("speculation (the server's /metrics): %llu verifications, %llu drafts, %llu accepted: %.2f accepted per "
               "verification\n", sp1[0] - sp0[0], sp1[1] - sp0[1], sp1[2] - sp0[2],
               (double)(sp1[2] - sp0[2]) / (double)(sp1[0] - sp0[0]));
    long failed = 0;
    for (long i = c->warmup; i < c->warmup + c->requests; i++) failed += !s.res[i].ok, free(s.res[i].itl);
    for (long i = 0; i < c->warmup; i++) free(s.res[i].itl);
    pthread_mutex_destroy(&s.mu);
    free(s.res);
    free(th);
    return failed ? nf_cli_fail("%ld requests failed", failed) : 0;
}

int nf_cmd_bench_serve(int argc, char **argv)
{
    bench_cfg c = {.url = "http://127.0.0.1:8080", .model = NULL, .conc = 1, .requests = 0, .warmup = -1, .in_len = 512,
                   .out_len = 128, .id_max = 256, .seed = 1};
    nf_opt opts[] = {
        {"--url", 0, NF_OPT_STRING, &c.url, "URL", "the server (default http://127.0.0.1:8080)", 0, 0},
        {"--model", 0, NF_OPT_STRING, &c.model, "ID", "the model id requests name (required)", 0, 0},
        {"--api-key", 0, NF_OPT_STRING, &c.key, "KEY", "sent as 'Authorization: Bearer KEY'", 0, 0},
        {"--concurrency", 'c', NF_OPT_INT, &c.conc, "C", "requests in flight at once (default 1)", 1, 4096},
        {"--requests", 'n', NF_OPT_INT, &c.requests, "N", "measured requests (default 4 x concurrency)", 1, 1e7},
        {"--warmup", 0, NF_OPT_INT, &c.warmup, "N", "uncounted requests first (default: concurrency)", 0, 1e6},
        {"--input-len", 0, NF_OPT_INT, &c.in_len, "T", "prompt tokens (random ids; default 512)", 1, 1 << 20},
        {"--output-len", 0, NF_OPT_INT, &c.out_len, "T", "tokens to generate per request (default 128)", 1, 1 << 20},
        {"--id-max", 0, NF_OPT_INT, &c.id_max, "V", "prompt ids are drawn from [0, V) (default 256)", 1, 1 << 30},
        {"--seed", 0, NF_OPT_INT, &c.seed, "S", "prompt seed (default 1)", 0, 1e15},
        {"--prompt-file", 0, NF_OPT_STRING, &c.prompt_file, "FILE", "text prompts, one a line, used in turn (instead of random ids)", 0, 0},
        {"--no-ignore-eos", 0, NF_OPT_FLAG, &c.no_ignore_eos, NULL, "do not send ignore_eos (servers that refuse it)", 0, 0},
    };
    const nf_cmd_usage u = {
        .name = "bench serve",
        .synopsis = "--model ID [--url URL] [-c C] [-n N] [--input-len T] [--output-len T]",
        .description = "Load an OpenAI-compatible server with C concurrent streaming /v1/completions clients and report\n"
                       "request and token throughput, TTFT, TPOT, ITL and E2EL (mean, p50, p90, p99) as vLLM's\n"
                       "`vllm bench serve` defines them (docs/serve.md).",
        .opts = opts,
        .n_opts = NF_CLI_COUNT(opts),
    };
    int npos, r = nf_cli_parse(&u, argc, argv, NULL, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!c.model) {
        fprintf(stderr, "ninfer: error: bench serve needs --model ID (GET /v1/models lists it)\n");
        return 2;
    }
    if (!parse_url(&c)) return nf_cli_fail("--url %s: expected http://HOST[:PORT]", c.url);
    if (!c.requests) c.requests = 4 * c.conc;
    if (c.warmup < 0) c.warmup = c.conc;
    if (c.prompt_file && (r = load_prompts(&c))) return r;
    r = run(&c);
    for (size_t i = 0; i < c.n_prompts; i++) free(c.prompts[i]);
    free(c.prompts);
    return r;
}
