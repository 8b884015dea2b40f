/* The CUDA backend's answers in a build without CUDA (NF_CUDA=OFF or no nvcc). */
#include <stdio.h>

#include "backend/cuda/cuda_backend.h"

int nf_cuda_compiled(void) { return 0; }

const char *nf_cuda_archs(void) { return ""; }

int nf_cuda_device_count(char *why, size_t why_size)
{
    if (why && why_size) snprintf(why, why_size, "this build has no CUDA backend");
    return 0;
}

int nf_cuda_device_describe(int dev, char *buf, size_t size)
{
    (void)dev;
    if (buf && size) buf[0] = '\0';
    return -1;
}

/* The sparse-MoE operator's entry points: binding is refused, so nothing else is reachable. */
#include "backend/cuda/sparse_moe/sparse_moe.h"

nf_status nf_sparse_moe_bind(const nf_moe_bank *bank, uint32_t max_tokens, nf_sparse_moe **out, size_t *ws,
                             nf_error *err)
{
    (void)bank, (void)max_tokens;
    *out = NULL;
    *ws = 0;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "sparse_moe: this build has no CUDA backend");
}
void nf_sparse_moe_free(nf_sparse_moe *m) { (void)m; }
const char *nf_sparse_moe_profile(const nf_sparse_moe *m) { (void)m; return ""; }
size_t nf_sparse_moe_weight_bytes(const nf_sparse_moe *m) { (void)m; return 0; }
size_t nf_sparse_moe_workspace_bytes(const nf_sparse_moe *m, uint32_t tokens) { (void)m, (void)tokens; return 0; }
nf_moe_route nf_sparse_moe_route(const nf_sparse_moe *m, uint32_t tokens) { (void)m, (void)tokens; return NF_MOE_ROUTE_DECODE; }
const char *nf_moe_route_name(nf_moe_route r) { (void)r; return ""; }
void nf_sparse_moe_set_thresholds(nf_sparse_moe *m, uint32_t a, uint32_t b) { (void)m, (void)a, (void)b; }
nf_status nf_sparse_moe_forward(const nf_sparse_moe *m, const uint16_t *x, uint32_t tokens, uint16_t *out,
                                void *workspace, void *stream, nf_error *err)
{
    (void)m, (void)x, (void)tokens, (void)out, (void)workspace, (void)stream;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "sparse_moe: this build has no CUDA backend");
}
void nf_sparse_moe_routing(const nf_sparse_moe *m, void *ws, const int32_t **ids, const float **w)
{
    (void)m, (void)ws;
    *ids = NULL;
    *w = NULL;
}
void nf_sparse_moe_force_routing(nf_sparse_moe *m, const int32_t *ids) { (void)m, (void)ids; }
