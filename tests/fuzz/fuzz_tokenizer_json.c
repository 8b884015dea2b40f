/* libFuzzer target for the Hugging Face tokenizer readers (src/tokenizer/hf_json.c): the input is
 * tokenizer.json, optionally followed by a NUL byte and tokenizer_config.json (special tokens,
 * add_bos_token, the chat_template field). It must either load, and then the tokenizer it built
 * encodes and decodes a fixed text and the chat template it carries is recognised and rendered,
 * or fail with a message naming the input. Built by `make fuzz FUZZ_TARGET=tokenizer_json`;
 * test_fuzz_regress_tokenizer_json feeds the seeds (tests/fuzz/seeds/tokenizer_json, made by
 * make_tok_seeds.py) and tests/fixtures/tokenizer/regress/ through this same function. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

static volatile uint64_t sink;

/* Every token's bytes, and the specials the config named, must be inside the tokenizer. */
static void walk_vocab(const nf_tokenizer *t)
{
    uint32_t n = nf_tok_vocab_size(t);
    for (uint32_t id = 0; id < n; id++) {
        size_t len;
        const uint8_t *b = nf_tok_token_bytes(t, (int32_t)id, &len);
        if (!b) abort();
        if (len) sink += b[len - 1];
        sink += (uint64_t)nf_tok_token_type(t, (int32_t)id);
    }
    int32_t bos = nf_tok_bos(t), eos = nf_tok_eos(t);
    if (bos >= (int32_t)n || eos >= (int32_t)n || nf_tok_token_bytes(t, (int32_t)n, &(size_t){0}) != NULL) abort();
    sink += (uint64_t)nf_tok_find(t, "<|im_start|>") + (uint64_t)nf_tok_find(t, "");
}

/* A short text through encode and decode: whatever the reader built must be usable. */
static void round_trip(const nf_tokenizer *t)
{
    static const char text[] = "Hello, world! 123 <|im_start|>user\n\xc3\xa9t\xc3\xa9  x\t<|endoftext|>";
    char *copy = malloc(sizeof text - 1); /* exact size, no NUL: ASan sees a read past the text */
    if (!copy) return;
    memcpy(copy, text, sizeof text - 1);
    for (unsigned flags = 0; flags <= NF_TOK_ADD_SPECIAL; flags++) {
        nf_tok_ids ids = {0};
        nf_error e = {0};
        char *out = NULL;
        size_t len = 0;
        if (nf_tok_encode(t, copy, sizeof text - 1, flags, &ids, &e) == NF_OK &&
            nf_tok_decode(t, ids.ids, ids.n, 0, &out, &len, &e) == NF_OK)
            sink += len;
        else if (e.msg[0] == 0)
            abort();
        free(out);
        nf_tok_ids_free(&ids);
    }
    free(copy);
}

static void render_chat(const nf_tokenizer *t)
{
    static const nf_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hi"},
                                       {"assistant", "<think>\nhm\n</think>\n\nHello"}, {"user", "Again"}};
    nf_chat_template ct;
    nf_error e = {0};
    if (nf_chat_detect(nf_tok_chat_template(t), &ct, &e) != NF_OK) {
        if (e.msg[0] == 0) abort();
        return;
    }
    for (int think = -1; think <= 1; think++) {
        char *out = NULL;
        size_t len = 0;
        if (nf_chat_render(&ct, msgs, 4, think != 0, think, &out, &len, &e) == NF_OK) sink += len + (uint8_t)out[len];
        else if (e.msg[0] == 0) abort();
        free(out);
    }
    nf_chat_template_free(&ct);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nf_log_set_level(NF_LOG_OFF); /* unknown chat templates warn; the fuzzer needs a quiet stderr */
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    const char *cfg = nul ? (const char *)nul + 1 : NULL;
    size_t cfg_len = nul ? size - json_len - 1 : 0;
    nf_tokenizer *t = NULL;
    nf_error e = {0};
    if (nf_tok_load_hf_text((const char *)data, json_len, cfg, cfg_len, "fuzz/tokenizer.json", &t, &e) == NF_OK) {
        walk_vocab(t);
        round_trip(t);
        render_chat(t);
        nf_tok_free(t);
    } else if (t != NULL || !strstr(e.msg, "fuzz/tokenizer.json")) {
        abort(); /* an error must name the input, and leave nothing open */
    }
    return 0;
}
