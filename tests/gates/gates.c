/* gates.c: the invariants of README "Invariants", one program: `gates GATE PRESET`.
 * Every gate speaks to engine.h alone (no backend header), so each backend runs the same
 * gates; the float64 reference (tests/ref) is the one outside witness.
 *   delta_rows_snap  each point equals, bit for bit, the lane and ring a prefill of rows
 *                    [0, m) of the span leaves from the same start state
 *   q_mark           marks move none of the pass's bits (top token, last logits, KV rows,
 *                    end state); the point at n is the end state; a point does not depend
 *                    on the other marks of its pass
 *   resume           restore at m, a prompt span, then steps == a fresh prefill of [start, m)
 *                    followed by the same span and steps, bit for bit, into the same and into
 *                    another sequence (KV rows carried by engine_kv_read / engine_kv_write)
 *   stale            a point whose KV prefix changed is refused, and so is a KV range on
 *                    another prefix
 *   k_keep           a marked call runs as many passes as the unmarked one, past a pass (512 rows on the CPU)
 *   batch_inv        a sequence in a mixed call (prompt spans and decode rows of others)
 *                    gives the bits of a call of its own; a sequence twice is an error
 *   anchor           a span anchored at rows a_i gives the bits of spans cut at a_i (every
 *                    row's logits, KV rows, points, end state), in no more passes than the
 *                    unanchored span; a resume at an anchor continues as the cut spans do
 *   accuracy         points against the float64 reference's lanes and rings, within a band
 *                    derived below: catches a defect shared by the marked pass and the prefix
 *                    prefill, which the bit-for-bit gates cannot see
 * Exit 0 when the gate holds, 1 when a check failed (each printed as "check failed"), 3 when
 * the gate could not be set up (printed as "setup failed"): the mutant runner
 * (tests/gates/mutants) counts only exit 1 with a "check failed" line as red. */
#include "unit/harness.h"
#include "unit/models.h"
#include "ref/ref.h"
#include "engine/engine.h"
#include "engine/sampler.h"

#include <math.h>

static const char *g_preset;

#define SETUP(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "    setup failed: ");        \
            fprintf(stderr, __VA_ARGS__);                 \
            fputc('\n', stderr);                          \
            exit(3);                                      \
        }                                                 \
    } while (0)

typedef struct fixture {
    model *m;
    engine *eng;
    int64_t V;
} fixture;

static bool g_kv_f32; /* the accuracy gate: its band is derived for f32 KV rows */

static void fixture_open(fixture *f, const char *quant, int64_t n_ctx, int n_seq) {
    herr e;
    SETUP(model_load(&f->m, test_model(g_preset, quant), &e) == 0, "%s", e.msg);
    engine_opts eo = {.device = ENGINE_CPU, .n_threads = 2, .n_ctx = n_ctx, .n_seq_max = n_seq};
    const char *dev = getenv("HEARTH_GATES_DEVICE");
    if (dev && !strcmp(dev, "cuda")) eo.device = ENGINE_CUDA;
    const char *kv = getenv("HEARTH_GATES_KV"); /* f16: KV rows in f16 (on the GPU, the tensor-core attention) */
    eo.kv_f16 = kv && !strcmp(kv, "f16") && !g_kv_f32;
    SETUP(engine_open(&f->eng, f->m, &eo, &e) == 0, "%s", e.msg);
    f->V = f->m->hp.n_vocab;
    static bool said;
    if (!said) printf("  (the gates run on the %s engine, KV rows %s)\n", engine_get_info(f->eng).backend, eo.kv_f16 ? "f16" : "f32");
    if (g_kv_f32 && kv && !strcmp(kv, "f16")) printf("  (accuracy: KV rows f32, as its band assumes)\n");
    said = true;
}

static void fixture_close(fixture *f) {
    engine_free(f->eng);
    model_free(f->m);
}

static engine_point *point_new(fixture *f) {
    herr e;
    engine_point *p;
    SETUP(engine_point_new(f->eng, &p, &e) == 0, "%s", e.msg);
    return p;
}

/* one span; logits of its last row into lg (may be NULL) */
static void run1(fixture *f, int seq, const int32_t *ids, int64_t n, const int64_t *marks, int n_marks,
                 engine_point *const *pts, float *lg) {
    herr e;
    engine_span sp = {.seq = seq, .ids = ids, .n = n, .marks = marks, .n_marks = n_marks, .points = pts,
                      .want = lg ? ENGINE_LOGITS_LAST : ENGINE_LOGITS_NONE, .logits = lg};
    SETUP(engine_run(f->eng, &sp, 1, &e) == 0, "%s", e.msg);
}

/* sequence seq emptied, then `prefix` rows of ids in a call of their own (the gate's start state) */
static void seq_with_prefix(fixture *f, int seq, const int32_t *ids, int64_t prefix) {
    engine_seq_clear(f->eng, seq);
    if (prefix > 0) run1(f, seq, ids, prefix, NULL, 0, NULL, NULL);
}

static bool points_equal(const engine_point *a, const engine_point *b, const char *what) {
    bool lanes = !memcmp(a->lanes, b->lanes, sizeof(float) * a->lane_floats * (size_t)a->n_gdn);
    bool rings = !memcmp(a->rings, b->rings, sizeof(float) * a->ring_floats * (size_t)a->n_gdn);
    CHECK_MSG(a->pos == b->pos, "%s: position %lld vs %lld", what, (long long)a->pos, (long long)b->pos);
    CHECK_MSG(a->hash == b->hash, "%s: provenance hashes differ", what);
    CHECK_MSG(lanes, "%s: lanes differ", what);
    CHECK_MSG(rings, "%s: rings differ", what);
    return lanes && rings && a->pos == b->pos;
}

static engine_point *saved(fixture *f, int seq) {
    herr e;
    engine_point *p = point_new(f);
    SETUP(engine_save(f->eng, seq, p, &e) == 0, "%s", e.msg);
    return p;
}

/* KV rows [0, rows) of two sequences, through engine_kv_read */
static bool kv_equal(fixture *f, int a, int b, int64_t rows) {
    herr e;
    engine_kv *ka, *kb;
    SETUP(engine_kv_read(f->eng, a, 0, rows, &ka, &e) == 0, "%s", e.msg);
    SETUP(engine_kv_read(f->eng, b, 0, rows, &kb, &e) == 0, "%s", e.msg);
    bool same = ka->bytes == kb->bytes && !memcmp(ka->data, kb->data, ka->bytes);
    engine_kv_free(f->eng, ka);
    engine_kv_free(f->eng, kb);
    return same;
}

/* ---- delta_rows_snap ---- */
static void snap_case(fixture *f, const int32_t *ids, int64_t prefix, int64_t n, const int64_t *marks, int n_marks,
                      const char *name) {
    engine_point **pts = xcalloc((size_t)n_marks, sizeof *pts);
    for (int i = 0; i < n_marks; i++) pts[i] = point_new(f);
    seq_with_prefix(f, 0, ids, prefix);
    run1(f, 0, ids + prefix, n, marks, n_marks, pts, NULL);
    for (int i = 0; i < n_marks; i++) {
        seq_with_prefix(f, 1, ids, prefix);
        run1(f, 1, ids + prefix, marks[i], NULL, 0, NULL, NULL);
        engine_point *want = saved(f, 1);
        char what[160];
        snprintf(what, sizeof what, "delta_rows_snap %s: mark %lld of a %lld-row span after %lld rows", name,
                 (long long)marks[i], (long long)n, (long long)prefix);
        points_equal(pts[i], want, what);
        engine_point_free(f->eng, want);
    }
    for (int i = 0; i < n_marks; i++) engine_point_free(f->eng, pts[i]);
    free(pts);
}

TEST(delta_rows_snap) {
    fixture f;
    fixture_open(&f, "q4_k_m", 1200, 2);
    int32_t *ids = test_ids(1100, f.V, 21);
    /* chunks of 64 rows laid from the span's start */
    { int64_t m[] = {64}; snap_case(&f, ids, 0, 200, m, 1, "on a chunk boundary"); }
    { int64_t m[] = {63}; snap_case(&f, ids, 0, 200, m, 1, "one before a boundary"); }
    { int64_t m[] = {65}; snap_case(&f, ids, 0, 200, m, 1, "one after a boundary"); }
    { int64_t m[] = {1}; snap_case(&f, ids, 0, 200, m, 1, "m = 1"); }
    { int64_t m[] = {200}; snap_case(&f, ids, 0, 200, m, 1, "m = n"); }
    { int64_t m[] = {70, 75, 100, 127}; snap_case(&f, ids, 0, 200, m, 4, "several in one chunk"); }
    { int64_t m[] = {3, 197}; snap_case(&f, ids, 0, 200, m, 2, "first and last chunk"); }
    { int64_t m[] = {2, 64, 130}; snap_case(&f, ids, 37, 150, m, 3, "non-zero start state"); }
    { int64_t m[] = {1, 511, 512, 513, 700}; snap_case(&f, ids, 5, 720, m, 5, "across the 512-row pass"); }
    /* Positions are int64_t end to end (engine.h, the point, the KV index), never 32-bit:
     * the case of a call starting past 2^31 does not arise. */
    free(ids);
    fixture_close(&f);
}

/* ---- q_mark ---- */
TEST(q_mark) {
    fixture f;
    fixture_open(&f, "q4_k_m", 800, 2);
    const int64_t prefix = 9, n = 600;
    int32_t *ids = test_ids(prefix + n, f.V, 33);
    const int64_t marks[] = {1, 63, 64, 65, 300, 512, 513, 599, 600};
    const int nm = 9;
    engine_point *pts[9];
    for (int i = 0; i < nm; i++) pts[i] = point_new(&f);
    float *plain = xmalloc(sizeof(float) * (size_t)f.V), *marked = xmalloc(sizeof(float) * (size_t)f.V);
    seq_with_prefix(&f, 0, ids, prefix);
    run1(&f, 0, ids + prefix, n, NULL, 0, NULL, plain);
    seq_with_prefix(&f, 1, ids, prefix);
    run1(&f, 1, ids + prefix, n, marks, nm, pts, marked);
    CHECK_MSG(sampler_argmax(plain, f.V) == sampler_argmax(marked, f.V), "q_mark: the chosen token differs");
    CHECK_MSG(!memcmp(plain, marked, sizeof(float) * (size_t)f.V), "q_mark: last logits row differs");
    CHECK_MSG(kv_equal(&f, 0, 1, prefix + n), "q_mark: KV rows differ");
    engine_point *end0 = saved(&f, 0), *end1 = saved(&f, 1);
    points_equal(end0, end1, "q_mark: end state with and without marks");
    points_equal(pts[nm - 1], end0, "q_mark: the point at n against the end state");
    /* a point does not depend on the other marks of its pass */
    for (int i = 0; i < nm; i++) {
        engine_point *alone = point_new(&f);
        seq_with_prefix(&f, 1, ids, prefix);
        run1(&f, 1, ids + prefix, n, &marks[i], 1, &alone, NULL);
        char what[96];
        snprintf(what, sizeof what, "q_mark: point %lld alone vs with the others", (long long)marks[i]);
        points_equal(alone, pts[i], what);
        engine_point_free(f.eng, alone);
    }
    for (int i = 0; i < nm; i++) engine_point_free(f.eng, pts[i]);
    engine_point_free(f.eng, end0);
    engine_point_free(f.eng, end1);
    free(plain);
    free(marked);
    free(ids);
    fixture_close(&f);
}

/* ---- resume ---- */
#define RESUME_K 70 /* the prompt span after the point: longer than a chunk */
#define RESUME_T 3  /* decode steps after it */

/* the span after the point and the steps: every row's logits, (K + T) x V */
static void continue_from(fixture *f, int seq, const int32_t *ids, float *out) {
    herr e;
    engine_span sp = {.seq = seq, .ids = ids, .n = RESUME_K, .want = ENGINE_LOGITS_ALL, .logits = out};
    SETUP(engine_run(f->eng, &sp, 1, &e) == 0, "%s", e.msg);
    for (int t = 0; t < RESUME_T; t++) run1(f, seq, ids + RESUME_K + t, 1, NULL, 0, NULL, out + (RESUME_K + t) * f->V);
}

TEST(resume) {
    fixture f;
    fixture_open(&f, "q4_k_m", 1200, 3);
    herr e;
    const int64_t start = 5, n = 1024;
    const int64_t marks[] = {1, 63, 64, 65, 511, 512, 513, 700, 1017};
    const int nm = 9;
    int32_t *ids = test_ids(start + n + RESUME_K + RESUME_T, f.V, 55);
    int32_t *tail = test_ids(RESUME_K + RESUME_T, f.V, 56); /* the continuation: other ids than the pass's */
    engine_point *pts[9];
    for (int i = 0; i < nm; i++) pts[i] = point_new(&f);
    seq_with_prefix(&f, 0, ids, start);
    run1(&f, 0, ids + start, n, marks, nm, pts, NULL);
    const size_t rows = (size_t)((RESUME_K + RESUME_T) * f.V);
    float *a = xmalloc(sizeof(float) * rows), *b = xmalloc(sizeof(float) * rows), *c = xmalloc(sizeof(float) * rows);
    /* the later points first: continuing from m rewrites the rows past m that later points need */
    for (int i = nm - 1; i >= 0; i--) {
        const int64_t m = marks[i];
        /* the same sequence */
        CHECK_MSG(engine_restore(f.eng, 0, pts[i], &e) == 0, "resume: restore at %lld refused: %s", (long long)m, e.msg);
        continue_from(&f, 0, tail, a);
        /* a fresh prefill of [start, m) from the same call boundary */
        seq_with_prefix(&f, 1, ids, start);
        run1(&f, 1, ids + start, m, NULL, 0, NULL, NULL);
        continue_from(&f, 1, tail, b);
        CHECK_MSG(!memcmp(a, b, sizeof(float) * rows), "resume: at %lld, restored and continued differs from a fresh prefill",
                  (long long)m);
        /* another sequence: its KV rows [0, start + m) from sequence 1's, then the point */
        engine_kv *kv;
        engine_seq_clear(f.eng, 2);
        SETUP(engine_kv_read(f.eng, 1, 0, start + m, &kv, &e) == 0, "%s", e.msg);
        CHECK_MSG(engine_kv_write(f.eng, 2, kv, &e) == 0, "resume: KV range into sequence 2 refused: %s", e.msg);
        engine_kv_free(f.eng, kv);
        CHECK_MSG(engine_restore(f.eng, 2, pts[i], &e) == 0, "resume: restore at %lld into sequence 2 refused: %s",
                  (long long)m, e.msg);
        continue_from(&f, 2, tail, c);
        CHECK_MSG(!memcmp(c, b, sizeof(float) * rows), "resume: at %lld into another sequence differs from a fresh prefill",
                  (long long)m);
    }
    printf("  resume %s: %d points, each restored into its own and another sequence, %d rows compared bit for bit\n",
           g_preset, nm, RESUME_K + RESUME_T);
    for (int i = 0; i < nm; i++) engine_point_free(f.eng, pts[i]);
    free(a); free(b); free(c); free(ids); free(tail);
    fixture_close(&f);
}

/* ---- stale ---- */
TEST(stale) {
    fixture f;
    fixture_open(&f, "q4_k_m", 1200, 2);
    herr e;
    const int64_t n = 1024, marks[] = {700, 1017};
    int32_t *ids = test_ids(n, f.V, 57), *other = test_ids(320, f.V, 58);
    engine_point *pts[2] = {point_new(&f), point_new(&f)};
    seq_with_prefix(&f, 0, ids, 0);
    run1(&f, 0, ids, n, marks, 2, pts, NULL);
    /* the case: restore 700, step 320 other ids, then the 1017 point must be refused */
    CHECK(engine_restore(f.eng, 0, pts[0], &e) == 0);
    for (int t = 0; t < 320; t++) run1(&f, 0, &other[t], 1, NULL, 0, NULL, NULL);
    CHECK_MSG(engine_restore(f.eng, 0, pts[1], &e) < 0, "stale: a point restored over changed KV rows was accepted");
    /* a point past the rows a sequence holds is refused too */
    engine_seq_clear(f.eng, 1);
    CHECK_MSG(engine_restore(f.eng, 1, pts[0], &e) < 0, "stale: a point past an empty sequence's rows was accepted");
    /* a KV range on another prefix is refused: sequence 1 holds other ids at [0, 100) */
    run1(&f, 1, other, 100, NULL, 0, NULL, NULL);
    engine_kv *kv;
    SETUP(engine_kv_read(f.eng, 0, 100, 600, &kv, &e) == 0, "%s", e.msg);
    CHECK_MSG(engine_kv_write(f.eng, 1, kv, &e) < 0, "stale: a KV range written after another prefix was accepted");
    engine_kv_free(f.eng, kv);
    /* a stale sequence (KV rows without their state) does not run */
    SETUP(engine_kv_read(f.eng, 0, 0, 700, &kv, &e) == 0, "%s", e.msg);
    engine_seq_clear(f.eng, 1);
    CHECK(engine_kv_write(f.eng, 1, kv, &e) == 0);
    engine_kv_free(f.eng, kv);
    engine_span sp = {.seq = 1, .ids = other, .n = 1};
    CHECK_MSG(engine_run(f.eng, &sp, 1, &e) < 0, "stale: a sequence with KV rows but no state ran");
    CHECK_MSG(engine_restore(f.eng, 1, pts[0], &e) == 0, "stale: restore after a matching KV range refused: %s", e.msg);
    for (int i = 0; i < 2; i++) engine_point_free(f.eng, pts[i]);
    free(ids); free(other);
    fixture_close(&f);
}

/* ---- k_keep ---- */
TEST(k_keep) {
    fixture f;
    fixture_open(&f, "q4_k_m", 1200, 1);
    const int64_t lens[] = {300, 1100};
    for (int li = 0; li < 2; li++) {
        const int64_t n = lens[li];
        int32_t *ids = test_ids(n, f.V, 77);
        float *a = xmalloc(sizeof(float) * (size_t)f.V), *c = xmalloc(sizeof(float) * (size_t)f.V);
        engine_stats s0 = engine_get_stats(f.eng);
        seq_with_prefix(&f, 0, ids, 0);
        run1(&f, 0, ids, n, NULL, 0, NULL, a);
        engine_stats s1 = engine_get_stats(f.eng);
        const int64_t plain = s1.n_passes - s0.n_passes;
        CHECK_MSG(s1.n_points == s0.n_points, "k_keep: an unmarked call took points");
        const int64_t marks[] = {10, 100, 299, 513, 1000, 1099};
        const int nm = n > 1000 ? 6 : 3;
        engine_point *pts[6];
        for (int i = 0; i < nm; i++) pts[i] = point_new(&f);
        seq_with_prefix(&f, 0, ids, 0);
        run1(&f, 0, ids, n, marks, nm, pts, NULL);
        engine_stats s2 = engine_get_stats(f.eng);
        CHECK_MSG(s2.n_passes - s1.n_passes == plain, "k_keep: at n=%lld a marked call ran %lld passes, the unmarked %lld",
                  (long long)n, (long long)(s2.n_passes - s1.n_passes), (long long)plain);
        CHECK_MSG(s2.n_calls - s1.n_calls == 1, "k_keep: a marked call counted as %lld calls", (long long)(s2.n_calls - s1.n_calls));
        CHECK_MSG(s2.n_points - s1.n_points == nm, "k_keep: %lld points for %d marks", (long long)(s2.n_points - s1.n_points), nm);
        const int64_t rpp = engine_get_info(f.eng).rows_per_pass;
        CHECK_MSG(plain == (n + rpp - 1) / rpp, "k_keep: %lld rows in %lld passes of at most %lld", (long long)n, (long long)plain,
                  (long long)rpp);
        /* and an unmarked call after a marked one runs exactly as the first */
        seq_with_prefix(&f, 0, ids, 0);
        run1(&f, 0, ids, n, NULL, 0, NULL, c);
        CHECK_MSG(!memcmp(a, c, sizeof(float) * (size_t)f.V), "k_keep: an unmarked call changed after marks");
        for (int i = 0; i < nm; i++) engine_point_free(f.eng, pts[i]);
        free(a); free(c); free(ids);
    }
    fixture_close(&f);
}

/* ---- batch_inv ---- */
TEST(batch_inv) {
    fixture f;
    fixture_open(&f, "q4_k_m", 1400, 8);
    herr e;
    const int64_t nA = 700, nD = 130, pre = 40;
    int32_t *A = test_ids(nA, f.V, 81), *D = test_ids(nD, f.V, 82), *P = test_ids(3 * pre, f.V, 83);
    const int64_t V = f.V;
    const int64_t mA[] = {64, 513, 700};
    /* alone: A's prompt in a call of its own; B and C: a prefix, then one decode row each */
    float *la = xmalloc(sizeof(float) * (size_t)(nA * V)), *lb = xmalloc(sizeof(float) * (size_t)V);
    float *lc = xmalloc(sizeof(float) * (size_t)V), *ld = xmalloc(sizeof(float) * (size_t)V);
    engine_point *pa[3] = {point_new(&f), point_new(&f), point_new(&f)};
    seq_with_prefix(&f, 0, A, 0);
    engine_span sa = {.seq = 0, .ids = A, .n = nA, .marks = mA, .n_marks = 3, .points = pa, .want = ENGINE_LOGITS_ALL, .logits = la};
    SETUP(engine_run(f.eng, &sa, 1, &e) == 0, "%s", e.msg);
    seq_with_prefix(&f, 1, P, pre);
    run1(&f, 1, &P[pre], 1, NULL, 0, NULL, lb);
    seq_with_prefix(&f, 2, P + pre, pre);
    run1(&f, 2, &P[2 * pre], 1, NULL, 0, NULL, lc);
    seq_with_prefix(&f, 3, D, 0);
    run1(&f, 3, D, nD, NULL, 0, NULL, ld);
    engine_point *ea = saved(&f, 0), *eb = saved(&f, 1), *ed = saved(&f, 3);
    /* mixed: the same four spans in one call, in another order, on other sequences */
    float *ma = xmalloc(sizeof(float) * (size_t)(nA * V)), *mb = xmalloc(sizeof(float) * (size_t)V);
    float *mc = xmalloc(sizeof(float) * (size_t)V), *md = xmalloc(sizeof(float) * (size_t)V);
    engine_point *qa[3] = {point_new(&f), point_new(&f), point_new(&f)};
    seq_with_prefix(&f, 4, A, 0);
    seq_with_prefix(&f, 5, P, pre);
    seq_with_prefix(&f, 6, P + pre, pre);
    seq_with_prefix(&f, 7, D, 0);
    engine_span mix[4] = {
        {.seq = 5, .ids = &P[pre], .n = 1, .want = ENGINE_LOGITS_LAST, .logits = mb},
        {.seq = 7, .ids = D, .n = nD, .want = ENGINE_LOGITS_LAST, .logits = md},
        {.seq = 4, .ids = A, .n = nA, .marks = mA, .n_marks = 3, .points = qa, .want = ENGINE_LOGITS_ALL, .logits = ma},
        {.seq = 6, .ids = &P[2 * pre], .n = 1, .want = ENGINE_LOGITS_LAST, .logits = mc},
    };
    SETUP(engine_run(f.eng, mix, 4, &e) == 0, "%s", e.msg);
    CHECK_MSG(!memcmp(la, ma, sizeof(float) * (size_t)(nA * V)), "batch_inv: a prompt span's logits move with its neighbours");
    CHECK_MSG(!memcmp(lb, mb, sizeof(float) * (size_t)V), "batch_inv: a decode row's logits move with its neighbours");
    CHECK_MSG(!memcmp(lc, mc, sizeof(float) * (size_t)V), "batch_inv: a second decode row's logits move");
    CHECK_MSG(!memcmp(ld, md, sizeof(float) * (size_t)V), "batch_inv: a second prompt span's logits move");
    CHECK_MSG(kv_equal(&f, 0, 4, nA), "batch_inv: KV rows of the prompt span differ");
    CHECK_MSG(kv_equal(&f, 1, 5, pre + 1), "batch_inv: KV rows of the decode row differ");
    engine_point *xa = saved(&f, 4), *xb = saved(&f, 5), *xd = saved(&f, 7);
    points_equal(ea, xa, "batch_inv: end state of the prompt span");
    points_equal(eb, xb, "batch_inv: end state of the decode row");
    points_equal(ed, xd, "batch_inv: end state of the second prompt span");
    for (int i = 0; i < 3; i++) {
        engine_point tmp = *qa[i];
        tmp.hash = pa[i]->hash; /* same ids, other sequence: same provenance */
        points_equal(pa[i], &tmp, "batch_inv: a point of the prompt span");
    }
    /* a sequence twice in one call is an error, and nothing runs */
    engine_stats s0 = engine_get_stats(f.eng);
    engine_span dup[2] = {{.seq = 1, .ids = P, .n = 1}, {.seq = 1, .ids = P, .n = 1}};
    CHECK_MSG(engine_run(f.eng, dup, 2, &e) < 0, "batch_inv: the same sequence twice in one call was accepted");
    CHECK(engine_get_stats(f.eng).n_passes == s0.n_passes);
    engine_point *all[] = {pa[0], pa[1], pa[2], qa[0], qa[1], qa[2], ea, eb, ed, xa, xb, xd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) engine_point_free(f.eng, all[i]);
    free(la); free(lb); free(lc); free(ld); free(ma); free(mb); free(mc); free(md);
    free(A); free(D); free(P);
    fixture_close(&f);
}

/* ---- anchor ---- */
TEST(anchor) {
    fixture f;
    fixture_open(&f, "q4_k_m", 1200, 2);
    herr e;
    /* 81 -> 600 is longer than a pass (the cut spans cut it at 593, the anchored span's grid
     * too); 17 and 81 share a chunk; a mark sits inside a chunk and on an anchor */
    const int64_t n = 1100, anchors[] = {17, 81, 600, 1090}, marks[] = {17, 40, 600, 700, 1100};
    const int na = 4, nm = 5;
    const int64_t V = f.V;
    int32_t *ids = test_ids(n, V, 101);
    float *la = xmalloc(sizeof(float) * (size_t)(n * V)), *lb = xmalloc(sizeof(float) * (size_t)(n * V));
    engine_point *pa[5], *pb[5];
    for (int i = 0; i < nm; i++) pa[i] = point_new(&f), pb[i] = point_new(&f);
    /* the passes of the same span unanchored and unmarked (an engine may take more than
     * n / rows_per_pass where a pass returns fewer logits rows than the span wants) */
    engine_seq_clear(f.eng, 1);
    engine_stats u0 = engine_get_stats(f.eng);
    engine_span su = {.seq = 1, .ids = ids, .n = n, .want = ENGINE_LOGITS_ALL, .logits = lb};
    SETUP(engine_run(f.eng, &su, 1, &e) == 0, "%s", e.msg);
    const int64_t plain = engine_get_stats(f.eng).n_passes - u0.n_passes;
    const int64_t rpp = engine_get_info(f.eng).rows_per_pass;
    CHECK_MSG(plain >= (n + rpp - 1) / rpp, "anchor: %lld rows in %lld passes of at most %lld rows", (long long)n,
              (long long)plain, (long long)rpp);
    engine_seq_clear(f.eng, 0);
    engine_stats s0 = engine_get_stats(f.eng);
    engine_span sa = {.seq = 0, .ids = ids, .n = n, .marks = marks, .n_marks = nm, .points = pa, .anchors = anchors,
                      .n_anchors = na, .want = ENGINE_LOGITS_ALL, .logits = la};
    SETUP(engine_run(f.eng, &sa, 1, &e) == 0, "%s", e.msg);
    engine_stats s1 = engine_get_stats(f.eng);
    CHECK_MSG(s1.n_passes - s0.n_passes == plain, "anchor: %lld rows anchored ran %lld passes, unanchored %lld",
              (long long)n, (long long)(s1.n_passes - s0.n_passes), (long long)plain);
    /* the same rows as spans cut at the anchors, one call each */
    engine_seq_clear(f.eng, 1);
    for (int k = 0, mi = 0; k <= na; k++) {
        const int64_t a = k ? anchors[k - 1] : 0, b = k < na ? anchors[k] : n;
        int64_t rel[5];
        engine_point *pts[5];
        int cnt = 0;
        for (; mi < nm && marks[mi] <= b; mi++) rel[cnt] = marks[mi] - a, pts[cnt++] = pb[mi];
        engine_span sb = {.seq = 1, .ids = ids + a, .n = b - a, .marks = rel, .n_marks = cnt, .points = pts,
                          .want = ENGINE_LOGITS_ALL, .logits = lb + a * V};
        SETUP(engine_run(f.eng, &sb, 1, &e) == 0, "%s", e.msg);
    }
    int64_t bad = -1;
    for (int64_t r = 0; r < n && bad < 0; r++)
        if (memcmp(la + r * V, lb + r * V, sizeof(float) * (size_t)V)) bad = r;
    CHECK_MSG(bad < 0, "anchor: row %lld's logits differ between the anchored span and the cut spans", (long long)bad);
    CHECK_MSG(kv_equal(&f, 0, 1, n), "anchor: KV rows differ");
    for (int i = 0; i < nm; i++) {
        char what[96];
        snprintf(what, sizeof what, "anchor: the point at %lld", (long long)marks[i]);
        points_equal(pa[i], pb[i], what);
    }
    engine_point *ea = saved(&f, 0), *eb = saved(&f, 1);
    points_equal(ea, eb, "anchor: end state");
    /* resumed at the anchor 600, the rest as one span anchored at 1090 - 600 */
    const int64_t rest[] = {1090 - 600};
    CHECK_MSG(engine_restore(f.eng, 0, pa[2], &e) == 0, "anchor: restore at 600 refused: %s", e.msg);
    engine_span sr = {.seq = 0, .ids = ids + 600, .n = n - 600, .anchors = rest, .n_anchors = 1,
                      .want = ENGINE_LOGITS_ALL, .logits = la};
    SETUP(engine_run(f.eng, &sr, 1, &e) == 0, "%s", e.msg);
    CHECK_MSG(!memcmp(la, lb + 600 * V, sizeof(float) * (size_t)((n - 600) * V)),
              "anchor: resumed at an anchor, the rest differs from the cut spans");
    /* an anchor outside the span is an error */
    const int64_t out[] = {n};
    engine_span so = {.seq = 1, .ids = ids, .n = n, .anchors = out, .n_anchors = 1};
    engine_seq_clear(f.eng, 1);
    CHECK_MSG(engine_run(f.eng, &so, 1, &e) < 0, "anchor: an anchor at the span's end was accepted");
    printf("  anchor %s: %lld rows, %d anchors: logits of every row, KV, %d points and the end state equal the cut spans'\n",
           g_preset, (long long)n, na, nm);
    for (int i = 0; i < nm; i++) engine_point_free(f.eng, pa[i]), engine_point_free(f.eng, pb[i]);
    engine_point_free(f.eng, ea);
    engine_point_free(f.eng, eb);
    free(la); free(lb); free(ids);
    fixture_close(&f);
}

/* ---- accuracy ----
 * Band, relative RMS of a point's lanes (and rings) against the float64 reference's, on an
 * f32 file (no activation quantization, and no routing flips: test_engine checks that).
 * The rows entering a GDN layer come through <= 8 layers of f32 matmuls (K <= 1024: a
 * random walk of round-offs, sqrt(K) 2^-24 = 1.9e-6 each, in quadrature over ~4 stages a
 * layer: 1.1e-5 at the last GDN layer); the lane adds sums over <= 64 rows of a chunk
 * (sqrt(64) 2^-24 = 4.8e-7) carried forward with decay < 1, so the inputs' 1.1e-5 bounds
 * it; rings are raw projection rows, the same figure. Band 3e-5: that bound with a factor
 * of ~3 for expf/logf ulps in the gates and the chunk solve's conditioning. Measured (gate
 * output): 9.2e-7 lanes / 5.7e-7 rings on tiny, 2.1e-6 / 1.3e-6 on small, so the band is
 * 14-30x the spread; a ring handed over reversed (the mutant) moves lanes by 0.25. The band
 * assumes f32 KV rows too: f16 rows (HEARTH_GATES_KV=f16) round every key and value by up to
 * 2^-11, 60x the f32 steps above, so this gate opens its engine with f32 rows always (the
 * f16 attention's accuracy is test_cuda's attn_matches_ref, against float64 with its own
 * bound; the other gates, bit for bit, run on f16 rows when asked). */
#define ACC_BAND 3e-5

static double rel_fd(const float *a, const double *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

TEST(accuracy) {
    fixture f;
    g_kv_f32 = true;
    fixture_open(&f, "f32", 800, 1);
    g_kv_f32 = false;
    const int64_t n = 700, marks[] = {100, 512, 515, 600, 700};
    const int nm = 5;
    int32_t *ids = test_ids(n, f.V, 91);
    engine_point *pts[5];
    for (int i = 0; i < nm; i++) pts[i] = point_new(&f);
    seq_with_prefix(&f, 0, ids, 0);
    /* two calls, rows [0, 512) then [512, 700): on every engine (the CPU's passes are 512
     * rows, the GPU's 2,048) the second starts from the lanes and rings the first handed over */
    const int64_t cut = 512, rest[] = {marks[2] - cut, marks[3] - cut, marks[4] - cut};
    run1(&f, 0, ids, cut, marks, 2, pts, NULL);
    run1(&f, 0, ids + cut, n - cut, rest, 3, pts + 2, NULL);
    ref_model *rm = ref_model_new(f.m);
    ref_seq *rs = ref_seq_new(rm, n);
    const model_hparams *hp = &f.m->hp;
    double worst_lane = 0, worst_ring = 0;
    for (int64_t t = 0, mi = 0; t < n; t++) {
        ref_step(rs, ids[t], NULL);
        if (t + 1 != marks[mi]) continue;
        int64_t g = 0;
        for (int il = 0; il < hp->n_layer; il++) {
            if (!hp->is_recurrent[il]) continue;
            const engine_point *p = pts[mi];
            double rl = rel_fd(p->lanes + (size_t)g * p->lane_floats, ref_seq_lane(rs, il), p->lane_floats);
            double rr = rel_fd(p->rings + (size_t)g * p->ring_floats, ref_seq_ring(rs, il), p->ring_floats);
            worst_lane = rl > worst_lane ? rl : worst_lane;
            worst_ring = rr > worst_ring ? rr : worst_ring;
            CHECK_MSG(rl <= ACC_BAND, "accuracy: point at %lld, layer %d: lane rel %.3e > band %.0e", (long long)marks[mi], il,
                      rl, ACC_BAND);
            CHECK_MSG(rr <= ACC_BAND, "accuracy: point at %lld, layer %d: ring rel %.3e > band %.0e", (long long)marks[mi], il,
                      rr, ACC_BAND);
            g++;
        }
        if (++mi == nm) break;
    }
    printf("  accuracy %s: points against the float64 reference: worst lane rel %.2e, ring rel %.2e (band %.0e)\n", g_preset,
           worst_lane, worst_ring, ACC_BAND);
    ref_seq_free(rs);
    ref_model_free(rm);
    for (int i = 0; i < nm; i++) engine_point_free(f.eng, pts[i]);
    free(ids);
    fixture_close(&f);
}

int main(int argc, char **argv) {
    static const char *gates[] = {"delta_rows_snap", "q_mark", "resume", "stale", "k_keep", "batch_inv", "anchor", "accuracy"};
    if (argc != 3) {
        fprintf(stderr, "usage: gates GATE|all PRESET (tiny, small, wide)\n");
        return 2;
    }
    g_preset = argv[2];
    const char *g = argv[1];
    bool all = !strcmp(g, "all"), any = false;
    void (*fns[])(void) = {delta_rows_snap, q_mark, resume, stale, k_keep, batch_inv, anchor, accuracy};
    for (size_t i = 0; i < sizeof gates / sizeof gates[0]; i++)
        if (all || !strcmp(g, gates[i])) {
            harness_cur_failed = 0;
            harness_skip_why = NULL;
            fns[i]();
            if (harness_cur_failed) { harness_failed++; printf("FAIL %s (%d checks)\n", gates[i], harness_cur_failed); }
            else { harness_passed++; printf("ok   %s\n", gates[i]); }
            any = true;
        }
    if (!any) { fprintf(stderr, "gates: unknown gate '%s'\n", g); return 2; }
    test_models_cleanup();
    return harness_done();
}
