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
    bool split_char;        /* an argument piece ended inside a UTF-8 character */
    size_t pushed;          /* bytes pushed so far (run) */
    size_t call_at;         /* pushed when the first call started, or 0 */
} parts;

static void add(char *dst, size_t *len, const char *s, size_t n) {
    if (*len + n >= 4096) n = 4095 - *len;
    memcpy(dst + *len, s, n);
    *len += n;
    dst[*len] = 0;
}

/* a call is written NAME(ARGUMENTS); its pieces joined */
static void sink(void *cls, answer_part part, const char *s, size_t n) {
    parts *p = cls;
    switch (part) {
    case ANSWER_REASONING: add(p->reasoning, &p->nr, s, n); break;
    case ANSWER_CONTENT: add(p->content, &p->nc, s, n); break;
    case ANSWER_CALL_START:
        add(p->calls, &p->nk, s, n);
        add(p->calls, &p->nk, "(", 1);
        if (!p->n_calls++) p->call_at = p->pushed;
        break;
    case ANSWER_CALL_ARGS:
        add(p->calls, &p->nk, s, n);
        for (size_t k = 1; k <= 3 && k <= n; k++) { /* the last character's lead byte: is it whole? */
            const unsigned char c = (unsigned char)s[n - k];
            if ((c & 0xc0) == 0x80) continue;
            p->split_char |= (c >= 0xf0 ? 4u : c >= 0xe0 ? 3u : c >= 0xc0 ? 2u : 1u) > k;
            break;
        }
        break;
    case ANSWER_CALL_END: add(p->calls, &p->nk, ");", 2); break;
    }
}

/* the arguments of every call, each a JSON object */
static bool args_parse(const parts *p) {
    const char *c = p->calls;
    while ((c = strchr(c, '('))) {
        const char *e = strstr(c, ");");
        if (!e) return false;
        char *j = xmalloc((size_t)(e - c));
        memcpy(j, c + 1, (size_t)(e - c) - 1);
        j[e - c - 1] = 0;
        cJSON *v = cJSON_Parse(j);
        const bool ok = cJSON_IsObject(v);
        cJSON_Delete(v);
        free(j);
        if (!ok) return false;
        c = e;
    }
    return true;
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
        p->pushed = i + k;
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
    CHECK_MSG(args_parse(&whole), "%s: arguments are no JSON objects: '%s'", text, whole.calls);
    for (size_t piece = 1; piece <= 13; piece++) {
        parts p;
        run(o, text, piece, &p);
        CHECK_MSG(!strcmp(p.reasoning, whole.reasoning) && !strcmp(p.content, whole.content) &&
                      !strcmp(p.calls, whole.calls) && !p.split_char,
                  "%s in pieces of %zu: '%s' '%s' '%s'%s", text, piece, p.reasoning, p.content, p.calls,
                  p.split_char ? " (a piece ends inside a character)" : "");
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
           "", "Let me look.\n", "get_weather({\"city\":\"Paris\"});");
    /* Qwen3.5: the integer parsed, the strings kept as text (zip looks like a number) */
    expect(&o,
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n<parameter=days>\n3\n"
           "</parameter>\n<parameter=zip>\n95112\n</parameter>\n</function>\n</tool_call>",
           "", "", "get_weather({\"city\":\"San Jose\",\"days\":3,\"zip\":\"95112\"});");
    /* a string's inner blanks, quotes, backslashes, control bytes and a 3-byte character kept */
    expect(&o,
           "<tool_call><function=get_weather><parameter=city>  a \t\"b\"\\\x01 \xe2\x82\xac\n\n</parameter></function>"
           "</tool_call>",
           "", "", "get_weather({\"city\":\"a \\t\\\"b\\\"\\\\\\u0001 \xe2\x82\xac\"});");
    /* an unknown tool's parameters are JSON where they parse; no parameters: {} */
    expect(&o, "<tool_call><function=other><parameter=x>[1, 2]</parameter><parameter=y>two words</parameter>"
               "</function></tool_call><tool_call><function=none></function></tool_call>",
           "", "", "other({\"x\":[1,2],\"y\":\"two words\"});none({});");
    /* two calls after thinking */
    expect(&o,
           "<think>plan</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n"
           "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>",
           "plan", "", "get_weather({\"city\":\"A\"});get_weather({\"city\":\"B\"});");
    /* neither format: the block stays content */
    expect(&o, "<tool_call>not a call</tool_call>", "", "<tool_call>not a call</tool_call>", "");
    expect(&o, "<tool_call><function=bad\nname></tool_call>", "", "<tool_call><function=bad\nname></tool_call>", "");
    /* a call cut off (here: the text ends) is no call, its text content: mid-value, between
     * parameters, in the name, after </function>, a Qwen3 one whose JSON is whole; a whole
     * call before it stays a call */
    expect(&o, "x <tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "",
           "x <tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "");
    expect(&o, "<tool_call><function=get_weather><parameter=days>4</parameter><para", "",
           "<tool_call><function=get_weather><parameter=days>4</parameter><para", "");
    expect(&o, "<tool_call><function=get_wea", "", "<tool_call><function=get_wea", "");
    expect(&o, "<tool_call><function=get_weather></function>\n</tool", "",
           "<tool_call><function=get_weather></function>\n</tool", "");
    expect(&o, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}", "",
           "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}", "");
    expect(&o, "<tool_call><function=get_weather><parameter=days>4</parameter></function></tool_call>\n"
               "<tool_call><function=get_weather><parameter=days>5", "",
           "<tool_call><function=get_weather><parameter=days>5", "get_weather({\"days\":4});");
    /* a value missing its </parameter> ends at </function> */
    expect(&o, "<tool_call><function=get_weather><parameter=city>Rome</function></tool_call>", "", "",
           "get_weather({\"city\":\"Rome\"});");
    /* streamed, no piece of a call goes out before its </tool_call> has come (the call could
     * still be cut off) */
    {
        const char *text = "a<tool_call>\n<function=get_weather>\n<parameter=city>\nLong city name\n</parameter>\n"
                           "</function>\n</tool_call>b";
        const size_t close_end = (size_t)(strstr(text, "</tool_call>") - text) + strlen("</tool_call>");
        for (size_t piece = 1; piece <= 13; piece++) {
            parts p;
            run(&o, text, piece, &p);
            CHECK_MSG(p.n_calls == 1 && p.call_at >= close_end, "pieces of %zu: the call started after %zu bytes of %zu",
                      piece, p.call_at, close_end);
        }
    }
    /* a stop string inside a call's value cuts the call there: no call */
    const char *stop[] = {"STOP"};
    /* arguments as a string (OpenAI's form): a JSON object in it is the call's; anything else
     * leaves the text as text (found by tests/fuzz/fuzz_answer: the string went out as is) */
    expect(&o, "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}</tool_call>", "", "",
           "get_weather({\"city\":\"Oslo\"});");
    expect(&o, "<tool_call>{\"name\": \"f\", \"arguments\": \"f\"}</tool_call>", "",
           "<tool_call>{\"name\": \"f\", \"arguments\": \"f\"}</tool_call>", "");
    answer_opts os = {.split_think = true, .tools = t, .stop = stop, .n_stop = 1};
    expect(&os, "<tool_call><function=get_weather><parameter=city>Ro STOP me</parameter></function></tool_call>", "",
           "<tool_call><function=get_weather><parameter=city>Ro ", "");
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
    /* overlapping stop strings: the one that ends first wins, whole or streamed ("y" ends at
     * 2, before "zyy" that starts earlier; the fuzzer's find, tests/fuzz/regress/answer) */
    const char *over[] = {"zyy", "y"};
    answer_opts oo = {.stop = over, .n_stop = 2};
    for (size_t piece = 0; piece <= 3; piece++) {
        w = run(&oo, "azyy1", piece, &p);
        CHECK_MSG(!strcmp(p.content, "az") && w && !strcmp(w, "y"), "pieces of %zu: '%s' %s", piece, p.content, w ? w : "");
    }
}

/* parallel_tool_calls false: the answer ends at its first call's </tool_call> (the push
 * that closes it says stop), whatever the cuts; a call cut by a stop string is no call */
TEST(one_call) {
    cJSON *t = tools();
    const char *stop[] = {"STOP"};
    answer_opts o = {.split_think = true, .tools = t, .one_call = true};
    expect(&o, "Looking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
               "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n"
               "</tool_call>\nMore text.", "", "Looking.\n", "get_weather({\"city\":\"Oslo\"});");
    expect(&o, "<think>two calls</think><tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"
               "</tool_call><tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>",
           "two calls", "", "get_weather({\"city\":\"Oslo\"});");
    /* a block in neither form is content, not the call that ends the answer */
    expect(&o, "<tool_call>nonsense</tool_call><tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>x",
           "", "<tool_call>nonsense</tool_call>", "get_weather({});");
    for (size_t piece = 0; piece <= 5; piece++) {
        parts p;
        answer_opts os = {.split_think = true, .tools = t, .one_call = true, .stop = stop, .n_stop = 1};
        const char *w = run(&os, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call> then STOP", piece, &p);
        CHECK_MSG(!strcmp(p.calls, "get_weather({});") && !p.content[0] && !w, "pieces of %zu: '%s' '%s' %s", piece,
                  p.calls, p.content, w ? w : "");
        w = run(&os, "<tool_call>{\"name\": \"get_weather\", STOP \"arguments\": {}}</tool_call>", piece, &p);
        CHECK_MSG(!p.calls[0] && w, "pieces of %zu: a call cut by a stop string: '%s'", piece, p.calls);
    }
    o.one_call = false; /* the default: every call */
    expect(&o, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"get_weather\", "
               "\"arguments\": {\"days\": 2}}</tool_call>", "", "", "get_weather({});get_weather({\"days\":2});");
    cJSON_Delete(t);
}

/* random bytes built from the tags' pieces: no crash, and the same parts for every cut */
TEST(fuzz_cuts) {
    static const char *frag[] = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<function=get_weather>",
                                 "<parameter=city>", "</parameter>", "</function>", "{\"name\": \"get_weather\"}",
                                 "<", ">", "</", "\n", "x", "END", "{", "}", "\xe2\x82", "\xac",
                                 "<parameter=days>", "\"", "\\", " ", "3"};
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
                         .stop = stop, .n_stop = iter % 5 == 0, .one_call = iter % 7 < 3};
        parts whole, p;
        run(&o, text, 0, &whole);
        for (size_t piece = 1; piece <= 7; piece++) {
            run(&o, text, piece, &p);
            if (strcmp(p.reasoning, whole.reasoning) || strcmp(p.content, whole.content) || strcmp(p.calls, whole.calls) ||
                !args_parse(&p)) {
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
    RUN(one_call);
    RUN(fuzz_cuts);
    return harness_done();
}
