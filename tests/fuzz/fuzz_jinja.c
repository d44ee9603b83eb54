/* fuzz_jinja.c: libFuzzer target for the chat template interpreter: the input is a
 * template, a NUL byte, then a chat request as JSON (chat_input_parse: {"messages", "tools",
 * "add_generation_prompt", ...}; none after the template: a fixed two-message chat). The
 * template is parsed, rendered under small limits (an error is fine, a crash or a limit
 * overrun is not), and when it renders, its message starts are found with the Qwen3.5
 * vocabulary, as the server does: ascending and inside the prompt. Seeds:
 * tests/fuzz/corpus/jinja (the fixture templates with the fixture chats). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "text/chat.h"

static tokenizer *tok;
static const char default_chat[] = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                                   "{\"role\": \"user\", \"content\": \"Hi <think>\"}], \"add_generation_prompt\": true}";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    tok = fuzz_vocab("ggml-vocab-qwen35.gguf");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *rest;
    size_t rest_len;
    char *src = fuzz_cut(data, size, &rest, &rest_len);
    herr e;
    chat_template *t = chat_template_parse(src, strlen(src), &e);
    if (!t) {
        free(src);
        return 0;
    }
    chat_input in;
    cJSON *root;
    int rc = rest ? chat_input_parse((const char *)rest, rest_len, &in, &root, &e)
                  : chat_input_parse(default_chat, strlen(default_chat), &in, &root, &e);
    if (rc == 0) {
        /* small limits: a fuzzed loop must end fast, and each limit must hold */
        in.limits = (jinja_limits){.max_output = 1 << 16, .max_memory = 32 << 20, .max_depth = 16, .max_steps = 100000};
        in.now = 1700000000;
        char *out;
        size_t len;
        if (chat_render(t, &in, &out, &len, &e) == 0) {
            FUZZ_CHECK(len <= in.limits.max_output && strlen(out) <= len, "output of %zu bytes", len);
            if (len <= 4096) {
                int64_t n_ids;
                int32_t *ids = tokenizer_encode_alloc(tok, out, len, true, &n_ids);
                int64_t *starts = malloc(sizeof(int64_t) * (size_t)(n_ids + 1));
                int64_t ns = chat_message_starts(t, &in, tok, out, len, ids, n_ids, starts, n_ids + 1, &e);
                for (int64_t i = 0; i < ns; i++) {
                    FUZZ_CHECK(starts[i] >= 0 && starts[i] <= n_ids, "start %lld of %lld ids", (long long)starts[i],
                               (long long)n_ids);
                    FUZZ_CHECK(i == 0 || starts[i] > starts[i - 1], "starts not ascending at %lld", (long long)i);
                }
                free(starts);
                free(ids);
            }
            free(out);
        }
        cJSON_Delete(root);
    }
    chat_template_free(t);
    free(src);
    return 0;
}
