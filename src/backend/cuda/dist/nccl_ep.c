/* Expert parallelism's exchange over NCCL (nccl_ep.h). */
#include "backend/cuda/dist/nccl_ep.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "dist/ep.h"

#if NF_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>

/* The entry points used, resolved from the library at open: ninfer never links NCCL. */
typedef struct nf_nccl_api {
    ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_version)(int *);
} nf_nccl_api;

struct nf_nccl {
    void *lib;
    nf_nccl_api api;
    uint32_t ranks;
    int version;
    ncclComm_t comm[NF_EP_MAX_RANKS]; /* rank r's communicator, on its device */
    nf_ep_op *ops;                    /* [2 ranks^2]: an exchange's calls, planned anew each exchange */
};

static nf_status resolve(nf_nccl *c, const char *path, nf_error *err)
{
    const struct {
        const char *name;
        void *dst;
    } sym[] = {{"ncclCommInitAll", &c->api.comm_init_all}, {"ncclCommDestroy", &c->api.comm_destroy},
               {"ncclGroupStart", &c->api.group_start},    {"ncclGroupEnd", &c->api.group_end},
               {"ncclSend", &c->api.send},                 {"ncclRecv", &c->api.recv},
               {"ncclGetErrorString", &c->api.error_string}, {"ncclGetVersion", &c->api.get_version}};
    for (size_t i = 0; i < sizeof sym / sizeof sym[0]; i++) {
        void *p = dlsym(c->lib, sym[i].name);
        if (!p) return nf_error_set(err, NF_ERR_UNSUPPORTED, "nccl: %s has no %s", path, sym[i].name);
        memcpy(sym[i].dst, &p, sizeof p); /* a function pointer's bits, as POSIX dlsym intends */
    }
    return NF_OK;
}

nf_status nf_nccl_open(uint32_t ranks, const int *devices, nf_nccl **out, nf_error *err)
{
    *out = NULL;
    if (ranks == 0 || ranks > NF_EP_MAX_RANKS)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "nccl: %u ranks (1 .. %d)", ranks, NF_EP_MAX_RANKS);
    for (uint32_t i = 0; i < ranks; i++)
        for (uint32_t j = i + 1; j < ranks; j++)
            if (devices[i] == devices[j])
                return nf_error_set(err, NF_ERR_INVALID_ARG, "nccl: ranks %u and %u are both on device %d (one rank a device)",
                                    i, j, devices[i]);
    const char *env = getenv("NF_NCCL_LIB"), *path = env && *env ? env : "libnccl.so.2";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "nccl: cannot load %s (%s); NF_NCCL_LIB names the library", path,
                            dlerror());
    nf_nccl *c = calloc(1, sizeof *c);
    nf_ep_op *ops = malloc(2 * (size_t)ranks * ranks * sizeof *ops);
    if (!c || !ops) {
        free(c), free(ops);
        dlclose(lib);
        return nf_error_set(err, NF_ERR_NOMEM, "nccl: out of memory");
    }
    c->lib = lib, c->ranks = ranks, c->ops = ops;
    nf_status st = resolve(c, path, err);
    ncclResult_t r = ncclSuccess;
    if (!st && (r = c->api.get_version(&c->version)) == ncclSuccess)
        r = c->api.comm_init_all(c->comm, (int)ranks, devices);
    if (!st && r != ncclSuccess)
        st = nf_error_set(err, NF_ERR_CUDA, "nccl: ncclCommInitAll over %u devices: %s", ranks, c->api.error_string(r));
    if (st) {
        memset(c->comm, 0, sizeof c->comm);
        nf_nccl_close(c);
        return st;
    }
    *out = c;
    return NF_OK;
}

void nf_nccl_close(nf_nccl *c)
{
    if (!c) return;
    for (uint32_t r = 0; r < c->ranks; r++)
        if (c->comm[r]) c->api.comm_destroy(c->comm[r]);
    dlclose(c->lib);
    free(c->ops);
    free(c);
}

int nf_nccl_version(const nf_nccl *c) { return c ? c->version : 0; }

nf_status nf_nccl_exchange(nf_nccl *c, const uint32_t *counts, size_t row_bytes, const void *const *send,
                           void *const *recv, int back, void *const *streams, nf_error *err)
{
    /* the calls nf_ep_exchange_plan lists (tested against the simulation on the CPU), in one group */
    const uint32_t G = c->ranks;
    const nf_ep_op *ops = c->ops;
    const size_t n = nf_ep_exchange_plan(G, counts, back, c->ops);
    ncclResult_t r = c->api.group_start();
    if (r != ncclSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "nccl exchange: ncclGroupStart: %s", c->api.error_string(r));
    size_t i = 0;
    for (; i < n && r == ncclSuccess; i++) {
        const nf_ep_op *o = &ops[i];
        cudaStream_t s = streams ? (cudaStream_t)streams[o->rank] : NULL;
        const size_t at = o->at * row_bytes, bytes = o->rows * row_bytes;
        r = o->recv ? c->api.recv((char *)recv[o->rank] + at, bytes, ncclInt8, (int)o->peer, c->comm[o->rank], s)
                    : c->api.send((const char *)send[o->rank] + at, bytes, ncclInt8, (int)o->peer, c->comm[o->rank], s);
    }
    const ncclResult_t e = c->api.group_end(); /* closes the group whatever failed inside it */
    if (r != ncclSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "nccl exchange: rank %u %s rank %u: %s", ops[i - 1].rank,
                            ops[i - 1].recv ? "receive from" : "send to", ops[i - 1].peer, c->api.error_string(r));
    if (e != ncclSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "nccl exchange over %u ranks: ncclGroupEnd: %s", G, c->api.error_string(e));
    return NF_OK;
}

#else /* built without nccl.h */

struct nf_nccl {
    int unused;
};

nf_status nf_nccl_open(uint32_t ranks, const int *devices, nf_nccl **out, nf_error *err)
{
    (void)ranks, (void)devices;
    *out = NULL;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "nccl: this build has no NCCL (nccl.h was not found when it was configured)");
}

void nf_nccl_close(nf_nccl *c) { (void)c; }

int nf_nccl_version(const nf_nccl *c)
{
    (void)c;
    return 0;
}

nf_status nf_nccl_exchange(nf_nccl *c, const uint32_t *counts, size_t row_bytes, const void *const *send,
                           void *const *recv, int back, void *const *streams, nf_error *err)
{
    (void)c, (void)counts, (void)row_bytes, (void)send, (void)recv, (void)back, (void)streams;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "nccl: this build has no NCCL");
}

#endif
