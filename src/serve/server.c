/* The HTTP server (server.h) over libmicrohttpd in thread-per-connection mode: a connection's
 * thread parses, waits on its job's events and writes them; a slow client slows only itself. */
#define _GNU_SOURCE /* POLLRDHUP: a peer that closed its side */
#include "serve/server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/timer.h"
#include "serve/metrics.h"

struct nf_server {
    struct MHD_Daemon *d;
    nf_server_opts o;
    int port;
    pthread_mutex_t mu;
    pthread_cond_t idle;
    const nf_api_model *m;   /* NULL until attached */
    nf_serve_backend *b;
    int stopping;
    size_t active;           /* generation requests in flight */
    unsigned long long serial;
    nf_metrics metrics;
};

int nf_serve_key_equal(const char *a, size_t na, const char *b, size_t nb)
{
    /* every byte of the longer one is read whatever matches, so timing tells only the lengths */
    size_t n = na > nb ? na : nb;
    unsigned char diff = (unsigned char)(na != nb);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)((i < na ? a[i] : 0) ^ (i < nb ? b[i] : 0));
    return diff == 0;
}

/* ---- responses ---------------------------------------------------------------------------- */

static enum MHD_Result send_body(nf_server *s, struct MHD_Connection *c, int status, const char *type, char *body,
                                 size_t len, int must_free)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, must_free ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (must_free) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, POST");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    nf_metrics_request(&s->metrics, status);
    return rc;
}

static enum MHD_Result send_json(nf_server *s, struct MHD_Connection *c, int status, char *json)
{
    if (!json) return MHD_NO; /* out of memory: the connection closes */
    return send_body(s, c, status, "application/json", json, strlen(json), 1);
}

static enum MHD_Result send_error(nf_server *s, struct MHD_Connection *c, const nf_api_error *e)
{
    return send_json(s, c, e->status, nf_api_error_json(e));
}

static enum MHD_Result fail(nf_server *s, struct MHD_Connection *c, int status, const char *param, const char *msg)
{
    nf_api_error e;
    nf_api_fail(&e, status, param, "%s", msg);
    return send_error(s, c, &e);
}

/* ---- a generation request ----------------------------------------------------------------- */

typedef struct gen {
    nf_server *s;
    nf_serve_backend *b;
    nf_serve_job *job;
    nf_api_call call;
    nf_api_resp resp;
    char *buf;           /* SSE bytes not yet written */
    size_t n, off;
    int fd, first, ended, cancelled, tokens;
    int counted; /* was submitted: its tokens belong in the metrics */
    double last_t;
} gen;

/* The peer closed its side or the socket failed: nobody will read the answer. */
static int peer_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void cancel(gen *g)
{
    if (g->cancelled) return;
    g->cancelled = 1;
    g->b->ops->cancel(g->b, g->job);
}

/* The next event; 0 when the peer went away (the job is cancelled). A stopping server cancels the
 * job and still delivers its END, so a stream gets its final chunk. */
static int next_event(gen *g, nf_serve_event *ev)
{
    for (;;) {
        if (nf_serve_job_next(g->job, ev, 100)) return 1;
        pthread_mutex_lock(&g->s->mu);
        int stopping = g->s->stopping;
        pthread_mutex_unlock(&g->s->mu);
        if (stopping) cancel(g);
        if (peer_gone(g->fd)) {
            cancel(g);
            return 0;
        }
    }
}

/* Metrics and the response body for one event; -1 when out of memory. */
static int take_event(gen *g, const nf_serve_event *ev)
{
    if (ev->kind == NF_EV_TOKEN) {
        if (!g->tokens++) nf_metrics_ttft(&g->s->metrics, ev->t);
        else nf_metrics_itl(&g->s->metrics, ev->t - g->last_t);
        g->last_t = ev->t;
    } else {
        g->ended = 1;
        nf_metrics_tokens(&g->s->metrics, g->job->prompt_tokens, g->job->completion_tokens);
    }
    char *out = NULL;
    size_t n = 0;
    int rc = nf_api_resp_event(&g->resp, ev, g->job, g->first, &out, &n);
    g->first = 0;
    if (!rc && out) {
        if (g->off == g->n) g->n = g->off = 0;
        char *p = realloc(g->buf, g->n + n);
        if (p) memcpy(p + g->n, out, n), g->buf = p, g->n += n;
        else rc = -1;
    }
    free(out);
    return rc;
}

static void gen_free(gen *g)
{
    if (!g) return;
    if (!g->ended) {
        cancel(g);
        if (g->counted) nf_metrics_cancelled(&g->s->metrics, g->job->req.n_prompt, (size_t)g->tokens);
    }
    nf_serve_job_release(g->job);
    nf_api_resp_free(&g->resp);
    free(g->buf);
    pthread_mutex_lock(&g->s->mu);
    if (!--g->s->active) pthread_cond_broadcast(&g->s->idle);
    pthread_mutex_unlock(&g->s->mu);
    free(g);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    gen *g = cls;
    while (g->off == g->n) {
        if (g->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        nf_serve_event ev;
        if (!next_event(g, &ev)) return MHD_CONTENT_READER_END_WITH_ERROR;
        int rc = take_event(g, &ev);
        free(ev.text);
        if (rc) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t k = g->n - g->off < max ? g->n - g->off : max;
    memcpy(buf, g->buf + g->off, k);
    g->off += k;
    return (ssize_t)k;
}

static void stream_done(void *cls)
{
    gen_free(cls);
}

/* Non-streaming: waits for END in this connection's thread, then answers. */
static enum MHD_Result whole(gen *g, struct MHD_Connection *c)
{
    nf_server *s = g->s;
    nf_serve_event ev = {0};
    int rc = 0;
    while (!rc && !g->ended) {
        if (!next_event(g, &ev)) break;
        if (ev.kind == NF_EV_END && ev.finish == NF_FINISH_ERROR) {
            char msg[200];
            snprintf(msg, sizeof msg, "generation failed: %.*s", (int)(ev.len < 150 ? ev.len : 150), ev.text);
            free(ev.text);
            g->ended = 1; /* nothing left to cancel */
            gen_free(g);
            return fail(s, c, 500, NULL, msg);
        }
        rc = take_event(g, &ev);
        free(ev.text);
    }
    enum MHD_Result r = MHD_NO; /* the peer is gone (or out of memory): close */
    if (!rc && g->ended) {
        char *body = g->buf;
        size_t n = g->n;
        g->buf = NULL;
        r = send_body(s, c, 200, "application/json", body, n, 1);
    }
    gen_free(g);
    return r;
}

/* A seed for requests without one: distinct per request. */
static uint64_t fresh_seed(unsigned long long serial)
{
    uint64_t z = (uint64_t)nf_time_ns() + serial * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    return z ^ (z >> 31);
}

static enum MHD_Result generate(nf_server *s, struct MHD_Connection *c, nf_api_kind kind, const char *body, size_t len)
{
    pthread_mutex_lock(&s->mu);
    const nf_api_model *m = s->m;
    nf_serve_backend *b = s->b;
    unsigned long long serial = ++s->serial;
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (!m || stopping) return fail(s, c, 503, NULL, m ? "the server is shutting down" : "the model is loading");
    gen *g = calloc(1, sizeof *g);
    if (!g) return MHD_NO;
    nf_api_error e;
    if (nf_api_parse(m, kind, body, len, fresh_seed(serial), &g->call, &e)) {
        free(g);
        return send_error(s, c, &e);
    }
    nf_error err;
    if (nf_serve_job_create(&g->call.req, &g->job, &err)) {
        free(g);
        return MHD_NO;
    }
    g->s = s, g->b = b, g->first = 1;
    nf_api_resp_init(&g->resp, &g->call, m, serial);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    pthread_mutex_lock(&s->mu);
    s->active++;
    pthread_mutex_unlock(&s->mu);
    if (b->ops->submit(b, g->job, &err)) {
        g->ended = 1; /* never queued: nothing to cancel */
        gen_free(g);
        return fail(s, c, 503, NULL, err.msg);
    }
    g->counted = 1;
    if (!g->call.stream) return whole(g, c);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, g, stream_done);
    if (!r) {
        gen_free(g);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    nf_metrics_request(&s->metrics, 200);
    return rc;
}

/* ---- routes ------------------------------------------------------------------------------- */

typedef enum route { R_PAGE, R_HEALTH, R_MODELS, R_METRICS, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_NONE } route;

static const struct {
    const char *path;
    int post;
} routes[] = {{"/", 0},         {"/health", 0},           {"/v1/models", 0}, {"/metrics", 0},
              {"/v1/chat/completions", 1}, {"/v1/completions", 1}, {"/tokenize", 1}, {"/detokenize", 1}};

static route find_route(const char *url)
{
    for (int i = 0; i < R_NONE; i++)
        if (strcmp(url, routes[i].path) == 0) return (route)i;
    return R_NONE;
}

static int authorized(nf_server *s, struct MHD_Connection *c)
{
    const char *key = s->o.api_key;
    if (!key || !*key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    return nf_serve_key_equal(h + 7, strlen(h + 7), key, strlen(key));
}

static enum MHD_Result get_route(nf_server *s, struct MHD_Connection *c, route r)
{
    pthread_mutex_lock(&s->mu);
    const nf_api_model *m = s->m;
    nf_serve_backend *b = s->b;
    pthread_mutex_unlock(&s->mu);
    if (r == R_PAGE) return send_body(s, c, 200, "text/html; charset=utf-8", (char *)nf_serve_page, nf_serve_page_len, 0);
    if (r == R_HEALTH) {
        if (!m) return fail(s, c, 503, NULL, "the model is loading");
        return send_json(s, c, 200, strdup("{\"status\":\"ok\"}"));
    }
    if (r == R_METRICS) {
        nf_serve_backend_stats st = {0};
        if (b) b->ops->stats(b, &st);
        char *t = nf_metrics_render(&s->metrics, &st);
        if (!t) return MHD_NO;
        return send_body(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", t, strlen(t), 1);
    }
    if (!m) return fail(s, c, 503, NULL, "the model is loading");
    return send_json(s, c, 200, nf_api_models_json(m, (long long)time(NULL)));
}

static enum MHD_Result post_route(nf_server *s, struct MHD_Connection *c, route r, const char *body, size_t len)
{
    if (r == R_CHAT || r == R_COMPLETIONS) return generate(s, c, r == R_CHAT ? NF_API_CHAT : NF_API_COMPLETION, body, len);
    pthread_mutex_lock(&s->mu);
    const nf_api_model *m = s->m;
    pthread_mutex_unlock(&s->mu);
    if (!m) return fail(s, c, 503, NULL, "the model is loading");
    nf_api_error e;
    char *out = r == R_TOKENIZE ? nf_api_tokenize(m, body, len, &e) : nf_api_detokenize(m, body, len, &e);
    return out ? send_json(s, c, 200, out) : send_error(s, c, &e);
}

/* ---- the access handler: called once with the headers, then per body piece, then once more --- */

typedef struct upload {
    char *body;
    size_t n, cap, dropped;
    int too_big;
} upload;

static int body_append(nf_server *s, upload *u, const char *data, size_t n)
{
    if (u->too_big || u->n + n > s->o.max_body) {
        u->too_big = 1; /* the rest is read and dropped, then 413 ... */
        u->dropped += n;
        return u->dropped > s->o.max_body ? -1 : 0; /* ... unless it goes on and on: then the connection closes */
    }
    if (u->n + n + 1 > u->cap) {
        size_t cap = (u->n + n + 1) * 2;
        if (cap > s->o.max_body + 1) cap = s->o.max_body + 1;
        char *p = realloc(u->body, cap);
        if (!p) return -1;
        u->body = p;
        u->cap = cap;
    }
    memcpy(u->body + u->n, data, n);
    u->n += n;
    u->body[u->n] = 0;
    return 0;
}

/* First call: route, method, key and declared length are checked before any body is read (an
 * answer given here closes the connection); a request that passes is answered on the last call. */
static enum MHD_Result first_call(nf_server *s, struct MHD_Connection *c, const char *url, const char *method,
                                  void **con_cls)
{
    route r = find_route(url);
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0, post = strcmp(method, "POST") == 0;
    if (r == R_NONE) return fail(s, c, 404, NULL, "unknown route");
    if ((routes[r].post && !post) || (!routes[r].post && !get)) return fail(s, c, 405, NULL, "method not allowed");
    if (r != R_PAGE && r != R_HEALTH && !authorized(s, c))
        return fail(s, c, 401, NULL, "a missing or wrong API key (send 'Authorization: Bearer KEY')");
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->o.max_body) return fail(s, c, 413, NULL, "the body is over the size limit");
    upload *u = calloc(1, sizeof *u);
    if (!u) return MHD_NO;
    *con_cls = u;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *data, size_t *data_size, void **con_cls)
{
    (void)version;
    nf_server *s = cls;
    if (!*con_cls) {
        *con_cls = (void *)1; /* answered at once unless first_call replaces it with an upload */
        return first_call(s, c, url, method, con_cls);
    }
    upload *u = *con_cls;
    if (u == (void *)1) return MHD_YES;
    if (*data_size) {
        int rc = body_append(s, u, data, *data_size);
        *data_size = 0;
        return rc ? MHD_NO : MHD_YES;
    }
    if (u->too_big) return fail(s, c, 413, NULL, "the body is over the size limit");
    /* answered here, after the whole request was read, so that the connection can stay open */
    route r = find_route(url);
    if (!routes[r].post) return get_route(s, c, r);
    return post_route(s, c, r, u->body ? u->body : "", u->n);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    upload *u = *con_cls;
    if (u && u != (void *)1) free(u->body), free(u);
    *con_cls = NULL;
}

/* ---- start and stop ----------------------------------------------------------------------- */

static nf_status resolve(const nf_server_opts *o, struct sockaddr_storage *sa, int *v6, nf_error *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int rc = getaddrinfo(o->host ? o->host : "127.0.0.1", port, &hints, &res);
    if (rc) return nf_error_set(err, NF_ERR_INVALID_ARG, "cannot resolve host '%s': %s", o->host, gai_strerror(rc));
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return NF_OK;
}

nf_status nf_server_start(const nf_server_opts *o, nf_server **out, nf_error *err)
{
    *out = NULL;
    struct sockaddr_storage sa;
    int v6 = 0;
    nf_status st = resolve(o, &sa, &v6, err);
    if (st) return st;
    nf_server *s = calloc(1, sizeof *s);
    if (!s) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    s->o = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    nf_metrics_init(&s->metrics);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | (v6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, o->max_conns, MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    if (!s->d) {
        nf_metrics_destroy(&s->metrics);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->idle);
        free(s);
        return nf_error_set(err, NF_ERR_IO, "cannot listen on %s port %d (in use, or not an address of this machine)",
                            o->host ? o->host : "127.0.0.1", o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return NF_OK;
}

int nf_server_port(const nf_server *s)
{
    return s->port;
}

void nf_server_attach(nf_server *s, const nf_api_model *m, nf_serve_backend *b)
{
    pthread_mutex_lock(&s->mu);
    s->m = m;
    s->b = b;
    pthread_mutex_unlock(&s->mu);
}

void nf_server_stop(nf_server *s, double grace_s)
{
    if (!s) return;
    MHD_socket listen = MHD_quiesce_daemon(s->d); /* no new connections from here on */
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)grace_s;
    while (s->active && pthread_cond_timedwait(&s->idle, &s->mu, &ts) == 0) {}
    pthread_mutex_unlock(&s->mu);
    MHD_stop_daemon(s->d);
    if (listen != MHD_INVALID_SOCKET) close(listen);
    nf_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle);
    free(s);
}
