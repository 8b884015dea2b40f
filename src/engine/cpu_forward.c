/* The CPU backend of the engine: binds a model's tensors to nf_cpu weight views and runs the
 * decoder (transformers' LlamaModel / Qwen2MoeModel / Qwen3MoeModel forward, in f32) over a batch
 * of sequences (base/batch.h):
 *
 *   x = embed(tokens)                                     all T tokens of all S sequences
 *   per layer:  h = rmsnorm(x) ; q,k,v = Wq h, Wk h, Wv h (+ bias: model.qkv_bias) ; q,k = rmsnorm per head
 *               (qwen3) ; rope(q, k) at each token's own position ; k, v into its sequence's pages ;
 *               x += Wo attention(q, that sequence's K, V)
 *               h = rmsnorm(x) ; x += moe(h) or Wdown (silu(Wgate h) * Wup h)
 *   logits = Whead rmsnorm(x)                             each sequence's last token, or every token
 *
 * Every product runs once over the whole batch; attention runs per sequence through its page
 * table. A sequence's logits are bit-identical to its logits run alone: every op is per row except
 * the products and attention, and those are made row-independent (cpu.h: each sequence's tokens
 * are one segment of every product, attention items never span sequences). The one exception is
 * dynamic NTK rope (NF_ROPE_DYNAMIC), whose frequencies follow the sequence's length: a batch of
 * more than one sequence is refused for it.
 *
 * Gated DeltaNet hybrids (qwen3_next, qwen3_5_moe; docs/hybrid.md): a linear layer's token mixer is
 *   qkv, z, ba = Wqkv h, Wz h, Wba h ; out = gdn(qkv, z, ba, its sequence's state slot) ; x += Wout out
 * and the attention layers are gated (x += Wo (attention * sigmoid(Wgate h))) with partial rotary. Each
 * sequence's recurrent state lives in the slot b->state_slot[i] names (max_seqs slots); a sequence at
 * pos0 = 0 starts from a zeroed slot, one at pos0 > 0 must continue the slot's last position exactly
 * (a recurrent state cannot rewind). KV pages exist for the attention layers only. A hybrid with an MTP
 * block (docs/hybrid.md "MTP") also keeps every token's final-normed hidden state (`hidden`), runs the
 * block (`mtp`, cpu_mtp) on a KV pool of its own, and copies state slots to spare slots and back
 * (`slot_copy`) for speculation's rollback. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "engine/engine.h"

typedef struct cpu_layer {
    const float *attn_norm, *ffn_norm;          /* [H] */
    const float *q_bias, *k_bias, *v_bias;      /* [q_dim] / [kv_dim] or NULL */
    const float *q_norm, *k_norm;               /* [head_dim] or NULL */
    nf_cpu_weight q, k, v, o;
    nf_cpu_weight gate, up, down;               /* dense layers */
    nf_cpu_moe moe;                             /* MoE layers */
    nf_cpu_moe_ws *moe_ws;                      /* shared by the MoE layers of one geometry (a layer's ws is
                                                   scratch of its own forward call only) */
    int moe_ws_owner;                           /* this layer created moe_ws (and frees it) */
    int is_moe;
    nf_cpu_kv kv;                               /* attention layers */
    nf_cpu_weight gate_w;                       /* gated attention: [q_dim][H] */
    nf_cpu_weight ssm_qkv, ssm_z, ssm_ba, ssm_out; /* Gated DeltaNet layers */
    nf_cpu_gdn gdn;
    int is_linear;
    size_t state_off;                           /* this layer's floats within a state slot */
} cpu_layer;

typedef struct cpu_state {
    const nf_model *m;
    nf_engine_opts o;        /* the engine's options, defaults filled in */
    nf_cpu *cpu;
    uint32_t ctx, chunk, q_dim, kv_dim;
    nf_cpu_weight embd, head;
    const float *out_norm;
    cpu_layer *layers;
    nf_nvfp4_planes *planes; /* [n_planes] views of nvfp4 tensors */
    size_t n_planes, cap_planes;
    nf_rope_config rope;
    float *inv_freq;         /* [head_dim / 2] */
    float attn_factor;
    uint32_t rope_seq;       /* the seq_len inv_freq was computed for (dynamic scaling) */
    float *rope_cs;          /* [chunk][rope_dim]: each token's nf_cpu_rope_table, filled with the positions
                                (positions()) and applied by every attention layer */
    int32_t *trace;          /* [layers][chunk][top_k] with trace_routing, else NULL */
    nf_cpu_ep_sim *ep;       /* ep_sim_ranks > 1: the MoE blocks' simulated ranks (one set for all layers) */
    size_t trace_T;          /* tokens of the last forward */
    uint32_t *pos;           /* [chunk]: each token's position in its sequence (this forward) */
    uint32_t *iota;          /* [chunk + 1]: 0, 1, 2, ...: one segment per row (the MTP head's last tokens) */
    uint32_t *lseg;          /* [max_seqs + 1]: the head's segments, one per sequence's logits rows */
    nf_cpu_attn_seq *aseq;   /* [max_seqs]: the sequences of this forward, for attention */
    float *x, *xn, *q, *k, *v, *att, *tmp, *g, *u; /* [chunk][...] activations */
    void *kv_mem;
    /* hybrids */
    float *gate;             /* [chunk][q_dim] attention gate */
    float *qkv, *z, *ba, *go; /* [chunk][conv_dim], [chunk][Vd], [chunk][2 Hv], [chunk][Vd] */
    float *slots;            /* [max_seqs][slot_floats]: each linear layer's state at its state_off */
    float *spares;           /* [max_seqs][slot_floats]: slots max_seqs .. 2 max_seqs - 1 (slot_copy), at first use */
    float *snaps;            /* [state_snaps][slot_floats]: slots 2 max_seqs .. (the prefix cache's), at first use */
    size_t slot_floats;
    uint32_t *slot_pos;      /* [2 max_seqs + state_snaps]: positions the slot's state has absorbed */
    nf_cpu_gdn_seq *gseq;    /* [max_seqs] */
    float *gdn_ws;           /* [threads][nf_cpu_gdn_ws_floats]: the chunked form's scratch (gdn_chunk) */
    /* the MTP block (docs/hybrid.md "MTP"), when the model has one */
    int has_mtp;
    cpu_layer mtp;           /* its attention layer (own KV pool: mtp_kv_mem) and MLP */
    nf_cpu_weight mtp_fc;    /* [H][2H] */
    const float *mtp_norm_embd, *mtp_norm_hidden, *mtp_out_norm; /* [H] */
    float *hid;              /* [chunk][H]: the last forward's final-normed hidden states */
    float *cat;              /* [chunk][2H]: the MTP's normed embedding | normed hidden */
    void *mtp_kv_mem;
} cpu_state;

/* ---- binding ----------------------------------------------------------------------------------- */

static nf_status bind_weight(cpu_state *s, const nf_tensor *t, nf_cpu_weight *w, nf_error *err)
{
    memset(w, 0, sizeof *w);
    if (!t) return NF_OK;
    w->codec = t->codec;
    w->rows = (uint32_t)t->layout.rows;
    w->cols = (uint32_t)t->layout.cols;
    if (t->codec->flags & NF_CODEC_PLANAR) {
        if (s->n_planes == s->cap_planes) return nf_error_set(err, NF_ERR_INTERNAL, "plane table full");
        nf_nvfp4_planes *p = &s->planes[s->n_planes++];
        nf_status st = nf_nvfp4_view(t->data, t->layout.payload_bytes, t->layout.rows, t->layout.cols,
                                     t->desc.divisors ? t->desc.divisors : 1, p, err);
        if (st) return nf_error_prefix(err, "tensor '%s'", t->desc.name);
        w->nv = p;
        return NF_OK;
    }
    if (!t->codec->dequantize_row)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "tensor '%s': codec %s cannot be decoded on the CPU",
                            t->desc.name, t->codec->name);
    w->data = t->data;
    w->row_bytes = nf_codec_row_bytes(t->codec, t->layout.cols);
    return NF_OK;
}

static const float *f32_of(const nf_tensor *t) { return t ? (const float *)(const void *)t->data : NULL; }

static nf_status bind_layer(cpu_state *s, const nf_model_layer *ly, cpu_layer *cl, nf_error *err)
{
    const nf_model_config *c = &s->m->cfg;
    nf_status st;
    cl->attn_norm = f32_of(ly->attn_norm);
    cl->ffn_norm = f32_of(ly->ffn_norm);
    cl->q_bias = f32_of(ly->attn_q_bias);
    cl->k_bias = f32_of(ly->attn_k_bias);
    cl->v_bias = f32_of(ly->attn_v_bias);
    cl->q_norm = f32_of(ly->attn_q_norm);
    cl->k_norm = f32_of(ly->attn_k_norm);
    cl->is_moe = ly->is_moe;
    cl->is_linear = ly->is_linear;
    if ((st = bind_weight(s, ly->attn_gate, &cl->gate_w, err)) || (st = bind_weight(s, ly->ssm_qkv, &cl->ssm_qkv, err)) ||
        (st = bind_weight(s, ly->ssm_z, &cl->ssm_z, err)) || (st = bind_weight(s, ly->ssm_ba, &cl->ssm_ba, err)) ||
        (st = bind_weight(s, ly->ssm_out, &cl->ssm_out, err)))
        return st;
    if (ly->is_linear) {
        cl->gdn = (nf_cpu_gdn){c->ssm_k_heads, c->ssm_v_heads, c->ssm_k_dim, c->ssm_v_dim, c->ssm_conv,
                               f32_of(ly->ssm_conv), f32_of(ly->ssm_dt_bias), f32_of(ly->ssm_a_log),
                               f32_of(ly->ssm_norm), c->rms_eps, s->o.gdn_chunk};
        cl->state_off = s->slot_floats;
        s->slot_floats += nf_cpu_gdn_state_floats(&cl->gdn);
    }
    if ((st = bind_weight(s, ly->attn_q, &cl->q, err)) || (st = bind_weight(s, ly->attn_k, &cl->k, err)) ||
        (st = bind_weight(s, ly->attn_v, &cl->v, err)) || (st = bind_weight(s, ly->attn_output, &cl->o, err)) ||
        (st = bind_weight(s, ly->ffn_gate, &cl->gate, err)) || (st = bind_weight(s, ly->ffn_up, &cl->up, err)) ||
        (st = bind_weight(s, ly->ffn_down, &cl->down, err)))
        return st;
    if (!ly->is_moe) return NF_OK;
    nf_cpu_moe *mo = &cl->moe;
    *mo = (nf_cpu_moe){.hidden = c->hidden, .experts = c->experts, .top_k = c->top_k, .inter = c->moe_inter,
                       .shared_inter = c->shared_inter, .norm_topk = c->norm_topk};
    if ((st = bind_weight(s, ly->ffn_gate_inp, &mo->router, err)) ||
        (st = bind_weight(s, ly->ffn_gate_up_exps, &mo->gate_up, err)) ||
        (st = bind_weight(s, ly->ffn_down_exps, &mo->down, err)) ||
        (st = bind_weight(s, ly->ffn_gate_up_shexp, &mo->shared_gate_up, err)) ||
        (st = bind_weight(s, ly->ffn_down_shexp, &mo->shared_down, err)) ||
        (st = bind_weight(s, ly->ffn_gate_inp_shexp, &mo->shared_gate, err)))
        return st;
    /* an earlier MoE layer of the same geometry lends its workspace: 48 layers of Qwen3-30B-A3B kept 48
     * (45 MB each at 128 tokens) */
    for (uint32_t l = 0; s->layers && l < s->m->cfg.layers && &s->layers[l] != cl; l++) {
        const cpu_layer *o = &s->layers[l];
        if (o->moe_ws && o->moe_ws_owner && o->moe.hidden == mo->hidden && o->moe.experts == mo->experts &&
            o->moe.top_k == mo->top_k && o->moe.inter == mo->inter && o->moe.shared_inter == mo->shared_inter) {
            cl->moe_ws = o->moe_ws;
            return NF_OK;
        }
    }
    cl->moe_ws_owner = 1;
    return nf_cpu_moe_ws_create(mo, s->chunk, &cl->moe_ws, err);
}

/* Simulated expert-parallel ranks for the MoE blocks, shaped by the first MoE layer (all share E, k, H). */
static nf_status create_ep_sim(cpu_state *s, uint32_t ranks, nf_error *err)
{
    for (uint32_t l = 0; l < s->m->cfg.layers; l++)
        if (s->layers[l].is_moe) return nf_cpu_ep_sim_create(&s->layers[l].moe, ranks, s->chunk, &s->ep, err);
    return NF_OK;
}

static void cpu_destroy(void *state)
{
    cpu_state *s = state;
    if (!s) return;
    nf_cpu_ep_sim_free(s->ep);
    if (s->layers)
        for (uint32_t l = 0; l < s->m->cfg.layers; l++)
            if (s->layers[l].moe_ws_owner) nf_cpu_moe_ws_free(s->layers[l].moe_ws);
    if (s->mtp.moe_ws_owner) nf_cpu_moe_ws_free(s->mtp.moe_ws);
    free(s->hid);
    free(s->cat);
    free(s->mtp_kv_mem);
    free(s->layers);
    free(s->planes);
    free(s->inv_freq);
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->tmp);
    free(s->g);
    free(s->u);
    free(s->kv_mem);
    free(s->trace);
    free(s->pos);
    free(s->rope_cs);
    free(s->iota);
    free(s->lseg);
    free(s->aseq);
    free(s->gate);
    free(s->qkv);
    free(s->z);
    free(s->ba);
    free(s->go);
    free(s->slots);
    free(s->spares);
    free(s->snaps);
    free(s->slot_pos);
    free(s->gseq);
    free(s->gdn_ws);
    nf_cpu_free(s->cpu);
    free(s);
}

static nf_status alloc_buffers(cpu_state *s, const nf_engine_opts *o, nf_error *err)
{
    const nf_model_config *c = &s->m->cfg;
    const size_t C = s->chunk, H = c->hidden, D = c->dense_inter ? c->dense_inter : 1;
    s->x = malloc(C * H * sizeof(float));
    s->xn = malloc(C * H * sizeof(float));
    s->tmp = malloc(C * H * sizeof(float));
    s->q = malloc(C * s->q_dim * sizeof(float));
    s->att = malloc(C * s->q_dim * sizeof(float));
    s->k = malloc(C * s->kv_dim * sizeof(float));
    s->v = malloc(C * s->kv_dim * sizeof(float));
    s->g = malloc(C * D * sizeof(float));
    s->u = malloc(C * D * sizeof(float));
    s->inv_freq = malloc(c->head_dim / 2 * sizeof(float));
    s->pos = malloc(C * sizeof(uint32_t));
    s->rope_cs = malloc(C * (c->rope_dim ? c->rope_dim : 1) * sizeof(float));
    s->iota = malloc((C + 1) * sizeof(uint32_t));
    s->lseg = malloc(((size_t)o->max_seqs + 1) * sizeof(uint32_t));
    s->aseq = malloc(o->max_seqs * sizeof(nf_cpu_attn_seq));
    /* the page pool, per attention layer: k then v, each [kv_pages][page_tokens][kv_dim] */
    const size_t esz = o->kv_bf16 ? 2 : 4, per = (size_t)o->kv_pages * o->page_tokens * s->kv_dim * esz;
    const size_t n_attn = c->layers - c->n_linear;
    s->kv_mem = calloc(n_attn ? n_attn * 2 : 1, per ? per : 1);
    if (!s->x || !s->xn || !s->tmp || !s->q || !s->att || !s->k || !s->v || !s->g || !s->u || !s->inv_freq ||
        !s->pos || !s->rope_cs || !s->iota || !s->lseg || !s->aseq || !s->kv_mem)
        return nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory for a KV pool of %u pages of %u tokens "
                            "(%zu MiB) and %zu-token buffers", o->kv_pages, o->page_tokens,
                            n_attn * 2 * per >> 20, C);
    for (size_t i = 0; i <= C; i++) s->iota[i] = (uint32_t)i;
    for (uint32_t l = 0, a = 0; l < c->layers; l++) {
        if (s->layers[l].is_linear) continue;
        uint8_t *base = (uint8_t *)s->kv_mem + (size_t)a++ * 2 * per;
        s->layers[l].kv = (nf_cpu_kv){base, base + per, o->kv_bf16, o->page_tokens, o->kv_pages, c->kv_heads,
                                      c->head_dim};
    }
    return NF_OK;
}

/* The MTP block: its weights, its attention layer's own KV pool (the main pool's pages and shape) and buffers. */
static nf_status bind_mtp(cpu_state *s, const nf_engine_opts *o, nf_error *err)
{
    const nf_model *m = s->m;
    if (!m->mtp || !o->mtp) return NF_OK; /* loaded only for speculation (nf_engine_opts.mtp) */
    const size_t H = m->cfg.hidden, C = s->chunk, esz = o->kv_bf16 ? 2 : 4;
    const size_t per = (size_t)o->kv_pages * o->page_tokens * s->kv_dim * esz;
    nf_status st = bind_weight(s, m->mtp_fc, &s->mtp_fc, err);
    if (!st) st = bind_layer(s, m->mtp, &s->mtp, err);
    if (st) return st;
    s->mtp_norm_embd = f32_of(m->mtp_norm_embd);
    s->mtp_norm_hidden = f32_of(m->mtp_norm_hidden);
    s->mtp_out_norm = f32_of(m->mtp_output_norm);
    s->hid = malloc(C * H * sizeof(float));
    s->cat = malloc(C * 2 * H * sizeof(float));
    s->mtp_kv_mem = calloc(2, per ? per : 1);
    if (!s->hid || !s->cat || !s->mtp_kv_mem)
        return nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory for the MTP block's KV pool (%zu MiB)",
                            2 * per >> 20);
    uint8_t *base = s->mtp_kv_mem;
    s->mtp.kv = (nf_cpu_kv){base, base + per, o->kv_bf16, o->page_tokens, o->kv_pages, m->cfg.kv_heads, m->cfg.head_dim};
    s->has_mtp = 1;
    return NF_OK;
}

/* The hybrids' buffers and state slots (after binding, which sized a slot). */
static nf_status alloc_hybrid(cpu_state *s, const nf_engine_opts *o, nf_error *err)
{
    const nf_model_config *c = &s->m->cfg;
    if (c->attn_gate && !(s->gate = malloc((size_t)s->chunk * s->q_dim * sizeof(float))))
        return nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory");
    if (!c->n_linear) return NF_OK;
    if (c->ssm_conv > NF_CPU_GDN_MAX_K || c->ssm_v_dim > NF_CPU_GDN_MAX_DV || o->gdn_chunk > NF_CPU_GDN_MAX_CHUNK)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "cpu backend: Gated DeltaNet conv kernel %u / v head dim %u / "
                            "chunk %u above %d / %d / %d", c->ssm_conv, c->ssm_v_dim, o->gdn_chunk, NF_CPU_GDN_MAX_K,
                            NF_CPU_GDN_MAX_DV, NF_CPU_GDN_MAX_CHUNK);
    const size_t C = s->chunk, Vd = (size_t)c->ssm_v_heads * c->ssm_v_dim;
    s->qkv = malloc(C * nf_model_conv_dim(c) * sizeof(float));
    s->z = malloc(C * Vd * sizeof(float));
    s->go = malloc(C * Vd * sizeof(float));
    s->ba = malloc(C * 2 * c->ssm_v_heads * sizeof(float));
    s->slots = calloc((size_t)o->max_seqs * s->slot_floats, sizeof(float));
    s->slot_pos = calloc(2 * (size_t)o->max_seqs + o->state_snaps, sizeof(uint32_t));
    s->gseq = malloc(o->max_seqs * sizeof *s->gseq);
    for (uint32_t l = 0; l < c->layers; l++) /* every linear layer has the same shape: size from any */
        if (s->layers[l].is_linear && o->gdn_chunk && !s->gdn_ws &&
            !(s->gdn_ws = malloc((size_t)nf_cpu_threads(s->cpu) * nf_cpu_gdn_ws_floats(&s->layers[l].gdn) * sizeof(float))))
            return nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory");
    if (!s->qkv || !s->z || !s->go || !s->ba || !s->slots || !s->slot_pos || !s->gseq)
        return nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory for %u state slots of %zu MiB", o->max_seqs,
                            s->slot_floats * sizeof(float) >> 20);
    return NF_OK;
}

static uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

static nf_status cpu_create(const nf_model *m, const nf_engine_opts *o, void **out, nf_error *err)
{
    *out = NULL;
    const nf_model_config *c = &m->cfg;
    cpu_state *s = calloc(1, sizeof *s);
    if (!s) return nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory");
    s->m = m;
    s->o = *o;
    s->ctx = o->ctx;
    s->chunk = o->chunk;
    s->q_dim = c->heads * c->head_dim;
    s->kv_dim = c->kv_heads * c->head_dim;
    s->cap_planes = (size_t)(c->layers + 1) * 16 + 4; /* + the MTP block */
    s->planes = calloc(s->cap_planes, sizeof *s->planes);
    s->layers = calloc(c->layers, sizeof *s->layers);
    uint32_t max_cols = max_u32(max_u32(c->hidden, s->q_dim), max_u32(max_u32(c->dense_inter, c->moe_inter), c->shared_inter));
    max_cols = max_u32(max_cols, c->ssm_v_heads * c->ssm_v_dim);
    if (m->mtp && o->mtp) max_cols = max_u32(max_cols, 2 * c->hidden); /* mtp.fc */
    nf_status st = NF_OK;
    if (!s->planes || !s->layers) st = nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory");
    if (!st) st = nf_cpu_create(o->threads, max_cols, s->ctx, &s->cpu, err);
    for (uint32_t l = 0; l < c->layers; l++) s->layers[l].is_linear = m->layers[l].is_linear;
    if (!st) {
        nf_cpu_set_reference(s->cpu, o->reference);
        nf_cpu_set_a8(s->cpu, !o->no_a8);
        st = alloc_buffers(s, o, err);
    }
    if (!st && o->trace_routing && c->top_k &&
        !(s->trace = malloc((size_t)c->layers * s->chunk * c->top_k * sizeof(int32_t))))
        st = nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory");
    if (!st) st = bind_weight(s, m->token_embd, &s->embd, err);
    if (!st) st = bind_weight(s, m->output, &s->head, err);
    for (uint32_t l = 0; !st && l < c->layers; l++) st = bind_layer(s, &m->layers[l], &s->layers[l], err);
    if (!st) st = alloc_hybrid(s, o, err);
    if (!st) st = bind_mtp(s, o, err);
    if (!st && o->ep_sim_ranks > 1 && c->top_k) st = create_ep_sim(s, o->ep_sim_ranks, err);
    if (st) {
        cpu_destroy(s);
        return st;
    }
    s->out_norm = f32_of(m->output_norm);
    static const nf_rope_kind kinds[] = {NF_ROPE_NONE, NF_ROPE_LINEAR, NF_ROPE_DYNAMIC, NF_ROPE_YARN, NF_ROPE_LLAMA3};
    s->rope = (nf_rope_config){kinds[c->rope_scaling], c->rope_theta, c->rope_factor,
                               c->rope_orig_ctx ? c->rope_orig_ctx : c->max_ctx, c->rope_low_freq_factor,
                               c->rope_high_freq_factor, c->rope_dim};
    nf_rope_inv_freq(&s->rope, 0, s->inv_freq, &s->attn_factor);
    *out = s;
    return NF_OK;
}

/* ---- forward ----------------------------------------------------------------------------------- */

static void add_rows(float *y, const float *x, size_t n) /* y += x */
{
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* The products of one layer run over all T tokens; each sequence's tokens are one segment. */
static nf_cpu_gemm_job job_of(const nf_batch *b, nf_cpu_weight w, const float *x, size_t ldx, float *y, size_t ldy)
{
    return (nf_cpu_gemm_job){w, x, ldx, y, ldy, b->n_tokens, b->seq_start, b->n_seqs, NULL};
}

/* Bias, per-head norm (qwen3) and rope of token t's q and k, at the token's own position. */
static void qk_row(cpu_state *s, const cpu_layer *L, size_t t)
{
    const nf_model_config *c = &s->m->cfg;
    const size_t hd = c->head_dim;
    float *q = s->q + t * s->q_dim, *k = s->k + t * s->kv_dim, *v = s->v + t * s->kv_dim;
    if (L->q_bias) {
        add_rows(q, L->q_bias, s->q_dim);
        add_rows(k, L->k_bias, s->kv_dim);
        add_rows(v, L->v_bias, s->kv_dim);
    }
    if (L->q_norm) {
        for (uint32_t h = 0; h < c->heads; h++) nf_cpu_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, c->rms_eps);
        for (uint32_t h = 0; h < c->kv_heads; h++) nf_cpu_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, c->rms_eps);
    }
    nf_cpu_rope_apply(q, c->heads, c->head_dim, c->rope_dim, s->rope_cs + t * c->rope_dim);
    nf_cpu_rope_apply(k, c->kv_heads, c->head_dim, c->rope_dim, s->rope_cs + t * c->rope_dim);
}

/* Per-token row work of a prompt over the pool (each token's row computed alone: the same bits as
 * one thread): the norms before the products and qk_row. */
enum { ROWS_PAR_MIN = 16 }; /* fewer tokens (decoding) stay on the calling thread */

typedef struct rows_ctx rows_ctx;
struct rows_ctx {
    void (*row)(const rows_ctx *r, size_t t); /* token t's row work */
    cpu_state *s;
    const cpu_layer *L;  /* qk rows */
    float *y;            /* norm rows: y[t] = rmsnorm(x[t]) * w, rows of n */
    const float *x, *w;
    size_t n;
    float eps;
};

static void norm_row(const rows_ctx *r, size_t t)
{
    nf_cpu_rmsnorm(r->y + t * r->n, r->x + t * r->n, r->w, r->n, r->eps);
}
static void qk_row_of(const rows_ctx *r, size_t t) { qk_row(r->s, r->L, t); }

static void rows_fn(void *ctx, size_t begin, size_t end, int worker)
{
    (void)worker;
    const rows_ctx *r = ctx;
    for (size_t t = begin; t < end; t++) r->row(r, t);
}

static void run_rows(cpu_state *s, rows_ctx *r, size_t T)
{
    if (T >= ROWS_PAR_MIN) nf_parallel_for(nf_cpu_pool(s->cpu), T, 4, rows_fn, r);
    else rows_fn(r, 0, T, 0);
}

/* y[t] = rmsnorm(x[t]) * w for the T rows of n. */
static void norm_rows(cpu_state *s, float *y, const float *x, const float *w, size_t n, size_t T)
{
    rows_ctx r = {norm_row, s, NULL, y, x, w, n, s->m->cfg.rms_eps};
    run_rows(s, &r, T);
}

static void qk_rows(cpu_state *s, const cpu_layer *L, size_t T)
{
    rows_ctx r = {qk_row_of, s, L, NULL, NULL, NULL, 0, 0};
    run_rows(s, &r, T);
}

static void attention_block(cpu_state *s, cpu_layer *L, const nf_batch *b)
{
    const nf_model_config *c = &s->m->cfg;
    const size_t T = b->n_tokens, H = c->hidden;
    norm_rows(s, s->xn, s->x, L->attn_norm, H, T);
    nf_cpu_gemm_job jobs[4] = {job_of(b, L->q, s->xn, H, s->q, s->q_dim), job_of(b, L->k, s->xn, H, s->k, s->kv_dim),
                               job_of(b, L->v, s->xn, H, s->v, s->kv_dim), job_of(b, L->gate_w, s->xn, H, s->gate, s->q_dim)};
    nf_cpu_gemm_batch(s->cpu, jobs, L->gate_w.rows ? 4 : 3);
    qk_rows(s, L, T);
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const nf_cpu_attn_seq *a = &s->aseq[i];
        nf_cpu_kv_store(&L->kv, a->pages, a->pos0, a->n, s->k + (size_t)a->t0 * s->kv_dim,
                        s->v + (size_t)a->t0 * s->kv_dim);
    }
    nf_cpu_attention(s->cpu, &L->kv, s->aseq, b->n_seqs, s->q, c->heads, 1.0f / sqrtf((float)c->head_dim), s->att);
    if (L->gate_w.rows) /* attn_output * torch.sigmoid(gate) */
        for (size_t i = 0; i < T * s->q_dim; i++) s->att[i] *= 1.0f / (1.0f + expf(-s->gate[i]));
    jobs[0] = job_of(b, L->o, s->att, s->q_dim, s->tmp, H);
    nf_cpu_gemm_batch(s->cpu, jobs, 1);
    add_rows(s->x, s->tmp, T * H);
}

/* A Gated DeltaNet layer's token mixer: the three in_proj products over the batch, the conv and
 * recurrence per sequence on its state slot (nf_cpu_gdn_forward), out_proj. */
static void gdn_block(cpu_state *s, cpu_layer *L, const nf_batch *b)
{
    const nf_model_config *c = &s->m->cfg;
    const size_t T = b->n_tokens, H = c->hidden, conv = nf_model_conv_dim(c), Vd = (size_t)c->ssm_v_heads * c->ssm_v_dim;
    norm_rows(s, s->xn, s->x, L->attn_norm, H, T);
    nf_cpu_gemm_job jobs[3] = {job_of(b, L->ssm_qkv, s->xn, H, s->qkv, conv), job_of(b, L->ssm_z, s->xn, H, s->z, Vd),
                               job_of(b, L->ssm_ba, s->xn, H, s->ba, 2 * c->ssm_v_heads)};
    nf_cpu_gemm_batch(s->cpu, jobs, 3);
    for (uint32_t i = 0; i < b->n_seqs; i++)
        s->gseq[i] = (nf_cpu_gdn_seq){s->slots + (size_t)b->state_slot[i] * s->slot_floats + L->state_off,
                                      b->seq_start[i], nf_batch_tokens_of(b, i)};
    nf_cpu_gdn_forward(s->cpu, &L->gdn, s->gseq, b->n_seqs, s->qkv, s->z, s->ba, s->go, s->gdn_ws);
    jobs[0] = job_of(b, L->ssm_out, s->go, Vd, s->tmp, H);
    nf_cpu_gemm_batch(s->cpu, jobs, 1);
    add_rows(s->x, s->tmp, T * H);
}

static void mlp_block(cpu_state *s, cpu_layer *L, const nf_batch *b, int32_t *trace)
{
    const nf_model_config *c = &s->m->cfg;
    const size_t T = b->n_tokens, H = c->hidden, D = c->dense_inter;
    norm_rows(s, s->xn, s->x, L->ffn_norm, H, T);
    if (L->is_moe) {
        if (s->ep && L != &s->mtp) /* ids are the router's and T <= chunk: it cannot fail */
            (void)nf_cpu_moe_forward_ep(s->cpu, &L->moe, s->ep, s->xn, T, b->seq_start, b->n_seqs, s->tmp, trace, NULL);
        else
            nf_cpu_moe_forward(s->cpu, &L->moe, L->moe_ws, s->xn, T, b->seq_start, b->n_seqs, s->tmp, trace, NULL);
    } else {
        if (trace) memset(trace, 0xff, T * c->top_k * sizeof(int32_t)); /* -1: no routing */
        nf_cpu_gemm_job jobs[2] = {job_of(b, L->gate, s->xn, H, s->g, D), job_of(b, L->up, s->xn, H, s->u, D)};
        nf_cpu_gemm_batch(s->cpu, jobs, 2);
        nf_cpu_swiglu_par(s->cpu, s->g, s->g, s->u, T * D);
        jobs[0] = job_of(b, L->down, s->g, D, s->tmp, H);
        nf_cpu_gemm_batch(s->cpu, jobs, 1);
    }
    add_rows(s->x, s->tmp, T * H);
}

/* The final norm and the head over each sequence's logits rows (base/batch.h nf_batch_rows_of: its
 * last token, its last few for a speculative verification, or all), one segment per sequence, as
 * when it runs alone: [sum of rows][vocab]. */
static void head_block(cpu_state *s, const nf_batch *b, float *logits)
{
    const nf_model_config *c = &s->m->cfg;
    const size_t H = c->hidden;
    s->lseg[0] = 0;
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const uint32_t r = nf_batch_rows_of(b, i), t0 = b->seq_start[i + 1] - r;
        for (uint32_t j = 0; j < r; j++)
            nf_cpu_rmsnorm(s->xn + (size_t)(s->lseg[i] + j) * H, s->x + (size_t)(t0 + j) * H, s->out_norm, H, c->rms_eps);
        s->lseg[i + 1] = s->lseg[i] + r;
    }
    nf_cpu_gemm_job j = {s->head, s->xn, H, logits, c->vocab, s->lseg[b->n_seqs], s->lseg, b->n_seqs, NULL};
    nf_cpu_gemm_batch(s->cpu, &j, 1);
}

/* A hybrid's state slots: every sequence names a distinct slot below max_seqs that either starts
 * (pos0 = 0: zeroed here) or holds exactly pos0 positions. Checked in full before any slot is reset,
 * so a refused batch changes nothing. */
static nf_status prepare_slots(cpu_state *s, const nf_batch *b, nf_error *err)
{
    if (!s->slots) return NF_OK;
    nf_status st = nf_batch_check_slots(b, s->o.max_seqs, s->slot_pos, "cpu backend", err);
    if (st) return st;
    for (uint32_t i = 0; i < b->n_seqs; i++)
        if (b->pos0[i] == 0) {
            memset(s->slots + (size_t)b->state_slot[i] * s->slot_floats, 0, s->slot_floats * sizeof(float));
            s->slot_pos[b->state_slot[i]] = 0;
        }
    return NF_OK;
}

/* Each token's position, its rope table (once for every layer) and each sequence's attention view. */
static void positions(cpu_state *s, const nf_batch *b)
{
    const uint32_t rd = s->m->cfg.rope_dim;
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const uint32_t t0 = b->seq_start[i], n = nf_batch_tokens_of(b, i);
        s->aseq[i] = (nf_cpu_attn_seq){b->pages + (size_t)i * b->page_stride, b->pos0[i], t0, n};
        for (uint32_t t = 0; t < n; t++) {
            s->pos[t0 + t] = b->pos0[i] + t;
            nf_cpu_rope_table(rd, s->pos[t0 + t], s->inv_freq, s->attn_factor, s->rope_cs + (size_t)(t0 + t) * rd);
        }
    }
}

/* The state slots, the dynamic rope update (one sequence), positions(). */
static nf_status prepare(cpu_state *s, const nf_batch *b, nf_error *err)
{
    if (s->rope.kind == NF_ROPE_DYNAMIC && b->n_seqs > 1)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "cpu backend: dynamic NTK rope scales its frequencies by the "
                            "sequence's length, so this model runs one sequence per forward (got %u)", b->n_seqs);
    nf_status st = prepare_slots(s, b, err); /* the last refusal: it may reset slots */
    if (st) return st;
    /* HF's dynamic update, before positions() builds the rope tables from the frequencies */
    if (s->rope.kind == NF_ROPE_DYNAMIC && b->pos0[0] + b->n_tokens > s->rope_seq) {
        s->rope_seq = b->pos0[0] + b->n_tokens;
        nf_rope_inv_freq(&s->rope, s->rope_seq, s->inv_freq, &s->attn_factor);
    }
    positions(s, b);
    return NF_OK;
}

static nf_status cpu_forward(void *state, const nf_batch *b, float *logits, nf_error *err)
{
    cpu_state *s = state;
    const nf_model_config *c = &s->m->cfg;
    nf_status st = nf_batch_check(b, &s->o, c->vocab, err);
    if (!st && !logits) st = nf_error_set(err, NF_ERR_INVALID_ARG, "cpu backend: the forward needs a logits buffer");
    if (!st) st = prepare(s, b, err);
    if (st) return st;
    const size_t T = b->n_tokens, H = c->hidden;
    for (size_t t = 0; t < T; t++) nf_cpu_weight_row(&s->embd, (uint32_t)b->tokens[t], s->x + t * H);
    for (uint32_t l = 0; l < c->layers; l++) {
        if (s->layers[l].is_linear) gdn_block(s, &s->layers[l], b);
        else attention_block(s, &s->layers[l], b);
        mlp_block(s, &s->layers[l], b, s->trace ? s->trace + (size_t)l * T * c->top_k : NULL);
    }
    s->trace_T = T;
    for (uint32_t i = 0; s->slots && i < b->n_seqs; i++) s->slot_pos[b->state_slot[i]] = b->pos0[i] + nf_batch_tokens_of(b, i);
    if (s->has_mtp) /* every token's final-normed hidden state, for the MTP block (cpu_hidden) */
        for (size_t t = 0; t < T; t++) nf_cpu_rmsnorm(s->hid + t * H, s->x + t * H, s->out_norm, H, c->rms_eps);
    head_block(s, b, logits);
    return NF_OK;
}

static nf_status cpu_hidden(void *state, float *out, nf_error *err)
{
    cpu_state *s = state;
    if (!s->has_mtp) return nf_error_set(err, NF_ERR_UNSUPPORTED, "cpu backend: hidden states are kept with an MTP "
                                         "block loaded only (nf_engine_opts.mtp)");
    memcpy(out, s->hid, s->trace_T * s->m->cfg.hidden * sizeof(float));
    return NF_OK;
}

/* The MTP block (vLLM's Qwen3NextMultiTokenPredictor; docs/hybrid.md "MTP"):
 *   x = mtp.fc [rmsnorm(embed(token)) | rmsnorm(hidden)] ; x += attention ; x += moe ; h' = rmsnorm(x) ;
 *   logits = head(h')
 * every norm with its own (1 + w) weight, the attention over the block's own pages. */
static nf_status cpu_mtp(void *state, const nf_batch *b, const float *hidden, float *logits, float *hidden_out,
                         nf_error *err)
{
    cpu_state *s = state;
    const nf_model_config *c = &s->m->cfg;
    if (!s->has_mtp) return nf_error_set(err, NF_ERR_UNSUPPORTED, "cpu backend: no MTP block (the model has none, or "
                                         "nf_engine_opts.mtp did not load it)");
    nf_status st = nf_batch_check(b, &s->o, c->vocab, err);
    if (!st && (!logits || !hidden))
        st = nf_error_set(err, NF_ERR_INVALID_ARG, "cpu backend: the MTP block needs hidden states and a logits buffer");
    if (!st && s->rope.kind == NF_ROPE_DYNAMIC) st = nf_error_set(err, NF_ERR_UNSUPPORTED, "cpu backend: MTP with dynamic rope");
    if (st) return st;
    positions(s, b);
    const size_t T = b->n_tokens, H = c->hidden;
    for (size_t t = 0; t < T; t++) {
        nf_cpu_weight_row(&s->embd, (uint32_t)b->tokens[t], s->tmp + t * H);
        nf_cpu_rmsnorm(s->cat + t * 2 * H, s->tmp + t * H, s->mtp_norm_embd, H, c->rms_eps);
        nf_cpu_rmsnorm(s->cat + t * 2 * H + H, hidden + t * H, s->mtp_norm_hidden, H, c->rms_eps);
    }
    nf_cpu_gemm_job j = job_of(b, s->mtp_fc, s->cat, 2 * H, s->x, H);
    nf_cpu_gemm_batch(s->cpu, &j, 1);
    attention_block(s, &s->mtp, b);
    mlp_block(s, &s->mtp, b, NULL);
    float *ho = hidden_out ? hidden_out : s->xn;
    if (b->all_logits) {
        for (size_t t = 0; t < T; t++) nf_cpu_rmsnorm(ho + t * H, s->x + t * H, s->mtp_out_norm, H, c->rms_eps);
        j = job_of(b, s->head, ho, H, logits, c->vocab);
    } else { /* each sequence's last token, one segment each (head_block's way) */
        for (uint32_t i = 0; i < b->n_seqs; i++)
            nf_cpu_rmsnorm(ho + i * H, s->x + (size_t)(b->seq_start[i + 1] - 1) * H, s->mtp_out_norm, H, c->rms_eps);
        j = (nf_cpu_gemm_job){s->head, ho, H, logits, c->vocab, b->n_seqs, s->iota, b->n_seqs, NULL};
    }
    nf_cpu_gemm_batch(s->cpu, &j, 1);
    return NF_OK;
}

/* Slot i's floats: one of the forward's slots, a spare (max_seqs ..) or a snapshot (2 max_seqs ..); each
 * group of spares allocated at the first use of one of them. */
static nf_status slot_at(cpu_state *s, uint32_t i, float **out, nf_error *err)
{
    const size_t sf = s->slot_floats, n = s->o.max_seqs, ns = s->o.state_snaps;
    if (!s->slots) return nf_error_set(err, NF_ERR_INVALID_ARG, "cpu backend: this model has no state slots");
    if (i >= 2 * n + ns)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cpu backend: state slot %u is not below 2 max_seqs + "
                            "state_snaps = %zu", i, 2 * n + ns);
    float **group = i < n ? &s->slots : i < 2 * n ? &s->spares : &s->snaps;
    const size_t first = i < n ? 0 : i < 2 * n ? n : 2 * n, count = i < 2 * n ? n : ns;
    if (!*group && !(*group = calloc(count * sf, sizeof(float))))
        return nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory for %zu spare state slots of %zu MiB", count,
                            sf * sizeof(float) >> 20);
    *out = *group + (i - first) * sf;
    return NF_OK;
}

static nf_status cpu_slot_copy(void *state, uint32_t dst, uint32_t src, nf_error *err)
{
    cpu_state *s = state;
    float *d = NULL, *f = NULL;
    nf_status st = slot_at(s, dst, &d, err);
    if (st || (st = slot_at(s, src, &f, err))) return st;
    if (d != f) memcpy(d, f, s->slot_floats * sizeof(float));
    s->slot_pos[dst] = s->slot_pos[src];
    return NF_OK;
}

static nf_status cpu_routing(void *state, int32_t *ids, nf_error *err)
{
    cpu_state *s = state;
    if (!s->trace) return nf_error_set(err, NF_ERR_INVALID_ARG, "routing: a dense model has none");
    memcpy(ids, s->trace, (size_t)s->m->cfg.layers * s->trace_T * s->m->cfg.top_k * sizeof(int32_t));
    return NF_OK;
}

static nf_status cpu_copy_page(void *state, uint32_t dst, uint32_t src, nf_error *err)
{
    cpu_state *s = state;
    if (dst >= s->o.kv_pages || src >= s->o.kv_pages)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "copy_page(%u <- %u): the pool has %u pages", dst, src,
                            s->o.kv_pages);
    for (uint32_t l = 0; l < s->m->cfg.layers; l++)
        if (!s->layers[l].is_linear) nf_cpu_kv_copy_page(&s->layers[l].kv, dst, src);
    if (s->has_mtp) nf_cpu_kv_copy_page(&s->mtp.kv, dst, src);
    return NF_OK;
}

const nf_backend_ops nf_cpu_backend = {.name = "cpu", .create = cpu_create, .destroy = cpu_destroy,
                                       .forward = cpu_forward, .copy_page = cpu_copy_page, .routing = cpu_routing,
                                       .hidden = cpu_hidden, .mtp = cpu_mtp, .slot_copy = cpu_slot_copy, .logit_rows = 1,
                                       .prefill_min = NF_CPU_STEP_MAX + 1};
