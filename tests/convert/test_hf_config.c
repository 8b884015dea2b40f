/* config.json parsing in both dialects against what transformers 5 reads from the same files
 * (tests/oracle/source_fixtures.py: configs written by Qwen3MoeConfig/Qwen2MoeConfig/LlamaConfig,
 * and published checkpoints' transformers-4 configs; expected values in manifest.json "configs"),
 * plus hand-made configs for each refusal. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "convert/hf_config.h"
#include "nf_test.h"

#define SRC NF_TEST_DATA "/fixtures/sources"

static cJSON *manifest(void)
{
    FILE *f = fopen(SRC "/manifest.json", "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n);
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    cJSON *m = cJSON_ParseWithLength(b, got);
    free(b);
    return m;
}

static double num(const cJSON *e, const char *k) { return cJSON_GetObjectItemCaseSensitive(e, k)->valuedouble; }
static int truth(const cJSON *e, const char *k) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, k)); }
static const char *str(const cJSON *e, const char *k) { return cJSON_GetObjectItemCaseSensitive(e, k)->valuestring; }

#define CHECK_FIELD(file, got, want)                                                                         \
    CHECK_MSG((double)(got) == (want), "%s: %s = %.17g, transformers says %.17g", file, #got, (double)(got), \
              (double)(want))

static void check_config(const char *file, const cJSON *e)
{
    char path[512];
    snprintf(path, sizeof path, SRC "/configs/%s", file);
    nf_hf_config c;
    nf_error err = {0};
    CHECK_MSG(nf_hf_config_load(path, &c, &err) == NF_OK, "%s: %s", file, err.msg);
    if (err.code) return;
    CHECK_MSG(strcmp(nf_hf_arch_name(c.arch), str(e, "model_type")) == 0, "%s: arch %s", file, nf_hf_arch_name(c.arch));
    CHECK_FIELD(file, c.hidden_size, num(e, "hidden_size"));
    CHECK_FIELD(file, c.n_layers, num(e, "n_layers"));
    CHECK_FIELD(file, c.n_heads, num(e, "n_heads"));
    CHECK_FIELD(file, c.n_kv_heads, num(e, "n_kv_heads"));
    CHECK_FIELD(file, c.head_dim, num(e, "head_dim"));
    CHECK_FIELD(file, c.vocab_size, num(e, "vocab_size"));
    CHECK_FIELD(file, c.intermediate_size, num(e, "intermediate_size"));
    CHECK_FIELD(file, c.max_position, num(e, "max_position"));
    CHECK_FIELD(file, c.rms_eps, num(e, "rms_eps"));
    CHECK_FIELD(file, c.rope.theta, num(e, "rope_theta"));
    CHECK_MSG(strcmp(c.rope.type, str(e, "rope_type")) == 0, "%s: rope type %s", file, c.rope.type);
    CHECK_FIELD(file, c.rope.factor, num(e, "rope_factor"));
    CHECK_FIELD(file, c.rope.original_max_position, num(e, "rope_original_max_position"));
    CHECK_FIELD(file, c.rope.low_freq_factor, num(e, "rope_low_freq_factor"));
    CHECK_FIELD(file, c.rope.high_freq_factor, num(e, "rope_high_freq_factor"));
    CHECK_FIELD(file, c.n_experts, num(e, "n_experts"));
    CHECK_FIELD(file, c.n_experts_used, num(e, "n_experts_used"));
    CHECK_FIELD(file, c.moe_intermediate_size, num(e, "moe_intermediate_size"));
    CHECK_FIELD(file, c.shared_intermediate_size, num(e, "shared_intermediate_size"));
    CHECK_FIELD(file, c.norm_topk_prob, truth(e, "norm_topk_prob"));
    CHECK_FIELD(file, c.decoder_sparse_step, num(e, "decoder_sparse_step"));
    CHECK_FIELD(file, c.tie_word_embeddings, truth(e, "tie_word_embeddings"));
    CHECK_MSG(strcmp(c.dtype, str(e, "dtype")) == 0, "%s: dtype '%s'", file, c.dtype);
    const cJSON *mlp = cJSON_GetObjectItemCaseSensitive(e, "mlp_only_layers");
    CHECK_EQ_INT(c.n_mlp_only, cJSON_GetArraySize(mlp));
    for (size_t i = 0; i < c.n_mlp_only && i < (size_t)cJSON_GetArraySize(mlp); i++)
        CHECK_FIELD(file, c.mlp_only_layers[i], cJSON_GetArrayItem(mlp, (int)i)->valuedouble);
    nf_hf_config_free(&c);
}

/* transformers' sparse-layer rule on tiny_qwen3_moe (4 layers, decoder_sparse_step 2,
 * mlp_only_layers [3]): layer 1 is MoE; 0 and 2 fail the step; 3 is listed as dense. */
static void test_moe_layers(void)
{
    nf_hf_config c;
    nf_error err = {0};
    CHECK_EQ_INT(nf_hf_config_load(SRC "/configs/tiny_qwen3_moe.json", &c, &err), NF_OK);
    CHECK(!nf_hf_config_layer_is_moe(&c, 0) && nf_hf_config_layer_is_moe(&c, 1));
    CHECK(!nf_hf_config_layer_is_moe(&c, 2) && !nf_hf_config_layer_is_moe(&c, 3));
    nf_hf_config_free(&c);
    CHECK_EQ_INT(nf_hf_config_load(SRC "/configs/published_qwen3_moe.json", &c, &err), NF_OK);
    for (uint32_t i = 0; i < c.n_layers; i++) CHECK(nf_hf_config_layer_is_moe(&c, i));
    nf_hf_config_free(&c);
    CHECK_EQ_INT(nf_hf_config_load(SRC "/configs/published_llama_smollm2.json", &c, &err), NF_OK);
    CHECK(!nf_hf_config_layer_is_moe(&c, 0));
    nf_hf_config_free(&c);
}

#define SIZES "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10"
#define BASE "\"hidden_size\": 64, " SIZES ", \"rms_norm_eps\": 1e-6, \"intermediate_size\": 32"
#define MOE0 BASE ", \"num_experts\": 4, \"moe_intermediate_size\": 16"
#define MOE MOE0 ", \"num_experts_per_tok\": 2"

static void refused(const char *json, nf_status code, const char *needle)
{
    nf_hf_config c;
    nf_error err = {0};
    nf_status s = nf_hf_config_parse(json, strlen(json), "config.json", &c, &err);
    CHECK_MSG(s == code, "%s: status %d, expected %d (%s)", json, s, code, err.msg);
    CHECK_CONTAINS(err.msg, "config.json: ");
    CHECK_CONTAINS(err.msg, needle);
    CHECK(c.mlp_only_layers == NULL);
}

static void accepted(const char *json, nf_hf_config *c)
{
    nf_error err = {0};
    CHECK_MSG(nf_hf_config_parse(json, strlen(json), "config.json", c, &err) == NF_OK, "%s: %s", json, err.msg);
}

static void test_refusals(void)
{
    refused("{\"model_type\": \"mixtral\", " MOE "}", NF_ERR_UNSUPPORTED,
            "unsupported architecture 'mixtral' (supported: qwen3_moe, qwen2_moe, llama, qwen3_next, qwen3_5_moe, "
            "qwen3_5_moe_text)");
    refused("{" BASE "}", NF_ERR_FORMAT, "\"model_type\" is missing");
    refused("{\"model_type\": \"llama\", \"hidden_size\": 64}", NF_ERR_FORMAT, "\"num_hidden_layers\" is missing");
    refused("{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}", NF_ERR_FORMAT,
            "num_attention_heads 4 is not a multiple of num_key_value_heads 3");
    refused("{\"model_type\": \"llama\", \"hidden_size\": 66, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
            "\"vocab_size\": 10, \"rms_norm_eps\": 1e-6, \"intermediate_size\": 32}",
            NF_ERR_FORMAT, "no \"head_dim\", and hidden_size 66");
    refused("{\"model_type\": \"llama\", " BASE ", \"hidden_size\": 8}", NF_ERR_FORMAT, "key \"hidden_size\" appears twice");
    refused("{\"model_type\": \"llama\", \"hidden_size\": -1, " SIZES "}", NF_ERR_FORMAT, "\"hidden_size\" is not an integer");
    refused("{\"model_type\": \"llama\", \"hidden_size\": 64, " SIZES ", \"rms_norm_eps\": 0}", NF_ERR_FORMAT,
            "rms_norm_eps = 0");
    refused("{\"model_type\": \"llama\", \"hidden_size\": 64, " SIZES ", \"rms_norm_eps\": 1e-5, "
            "\"intermediate_size\": null}", NF_ERR_FORMAT, "\"intermediate_size\" is missing or 0");
    refused("{\"model_type\": \"llama\", " BASE ", \"rope_theta\": 10000, \"rope_parameters\": {\"rope_theta\": 500000}}",
            NF_ERR_FORMAT, "\"rope_theta\" = 10000 and \"rope_parameters\".rope_theta = 500000 disagree");
    refused("{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"full_attention\": {\"rope_theta\": 1}}}",
            NF_ERR_UNSUPPORTED, "per-layer-type");
    refused("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": 3}", NF_ERR_FORMAT, "\"rope_scaling\" is not an object");
    refused("{\"model_type\": \"qwen3_moe\", " BASE "}", NF_ERR_FORMAT, "\"num_experts\" (or \"num_local_experts\")");
    refused("{\"model_type\": \"qwen3_moe\", " MOE ", \"num_local_experts\": 8}", NF_ERR_FORMAT,
            "\"num_experts\" = 4 and \"num_local_experts\" = 8 disagree");
    refused("{\"model_type\": \"qwen3_moe\", " MOE0 ", \"num_experts_per_tok\": 5}", NF_ERR_FORMAT,
            "num_experts_per_tok 5 exceeds num_experts 4");
    refused("{\"model_type\": \"qwen2_moe\", " MOE "}", NF_ERR_FORMAT, "\"shared_expert_intermediate_size\" is missing");
    refused("{\"model_type\": \"qwen3_moe\", " MOE ", \"mlp_only_layers\": [2]}", NF_ERR_FORMAT,
            "\"mlp_only_layers\"[0] is not a layer index below 2");
    refused("{\"model_type\": \"qwen3_moe\", " MOE ", \"decoder_sparse_step\": 0}", NF_ERR_FORMAT,
            "\"decoder_sparse_step\" is 0");
    refused("{\"model_type\": \"qwen3_moe\", " MOE ", \"norm_topk_prob\": 1}", NF_ERR_FORMAT,
            "\"norm_topk_prob\" is not true or false");
    refused("{\"model_type\": \"llama\", ", NF_ERR_FORMAT, "not valid JSON");
    refused("[]", NF_ERR_FORMAT, "not a JSON object");
    /* defaults and dialect mixes transformers also accepts */
    nf_hf_config c;
    accepted("{\"model_type\": \"llama\", " BASE "}", &c);
    CHECK(c.n_kv_heads == 4 && c.head_dim == 16 && c.rope.theta == 10000.0 && strcmp(c.rope.type, "default") == 0);
    CHECK(c.tie_word_embeddings == 0 && c.dtype[0] == '\0');
    nf_hf_config_free(&c);
    accepted("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4}, "
             "\"torch_dtype\": \"float16\", \"dtype\": \"bfloat16\"}", &c);
    CHECK(strcmp(c.rope.type, "linear") == 0 && c.rope.factor == 4.0 && strcmp(c.dtype, "bfloat16") == 0);
    nf_hf_config_free(&c);
    /* a qwen3_moe whose every layer is sparse needs no intermediate_size */
    accepted("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
             "\"vocab_size\": 10, \"rms_norm_eps\": 1e-6, \"num_experts\": 4, \"num_experts_per_tok\": 2, "
             "\"moe_intermediate_size\": 16}", &c);
    nf_hf_config_free(&c);
    nf_error err = {0};
    CHECK_EQ_INT(nf_hf_config_load("/nonexistent/config.json", &c, &err), NF_ERR_IO);
}

/* Attention biases: Qwen2MoeConfig's "qkv_bias" (default true: transformers 4's Qwen2MoeAttention
 * always had them, and its published configs have no such key); qwen3_moe/llama's "attention_bias"
 * would add an o_proj bias the schema lacks, so true is refused. */
static void test_bias(void)
{
#define Q2 "{\"model_type\": \"qwen2_moe\", " MOE ", \"shared_expert_intermediate_size\": 8"
    nf_hf_config c;
    accepted(Q2 "}", &c);
    CHECK(c.qkv_bias == 1);
    nf_hf_config_free(&c);
    accepted(Q2 ", \"qkv_bias\": false}", &c);
    CHECK(c.qkv_bias == 0);
    nf_hf_config_free(&c);
    accepted(Q2 ", \"qkv_bias\": true, \"attention_bias\": true}", &c); /* not a qwen2_moe key: ignored */
    CHECK(c.qkv_bias == 1);
    nf_hf_config_free(&c);
    refused(Q2 ", \"qkv_bias\": 0}", NF_ERR_FORMAT, "\"qkv_bias\" is not true or false");
    nf_error err = {0};
    CHECK_EQ_INT(nf_hf_config_load(SRC "/configs/published_qwen2_moe.json", &c, &err), NF_OK);
    CHECK(c.qkv_bias == 1);
    nf_hf_config_free(&c);
    CHECK_EQ_INT(nf_hf_config_load(SRC "/configs/tiny_qwen3_moe.json", &c, &err), NF_OK);
    CHECK(c.qkv_bias == 0);
    nf_hf_config_free(&c);
    accepted("{\"model_type\": \"llama\", " BASE ", \"attention_bias\": false, \"qkv_bias\": true}", &c);
    CHECK(c.qkv_bias == 0);
    nf_hf_config_free(&c);
    refused("{\"model_type\": \"llama\", " BASE ", \"attention_bias\": true}", NF_ERR_UNSUPPORTED,
            "\"attention_bias\": true (biases on q/k/v/o_proj) is not supported for llama");
    refused("{\"model_type\": \"qwen3_moe\", " MOE ", \"attention_bias\": true}", NF_ERR_UNSUPPORTED,
            "not supported for qwen3_moe");
    refused("{\"model_type\": \"llama\", " BASE ", \"mlp_bias\": true}", NF_ERR_UNSUPPORTED,
            "\"mlp_bias\": true (biases on gate/up/down_proj) is not supported for llama");
    accepted("{\"model_type\": \"llama\", " BASE ", \"mlp_bias\": false}", &c);
    nf_hf_config_free(&c);
#undef Q2
}

/* The hybrids: layer kinds from layer_types or full_attention_interval, the linear-attention sizes,
 * partial rotary from either place, the multimodal qwen3_5_moe read through its text_config. */
static void test_hybrid(void)
{
#define LIN ", \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, " \
            "\"linear_value_head_dim\": 8, \"shared_expert_intermediate_size\": 8"
#define NEXT "{\"model_type\": \"qwen3_next\", " MOE LIN
    nf_hf_config c;
    accepted(NEXT ", \"full_attention_interval\": 2, \"partial_rotary_factor\": 0.5}", &c);
    CHECK(nf_hf_arch_hybrid(c.arch) && c.n_layers == 2 && c.conv_kernel == 4 && c.partial_rotary == 0.5);
    CHECK(c.linear_layers && c.linear_layers[0] == 1 && c.linear_layers[1] == 0);
    nf_hf_config_free(&c);
    accepted(NEXT "}", &c); /* transformers' default interval 4: both layers linear */
    CHECK(c.linear_layers && c.linear_layers[0] == 1 && c.linear_layers[1] == 1 && c.partial_rotary == 0.25);
    CHECK(c.norm_topk_prob == 1 && c.shared_intermediate_size == 8 && strcmp(c.prefix, "model.") == 0);
    nf_hf_config_free(&c);
    accepted(NEXT ", \"layer_types\": [\"full_attention\", \"linear_attention\"], "
             "\"rope_parameters\": {\"rope_theta\": 1e6, \"partial_rotary_factor\": 0.25}}", &c);
    CHECK(c.linear_layers[0] == 0 && c.linear_layers[1] == 1 && c.partial_rotary == 0.25 && c.rope.theta == 1e6);
    nf_hf_config_free(&c);
    refused(NEXT ", \"layer_types\": [\"full_attention\"]}", NF_ERR_FORMAT, "not an array of num_hidden_layers (2)");
    refused(NEXT ", \"layer_types\": [\"full_attention\", \"sliding_attention\"]}", NF_ERR_UNSUPPORTED,
            "\"layer_types\"[1] is 'sliding_attention'");
    refused(NEXT ", \"linear_num_value_heads\": 3}", NF_ERR_FORMAT, "key \"linear_num_value_heads\" appears twice");
    refused(NEXT ", \"partial_rotary_factor\": 0.5, \"rope_parameters\": {\"partial_rotary_factor\": 0.25}}",
            NF_ERR_FORMAT, "disagree");
    refused(NEXT ", \"partial_rotary_factor\": 0.01}", NF_ERR_FORMAT, "not an even number of dimensions");
    refused("{\"model_type\": \"qwen3_next\", " MOE "}", NF_ERR_FORMAT, "\"shared_expert_intermediate_size\" is missing");
    /* the multimodal layout: the text model's config inside, its top-level tie and dtype */
    accepted("{\"model_type\": \"qwen3_5_moe\", \"tie_word_embeddings\": true, \"dtype\": \"bfloat16\", "
             "\"text_config\": {\"model_type\": \"qwen3_5_moe_text\", \"norm_topk_prob\": false, " MOE LIN "}}", &c);
    CHECK(c.arch == NF_HF_QWEN3_5_MOE_TEXT && strcmp(c.prefix, "model.language_model.") == 0);
    CHECK(c.tie_word_embeddings == 1 && strcmp(c.dtype, "bfloat16") == 0 && c.norm_topk_prob == 1);
    nf_hf_config_free(&c);
    refused("{\"model_type\": \"qwen3_5_moe\", " MOE "}", NF_ERR_FORMAT, "without a \"text_config\" object");
    refused("{\"model_type\": \"qwen3_5_moe\", \"text_config\": {\"model_type\": \"qwen3_moe\"}}", NF_ERR_UNSUPPORTED,
            "expected qwen3_5_moe_text");
#undef NEXT
#undef LIN
}

int main(void)
{
    cJSON *m = manifest();
    const cJSON *configs = m ? cJSON_GetObjectItemCaseSensitive(m, "configs") : NULL;
    CHECK(configs != NULL && cJSON_GetArraySize(configs) >= 7);
    for (const cJSON *e = configs ? configs->child : NULL; e; e = e->next) check_config(e->string, e);
    test_moe_layers();
    test_refusals();
    test_bias();
    test_hybrid();
    cJSON_Delete(m);
    return nf_test_report();
}
