/* request.h: an endpoint's body into a checked request, with no engine and no connection:
 * the JSON body, the sampling and length fields, a prompt as text or ids, a chat's messages
 * rendered and tokenized with their message starts, Anthropic's messages as a chat request,
 * /tokenize's and /detokenize's fields, /slots' file name. Every error names the field; a
 * body is never trusted past these functions' checks (tests/fuzz/fuzz_request.c). */
#ifndef HEARTH_SERVE_REQUEST_H
#define HEARTH_SERVE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "engine/sampler.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "base/util.h"

#define MAX_STOP 16         /* stop strings per request (OpenAI allows 4) */
#define STOP_MAX_LEN 256    /* bytes of one stop string */

/* A growing NUL-terminated byte buffer (p is NULL until the first add). */
typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

void buf_add(buf *b, const char *s, size_t n);
void buf_str(buf *b, const char *s);

typedef enum api_kind { API_CHAT, API_COMPLETION, API_OAI_COMPLETION, API_MESSAGES, API_RESPONSES } api_kind;

/* The chat prompts lately tokenized, text and ids, shared by the HTTP threads: a
 * conversation's next turn encodes its new messages only (tokenizer_encode_after). */
typedef struct req_memo req_memo;
req_memo *req_memo_new(void);
void req_memo_free(req_memo *m);

/* What a request's fields are read against: the server's model and flags. */
typedef struct req_ctx {
    const tokenizer *tok;
    const chat_template *tmpl;
    int64_t n_ctx;          /* per slot: the bound of the length fields */
    int64_t n_predict;      /* the length when a request names none (-n) */
    const char *bos_text, *eos_text; /* the template's bos_token and eos_token (NULL: undefined) */
    req_memo *memo;         /* chat prompts lately tokenized (NULL: each encoded whole) */
    const cJSON *template_kwargs; /* --chat-template-kwargs: an object under each request's own
                                   * chat_template_kwargs (which win), or NULL */
    bool has_defaults;      /* so_default's temp, top_k, top_p and min_p are what a request that
                             * sets none samples with (--temp, ...); else llama-server's 0.8, 40, 0.95, 0.05 */
    sampler_opts so_default;
    bool seed_set;          /* --seed: the seed of a request that sets none (else a fresh one each) */
    uint64_t seed;
} req_ctx;

typedef struct gen_params {
    sampler_opts so;
    int64_t n_predict;
    bool ignore_eos, stream, include_usage, return_tokens, cache_prompt;
    int top_logprobs;       /* -1: no log-probabilities */
    double t_max_predict_ms; /* 0: none; else stop after this long once a newline was generated */
    int slot;
    char *stop[MAX_STOP];
    int n_stop;
    struct grammar *grammar; /* sampling constrained to it (req_constraints), or NULL */
    int32_t *bias_id;       /* logit_bias: added to these ids' logits (-inf: never) */
    float *bias;
    int n_bias;
    char *prefill;          /* chat: the assistant prefill the content begins with (req_chat_prefill), or NULL */
    bool one_call;          /* parallel_tool_calls false: at most one tool call (answer_opts) */
} gen_params;

/* The body as a JSON object, or NULL with e saying why (naming the byte where JSON fails). */
cJSON *req_body(const char *body, size_t len, herr *e);

/* The sampling and length fields of every generating endpoint (llama-server's names and
 * OpenAI's); seed is the seed when the request names none. On error g holds nothing to free
 * beyond what req_params_free frees. */
int req_params(const req_ctx *x, const cJSON *j, api_kind kind, uint64_t seed, gen_params *g, herr *e);
void req_params_free(gen_params *g);
/* The fields that constrain sampling (constrain.c, called by req_params): grammar,
 * json_schema, response_format json_object / json_schema, tool_choice forcing a call (a
 * grammar of the template's tool-call form), logit_bias, /completion's n_probs. */
int req_constraints(const req_ctx *x, const cJSON *j, api_kind kind, gen_params *g, herr *e);

/* Token ids of a JSON array (what names the field in errors); NULL with e set. */
int32_t *req_token_ids(const req_ctx *x, const cJSON *arr, const char *what, int64_t *n, herr *e);

/* A prompt as llama-server takes it: a string (special tokens parsed, BOS added where the
 * vocabulary asks) or an array of token ids. NULL with e set. */
int32_t *req_prompt_ids(const req_ctx *x, const cJSON *pr, int64_t *n, herr *e);

/* Renders a chat request's messages (roles checked; "reasoning" passed on as
 * reasoning_content; tool calls' JSON arguments as mappings). With ids not NULL, also the
 * prompt's ids and its message starts (*starts has *n_ids + 1 room). */
/* tool_choice "none" (OpenAI's string, Anthropic's {"type": "none"}): the template gets no
 * tools and the answer is not parsed for calls (req_params refuses every value but "auto"
 * and "none") */
bool req_tool_choice_none(const cJSON *j);
/* gen_prompt: the generation prompt unless the request's add_generation_prompt says otherwise;
 * a last assistant message (with no tool calls) is continued instead (req_chat_prefill),
 * rendered with thinking off (enable_thinking false over the kwargs, as llama-server). */
int req_chat_prompt(const req_ctx *x, const cJSON *j, bool gen_prompt, char **text, int32_t **ids, int64_t *n_ids,
                    int64_t **starts, int *n_starts, herr *e);
/* Assistant prefill, llama-server's: the text of the request's last message when it is an
 * assistant's with no tool calls (malloc'd; its text parts joined), which the prompt
 * continues rather than closes; else NULL. */
char *req_chat_prefill(const cJSON *j);

/* Anthropic's messages request as the chat request req_chat_prompt and req_params take
 * (a new object), or NULL with e set. */
cJSON *req_messages_to_chat(const cJSON *j, herr *e);

/* Claude Code's per-request line "x-anthropic-billing-header: cc_version=...; cch=...;" in
 * the "system" of an Anthropic messages request j (a string, or text blocks): billing
 * metadata for Anthropic's service that changes every request, so a prefix cache would miss
 * from the system prompt's first token. Each line that begins with it is removed with its
 * newline (a block left empty, whole). Returns how many were removed. */
int req_drop_billing_header(cJSON *j);

/* /tokenize: the ids of "content" (BOS first when add_special and the vocabulary asks);
 * *with_pieces from the field of that name. NULL with e set. */
int32_t *req_tokenize(const req_ctx *x, const cJSON *j, int64_t *n, bool *with_pieces, herr *e);

/* /slots save and restore: the "filename", when it is a plain file name (letters, digits,
 * '.', '_', '-', not starting with '.', under 200 bytes); NULL otherwise. */
const char *req_slot_file(const cJSON *j);

#endif
