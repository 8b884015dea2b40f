/* The server's pure parts (its stop strings are the scheduler's: tests/engine/test_stopstream.c): the
 * <think> split over every way of cutting a reply into pieces, the constant-time key compare,
 * lossy UTF-8, and request parsing's statuses (each with an independent expectation written out). */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_test.h"
#include "serve/api.h"
#include "serve/server.h"

/* Every cut of a reply into three pieces gives the same reasoning and content. */
static void think_cuts(const char *reply, const char *want_r, const char *want_c)
{
    size_t n = strlen(reply);
    for (size_t a = 0; a <= n; a++)
        for (size_t b = a; b <= n; b++) {
            nf_think_split t = {0};
            char *r = NULL, *c = NULL;
            size_t rn = 0, cn = 0;
            CHECK(nf_think_feed(&t, reply, a, 0, &r, &rn, &c, &cn) == 0);
            CHECK(nf_think_feed(&t, reply + a, b - a, 0, &r, &rn, &c, &cn) == 0);
            CHECK(nf_think_feed(&t, reply + b, n - b, 1, &r, &rn, &c, &cn) == 0);
            CHECK_MSG(strcmp(r, want_r) == 0 && strcmp(c, want_c) == 0, "'%s' cut %zu/%zu: reasoning '%s' content '%s'",
                      reply, a, b, r, c);
            free(r), free(c);
        }
}

static void think(void)
{
    think_cuts("<think>\nplan it\n</think>\n\nThe answer.", "\nplan it\n", "The answer.");
    think_cuts("<think></think>Hi", "", "Hi");
    think_cuts("No thinking <think>here</think>", "", "No thinking <think>here</think>");
    think_cuts("<thin", "", "<thin");
    think_cuts("<think>unfinished </thi", "unfinished </thi", "");
    think_cuts("\xC3\xA9<think>x</think>", "", "\xC3\xA9<think>x</think>");
}

static void keys(void)
{
    CHECK(nf_serve_key_equal("secret", 6, "secret", 6));
    CHECK(!nf_serve_key_equal("secret", 6, "secreT", 6));
    CHECK(!nf_serve_key_equal("secret", 6, "secret2", 7));
    CHECK(!nf_serve_key_equal("", 0, "x", 1));
    char *s = nf_api_lossy_utf8("a\xFF\xC3\xA9\xC3", 5);
    CHECK(s && strcmp(s, "a\xEF\xBF\xBD\xC3\xA9\xEF\xBF\xBD") == 0);
    free(s);
    s = nf_api_lossy_utf8("a\0b", 3); /* NUL would end the JSON string */
    CHECK(s && strcmp(s, "a\xEF\xBF\xBD" "b") == 0);
    free(s);
}

/* Status and param of a request body (the model is a byte tokenizer-free stub: only bodies that
 * fail before tokenizing are used, plus token-id prompts). */
static void expect(nf_api_kind k, const char *body, int status, const char *param)
{
    nf_api_model m = {.id = "tiny", .ctx = 64, .vocab = 100};
    nf_api_call c;
    nf_api_error e = {0};
    int rc = nf_api_parse(&m, k, body, strlen(body), 1, &c, &e);
    if (status == 200) {
        CHECK_MSG(rc == 0, "%s: %d %s", body, e.status, e.msg);
        if (!rc) nf_api_call_free(&c);
        return;
    }
    CHECK_MSG(rc == -1 && e.status == status, "%s: got %d (%s), want %d", body, rc ? e.status : 200, e.msg, status);
    if (param) CHECK_MSG(e.param && strcmp(e.param, param) == 0, "%s: param %s, want %s", body, e.param, param);
    char *j = nf_api_error_json(&e);
    CHECK(j && strstr(j, "\"error\"") && strstr(j, "\"message\""));
    free(j);
}

static void parsing(void)
{
    const nf_api_kind C = NF_API_COMPLETION;
    expect(C, "{\"prompt\":[1,2,3],\"max_tokens\":4}", 200, NULL);
    expect(C, "{\"prompt\":[1,2,3]", 400, NULL);
    expect(C, "[1]", 400, NULL);
    expect(C, "{\"prompt\":[1,2,100]}", 400, "prompt");
    expect(C, "{\"prompt\":[1.5]}", 400, "prompt");
    expect(C, "{\"prompt\":[]}", 400, "prompt");
    expect(C, "{\"prompt\":[1],\"max_tokens\":64}", 400, "max_tokens");
    expect(C, "{\"prompt\":[1],\"max_tokens\":63}", 200, NULL);
    expect(C, "{\"prompt\":[1],\"max_tokens\":1e300}", 400, "max_tokens");
    expect(C, "{\"prompt\":[1],\"max_tokens\":\"4\"}", 400, "max_tokens");
    expect(C, "{\"prompt\":[1],\"temperature\":3}", 400, "temperature");
    expect(C, "{\"prompt\":[1],\"seed\":1e20}", 400, "seed");
    expect(C, "{\"prompt\":[1],\"n\":2}", 400, "n");
    expect(C, "{\"prompt\":[1],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop");
    expect(C, "{\"prompt\":[1],\"stop\":7}", 400, "stop");
    expect(C, "{\"prompt\":[1],\"model\":\"other\"}", 404, "model");
    expect(C, "{\"prompt\":[1],\"model\":\"tiny\",\"logprobs\":5}", 200, NULL);
    expect(C, "{\"prompt\":[1],\"logprobs\":6}", 400, "logprobs");
    expect(C, "{\"prompt\":[1],\"stream_options\":{\"include_usage\":true}}", 400, "stream_options");
    expect(C, "{\"prompt\":[1],\"prompt\":\"\xFF\"}", 400, NULL);
    expect(NF_API_CHAT, "{\"messages\":[]}", 400, "messages");
    expect(NF_API_CHAT, "{\"messages\":[{\"role\":\"pirate\",\"content\":\"x\"}]}", 400, "messages");
    expect(NF_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400, "messages");
    expect(NF_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400, "top_logprobs");
    expect(NF_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":21,\"logprobs\":true}", 400,
           "top_logprobs");
}

/* chat_template_kwargs.enable_thinking reaches Qwen3's template: false adds the empty think block
 * to the generation prompt (the text Qwen3's Jinja template renders, written out here). */
static void thinking_kwarg(void)
{
    nf_tokenizer *tok = NULL;
    nf_chat_template ct = {0};
    nf_error err;
    const char *dir = NF_TEST_DATA "/fixtures/tokenizer/qwen3";
    char tj[512], tc[512];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    CHECK_MSG(nf_tok_load_hf(tj, tc, &tok, &err) == NF_OK, "%s", err.msg);
    if (!tok) return;
    CHECK(nf_chat_detect(nf_tok_chat_template(tok), &ct, &err) == NF_OK && ct.kind == NF_CHAT_QWEN3);
    nf_api_model m = {.id = "q", .tok = tok, .ct = &ct, .ctx = 4096, .vocab = nf_tok_vocab_size(tok)};
    static const char *const want[] = {
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    };
    static const char *const body[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":false}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":true}}",
    };
    for (int i = 0; i < 2; i++) {
        nf_api_call c;
        nf_api_error e;
        nf_tok_ids ids = {0};
        CHECK(nf_tok_encode(tok, want[i], strlen(want[i]), NF_TOK_PARSE_SPECIAL, &ids, &err) == NF_OK);
        int rc = nf_api_parse(&m, NF_API_CHAT, body[i], strlen(body[i]), 1, &c, &e);
        CHECK_MSG(rc == 0, "%s", e.msg);
        if (!rc) {
            CHECK_MSG(c.req.n_prompt == ids.n && memcmp(c.req.prompt, ids.ids, ids.n * sizeof *ids.ids) == 0,
                      "enable_thinking %d: %zu ids, want %zu", i == 1, c.req.n_prompt, ids.n);
            CHECK(c.think_split);
            nf_api_call_free(&c);
        }
        nf_tok_ids_free(&ids);
    }
    nf_chat_template_free(&ct);
    nf_tok_free(tok);
}

/* Events through nf_api_resp_event: a reply "<think>ab</think>\n\ncd" cut into pieces, streamed
 * and not. The stream's chunks (parsed back with cJSON) must be: the role chunk, deltas whose
 * reasoning_content joins to "ab" and content to "cd", one finish chunk, the usage chunk with
 * choices [], then [DONE]; the whole response must carry the same split and usage. */
static void responses(int stream)
{
    static const char *const pieces[] = {"<thi", "nk>a", "b</th", "ink>\n", "\nc", "d"};
    nf_serve_req req = {.max_tokens = 8};
    nf_serve_job *j;
    nf_error err;
    CHECK(nf_serve_job_create(&req, &j, &err) == NF_OK);
    j->prompt_tokens = 5;
    j->completion_tokens = 6;
    nf_api_model m = {.id = "tiny", .ctx = 64, .vocab = 100};
    nf_api_call call = {.kind = NF_API_CHAT, .stream = stream, .include_usage = stream, .think_split = 1};
    nf_api_resp r;
    nf_api_resp_init(&r, &call, &m, 7);
    char *all = NULL;
    size_t n_all = 0;
    for (int i = 0; i <= 6; i++) {
        nf_serve_event ev = {.kind = i < 6 ? NF_EV_TOKEN : NF_EV_END, .text = (char *)(i < 6 ? pieces[i] : ""),
                             .len = i < 6 ? strlen(pieces[i]) : 0, .finish = NF_FINISH_LENGTH};
        char *out;
        size_t n;
        CHECK(nf_api_resp_event(&r, &ev, j, i == 0, &out, &n) == 0);
        if (out) {
            all = realloc(all, n_all + n + 1);
            memcpy(all + n_all, out, n);
            n_all += n;
            all[n_all] = 0;
        }
        free(out);
    }
    char reasoning[64] = "", content[64] = "";
    int finishes = 0, roles = 0, usage_last = 0, done = 0;
    if (!stream) {
        cJSON *o = cJSON_Parse(all), *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
        CHECK(o && msg);
        CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(msg, "reasoning_content")), "ab") == 0);
        CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content")), "cd") == 0);
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "total_tokens")->valuedouble == 11);
        cJSON_Delete(o);
    }
    for (char *line = all; stream && line && *line;) {
        char *end = strstr(line, "\n\n");
        CHECK(end && strncmp(line, "data: ", 6) == 0);
        if (!end) break;
        *end = 0;
        CHECK(!done); /* nothing after [DONE] */
        if (strcmp(line, "data: [DONE]") == 0) done = 1;
        cJSON *o = done ? NULL : cJSON_Parse(line + 6);
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), *d = cJSON_GetObjectItem(ch, "delta");
        const char *rc = cJSON_GetStringValue(cJSON_GetObjectItem(d, "reasoning_content")),
                   *cc = cJSON_GetStringValue(cJSON_GetObjectItem(d, "content"));
        if (rc) strncat(reasoning, rc, sizeof reasoning - strlen(reasoning) - 1);
        if (cc) strncat(content, cc, sizeof content - strlen(content) - 1);
        roles += cJSON_GetObjectItem(d, "role") != NULL;
        finishes += cJSON_IsString(cJSON_GetObjectItem(ch, "finish_reason"));
        if (o) usage_last = cJSON_IsObject(cJSON_GetObjectItem(o, "usage")) && !ch; /* the last object chunk */
        cJSON_Delete(o);
        line = end + 2;
    }
    if (stream) {
        CHECK_MSG(strcmp(reasoning, "ab") == 0 && strcmp(content, "cd") == 0, "reasoning '%s' content '%s'", reasoning, content);
        CHECK(roles == 1 && finishes == 1 && usage_last && done);
    }
    free(all);
    nf_api_resp_free(&r);
    nf_serve_job_release(j);
}

int main(void)
{
    responses(1);
    responses(0);
    thinking_kwarg();
    think();
    keys();
    parsing();
    return nf_test_report();
}
