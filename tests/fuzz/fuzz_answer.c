/* fuzz_answer.c: libFuzzer target for the parsers of model output (src/serve/answer.c):
 * thinking blocks, tool calls in both formats, stop strings. Input: a flags byte (bit 0
 * split thinking, bit 1 the prompt left <think> open, bit 2 tools given, bits 3-4 the
 * number of stop strings, bit 5 one call at most: parallel_tool_calls false), a byte seeding the piece sizes, then the stop strings each ended
 * by a NUL byte, then the generated text. Properties (answer.h's contract): the parts are
 * the same whether the text comes whole or in pieces of random sizes, a call's pieces
 * come as START, ARGS..., END, and its arguments joined are one JSON object. Seeds:
 * tests/fuzz/corpus/answer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "serve/answer.h"

static cJSON *tools;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
                        "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}}}},"
                        "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]");
    return 0;
}

/* what the sink saw: a transcript where a part's bytes follow its tag, consecutive pieces
 * of one text part merged; the open call's arguments apart, to parse at its end */
typedef struct seen {
    char *t;
    size_t n, cap;
    int last;
    bool in_call;
    char *args;
    size_t n_args;
    int calls;              /* calls ended */
} seen;

static void put(seen *s, const void *p, size_t n) {
    if (s->n + n > s->cap) {
        s->cap = 2 * (s->n + n) + 256;
        s->t = realloc(s->t, s->cap);
    }
    memcpy(s->t + s->n, p, n);
    s->n += n;
}

static void sink(void *cls, answer_part part, const char *p, size_t n) {
    seen *s = cls;
    const char tag = (char)('A' + part);
    if (part == ANSWER_CALL_START) {
        FUZZ_CHECK(!s->in_call, "a call starts inside a call");
        s->in_call = true;
        s->n_args = 0;
    } else if (part == ANSWER_CALL_ARGS) {
        FUZZ_CHECK(s->in_call, "arguments outside a call");
        s->args = realloc(s->args, s->n_args + n + 1);
        memcpy(s->args + s->n_args, p, n);
        s->n_args += n;
    } else if (part == ANSWER_CALL_END) {
        FUZZ_CHECK(s->in_call, "a call ends that never started");
        s->in_call = false;
        s->calls++;
        s->args = realloc(s->args, s->n_args + 1);
        s->args[s->n_args] = 0;
        cJSON *j = cJSON_ParseWithLength(s->args, s->n_args);
        FUZZ_CHECK(cJSON_IsObject(j), "a call's arguments are not one JSON object: %.300s", s->args);
        cJSON_Delete(j);
    }
    const bool merge = (part == ANSWER_REASONING || part == ANSWER_CONTENT || part == ANSWER_CALL_ARGS) && s->last == (int)part;
    if (!merge) put(s, &tag, 1);
    put(s, p, n);
    if (part == ANSWER_CALL_START) put(s, "\x01", 1); /* the name's end */
    s->last = merge || part == ANSWER_REASONING || part == ANSWER_CONTENT || part == ANSWER_CALL_ARGS ? (int)part : -1;
}

/* pushes text in pieces (sizes from seed; 0: whole) as the server does: nothing after a stop */
static void run(const answer_opts *o, const char *text, size_t len, unsigned seed, seen *s) {
    memset(s, 0, sizeof *s);
    s->last = -1;
    answer a;
    answer_init(&a, o, sink, s);
    bool stopped = false;
    uint64_t r = seed;
    for (size_t i = 0; i < len && !stopped;) {
        size_t k = len - i;
        if (seed) {
            r = rng_mix(r);
            k = 1 + (size_t)(r % 9);
            if (k > len - i) k = len - i;
        }
        stopped = answer_push(&a, text + i, k, false);
        i += k;
    }
    if (!stopped) answer_push(&a, "", 0, true);
    FUZZ_CHECK(!s->in_call, "a call left open at the end");
    answer_free(&a);
    free(s->args);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const unsigned flags = data[0], seed = data[1] | 0x100u;
    const uint8_t *p = data + 2;
    size_t n = size - 2;
    char *stop[3];
    int n_stop = 0;
    for (unsigned k = 0; k < ((flags >> 3) & 3); k++) {
        const uint8_t *rest;
        size_t rest_len;
        char *s = fuzz_cut(p, n, &rest, &rest_len);
        if (!rest) { free(s); break; }
        if (s[0] && strlen(s) <= 256) stop[n_stop++] = s; /* the server drops empty and long ones */
        else free(s);
        p = rest;
        n = rest_len;
    }
    const answer_opts o = {.split_think = flags & 1, .think_open = flags & 2, .tools = (flags & 4) ? tools : NULL,
                           .stop = (const char *const *)stop, .n_stop = n_stop, .one_call = flags & 0x20};
    seen whole, pieces;
    run(&o, (const char *)p, n, 0, &whole);
    run(&o, (const char *)p, n, seed, &pieces);
    FUZZ_CHECK(!(flags & 0x20) || whole.calls <= 1, "one call at most: %d", whole.calls);
    FUZZ_CHECK(whole.n == pieces.n && (!whole.n || !memcmp(whole.t, pieces.t, whole.n)), /* t is NULL when empty */
               "the parts depend on the pieces: whole %zu bytes, pieces %zu bytes", whole.n, pieces.n);
    free(whole.t);
    free(pieces.t);
    for (int k = 0; k < n_stop; k++) free(stop[k]);
    return 0;
}
