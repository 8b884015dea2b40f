/* The CUDA backend of the engine: describes the model to the CUDA decoder (backend/cuda/decoder)
 * in its own terms and forwards the engine's calls. The math is the CPU backend's (cpu_forward.c);
 * what differs is documented in decoder.h (bf16 activations into every product, bf16 KV cache). */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/decoder/decoder.h"
#include "engine/engine.h"
#include "engine/moe_bank.h"

typedef struct cuda_state {
    const nf_model *m;
    nf_engine_opts o;  /* the engine's options, defaults filled in */
    nf_cuda_decoder *dec;
    nf_rope_config rope;
    uint32_t rope_seq; /* the seq_len inv_freq was computed for (dynamic scaling) */
    float *inv_freq;   /* [head_dim / 2] */
} cuda_state;

static const float *f32_of(const nf_tensor *t) { return t ? (const float *)(const void *)t->data : NULL; }

/* Layer l of the model, or (l == layers) its MTP block's layer. */
static nf_status describe_layer(const nf_model *m, uint32_t l, int allow_a8, nf_cuda_layer_desc *d, nf_moe_bank *bank,
                                nf_error *err)
{
    const int mtp = l == m->cfg.layers;
    const nf_model_layer *ly = mtp ? m->mtp : &m->layers[l];
    *d = (nf_cuda_layer_desc){
        .attn_norm = f32_of(ly->attn_norm), .ffn_norm = f32_of(ly->ffn_norm), .q_bias = f32_of(ly->attn_q_bias),
        .k_bias = f32_of(ly->attn_k_bias), .v_bias = f32_of(ly->attn_v_bias), .q_norm = f32_of(ly->attn_q_norm),
        .k_norm = f32_of(ly->attn_k_norm), .q = nf_moe_matrix_of(ly->attn_q), .k = nf_moe_matrix_of(ly->attn_k),
        .v = nf_moe_matrix_of(ly->attn_v), .o = nf_moe_matrix_of(ly->attn_output),
        .attn_gate = nf_moe_matrix_of(ly->attn_gate), .gate = nf_moe_matrix_of(ly->ffn_gate),
        .up = nf_moe_matrix_of(ly->ffn_up), .down = nf_moe_matrix_of(ly->ffn_down), .is_linear = ly->is_linear,
        .ssm_qkv = nf_moe_matrix_of(ly->ssm_qkv), .ssm_z = nf_moe_matrix_of(ly->ssm_z),
        .ssm_ba = nf_moe_matrix_of(ly->ssm_ba), .ssm_out = nf_moe_matrix_of(ly->ssm_out),
        .ssm_conv = f32_of(ly->ssm_conv), .ssm_dt_bias = f32_of(ly->ssm_dt_bias), .ssm_a_log = f32_of(ly->ssm_a_log),
        .ssm_norm = f32_of(ly->ssm_norm)};
    if (!ly->is_moe) return NF_OK;
    d->moe = bank;
    nf_status st = mtp ? nf_moe_bank_of_mtp(m, bank, err) : nf_moe_bank_of_layer(m, l, bank, err);
    bank->gate_up.allow_a8 = bank->down.allow_a8 = allow_a8;
    bank->shared_gate_up.allow_a8 = bank->shared_down.allow_a8 = allow_a8;
    return st;
}

static nf_status set_rope(cuda_state *s, uint32_t seq, nf_error *err)
{
    float factor = 1;
    nf_rope_inv_freq(&s->rope, seq, s->inv_freq, &factor);
    s->rope_seq = seq;
    return nf_cuda_decoder_set_rope(s->dec, s->inv_freq, factor, err);
}

static void cuda_destroy(void *state)
{
    cuda_state *s = state;
    if (!s) return;
    nf_cuda_decoder_free(s->dec);
    free(s->inv_freq);
    free(s);
}

static nf_status cuda_create(const nf_model *m, const nf_engine_opts *o, void **out, nf_error *err)
{
    *out = NULL;
    char why[160];
    if (nf_cuda_device_count(why, sizeof why) < 1)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "device 'cuda': no GPU is visible (%s)", why);
    const nf_model_config *c = &m->cfg;
    cuda_state *s = calloc(1, sizeof *s);
    /* the model's layers, then the MTP block's when it has one and speculation asked for it */
    const nf_model_layer *mtp = o->mtp ? m->mtp : NULL;
    const uint32_t n_layers = c->layers + (mtp != NULL);
    nf_cuda_layer_desc *ld = calloc(n_layers, sizeof *ld);
    nf_moe_bank *banks = calloc(n_layers, sizeof *banks);
    if (s) s->inv_freq = malloc(c->rope_dim / 2 * sizeof(float) + 1);
    nf_status st = NF_OK;
    if (!s || !ld || !banks || !s->inv_freq) st = nf_error_set(err, NF_ERR_NOMEM, "cuda backend: out of memory");
    for (uint32_t l = 0; !st && l < n_layers; l++) st = describe_layer(m, l, !o->no_a8, &ld[l], &banks[l], err);
    if (!st) {
        nf_cuda_decoder_desc d = {.hidden = c->hidden, .layers = c->layers, .heads = c->heads,
                                  .kv_heads = c->kv_heads, .head_dim = c->head_dim, .vocab = c->vocab,
                                  .rope_dim = c->rope_dim,
                                  .gdn = {c->ssm_k_heads, c->ssm_v_heads, c->ssm_k_dim, c->ssm_v_dim, c->ssm_conv},
                                  .rms_eps = c->rms_eps, .embd = nf_moe_matrix_of(m->token_embd),
                                  .head = nf_moe_matrix_of(m->output), .out_norm = f32_of(m->output_norm),
                                  .layer = ld, .ctx = o->ctx, .chunk = o->chunk, .page_tokens = o->page_tokens,
                                  .kv_pages = o->kv_pages, .max_seqs = o->max_seqs, .state_snaps = o->state_snaps, .no_graphs = o->no_graphs,
                                  .trace_routing = o->trace_routing, .allow_a8 = !o->no_a8,
                                  .mtp = {mtp ? &ld[c->layers] : NULL, nf_moe_matrix_of(mtp ? m->mtp_fc : NULL),
                                          f32_of(m->mtp_norm_embd), f32_of(m->mtp_norm_hidden),
                                          f32_of(m->mtp_output_norm)}};
        s->m = m;
        s->o = *o;
        st = nf_cuda_decoder_create(&d, &s->dec, err);
    }
    free(ld);
    free(banks);
    if (!st) {
        static const nf_rope_kind kinds[] = {NF_ROPE_NONE, NF_ROPE_LINEAR, NF_ROPE_DYNAMIC, NF_ROPE_YARN,
                                             NF_ROPE_LLAMA3};
        s->rope = (nf_rope_config){kinds[c->rope_scaling], c->rope_theta, c->rope_factor,
                                   c->rope_orig_ctx ? c->rope_orig_ctx : c->max_ctx, c->rope_low_freq_factor,
                                   c->rope_high_freq_factor, c->rope_dim};
        st = set_rope(s, 0, err);
    }
    if (st) {
        cuda_destroy(s);
        return st;
    }
    *out = s;
    return NF_OK;
}

/* The batch goes to the decoder as it is (its KV pool has the engine's page geometry). */
static nf_status cuda_forward(void *state, const nf_batch *b, float *logits, nf_error *err)
{
    cuda_state *s = state;
    nf_status st = nf_batch_check(b, &s->o, s->m->cfg.vocab, err);
    if (st) return st;
    if (s->rope.kind == NF_ROPE_DYNAMIC) { /* one rotation table for the batch: one sequence */
        if (b->n_seqs > 1)
            return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda backend: dynamic NTK rope scales its frequencies by "
                                "the sequence's length, so this model runs one sequence per forward (got %u)", b->n_seqs);
        const uint32_t end = b->pos0[0] + b->n_tokens;
        if (end > s->rope_seq && (st = set_rope(s, end, err))) return st; /* HF's dynamic update */
    }
    return nf_cuda_decoder_forward_batch(s->dec, b, logits, err);
}

static nf_status cuda_copy_page(void *state, uint32_t dst, uint32_t src, nf_error *err)
{
    return nf_cuda_decoder_copy_page(((cuda_state *)state)->dec, dst, src, err);
}

static nf_status cuda_logits(void *state, float *out, nf_error *err)
{
    return nf_cuda_decoder_logits(((cuda_state *)state)->dec, out, err);
}

static nf_status cuda_penalize(void *state, const nf_penalty *pen, const uint32_t *start, const int32_t *ids,
                               const uint32_t *counts, nf_error *err)
{
    return nf_cuda_decoder_penalize(((cuda_state *)state)->dec, pen, start, ids, counts, err);
}

static nf_status cuda_topk(void *state, uint32_t k, int32_t *ids, float *vals, nf_error *err)
{
    return nf_cuda_decoder_topk(((cuda_state *)state)->dec, k, ids, vals, err);
}

static nf_status cuda_routing(void *state, int32_t *ids, nf_error *err)
{
    return nf_cuda_decoder_routing(((cuda_state *)state)->dec, ids, err);
}

static nf_status cuda_slot_copy(void *state, uint32_t dst, uint32_t src, nf_error *err)
{
    return nf_cuda_decoder_slot_copy(((cuda_state *)state)->dec, dst, src, err);
}

static nf_status cuda_hidden(void *state, float *out, nf_error *err)
{
    return nf_cuda_decoder_hidden(((cuda_state *)state)->dec, out, err);
}

/* The MTP block (engine.h; the decoder's nf_cuda_decoder_mtp). Its positions are the main model's, so
 * the rotation table serves both; a dynamic rope's table follows the forward's length and is refused
 * (as on the CPU). */
static nf_status cuda_mtp(void *state, const nf_batch *b, const float *hidden, float *logits, float *hidden_out,
                          nf_error *err)
{
    cuda_state *s = state;
    if (!s->m->mtp || !s->o.mtp)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda backend: no MTP block (the model has none, or "
                            "nf_engine_opts.mtp did not load it)");
    if (s->rope.kind == NF_ROPE_DYNAMIC) return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda backend: MTP with dynamic rope");
    nf_status st = nf_batch_check(b, &s->o, s->m->cfg.vocab, err);
    return st ? st : nf_cuda_decoder_mtp(s->dec, b, hidden, logits, hidden_out, err);
}

static void cuda_describe(void *state, nf_backend_info *info)
{
    cuda_state *s = state;
    info->weight_bytes = nf_cuda_decoder_weight_bytes(s->dec);
    info->kv_bytes = nf_cuda_decoder_kv_bytes(s->dec);
}

const nf_backend_ops nf_cuda_backend = {.name = "cuda", .create = cuda_create, .destroy = cuda_destroy,
                                        .forward = cuda_forward, .logits = cuda_logits, .topk = cuda_topk,
                                        .penalize = cuda_penalize,
                                        .copy_page = cuda_copy_page,
                                        .describe = cuda_describe, .routing = cuda_routing,
                                        .hidden = cuda_hidden, .mtp = cuda_mtp, .slot_copy = cuda_slot_copy,
                                        .logit_rows = 1};
