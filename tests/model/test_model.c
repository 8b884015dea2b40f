/* nf_model: the config read from metadata, every tensor bound, and load errors that name the file
 * and the tensor or key at fault (a missing tensor, a wrong shape, a bad config value). */
#define _POSIX_C_SOURCE 200809L
#include <unistd.h>

#include "model/model.h"
#include "model/synth.h"
#include "nf_test.h"

static void expect_error(const char *path, const synth_opts *o, const char *needle1, const char *needle2)
{
    CHECK(synth_write(path, o));
    nf_model *m = NULL;
    nf_error e = {0};
    CHECK(nf_model_load(path, &m, &e) == NF_ERR_FORMAT);
    CHECK(m == NULL);
    CHECK_CONTAINS(e.msg, needle1);
    CHECK_CONTAINS(e.msg, needle2);
    unlink(path);
}

/* The hybrid (qwen3_next): its keys and both layer kinds bound; a missing GDN tensor, a bent conv
 * kernel and malformed hybrid keys refused with the key or tensor named. */
static void test_hybrid(const char *path)
{
    synth_opts o = {.arch = "qwen3_next", .codec = NF_CODEC_BF16};
    CHECK(synth_write(path, &o));
    nf_model *m = NULL;
    nf_error e;
    CHECK_MSG(nf_model_load(path, &m, &e) == NF_OK, "qwen3_next: %s", e.msg);
    if (m) {
        const nf_model_config *c = &m->cfg;
        CHECK(c->arch == NF_ARCH_QWEN3_NEXT && c->n_linear == 1 && c->linear_layers[0] && !c->linear_layers[1]);
        CHECK(c->rope_dim == 4 && c->attn_gate && c->ssm_k_heads == SY_HK && c->ssm_v_heads == SY_HV);
        CHECK_EQ_INT(nf_model_conv_dim(c), SY_CONV);
        CHECK(m->layers[0].is_linear && m->layers[0].ssm_qkv && !m->layers[0].attn_q);
        CHECK(!m->layers[1].is_linear && m->layers[1].attn_gate && m->layers[1].attn_q && !m->layers[1].ssm_qkv);
        nf_model_free(m);
    }
    unlink(path);
    o.skip = "blk.0.ssm_a_log";
    expect_error(path, &o, "no tensor named 'blk.0.ssm_a_log'", path);
    o = (synth_opts){.arch = "qwen3_next", .codec = NF_CODEC_BF16, .bend = "blk.0.ssm_conv"};
    expect_error(path, &o, "blk.0.ssm_conv' has shape [65, 4], expected [64, 4]", path);
    o = (synth_opts){.arch = "qwen3_next", .codec = NF_CODEC_BF16, .bad_hybrid = 1};
    expect_error(path, &o, "model.linear_layers has 1 entries, expected model.layers = 2", path);
    o.bad_hybrid = 2;
    expect_error(path, &o, "ssm_v_heads 3 must be a multiple of ssm_k_heads 2", path);
}

int main(void)
{
    char path[] = "/tmp/nf_test_model_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    const char *arch[] = {"llama", "qwen2_moe", "qwen3_moe"};
    for (int a = 0; a < 3; a++) {
        synth_opts o = {.arch = arch[a], .codec = NF_CODEC_BF16};
        CHECK(synth_write(path, &o));
        nf_model *m = NULL;
        nf_error e;
        nf_status st = nf_model_load(path, &m, &e);
        CHECK_MSG(st == NF_OK, "%s: %s", arch[a], e.msg);
        if (st) continue;
        CHECK(strcmp(nf_arch_name(m->cfg.arch), arch[a]) == 0);
        CHECK_EQ_INT(m->cfg.hidden, SY_H);
        CHECK_EQ_INT(m->cfg.heads, SY_HEADS);
        CHECK_EQ_INT(m->cfg.kv_heads, SY_KV);
        CHECK(m->cfg.rope_theta == 10000.0);
        CHECK_EQ_INT(m->cfg.experts, a ? SY_E : 0);
        CHECK_EQ_INT(m->cfg.shared_inter, a == 1 ? SY_S : 0);
        CHECK_EQ_INT(m->layers[1].is_moe, a == 2);
        CHECK((m->output == m->token_embd) == (a != 2)); /* tied for llama and qwen2 here */
        CHECK((m->layers[0].attn_q_bias != NULL) == (a == 1));
        CHECK((m->layers[0].attn_q_norm != NULL) == (a == 2));
        /* bytes per token: every dense byte + k/E of each expert bank (computed here from the tensors) */
        uint64_t expect = 0;
        for (size_t i = 0; i < nf_artifact_n_tensors(m->art); i++) {
            const nf_tensor *t = nf_artifact_tensor(m->art, i);
            uint64_t b = t->layout.payload_bytes;
            if (strstr(t->desc.name, "_exps")) b = b / SY_E * SY_K;
            if (strcmp(t->desc.name, "token_embd") == 0) b = b / SY_V * (m->output == m->token_embd ? SY_V + 1 : 1);
            expect += b;
        }
        CHECK_EQ_U64(nf_model_bytes_per_token(m), expect);
        nf_model_free(m);
        unlink(path);
    }
    synth_opts o = {.arch = "qwen3_moe", .codec = NF_CODEC_BF16, .skip = "blk.1.ffn_down_exps"};
    expect_error(path, &o, "blk.1.ffn_down_exps", path);
    o = (synth_opts){.arch = "qwen2_moe", .codec = NF_CODEC_Q8_0, .bend = "blk.0.attn_k"};
    expect_error(path, &o, "blk.0.attn_k' has shape [33, 64], expected [32, 64]", path);
    o = (synth_opts){.arch = "qwen2_moe", .codec = NF_CODEC_BF16, .skip = "blk.0.ffn_gate_inp_shexp"};
    expect_error(path, &o, "no tensor named 'blk.0.ffn_gate_inp_shexp'", path);
    o = (synth_opts){.arch = "llama", .codec = NF_CODEC_BF16, .skip = "output_norm"};
    expect_error(path, &o, "output_norm", path);
    test_hybrid(path);
    return nf_test_report();
}
