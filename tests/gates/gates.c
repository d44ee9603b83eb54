/* gates.c: the marked-prefill gates of DESIGN.md, one program: `gates GATE PRESET`.
 *   delta_rows_snap  each point equals, bit for bit, the lane and ring a prefill of rows
 *                    [0, m) leaves from the same start state
 *   q_mark           marks move none of the pass's bits; the point at n is the end state; a
 *                    point does not depend on the other marks of its pass
 *   q_mark_cut       1024 ids marked at 700 and 1017: restore, continue twice (same bits),
 *                    4 teacher-forced tokens within a derived band of the stepped run
 *   k_keep           an unmarked call runs as before; a marked call is one pass
 * Exit 0 when the gate holds, 1 when it does not (each failure printed). The mutant runner
 * (tests/gates/mutants) runs these under HEARTH_MUTANT=... and expects exit 1. */
#include "unit/harness.h"
#include "unit/models.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/cpu/cpu.h"

#include <math.h>

static const char *g_preset;


typedef struct fixture {
    model *m;
    engine *eng;
    int64_t V;
} fixture;

static bool fixture_open(fixture *f, const char *quant, int64_t n_ctx) {
    herr e;
    if (model_load(&f->m, test_model(g_preset, quant), &e) < 0) { CHECK_MSG(0, "%s", e.msg); return false; }
    engine_opts eo = {.n_threads = 2, .n_ctx = n_ctx};
    if (engine_open_cpu(&f->eng, f->m, &eo, &e) < 0) { CHECK_MSG(0, "%s", e.msg); return false; }
    f->V = f->m->hp.n_vocab;
    return true;
}

static void fixture_close(fixture *f) {
    engine_free(f->eng);
    model_free(f->m);
}

/* a new sequence holding `prefix` rows of ids (the gate's start state) */
static seq *seq_with_prefix(fixture *f, const int32_t *ids, int64_t prefix) {
    herr e;
    seq *s = engine_seq_new(f->eng, &e);
    if (prefix > 0) CHECK(engine_prefill(f->eng, s, ids, prefix, NULL, 0, NULL, NULL, false, &e) == 0);
    return s;
}

static bool points_equal(const point *a, const point *b, const char *what) {
    bool lanes = !memcmp(a->lanes, b->lanes, sizeof(float) * a->lane_floats * (size_t)a->n_gdn);
    bool rings = !memcmp(a->rings, b->rings, sizeof(float) * a->ring_floats * (size_t)a->n_gdn);
    CHECK_MSG(a->pos == b->pos, "%s: position %lld vs %lld", what, (long long)a->pos, (long long)b->pos);
    CHECK_MSG(lanes, "%s: lanes differ", what);
    CHECK_MSG(rings, "%s: rings differ", what);
    return lanes && rings && a->pos == b->pos;
}

/* ---- delta_rows_snap ---- */
static void snap_case(fixture *f, const int32_t *ids, int64_t prefix, int64_t n, const int64_t *marks, int n_marks,
                      const char *name) {
    herr e;
    point *pts = xcalloc((size_t)n_marks, sizeof(point));
    for (int i = 0; i < n_marks; i++) point_alloc(&pts[i], &f->m->hp);
    seq *s = seq_with_prefix(f, ids, prefix);
    CHECK(engine_prefill(f->eng, s, ids + prefix, n, marks, n_marks, pts, NULL, false, &e) == 0);
    for (int i = 0; i < n_marks; i++) {
        seq *r = seq_with_prefix(f, ids, prefix);
        CHECK(engine_prefill(f->eng, r, ids + prefix, marks[i], NULL, 0, NULL, NULL, false, &e) == 0);
        point want;
        point_alloc(&want, &f->m->hp);
        engine_snapshot(f->eng, r, &want);
        char what[160];
        snprintf(what, sizeof what, "delta_rows_snap %s: mark %lld of a %lld-row call after %lld rows", name,
                 (long long)marks[i], (long long)n, (long long)prefix);
        points_equal(&pts[i], &want, what);
        point_free(&want);
        engine_seq_free(f->eng, r);
    }
    engine_seq_free(f->eng, s);
    for (int i = 0; i < n_marks; i++) point_free(&pts[i]);
    free(pts);
}

TEST(delta_rows_snap) {
    fixture f;
    if (!fixture_open(&f, "q4_k_m", 1200)) return;
    int32_t *ids = test_ids(1100, f.V, 21);
    /* chunks of 64 rows laid from the call's start */
    { int64_t m[] = {64}; snap_case(&f, ids, 0, 200, m, 1, "on a chunk boundary"); }
    { int64_t m[] = {63}; snap_case(&f, ids, 0, 200, m, 1, "one before a boundary"); }
    { int64_t m[] = {65}; snap_case(&f, ids, 0, 200, m, 1, "one after a boundary"); }
    { int64_t m[] = {1}; snap_case(&f, ids, 0, 200, m, 1, "m = 1"); }
    { int64_t m[] = {200}; snap_case(&f, ids, 0, 200, m, 1, "m = n"); }
    { int64_t m[] = {70, 75, 100, 127}; snap_case(&f, ids, 0, 200, m, 4, "several in one chunk"); }
    { int64_t m[] = {3, 197}; snap_case(&f, ids, 0, 200, m, 2, "first and last chunk"); }
    { int64_t m[] = {2, 64, 130}; snap_case(&f, ids, 37, 150, m, 3, "non-zero start state"); }
    { int64_t m[] = {1, 511, 512, 513, 700}; snap_case(&f, ids, 5, 720, m, 5, "across the 512-row batch"); }
    /* Positions are int64_t end to end (engine.h, point.pos, the KV index), never 32-bit:
     * the case of a call starting past 2^31 does not arise. */
    free(ids);
    fixture_close(&f);
}

/* ---- q_mark ---- */
typedef struct pass_out {
    float *logits;
    int32_t top;
    point end;
    seq *s;
} pass_out;

static void run_pass(fixture *f, const int32_t *ids, int64_t prefix, int64_t n, const int64_t *marks, int n_marks,
                     point *pts, pass_out *o) {
    herr e;
    o->logits = xmalloc(sizeof(float) * (size_t)f->V);
    o->s = seq_with_prefix(f, ids, prefix);
    CHECK(engine_prefill(f->eng, o->s, ids + prefix, n, marks, n_marks, pts, o->logits, false, &e) == 0);
    o->top = sampler_argmax(o->logits, f->V);
    point_alloc(&o->end, &f->m->hp);
    engine_snapshot(f->eng, o->s, &o->end);
}

static void pass_free(fixture *f, pass_out *o) {
    free(o->logits);
    point_free(&o->end);
    engine_seq_free(f->eng, o->s);
}

static bool kv_equal(fixture *f, const seq *a, const seq *b, int64_t rows) {
    const model_hparams *hp = &f->m->hp;
    size_t row = (size_t)(hp->n_head_kv * hp->head_dim) * (a->kv_f16 ? 2 : 4);
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->is_recurrent[il]) continue;
        if (memcmp(a->k[il], b->k[il], row * (size_t)rows) || memcmp(a->v[il], b->v[il], row * (size_t)rows)) return false;
    }
    return true;
}

TEST(q_mark) {
    fixture f;
    if (!fixture_open(&f, "q4_k_m", 800)) return;
    const int64_t prefix = 9, n = 600;
    int32_t *ids = test_ids(prefix + n, f.V, 33);
    int64_t marks[] = {1, 63, 64, 65, 300, 512, 513, 599, 600};
    const int nm = 9;
    point pts[9];
    for (int i = 0; i < nm; i++) point_alloc(&pts[i], &f.m->hp);
    pass_out plain, marked;
    run_pass(&f, ids, prefix, n, NULL, 0, NULL, &plain);
    run_pass(&f, ids, prefix, n, marks, nm, pts, &marked);
    CHECK_MSG(plain.top == marked.top, "q_mark: chosen token %d vs %d", plain.top, marked.top);
    CHECK_MSG(!memcmp(plain.logits, marked.logits, sizeof(float) * (size_t)f.V), "q_mark: last logits row differs");
    CHECK_MSG(kv_equal(&f, plain.s, marked.s, prefix + n), "q_mark: KV rows differ");
    points_equal(&plain.end, &marked.end, "q_mark: end state with and without marks");
    points_equal(&pts[nm - 1], &plain.end, "q_mark: the point at n against the end state");
    /* a point does not depend on the other marks of its pass */
    for (int i = 0; i < nm; i++) {
        point alone;
        point_alloc(&alone, &f.m->hp);
        pass_out o;
        run_pass(&f, ids, prefix, n, &marks[i], 1, &alone, &o);
        char what[96];
        snprintf(what, sizeof what, "q_mark: point %lld alone vs with the others", (long long)marks[i]);
        points_equal(&alone, &pts[i], what);
        point_free(&alone);
        pass_free(&f, &o);
    }
    for (int i = 0; i < nm; i++) point_free(&pts[i]);
    pass_free(&f, &plain);
    pass_free(&f, &marked);
    free(ids);
    fixture_close(&f);
}

/* ---- q_mark_cut ---- */

/* Band for a restored point + 4 stepped tokens against the all-stepped run, on an f32
 * file: the point came out of a chunked pass, the stepped run is sequential; they differ
 * by f32 summation order only: ~2^-24 * sqrt(S * C) = 5.4e-6 per state entry, carried
 * through <= 8 layers and 1024 rows as in tests/unit/test_engine.c: 1e-3. */
#define CUT_BAND 1e-3

TEST(q_mark_cut) {
    fixture f;
    if (!fixture_open(&f, "f32", 1100)) return;
    herr e;
    const int64_t n = 1024, T = 4;
    const int64_t marks[] = {700, 1017};
    const int64_t NL = f.m->hp.n_layer, K = f.m->hp.n_expert_used;
    int32_t *ids = test_ids(n + T, f.V, 55);
    point pts[2];
    for (int i = 0; i < 2; i++) point_alloc(&pts[i], &f.m->hp);
    seq *s = engine_seq_new(f.eng, &e);
    CHECK(engine_prefill(f.eng, s, ids, n, marks, 2, pts, NULL, false, &e) == 0);
    /* the stepped run: every row one step, logits and routes kept for the rows after each mark */
    float *step_lg = xmalloc(sizeof(float) * (size_t)(2 * T * f.V));
    int32_t *step_rt = xmalloc(sizeof(int32_t) * (size_t)(2 * T * NL * K));
    seq *r = engine_seq_new(f.eng, &e);
    float *lg = xmalloc(sizeof(float) * (size_t)f.V);
    for (int64_t t = 0; t < marks[1] + T; t++) {
        for (int mi = 0; mi < 2; mi++)
            if (t >= marks[mi] && t < marks[mi] + T) f.eng->route_trace = step_rt + ((mi * T) + (t - marks[mi])) * NL * K;
        CHECK(engine_step(f.eng, &r, &ids[t], 1, lg, &e) == 0);
        f.eng->route_trace = NULL;
        for (int mi = 0; mi < 2; mi++)
            if (t >= marks[mi] && t < marks[mi] + T)
                memcpy(step_lg + ((mi * T) + (t - marks[mi])) * f.V, lg, sizeof(float) * (size_t)f.V);
    }
    float *a = xmalloc(sizeof(float) * (size_t)(T * f.V)), *b = xmalloc(sizeof(float) * (size_t)(T * f.V));
    int32_t *rt = xmalloc(sizeof(int32_t) * (size_t)(NL * K));
    /* the later point first: resuming at 700 rewrites KV rows the 1017 point still needs */
    for (int mi = 1; mi >= 0; mi--) {
        int route_sites = 0;
        for (int rep = 0; rep < 2; rep++) {
            CHECK(engine_restore(f.eng, s, &pts[mi], &e) == 0);
            for (int64_t t = 0; t < T; t++) {
                f.eng->route_trace = rt;
                CHECK(engine_step(f.eng, &s, &ids[marks[mi] + t], 1, (rep ? b : a) + t * f.V, &e) == 0);
                f.eng->route_trace = NULL;
                if (rep == 0) {
                    const int32_t *want = step_rt + ((mi * T) + t) * NL * K;
                    for (int64_t i = 0; i < NL * K; i++) route_sites += rt[i] != want[i];
                }
            }
        }
        CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)(T * f.V)), "q_mark_cut: resuming at %lld twice gave different bits",
                  (long long)marks[mi]);
        double worst = 0;
        for (int64_t t = 0; t < T; t++) {
            double rel = rel_rms_ff(a + t * f.V, step_lg + ((mi * T) + t) * f.V, f.V);
            worst = rel > worst ? rel : worst;
        }
        printf("  q_mark_cut %s: resume at %lld: worst rel %.2e over %lld tokens (band %.0e), routed expert sites "
               "differing: %d of %lld\n",
               g_preset, (long long)marks[mi], worst, (long long)T, CUT_BAND, route_sites, (long long)(T * NL * K));
        CHECK_MSG(worst <= CUT_BAND, "q_mark_cut: resume at %lld: rel %.3e > band %.0e", (long long)marks[mi], worst,
                  CUT_BAND);
    }
    free(a); free(b); free(rt); free(lg); free(step_lg); free(step_rt);
    engine_seq_free(f.eng, s);
    engine_seq_free(f.eng, r);
    for (int i = 0; i < 2; i++) point_free(&pts[i]);
    free(ids);
    fixture_close(&f);
}

/* ---- k_keep ---- */
TEST(k_keep) {
    fixture f;
    if (!fixture_open(&f, "q4_k_m", 600)) return;
    herr e;
    const int64_t n = 300;
    int32_t *ids = test_ids(n, f.V, 77);
    engine_stats before = f.eng->stats;
    pass_out a, b;
    run_pass(&f, ids, 0, n, NULL, 0, NULL, &a);
    CHECK_MSG(f.eng->stats.n_passes - before.n_passes == 1, "k_keep: an unmarked call ran %lld passes",
              (long long)(f.eng->stats.n_passes - before.n_passes));
    CHECK_MSG(f.eng->stats.n_points == before.n_points, "k_keep: an unmarked call took points");
    int64_t marks[] = {10, 100, 299};
    point pts[3];
    for (int i = 0; i < 3; i++) point_alloc(&pts[i], &f.m->hp);
    before = f.eng->stats;
    run_pass(&f, ids, 0, n, marks, 3, pts, &b);
    CHECK_MSG(f.eng->stats.n_passes - before.n_passes == 1, "k_keep: a marked call ran %lld passes",
              (long long)(f.eng->stats.n_passes - before.n_passes));
    CHECK_MSG(f.eng->stats.n_prefill_calls - before.n_prefill_calls == 1, "k_keep: a marked call counted as %lld calls",
              (long long)(f.eng->stats.n_prefill_calls - before.n_prefill_calls));
    CHECK_MSG(f.eng->stats.n_points - before.n_points == 3, "k_keep: %lld points for 3 marks",
              (long long)(f.eng->stats.n_points - before.n_points));
    /* and an unmarked call after a marked one runs exactly as the first */
    pass_out c;
    run_pass(&f, ids, 0, n, NULL, 0, NULL, &c);
    CHECK_MSG(!memcmp(a.logits, c.logits, sizeof(float) * (size_t)f.V), "k_keep: an unmarked call changed after marks");
    points_equal(&a.end, &c.end, "k_keep: end state of unmarked calls");
    for (int i = 0; i < 3; i++) point_free(&pts[i]);
    pass_free(&f, &a);
    pass_free(&f, &b);
    pass_free(&f, &c);
    free(ids);
    (void)e;
    fixture_close(&f);
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[2], "tiny") && strcmp(argv[2], "small"))) {
        fprintf(stderr, "usage: gates delta_rows_snap|q_mark|q_mark_cut|k_keep|all tiny|small\n");
        return 2;
    }
    g_preset = argv[2];
    const char *g = argv[1];
    bool all = !strcmp(g, "all"), any = false;
    if (all || !strcmp(g, "delta_rows_snap")) { RUN(delta_rows_snap); any = true; }
    if (all || !strcmp(g, "q_mark")) { RUN(q_mark); any = true; }
    if (all || !strcmp(g, "q_mark_cut")) { RUN(q_mark_cut); any = true; }
    if (all || !strcmp(g, "k_keep")) { RUN(k_keep); any = true; }
    if (!any) { fprintf(stderr, "gates: unknown gate '%s'\n", g); return 2; }
    test_models_cleanup();
    return harness_done();
}
