/* Expert parallelism's exchange over NCCL (nccl_ep.h). */
#include "backend/cuda/dist/nccl_ep.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

enum { kMaxRanks = 64 };

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
    ncclComm_t comm[kMaxRanks]; /* rank r's communicator, on its device */
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
    if (ranks == 0 || ranks > kMaxRanks)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "nccl: %u ranks (1 .. %d)", ranks, kMaxRanks);
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
    if (!c) {
        dlclose(lib);
        return nf_error_set(err, NF_ERR_NOMEM, "nccl: out of memory");
    }
    c->lib = lib, c->ranks = ranks;
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
    free(c);
}

int nf_nccl_version(const nf_nccl *c) { return c ? c->version : 0; }

/* sd[a][b]: rank a's first send row to rank b (prefix sums of counts[a][.]); rd[a][b]: rank a's first
 * receive row from rank b (prefix sums of counts[.][a]): nf_ep_exchange_sim's displacements. */
static void displacements(const uint32_t *counts, uint32_t G, size_t *sd, size_t *rd)
{
    for (uint32_t a = 0; a < G; a++) {
        size_t s = 0, r = 0;
        for (uint32_t b = 0; b < G; b++) {
            sd[a * G + b] = s, rd[a * G + b] = r;
            s += counts[a * G + b], r += counts[b * G + a];
        }
    }
}

nf_status nf_nccl_exchange(nf_nccl *c, const uint32_t *counts, size_t row_bytes, const void *const *send,
                           void *const *recv, int back, void *const *streams, nf_error *err)
{
    const uint32_t G = c->ranks;
    size_t *sd = malloc(2 * (size_t)G * G * sizeof *sd);
    if (!sd) return nf_error_set(err, NF_ERR_NOMEM, "nccl exchange: out of memory");
    size_t *rd = sd + (size_t)G * G;
    displacements(counts, G, sd, rd);
    /* rank a's operations with rank b: forward, a sends its rows for b and receives b's rows for it;
     * back, a returns the results of b's rows and receives the results of its own rows from b */
    ncclResult_t r = c->api.group_start();
    uint32_t fa = 0, fb = 0;
    const char *what = "ncclGroupStart";
    for (uint32_t a = 0; a < G && r == ncclSuccess; a++)
        for (uint32_t b = 0; b < G && r == ncclSuccess; b++) {
            const size_t ab = (size_t)a * G + b, ba = (size_t)b * G + a;
            const size_t n_out = back ? counts[ba] : counts[ab], at_out = back ? rd[ab] : sd[ab];
            const size_t n_in = back ? counts[ab] : counts[ba], at_in = back ? sd[ab] : rd[ab];
            cudaStream_t s = streams ? (cudaStream_t)streams[a] : NULL;
            fa = a, fb = b;
            if (n_out) {
                what = "send to";
                r = c->api.send((const char *)send[a] + at_out * row_bytes, n_out * row_bytes, ncclInt8, (int)b, c->comm[a], s);
            }
            if (n_in && r == ncclSuccess) {
                what = "receive from";
                r = c->api.recv((char *)recv[a] + at_in * row_bytes, n_in * row_bytes, ncclInt8, (int)b, c->comm[a], s);
            }
        }
    const ncclResult_t e = c->api.group_end(); /* closes the group whatever failed inside it */
    free(sd);
    if (r != ncclSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "nccl exchange: rank %u %s rank %u: %s", fa, what, fb, c->api.error_string(r));
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
