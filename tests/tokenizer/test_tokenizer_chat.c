/* Chat templates: the renderer's output equals jinja2's rendering of the real templates (Qwen3's
 * tokenizer_config.json, SmolLM2's GGUF tokenizer.chat_template, plain ChatML) byte for byte, for
 * conversations with system prompts, reasoning blocks, tool turns, with and without the generation
 * prompt and enable_thinking; each template is recognised as its family; an unknown template falls
 * back to ChatML. */
#include <stdio.h>

#include "nf_test.h"
#include "tok_fixture.h"
#include "tokenizer/chat.h"

static void check_cases(const cJSON *fix)
{
    const cJSON *templates = cJSON_GetObjectItem(fix, "templates"), *c;
    int n = 0, bad = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fix, "cases"))
    {
        const char *name = cJSON_GetObjectItem(c, "template")->valuestring;
        nf_chat_template ct;
        nf_error e;
        CHECK(nf_chat_detect(cJSON_GetObjectItem(templates, name)->valuestring, &ct, &e) == NF_OK);
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages"), *m;
        nf_chat_msg mv[16];
        size_t k = 0;
        cJSON_ArrayForEach(m, msgs)
        {
            mv[k].role = cJSON_GetObjectItem(m, "role")->valuestring;
            mv[k].content = cJSON_GetObjectItem(m, "content")->valuestring;
            k++;
        }
        const cJSON *think = cJSON_GetObjectItem(c, "enable_thinking");
        int et = cJSON_IsNull(think) ? -1 : cJSON_IsTrue(think);
        char *out;
        size_t len, wlen;
        char *want = fix_unhex(cJSON_GetObjectItem(c, "hex")->valuestring, &wlen);
        CHECK(nf_chat_render(&ct, mv, k, cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")), et, &out, &len,
                             &e) == NF_OK);
        if (len != wlen || memcmp(out, want, wlen) != 0) {
            if (bad++ < 3) fprintf(stderr, "chat case %d (%s) differs:\n--- got\n%s\n--- jinja2\n%s\n---\n", n, name, out, want);
        }
        free(out);
        free(want);
        nf_chat_template_free(&ct);
        n++;
    }
    CHECK_MSG(bad == 0, "%d of %d chat renderings differ from jinja2", bad, n);
    CHECK(n >= 40);
}

static void check_detection(const cJSON *fix)
{
    const cJSON *templates = cJSON_GetObjectItem(fix, "templates");
    nf_chat_template ct;
    nf_error e;
    CHECK(nf_chat_detect(cJSON_GetObjectItem(templates, "qwen3")->valuestring, &ct, &e) == NF_OK);
    CHECK_EQ_INT(ct.kind, NF_CHAT_QWEN3);
    nf_chat_template_free(&ct);
    CHECK(nf_chat_detect(cJSON_GetObjectItem(templates, "smollm2")->valuestring, &ct, &e) == NF_OK);
    CHECK_EQ_INT(ct.kind, NF_CHAT_CHATML_SYSTEM);
    CHECK(ct.default_system && strcmp(ct.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face") == 0);
    nf_chat_template_free(&ct);
    CHECK(nf_chat_detect(cJSON_GetObjectItem(templates, "chatml")->valuestring, &ct, &e) == NF_OK);
    CHECK_EQ_INT(ct.kind, NF_CHAT_CHATML);
    nf_chat_template_free(&ct);
    // A Jinja-escaped default system prompt (Qwen2-style text) is recognised and unescaped.
    CHECK(nf_chat_detect("{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a "
                         "helpful assistant.<|im_end|>\\n' }}{% endif %}<|im_start|>",
                         &ct, &e) == NF_OK);
    CHECK_EQ_INT(ct.kind, NF_CHAT_CHATML_SYSTEM);
    CHECK(ct.default_system && strcmp(ct.default_system, "You are a helpful assistant.") == 0);
    nf_chat_template_free(&ct);
    // Unknown (llama-3 style) and missing templates fall back to ChatML.
    CHECK(nf_chat_detect("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}", &ct, &e) == NF_OK);
    CHECK_EQ_INT(ct.kind, NF_CHAT_CHATML);
    nf_chat_msg m = {"user", "hi"};
    char *out;
    size_t len;
    CHECK(nf_chat_render(&ct, &m, 1, 1, -1, &out, &len, &e) == NF_OK);
    CHECK(strcmp(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") == 0);
    free(out);
    nf_chat_template_free(&ct);
    CHECK(nf_chat_detect(NULL, &ct, &e) == NF_OK);
    CHECK_EQ_INT(ct.kind, NF_CHAT_CHATML);
    nf_chat_msg bad = {"user", NULL};
    CHECK(nf_chat_render(&ct, &bad, 1, 1, -1, &out, &len, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "message 0 has no content");
}

int main(void)
{
    cJSON *fix = fix_json(TOK_FIX "chat_cases.json");
    CHECK(fix != NULL);
    if (!fix) return nf_test_report();
    check_cases(fix);
    check_detection(fix);
    cJSON_Delete(fix);
    return nf_test_report();
}
