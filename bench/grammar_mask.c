/* grammar_mask.c: the cost of grammar-constrained sampling per token at Qwen3.5's vocabulary
 * size (248,320). The vocabulary: the 151,936 real tokens of the qwen35 fixture (Qwen2's
 * byte-level BPE) and 96,384 more made by joining two real tokens' bytes (seeded), so the
 * trie has the real shape and the real width. For each grammar, a valid document is
 * tokenized and fed token by token; at each step it times
 *   bits:  gmatch_mask, the allowed tokens as bits (what sampling computes when the sampled
 *          token is refused);
 *   apply: gmatch_apply_bits, -inf written over the refused of a 248,320-float row;
 *   mask = bits + apply; check: gmatch_token_ok of the document's token (what sampling does
 *          first, the mask only when it is refused);
 *   cold:  the mask of each step's state from a fresh matcher (nothing known yet);
 * under four modes, interleaved repetition by repetition:
 *   whole:  every mask a whole walk of the trie from the state (the path before the
 *           position cache; per-state masks cached as before);
 *   fresh:  the position cache, entries made by this matcher alone (a grammar's first
 *           request on a server that does not prime: before sched.c primed at start-up);
 *   primed: the position cache, entries found among those primed as the server primes them
 *           at start-up (schema_prime, SCHED_PRIME_STATES), the others made by this matcher
 *           alone (a grammar's first request on a server today);
 *   shared: the position cache with the vocabulary's table warm (a server that has seen the
 *           grammar's rules before: any JSON schema after the first).
 * The vocabulary's start-up cost is printed first: the trie's build and the priming (wall
 * and CPU time, MiB).
 * Before them: the first mask inside a JSON string timed alone (thread CPU time) in each
 * mode, and the -inf pass split out (the scalar loop of before against gmatch_apply_bits).
 * Build: make build/grammar_mask; run: build/grammar_mask [reps]. One thread. GM_WALKS_ONLY=1
 * stops after the walks and the split; GM_DEBUG=1 names every step over 1 ms. */
#include "serve/grammar.h"
#include "serve/schema.h"
#include "serve/sched.h"
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

/* this thread's CPU time: a walk's own cost, whatever else the box runs */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
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

typedef struct stats { double med, mean, p99, max; } stats;

/* x[0..n) in seconds, sorted in place; the figures in microseconds */
static stats summarize(double *x, int64_t n) {
    stats s = {0};
    if (n <= 0) return s;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    qsort(x, (size_t)n, sizeof *x, dcmp);
    const int64_t k99 = (n * 99 + 99) / 100 - 1;
    s.med = x[n / 2] * 1e6, s.mean = sum / (double)n * 1e6, s.p99 = x[k99 < n ? k99 : n - 1] * 1e6, s.max = x[n - 1] * 1e6;
    return s;
}

enum { M_WHOLE, M_FRESH, M_PRIMED, M_SHARED, N_MODES };
static const char *const mode_name[N_MODES] = {"whole", "fresh", "primed", "shared"};

static gmatch *matcher(const grammar *g, const gvocab *v, int mode) {
    herr e;
    gmatch *m = gmatch_new(g, v, &e);
    if (!m) { fprintf(stderr, "%s\n", e.msg); exit(1); }
    gmatch_set_whole_walks(m, mode == M_WHOLE);
    gmatch_set_share(m, mode == M_SHARED);
    if (mode == M_PRIMED) gmatch_set_share_primed(m);
    return m;
}

typedef struct series { double *mask, *bits, *apply, *check, *first; int64_t n, nc, nf; } series;

/* one pass over the document under mode, the step timings appended to s */
static void pass(const grammar *g, const gvocab *v, const int32_t *ids, int64_t n, int mode, float *lg, series *s,
                 gmatch_stats *st) {
    herr e;
    const int32_t V = gvocab_n(v);
    gmatch *m = matcher(g, v, mode);
    for (int64_t i = 0; i <= n; i++) {
        for (int32_t j = 0; j < V; j++) lg[j] = 0.0f;
        const uint64_t *bits;
        double t0 = now();
        const int64_t a = gmatch_mask(m, &bits, &e);
        const double t1 = now();
        if (a <= 0) { fprintf(stderr, "step %lld: nothing allowed (%s)\n", (long long)i, a < 0 ? e.msg : ""); exit(1); }
        gmatch_apply_bits(bits, lg, V);
        const double t2 = now();
        s->bits[s->n] = t1 - t0, s->apply[s->n] = t2 - t1, s->mask[s->n] = t2 - t0;
        if (i == 0) s->first[s->nf++] = t2 - t0;
        if (getenv("GM_DEBUG") && t2 - t0 > 1e-3) {
            const gmatch_stats d = gmatch_get_stats(m);
            size_t pl = 0;
            const char *pc = i ? gvocab_piece(v, ids[i - 1], &pl) : "";
            fprintf(stderr, "  [%s step %lld after '%.*s': %.0f us, allowed %lld; so far: whole %lld entries %lld shared %lld visits %lld]\n",
                    mode_name[mode], (long long)i, (int)pl, pc, (t2 - t0) * 1e6, (long long)a, (long long)d.masks_whole,
                    (long long)d.entries, (long long)d.entries_shared, (long long)d.trie_visits);
        }
        s->n++;
        if (i == n) break;
        t0 = now();
        const bool ok = gmatch_token_ok(m, ids[i]);
        s->check[s->nc++] = now() - t0;
        if (!ok || gmatch_token(m, ids[i]) < 0) { fprintf(stderr, "the document's token %lld refused\n", (long long)i); exit(1); }
    }
    if (st) *st = gmatch_get_stats(m);
    gmatch_free(m);
}

static void run(const char *label, const char *gbnf, const char *doc, const tokenizer *t, gvocab *v, int reps) {
    herr e;
    grammar *g = grammar_parse(gbnf, strlen(gbnf), &e);
    if (!g) { fprintf(stderr, "%s: %s\n", label, e.msg); exit(1); }
    int64_t n = 0;
    int32_t *ids = tokenizer_encode_alloc(t, doc, strlen(doc), false, &n);
    const int32_t V = gvocab_n(v);
    float *lg = xmalloc(sizeof *lg * (size_t)V);
    series s[N_MODES];
    const int64_t cap = (n + 1) * reps;
    for (int k = 0; k < N_MODES; k++) {
        s[k] = (series){0};
        s[k].mask = xmalloc(sizeof(double) * (size_t)cap), s[k].bits = xmalloc(sizeof(double) * (size_t)cap);
        s[k].apply = xmalloc(sizeof(double) * (size_t)cap), s[k].check = xmalloc(sizeof(double) * (size_t)cap);
        s[k].first = xmalloc(sizeof(double) * (size_t)reps);
    }
    gmatch_stats st[N_MODES] = {{0}};
    series warm = s[M_SHARED];
    pass(g, v, ids, n, M_SHARED, lg, &warm, NULL); /* the vocabulary's table warm for "shared" */
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < N_MODES; k++) pass(g, v, ids, n, k, lg, &s[k], &st[k]);
    /* cold: each step's state reached by a fresh matcher, its mask timed first thing */
    double *cold[N_MODES];
    for (int k = 0; k < N_MODES; k++) {
        cold[k] = xmalloc(sizeof(double) * (size_t)(n + 1));
        for (int64_t i = 0; i <= n; i++) {
            gmatch *m = matcher(g, v, k);
            for (int64_t j = 0; j < i; j++) gmatch_token(m, ids[j]);
            const uint64_t *bits;
            const double t0 = now();
            gmatch_mask(m, &bits, &e);
            gmatch_apply_bits(bits, lg, V);
            cold[k][i] = now() - t0;
            gmatch_free(m);
        }
    }
    printf("\n%s: %lld tokens, %d reps, microseconds a step (mask = bits + apply; \"best\": each step's fastest rep, "
           "the box's other load filtered)\n", label, (long long)n, reps);
    double *best = xmalloc(sizeof(double) * (size_t)(n + 1));
    for (int k = 0; k < N_MODES; k++) {
        for (int64_t i = 0; i <= n; i++) {
            best[i] = s[k].mask[i];
            for (int r = 1; r < reps; r++)
                if (s[k].mask[r * (n + 1) + i] < best[i]) best[i] = s[k].mask[r * (n + 1) + i];
        }
        const stats sm = summarize(s[k].mask, s[k].n), sb = summarize(s[k].bits, s[k].n), sa = summarize(s[k].apply, s[k].n);
        const stats sf = summarize(s[k].first, s[k].nf), sc = summarize(s[k].check, s[k].nc), sk = summarize(cold[k], n + 1);
        const stats bs = summarize(best, n + 1);
        const int64_t made = st[k].masks_walked ? st[k].masks_walked : 1;
        printf("  %-6s mask med %6.1f mean %7.1f p99 %7.1f max %7.1f | best: mean %7.1f p99 %7.1f max %7.1f | bits med %6.1f "
               "mean %7.1f | apply med %5.1f mean %5.1f | first %7.1f | cold mean %7.1f max %7.1f | check med %4.2f | "
               "entries made %lld found %lld (abstract visits %lld), whole walks %lld, real visits/mask %.0f\n",
               mode_name[k], sm.med, sm.mean, sm.p99, sm.max, bs.mean, bs.p99, bs.max, sb.med, sb.mean, sa.med, sa.mean,
               sf.mean, sk.mean, sk.max, sc.med, (long long)st[k].entries, (long long)st[k].entries_shared,
               (long long)st[k].entry_visits, (long long)st[k].masks_whole, (double)st[k].trie_visits / (double)made);
        free(s[k].mask), free(s[k].bits), free(s[k].apply), free(s[k].check), free(s[k].first), free(cold[k]);
    }
    free(best);
    fflush(stdout);
    free(ids), free(lg);
    grammar_free(g);
}

/* the -inf pass as it was before gmatch_apply_bits (a bit test a logit, words of all ones
 * skipped): the reference the vectorized pass is timed against */
static void apply_scalar(const uint64_t *b, float *logits, int32_t V) {
    for (int32_t w = 0; w < (V + 63) / 64; w++) {
        const uint64_t x = b[w];
        if (x == ~0ull) continue;
        const int32_t lo = w * 64, hi = lo + 64 < V ? lo + 64 : V;
        for (int32_t i = lo; i < hi; i++)
            if (!((x >> (i - lo)) & 1)) logits[i] = -INFINITY;
    }
}

/* the apply split: the scalar pass and gmatch_apply_bits over the same bits, fastest of reps
 * (wall time; the row rewritten before each) */
static void applies(gvocab *v, const char *gbnf, const char *pre, const char *label, int reps) {
    herr e;
    grammar *g = grammar_parse(gbnf, strlen(gbnf), &e);
    gmatch *m = matcher(g, v, M_SHARED);
    gmatch_bytes(m, pre, strlen(pre));
    const uint64_t *bits;
    const int64_t allowed = gmatch_mask(m, &bits, &e);
    const int32_t V = gvocab_n(v);
    float *lg = xmalloc(sizeof *lg * (size_t)V);
    double best[2] = {1e9, 1e9};
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++) {
            for (int32_t j = 0; j < V; j++) lg[j] = (float)(j & 7);
            const double t0 = now();
            if (k) gmatch_apply_bits(bits, lg, V);
            else apply_scalar(bits, lg, V);
            const double dt = now() - t0;
            if (dt < best[k]) best[k] = dt;
        }
    printf("apply over %d logits, %s (%lld allowed), fastest of %d: scalar %.1f us, vectorized %.1f us\n", V, label,
           (long long)allowed, reps, best[0] * 1e6, best[1] * 1e6);
    free(lg);
    gmatch_free(m);
    grammar_free(g);
}

/* The walks that bound a mask's worst case, at the state inside a JSON string (almost every
 * token allowed): the fastest of reps fresh matchers each (the box's load filtered) */
static void walks(const tokenizer *t, gvocab *v, int reps) {
    herr e;
    cJSON *js = cJSON_Parse("{}");
    char *gb = schema_to_gbnf(js, "json_schema", &e);
    cJSON_Delete(js);
    grammar *g = grammar_parse(gb, strlen(gb), &e);
    const char *pre = "{\"k\": \"";
    double best[N_MODES];
    int64_t visits[N_MODES] = {0}, allowed = 0;
    for (int k = 0; k < N_MODES; k++) {
        best[k] = 1e9;
        for (int r = 0; r < reps; r++) {
            gmatch *m = matcher(g, v, k);
            gmatch_bytes(m, pre, strlen(pre));
            const uint64_t *bits;
            const double t0 = cpu_now();
            allowed = gmatch_mask(m, &bits, &e);
            const double dt = cpu_now() - t0;
            if (dt < best[k]) best[k] = dt;
            const gmatch_stats st = gmatch_get_stats(m);
            visits[k] = st.trie_visits + st.entry_visits;
            if (r == 0) printf("  %s: %lld states, %lld transitions computed (abstract matcher's not counted)\n", mode_name[k], (long long)st.states, (long long)st.transitions);
            gmatch_free(m);
        }
    }
    printf("\nthe first mask inside a JSON string (%lld of %d tokens allowed), fastest of %d: whole walk %.0f us, "
           "entries made (fresh) %.0f us, entries found primed (primed) %.0f us, entries found (shared) %.0f us; trie "
           "nodes visited %lld / %lld / %lld / %lld\n",
           (long long)allowed, gvocab_n(v), reps, best[M_WHOLE] * 1e6, best[M_FRESH] * 1e6, best[M_PRIMED] * 1e6,
           best[M_SHARED] * 1e6, (long long)visits[M_WHOLE], (long long)visits[M_FRESH], (long long)visits[M_PRIMED],
           (long long)visits[M_SHARED]);
    fflush(stdout);
    grammar_free(g);
    free(gb);
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
    /* what the server does at start-up after the trie (sched.c): the primed entries */
    const char *ms = getenv("GM_PRIME_STATES");
    gvocab_prime_stats ps = {0};
    t0 = now();
    const double c0 = cpu_now();
    schema_prime(v, ms ? atoi(ms) : SCHED_PRIME_STATES, NULL, &ps);
    const double t_prime = now() - t0, c_prime = cpu_now() - c0;
    int64_t pin_bytes = 0;
    const int64_t n_pin = gvocab_primed(v, &pin_bytes);
    char cpu[256] = "?";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    for (char line[512]; ci && fgets(line, sizeof line, ci);)
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
            cpu[strcspn(cpu, "\n")] = 0;
            break;
        }
    if (ci) fclose(ci);
    printf("CPU %s, one thread; vocabulary %d tokens (%d real), trie %lld nodes, built in %.0f ms (once per vocabulary), "
           "%.1f MiB\n", cpu, V_TARGET, nr, (long long)gvocab_trie_nodes(v), t_vocab * 1e3, gvocab_bytes(v) / 1048576.0);
    printf("primed (start-up, schema_prime, %d states a grammar): %lld DFA states, %lld entries pinned (%lld found pinned "
           "already), %lld trie nodes walked, %.0f ms (%.0f ms CPU), %.1f MiB%s\n", ms ? atoi(ms) : SCHED_PRIME_STATES,
           (long long)ps.states, (long long)n_pin, (long long)ps.found, (long long)ps.visits, t_prime * 1e3, c_prime * 1e3,
           pin_bytes / 1048576.0, ps.full ? " (caps reached)" : "");
    herr e;
    walks(t, v, reps < 5 ? 5 : reps);
    {
        cJSON *js = cJSON_Parse("{}");
        char *gb = schema_to_gbnf(js, "json_schema", &e);
        cJSON_Delete(js);
        applies(v, gb, "{\"k\": \"", "inside a JSON string", 20);
        applies(v, gb, "{\"k\": ", "at a JSON value", 20);
        applies(v, gb, "{\"k\": 1", "after a digit", 20);
        free(gb);
    }
    if (getenv("GM_WALKS_ONLY")) return 0;
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
    char *tc = schema_tool_gbnf(tools, NULL, true, true, &e); /* required's form */
    cJSON_Delete(tools);
    run("tool_call", tc,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, California\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        t, v, reps);
    free(tc);
    s = cJSON_Parse("{\"type\": \"object\", \"properties\": {\"title\": {\"type\": \"string\"}, \"body\": {\"type\": "
                    "\"string\"}, \"notes\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": "
                    "[\"title\", \"body\"]}");
    char *ft = schema_to_gbnf(s, "json_schema", &e);
    cJSON_Delete(s);
    run("free_text", ft,
        "{\"title\": \"On the Analytical Engine\", \"body\": \"The Analytical Engine weaves algebraic patterns just as "
        "the Jacquard loom weaves flowers and leaves. It might act upon other things besides number, were objects found "
        "whose mutual fundamental relations could be expressed by those of the abstract science of operations, and which "
        "should be also susceptible of adaptations to the action of the operating notation and mechanism of the engine. "
        "Supposing, for instance, that the fundamental relations of pitched sounds in the science of harmony and of "
        "musical composition were susceptible of such expression and adaptations, the engine might compose elaborate and "
        "scientific pieces of music of any degree of complexity or extent.\\n\\nShe wrote: \\\"It can do whatever we "
        "know how to order it to perform.\\\" — Note G, 1843 (≈ 20,000 words; 日本語の注釈もある).\", \"notes\": "
        "[\"translated from Menabrea's French\", \"notes A to G are longer than the paper\", \"Bernoulli numbers: "
        "B1 = -1/2, B2 = 1/6, …\"]}",
        t, v, reps);
    free(ft);
    for (int32_t i = 0; i < V_TARGET; i++) free(made[i]);
    free(made), free(p), free(l), free(eog);
    gvocab_free(v);
    tokenizer_free(t);
    return 0;
}
