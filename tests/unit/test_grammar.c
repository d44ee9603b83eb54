/* test_grammar.c: src/serve/grammar.c and schema.c: GBNF compiled and matched byte by byte
 * (strings accepted and refused, errors that name the rule), JSON Schema into grammars that
 * accept the documents the schema allows and refuse the others, tool-call grammars, and the
 * vocabulary trie's masks against a token-by-token check on the real Qwen vocabulary. */
#include "harness.h"
#include "serve/grammar.h"
#include "serve/schema.h"
#include "serve/sched.h"
#include "format/gguf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* a byte vocabulary: token i is byte i, token 256 the end */
static gvocab *byte_vocab(void) {
    static char bytes[256];
    const char *p[257];
    size_t l[257];
    bool eog[257] = {0};
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, p[i] = &bytes[i], l[i] = 1;
    p[256] = "", l[256] = 0, eog[256] = true;
    return gvocab_from(257, p, l, eog);
}

/* 1: s is a whole sentence of the grammar; 0: a prefix only; -1: refused; -2: no grammar */
static int match(const char *gbnf, const char *s) {
    herr e;
    grammar *g = grammar_parse(gbnf, strlen(gbnf), &e);
    if (!g) { fprintf(stderr, "    %s\n", e.msg); return -2; }
    gvocab *v = byte_vocab();
    gmatch *m = gmatch_new(g, v, &e);
    int rc = -2;
    if (m) rc = gmatch_bytes(m, s, strlen(s)) < 0 ? -1 : gmatch_complete(m) ? 1 : 0;
    gmatch_free(m);
    gvocab_free(v);
    grammar_free(g);
    return rc;
}

static bool parse_fails(const char *gbnf, const char *needle) {
    herr e = {0};
    grammar *g = grammar_parse(gbnf, strlen(gbnf), &e);
    if (g) { grammar_free(g); return false; }
    if (!strstr(e.msg, needle)) { fprintf(stderr, "    error \"%s\" lacks \"%s\"\n", e.msg, needle); return false; }
    return true;
}

TEST(gbnf_accepts_and_refuses) {
    CHECK(match("root ::= \"ab\" | \"cd\"", "ab") == 1);
    CHECK(match("root ::= \"ab\" | \"cd\"", "c") == 0);
    CHECK(match("root ::= \"ab\" | \"cd\"", "ac") == -1);
    CHECK(match("root ::= [a-c]+ \"!\"", "abcba!") == 1);
    CHECK(match("root ::= [a-c]+ \"!\"", "!") == -1);
    CHECK(match("root ::= [^a-c]*", "xyz\n") == 1);
    CHECK(match("root ::= [^a-c]*", "xyb") == -1);
    CHECK(match("root ::= \"x\"{2,3}", "x") == 0);
    CHECK(match("root ::= \"x\"{2,3}", "xxx") == 1);
    CHECK(match("root ::= \"x\"{2,3}", "xxxx") == -1);
    CHECK(match("root ::= \"x\"{2,}", "xxxxxxx") == 1);
    CHECK(match("root ::= (\"ab\" | \"c\")* \"d\"?", "abcabd") == 1);
    CHECK(match("root ::= (\"ab\" | \"c\")* \"d\"?", "abcad") == -1);
    /* rules referring to each other, comments, rules over several lines */
    CHECK(match("# a list\nroot ::= \"[\" item (\",\" item)* \"]\"\nitem ::=\n  [0-9]+ # digits\n  | \"x\"", "[1,x,23]") == 1);
    CHECK(match("root ::= \"(\" root \")\" | \"\"", "((()))") == 1); /* nesting: a pushdown, not a DFA */
    CHECK(match("root ::= \"(\" root \")\" | \"\"", "(()))") == -1);
    /* code points as UTF-8 bytes: a class of non-ASCII, '.', escapes */
    CHECK(match("root ::= [α-ω]+", "αβγ") == 1);
    CHECK(match("root ::= [α-ω]+", "αa") == -1);
    CHECK(match("root ::= [^\"]+", "日本語 ok") == 1);
    CHECK(match("root ::= . .", "é😀") == 1);
    CHECK(match("root ::= . .", "\xff\xfe") == -1); /* no UTF-8 */
    CHECK(match("root ::= \"\\x41\\u00e9\\n\"", "Aé\n") == 1);
    CHECK(match("root ::= [\\u4e00-\\u9fff]", "中") == 1);
    /* ambiguity: both alternatives alive until the end decides */
    CHECK(match("root ::= \"a\" [a-z]* \"z\" | \"a\" [a-z]* \"y\"", "abcy") == 1);
}

TEST(gbnf_errors_name_the_problem) {
    CHECK(parse_fails("", "empty"));
    CHECK(parse_fails("item ::= \"a\"", "no rule \"root\""));
    CHECK(parse_fails("root ::= item", "rule \"item\" is used"));
    CHECK(parse_fails("root ::= root \"a\" | \"b\"", "left-recursive"));
    CHECK(parse_fails("root ::= x\nx ::= y \"a\"\ny ::= \"\" | x", "left-recursive"));
    CHECK(parse_fails("root ::= (\"a\"?)*", "left-recursive"));
    CHECK(parse_fails("root ::= \"abc", "not closed"));
    CHECK(parse_fails("root ::= [abc", "not closed"));
    CHECK(parse_fails("root ::= (\"a\"", "not closed"));
    CHECK(parse_fails("root ::= \"\\q\"", "unknown escape"));
    CHECK(parse_fails("root ::= [z-a]", "ends before it starts"));
    CHECK(parse_fails("root ::= \"a\"{3,2}", "under its minimum"));
    CHECK(parse_fails("root ::= \"a\"{99999}", "over"));
    CHECK(parse_fails("root ::= \"a\"\nroot ::= \"b\"", "defined twice"));
    CHECK(parse_fails("root ::= \"a\" ) ", "closes nothing"));
    CHECK(parse_fails("root ::= \"a\" @", "unexpected"));
    herr e;
    CHECK(!grammar_parse("root ::= \"a\"\n\nfoo ::= bar", 25, &e) && strstr(e.msg, "line 3"));
}

/* 1 the document is accepted whole, 0 prefix only, -1 refused, -2 the schema refused */
static int schema_match(const char *schema, const char *doc, char *err, size_t cap) {
    cJSON *s = cJSON_Parse(schema);
    herr e = {0};
    char *gb = schema_to_gbnf(s, "json_schema", &e);
    cJSON_Delete(s);
    if (!gb) { snprintf(err, cap, "%s", e.msg); return -2; }
    const int rc = match(gb, doc);
    free(gb);
    return rc;
}

TEST(schema_documents) {
    char err[600];
    const char *person = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": "
                         "\"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 2}},"
                         "\"required\": [\"name\"], \"additionalProperties\": false}";
    CHECK(schema_match(person, "{\"name\": \"Ann\", \"age\": 31}", err, sizeof err) == 1);
    CHECK(schema_match(person, "{\"name\":\"A\\\"b\",\"tags\":[\"x\",\"y\"]}", err, sizeof err) == 1);
    CHECK(schema_match(person, "{\"age\": 31}", err, sizeof err) == -1);            /* name is required */
    CHECK(schema_match(person, "{\"name\": \"A\", \"x\": 1}", err, sizeof err) == -1); /* no other keys */
    CHECK(schema_match(person, "{\"name\": \"A\", \"age\": 3.5}", err, sizeof err) == -1);
    CHECK(schema_match(person, "{\"name\": \"A\", \"tags\": [\"a\",\"b\",\"c\"]}", err, sizeof err) == -1);
    CHECK(schema_match(person, "{\"name\": \"A\"", err, sizeof err) == 0);
    const char *e1 = "{\"enum\": [\"red\", \"green\", 3, null]}";
    CHECK(schema_match(e1, "\"green\"", err, sizeof err) == 1);
    CHECK(schema_match(e1, "3", err, sizeof err) == 1);
    CHECK(schema_match(e1, "\"blue\"", err, sizeof err) == -1);
    CHECK(schema_match("{\"const\": {\"a\": [1, true]}}", "{\"a\":[1,true]}", err, sizeof err) == 1);
    const char *any = "{\"anyOf\": [{\"type\": \"number\"}, {\"type\": \"array\", \"minItems\": 1, \"items\": {\"type\": \"boolean\"}}]}";
    CHECK(schema_match(any, "-1.5e3", err, sizeof err) == 1);
    CHECK(schema_match(any, "[true, false]", err, sizeof err) == 1);
    CHECK(schema_match(any, "[]", err, sizeof err) == -1);
    CHECK(schema_match("{\"type\": [\"string\", \"null\"]}", "null", err, sizeof err) == 1);
    const char *tree = "{\"$ref\": \"#/$defs/node\", \"$defs\": {\"node\": {\"type\": \"object\", \"properties\": "
                       "{\"v\": {\"type\": \"integer\"}, \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": "
                       "\"#/$defs/node\"}}}, \"required\": [\"v\"]}}}";
    CHECK(schema_match(tree, "{\"v\": 1, \"kids\": [{\"v\": 2}, {\"v\": 3, \"kids\": []}]}", err, sizeof err) == 1);
    CHECK(schema_match(tree, "{\"v\": 1, \"kids\": [{\"w\": 2}]}", err, sizeof err) == -1);
    CHECK(schema_match("{\"definitions\": {\"a\": {\"type\": \"boolean\"}}, \"$ref\": \"#/definitions/a\"}", "true",
                       err, sizeof err) == 1);
    CHECK(schema_match("{\"type\": \"string\", \"format\": \"date\"}", "\"2024-02-29\"", err, sizeof err) == 1);
    CHECK(schema_match("{\"type\": \"string\", \"format\": \"date\"}", "\"2024-13-01\"", err, sizeof err) == -1);
    CHECK(schema_match("{\"type\": \"string\", \"format\": \"date-time\"}", "\"2024-02-29T12:30:00Z\"", err, sizeof err) == 1);
    CHECK(schema_match("{\"type\": \"string\", \"format\": \"date-time\"}", "\"2024-02-29 12:30:00\"", err, sizeof err) == -1);
    CHECK(schema_match("{\"type\": \"string\", \"format\": \"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"", err, sizeof err) == 1);
    CHECK(schema_match("{\"type\": \"string\", \"format\": \"uuid\"}", "\"123e4567-e89b-12d3-a456\"", err, sizeof err) == -1);
    CHECK(schema_match("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}", "\"ab\"", err, sizeof err) == 1);
    CHECK(schema_match("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}", "\"abcd\"", err, sizeof err) == -1);
    CHECK(schema_match("{}", "[1, {\"a\": \"b\"}, null]", err, sizeof err) == 1);
    CHECK(schema_match("{\"type\": \"object\"}", "{\"k\": [1]}", err, sizeof err) == 1);
    CHECK(schema_match("{\"type\": \"object\"}", "[1]", err, sizeof err) == -1);
    /* optional keys in any subset, in the schema's order */
    const char *opt = "{\"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"integer\"}, \"c\": {\"type\": \"integer\"}}}";
    CHECK(schema_match(opt, "{}", err, sizeof err) == 1);
    CHECK(schema_match(opt, "{\"b\": 1, \"c\": 2}", err, sizeof err) == 1);
    CHECK(schema_match(opt, "{\"a\": 1, \"c\": 2}", err, sizeof err) == 1);
    CHECK(schema_match(opt, "{, \"c\": 2}", err, sizeof err) == -1);
    CHECK(schema_match("{\"additionalProperties\": {\"type\": \"integer\"}}", "{\"x\": 1, \"y\": 2}", err, sizeof err) == 1);
    CHECK(schema_match("{\"additionalProperties\": {\"type\": \"integer\"}}", "{\"x\": \"no\"}", err, sizeof err) == -1);
}

TEST(schema_refusals_name_the_keyword) {
    char err[600];
    static const struct { const char *schema, *needle; } bad[] = {
        {"{\"type\": \"string\", \"pattern\": \"^a\"}", "\"pattern\" is not supported"},
        {"{\"type\": \"integer\", \"minimum\": 3}", "\"minimum\" is not supported"},
        {"{\"properties\": {\"x\": {\"type\": \"number\", \"multipleOf\": 2}}}", "at /properties/x"},
        {"{\"type\": \"string\", \"format\": \"email\"}", "format \"email\""},
        {"{\"type\": \"fish\"}", "\"fish\""},
        {"{\"$ref\": \"#/$defs/missing\"}", "not found"},
        {"{\"$ref\": \"http://x/y.json\"}", "not local"},
        {"{\"allOf\": [{\"type\": \"string\"}, {\"maxLength\": 3}]}", "allOf"},
        {"{\"type\": \"object\", \"properties\": {}, \"required\": [\"a\"]}", "\"required\" names \"a\""},
        {"{\"type\": \"array\", \"maxItems\": 5000}", "over 1000"},
        {"{\"type\": \"array\", \"items\": [{\"type\": \"string\"}]}", "tuples"},
        {"false", "matches nothing"},
        {"[1]", "object or a boolean"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        const int rc = schema_match(bad[i].schema, "1", err, sizeof err);
        CHECK_MSG(rc == -2 && strstr(err, bad[i].needle), "%s: rc %d, error \"%s\"", bad[i].schema, rc, err);
    }
    /* deep nesting is refused, not a crash */
    char deep[4000] = "";
    for (int i = 0; i < 100; i++) strcat(deep, "{\"items\": ");
    strcat(deep, "{}");
    for (int i = 0; i < 100; i++) strcat(deep, "}");
    CHECK(schema_match(deep, "[]", err, sizeof err) == -2 && strstr(err, "64 deep"));
}

TEST(tool_call_grammars) {
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
                               "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": "
                               "\"integer\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"C\", \"F\"]}}, \"required\": "
                               "[\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"noop\"}}]");
    herr e;
    char *xml = schema_tool_gbnf(tools, NULL, true, false, &e);
    CHECK(xml != NULL);
    if (xml) {
        CHECK(match(xml, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, <France>\n</parameter>\n"
                         "<parameter=unit>\nC\n</parameter>\n</function>\n</tool_call>") == 1);
        CHECK(match(xml, "<tool_call>\n<function=noop>\n</function>\n</tool_call>") == 1);
        CHECK(match(xml, "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>") == -1);
        CHECK(match(xml, "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=unit>\nK") == -1);
        CHECK(match(xml, "<tool_call>\n<function=other>") == -1);
    }
    free(xml);
    char *one = schema_tool_gbnf(tools, "noop", true, false, &e);
    CHECK(one && match(one, "<tool_call>\n<function=get_weather>") == -1);
    free(one);
    char *js = schema_tool_gbnf(tools, "get_weather", false, false, &e);
    CHECK(js && match(js, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>") == 1);
    free(js);
    CHECK(!schema_tool_gbnf(tools, "nope", true, false, &e) && strstr(e.msg, "\"nope\""));
    cJSON_Delete(tools);
}

/* tool_choice "required" / Anthropic "any": one or more calls when parallel calls are allowed
 * (llama-server's (tool_call)+), exactly one when parallel_tool_calls is false */
TEST(tool_call_grammars_many) {
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": "
                               "\"object\", \"properties\": {\"zone\": {\"type\": \"string\"}}, \"required\": [\"zone\"]}}}, "
                               "{\"type\": \"function\", \"function\": {\"name\": \"noop\"}}]");
    static const char X1[] = "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>",
                      X2[] = "<tool_call>\n<function=noop>\n</function>\n</tool_call>",
                      J1[] = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>",
                      J2[] = "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>";
    herr e;
    char *xml[2] = {NULL, NULL}, *js[2] = {NULL, NULL}, s[512];
    for (int many = 0; many < 2; many++) {
        xml[many] = schema_tool_gbnf(tools, NULL, true, many, &e);
        js[many] = schema_tool_gbnf(tools, NULL, false, many, &e);
        CHECK(xml[many] && js[many]);
        if (!xml[many] || !js[many]) goto out;
    }
    /* one call: complete under both */
    CHECK(match(xml[0], X1) == 1 && match(xml[1], X1) == 1 && match(js[0], J1) == 1 && match(js[1], J1) == 1);
    /* two calls as the template writes them (a newline between) */
    snprintf(s, sizeof s, "%s\n%s", X1, X2);
    CHECK_MSG(match(xml[1], s) == 1, "required, parallel: a second call (xml)");
    CHECK_MSG(match(xml[0], s) == -1, "parallel_tool_calls false: refused after the first call (xml)");
    snprintf(s, sizeof s, "%s\n%s", J1, J2);
    CHECK_MSG(match(js[1], s) == 1, "required, parallel: a second call (json)");
    CHECK_MSG(match(js[0], s) == -1, "parallel_tool_calls false: refused after the first call (json)");
    /* three, with no separator and a newline after the last */
    snprintf(s, sizeof s, "%s%s\n%s\n", X2, X1, X2);
    CHECK(match(xml[1], s) == 1);
    /* between calls a newline at most (the answer drops it; a blank would be content) */
    snprintf(s, sizeof s, "%s\nhello", X1);
    CHECK(match(xml[1], s) == -1);
    snprintf(s, sizeof s, "%s\n\n%s", X1, X1);
    CHECK(match(xml[1], s) == -1);
    snprintf(s, sizeof s, "%s %s", X1, X1);
    CHECK(match(xml[1], s) == -1);
    /* a second call cut short is no end: not complete */
    snprintf(s, sizeof s, "%s\n<tool_call>\n<function=get_time>", X1);
    CHECK(match(xml[1], s) == 0);
    /* still none: a call is required */
    CHECK(match(xml[1], "") == 0 && match(xml[1], "\n") == -1);
out:
    for (int many = 0; many < 2; many++) free(xml[many]), free(js[many]);
    cJSON_Delete(tools);
}

/* the qwen35 fixture's tokenizer (151,936 tokens of Qwen2's byte-level BPE), or NULL */
static tokenizer *fixture_tokenizer(void) {
    FILE *p = popen("gzip -dc tests/fixtures/vocab/ggml-vocab-qwen35.gguf.gz", "r");
    size_t cap = 8 << 20, len = 0, k;
    uint8_t *buf = xmalloc(cap);
    while (p && (k = fread(buf + len, 1, cap - len, p)) > 0)
        if ((len += k) == cap) buf = xrealloc(buf, cap *= 2);
    if (!p || pclose(p) != 0 || len < 1000) { free(buf); return NULL; }
    gguf_file *f;
    tokenizer *t = NULL;
    herr e;
    if (gguf_open_buffer(&f, buf, len, &e) < 0) { free(buf); return NULL; }
    if (tokenizer_load(&t, f, &e) < 0) t = NULL;
    gguf_close(f);
    free(buf);
    return t;
}

static char *schema_gbnf(const char *schema) {
    cJSON *s = cJSON_Parse(schema);
    herr e;
    char *gb = schema_to_gbnf(s, "json_schema", &e);
    cJSON_Delete(s);
    if (!gb) fprintf(stderr, "    %s\n", e.msg);
    return gb;
}

/* Along doc (tokenized), at every step: the mask of m (the position cache, with a planted
 * defect when asked) and of a matcher walking the whole trie, each against every token
 * checked alone. The steps where they differ (-1: the grammar or the document failed). */
static int64_t mask_mismatches_st(const tokenizer *t, const gvocab *v, const char *gbnf, const char *doc, int defect,
                                  int64_t *n_steps, gmatch_stats *out, bool primed_only) {
    herr e;
    grammar *g = grammar_parse(gbnf, strlen(gbnf), &e);
    if (!g) { fprintf(stderr, "    %s\n", e.msg); return -1; }
    gmatch *m = gmatch_new(g, v, &e), *whole = gmatch_new(g, v, &e), *ref = gmatch_new(g, v, &e);
    gmatch_plant_defect(m, defect);
    if (primed_only) gmatch_set_share_primed(m);
    gmatch_set_whole_walks(whole, true);
    int64_t n_ids = 0, bad_steps = 0;
    int32_t *ids = tokenizer_encode_alloc(t, doc, strlen(doc), false, &n_ids);
    const int32_t V = gvocab_n(v), eos = tokenizer_eos(t);
    for (int64_t i = 0; i <= n_ids; i++) {
        const uint64_t *bits, *wbits;
        const int64_t allowed = gmatch_mask(m, &bits, &e), w_allowed = gmatch_mask(whole, &wbits, &e);
        int64_t bad = 0, count = 0;
        for (int32_t id = 0; id < V; id++) {
            const bool in = (bits[id >> 6] >> (id & 63)) & 1, w = (wbits[id >> 6] >> (id & 63)) & 1;
            const bool ok = gmatch_token_ok(ref, id);
            count += in;
            if ((in != ok || w != ok) && bad++ < 3 && !defect)
                fprintf(stderr, "    step %lld: token %d cached %d whole %d alone %d\n", (long long)i, id, in, w, ok);
        }
        if (bad || count != allowed || w_allowed != allowed) bad_steps++;
        if (i == n_ids) {
            if (!gmatch_complete(m) || !((bits[eos >> 6] >> (eos & 63)) & 1)) bad_steps = -1;
            break;
        }
        if (!((bits[ids[i] >> 6] >> (ids[i] & 63)) & 1) && !defect) bad_steps++;
        if (gmatch_token(m, ids[i]) < 0 || gmatch_token(ref, ids[i]) < 0 || gmatch_token(whole, ids[i]) < 0) {
            fprintf(stderr, "    step %lld: the document's token %d refused\n", (long long)i, ids[i]);
            bad_steps = -1;
            break;
        }
    }
    const gmatch_stats st = gmatch_get_stats(m);
    if (!defect)
        fprintf(stderr, "    %lld steps, %lld position entries made, %lld found made (by this or another grammar), "
                "%lld masks by whole walks\n", (long long)n_ids + 1, (long long)st.entries, (long long)st.entries_shared,
                (long long)st.masks_whole);
    CHECK(defect || st.entries + st.entries_shared > 0);
    if (out) *out = st;
    *n_steps = n_ids + 1;
    free(ids);
    gmatch_free(m);
    gmatch_free(whole);
    gmatch_free(ref);
    grammar_free(g);
    return bad_steps;
}

static int64_t mask_mismatches(const tokenizer *t, const gvocab *v, const char *gbnf, const char *doc, int defect,
                               int64_t *n_steps) {
    return mask_mismatches_st(t, v, gbnf, doc, defect, n_steps, NULL, false);
}

/* The cached mask (position entries and the walk of context-dependent tokens) and the whole
 * walk against each token checked alone, on the real vocabulary, along documents of
 * grammars with recursion (JSON values in values, $ref trees, nested parentheses), string
 * escapes and multi-byte characters; then planted defects in the cache turn it red. */
TEST(mask_matches_token_checks) {
    tokenizer *t = fixture_tokenizer();
    if (!t) SKIP("the vocabulary fixture could not be read");
    gvocab *v = gvocab_new(t);
    CHECK(gvocab_n(v) == tokenizer_n_vocab(t));
    char *schema = schema_gbnf("{\"type\": \"object\", \"properties\": {\"title\": {\"type\": \"string\"}, \"n\": {\"type\": "
                               "\"integer\"}, \"ok\": {\"type\": \"boolean\"}}, \"required\": [\"title\", \"n\", \"ok\"]}");
    char *any = schema_gbnf("{}");
    char *tree = schema_gbnf("{\"$ref\": \"#/$defs/node\", \"$defs\": {\"node\": {\"type\": \"object\", \"properties\": "
                             "{\"v\": {\"type\": \"string\"}, \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": "
                             "\"#/$defs/node\"}}}, \"required\": [\"v\"]}}}");
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
                               "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]");
    herr e;
    char *tool = schema_tool_gbnf(tools, NULL, true, true, &e);
    cJSON_Delete(tools);
    const struct { const char *name, *gbnf, *doc; } cases[] = {
        {"schema", schema, "{\"title\": \"Día de \\\"sol\\\"\", \"n\": -12, \"ok\": true}"},
        {"json_object", any, "{\"a\": [1, {\"b\": \"x\\\"}, \\u00e9\"}, [[]], null], \"c\": {\"d\": {\"e\": \"日本語\"}}}"},
        {"tree", tree, "{\"v\": \"root\", \"kids\": [{\"v\": \"a\"}, {\"v\": \"b\", \"kids\": [{\"v\": \"c\", \"kids\": []}]}]}"},
        {"parens", "root ::= item+\nitem ::= (\"(\" item* \")\" | [a-z]+) \" \"?", "((ab (cd) ) (((x))) y)(z )"},
        {"tool_call", tool, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, \"<France>\"\n</parameter>\n"
                            "</function>\n</tool_call>"},
    };
    /* the cache's limits: a state of over PE_MAX / 2 stacks (140 words: the whole walk), the
     * matcher's entries cleared past PE_MAX (120 words: 120 + 120 + 100 tops), and a state
     * whose free-text tops cost more than the trie to make (the rest walked whole) */
    char *many = xmalloc(140 * 12 + 64), *fewer = xmalloc(120 * 12 + 64);
    strcpy(many, "root ::= (");
    strcpy(fewer, "root ::= (");
    for (int w = 0; w < 140; w++) {
        sprintf(many + strlen(many), "%s\"w%03d\"", w ? " | " : "", w);
        if (w < 120) sprintf(fewer + strlen(fewer), "%s\"w%03d\"", w ? " | " : "", w);
    }
    strcat(many, ") \":\" [a-z]+");
    strcat(fewer, ") \":\" [a-z]+");
    const struct { const char *name, *gbnf, *doc; } limits[] = {
        {"140 words", many, "w042:abc"},
        {"120 words", fewer, "w042:abc"},
        {"free texts", "root ::= [^!]* \"!\" | [^?]* \"?\" | [^.]* \".\"", "Día de sol, \"ok\"? No: 日本語!"},
    };
    for (size_t c = 0; c < sizeof limits / sizeof limits[0]; c++) {
        int64_t steps = 0;
        fprintf(stderr, "    %s:\n", limits[c].name);
        const int64_t bad = mask_mismatches(t, v, limits[c].gbnf, limits[c].doc, 0, &steps);
        CHECK_MSG(bad == 0 && steps > 3, "%s: %lld of %lld steps differ", limits[c].name, (long long)bad, (long long)steps);
    }
    free(many), free(fewer);
    int64_t red1 = 0, red2 = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t steps = 0;
        CHECK(cases[c].gbnf != NULL);
        if (!cases[c].gbnf) continue;
        fprintf(stderr, "    %s:\n", cases[c].name);
        const int64_t bad = mask_mismatches(t, v, cases[c].gbnf, cases[c].doc, 0, &steps);
        CHECK_MSG(bad == 0 && steps > 10, "%s: %lld of %lld steps differ", cases[c].name, (long long)bad, (long long)steps);
        /* again: every entry now from the vocabulary's table */
        CHECK(mask_mismatches(t, v, cases[c].gbnf, cases[c].doc, 0, &steps) == 0);
        /* the planted defects: context-dependent tokens refused, or taken, unchecked */
        red1 += mask_mismatches(t, v, cases[c].gbnf, cases[c].doc, 1, &steps);
        red2 += mask_mismatches(t, v, cases[c].gbnf, cases[c].doc, 2, &steps);
    }
    fprintf(stderr, "    planted defects: %lld and %lld steps differ\n", (long long)red1, (long long)red2);
    CHECK(red1 > 0 && red2 > 0);
    /* the mask really masks: the logits of refused tokens become -inf, the others unchanged
     * (after "{": few allowed; inside a string: most) */
    grammar *g = grammar_parse(schema, strlen(schema), &e);
    float *lg = xmalloc(sizeof *lg * (size_t)gvocab_n(v));
    static const char *const prefix[2] = {"{", "{\"title\": \"ab"};
    for (int k = 0; g && k < 2; k++) {
        for (int32_t id = 0; id < gvocab_n(v); id++) lg[id] = (float)(id % 97) * 0.25f;
        gmatch *m2 = gmatch_new(g, v, &e);
        CHECK(gmatch_bytes(m2, prefix[k], strlen(prefix[k])) == 0);
        const int64_t n_ok = gmatch_apply(m2, lg, &e);
        const uint64_t *bits;
        CHECK(gmatch_mask(m2, &bits, &e) == n_ok);
        int64_t finite = 0, wrong = 0;
        for (int32_t id = 0; id < gvocab_n(v); id++) {
            const bool in = (bits[id >> 6] >> (id & 63)) & 1;
            finite += isfinite(lg[id]);
            wrong += in ? lg[id] != (float)(id % 97) * 0.25f : !(isinf(lg[id]) && lg[id] < 0);
        }
        CHECK_MSG(n_ok > 0 && finite == n_ok && wrong == 0 && (k ? n_ok > gvocab_n(v) / 2 : n_ok < gvocab_n(v) / 100),
                  "after %s: %lld allowed, %lld finite, %lld wrong", prefix[k], (long long)n_ok, (long long)finite,
                  (long long)wrong);
        gmatch_free(m2);
    }
    free(lg);
    grammar_free(g);
    free(schema), free(any), free(tree), free(tool);
    gvocab_free(v);
    tokenizer_free(t);
}

/* A vocabulary primed as the server primes it at start-up (schema_prime): grammars other
 * than the priming ones (their own schema, tool names and parameters) find the entries of
 * their free-text tops made (JSON's strings, a call's parameter text), so their first
 * request walks no large part of the trie for entries; and the masks are the same bits
 * (against the whole walk and each token alone). */
TEST(primed_vocabulary) {
    tokenizer *t = fixture_tokenizer();
    if (!t) SKIP("the vocabulary fixture could not be read");
    gvocab *v = gvocab_new(t);
    gvocab_prime_stats ps = {0};
    schema_prime(v, SCHED_PRIME_STATES, NULL, &ps);
    int64_t pin_bytes = 0;
    const int64_t n_pin = gvocab_primed(v, &pin_bytes);
    fprintf(stderr, "    primed: %lld states, %lld entries pinned (%.1f MiB), %lld trie nodes walked\n",
            (long long)ps.states, (long long)n_pin, pin_bytes / 1048576.0, (long long)ps.visits);
    CHECK(n_pin > 0 && n_pin == ps.entries && !ps.full);
    char *schema = schema_gbnf("{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"when\": "
                               "{\"type\": \"string\", \"format\": \"date\"}, \"notes\": {\"type\": \"array\", \"items\": "
                               "{\"type\": \"string\"}}, \"n\": {\"type\": \"number\"}}, \"required\": [\"city\", \"when\"]}");
    char *any = schema_gbnf("{}");
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"send_mail\", \"parameters\": "
                               "{\"type\": \"object\", \"properties\": {\"to\": {\"type\": \"string\"}, \"body\": {\"type\": "
                               "\"string\"}, \"urgent\": {\"type\": \"boolean\"}}, \"required\": [\"to\", \"body\"]}}}]");
    herr e;
    char *xml = schema_tool_gbnf(tools, NULL, true, true, &e), *json = schema_tool_gbnf(tools, NULL, false, true, &e);
    cJSON_Delete(tools);
    const struct { const char *name, *gbnf, *doc; } cases[] = {
        {"schema", schema, "{\"city\": \"Zürich, \\\"old town\\\"\", \"when\": \"2026-12-06\", \"notes\": [\"日本語\", "
                           "\"a\\u00e9b\"], \"n\": -1.5e3}"},
        {"json_object", any, "{\"text\": \"The quick brown fox \\n jumps.\", \"list\": [1, \"two\", {\"k\": null}]}"},
        {"tool_call xml", xml, "<tool_call>\n<function=send_mail>\n<parameter=to>\nada@example.org\n</parameter>\n"
                               "<parameter=body>\nDear Ada, 3 <4 and <b>see the notes.\n</parameter>\n</function>\n</tool_call>"},
        {"tool_call json", json, "<tool_call>\n{\"name\": \"send_mail\", \"arguments\": {\"to\": \"ada@example.org\", "
                                 "\"body\": \"Dear Ada,\\nsee the notes.\"}}\n</tool_call>"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK(cases[c].gbnf != NULL);
        if (!cases[c].gbnf) continue;
        fprintf(stderr, "    %s:\n", cases[c].name);
        int64_t steps = 0;
        gmatch_stats st;
        /* entries from the primed ones only (none from the cases before): each case is a
         * first request on a server that primed at start-up */
        const int64_t bad = mask_mismatches_st(t, v, cases[c].gbnf, cases[c].doc, 0, &steps, &st, true);
        fprintf(stderr, "    entries found %lld, made %lld walking %lld trie nodes (the trie: %lld)\n",
                (long long)st.entries_shared, (long long)st.entries, (long long)st.entry_visits,
                (long long)gvocab_trie_nodes(v));
        CHECK_MSG(bad == 0 && steps > 10, "%s: %lld of %lld steps differ", cases[c].name, (long long)bad, (long long)steps);
        /* a free-text top's entry walks a fifth of the trie or more: none made here */
        CHECK_MSG(st.entries_shared > 0 && st.entry_visits < gvocab_trie_nodes(v) / 10,
                  "%s: entries found %lld, made ones walked %lld nodes", cases[c].name, (long long)st.entries_shared,
                  (long long)st.entry_visits);
    }
    free(schema), free(any), free(xml), free(json);
    gvocab_free(v);
    tokenizer_free(t);
}

int main(void) {
    RUN(gbnf_accepts_and_refuses);
    RUN(gbnf_errors_name_the_problem);
    RUN(schema_documents);
    RUN(schema_refusals_name_the_keyword);
    RUN(tool_call_grammars);
    RUN(tool_call_grammars_many);
    RUN(mask_matches_token_checks);
    RUN(primed_vocabulary);
    return harness_done();
}
