/* fuzz_request.c: libFuzzer target for the server's request layer (src/serve/request.c):
 * what every endpoint does with a body before the scheduler sees it, with the Qwen3.5
 * vocabulary and chat template and no engine. The first byte picks the endpoint (chat,
 * /completion, /v1/completions, /v1/messages, count_tokens, /tokenize, /detokenize,
 * /apply-template, /slots save, /v1/responses), the rest is the body. Properties: bad input is refused
 * with a message (never a crash); what is accepted is in range: lengths within the context,
 * ids in the vocabulary, message starts ascending inside the prompt, stop strings bounded.
 * Seeds: tests/fuzz/corpus/request. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "serve/request.h"
#include "serve/responses.h"
#include "serve/sched.h"

static req_ctx rx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    tokenizer *t = fuzz_vocab("ggml-vocab-qwen35.gguf");
    char path[1024], *src;
    size_t len;
    herr e;
    snprintf(path, sizeof path, "%s/tests/fixtures/templates/Qwen3.5-4B.jinja", FUZZ_ROOT);
    chat_template *tm = NULL;
    if (read_file(path, &src, &len, &e) < 0 || !(tm = chat_template_parse(src, len, &e))) {
        fprintf(stderr, "fuzz_request: %s\n", e.msg);
        exit(1);
    }
    free(src);
    rx = (req_ctx){.tok = t, .tmpl = tm, .n_ctx = 4096, .n_predict = -1, .bos_text = NULL, .eos_text = "<|im_end|>",
                   .memo = req_memo_new()};
    return 0;
}

static void check_ids(const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(rx.tok), "id %d at %lld", ids[i], (long long)i);
}

static void check_params(const gen_params *g) {
    FUZZ_CHECK(g->n_predict >= -1 && g->n_predict <= rx.n_ctx, "n_predict %lld", (long long)g->n_predict);
    FUZZ_CHECK(g->n_stop >= 0 && g->n_stop <= MAX_STOP, "%d stop strings", g->n_stop);
    for (int k = 0; k < g->n_stop; k++) FUZZ_CHECK(g->stop[k][0] && strlen(g->stop[k]) <= STOP_MAX_LEN, "stop %d", k);
    FUZZ_CHECK(g->top_logprobs >= -1 && g->top_logprobs <= SCHED_MAX_TOP, "top_logprobs %d", g->top_logprobs);
    FUZZ_CHECK(g->so.temp >= 0 && g->so.top_p >= 0 && g->so.top_p <= 1 && g->so.min_p >= 0 && g->so.min_p <= 1,
               "sampling out of range");
    FUZZ_CHECK(g->so.repeat_last_n >= 0 && g->so.repeat_last_n <= rx.n_ctx, "repeat_last_n %d", g->so.repeat_last_n);
}

/* a chat request (OpenAI's shape) as chat_generate reads it */
static void chat(const cJSON *q, api_kind kind, bool params) {
    herr e;
    gen_params p = {0};
    char *text = NULL;
    int32_t *ids = NULL;
    int64_t n_ids = 0, *starts = NULL;
    int n_starts = 0;
    if (params && req_params(&rx, q, kind, 1, &p, &e) == 0) check_params(&p);
    if (req_chat_prompt(&rx, q, true, &text, &ids, &n_ids, &starts, &n_starts, &e) == 0) {
        check_ids(ids, n_ids);
        for (int i = 0; i < n_starts; i++) {
            FUZZ_CHECK(starts[i] >= 0 && starts[i] <= n_ids, "start %lld of %lld", (long long)starts[i], (long long)n_ids);
            FUZZ_CHECK(i == 0 || starts[i] > starts[i - 1], "starts not ascending");
        }
    } else {
        FUZZ_CHECK(e.msg[0], "a refusal without a message");
    }
    req_params_free(&p);
    free(text);
    free(ids);
    free(starts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    herr e;
    cJSON *j = req_body((const char *)data + 1, size - 1, &e);
    if (!j) {
        /* not JSON, or a string holding \u0000 (which cJSON would cut), refused by its path */
        FUZZ_CHECK(strstr(e.msg, "JSON") || strstr(e.msg, "\\u0000"), "the refusal says neither JSON nor \\u0000: %s", e.msg);
        return 0;
    }
    int64_t n;
    int32_t *ids = NULL;
    bool pieces;
    switch (data[0] % 10) {
    case 0: chat(j, API_CHAT, true); break;
    case 1:
    case 2: {
        gen_params p;
        const api_kind kind = data[0] % 10 == 1 ? API_COMPLETION : API_OAI_COMPLETION;
        if (req_params(&rx, j, kind, 1, &p, &e) == 0) check_params(&p);
        req_params_free(&p);
        if ((ids = req_prompt_ids(&rx, cJSON_GetObjectItemCaseSensitive(j, "prompt"), &n, &e))) check_ids(ids, n);
        break;
    }
    case 3:
    case 4: {
        cJSON *q = req_messages_to_chat(j, &e);
        if (q) chat(q, API_MESSAGES, data[0] % 10 == 3);
        cJSON_Delete(q);
        break;
    }
    case 5:
        if ((ids = req_tokenize(&rx, j, &n, &pieces, &e))) check_ids(ids, n);
        break;
    case 6:
        if ((ids = req_token_ids(&rx, cJSON_GetObjectItemCaseSensitive(j, "tokens"), "\"tokens\"", &n, &e))) {
            check_ids(ids, n);
            tokdec d;
            tokdec_init(&d, rx.tok);
            char piece[512];
            for (int64_t i = 0; i < n; i++) tokdec_push(&d, ids[i], piece, sizeof piece);
            while (tokdec_flush(&d, piece, sizeof piece) > 0) {}
            tokdec_free(&d);
        }
        break;
    case 7: {
        char *text = NULL;
        req_chat_prompt(&rx, j, true, &text, NULL, NULL, NULL, NULL, &e);
        free(text);
        break;
    }
    case 8: {
        const char *fn = req_slot_file(j);
        if (fn) FUZZ_CHECK(fn[0] != '.' && !strchr(fn, '/') && strlen(fn) < 200, "file name %s", fn);
        break;
    }
    case 9: { /* a Responses request read into a chat request, which must be one chat reads */
        cJSON *q = resp_to_chat(&rx, j, &e);
        if (q) {
            FUZZ_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(q, "messages")) > 0, "no messages");
            chat(q, API_RESPONSES, true);
        } else {
            FUZZ_CHECK(e.msg[0], "a refusal without a message");
        }
        cJSON_Delete(q);
        break;
    }
    }
    free(ids);
    cJSON_Delete(j);
    return 0;
}
