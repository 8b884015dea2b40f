/* The HTTP server (libmicrohttpd, a thread per connection): routes, authentication, limits,
 * streaming, and a graceful stop. It never runs the model: generation requests become jobs for the
 * backend (backend.h), attached once the model is loaded (/health is 503 until then). */
#ifndef NF_SERVE_SERVER_H
#define NF_SERVE_SERVER_H

#include <stddef.h>

#include "serve/api.h"
#include "serve/backend.h"

typedef struct nf_server_opts {
    const char *host;        /* address to bind (numeric or a name); NULL: 127.0.0.1 */
    int port;                /* 0: any free port (nf_server_port says which) */
    const char *api_key;     /* NULL or empty: no authentication */
    size_t max_body;         /* bytes; larger bodies get 413 */
    unsigned max_conns;      /* open connections at once */
    unsigned timeout_s;      /* an idle connection (headers or body not arriving) is closed after this */
} nf_server_opts;

typedef struct nf_server nf_server;

nf_status nf_server_start(const nf_server_opts *o, nf_server **out, nf_error *err);
int nf_server_port(const nf_server *s);
/* Makes the model available: /health turns 200 and generation requests are accepted. The model
 * description and the backend must outlive the server. */
void nf_server_attach(nf_server *s, const nf_api_model *m, nf_serve_backend *b);
/* Stops accepting connections, ends in-flight streams (each gets its final chunk), waits for the
 * requests to finish (at most grace_s seconds) and frees the server. The backend is the caller's. */
void nf_server_stop(nf_server *s, double grace_s);

/* Constant-time equality of two strings' bytes (the time depends on the lengths only). */
int nf_serve_key_equal(const char *a, size_t na, const char *b, size_t nb);

/* The chat page, generated from src/serve/chat.html at build time. */
extern const unsigned char nf_serve_page[];
extern const size_t nf_serve_page_len;

#endif
