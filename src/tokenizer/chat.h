/* Chat templates without a Jinja engine: the checkpoint's template text is recognised as one of a
 * few families whose output is reproduced byte for byte (checked against jinja2 renderings of the
 * real templates in tests/fixtures/tokenizer/chat_cases.json).
 *
 *   NF_CHAT_CHATML         <|im_start|>{role}\n{content}<|im_end|>\n per message, then
 *                          <|im_start|>assistant\n with add_generation_prompt
 *   NF_CHAT_CHATML_SYSTEM  ChatML that first adds a default system message when the conversation
 *                          does not start with one (SmolLM2; Qwen1.5/Qwen2/Qwen2.5's templates)
 *   NF_CHAT_QWEN3          Qwen3's: reasoning in <think>...</think> is dropped from earlier assistant
 *                          turns and kept (or an empty block added) after the last user query;
 *                          tool messages wrapped in <tool_response>; enable_thinking=false adds an
 *                          empty think block to the generation prompt
 * Anything else (or no template) falls back to ChatML with a warning. */
#ifndef NF_TOKENIZER_CHAT_H
#define NF_TOKENIZER_CHAT_H

#include <stddef.h>

#include "base/error.h"

typedef enum nf_chat_kind { NF_CHAT_CHATML = 0, NF_CHAT_CHATML_SYSTEM, NF_CHAT_QWEN3 } nf_chat_kind;

typedef struct nf_chat_template {
    nf_chat_kind kind;
    char *default_system; /* NF_CHAT_CHATML_SYSTEM: the default system message (malloc'd) */
} nf_chat_template;

typedef struct nf_chat_msg {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8, NUL-terminated */
} nf_chat_msg;

/* Recognises a template text (NULL: none). Never fails on an unknown template: that is ChatML and
 * a warning. Fails only for lack of memory. */
nf_status nf_chat_detect(const char *template_text, nf_chat_template *out, nf_error *err);
void nf_chat_template_free(nf_chat_template *ct);
const char *nf_chat_kind_name(nf_chat_kind k);

/* enable_thinking: -1 leaves it undefined (the templates' default), 0 false, 1 true. *out is
 * malloc'd and NUL-terminated. A message without role or content is NF_ERR_INVALID_ARG. */
nf_status nf_chat_render(const nf_chat_template *ct, const nf_chat_msg *msgs, size_t n, int add_generation_prompt,
                         int enable_thinking, char **out, size_t *len, nf_error *err);

#endif
