/* test_answer.c: src/serve/answer.c: generated text into reasoning, content and tool calls,
 * with stop strings. The parts must not depend on how the text was cut into pieces (a
 * stream and a whole answer agree): every text here is pushed whole, byte by byte, and in
 * pieces of 2..13 bytes, and the parts compared. */
#include "harness.h"
#include "serve/answer.h"
#include "base/util.h"

#include <stdio.h>
#include <string.h>

typedef struct parts {
    char reasoning[4096], content[4096], calls[4096];
    size_t nr, nc, nk;
    int n_calls;
} parts;

static void add(char *dst, size_t *len, const char *s, size_t n) {
    if (*len + n >= 4096) n = 4095 - *len;
    memcpy(dst + *len, s, n);
    *len += n;
    dst[*len] = 0;
}

static void sink(void *cls, answer_part part, const char *s, size_t n, cJSON *call) {
    parts *p = cls;
    if (part == ANSWER_CALL) {
        char *j = cJSON_PrintUnformatted(call);
        add(p->calls, &p->nk, j, strlen(j));
        add(p->calls, &p->nk, ";", 1);
        free(j);
        cJSON_Delete(call);
        p->n_calls++;
        return;
    }
    if (part == ANSWER_REASONING) add(p->reasoning, &p->nr, s, n);
    else add(p->content, &p->nc, s, n);
}

/* text pushed in pieces of `piece` bytes (0: whole); returns the stop word found or NULL */
static const char *run(const answer_opts *o, const char *text, size_t piece, parts *p) {
    memset(p, 0, sizeof *p);
    answer a;
    answer_init(&a, o, sink, p);
    const size_t n = strlen(text);
    if (!piece) piece = n ? n : 1;
    size_t i = 0;
    bool stopped = false;
    while (i < n && !stopped) {
        size_t k = n - i < piece ? n - i : piece;
        stopped = answer_push(&a, text + i, k, false);
        i += k;
    }
    if (!stopped) answer_push(&a, "", 0, true);
    const char *w = a.stop_word;
    answer_free(&a);
    return w;
}

/* the parts of text, the same for every cut */
static void expect(const answer_opts *o, const char *text, const char *reasoning, const char *content, const char *calls) {
    parts whole;
    run(o, text, 0, &whole);
    CHECK_MSG(!strcmp(whole.reasoning, reasoning), "%s: reasoning '%s', want '%s'", text, whole.reasoning, reasoning);
    CHECK_MSG(!strcmp(whole.content, content), "%s: content '%s', want '%s'", text, whole.content, content);
    CHECK_MSG(!strcmp(whole.calls, calls), "%s: calls '%s', want '%s'", text, whole.calls, calls);
    for (size_t piece = 1; piece <= 13; piece++) {
        parts p;
        run(o, text, piece, &p);
        CHECK_MSG(!strcmp(p.reasoning, whole.reasoning) && !strcmp(p.content, whole.content) &&
                      !strcmp(p.calls, whole.calls),
                  "%s in pieces of %zu: '%s' '%s' '%s'", text, piece, p.reasoning, p.content, p.calls);
    }
}

static cJSON *tools(void) {
    return cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                       "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                       "\"zip\":{\"type\":\"string\"}}}}}]");
}

TEST(thinking_split) {
    answer_opts o = {.split_think = true};
    expect(&o, "<think>\nweighing it</think>\n\nThe answer.", "\nweighing it", "The answer.", "");
    expect(&o, "no thinking here", "", "no thinking here", "");
    expect(&o, "<thin", "", "<thin", ""); /* a prefix of <think> that never became one */
    o.think_open = true;                  /* the prompt ended in <think> */
    expect(&o, "inside</think>out", "inside", "out", "");
    expect(&o, "cut off before the end </thi", "cut off before the end </thi", "", "");
    o = (answer_opts){.split_think = false};
    expect(&o, "<think>x</think>y", "", "<think>x</think>y", "");
}

TEST(tool_calls_both_formats) {
    cJSON *t = tools();
    answer_opts o = {.split_think = true, .tools = t};
    expect(&o, "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
           "", "Let me look.\n", "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"};");
    /* Qwen3.5: the integer parsed, the strings kept as text (zip looks like a number) */
    expect(&o,
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n<parameter=days>\n3\n"
           "</parameter>\n<parameter=zip>\n95112\n</parameter>\n</function>\n</tool_call>",
           "", "",
           "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"San Jose\\\",\\\"days\\\":3,\\\"zip\\\":\\\"95112\\\"}\"};");
    /* two calls after thinking */
    expect(&o,
           "<think>plan</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n"
           "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>",
           "plan", "",
           "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"A\\\"}\"};"
           "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"B\\\"}\"};");
    /* neither format, or cut off: the block stays content */
    expect(&o, "<tool_call>not a call</tool_call>", "", "<tool_call>not a call</tool_call>", "");
    expect(&o, "x <tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "",
           "x <tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "");
    /* without tools in the request, a tool call is only text */
    o.tools = NULL;
    expect(&o, "<tool_call>{\"name\": \"f\"}</tool_call>", "", "<tool_call>{\"name\": \"f\"}</tool_call>", "");
    cJSON_Delete(t);
}

TEST(stop_strings) {
    const char *stop[] = {"END", "\n\n"};
    answer_opts o = {.stop = stop, .n_stop = 2};
    parts p;
    const char *w = run(&o, "one two END three", 0, &p);
    CHECK_MSG(!strcmp(p.content, "one two ") && w && !strcmp(w, "END"), "'%s' %s", p.content, w ? w : "(none)");
    for (size_t piece = 1; piece <= 6; piece++) {
        w = run(&o, "a\nb EN still\n\nafter", piece, &p);
        CHECK_MSG(!strcmp(p.content, "a\nb EN still") && w && !strcmp(w, "\n\n"), "pieces of %zu: '%s'", piece, p.content);
    }
    w = run(&o, "no stop at all EN", 1, &p); /* a held-back prefix comes out at the end */
    CHECK_MSG(!strcmp(p.content, "no stop at all EN") && !w, "'%s'", p.content);
    /* a stop string inside the thinking ends the answer there too */
    answer_opts ot = {.split_think = true, .stop = stop, .n_stop = 1};
    w = run(&ot, "<think>abc END def</think>x", 3, &p);
    CHECK_MSG(!strcmp(p.reasoning, "abc ") && !p.content[0] && w, "'%s' '%s'", p.reasoning, p.content);
}

/* random bytes built from the tags' pieces: no crash, and the same parts for every cut */
TEST(fuzz_cuts) {
    static const char *frag[] = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<function=get_weather>",
                                 "<parameter=city>", "</parameter>", "</function>", "{\"name\": \"get_weather\"}",
                                 "<", ">", "</", "\n", "x", "END", "{", "}", "\xe2\x82", "\xac"};
    const char *stop[] = {"END"};
    cJSON *t = tools();
    uint64_t st = 12345;
    for (int iter = 0; iter < 400; iter++) {
        char text[512] = {0};
        size_t len = 0;
        int nf = 1 + (int)(rng_at(st, (uint64_t)iter * 64) % 24);
        for (int k = 0; k < nf; k++) {
            const char *f = frag[rng_at(st, (uint64_t)iter * 64 + 1 + (uint64_t)k) % (sizeof frag / sizeof frag[0])];
            if (len + strlen(f) < sizeof text - 1) { memcpy(text + len, f, strlen(f)); len += strlen(f); }
        }
        answer_opts o = {.split_think = iter % 2 == 0, .think_open = iter % 3 == 0, .tools = iter % 4 < 2 ? t : NULL,
                         .stop = stop, .n_stop = iter % 5 == 0};
        parts whole, p;
        run(&o, text, 0, &whole);
        for (size_t piece = 1; piece <= 7; piece++) {
            run(&o, text, piece, &p);
            if (strcmp(p.reasoning, whole.reasoning) || strcmp(p.content, whole.content) || strcmp(p.calls, whole.calls)) {
                CHECK_MSG(0, "iteration %d, pieces of %zu: '%s' | '%s' | '%s' vs whole '%s' | '%s' | '%s'", iter, piece,
                          p.reasoning, p.content, p.calls, whole.reasoning, whole.content, whole.calls);
                break;
            }
        }
    }
    cJSON_Delete(t);
}

int main(void) {
    RUN(thinking_split);
    RUN(tool_calls_both_formats);
    RUN(stop_strings);
    RUN(fuzz_cuts);
    return harness_done();
}
