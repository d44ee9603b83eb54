/* grammar_mask.c: the cost of grammar-constrained sampling per token at Qwen3.5's vocabulary
 * size (248,320). The vocabulary: the 151,936 real tokens of the qwen35 fixture (Qwen2's
 * byte-level BPE) and 96,384 more made by joining two real tokens' bytes (seeded), so the
 * trie has the real shape and the real width. For each grammar, a valid document is
 * tokenized and fed token by token; at each step it times
 *   mask:  gmatch_apply over a 248,320-float logits row (the trie walk, or the state's cached
 *          mask, and -inf written over the refused), as sampling does when the sampled token
 *          is refused;
 *   check: gmatch_token_ok of the document's token (what sampling does first);
 *   cold:  the mask of the same state from a fresh matcher (no transition known yet).
 * Build: make build/grammar_mask; run: build/grammar_mask [reps]. One thread. */
#include "serve/grammar.h"
#include "serve/schema.h"
#include "format/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define V_TARGET 248320

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int dcmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static tokenizer *load_vocab(void) {
    FILE *p = popen("gzip -dc tests/fixtures/vocab/ggml-vocab-qwen35.gguf.gz", "r");
    size_t cap = 8 << 20, len = 0, k;
    uint8_t *buf = xmalloc(cap);
    while (p && (k = fread(buf + len, 1, cap - len, p)) > 0)
        if ((len += k) == cap) buf = xrealloc(buf, cap *= 2);
    if (!p || pclose(p) != 0) { fprintf(stderr, "grammar_mask: run from the repo root (tests/fixtures)\n"); exit(1); }
    gguf_file *f;
    tokenizer *t;
    herr e;
    if (gguf_open_buffer(&f, buf, len, &e) < 0 || tokenizer_load(&t, f, &e) < 0) { fprintf(stderr, "%s\n", e.msg); exit(1); }
    gguf_close(f);
    free(buf);
    return t;
}

typedef struct stat3 { double med, p90, max, mean; } stat3;

static stat3 summarize(double *x, int n) {
    stat3 s = {0};
    double sum = 0;
    for (int i = 0; i < n; i++) sum += x[i];
    qsort(x, (size_t)n, sizeof *x, dcmp);
    s.med = x[n / 2] * 1e6, s.p90 = x[(n * 9) / 10] * 1e6, s.max = x[n - 1] * 1e6, s.mean = sum / n * 1e6;
    return s;
}

static void run(const char *label, const char *gbnf, const char *doc, const tokenizer *t, const gvocab *v, int reps) {
    herr e;
    grammar *g = grammar_parse(gbnf, strlen(gbnf), &e);
    if (!g) { fprintf(stderr, "%s: %s\n", label, e.msg); exit(1); }
    int64_t n = 0;
    int32_t *ids = tokenizer_encode_alloc(t, doc, strlen(doc), false, &n);
    const int32_t V = gvocab_n(v);
    float *lg = xmalloc(sizeof *lg * (size_t)V);
    double *tm = xmalloc(sizeof *tm * (size_t)(n + 1) * (size_t)reps), *tc = xmalloc(sizeof *tc * (size_t)(n + 1) * (size_t)reps);
    double *tcold = xmalloc(sizeof *tcold * (size_t)(n + 1));
    int k = 0, kc = 0;
    int64_t allowed_sum = 0;
    gmatch_stats st = {0};
    double t_new = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        gmatch *m = gmatch_new(g, v, &e);
        t_new += now() - t0;
        for (int64_t i = 0; i <= n; i++) {
            for (int32_t j = 0; j < V; j++) lg[j] = 0.0f;
            t0 = now();
            const int64_t a = gmatch_apply(m, lg, &e);
            tm[k] = now() - t0;
            if (a <= 0) { fprintf(stderr, "%s: step %lld: nothing allowed (%s)\n", label, (long long)i, e.msg); exit(1); }
            allowed_sum += a;
            if (i == n) { k++; break; }
            t0 = now();
            const bool ok = gmatch_token_ok(m, ids[i]);
            tc[kc++] = now() - t0;
            if (!ok || gmatch_token(m, ids[i]) < 0) { fprintf(stderr, "%s: the document's token %lld refused\n", label, (long long)i); exit(1); }
            k++;
        }
        if (r == reps - 1) st = gmatch_get_stats(m);
        gmatch_free(m);
    }
    /* cold: each step's state reached by a fresh matcher, its mask timed first thing */
    for (int64_t i = 0; i <= n; i++) {
        gmatch *m = gmatch_new(g, v, &e);
        for (int64_t j = 0; j < i; j++) gmatch_token(m, ids[j]);
        double t0 = now();
        gmatch_apply(m, lg, &e);
        tcold[i] = now() - t0;
        gmatch_free(m);
    }
    const stat3 sm = summarize(tm, k), sc = summarize(tc, kc), sk = summarize(tcold, (int)n + 1);
    printf("%-12s %4lld tokens | mask us: med %7.1f p90 %7.1f max %7.1f mean %7.1f | cold mask us: med %7.1f max %7.1f mean %7.1f"
           " | check us: med %5.2f max %6.2f | allowed/step %lld | states %lld, walks %lld, cached %lld, trie visits/walk %.0f"
           " | matcher start %.0f us\n",
           label, (long long)n, sm.med, sm.p90, sm.max, sm.mean, sk.med, sk.max, sk.mean, sc.med, sc.max,
           (long long)(allowed_sum / k), (long long)st.states, (long long)st.masks_walked, (long long)st.masks_cached,
           st.masks_walked ? (double)st.trie_visits / (double)st.masks_walked : 0, t_new / reps * 1e6);
    free(ids), free(lg), free(tm), free(tc), free(tcold);
    grammar_free(g);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 3;
    tokenizer *t = load_vocab();
    const int32_t nr = tokenizer_n_vocab(t);
    const char **p = xmalloc(sizeof *p * V_TARGET);
    size_t *l = xmalloc(sizeof *l * V_TARGET);
    bool *eog = xcalloc(V_TARGET, 1);
    char **made = xcalloc(V_TARGET, sizeof *made);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int32_t i = 0; i < V_TARGET; i++) {
        if (i < nr) {
            p[i] = tokenizer_piece(t, i, false, &l[i]);
            if (!p[i]) p[i] = "", l[i] = 0;
            eog[i] = tokenizer_is_eog(t, i);
            continue;
        }
        size_t la = 0, lb = 0;
        const char *a = NULL, *b = NULL;
        while (!la || !lb) { /* two real normal tokens, joined */
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            a = tokenizer_piece(t, (int32_t)(x % 150000), false, &la);
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b = tokenizer_piece(t, (int32_t)(x % 150000), false, &lb);
        }
        made[i] = xmalloc(la + lb);
        memcpy(made[i], a, la);
        memcpy(made[i] + la, b, lb);
        p[i] = made[i], l[i] = la + lb;
    }
    double t0 = now();
    gvocab *v = gvocab_from(V_TARGET, p, l, eog);
    const double t_vocab = now() - t0;
    printf("vocabulary %d tokens (%d real), trie %lld nodes, built in %.0f ms (once per vocabulary)\n", V_TARGET, nr,
           (long long)gvocab_trie_nodes(v), t_vocab * 1e3);
    herr e;
    cJSON *s = cJSON_Parse("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": "
                           "\"integer\"}, \"email\": {\"type\": \"string\"}, \"tags\": {\"type\": \"array\", \"items\": "
                           "{\"type\": \"string\"}, \"maxItems\": 8}, \"address\": {\"type\": \"object\", \"properties\": "
                           "{\"street\": {\"type\": \"string\"}, \"city\": {\"type\": \"string\"}, \"zip\": {\"type\": "
                           "\"string\"}}, \"required\": [\"city\"]}, \"active\": {\"type\": \"boolean\"}, \"born\": "
                           "{\"type\": \"string\", \"format\": \"date\"}, \"role\": {\"enum\": [\"admin\", \"user\", "
                           "\"guest\"]}}, \"required\": [\"name\", \"age\", \"active\"]}");
    char *schema = schema_to_gbnf(s, "json_schema", &e);
    cJSON_Delete(s);
    run("json_schema", schema,
        "{\"name\": \"Ada Lovelace\", \"age\": 36, \"email\": \"ada@example.org\", \"tags\": [\"math\", \"poetry\", "
        "\"engines\"], \"address\": {\"street\": \"12 St James's Square\", \"city\": \"London\"}, \"active\": true, "
        "\"born\": \"1815-12-10\", \"role\": \"admin\"}",
        t, v, reps);
    free(schema);
    s = cJSON_Parse("{}");
    char *any = schema_to_gbnf(s, "json_schema", &e);
    cJSON_Delete(s);
    run("json_object", any,
        "{\"summary\": \"The quick brown fox jumps over the lazy dog, and the dog — unimpressed — goes back to sleep.\", "
        "\"scores\": [0.5, 12, -3.25e2], \"ok\": false, \"next\": null}",
        t, v, reps);
    free(any);
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
                               "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": "
                               "\"integer\"}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": "
                               "\"search\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": "
                               "\"string\"}}}}}]");
    char *tc = schema_tool_gbnf(tools, NULL, true, &e);
    cJSON_Delete(tools);
    run("tool_call", tc,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, California\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        t, v, reps);
    free(tc);
    for (int32_t i = 0; i < V_TARGET; i++) free(made[i]);
    free(made), free(p), free(l), free(eog);
    gvocab_free(v);
    tokenizer_free(t);
    return 0;
}
