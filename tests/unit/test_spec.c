/* test_spec.c: speculative decoding with the MTP block (src/engine/spec.h, engine_mtp_draft).
 *   - greedy: every token, and the logits row it was chosen from, equal the plain decode's bit
 *     for bit, and so do the sequence's state, KV rows (the block's too) and its next drafts
 *     after the run; with the block's own drafts (random weights: nearly all refused), with
 *     the true continuation replayed as drafts (all kept), and with every third one wrong;
 *     prompts that end inside and past a 64-row chunk, drafts 1..8 a step;
 *   - sampled: sampler_sample_draft's tokens are distributed as sampler_sample's (the bound
 *     derived at the test);
 *   - errors by name: a model without the block, an engine without it, bad arguments.
 * Planted defects (tests/gates/mutants): spec_no_anchors, spec_no_restore, mtp_h_last and
 * spec_residual_keeps_d each turn a check here red. */
#include "unit/harness.h"
#include "unit/models.h"
#include "engine/spec.h"
#include "ref/ref.h"

#include <math.h>

static const char *mtp_model(const char *quant) {
    static char paths[4][512];
    static int n;
    const char *dir = getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp";
    char want[512];
    snprintf(want, sizeof want, "%s/test-spec-tiny-%s-%d.gguf", dir, quant, (int)getpid());
    for (int i = 0; i < n; i++)
        if (!strcmp(paths[i], want)) return paths[i];
    gen_opts o = {.preset = "tiny", .seed = 1, .out_path = want, .mtp = true};
    herr e;
    if (gen_quant_parse(quant, &o.quant, &e) < 0 || gen_write(&o, NULL, &e) < 0) {
        fprintf(stderr, "mtp_model(%s): %s\n", quant, e.msg);
        exit(3);
    }
    snprintf(paths[n], sizeof paths[n], "%s", want);
    return paths[n++];
}

static engine *open_mtp(const model *m, herr *e) {
    engine *eng;
    engine_opts o = {.device = ENGINE_CPU, .n_threads = 2, .n_ctx = 512, .n_seq_max = 1, .mtp = true};
    if (engine_open(&eng, m, &o, e) < 0) return NULL;
    return eng;
}

#define N_GEN 40

/* The plain decode of N_GEN tokens: tokens and the logits row each came from */
static void plain(engine *eng, const int32_t *prompt, int64_t n_prompt, int32_t *tok, float *rows, herr *e) {
    const int64_t V = engine_get_info(eng).n_vocab;
    engine_seq_clear(eng, 0);
    CHECK(test_run(eng, 0, prompt, n_prompt, rows, ENGINE_LOGITS_LAST, e) == 0);
    for (int i = 0; i < N_GEN; i++) {
        tok[i] = sampler_argmax(rows + (size_t)i * (size_t)V, V);
        if (i + 1 < N_GEN) CHECK(test_run(eng, 0, &tok[i], 1, rows + (size_t)(i + 1) * (size_t)V, ENGINE_LOGITS_LAST, e) == 0);
    }
}

/* the sequence's state and KV rows as bytes (a point's lanes and rings, then the rows) */
static uint8_t *state_bytes(engine *eng, size_t *n, herr *e) {
    engine_point *p;
    engine_kv *kv;
    const int64_t pos = engine_seq_pos(eng, 0);
    if (engine_point_new(eng, &p, e) < 0 || engine_save(eng, 0, p, e) < 0 || engine_kv_read(eng, 0, 0, pos, &kv, e) < 0) return NULL;
    const size_t nl = sizeof(float) * (size_t)p->n_gdn * p->lane_floats, nr = sizeof(float) * (size_t)p->n_gdn * p->ring_floats;
    *n = nl + nr + kv->bytes;
    uint8_t *b = xmalloc(*n);
    memcpy(b, p->lanes, nl);
    memcpy(b + nl, p->rings, nr);
    memcpy(b + nl + nr, kv->data, kv->bytes);
    engine_point_free(eng, p);
    engine_kv_free(eng, kv);
    return b;
}

static void greedy_equals_plain(const char *quant) {
    herr e;
    model *m;
    if (model_load(&m, mtp_model(quant), &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    engine *eng = open_mtp(m, &e);
    if (!eng) { CHECK_MSG(0, "%s", e.msg); model_free(m); return; }
    const int64_t V = m->hp.n_vocab;
    const int64_t lens[] = {5, 70, 130}; /* inside the first 64-row chunk, past one, past two */
    float *want = xmalloc(sizeof(float) * (size_t)N_GEN * (size_t)V);
    int32_t want_tok[N_GEN], got[N_GEN + 8 + 1], replay[N_GEN];
    int n_runs = 0, n_kept = 0, n_refused = 0;
    for (int li = 0; li < 3; li++) {
        int32_t *prompt = test_ids(lens[li], V, 100 + (uint64_t)li);
        plain(eng, prompt, lens[li], want_tok, want, &e);
        size_t n_want;
        uint8_t *want_state = state_bytes(eng, &n_want, &e);
        int32_t want_drafts[4], got_drafts[4];
        CHECK(engine_mtp_draft(eng, 0, want_tok[N_GEN - 1], 4, want_drafts, NULL, &e) == 4);
        for (int mode = 0; mode < 3; mode++) /* the block's drafts; the true tokens; every third one wrong */
            for (int k = 1; k <= SPEC_MAX; k += (k < 3 ? 1 : k == 3 ? 2 : 3)) {
                for (int i = 0; i < N_GEN; i++) replay[i] = i % 3 == 2 && mode == 2 ? (want_tok[i] + 1) % (int32_t)V : want_tok[i];
                spec_ctx sc;
                sampler sm;
                sampler_init(&sm, &(sampler_opts){.temp = 0}, V);
                if (spec_init(&sc, eng, 0, k, &e) < 0) { CHECK_MSG(0, "%s", e.msg); break; }
                if (mode) sc.replay = replay, sc.n_replay = N_GEN;
                engine_seq_clear(eng, 0);
                float *row = xmalloc(sizeof(float) * (size_t)V);
                CHECK(test_run(eng, 0, prompt, lens[li], row, ENGINE_LOGITS_LAST, &e) == 0);
                int64_t n_out = 0;
                got[n_out++] = sampler_argmax(row, V);
                bool rows_equal = !memcmp(row, want, sizeof(float) * (size_t)V);
                while (n_out < N_GEN) {
                    const int g = spec_step(&sc, &sm, got[n_out - 1], n_out, (int)(N_GEN - n_out), got + n_out, &e);
                    if (g < 1) { CHECK_MSG(0, "spec_step: %s", e.msg); break; }
                    for (int i = 0; i < g; i++) /* token n_out + i came from the step's row i */
                        rows_equal &= !memcmp(sc.logits + (size_t)i * (size_t)V, want + (size_t)(n_out + i) * (size_t)V,
                                              sizeof(float) * (size_t)V);
                    n_out += g;
                }
                CHECK_MSG(n_out == N_GEN && !memcmp(got, want_tok, sizeof want_tok), "%s, prompt %lld, k %d, mode %d: tokens differ",
                          quant, (long long)lens[li], k, mode);
                CHECK_MSG(rows_equal, "%s, prompt %lld, k %d, mode %d: a token's logits differ from the plain decode's", quant,
                          (long long)lens[li], k, mode);
                size_t n_got;
                uint8_t *got_state = state_bytes(eng, &n_got, &e);
                CHECK_MSG(got_state && want_state && n_got == n_want && !memcmp(got_state, want_state, n_want),
                          "%s, prompt %lld, k %d, mode %d: the state or KV rows after the run differ", quant, (long long)lens[li], k,
                          mode);
                CHECK(engine_mtp_draft(eng, 0, want_tok[N_GEN - 1], 4, got_drafts, NULL, &e) == 4);
                CHECK_MSG(!memcmp(got_drafts, want_drafts, sizeof want_drafts),
                          "%s, prompt %lld, k %d, mode %d: the next drafts differ from the plain decode's", quant, (long long)lens[li],
                          k, mode);
                n_runs++, n_kept += (int)sc.n_accepted, n_refused += (int)(sc.n_drafted - sc.n_accepted);
                free(got_state);
                free(row);
                spec_free(&sc);
                sampler_free(&sm);
            }
        free(want_state);
        free(prompt);
    }
    printf("    %s: %d runs, %d drafts kept, %d refused\n", quant, n_runs, n_kept, n_refused);
    CHECK(n_kept > 0 && n_refused > 0); /* both paths ran */
    free(want);
    engine_free(eng);
    model_free(m);
}

TEST(spec_greedy_equals_plain_f32) { greedy_equals_plain("f32"); }
TEST(spec_greedy_equals_plain_q4_k_m) { greedy_equals_plain("q4_k_m"); }

/* sampler_sample_draft against the distribution p that sampler_sample draws from: logits of
 * 8 ids at temperature 0.8 with top-k 6 (so two ids have p = 0: the stages must be the
 * same), the draft d each candidate in turn and one cut by top-k. N = 400,000 draws a draft
 * (seeds 0..N-1). Each id's count c is Binomial(N, p) where the rule is right; the check
 * |c - N p| <= 5 sqrt(N p (1 - p)) + 1 holds with probability > 1 - 5.8e-7 an id (the normal
 * tail at 5 sigma, the +1 for the count's granularity), so a right rule fails it over the 7
 * drafts x 8 ids with probability < 3.3e-5; ids with p = 0 must never come. A rule off by
 * delta in an id's probability is caught once delta > 5 sqrt(p (1 - p) / N) <= 0.004: keeping
 * d in the residual (spec_residual_keeps_d) moves p(d) by p(d)(1 - p(d)) >= 0.04 here. */
TEST(spec_sampling_keeps_the_distribution) {
    const float logits[8] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f, 1.5f, -4.0f};
    const sampler_opts so = {.temp = 0.8f, .top_k = 6, .top_p = 1, .min_p = 0};
    /* p: the stages' survivors (top 6 by logit), softmax at temperature 0.8, in double */
    double p[8] = {0}, sum = 0;
    for (int i = 0; i < 8; i++) {
        int above = 0;
        for (int j = 0; j < 8; j++) above += logits[j] > logits[i];
        if (above < 6) p[i] = exp((double)logits[i] / 0.8), sum += p[i];
    }
    for (int i = 0; i < 8; i++) p[i] /= sum;
    const int N = 400000;
    const int32_t drafts[] = {3, 6, 0, 1, 4, 2, 5}; /* 5: cut by top-k, p = 0 */
    for (size_t di = 0; di < sizeof drafts / sizeof drafts[0]; di++) {
        int64_t count[8] = {0}, kept = 0;
        for (int s = 0; s < N; s++) {
            sampler sm;
            sampler_opts o = so;
            o.seed = (uint64_t)s * 7919u + di;
            sampler_init(&sm, &o, 8);
            bool acc;
            const int32_t t = sampler_sample_draft(&sm, logits, drafts[di], &acc);
            count[t]++;
            kept += acc;
            CHECK(acc == (t == drafts[di]));
            sampler_free(&sm);
        }
        for (int i = 0; i < 8; i++) {
            const double mean = N * p[i], sd = sqrt(N * p[i] * (1 - p[i]));
            CHECK_MSG(fabs((double)count[i] - mean) <= 5 * sd + 1, "draft %d: id %d came %lld times, expected %.1f +- %.1f", drafts[di], i,
                      (long long)count[i], mean, 5 * sd + 1);
        }
        CHECK_MSG(kept == count[drafts[di]], "draft %d: %lld kept, %lld drawn", drafts[di], (long long)kept, (long long)count[drafts[di]]);
    }
    /* greedy: the argmax, kept only where it is the draft */
    sampler sm;
    sampler_init(&sm, &(sampler_opts){.temp = 0}, 8);
    bool acc;
    CHECK(sampler_sample_draft(&sm, logits, 3, &acc) == 3 && acc);
    CHECK(sampler_sample_draft(&sm, logits, 6, &acc) == 3 && !acc);
    sampler_free(&sm);
}

TEST(spec_errors_by_name) {
    herr e;
    model *m;
    if (model_load(&m, test_model("tiny", "f32"), &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    engine *eng;
    engine_opts o = {.device = ENGINE_CPU, .n_threads = 2, .n_ctx = 64, .mtp = true};
    CHECK(engine_open(&eng, m, &o, &e) < 0 && strstr(e.msg, "--spec-mtp") && strstr(e.msg, "no MTP block"));
    o.mtp = false;
    if (engine_open(&eng, m, &o, &e) < 0) { CHECK_MSG(0, "%s", e.msg); model_free(m); return; }
    int32_t d[4];
    CHECK(engine_mtp_draft(eng, 0, 1, 4, d, NULL, &e) < 0 && strstr(e.msg, "without the MTP block"));
    spec_ctx sc;
    CHECK(spec_init(&sc, eng, 0, 2, &e) < 0 && strstr(e.msg, "--spec-mtp"));
    engine_free(eng);
    model_free(m);
    if (model_load(&m, mtp_model("f32"), &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    if (!(eng = open_mtp(m, &e))) { CHECK_MSG(0, "%s", e.msg); model_free(m); return; }
    CHECK(engine_mtp_draft(eng, 0, -1, 4, d, NULL, &e) < 0 && strstr(e.msg, "outside the vocabulary"));
    CHECK(engine_mtp_draft(eng, 0, 1, 0, d, NULL, &e) < 0 && strstr(e.msg, "at least 1"));
    CHECK(engine_mtp_draft(eng, 3, 1, 1, d, NULL, &e) < 0 && strstr(e.msg, "does not exist"));
    CHECK(spec_init(&sc, eng, 0, SPEC_MAX + 1, &e) < 0 && strstr(e.msg, "--spec-mtp"));
    /* the context's end: drafts stop there */
    int32_t *ids = test_ids(510, m->hp.n_vocab, 7);
    CHECK(test_run(eng, 0, ids, 510, NULL, ENGINE_LOGITS_NONE, &e) == 0);
    CHECK(engine_mtp_draft(eng, 0, 1, 4, d, NULL, &e) == 2);
    free(ids);
    engine_free(eng);
    model_free(m);
}

/* The block against the float64 reference (tests/ref: ref_mtp_row), tiny f32: a 12-row
 * prompt in one pass (the block's KV rows made beside it), then 3 drafts from the trunk's
 * greedy token, each row's logits against the reference's fed the same tokens. Band: f32
 * round-off, as test_engine's BAND_F32 derives it: ~sqrt(K) 2^-24 <= 1.9e-6 a stage (K <=
 * 1024), stages adding in quadrature; draft i's logits passed through 4 stages a trunk layer
 * (L), eh_proj, the block's 4 and the output matrix, and 5 more a draft before it (the chain
 * goes through h): band_i = sqrt(4 L + 6 + 5 i) 1.9e-6 (tiny: 8.9e-6 .. 1.1e-5). A top-1
 * disagreement only counts where the reference's margin exceeds 4 sqrt(2) band_i rms. The
 * defects it must see: the embedding and h halves swapped (mtp_swap), the block's KV rows of
 * the pass not made (mtp_kv_skip). */
TEST(mtp_matches_reference) {
    herr e;
    model *m;
    if (model_load(&m, mtp_model("f32"), &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    engine *eng = open_mtp(m, &e);
    if (!eng) { CHECK_MSG(0, "%s", e.msg); model_free(m); return; }
    const int64_t V = m->hp.n_vocab, E = m->hp.n_embd, n = 12, L = m->hp.n_layer;
    int32_t *ids = test_ids(n, V, 31);
    float *row = xmalloc(sizeof(float) * (size_t)V), *dl = xmalloc(sizeof(float) * (size_t)(3 * V));
    CHECK(test_run(eng, 0, ids, n, row, ENGINE_LOGITS_LAST, &e) == 0);
    const int32_t t = sampler_argmax(row, V);
    int32_t d[3];
    CHECK(engine_mtp_draft(eng, 0, t, 3, d, dl, &e) == 3);
    ref_model *rm = ref_model_new(m);
    ref_seq *rs = ref_seq_new(rm, 64);
    double *hp = xcalloc((size_t)E, sizeof(double)), *hc = xmalloc(sizeof(double) * (size_t)E);
    double *rl = xmalloc(sizeof(double) * (size_t)V);
    for (int64_t p = 0; p < n; p++) {
        ref_mtp_row(rs, p, ids[p], p ? hp : NULL, NULL, NULL);
        ref_step(rs, ids[p], p == n - 1 ? rl : NULL);
        ref_seq_head_input(rs, hp);
    }
    CHECK_MSG(rel_rms_fd(row, rl, V) <= 1.1e-5, "the trunk's last logits: rel %.2e", rel_rms_fd(row, rl, V));
    int32_t tok = t;
    for (int i = 0; i < 3; i++) {
        ref_mtp_row(rs, n + i, tok, hp, hc, rl);
        const double band = sqrt((double)(4 * L + 6 + 5 * i)) * 1.9e-6, rel = rel_rms_fd(dl + (size_t)i * (size_t)V, rl, V);
        double ms = 0, second = -INFINITY;
        const int64_t b = argmax_d(rl, V);
        for (int64_t j = 0; j < V; j++) ms += rl[j] * rl[j], second = j != b && rl[j] > second ? rl[j] : second;
        printf("    draft %d: rel %.2e (band %.2e), top-1 %s\n", i, rel, band, b == d[i] ? "equal" : "differs");
        CHECK_MSG(rel <= band, "draft %d: logits rel rms %.3e against the reference > band %.2e", i, rel, band);
        CHECK_MSG(b == d[i] || rl[b] - second < 4 * sqrt(2.0) * band * sqrt(ms / (double)V), "draft %d: top-1 %d, the reference's %lld",
                  i, d[i], (long long)b);
        tok = d[i];
        memcpy(hp, hc, sizeof(double) * (size_t)E);
    }
    free(hp), free(hc), free(rl), free(row), free(dl), free(ids);
    ref_seq_free(rs);
    ref_model_free(rm);
    engine_free(eng);
    model_free(m);
}

/* argv[1], where given: only the tests whose names hold it (the mutant runner's defects each
 * need one of them) */
static const char *only;
#define RUN_ONLY(name) do { if (!only || strstr(#name, only)) RUN(name); } while (0)

int main(int argc, char **argv) {
    only = argc > 1 ? argv[1] : NULL;
    RUN_ONLY(spec_greedy_equals_plain_f32);
    RUN_ONLY(spec_greedy_equals_plain_q4_k_m);
    RUN_ONLY(spec_sampling_keeps_the_distribution);
    RUN_ONLY(spec_errors_by_name);
    RUN_ONLY(mtp_matches_reference);
    const char *dir = getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp";
    const char *quants[] = {"f32", "q4_k_m"};
    for (int i = 0; i < 2; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/test-spec-tiny-%s-%d.gguf", dir, quants[i], (int)getpid());
        unlink(p);
    }
    test_models_cleanup();
    return harness_done();
}
