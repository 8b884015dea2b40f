/* OpenAI's API over the backend's jobs: request bodies to nf_serve_req (every field checked, with
 * the status and message OpenAI would give), and events to response bodies and SSE chunks. No I/O
 * here: http.c moves the bytes. */
#ifndef NF_SERVE_API_H
#define NF_SERVE_API_H

#include <stddef.h>
#include <stdint.h>

#include "serve/backend.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

/* An OpenAI error: {"error": {"message", "type", "param", "code"}} with an HTTP status. */
typedef struct nf_api_error {
    int status;
    const char *type;  /* "invalid_request_error", "authentication_error", ... */
    const char *param; /* the offending field, or NULL */
    const char *code;  /* or NULL */
    char msg[256];
} nf_api_error;

/* What requests are read against. */
typedef struct nf_api_model {
    const char *id;              /* the model name /v1/models lists and requests may name */
    const nf_tokenizer *tok;
    const nf_chat_template *ct;
    uint32_t ctx, vocab;
} nf_api_model;

typedef enum nf_api_kind { NF_API_CHAT = 0, NF_API_COMPLETION } nf_api_kind;

/* A parsed generation request. */
typedef struct nf_api_call {
    nf_api_kind kind;
    nf_serve_req req; /* moves into the job (nf_serve_job_create): read it there afterwards */
    int stream, include_usage;
    int think_split; /* chat: return <think>...</think> as reasoning_content */
} nf_api_call;

/* Parses a /v1/chat/completions or /v1/completions body. 0 and *out filled (free with
 * nf_api_call_free unless handed to nf_serve_job_create), or -1 and *e. */
int nf_api_parse(const nf_api_model *m, nf_api_kind kind, const char *body, size_t len, uint64_t default_seed,
                 nf_api_call *out, nf_api_error *e);
void nf_api_call_free(nf_api_call *c);

/* The body as JSON (a cJSON tree to cJSON_Delete), or NULL with a 400 in *e: invalid UTF-8,
 * malformed JSON, bytes after the value. */
struct cJSON *nf_api_json(const char *body, size_t len, nf_api_error *e);

/* Sets *e (message printf-style); returns -1. */
int nf_api_fail(nf_api_error *e, int status, const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* The error object's JSON (malloc'd; NULL when out of memory). */
char *nf_api_error_json(const nf_api_error *e);

/* <think>...</think> at the start of a reply, split off as reasoning. Text is fed in pieces; a
 * possible tag prefix is held back (tags are ASCII, so no UTF-8 character is ever split). */
typedef struct nf_think_split {
    int state;       /* 0: at the start, 1: inside the block, 2: after it (or none), 3: after, eating "\n" */
    char hold[16];
    size_t n_hold;
} nf_think_split;
/* Appends the reasoning and the content parts of text to the two growing buffers (each malloc'd,
 * NUL-terminated, *r / *c may start NULL); final flushes what is held. 0, or -1 when out of memory. */
int nf_think_feed(nf_think_split *t, const char *text, size_t len, int final, char **r, size_t *rn, char **c,
                  size_t *cn);

/* A response in the making: one per request, fed the job's events in order. */
typedef struct nf_api_resp {
    const nf_api_call *call;
    const nf_api_model *m;
    char id[40];
    long long created;
    nf_think_split think;
    char *content, *reasoning; /* non-streaming: everything so far */
    size_t n_content, n_reasoning;
    void *logprobs;            /* cJSON array (chat) or object (completions) */
    size_t text_offset;        /* completions logprobs: bytes so far */
} nf_api_resp;

int nf_api_resp_init(nf_api_resp *r, const nf_api_call *call, const nf_api_model *m, uint64_t serial);
void nf_api_resp_free(nf_api_resp *r);
/* Streaming: the SSE bytes for an event ("data: {...}\n\n" lines; the role chunk first, the finish
 * chunk, the usage chunk and "data: [DONE]" after END), malloc'd into *out. Non-streaming: the
 * event is collected and *out is NULL until END, when it is the whole response body. 0, or -1 when
 * out of memory. `first` is set for the first call of a stream. */
int nf_api_resp_event(nf_api_resp *r, const nf_serve_event *ev, const nf_serve_job *j, int first, char **out,
                      size_t *out_len);

/* /v1/models, /tokenize, /detokenize bodies (malloc'd), or NULL with *e. */
char *nf_api_models_json(const nf_api_model *m, long long created);
char *nf_api_tokenize(const nf_api_model *m, const char *body, size_t len, nf_api_error *e);
char *nf_api_detokenize(const nf_api_model *m, const char *body, size_t len, nf_api_error *e);

/* Text of token bytes as valid UTF-8 without NUL (invalid bytes and NUL become U+FFFD: cJSON's strings
 * end at a NUL, which would cut the rest of a text off), malloc'd. */
char *nf_api_lossy_utf8(const char *s, size_t n);

#endif
