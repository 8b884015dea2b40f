/* Request parsing for the OpenAI endpoints (api.h). Field names, ranges and defaults follow
 * OpenAI's API reference; sampling fields OpenAI lacks (top_k, min_p, repetition_penalty,
 * ignore_eos, chat_template_kwargs) are the ones vLLM and llama-server accept. */
#define _POSIX_C_SOURCE 200809L
#include "serve/api.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_STOP_BYTES = 256 };

int nf_api_fail(nf_api_error *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = status == 401   ? "authentication_error"
              : status == 404 ? "not_found_error"
              : status == 503 ? "server_error"
              : status >= 500 ? "server_error"
                              : "invalid_request_error";
    e->param = param;
    e->code = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

char *nf_api_error_json(const nf_api_error *e)
{
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    if (o) {
        cJSON_AddStringToObject(o, "message", e->msg);
        cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
        if (e->param) cJSON_AddStringToObject(o, "param", e->param);
        else cJSON_AddNullToObject(o, "param");
        if (e->code) cJSON_AddStringToObject(o, "code", e->code);
        else cJSON_AddNullToObject(o, "code");
    }
    char *s = o ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* cJSON is lenient where JSON is not: it stops at the end of the first value (trailing bytes are
 * ignored) and takes raw control characters inside strings. Both are refused here. */
cJSON *nf_api_json(const char *body, size_t len, nf_api_error *e)
{
    if (nf_utf8_valid_prefix(body, len) != len) return nf_api_fail(e, 400, NULL, "the body is not valid UTF-8"), NULL;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)body[i] < 0x20 && body[i] != '\t' && body[i] != '\n' && body[i] != '\r')
            return nf_api_fail(e, 400, NULL, "the body is not valid JSON (a raw control character at byte %zu)", i), NULL;
    const char *end = NULL;
    cJSON *b = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    while (b && end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (b && end != body + len) {
        cJSON_Delete(b);
        b = NULL;
    }
    if (!b) nf_api_fail(e, 400, NULL, "the body is not valid JSON");
    return b;
}

/* ---- typed field readers: each returns 0 (absent or fine) or -1 with *e --------------------- */

static const cJSON *field(const cJSON *o, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return f && !cJSON_IsNull(f) ? f : NULL; /* null means "default", as OpenAI's clients send it */
}

static int get_num(const cJSON *o, const char *name, double lo, double hi, float *out, nf_api_error *e)
{
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return nf_api_fail(e, 400, name, "'%s' must be a number", name);
    if (!(f->valuedouble >= lo && f->valuedouble <= hi))
        return nf_api_fail(e, 400, name, "'%s' must be in [%g, %g], got %g", name, lo, hi, f->valuedouble);
    *out = (float)f->valuedouble;
    return 0;
}

/* An integer in [lo, hi]; a JSON number with a fraction or past 2^53 is refused. */
static int get_int(const cJSON *o, const char *name, double lo, double hi, long long *out, nf_api_error *e)
{
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble))
        return nf_api_fail(e, 400, name, "'%s' must be an integer", name);
    if (!(f->valuedouble >= lo && f->valuedouble <= hi))
        return nf_api_fail(e, 400, name, "'%s' must be in [%.0f, %.0f], got %g", name, lo, hi, f->valuedouble);
    *out = (long long)f->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *name, int *out, nf_api_error *e)
{
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return nf_api_fail(e, 400, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(f);
    return 0;
}

/* ---- messages and prompts --------------------------------------------------------------------- */

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts joined. */
static int content_text(const cJSON *c, char **out, nf_api_error *e)
{
    if (!c) return (*out = strdup("")) ? 0 : nf_api_fail(e, 500, NULL, "out of memory");
    if (cJSON_IsString(c)) return (*out = strdup(c->valuestring)) ? 0 : nf_api_fail(e, 500, NULL, "out of memory");
    if (!cJSON_IsArray(c)) return nf_api_fail(e, 400, "messages", "a message's 'content' must be a string or an array of text parts");
    size_t n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type"), *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0)
            return nf_api_fail(e, 400, "messages", "only content parts of type 'text' are supported");
        if (!cJSON_IsString(text)) return nf_api_fail(e, 400, "messages", "a text part needs a string 'text'");
        n += strlen(text->valuestring);
    }
    char *s = malloc(n + 1);
    if (!s) return nf_api_fail(e, 500, NULL, "out of memory");
    size_t at = 0;
    cJSON_ArrayForEach(p, c)
    {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        memcpy(s + at, t, strlen(t));
        at += strlen(t);
    }
    s[at] = 0;
    *out = s;
    return 0;
}

static const char *role_of(const char *r)
{
    static const char *const ok[] = {"system", "user", "assistant", "tool"};
    if (strcmp(r, "developer") == 0) return "system"; /* OpenAI's newer name for system */
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (strcmp(r, ok[i]) == 0) return ok[i];
    return NULL;
}

static int encode(const nf_api_model *m, const char *text, unsigned flags, nf_serve_req *r, nf_api_error *e)
{
    nf_tok_ids ids = {0};
    nf_error err;
    if (nf_tok_encode(m->tok, text, strlen(text), flags, &ids, &err))
        return nf_api_fail(e, 400, "prompt", "cannot tokenize the prompt: %s", err.msg);
    r->prompt = ids.ids;
    r->n_prompt = ids.n;
    return 0;
}

/* The chat template over messages, then the tokenizer. */
static int chat_prompt(const nf_api_model *m, const cJSON *body, nf_serve_req *r, nf_api_error *e)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs))
        return nf_api_fail(e, 400, "messages", "'messages' must be a non-empty array");
    int n = cJSON_GetArraySize(msgs), think = -1, rc = 0;
    const cJSON *kw = field(body, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw)) return nf_api_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (kw && get_bool(kw, "enable_thinking", &think, e)) return -1;
    nf_chat_msg *cm = calloc((size_t)n, sizeof *cm);
    char **owned = calloc((size_t)n, sizeof *owned);
    if (!cm || !owned) rc = nf_api_fail(e, 500, NULL, "out of memory");
    int i = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs)
    {
        if (rc) break;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role) || !role_of(role->valuestring)) {
            rc = nf_api_fail(e, 400, "messages", "message %d: 'role' must be system, developer, user, assistant or tool", i);
            break;
        }
        if ((rc = content_text(field(msg, "content"), &owned[i], e))) break;
        cm[i] = (nf_chat_msg){role_of(role->valuestring), owned[i]};
        i++;
    }
    char *text = NULL;
    size_t len;
    nf_error err;
    if (!rc && nf_chat_render(m->ct, cm, (size_t)n, 1, think, &text, &len, &err))
        rc = nf_api_fail(e, 400, "messages", "%s", err.msg);
    if (!rc) rc = encode(m, text, NF_TOK_PARSE_SPECIAL, r, e);
    free(text);
    for (int k = 0; owned && k < n; k++) free(owned[k]);
    free(owned);
    free(cm);
    return rc;
}

/* A string, a one-string array, or an array of token ids. */
static int completion_prompt(const nf_api_model *m, const cJSON *body, nf_serve_req *r, nf_api_error *e)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0))) p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p)) return encode(m, p->valuestring, NF_TOK_ADD_SPECIAL | NF_TOK_PARSE_SPECIAL, r, e);
    if (!cJSON_IsArray(p) || !cJSON_GetArraySize(p))
        return nf_api_fail(e, 400, "prompt", "'prompt' must be a string or a non-empty array of token ids (one prompt per request)");
    size_t n = (size_t)cJSON_GetArraySize(p), i = 0;
    if (!(r->prompt = malloc(n * sizeof *r->prompt))) return nf_api_fail(e, 500, NULL, "out of memory");
    const cJSON *t;
    cJSON_ArrayForEach(t, p)
    {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= (double)m->vocab)
            return nf_api_fail(e, 400, "prompt", "prompt token %zu: ids are integers in [0, %u)", i, m->vocab);
        r->prompt[i++] = (int32_t)t->valuedouble;
    }
    r->n_prompt = n;
    return 0;
}

/* ---- sampling and limits ------------------------------------------------------------------ */

static int stops(const cJSON *body, nf_serve_req *r, nf_api_error *e)
{
    const cJSON *s = field(body, "stop");
    if (!s) return 0;
    if (!cJSON_IsString(s) && !cJSON_IsArray(s)) return nf_api_fail(e, 400, "stop", "'stop' must be a string or an array of strings");
    if (cJSON_IsArray(s) && cJSON_GetArraySize(s) > NF_SERVE_MAX_STOPS)
        return nf_api_fail(e, 400, "stop", "at most %d stop strings", NF_SERVE_MAX_STOPS);
    const cJSON *one = s, *it;
    if (cJSON_IsString(s)) s = NULL;
    for (it = s ? s->child : one; it; it = s ? it->next : NULL) {
        if (!cJSON_IsString(it)) return nf_api_fail(e, 400, "stop", "'stop' must be a string or an array of strings");
        if (strlen(it->valuestring) > MAX_STOP_BYTES) return nf_api_fail(e, 400, "stop", "a stop string is at most %d bytes", MAX_STOP_BYTES);
        if (!*it->valuestring) continue;
        if (!(r->stops[r->n_stops] = strdup(it->valuestring))) return nf_api_fail(e, 500, NULL, "out of memory");
        r->n_stops++;
    }
    return 0;
}

static int sampling(const cJSON *b, nf_serve_req *r, uint64_t default_seed, nf_api_error *e)
{
    nf_sampler_params *s = &r->sampling;
    /* OpenAI's defaults: temperature 1, nucleus off; vLLM's: top_k and min_p off */
    *s = (nf_sampler_params){.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repeat_penalty = 1.0f,
                             .repeat_last_n = 64, .seed = default_seed};
    long long top_k = 0, seed = 0;
    int has_seed = field(b, "seed") != NULL;
    if (get_num(b, "temperature", 0, 2, &s->temp, e) || get_num(b, "top_p", 0, 1, &s->top_p, e) ||
        get_int(b, "top_k", -1, 1e9, &top_k, e) || get_num(b, "min_p", 0, 1, &s->min_p, e) ||
        get_num(b, "repetition_penalty", 0.01, 100, &s->repeat_penalty, e) ||
        get_num(b, "presence_penalty", -2, 2, &s->presence_penalty, e) ||
        get_num(b, "frequency_penalty", -2, 2, &s->frequency_penalty, e) ||
        get_int(b, "seed", -9007199254740991.0, 9007199254740991.0, &seed, e) || get_bool(b, "ignore_eos", &r->ignore_eos, e))
        return -1;
    s->top_k = top_k > 0 ? (int)top_k : 0;
    if (has_seed) s->seed = (uint64_t)seed;
    return 0;
}

/* logprobs: chat has a boolean and top_logprobs; completions an integer (the number of top). */
static int logprob_fields(const cJSON *b, nf_api_kind kind, nf_serve_req *r, nf_api_error *e)
{
    long long top = 0;
    if (kind == NF_API_COMPLETION) {
        if (get_int(b, "logprobs", 0, 5, &top, e)) return -1;
        r->logprobs = field(b, "logprobs") != NULL;
    } else {
        if (get_bool(b, "logprobs", &r->logprobs, e) || get_int(b, "top_logprobs", 0, NF_SERVE_MAX_TOP_LOGPROBS, &top, e))
            return -1;
        if (top && !r->logprobs) return nf_api_fail(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    r->top_logprobs = (int)top;
    return 0;
}

/* max_tokens against the context; the message names both numbers. */
static int limits(const nf_api_model *m, const cJSON *b, nf_serve_req *r, nf_api_error *e)
{
    long long max = -1;
    const char *name = field(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (get_int(b, name, 1, 1e15, &max, e)) return -1;
    if (!r->n_prompt) return nf_api_fail(e, 400, "prompt", "the prompt is empty (no tokens)");
    if (r->n_prompt >= m->ctx)
        return nf_api_fail(e, 400, "messages", "the prompt is %zu tokens, the context is %u", r->n_prompt, m->ctx);
    if (max < 0) max = (long long)(m->ctx - r->n_prompt);
    if ((unsigned long long)max + r->n_prompt > m->ctx)
        return nf_api_fail(e, 400, name, "the prompt (%zu tokens) plus %s (%lld) is past the context (%u tokens)",
                           r->n_prompt, name, max, m->ctx);
    r->max_tokens = (size_t)max;
    return 0;
}

static int unsupported(const cJSON *b, nf_api_kind kind, nf_api_error *e)
{
    long long n = 1;
    if (get_int(b, "n", 1, 1, &n, e)) return nf_api_fail(e, 400, "n", "only n = 1 is supported");
    int echo = 0;
    if (kind == NF_API_COMPLETION && (get_bool(b, "echo", &echo, e) || echo))
        return nf_api_fail(e, 400, "echo", "'echo' is not supported");
    if (field(b, "tools") || field(b, "functions")) return nf_api_fail(e, 400, "tools", "tool calls are not supported");
    return 0;
}

static int stream_fields(const cJSON *b, nf_api_call *c, nf_api_error *e)
{
    if (get_bool(b, "stream", &c->stream, e)) return -1;
    const cJSON *so = field(b, "stream_options");
    if (!so) return 0;
    if (!cJSON_IsObject(so)) return nf_api_fail(e, 400, "stream_options", "'stream_options' must be an object");
    if (!c->stream) return nf_api_fail(e, 400, "stream_options", "'stream_options' needs 'stream': true");
    return get_bool(so, "include_usage", &c->include_usage, e);
}

static int parse_body(const nf_api_model *m, const cJSON *b, nf_api_call *c, uint64_t seed, nf_api_error *e)
{
    if (!cJSON_IsObject(b)) return nf_api_fail(e, 400, NULL, "the body must be a JSON object");
    const cJSON *model = field(b, "model");
    if (model && !cJSON_IsString(model)) return nf_api_fail(e, 400, "model", "'model' must be a string");
    if (model && strcmp(model->valuestring, m->id) != 0) {
        nf_api_fail(e, 404, "model", "the model '%.64s' does not exist; this server has '%.64s'", model->valuestring, m->id);
        e->code = "model_not_found";
        return -1;
    }
    if (unsupported(b, c->kind, e) || stream_fields(b, c, e) || sampling(b, &c->req, seed, e) ||
        logprob_fields(b, c->kind, &c->req, e) || stops(b, &c->req, e))
        return -1;
    if (c->kind == NF_API_CHAT ? chat_prompt(m, b, &c->req, e) : completion_prompt(m, b, &c->req, e)) return -1;
    return limits(m, b, &c->req, e);
}

int nf_api_parse(const nf_api_model *m, nf_api_kind kind, const char *body, size_t len, uint64_t default_seed,
                 nf_api_call *out, nf_api_error *e)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->think_split = kind == NF_API_CHAT;
    cJSON *b = nf_api_json(body, len, e);
    if (!b) return -1;
    int rc = parse_body(m, b, out, default_seed, e);
    cJSON_Delete(b);
    if (rc) nf_api_call_free(out);
    return rc;
}

void nf_api_call_free(nf_api_call *c)
{
    free(c->req.prompt);
    for (size_t i = 0; i < c->req.n_stops; i++) free(c->req.stops[i]);
    memset(&c->req, 0, sizeof c->req);
}
