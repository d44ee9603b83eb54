/* test_ref.c: checks of the float64 reference forward pass (tests/ref/ref.c) itself: the
 * delta-rule algebra against its closed form, RoPE against hand values, and on a generated
 * tiny model: finiteness, determinism, the prefix property, and layer outputs at position 0
 * recomputed independently from the dequantized weights (where every layer reduces to a
 * closed form: one key for attention, a zero lane and ring for GDN). */
#include "unit/harness.h"
#include "ref/ref.h"
#include "make/gen.h"
#include "format/gguf.h"
#include "model/model.h"
#include "format/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

static double rnd(uint64_t key, uint64_t i) { return 2.0 * rng_unit(key, i) - 1.0; }

static double max_abs_diff(const double *a, const double *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

static double max_abs(const double *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

/* ------------------------------------------------------------ (1) delta rule */

TEST(delta_rule_hand_case) {
    /* S = [[1,2],[3,4]], unit key e0, β = 1, g = 0: the rule overwrites row 0 with v. */
    double S[4] = {1, 2, 3, 4}, k[2] = {1, 0}, v[2] = {5, 6}, q[2] = {0, 1}, o[2];
    ref_delta_step(S, 2, q, k, v, 0.0, 1.0, o);
    CHECK(S[0] == 5 && S[1] == 6 && S[2] == 3 && S[3] == 4);
    CHECK(o[0] == 3 && o[1] == 4);               /* o = Sᵀq = row 1 */
    /* decay: g = log(0.5) halves S first; β = 0.5, k = e1, v = 0: row 1 becomes half of itself. */
    double S2[4] = {4, 8, 2, 6}, k2[2] = {0, 1}, v2[2] = {0, 0}, q2[2] = {1, 1};
    ref_delta_step(S2, 2, q2, k2, v2, log(0.5), 0.5, o);
    CHECK_MSG(fabs(S2[0] - 2) < 1e-15 && fabs(S2[1] - 4) < 1e-15, "row 0 %g %g", S2[0], S2[1]);
    CHECK_MSG(fabs(S2[2] - 0.5) < 1e-15 && fabs(S2[3] - 1.5) < 1e-15, "row 1 %g %g", S2[2], S2[3]);
    CHECK(fabs(o[0] - 2.5) < 1e-15 && fabs(o[1] - 5.5) < 1e-15);
}

TEST(delta_rule_closed_form) {
    enum { N = 5, T = 4 };
    const uint64_t key = rng_key(7, "delta");
    double S[N * N], Sc[N * N];
    for (int i = 0; i < N * N; i++) S[i] = Sc[i] = rnd(key, (uint64_t)i);
    for (int t = 0; t < T; t++) {
        double q[N], k[N], v[N], o[N], oc[N], kn = 0;
        for (int i = 0; i < N; i++) {
            q[i] = rnd(key, 100 + 10 * t + i);
            k[i] = rnd(key, 200 + 10 * t + i);
            v[i] = rnd(key, 300 + 10 * t + i);
            kn += k[i] * k[i];
        }
        for (int i = 0; i < N; i++) k[i] /= sqrt(kn);
        const double g = -0.3 * (t + 1), beta = 0.2 + 0.2 * t;
        ref_delta_step(S, N, q, k, v, g, beta, o);
        /* S_t = exp(g)(I − β k kᵀ) S_{t−1} + β k vᵀ */
        double next[N * N];
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++) {
                double acc = 0;
                for (int m = 0; m < N; m++) acc += ((i == m ? 1.0 : 0.0) - beta * k[i] * k[m]) * Sc[m * N + j];
                next[i * N + j] = exp(g) * acc + beta * k[i] * v[j];
            }
        memcpy(Sc, next, sizeof Sc);
        for (int j = 0; j < N; j++) {
            oc[j] = 0;
            for (int i = 0; i < N; i++) oc[j] += Sc[i * N + j] * q[i];
        }
        CHECK_MSG(max_abs_diff(S, Sc, N * N) < 1e-13, "step %d: state off by %g", t, max_abs_diff(S, Sc, N * N));
        CHECK_MSG(max_abs_diff(o, oc, N) < 1e-13, "step %d: output off by %g", t, max_abs_diff(o, oc, N));
    }
}

/* ------------------------------------------------------------ (2) RoPE */

TEST(rope_hand_values) {
    /* n_rot 4, theta 1e4, pos 1: pair 0 = (x0, x2) turns by 1 rad, pair 1 = (x1, x3) by 0.01. */
    double x[6] = {1, 0, 0, 0, 7, 8};
    ref_rope(x, 4, 1, 10000.0, NULL);
    CHECK(fabs(x[0] - cos(1.0)) < 1e-15 && fabs(x[2] - sin(1.0)) < 1e-15);
    CHECK(x[1] == 0 && x[3] == 0 && x[4] == 7 && x[5] == 8);
    double y[4] = {0, 1, 0, 0};
    ref_rope(y, 4, 1, 10000.0, NULL);
    CHECK(fabs(y[1] - cos(0.01)) < 1e-15 && fabs(y[3] - sin(0.01)) < 1e-15 && y[0] == 0 && y[2] == 0);
    double z[4] = {0.5, -2, 3, 1.5};           /* pos 3: pair 0 by 3 rad, pair 1 by 0.03 */
    ref_rope(z, 4, 3, 10000.0, NULL);
    CHECK(fabs(z[0] - (0.5 * cos(3.0) - 3 * sin(3.0))) < 1e-14);
    CHECK(fabs(z[2] - (0.5 * sin(3.0) + 3 * cos(3.0))) < 1e-14);
    CHECK(fabs(z[1] - (-2 * cos(0.03) - 1.5 * sin(0.03))) < 1e-14);
    CHECK(fabs(z[3] - (-2 * sin(0.03) + 1.5 * cos(0.03))) < 1e-14);
}

TEST(rope_norms_and_relative_position) {
    enum { D = 24, R = 16 };
    const uint64_t key = rng_key(3, "rope");
    const int32_t sec[4] = {3, 3, 2, 0};
    double q[D], k[D], a[D], b[D];
    for (int i = 0; i < D; i++) { q[i] = rnd(key, i); k[i] = rnd(key, 100 + i); }
    double n0 = 0, n1 = 0;
    memcpy(a, q, sizeof a);
    ref_rope(a, R, 1234, 1e7, sec);
    for (int i = 0; i < D; i++) { n0 += q[i] * q[i]; n1 += a[i] * a[i]; }
    CHECK_MSG(fabs(n0 - n1) < 1e-12, "norm %g -> %g", n0, n1);
    for (int i = R; i < D; i++) CHECK(a[i] == q[i]);
    /* q(m)·k(n) depends on m − n only */
    double d[2];
    for (int s = 0; s < 2; s++) {
        memcpy(a, q, sizeof a); memcpy(b, k, sizeof b);
        ref_rope(a, R, 10 + 50 * s, 1e7, sec);
        ref_rope(b, R, 3 + 50 * s, 1e7, sec);
        d[s] = 0;
        for (int i = 0; i < D; i++) d[s] += a[i] * b[i];
    }
    CHECK_MSG(fabs(d[0] - d[1]) < 1e-12, "%g vs %g", d[0], d[1]);
    /* the real model's sections rotate every pair; a section layout with a 4th-component
     * sector leaves that pair unrotated (llama.cpp's IMROPE with text positions) */
    const int32_t real[4] = {11, 11, 10, 0}, odd[4] = {1, 1, 0, 1};
    bool all = true;
    for (int i = 0; i < 32; i++) all &= ref_rope_pair_rotates(real, i);
    CHECK(all);
    CHECK(ref_rope_pair_rotates(odd, 0) && ref_rope_pair_rotates(odd, 1) && !ref_rope_pair_rotates(odd, 2));
    CHECK(ref_rope_pair_rotates(sec, 7) && ref_rope_pair_rotates(NULL, 5));
}

/* ------------------------------------------------------------ tiny model */

static model *g_model;        /* the model the body under test runs on */
static ref_model *g_ref;
static const char *g_name;

typedef struct test_model { char name[32]; model *m; ref_model *r; } test_model;
static test_model g_models[4];
static int g_n_models;
static const char *g_gen_skip;

static void add_model(const char *name, const char *path) {
    herr e;
    model *m;
    if (model_load(&m, path, &e) < 0) {
        fprintf(stderr, "    model_load %s: %s\n", name, e.msg);
        unlink(path);
        return;
    }
    unlink(path); /* the mapping stays valid */
    test_model *t = &g_models[g_n_models++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->m = m;
    t->r = ref_model_new(m);
}

/* A model of our own: GQA with 2 KV heads (the tiny preset has 1), norm weights and
 * biases away from 1 and 0 (the presets start norms at 1), 4 value heads over 2 key heads. */
static int write_custom(const char *path, herr *e) {
    model_hparams hp;
    memset(&hp, 0, sizeof hp);
    snprintf(hp.arch, sizeof hp.arch, "qwen35moe");
    hp.n_layer = 4; hp.n_ctx_train = 4096; hp.n_embd = 64; hp.n_vocab = 96;
    hp.n_head = 4; hp.n_head_kv = 2; hp.head_dim = 32; hp.rms_eps = 1e-6f;
    hp.rope_dims = 16; hp.rope_theta = 1e4f;
    hp.rope_sections[0] = 3; hp.rope_sections[1] = 3; hp.rope_sections[2] = 2;
    hp.n_expert = 6; hp.n_expert_used = 3; hp.n_ff_exp = 32; hp.n_ff_shexp = 48;
    hp.ssm_d_conv = 4; hp.ssm_d_state = 16; hp.ssm_n_group = 2; hp.ssm_dt_rank = 4;
    hp.ssm_d_inner = 64; hp.full_attn_interval = 4;
    if (model_hparams_check(&hp, e) < 0) return -1;
    gguf_writer *w = gguf_writer_new();
    model_hparams_write(&hp, w);
    tensor_spec *sp;
    const int64_t n = model_tensor_specs(&hp, &sp);
    for (int64_t i = 0; i < n; i++) gguf_add_tensor(w, sp[i].name, QT_F32, sp[i].n_dims, sp[i].ne);
    int rc = gguf_writer_open(w, path, e);
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const int64_t cnt = sp[i].ne[0] * sp[i].ne[1] * sp[i].ne[2];
        float *f = xmalloc((size_t)cnt * sizeof(float));
        const uint64_t key = rng_key(5, sp[i].name);
        for (int64_t j = 0; j < cnt; j++) {
            const float r = rng_normal(key, (uint64_t)j);
            switch (sp[i].role) {
            case TR_ATTN_NORM: case TR_POST_NORM: case TR_OUTPUT_NORM: case TR_SSM_NORM:
            case TR_ATTN_Q_NORM: case TR_ATTN_K_NORM: f[j] = 1 + 0.3f * r; break;
            case TR_SSM_A: f[j] = -expf(0.5f * r); break;
            case TR_SSM_DT: case TR_SSM_CONV1D: f[j] = 0.5f * r; break;
            case TR_TOKEN_EMBD: f[j] = r; break;
            default: f[j] = r / sqrtf((float)sp[i].ne[0]);
            }
        }
        rc = gguf_writer_write(w, i, 0, f, (uint64_t)cnt * sizeof(float), e);
        free(f);
    }
    if (rc == 0) rc = gguf_writer_close(w, e);
    gguf_writer_free(w);
    free(sp);
    return rc;
}

/* The tiny preset through the gen library (f32, q8_0, q4_k_m, seed 1) and our own model. */
static void load_models(void) {
    char path[512];
    herr e;
    const char *tmp = getenv("HEARTH_TMP");
    if (!tmp) tmp = "/tmp";
    const gen_quant quants[3] = {GEN_F32, GEN_Q8_0, GEN_Q4_K_M};
    for (int qi = 0; qi < 3; qi++) {
        snprintf(path, sizeof path, "%s/test_ref_tiny_%d_%d.gguf", tmp, (int)getpid(), qi);
        gen_opts o = {.preset = "tiny", .quant = quants[qi], .seed = 1, .n_threads = 2, .out_path = path};
        gen_stats st;
        if (gen_write(&o, &st, &e) < 0) {
            fprintf(stderr, "    gen_write: %s\n", e.msg);
            g_gen_skip = "could not generate the tiny model";
            break;
        }
        static const char *const names[3] = {"tiny-f32", "tiny-q8_0", "tiny-q4_k_m"};
        add_model(names[qi], path);
    }
    snprintf(path, sizeof path, "%s/test_ref_custom_%d.gguf", tmp, (int)getpid());
    if (write_custom(path, &e) < 0) fprintf(stderr, "    custom model: %s\n", e.msg);
    else add_model("custom", path);
}

static void free_models(void) {
    for (int i = 0; i < g_n_models; i++) {
        ref_model_free(g_models[i].r);
        model_free(g_models[i].m);
    }
}

/* Runs body on every loaded model, naming the model when a check in it fails. */
static void for_models(void (*body)(void)) {
    if (g_n_models == 0) SKIP("no model could be made");
    for (int i = 0; i < g_n_models; i++) {
        g_model = g_models[i].m;
        g_ref = g_models[i].r;
        g_name = g_models[i].name;
        const int before = harness_cur_failed;
        body();
        if (harness_cur_failed > before) fprintf(stderr, "    ^ on model %s\n", g_name);
    }
}

static int32_t tok(int64_t i) { return (int32_t)(rng_at(rng_key(1, "tokens"), (uint64_t)i) % (uint64_t)g_model->hp.n_vocab); }

static void body_logits_finite_and_deterministic(void) {
    enum { T = 12 };
    const int64_t V = g_model->hp.n_vocab;
    double *l1 = xmalloc((size_t)(T * V) * sizeof(double)), *l2 = xmalloc((size_t)(T * V) * sizeof(double));
    for (int run = 0; run < 2; run++) {
        ref_seq *s = ref_seq_new(g_ref, T);
        for (int t = 0; t < T; t++) ref_step(s, tok(t), (run ? l2 : l1) + t * V);
        CHECK(ref_seq_pos(s) == T);
        ref_seq_free(s);
    }
    int bad = 0;
    for (int64_t i = 0; i < T * V; i++) bad += !isfinite(l1[i]);
    CHECK_MSG(bad == 0, "%d non-finite logits", bad);
    CHECK_MSG(memcmp(l1, l2, (size_t)(T * V) * sizeof(double)) == 0, "two runs differ");
    /* logits must not be degenerate: spread over the vocabulary, changing with the step */
    double lo = l1[0], hi = l1[0];
    for (int64_t i = 0; i < V; i++) { if (l1[i] < lo) lo = l1[i]; if (l1[i] > hi) hi = l1[i]; }
    CHECK_MSG(hi - lo > 1e-3, "logits flat: %g..%g", lo, hi);
    CHECK(max_abs_diff(l1, l1 + (T - 1) * V, V) > 1e-6);
    free(l1); free(l2);
}

static void body_prefix_property(void) {
    enum { N = 9 };
    const int64_t V = g_model->hp.n_vocab;
    double *a = xmalloc((size_t)V * sizeof(double)), *b = xmalloc((size_t)V * sizeof(double));
    double *c = xmalloc((size_t)V * sizeof(double));
    /* a sequence with room for more rows than it uses: stale rows must not leak in */
    ref_seq *s1 = ref_seq_new(g_ref, 64);
    for (int t = 0; t < N; t++) ref_step(s1, tok(t), NULL);
    ref_seq *s2 = ref_seq_clone(s1);
    ref_step(s1, tok(N), a);
    ref_seq *s3 = ref_seq_new(g_ref, N + 1);
    for (int t = 0; t <= N; t++) ref_step(s3, tok(t), t == N ? b : NULL);
    CHECK_MSG(memcmp(a, b, (size_t)V * sizeof(double)) == 0, "steps 1..n then n+1 != n+1 from scratch");
    ref_step(s2, tok(N), c);
    CHECK_MSG(memcmp(a, c, (size_t)V * sizeof(double)) == 0, "a clone continues differently");
    /* the history matters: a different first token changes the last logits */
    ref_seq *s4 = ref_seq_new(g_ref, N + 1);
    for (int t = 0; t <= N; t++) ref_step(s4, t == 0 ? (tok(0) + 1) % (int32_t)V : tok(t), t == N ? c : NULL);
    CHECK_MSG(max_abs_diff(a, c, V) > 1e-9, "the first token has no effect on the last logits");
    /* every GDN lane and ring is in use; the expert choice is well formed */
    const model_hparams *hp = &g_model->hp;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->is_recurrent[il]) {
            CHECK(max_abs(ref_seq_lane(s1, il), hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state) > 0);
            CHECK(max_abs(ref_seq_ring(s1, il), (hp->ssm_d_conv - 1) * hp_conv_dim(hp)) > 0);
        } else {
            CHECK(ref_seq_kv_k(s1, il) != NULL && ref_seq_lane(s1, il) == NULL);
        }
        const int32_t *ids = ref_seq_experts(s1, il);
        const double *w = ref_seq_expert_weights(s1, il);
        double sum = 0;
        for (int k = 0; k < hp->n_expert_used; k++) {
            CHECK(ids[k] >= 0 && ids[k] < hp->n_expert);
            for (int j = 0; j < k; j++) CHECK(ids[j] != ids[k]);
            if (k) CHECK(w[k] <= w[k - 1]);
            sum += w[k];
        }
        CHECK_MSG(fabs(sum - 1) < 1e-12, "layer %d: expert weights sum to %g", il, sum);
    }
    ref_seq_free(s1); ref_seq_free(s2); ref_seq_free(s3); ref_seq_free(s4);
    free(a); free(b); free(c);
}

/* rows [r0, r0+n) of a weight as doubles */
static double *deq(const qtensor *q, int64_t r0, int64_t n) {
    float *f = xmalloc((size_t)q->ne[0] * sizeof(float));
    double *d = xmalloc((size_t)(n * q->ne[0]) * sizeof(double));
    for (int64_t r = 0; r < n; r++) {
        quant_dequantize_row(q->type, (const char *)q->data + (r0 + r) * q->row_bytes, f, q->ne[0]);
        for (int64_t i = 0; i < q->ne[0]; i++) d[r * q->ne[0] + i] = f[i];
    }
    free(f);
    return d;
}

/* y = W x, W (rows, n) plain row-major, one accumulator */
static void mv(const double *W, int64_t rows, int64_t n, const double *x, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        double acc = 0;
        for (int64_t i = 0; i < n; i++) acc += W[r * n + i] * x[i];
        y[r] = acc;
    }
}

static double sigm(double x) { return 1 / (1 + exp(-x)); }
static double silu_(double x) { return x * sigm(x); }

static void rand_vec(double *x, int64_t n, const char *name) {
    const uint64_t key = rng_key(11, name);
    for (int64_t i = 0; i < n; i++) x[i] = rnd(key, (uint64_t)i);
}

static void body_attention_at_pos0_is_gated_v(void) {
    const model_hparams *hp = &g_model->hp;
    int il = -1;
    for (int i = 0; i < hp->n_layer && il < 0; i++) if (!hp->is_recurrent[i]) il = i;
    if (il < 0) return;
    const model_layer *L = &g_model->layers[il];
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    double *h = xmalloc((size_t)E * sizeof(double)), *out = xmalloc((size_t)E * sizeof(double));
    double *want = xmalloc((size_t)E * sizeof(double));
    rand_vec(h, E, "attn h");
    ref_seq *s = ref_seq_new(g_ref, 4);
    ref_mixer(s, il, h, out);
    /* softmax over one key is 1: o_h = v_{h/(H/Hkv)} ⊙ sigmoid(gate_h), out = Wo o */
    double *Wq = deq(&L->attn_q, 0, 2 * H * D), *Wv = deq(&L->attn_v, 0, Hkv * D), *Wo = deq(&L->attn_out, 0, E);
    double *qg = xmalloc((size_t)(2 * H * D) * sizeof(double)), *v = xmalloc((size_t)(Hkv * D) * sizeof(double));
    double *o = xmalloc((size_t)(H * D) * sizeof(double));
    mv(Wq, 2 * H * D, E, h, qg);
    mv(Wv, Hkv * D, E, h, v);
    for (int64_t hh = 0; hh < H; hh++)
        for (int64_t i = 0; i < D; i++) o[hh * D + i] = v[(hh / (H / Hkv)) * D + i] * sigm(qg[hh * 2 * D + D + i]);
    mv(Wo, E, H * D, o, want);
    double err = max_abs_diff(out, want, E), mag = max_abs(want, E);
    CHECK_MSG(err <= 1e-12 * (1 + mag), "attention at pos 0 off by %g (|out| %g)", err, mag);
    CHECK(mag > 0);
    /* the stored value row is v itself; the stored key row has the RMS norm's scale */
    CHECK(max_abs_diff(ref_seq_kv_v(s, il), v, Hkv * D) <= 1e-13 * (1 + max_abs(v, Hkv * D)));
    ref_seq_free(s);
    free(Wq); free(Wv); free(Wo); free(qg); free(v); free(o); free(h); free(out); free(want);
}

/* y ← rmsnorm(y) * w, plainly */
static void rms_w(double *y, int64_t n, double eps, const double *w) {
    double ms = 0;
    for (int64_t i = 0; i < n; i++) ms += y[i] * y[i];
    const double r = 1 / sqrt(ms / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] *= r * w[i];
}

/* A token through ref_step, then a chosen h at position 1 through the first attention
 * layer: the stored KV row 0 follows from the layer's input (recovered from the previous
 * layer's output), and the output at position 1 is a two-key softmax with q/k norms and
 * RoPE at positions 1 and 0. */
static void body_attention_two_positions(void) {
    const model_hparams *hp = &g_model->hp;
    int il = -1;
    for (int i = 0; i < hp->n_layer && il < 0; i++) if (!hp->is_recurrent[i]) il = i;
    if (il < 0) return;
    const model_layer *L = &g_model->layers[il];
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const double eps = hp->rms_eps;
    ref_seq *s = ref_seq_new(g_ref, 4);
    const int32_t t0 = tok(0);
    ref_step(s, t0, NULL);

    double *h0 = il > 0 ? xmalloc((size_t)E * sizeof(double)) : deq(&g_model->token_embd, t0, 1);
    if (il > 0) memcpy(h0, ref_seq_hidden(s, il - 1), (size_t)E * sizeof(double));
    double *an = deq(&L->attn_norm, 0, 1), *qn = deq(&L->attn_q_norm, 0, 1), *kn = deq(&L->attn_k_norm, 0, 1);
    rms_w(h0, E, eps, an);
    double *Wq = deq(&L->attn_q, 0, 2 * H * D), *Wk = deq(&L->attn_k, 0, Hkv * D), *Wv = deq(&L->attn_v, 0, Hkv * D);
    double *Wo = deq(&L->attn_out, 0, E);
    const int64_t KV = Hkv * D;
    double *k0 = xmalloc((size_t)KV * sizeof(double)), *v0 = xmalloc((size_t)KV * sizeof(double));
    mv(Wk, KV, E, h0, k0);
    mv(Wv, KV, E, h0, v0);
    for (int64_t j = 0; j < Hkv; j++) rms_w(k0 + j * D, D, eps, kn); /* RoPE at 0 is the identity */
    CHECK_MSG(max_abs_diff(ref_seq_kv_k(s, il), k0, KV) <= 1e-12 * (1 + max_abs(k0, KV)), "KV key row 0 off by %g",
              max_abs_diff(ref_seq_kv_k(s, il), k0, KV));
    CHECK(max_abs_diff(ref_seq_kv_v(s, il), v0, KV) <= 1e-12 * (1 + max_abs(v0, KV)));

    double *h1 = xmalloc((size_t)E * sizeof(double)), *out = xmalloc((size_t)E * sizeof(double));
    double *want = xmalloc((size_t)E * sizeof(double));
    rand_vec(h1, E, "attn h1");
    ref_mixer(s, il, h1, out);
    double *qg = xmalloc((size_t)(2 * H * D) * sizeof(double)), *k1 = xmalloc((size_t)KV * sizeof(double));
    double *v1 = xmalloc((size_t)KV * sizeof(double)), *o = xmalloc((size_t)(H * D) * sizeof(double));
    mv(Wq, 2 * H * D, E, h1, qg);
    mv(Wk, KV, E, h1, k1);
    mv(Wv, KV, E, h1, v1);
    for (int64_t j = 0; j < Hkv; j++) {
        rms_w(k1 + j * D, D, eps, kn);
        ref_rope(k1 + j * D, hp->rope_dims, 1, hp->rope_theta, hp->rope_sections);
    }
    CHECK(max_abs_diff(ref_seq_kv_k(s, il) + KV, k1, KV) <= 1e-12 * (1 + max_abs(k1, KV)));
    for (int64_t hh = 0; hh < H; hh++) {
        double *q = qg + hh * 2 * D;
        const int64_t kv = hh / (H / Hkv);
        rms_w(q, D, eps, qn);
        ref_rope(q, hp->rope_dims, 1, hp->rope_theta, hp->rope_sections);
        double s0 = 0, s1 = 0;
        for (int64_t i = 0; i < D; i++) { s0 += q[i] * k0[kv * D + i]; s1 += q[i] * k1[kv * D + i]; }
        s0 /= sqrt((double)D); s1 /= sqrt((double)D);
        const double p0 = 1 / (1 + exp(s1 - s0)), p1 = 1 - p0;
        for (int64_t i = 0; i < D; i++)
            o[hh * D + i] = (p0 * v0[kv * D + i] + p1 * v1[kv * D + i]) * sigm(q[D + i]);
    }
    mv(Wo, E, H * D, o, want);
    double err = max_abs_diff(out, want, E), mag = max_abs(want, E);
    CHECK_MSG(err <= 1e-11 * (1 + mag), "attention at pos 1 off by %g (|out| %g)", err, mag);
    ref_seq_free(s);
    free(h0); free(an); free(qn); free(kn); free(Wq); free(Wk); free(Wv); free(Wo); free(k0); free(v0);
    free(h1); free(out); free(want); free(qg); free(k1); free(v1); free(o);
}

/* The closed-form lane update of every value head from a post-conv row y (C): q, k
 * L2-normed per key head, value head h reading key head h % Gk; g NULL means no decay. */
static void gdn_lane_update(double *Sl, const double *y, const double *b, const double *g, const model_hparams *hp) {
    const int64_t S = hp->ssm_d_state, Gk = hp->ssm_n_group, Gv = hp->ssm_dt_rank;
    const double eps = hp->rms_eps;
    double *next = xmalloc((size_t)(S * S) * sizeof(double)), *k = xmalloc((size_t)S * sizeof(double));
    for (int64_t hh = 0; hh < Gv; hh++) {
        const double *kr = y + Gk * S + (hh % Gk) * S, *v = y + 2 * Gk * S + hh * S;
        double kk = 0;
        for (int64_t i = 0; i < S; i++) kk += kr[i] * kr[i];
        for (int64_t i = 0; i < S; i++) k[i] = kr[i] / sqrt(kk + eps);
        const double beta = sigm(b[hh]), decay = g ? exp(g[hh]) : 1.0;
        double *Sh = Sl + hh * S * S;
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++) {
                double acc = 0;
                for (int64_t m = 0; m < S; m++) acc += ((i == m) - beta * k[i] * k[m]) * Sh[m * S + j];
                next[i * S + j] = decay * acc + beta * k[i] * v[j];
            }
        memcpy(Sh, next, (size_t)(S * S) * sizeof(double));
    }
    free(next); free(k);
}

static void body_gdn_closed_form_two_tokens(void) {
    const model_hparams *hp = &g_model->hp;
    int il = -1;
    for (int i = 0; i < hp->n_layer && il < 0; i++) if (hp->is_recurrent[i]) il = i;
    if (il < 0) return;
    const model_layer *L = &g_model->layers[il];
    const int64_t E = hp->n_embd, S = hp->ssm_d_state, Gk = hp->ssm_n_group, Gv = hp->ssm_dt_rank;
    const int64_t C = hp_conv_dim(hp), W = hp->ssm_d_conv;
    const double eps = hp->rms_eps;
    double *h = xmalloc((size_t)E * sizeof(double)), *out = xmalloc((size_t)E * sizeof(double));
    double *want = xmalloc((size_t)E * sizeof(double));
    rand_vec(h, E, "gdn h");
    ref_seq *s = ref_seq_new(g_ref, 4);
    ref_mixer(s, il, h, out);

    /* zero ring: y = silu(w[c][W-1] qkv_c); zero lane: S = β k vᵀ, o = Sᵀq = β (k·q) v */
    double *Wqkv = deq(&L->attn_qkv, 0, C), *Wz = deq(&L->attn_gate, 0, Gv * S);
    double *Wb = deq(&L->ssm_beta, 0, Gv), *Wa = deq(&L->ssm_alpha, 0, Gv), *Wout = deq(&L->ssm_out, 0, E);
    double *conv = deq(&L->ssm_conv1d, 0, C), *nw = deq(&L->ssm_norm, 0, 1);
    double *qkv = xmalloc((size_t)C * sizeof(double)), *z = xmalloc((size_t)(Gv * S) * sizeof(double));
    double *b = xmalloc((size_t)Gv * sizeof(double)), *o = xmalloc((size_t)(Gv * S) * sizeof(double));
    mv(Wqkv, C, E, h, qkv);
    mv(Wz, Gv * S, E, h, z);
    mv(Wb, Gv, E, h, b);
    double *y = xmalloc((size_t)C * sizeof(double));
    for (int64_t c = 0; c < C; c++) y[c] = silu_(conv[c * W + W - 1] * qkv[c]);
    for (int64_t hh = 0; hh < Gv; hh++) {
        const double *q = y + (hh % Gk) * S, *k = y + Gk * S + (hh % Gk) * S, *v = y + 2 * Gk * S + hh * S;
        double qq = 0, kk = 0, kq = 0;
        for (int64_t i = 0; i < S; i++) { qq += q[i] * q[i]; kk += k[i] * k[i]; kq += k[i] * q[i]; }
        const double coef = sigm(b[hh]) * kq / sqrt(qq + eps) / sqrt(kk + eps) / sqrt((double)S);
        double ms = 0;
        for (int64_t i = 0; i < S; i++) { o[hh * S + i] = coef * v[i]; ms += o[hh * S + i] * o[hh * S + i]; }
        const double r = 1 / sqrt(ms / (double)S + eps);
        for (int64_t i = 0; i < S; i++) o[hh * S + i] *= r * nw[i] * silu_(z[hh * S + i]);
    }
    mv(Wout, E, Gv * S, o, want);
    double err = max_abs_diff(out, want, E), mag = max_abs(want, E);
    CHECK_MSG(err <= 1e-9 * (1 + mag), "GDN at pos 0 off by %g (|out| %g)", err, mag);
    CHECK(mag > 0);
    /* the ring now holds qkv as its newest row, zeros before */
    const double *ring = ref_seq_ring(s, il);
    CHECK(max_abs_diff(ring + (W - 2) * C, qkv, C) <= 1e-12 * (1 + max_abs(qkv, C)));
    CHECK(max_abs(ring, (W - 2) * C) == 0);

    /* the lane after one token: S_h = β k̂ v_hᵀ (k̂ the L2-normed key of head h % Gk) */
    const double *lane = ref_seq_lane(s, il);
    double *Sw = xcalloc((size_t)(Gv * S * S), sizeof(double));
    gdn_lane_update(Sw, y, b, NULL, hp);
    CHECK_MSG(max_abs_diff(lane, Sw, Gv * S * S) <= 1e-12 * (1 + max_abs(Sw, Gv * S * S)), "lane after one token off by %g",
              max_abs_diff(lane, Sw, Gv * S * S));

    /* position 1: tap W-2 meets the previous row; the lane decays by exp(g) and updates
     * by the closed form S ← exp(g)(I − β k kᵀ)S + β k vᵀ */
    double *h1 = xmalloc((size_t)E * sizeof(double)), *qkv1 = xmalloc((size_t)C * sizeof(double));
    double *a1 = xmalloc((size_t)Gv * sizeof(double)), *dt = deq(&L->ssm_dt, 0, 1), *A = deq(&L->ssm_a, 0, 1);
    double *g1 = xmalloc((size_t)Gv * sizeof(double));
    rand_vec(h1, E, "gdn h1");
    mv(Wqkv, C, E, h1, qkv1);
    mv(Wb, Gv, E, h1, b);
    mv(Wa, Gv, E, h1, a1);
    for (int64_t hh = 0; hh < Gv; hh++) g1[hh] = A[hh] * log1p(exp(a1[hh] + dt[hh]));
    for (int64_t c = 0; c < C; c++) y[c] = silu_(conv[c * W + W - 2] * qkv[c] + conv[c * W + W - 1] * qkv1[c]);
    gdn_lane_update(Sw, y, b, g1, hp);
    ref_mixer(s, il, h1, out); /* same position in the seq: fine, only the layer's state moves */
    CHECK(max_abs_diff(ring + (W - 2) * C, qkv1, C) <= 1e-12 * (1 + max_abs(qkv1, C)));
    if (W >= 3) CHECK(max_abs_diff(ring + (W - 3) * C, qkv, C) <= 1e-12 * (1 + max_abs(qkv, C)));
    CHECK_MSG(max_abs_diff(lane, Sw, Gv * S * S) <= 1e-12 * (1 + max_abs(Sw, Gv * S * S)), "lane after two tokens off by %g",
              max_abs_diff(lane, Sw, Gv * S * S));
    free(Sw); free(a1); free(dt); free(A); free(g1);
    ref_seq_free(s);
    free(Wqkv); free(Wz); free(Wb); free(Wa); free(Wout); free(conv); free(nw);
    free(qkv); free(z); free(b); free(o); free(y); free(h); free(h1); free(qkv1); free(out); free(want);
}

static void body_moe_independent(void) {
    const model_hparams *hp = &g_model->hp;
    const int il = (int)hp->n_layer - 1;
    const model_layer *L = &g_model->layers[il];
    const int64_t E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp, Fs = hp->n_ff_shexp;
    double *h = xmalloc((size_t)E * sizeof(double)), *out = xmalloc((size_t)E * sizeof(double));
    double *want = xcalloc((size_t)E, sizeof(double));
    rand_vec(h, E, "moe h");
    ref_seq *s = ref_seq_new(g_ref, 1);
    ref_moe(s, il, h, out);

    double *R = deq(&L->ffn_gate_inp, 0, X), *p = xmalloc((size_t)X * sizeof(double));
    mv(R, X, E, h, p);
    double mx = p[0], sum = 0;
    for (int64_t e = 1; e < X; e++) if (p[e] > mx) mx = p[e];
    for (int64_t e = 0; e < X; e++) sum += (p[e] = exp(p[e] - mx));
    for (int64_t e = 0; e < X; e++) p[e] /= sum;
    /* the chosen set: every chosen probability >= every unchosen one */
    const int32_t *ids = ref_seq_experts(s, il);
    const double *w = ref_seq_expert_weights(s, il);
    double min_in = 2, max_out = -1, top = 0;
    for (int64_t e = 0; e < X; e++) {
        bool in = false;
        for (int64_t k = 0; k < K; k++) in |= ids[k] == e;
        if (in) { if (p[e] < min_in) min_in = p[e]; top += p[e]; }
        else if (p[e] > max_out) max_out = p[e];
    }
    CHECK_MSG(min_in >= max_out, "not the top-%d: %g < %g", (int)K, min_in, max_out);
    double *g = xmalloc((size_t)(F > Fs ? F : Fs) * sizeof(double)), *u = xmalloc((size_t)(F > Fs ? F : Fs) * sizeof(double));
    double *y = xmalloc((size_t)E * sizeof(double));
    for (int64_t k = 0; k < K; k++) {
        const int64_t e = ids[k];
        CHECK(fabs(w[k] - p[e] / top) < 1e-14);
        double *Wg = deq(&L->ffn_gate_exps, e * F, F), *Wu = deq(&L->ffn_up_exps, e * F, F);
        double *Wd = deq(&L->ffn_down_exps, e * E, E);
        mv(Wg, F, E, h, g); mv(Wu, F, E, h, u);
        for (int64_t i = 0; i < F; i++) g[i] = silu_(g[i]) * u[i];
        mv(Wd, E, F, g, y);
        for (int64_t i = 0; i < E; i++) want[i] += p[e] / top * y[i];
        free(Wg); free(Wu); free(Wd);
    }
    double *Wg = deq(&L->ffn_gate_shexp, 0, Fs), *Wu = deq(&L->ffn_up_shexp, 0, Fs), *Wd = deq(&L->ffn_down_shexp, 0, E);
    double *gi = deq(&L->ffn_gate_inp_shexp, 0, 1);
    mv(Wg, Fs, E, h, g); mv(Wu, Fs, E, h, u);
    for (int64_t i = 0; i < Fs; i++) g[i] = silu_(g[i]) * u[i];
    mv(Wd, E, Fs, g, y);
    double sg = 0;
    for (int64_t i = 0; i < E; i++) sg += gi[i] * h[i];
    sg = sigm(sg);
    for (int64_t i = 0; i < E; i++) want[i] += sg * y[i];
    double err = max_abs_diff(out, want, E), mag = max_abs(want, E);
    CHECK_MSG(err <= 1e-12 * (1 + mag), "MoE off by %g (|out| %g)", err, mag);
    ref_seq_free(s);
    free(Wg); free(Wu); free(Wd); free(gi); free(R); free(p); free(g); free(u); free(y);
    free(h); free(out); free(want);
}

/* ref_step is the layer equation over ref_mixer and ref_moe: x = embd; per layer
 * x += mixer(rmsnorm(x)*attn_norm); x += moe(rmsnorm(x)*post_norm); logits =
 * output·(rmsnorm(x)*output_norm). Recomposed here over two tokens on a second sequence. */
static void body_step_wiring(void) {
    const model_hparams *hp = &g_model->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    const double eps = hp->rms_eps;
    ref_seq *s = ref_seq_new(g_ref, 2), *r = ref_seq_new(g_ref, 2);
    double *logits = xmalloc((size_t)V * sizeof(double)), *want = xmalloc((size_t)V * sizeof(double));
    double *h = xmalloc((size_t)E * sizeof(double)), *out = xmalloc((size_t)E * sizeof(double));
    double *on = deq(&g_model->output_norm, 0, 1), *Wout = deq(&g_model->output, 0, V);
    for (int t = 0; t < 2; t++) {
        ref_step(s, tok(t), logits);
        double *x = deq(&g_model->token_embd, tok(t), 1);
        for (int il = 0; il < hp->n_layer; il++) {
            double *an = deq(&g_model->layers[il].attn_norm, 0, 1), *pn = deq(&g_model->layers[il].post_norm, 0, 1);
            memcpy(h, x, (size_t)E * sizeof(double));
            rms_w(h, E, eps, an);
            ref_mixer(r, il, h, out);
            for (int64_t i = 0; i < E; i++) x[i] += out[i];
            memcpy(h, x, (size_t)E * sizeof(double));
            rms_w(h, E, eps, pn);
            ref_moe(r, il, h, out);
            for (int64_t i = 0; i < E; i++) x[i] += out[i];
            double err = max_abs_diff(x, ref_seq_hidden(s, il), E);
            CHECK_MSG(err <= 1e-10 * (1 + max_abs(x, E)), "token %d layer %d: residual off by %g", t, il, err);
            free(an); free(pn);
        }
        rms_w(x, E, eps, on);
        mv(Wout, V, E, x, want);
        double err = max_abs_diff(logits, want, V);
        CHECK_MSG(err <= 1e-10 * (1 + max_abs(want, V)), "token %d: logits off by %g", t, err);
        free(x);
        ref_seq_advance(r);
    }
    ref_seq_free(s); ref_seq_free(r);
    free(logits); free(want); free(h); free(out); free(on); free(Wout);
}

static test_model *find_model(const char *name) {
    for (int i = 0; i < g_n_models; i++) if (!strcmp(g_models[i].name, name)) return &g_models[i];
    return NULL;
}

/* The models the per-model checks ran on: the tiny preset in three types (gen writes
 * quantized blocks from their own random bits, so the three are different models) and
 * ours. Shown as skipped when gen could not make the tiny files. */
TEST(models_present) {
    if (g_gen_skip) SKIP(g_gen_skip);
    const char *want[4] = {"tiny-f32", "tiny-q8_0", "tiny-q4_k_m", "custom"};
    for (int i = 0; i < 4; i++) CHECK_MSG(find_model(want[i]) != NULL, "model %s missing", want[i]);
    const test_model *q = find_model("tiny-q4_k_m");
    if (q) CHECK_MSG(q->m->layers[0].ffn_gate_exps.type != QT_F32, "tiny-q4_k_m has f32 experts");
}

TEST(model_logits_finite_and_deterministic) { for_models(body_logits_finite_and_deterministic); }
TEST(model_prefix_property) { for_models(body_prefix_property); }
TEST(model_attention_at_pos0_is_gated_v) { for_models(body_attention_at_pos0_is_gated_v); }
TEST(model_attention_two_positions) { for_models(body_attention_two_positions); }
TEST(model_gdn_closed_form_two_tokens) { for_models(body_gdn_closed_form_two_tokens); }
TEST(model_moe_independent) { for_models(body_moe_independent); }
TEST(model_step_wiring) { for_models(body_step_wiring); }

int main(void) {
    RUN(delta_rule_hand_case);
    RUN(delta_rule_closed_form);
    RUN(rope_hand_values);
    RUN(rope_norms_and_relative_position);
    load_models();
    RUN(models_present);
    RUN(model_logits_finite_and_deterministic);
    RUN(model_prefix_property);
    RUN(model_attention_at_pos0_is_gated_v);
    RUN(model_attention_two_positions);
    RUN(model_gdn_closed_form_two_tokens);
    RUN(model_moe_independent);
    RUN(model_step_wiring);
    free_models();
    return harness_done();
}
