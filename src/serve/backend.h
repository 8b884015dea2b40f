/* The seam between the HTTP layer and whatever runs the model.
 *
 * HTTP threads turn a request into an nf_serve_job (prompt ids, sampling, limits), hand it to a
 * backend with submit, and read the job's event queue (nf_serve_job_next) until its END event;
 * cancel (a client that went away, a shutting-down server) asks the backend to stop it early. The
 * backend owns the engine: HTTP threads never run the model.
 *
 * The backend (worker.c) is one thread that owns the engine and the continuous-batching scheduler
 * (engine/sched.h): every job is a sequence of the scheduler, and all running jobs advance together,
 * one batched forward per step. */
#ifndef NF_SERVE_BACKEND_H
#define NF_SERVE_BACKEND_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/sampler.h"
#include "engine/sched.h"

enum { NF_SERVE_MAX_STOPS = 4, NF_SERVE_MAX_TOP_LOGPROBS = NF_SEQ_MAX_TOP_LOGPROBS };

/* Why a job ended: OpenAI's finish_reason values plus the two that are not a finish. */
typedef enum nf_serve_finish {
    NF_FINISH_LENGTH = 0, /* max_tokens (or the context) reached */
    NF_FINISH_STOP,       /* an end-of-generation id or a stop string */
    NF_FINISH_CANCELLED,  /* cancel() or a server stop */
    NF_FINISH_ERROR       /* the backend failed; the END event's text says why */
} nf_serve_finish;

/* What a job asks for. Strings and arrays are owned by the job (freed by nf_serve_job_release). */
typedef struct nf_serve_req {
    int32_t *prompt;     /* token ids, all < the model's vocabulary */
    size_t n_prompt;
    size_t max_tokens;   /* >= 1; prompt + max_tokens fits the context (the HTTP layer checks) */
    nf_sampler_params sampling; /* penalties included (engine/sampler.h) */
    char *stops[NF_SERVE_MAX_STOPS];
    size_t n_stops;
    int ignore_eos;      /* generate past end-of-generation ids (benchmarks) */
    int logprobs;        /* report each token's log-probability */
    int top_logprobs;    /* and the best top_logprobs alternatives (<= NF_SERVE_MAX_TOP_LOGPROBS) */
} nf_serve_req;

typedef enum nf_serve_event_kind { NF_EV_TOKEN = 0, NF_EV_END } nf_serve_event_kind;

typedef struct nf_serve_event {
    nf_serve_event_kind kind;
    char *text;           /* TOKEN: text that became final with this token (valid UTF-8, maybe empty);
                           * END: the tail held back for stop strings, or the error message */
    size_t len;
    int32_t id;           /* TOKEN: the sampled id */
    float logprob;        /* TOKEN with logprobs */
    int n_top;
    int32_t top_ids[NF_SERVE_MAX_TOP_LOGPROBS];
    float top_lp[NF_SERVE_MAX_TOP_LOGPROBS];
    nf_serve_finish finish; /* END */
    double t;             /* seconds since the job was submitted, when the event was pushed */
} nf_serve_event;

/* A job: the request, its event queue and its reference count (HTTP side + backend side). */
typedef struct nf_serve_job {
    nf_serve_req req;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    nf_serve_event *ev;
    size_t n_ev, cap_ev, head; /* events [head, n_ev) not read yet */
    int ended;                 /* the END event was pushed */
    int cancelled;             /* read under mu by the backend */
    int refs;
    uint64_t t0_ns;            /* submit time */
    size_t prompt_tokens, completion_tokens; /* set by the backend before END */
    double ttft;               /* seconds to the first token, -1 before it */
} nf_serve_job;

/* A new job with one reference; takes ownership of req's arrays and strings (even on failure). */
nf_status nf_serve_job_create(nf_serve_req *req, nf_serve_job **out, nf_error *err);
void nf_serve_job_retain(nf_serve_job *j);
void nf_serve_job_release(nf_serve_job *j);
/* Backend side: appends an event (text copied); NF_ERR_NOMEM leaves the queue unchanged. */
nf_status nf_serve_job_push(nf_serve_job *j, const nf_serve_event *ev);
int nf_serve_job_cancelled(nf_serve_job *j);
/* HTTP side: waits up to timeout_ms for the next event. 1: *ev filled (the caller frees ev->text
 * with free()); 0: timed out. */
int nf_serve_job_next(nf_serve_job *j, nf_serve_event *ev, int timeout_ms);

/* What /metrics reports of the backend. */
typedef struct nf_serve_backend_stats {
    size_t running;        /* sequences admitted (holding KV pages) */
    size_t waiting;        /* jobs submitted and not admitted yet (queued or preempted) */
    size_t pages_used;     /* KV pages held by sequences */
    size_t pages_free;     /* KV pages an allocation can take: free + cached */
    size_t pages_cached;   /* of those, pages holding a cached prefix nobody holds now */
    size_t batch_max;      /* the most sequences one forward has carried since start */
    unsigned long long preemptions, steps; /* counters since start */
    unsigned long long spec_verifications, spec_drafts, spec_accepted; /* speculation's, since start */
} nf_serve_backend_stats;

typedef struct nf_serve_backend nf_serve_backend;
typedef struct nf_serve_backend_ops {
    /* Queues the job (the backend retains it). NF_ERR_REFUSED when the waiting queue is full. */
    nf_status (*submit)(nf_serve_backend *b, nf_serve_job *j, nf_error *err);
    /* Asks the backend to end the job soon with NF_FINISH_CANCELLED; safe at any time. */
    void (*cancel)(nf_serve_backend *b, nf_serve_job *j);
    void (*stats)(nf_serve_backend *b, nf_serve_backend_stats *st);
    /* Ends every job (queued ones get END at once, running ones at the next step), joins the
     * backend's threads and frees it. */
    void (*destroy)(nf_serve_backend *b);
} nf_serve_backend_ops;

struct nf_serve_backend {
    const nf_serve_backend_ops *ops;
};

#endif
