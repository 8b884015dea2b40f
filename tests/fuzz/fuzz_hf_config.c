/* libFuzzer target for the config.json reader (src/convert/hf_config.c): any byte string must
 * either parse into a config the converter can use (known architecture, sizes non-zero, head
 * geometry consistent, MoE fields for the MoE architectures, mlp_only_layers inside the model) or
 * fail with a message naming the input. Seeds cover every architecture it knows (qwen3_moe,
 * qwen2_moe, llama) in both dialects. Built by `make fuzz FUZZ_TARGET=hf_config`;
 * test_fuzz_regress_hf_config feeds the seeds and tests/fixtures/sources/regress/hf_config/ through
 * this same function. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convert/hf_config.h"

static volatile uint64_t sink;

/* What the reader promises (hf_config.h) and the converter relies on when it sizes tensors. */
static void check(const nf_hf_config *c)
{
    if ((unsigned)c->arch >= NF_HF_ARCH_COUNT || strcmp(nf_hf_arch_name(c->arch), "?") == 0) abort();
    if (!c->hidden_size || !c->n_layers || !c->n_heads || !c->n_kv_heads || !c->head_dim || !c->vocab_size) abort();
    if (c->n_heads % c->n_kv_heads || !(c->rms_eps > 0) || !(c->rope.theta > 0)) abort();
    if (memchr(c->rope.type, 0, sizeof c->rope.type) == NULL || memchr(c->dtype, 0, sizeof c->dtype) == NULL) abort();
    if (c->arch != NF_HF_LLAMA && (!c->n_experts || c->n_experts_used > c->n_experts || !c->moe_intermediate_size))
        abort();
    if (c->arch == NF_HF_QWEN2_MOE && !c->shared_intermediate_size) abort();
    for (size_t i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only_layers[i] >= c->n_layers) abort();
    /* the converter asks this for every layer; a few suffice to run it on whatever was parsed */
    for (uint32_t i = 0; i < c->n_layers && i < 64; i++) sink += (uint64_t)nf_hf_config_layer_is_moe(c, i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nf_hf_config c;
    nf_error e = {0};
    if (nf_hf_config_parse((const char *)data, size, "fuzz/config.json", &c, &e) == NF_OK) {
        check(&c);
        nf_hf_config_free(&c);
    } else if (c.mlp_only_layers != NULL || !strstr(e.msg, "fuzz/config.json")) {
        abort(); /* an error must name the input, and leave nothing allocated */
    }
    return 0;
}
