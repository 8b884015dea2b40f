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

int nf_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
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
void nf_sparse_moe_set_mmq_max(nf_sparse_moe *m, uint32_t a) { (void)m, (void)a; }
void nf_sparse_moe_set_tile_height(nf_sparse_moe *m, uint32_t h) { (void)m, (void)h; }
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

/* The decoder: creation is refused, so nothing else is reachable. */
#include "backend/cuda/decoder/decoder.h"

nf_status nf_cuda_decoder_create(const nf_cuda_decoder_desc *d, nf_cuda_decoder **out, nf_error *err)
{
    (void)d;
    *out = NULL;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "device 'cuda': this build has no CUDA backend");
}
void nf_cuda_decoder_free(nf_cuda_decoder *dec) { (void)dec; }
static nf_status no_cuda(nf_error *err) { return nf_error_set(err, NF_ERR_UNSUPPORTED, "this build has no CUDA backend"); }
nf_status nf_cuda_decoder_set_rope(nf_cuda_decoder *dec, const float *f, float a, nf_error *err)
{
    (void)dec, (void)f, (void)a;
    return no_cuda(err);
}
nf_status nf_cuda_decoder_forward_batch(nf_cuda_decoder *dec, const nf_batch *b, float *logits, nf_error *err)
{
    (void)dec, (void)b, (void)logits;
    return no_cuda(err);
}
nf_status nf_cuda_decoder_penalize(nf_cuda_decoder *dec, const nf_penalty *pen, const uint32_t *start,
                                   const int32_t *ids, const uint32_t *counts, nf_error *err)
{
    (void)dec, (void)pen, (void)start, (void)ids, (void)counts;
    return no_cuda(err);
}
nf_status nf_cuda_decoder_copy_page(nf_cuda_decoder *dec, uint32_t dst, uint32_t src, nf_error *err)
{
    (void)dec, (void)dst, (void)src;
    return no_cuda(err);
}
nf_status nf_cuda_decoder_topk(nf_cuda_decoder *dec, uint32_t k, int32_t *ids, float *vals, nf_error *err)
{
    (void)dec, (void)k, (void)ids, (void)vals;
    return no_cuda(err);
}
nf_status nf_cuda_decoder_logits(nf_cuda_decoder *dec, float *logits, nf_error *err)
{
    (void)dec, (void)logits;
    return no_cuda(err);
}
nf_status nf_cuda_decoder_routing(nf_cuda_decoder *dec, int32_t *ids, nf_error *err)
{
    (void)dec, (void)ids;
    return no_cuda(err);
}
size_t nf_cuda_decoder_weight_bytes(const nf_cuda_decoder *dec) { (void)dec; return 0; }
size_t nf_cuda_decoder_kv_bytes(const nf_cuda_decoder *dec) { (void)dec; return 0; }
nf_status nf_cuda_decoder_slot_copy(nf_cuda_decoder *dec, uint32_t dst, uint32_t src, nf_error *err)
{
    (void)dec, (void)dst, (void)src;
    return no_cuda(err);
}
nf_status nf_cuda_decoder_hidden(nf_cuda_decoder *dec, float *out, nf_error *err)
{
    (void)dec, (void)out;
    return no_cuda(err);
}
nf_status nf_cuda_decoder_mtp(nf_cuda_decoder *dec, const nf_batch *b, const float *hidden, float *logits,
                              float *hidden_out, nf_error *err)
{
    (void)dec, (void)b, (void)hidden, (void)logits, (void)hidden_out;
    return no_cuda(err);
}
