/* test_engine.c: the CPU engine against the float64 reference (tests/ref), batched
 * prompts against token-by-token steps, and determinism across runs and thread counts,
 * on the tiny and small presets at f32, q8_0 and q4_k_m; with --wide, on the wide preset
 * (every width of Qwen3.6-35B-A3B, 4 layers) at q4_k_m, which tests/cli/wide.sh writes. */
#include "harness.h"
#include "models.h"
#include "ref/ref.h"
#include "engine/engine.h"
#include "engine/debug.h"
#include "engine/sampler.h"

#include <math.h>
#include <pthread.h>

/* prompt lengths whose last row is compared with the reference: one row, a GDN chunk
 * (64) and its neighbours, a few chunks, and past one pass (512 rows); and the ones run
 * token by token as well */
static const int64_t lengths_toy[] = {1, 5, 63, 64, 65, 130, 700, 0};
static const int64_t stepped_toy[] = {5, 65, 130, 0};
/* At the real widths a reference row costs ~0.23 s (240M multiply-adds of float weights
 * read from memory, plus the 248,320-row vocabulary head, 0.9 s, where logits are
 * wanted), so the rows stop just past the first pass boundary: 513 rows, two reference
 * sequences on two threads, ~2 minutes. 2,048-row prompts run in wide.sh and in the
 * thread-count check below, without the reference. */
static const int64_t lengths_wide[] = {1, 63, 64, 65, 512, 513, 0};
static const int64_t stepped_wide[] = {65, 0};

static bool in_list(const int64_t *list, int64_t n) {
    for (; *list; list++) if (*list == n) return true;
    return false;
}

static bool in_set(const int32_t *set, int64_t n, int32_t x) {
    for (int64_t i = 0; i < n; i++) if (set[i] == x) return true;
    return false;
}
/* the gap between the best and the second-best logit: a top-1 disagreement inside the band
 * is only a failure when the reference's margin is larger than the band allows */
static double top_margin(const double *x, int64_t n) {
    int64_t b = argmax_d(x, n);
    double second = -INFINITY;
    for (int64_t i = 0; i < n; i++) if (i != b && x[i] > second) second = x[i];
    return x[b] - second;
}

static double rms_d(const double *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] * x[i];
    return sqrt(s / (double)n);
}

/* Bands, relative RMS of the logits against the reference.
 * f32 files: weights and activations stay f32; a dot of length K <= 1024 rounds with
 * relative error at most ~ sqrt(K) * 2^-24 = 1.9e-6 (a random walk of round-offs, before
 * the lane-wise partial sums shorten it), and a token's logits pass through ~4 such stages
 * per layer (mixer in/out, FFN in/out) over L <= 8 layers, adding in quadrature:
 * sqrt(4*8+1) * 1.9e-6 = 1.1e-5. The recurrent state does not add to it: the decay bounds
 * how far back an error reaches (measured: 1.3e-6 at 700 rows as at 1). Measured on tiny and
 * small: 3.0e-7 .. 1.6e-6, so the band sits 7x above the worst. */
#define BAND_F32 1.1e-5
/* Batched against stepped runs of the same engine (a step is a chunk of one row): the
 * delta rule's summation order differs, the same f32 round-off per stage: the same band
 * (measured 1.1e-6 .. 1.3e-6). */
#define BAND_STEP_F32 1.1e-5
/* Quantized files: every matrix input is rounded to 8-bit blocks (Q8_K, Q8_0). Any f32
 * difference moves an element across a rounding step now and then, and that step (~3% of
 * the row's rms) moves the next stage's inputs across more steps: within a few stages any
 * two arithmetics that differ at all reach the full rounding noise, 2-5% of the logits. No
 * fixed band separates that from a defect of the same size (a ring reversal measured 4-6%).
 * So the noise is measured, not guessed: a second reference sequence rounds its inputs as
 * the engine does (ref_seq_round_activations), an independent draw of the same noise.
 *  - Where no step is crossed, the rounded reference and the engine are the same function:
 *    one-row prompts agree to BAND_F32 (measured 4e-8 .. 4e-7); a row where some element
 *    lay within f32 round-off of a step jumps to the full noise, and the more elements a
 *    row rounds, the likelier that is (measured: 1 and 4 of 16 rows on tiny, 9 of 16 on
 *    small q8_0). A defect in any one-row path moves every row, so at least ROW0_EXACT of
 *    the 16 must agree: at a hit rate of 9/16, 15 or 16 hits have probability 1.4e-3.
 *  - Longer prompts: the engine's distance to the double reference and the rounded
 *    reference's are two draws of one noise; their ratio measured 0.86 .. 1.12 over 28
 *    (file, length) pairs (|log| <= 0.15). RATIO_Q = 1.3 (|log| 0.26, 1.75x the widest). An
 *    added error of a times the noise gives sqrt(1 + a^2): red from a = 0.83 on.
 *  - Batched against stepped: two draws against each other, sqrt(2) times one draw's noise
 *    (the rounded reference's, at its worst length) times RATIO_Q. */
#define RATIO_Q 1.3
#define ROW0_PROMPTS 16
#define ROW0_EXACT 2
/* An engine that keeps its matrix inputs f32 (engine_info.act_f32: the CUDA engine) rounds
 * nothing but f32 arithmetic, on quantized files as on f32 ones: its bands are BAND_F32 and
 * BAND_STEP_F32 whatever the file, and all ROW0_PROMPTS one-row prompts must agree with the
 * unrounded reference within BAND_F32 (measured on the H200: 2.4e-7 .. 1.4e-6 at every
 * length of tiny and small, f32, q8_0 and q4_k_m). */

/* One reference sequence over ids[0..N), routed as the engine routed (routes: N x L x K):
 * its logits at each of lengths' rows, and per (row, layer) its router probabilities (X)
 * and its own top-K. Each job has its own ref_model (its expert copies fill as it runs),
 * so two run on two threads. */
typedef struct {
    const model *m;
    const int32_t *ids, *routes;
    int64_t N;
    const int64_t *lengths;
    bool round;        /* round matrix inputs as the engine does */
    double *logits;    /* V per length */
    double *probs;     /* N x L x X */
    int32_t *own;      /* N x L x K */
} ref_job;

static void *ref_job_run(void *arg) {
    ref_job *j = arg;
    const model_hparams *hp = &j->m->hp;
    const int64_t V = hp->n_vocab, NL = hp->n_layer, K = hp->n_expert_used, X = hp->n_expert;
    ref_model *rm = ref_model_new(j->m);
    ref_seq *rs = ref_seq_new(rm, j->N);
    ref_seq_round_activations(rs, j->round);
    for (int64_t t = 0, li = 0; t < j->N; t++) {
        const bool want = t + 1 == j->lengths[li];
        ref_seq_force_experts(rs, j->routes + t * NL * K);
        ref_step(rs, j->ids[t], want ? j->logits + li * V : NULL);
        for (int il = 0; il < NL; il++) {
            memcpy(j->probs + (t * NL + il) * X, ref_seq_router_probs(rs, il), sizeof(double) * (size_t)X);
            memcpy(j->own + (t * NL + il) * K, ref_seq_own_experts(rs, il), sizeof(int32_t) * (size_t)K);
        }
        li += want;
    }
    ref_seq_free(rs);
    ref_model_free(rm);
    return NULL;
}

/* lengths and stepped: 0-terminated, ascending; the last length is the longest prompt */
static void check_file(const char *preset, const char *quant, const int64_t *lengths, const int64_t *stepped) {
    const char *path = test_model(preset, quant);
    herr e;
    model *m;
    if (model_load(&m, path, &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    size_t N_LEN = 0;
    while (lengths[N_LEN]) N_LEN++;
    const int64_t V = m->hp.n_vocab, N = lengths[N_LEN - 1];
    const int64_t NL = m->hp.n_layer, K = m->hp.n_expert_used, X = m->hp.n_expert;
    int32_t *ids = test_ids(N, V, 7);

    /* the engine: one pass over all N rows, every row's logits and routes. A row's outputs
     * depend on the rows up to it only (chunks are laid from the call's start), so row n-1
     * of this pass is what a prefill of n rows returns (checked bit for bit below). */
    engine *eng;
    engine_opts eo = {.n_threads = 2, .n_ctx = N + 8, .n_seq_max = 2};
    if (engine_open(&eng, m, &eo, &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    float *all = xmalloc(sizeof(float) * (size_t)(N * V));
    int32_t *routes = xmalloc(sizeof(int32_t) * (size_t)(N * NL * K));
    engine_debug_route_trace(eng, routes);
    CHECK(test_run(eng, 0, ids, N, all, ENGINE_LOGITS_ALL, &e) == 0);
    engine_debug_route_trace(eng, NULL);

    /* the reference, routed as the engine routed, so the logits compare arithmetic only;
     * its own choices are counted as flips and each must be a near-tie. On quantized files a
     * second reference sequence rounds its matrix inputs to 8 bits as the engine does (same
     * routes): its distance from the first is a measured draw of the rounding noise that the
     * engine's distance is held to, and its router log-probabilities say how far that noise
     * moves a router logit. */
    const bool quantized = strcmp(quant, "f32") != 0;
    const bool rounds = quantized && !engine_get_info(eng).act_f32; /* the engine rounds its matrix inputs */
    printf("  %s %s on the %s engine%s\n", preset, quant, engine_get_info(eng).backend,
           quantized && !rounds ? " (f32 matrix inputs: the f32 bands)" : "");
    ref_job jobs[2];
    for (int k = 0; k < 2; k++)
        jobs[k] = (ref_job){.m = m, .ids = ids, .routes = routes, .N = N, .lengths = lengths, .round = k == 1,
                            .logits = xmalloc(sizeof(double) * (size_t)(V * (int64_t)N_LEN)),
                            .probs = xmalloc(sizeof(double) * (size_t)(N * NL * X)),
                            .own = xmalloc(sizeof(int32_t) * (size_t)(N * NL * K))};
    pthread_t th;
    const bool threaded = quantized && pthread_create(&th, NULL, ref_job_run, &jobs[1]) == 0;
    ref_job_run(&jobs[0]);
    if (threaded) pthread_join(th, NULL);
    else if (quantized) ref_job_run(&jobs[1]);
    const double *ref_logits = jobs[0].logits, *rq_logits = jobs[1].logits;
    /* per (row, layer): the largest log-probability gap the engine's choice jumped (0: no flip) */
    double *gap = xcalloc((size_t)(N * NL), sizeof(double));
    double noise2[MODEL_MAX_LAYERS] = {0};             /* sum of squared router log-prob noise */
    int64_t flips = 0, q_flips = 0;
    for (int64_t t = 0; t < N; t++) {
        for (int64_t il = 0; il < NL; il++) {
            const int32_t *own = jobs[0].own + (t * NL + il) * K, *used = routes + (t * NL + il) * K;
            const double *p = jobs[0].probs + (t * NL + il) * X;
            double kth = 1;
            for (int64_t k = 0; k < K; k++) kth = p[own[k]] < kth ? p[own[k]] : kth;
            for (int64_t k = 0; k < K; k++) {
                if (in_set(own, K, used[k])) continue;
                /* the engine took used[k] over one of the reference's top-K */
                double g = log(kth) - log(p[used[k]]);
                gap[t * NL + il] = g > gap[t * NL + il] ? g : gap[t * NL + il];
            }
            flips += gap[t * NL + il] > 0;
            if (!quantized) continue;
            const double *pq = jobs[1].probs + (t * NL + il) * X;
            const int32_t *own_q = jobs[1].own + (t * NL + il) * K;
            bool q_flip = false;
            for (int64_t x = 0; x < X; x++) noise2[il] += (log(pq[x]) - log(p[x])) * (log(pq[x]) - log(p[x]));
            for (int64_t k = 0; k < K; k++) q_flip |= !in_set(own, K, own_q[k]);
            q_flips += q_flip;
        }
    }
    for (int k = 0; k < 2; k++) { free(jobs[k].probs); free(jobs[k].own); }
    int64_t far_flips = 0;
    double worst_gap_ratio = 0;
    for (int64_t il = 0; il < NL; il++) {
        /* a flip is a near-tie when the gap it jumped is within 4 sigma of the difference
         * of two router log-probabilities, each moved by the measured noise (rms delta_l):
         * tau_l = 4 * sqrt(2) * delta_l */
        const double tau = 4 * sqrt(2.0) * sqrt(noise2[il] / (double)(N * X));
        for (int64_t t = 0; t < N; t++) {
            if (gap[t * NL + il] == 0) continue;
            if (rounds) worst_gap_ratio = fmax(worst_gap_ratio, gap[t * NL + il] / tau);
            far_flips += !rounds || gap[t * NL + il] > tau;
        }
    }
    /* the flips themselves: the engine's and the rounded reference's counts are two draws of
     * one rate (measured 50/49, 67/66, 395/397, 692/676), so their difference has a spread
     * of about sqrt(2 * count); more than 4 of those (plus 4 for small counts) is too many
     * near-ties to excuse */
    const int64_t flip_cap = rounds ? q_flips + (int64_t)(4 * sqrt(2.0 * (double)q_flips)) + 4 : 0;
    printf("  %s %s: %lld of %lld (row, layer) routings differ from the reference's own (rounded reference: %lld, "
           "cap %lld); %lld beyond a near-tie (worst gap %.2f tau)\n", preset, quant, (long long)flips,
           (long long)(N * NL), (long long)q_flips, (long long)flip_cap, (long long)far_flips, worst_gap_ratio);
    CHECK_MSG(far_flips == 0, "%s %s: %lld routing differences are no near-ties", preset, quant, (long long)far_flips);
    CHECK_MSG(flips <= flip_cap, "%s %s: %lld routing differences, more than the %lld excused", preset, quant,
              (long long)flips, (long long)flip_cap);
    free(gap);

    float *lg = xmalloc(sizeof(float) * (size_t)V);
    if (quantized) { /* one-row prompts: the engine against the reference rounded as it rounds */
        double *lq = xmalloc(sizeof(double) * (size_t)V);
        int32_t *rt = xmalloc(sizeof(int32_t) * (size_t)(NL * K));
        ref_model *rm = ref_model_new(m);
        int exact = 0;
        double worst_exact = 0;
        for (int k = 0; k < ROW0_PROMPTS; k++) {
            const int32_t id = ids[(k * 37) % N];
            ref_seq *r1 = ref_seq_new(rm, 1);
            ref_seq_round_activations(r1, rounds);
            engine_seq_clear(eng, 0);
            engine_debug_route_trace(eng, rt);
            CHECK(test_run(eng, 0, &id, 1, lg, ENGINE_LOGITS_LAST, &e) == 0);
            engine_debug_route_trace(eng, NULL);
            ref_seq_force_experts(r1, rt);
            ref_step(r1, id, lq);
            double r1_rel = rel_rms_fd(lg, lq, V);
            if (r1_rel <= BAND_F32) { exact++; worst_exact = fmax(worst_exact, r1_rel); }
            ref_seq_free(r1);
        }
        ref_model_free(rm);
        printf("  %s %s: %d of %d one-row prompts equal the %sreference within %.1e (worst %.2e)\n", preset, quant,
               exact, ROW0_PROMPTS, rounds ? "rounded " : "", BAND_F32, worst_exact);
        CHECK_MSG(exact >= (rounds ? ROW0_EXACT : ROW0_PROMPTS), "%s %s: only %d of %d one-row prompts equal the %sreference",
                  preset, quant, exact, ROW0_PROMPTS, rounds ? "rounded " : "");
        free(lq);
        free(rt);
    }
    double noise_q = 0; /* the rounded reference's distance at its worst length */
    for (size_t li = 0; quantized && li < N_LEN; li++)
        noise_q = fmax(noise_q, rel_rms_dd(rq_logits + (int64_t)li * V, ref_logits + (int64_t)li * V, V));
    for (size_t li = 0; li < N_LEN; li++) {
        const int64_t n = lengths[li];
        const double *ref = ref_logits + (int64_t)li * V;
        const float *row = all + (n - 1) * V;
        const double rel = rel_rms_fd(row, ref, V);
        /* the band: BAND_F32, or RATIO_Q times the rounded reference's distance at this length */
        const double band = rounds ? RATIO_Q * rel_rms_dd(rq_logits + (int64_t)li * V, ref, V) : BAND_F32;
        int64_t top_e = sampler_argmax(row, V), top_r = argmax_d(ref, V);
        printf("  %s %s n=%-4lld rel %.2e (band %.2e) top1 %s margin %.3g\n", preset, quant, (long long)n, rel, band,
               top_e == top_r ? "same" : "DIFF", top_margin(ref, V));
        CHECK_MSG(rel <= band, "%s %s n=%lld: logits rel rms %.3e > band %.2e", preset, quant, (long long)n, rel, band);
        /* top-1 must agree unless the reference's own margin is inside the noise: each logit
         * moves by up to band * rms, a difference of two by sqrt(2) times that; 4 sigma */
        CHECK_MSG(top_e == top_r || top_margin(ref, V) < 4 * sqrt(2.0) * band * rms_d(ref, V),
                  "%s %s n=%lld: top-1 %lld vs reference %lld", preset, quant, (long long)n, (long long)top_e,
                  (long long)top_r);
        /* a prefill of exactly n rows returns row n-1 of the long pass, bit for bit */
        engine_seq_clear(eng, 0);
        CHECK(test_run(eng, 0, ids, n, lg, ENGINE_LOGITS_LAST, &e) == 0);
        CHECK_MSG(!memcmp(lg, row, sizeof(float) * (size_t)V), "%s %s n=%lld: prefill of n rows differs from row n-1",
                  preset, quant, (long long)n);
        if (in_list(stepped, n)) { /* the same ids token by token */
            engine_seq_clear(eng, 1);
            int32_t *rt2 = xmalloc(sizeof(int32_t) * (size_t)(n * NL * K));
            float *step_lg = xmalloc(sizeof(float) * (size_t)(n * V));
            for (int64_t t = 0; t < n; t++) {
                engine_debug_route_trace(eng, rt2 + t * NL * K);
                CHECK(test_run(eng, 1, &ids[t], 1, step_lg + t * V, ENGINE_LOGITS_LAST, &e) == 0);
            }
            engine_debug_route_trace(eng, NULL);
            /* Rows before the first routing difference went through the same experts in both
             * runs: their logits compare on arithmetic alone, within the band; from the
             * first flip on, the two runs are different functions and no band holds. */
            int64_t first_flip = n;
            for (int64_t t = 0; t < n && first_flip == n; t++)
                for (int64_t i = 0; i < NL * K; i++)
                    if (rt2[t * NL * K + i] != routes[t * NL * K + i]) { first_flip = t; break; }
            const double bs = rounds ? sqrt(2.0) * RATIO_Q * noise_q : BAND_STEP_F32;
            double worst = 0;
            for (int64_t t = 0; t < first_flip; t++) {
                double r_ = rel_rms_ff(step_lg + t * V, all + t * V, V);
                worst = r_ > worst ? r_ : worst;
                CHECK_MSG(r_ <= bs, "%s %s row %lld of %lld: batched vs stepped %.3e > %.2e", preset, quant, (long long)t,
                          (long long)n, r_, bs);
            }
            printf("  %s %s n=%-4lld batched vs stepped: worst rel %.2e (band %.2e) over the %lld rows before the first "
                   "routing difference\n", preset, quant, (long long)n, worst, bs, (long long)first_flip);
            /* a flip is a near-tie (counted and bounded against the reference above); quantized
             * small files have 7-12% of them, so the first can come early, but never at row 0:
             * a span's first row and a one-row span run the same operations */
            CHECK_MSG(first_flip >= 1, "%s %s n=%lld: routing differs at the first row", preset, quant, (long long)n);
            CHECK_MSG(strcmp(quant, "f32") || first_flip == n, "%s f32 n=%lld: stepped routing differs", preset,
                      (long long)n);
            free(rt2);
            free(step_lg);
        }
    }
    engine_free(eng);
    free(all);
    free(routes);
    free(lg);
    free(jobs[0].logits);
    free(jobs[1].logits);
    free(ids);
    model_free(m);
}

/* greedy decoding: identical ids and identical logit bits across runs and thread counts */
static void check_determinism(const char *preset, const char *quant, int64_t n_prompt) {
    const char *path = test_model(preset, quant);
    herr e;
    model *m;
    if (model_load(&m, path, &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    const int64_t V = m->hp.n_vocab, n_gen = 12;
    int32_t *ids = test_ids(n_prompt, V, 11);
    int32_t first[32];
    float *first_lg = xmalloc(sizeof(float) * (size_t)V), *lg = xmalloc(sizeof(float) * (size_t)V);
    const int threads[] = {1, 2, 3, 2};
    for (int run = 0; run < 4; run++) {
        engine *eng;
        engine_opts eo = {.n_threads = threads[run], .n_ctx = n_prompt + n_gen + 1};
        if (engine_open(&eng, m, &eo, &e) < 0) { CHECK_MSG(0, "%s", e.msg); break; }
        CHECK(test_run(eng, 0, ids, n_prompt, lg, ENGINE_LOGITS_LAST, &e) == 0);
        int32_t out[32];
        for (int k = 0; k < n_gen; k++) {
            out[k] = sampler_argmax(lg, V);
            CHECK(test_run(eng, 0, &out[k], 1, lg, ENGINE_LOGITS_LAST, &e) == 0);
        }
        if (run == 0) {
            memcpy(first, out, sizeof out);
            memcpy(first_lg, lg, sizeof(float) * (size_t)V);
        } else {
            CHECK_MSG(!memcmp(first, out, sizeof(int32_t) * (size_t)n_gen), "%s %s: greedy ids differ with -t %d", preset,
                      quant, threads[run]);
            CHECK_MSG(!memcmp(first_lg, lg, sizeof(float) * (size_t)V), "%s %s: logits bits differ with -t %d", preset,
                      quant, threads[run]);
        }
        engine_free(eng);
    }
    free(first_lg);
    free(lg);
    free(ids);
    model_free(m);
}

/* ENGINE_LOGITS_ARGMAX (the greedy token alone; on the GPU only the id leaves the device)
 * against sampler_argmax of the LAST row of the same ids: a prompt, then steps, the two
 * sequences in one call and, every other step, the argmax sequence in a call of its own
 * (tokens alone). A span asking for it with nowhere to put it is refused. */
static void check_argmax(const char *preset, const char *quant, int64_t n_prompt) {
    const char *path = test_model(preset, quant);
    herr e;
    model *m;
    if (model_load(&m, path, &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    const int64_t V = m->hp.n_vocab, n_gen = 8;
    int32_t *ids = test_ids(n_prompt, V, 12);
    float *lg = xmalloc(sizeof(float) * (size_t)V);
    engine *eng;
    engine_opts eo = {.n_threads = 2, .n_ctx = n_prompt + n_gen + 1, .n_seq_max = 2};
    if (engine_open(&eng, m, &eo, &e) < 0) {
        CHECK_MSG(0, "%s", e.msg);
    } else {
        int32_t tok = -1, next[2] = {0, 0};
        engine_span bad = {.seq = 1, .ids = ids, .n = 1, .want = ENGINE_LOGITS_ARGMAX};
        CHECK_MSG(engine_run(eng, &bad, 1, &e) < 0 && strstr(e.msg, "greedy token"), "an argmax span with no token ran");
        engine_span sp[2] = {{.seq = 0, .ids = ids, .n = n_prompt, .want = ENGINE_LOGITS_LAST, .logits = lg},
                             {.seq = 1, .ids = ids, .n = n_prompt, .want = ENGINE_LOGITS_ARGMAX, .token = &tok}};
        int bad_steps = 0;
        for (int k = 0; k <= n_gen; k++) {
            const bool apart = k % 2 == 1;
            if (apart) {
                CHECK(engine_run(eng, &sp[0], 1, &e) == 0 && engine_run(eng, &sp[1], 1, &e) == 0);
            } else {
                CHECK(engine_run(eng, sp, 2, &e) == 0);
            }
            const int32_t want = sampler_argmax(lg, V);
            bad_steps += tok != want;
            next[0] = want, next[1] = tok;
            sp[0].ids = &next[0], sp[1].ids = &next[1], sp[0].n = sp[1].n = 1;
        }
        CHECK_MSG(bad_steps == 0, "%s %s: %d of %lld steps' argmax token differs from sampler_argmax of the logits", preset,
                  quant, bad_steps, (long long)n_gen + 1);
        printf("  %s %s (%s): argmax tokens = sampler_argmax of the logits over a %lld-row prompt and %lld steps\n", preset,
               quant, engine_get_info(eng).backend, (long long)n_prompt, (long long)n_gen);
        engine_free(eng);
    }
    free(lg);
    free(ids);
    model_free(m);
}

TEST(tiny_f32) { check_file("tiny", "f32", lengths_toy, stepped_toy); }
TEST(tiny_q8_0) { check_file("tiny", "q8_0", lengths_toy, stepped_toy); }
TEST(tiny_q4_k_m) { check_file("tiny", "q4_k_m", lengths_toy, stepped_toy); }
TEST(small_f32) { check_file("small", "f32", lengths_toy, stepped_toy); }
TEST(small_q8_0) { check_file("small", "q8_0", lengths_toy, stepped_toy); }
TEST(small_q4_k_m) { check_file("small", "q4_k_m", lengths_toy, stepped_toy); }
TEST(wide_q4_k_m) { check_file("wide", "q4_k_m", lengths_wide, stepped_wide); }
TEST(tiny_dense_f32) { check_file("tiny-dense", "f32", lengths_toy, stepped_toy); } /* qwen35: the dense MLP */
TEST(tiny_dense_q4_k_m) { check_file("tiny-dense", "q4_k_m", lengths_toy, stepped_toy); }
TEST(determinism_tiny) { check_determinism("tiny", "q4_k_m", 70); check_determinism("tiny", "f32", 70); }
TEST(argmax_tiny) { check_argmax("tiny", "q4_k_m", 70); }
TEST(argmax_wide) { check_argmax("wide", "q4_k_m", 70); } /* the real vocabulary, 248,320 */
TEST(determinism_small) { check_determinism("small", "q4_k_m", 70); }
/* four passes of 512 rows, then steps: the same bits at every thread count */
TEST(determinism_wide) { check_determinism("wide", "q4_k_m", 2048); }

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "--wide")) { /* tests/cli/wide.sh: the file it wrote, shared */
        RUN(wide_q4_k_m);
        RUN(determinism_wide);
        RUN(argmax_wide);
        return harness_done();
    }
    RUN(tiny_f32);
    RUN(tiny_q8_0);
    RUN(tiny_q4_k_m);
    RUN(determinism_tiny);
    RUN(argmax_tiny);
    RUN(tiny_dense_f32);
    RUN(tiny_dense_q4_k_m);
    if (strcmp(mode, "--tiny")) {
        RUN(small_q4_k_m);
        RUN(small_q8_0);
        RUN(small_f32);
        RUN(determinism_small);
    }
    test_models_cleanup();
    return harness_done();
}
