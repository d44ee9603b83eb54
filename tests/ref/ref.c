/* ref.c: the plain float64 qwen35moe forward pass of ref.h (tests only). Written for
 * obviousness: one token, one layer, one head at a time, every formula as in MODEL.md.
 * Speed comes only from not redoing work (float weight copies, chosen experts only,
 * skipping the output matrix when no logits are wanted), never from reordering the math. */
#include "ref.h"
#include "format/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* A weight matrix: rows of n_in weights; f points at float rows when cached (or aliased
 * for F32), else rows are dequantized from q at use. */
typedef struct ref_mat {
    const qtensor *q;
    const float *f;
    int64_t n_in, n_rows;
} ref_mat;

typedef struct ref_layer {
    bool recurrent;
    double *attn_norm, *post_norm;                 /* (E) */
    /* GDN */
    ref_mat qkv, gate_z, beta, alpha, ssm_out;
    double *conv;                                  /* (C, W) */
    double *dt, *a;                                /* (Gv) */
    double *ssm_norm;                              /* (S) */
    /* attention */
    ref_mat wq, wk, wv, wo;
    double *q_norm, *k_norm;                       /* (D) */
    /* MoE */
    ref_mat router, gate_exps, up_exps, down_exps, gate_sh, up_sh, down_sh;
    ref_mat gate_d, up_d, down_d;                  /* qwen35's dense MLP */
    double *gate_inp_sh;                           /* (E) */
    float **exp_cache[3];                          /* gate, up, down: per expert, filled on first use */
} ref_layer;

struct ref_model {
    const model *m;
    ref_mat token_embd, output;
    /* the lazy expert copies fill as sequences run: a ref_model is not shared by threads */
    double *output_norm;                           /* (E) */
    ref_layer layers[MODEL_MAX_LAYERS];            /* the trunk's, then the MTP block's (has_mtp) */
    ref_mat eh_proj;                               /* the MTP block's (has_mtp) */
    double *enorm, *hnorm, *head_norm;             /* (E) */
    int n_all;                                     /* layers: n_layer + has_mtp */
    int64_t max_row;                               /* longest row of any matrix */
    size_t cached_bytes, budget;                   /* bytes of dequantized float copies: used, at most */
    void *owned[MODEL_MAX_LAYERS * 32 + 8];        /* allocations to free */
    int n_owned;
};

struct ref_seq {
    ref_model *rm;
    int64_t pos, max_tokens;
    double *kv_k[MODEL_MAX_LAYERS], *kv_v[MODEL_MAX_LAYERS]; /* (max_tokens, Hkv, D) */
    double *lane[MODEL_MAX_LAYERS];                /* (Gv, S, S) */
    double *ring[MODEL_MAX_LAYERS];                /* (W-1, C) */
    int32_t *experts;                              /* (L, K) used in the last step */
    int32_t *own;                                  /* (L, K) the reference's own top-K */
    double *probs_all;                             /* (L, X) router probabilities */
    const int32_t *forced;                         /* (L, K) experts to use in the next step */
    double *expert_w;                              /* (L, K) */
    double *hidden;                                /* (L, E) */
    bool act_round;                                /* ref_seq_round_activations */
    /* scratch */
    float *row;                                    /* (max_row) */
    float *xf;                                     /* (max_row) an input vector as float */
    void *xblk;                                    /* its 8-bit blocks */
    double *xr;                                    /* (max_row) the rounded input */
    double *x, *h, *out, *moe_out;                 /* (E) */
    double *qkv, *y, *z, *bb, *aa, *o;             /* GDN */
    double *qg, *k, *v, *scores, *att;             /* attention */
    double *probs, *g, *u, *eo;                    /* MoE */
};

/* ---------------------------------------------------------------- primitives */

static double dot_fd(const float *w, const double *x, int64_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)w[i] * x[i];
        s1 += (double)w[i + 1] * x[i + 1];
        s2 += (double)w[i + 2] * x[i + 2];
        s3 += (double)w[i + 3] * x[i + 3];
    }
    for (; i < n; i++) s0 += (double)w[i] * x[i];
    return (s0 + s1) + (s2 + s3);
}

static double dot_dd(const double *a, const double *b, int64_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x / (1.0 + exp(-x)); }
static double softplus(double x) { return x > 20.0 ? x : log(1.0 + exp(x)); }

void ref_rmsnorm(double *x, int64_t n, double eps, const double *w) {
    double ss = dot_dd(x, x, n);
    double scale = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * scale * (w ? w[i] : 1.0);
}

/* x / sqrt(Σx² + eps) */
static void l2norm(double *x, int64_t n, double eps) {
    double scale = 1.0 / sqrt(dot_dd(x, x, n) + eps);
    for (int64_t i = 0; i < n; i++) x[i] *= scale;
}

static void softmax(double *x, int64_t n) {
    double mx = x[0];
    for (int64_t i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int64_t i = 0; i < n; i++) { x[i] = exp(x[i] - mx); sum += x[i]; }
    for (int64_t i = 0; i < n; i++) x[i] /= sum;
}

void ref_delta_step(double *S, int64_t n, const double *q, const double *k, const double *v,
                    double g, double beta, double *o) {
    const double decay = exp(g);
    for (int64_t i = 0; i < n * n; i++) S[i] *= decay;
    for (int64_t j = 0; j < n; j++) {             /* u_j = Σ_i S[i][j] k_i;  δ_j = β(v_j − u_j) */
        double u = 0;
        for (int64_t i = 0; i < n; i++) u += S[i * n + j] * k[i];
        const double delta = beta * (v[j] - u);
        for (int64_t i = 0; i < n; i++) S[i * n + j] += k[i] * delta;
    }
    for (int64_t j = 0; j < n; j++) {             /* o_j = Σ_i S[i][j] q_i */
        double acc = 0;
        for (int64_t i = 0; i < n; i++) acc += S[i * n + j] * q[i];
        o[j] = acc;
    }
}

bool ref_rope_pair_rotates(const int32_t sections[4], int64_t i) {
    if (!sections) return true;
    const int64_t total = (int64_t)sections[0] + sections[1] + sections[2] + sections[3];
    if (total <= 0) return true;
    const int64_t s = i % total;
    if (s % 3 == 0 && s < 3 * (int64_t)sections[0]) return true;  /* t */
    if (s % 3 == 1 && s < 3 * (int64_t)sections[1]) return true;  /* h */
    if (s % 3 == 2 && s < 3 * (int64_t)sections[2]) return true;  /* w */
    return false;                                                 /* e: position 0 for text */
}

void ref_rope(double *x, int64_t n_rot, int64_t pos, double theta, const int32_t sections[4]) {
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; i++) {
        const double p = ref_rope_pair_rotates(sections, i) ? (double)pos : 0.0;
        const double ang = p * pow(theta, -2.0 * (double)i / (double)n_rot);
        const double c = cos(ang), s = sin(ang);
        const double x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x0 * s + x1 * c;
    }
}

/* ---------------------------------------------------------------- weights */

static void *own(ref_model *rm, void *p) {
    HEARTH_CHECK(rm->n_owned < (int)(sizeof rm->owned / sizeof rm->owned[0]));
    rm->owned[rm->n_owned++] = p;
    return p;
}

/* A small tensor (norms, gates, conv taps) as doubles. */
static double *vec_of(ref_model *rm, const qtensor *q) {
    HEARTH_CHECK(q->data != NULL);
    int64_t n = q->ne[0] * q->ne[1] * q->ne[2] * q->ne[3];
    float *f = xmalloc((size_t)n * sizeof *f);
    int64_t rows = n / q->ne[0];
    for (int64_t r = 0; r < rows; r++)
        quant_dequantize_row(q->type, (const char *)q->data + r * q->row_bytes, f + r * q->ne[0], q->ne[0]);
    double *d = own(rm, xmalloc((size_t)n * sizeof *d));
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    return d;
}

static ref_mat mat_of(ref_model *rm, const qtensor *q, bool cache) {
    HEARTH_CHECK(q->data != NULL);
    ref_mat m = {.q = q, .f = NULL, .n_in = q->ne[0], .n_rows = q->ne[1] * q->ne[2] * q->ne[3]};
    if (m.n_in > rm->max_row) rm->max_row = m.n_in;
    if (q->type == QT_F32) {
        m.f = q->data;
    } else if (cache) {
        size_t bytes = (size_t)m.n_in * (size_t)m.n_rows * sizeof(float);
        if (rm->cached_bytes + bytes <= rm->budget) {
            float *f = own(rm, xmalloc(bytes));
            for (int64_t r = 0; r < m.n_rows; r++)
                quant_dequantize_row(q->type, (const char *)q->data + r * q->row_bytes, f + r * m.n_in, m.n_in);
            rm->cached_bytes += bytes;
            m.f = f;
        }
    }
    return m;
}

ref_model *ref_model_new(const model *m) {
    ref_model *rm = xcalloc(1, sizeof *rm);
    rm->m = m;
    const char *mb = getenv("HEARTH_REF_CACHE_MB");
    rm->budget = mb ? (size_t)strtoull(mb, NULL, 10) << 20 : (size_t)2 << 30;
    rm->token_embd = mat_of(rm, &m->token_embd, false);
    rm->output_norm = vec_of(rm, &m->output_norm);
    rm->n_all = (int)m->hp.n_layer + m->has_mtp;
    if (m->has_mtp) {
        rm->eh_proj = mat_of(rm, &m->mtp.eh_proj, true);
        rm->enorm = vec_of(rm, &m->mtp.enorm);
        rm->hnorm = vec_of(rm, &m->mtp.hnorm);
        rm->head_norm = vec_of(rm, &m->mtp.head_norm);
    }
    for (int il = 0; il < rm->n_all; il++) {
        const model_layer *ml = &m->layers[il];
        ref_layer *l = &rm->layers[il];
        l->recurrent = ml->recurrent;
        l->attn_norm = vec_of(rm, &ml->attn_norm);
        l->post_norm = vec_of(rm, &ml->post_norm);
        if (l->recurrent) {
            l->qkv = mat_of(rm, &ml->attn_qkv, true);
            l->gate_z = mat_of(rm, &ml->attn_gate, true);
            l->beta = mat_of(rm, &ml->ssm_beta, true);
            l->alpha = mat_of(rm, &ml->ssm_alpha, true);
            l->ssm_out = mat_of(rm, &ml->ssm_out, true);
            l->conv = vec_of(rm, &ml->ssm_conv1d);
            l->dt = vec_of(rm, &ml->ssm_dt);
            l->a = vec_of(rm, &ml->ssm_a);
            l->ssm_norm = vec_of(rm, &ml->ssm_norm);
        } else {
            l->wq = mat_of(rm, &ml->attn_q, true);
            l->wk = mat_of(rm, &ml->attn_k, true);
            l->wv = mat_of(rm, &ml->attn_v, true);
            l->wo = mat_of(rm, &ml->attn_out, true);
            l->q_norm = vec_of(rm, &ml->attn_q_norm);
            l->k_norm = vec_of(rm, &ml->attn_k_norm);
        }
        if (m->hp.dense) {
            l->gate_d = mat_of(rm, &ml->ffn_gate, true);
            l->up_d = mat_of(rm, &ml->ffn_up, true);
            l->down_d = mat_of(rm, &ml->ffn_down, true);
            for (int w = 0; w < 3; w++) l->exp_cache[w] = xcalloc(1, sizeof(float *));
            continue;
        }
        l->router = mat_of(rm, &ml->ffn_gate_inp, true);
        l->gate_exps = mat_of(rm, &ml->ffn_gate_exps, false);
        l->up_exps = mat_of(rm, &ml->ffn_up_exps, false);
        l->down_exps = mat_of(rm, &ml->ffn_down_exps, false);
        l->gate_sh = mat_of(rm, &ml->ffn_gate_shexp, true);
        l->up_sh = mat_of(rm, &ml->ffn_up_shexp, true);
        l->down_sh = mat_of(rm, &ml->ffn_down_shexp, true);
        l->gate_inp_sh = vec_of(rm, &ml->ffn_gate_inp_shexp);
        for (int w = 0; w < 3; w++) l->exp_cache[w] = xcalloc((size_t)m->hp.n_expert, sizeof(float *));
    }
    rm->output = mat_of(rm, &m->output, true); /* last: the biggest, cached if budget is left */
    return rm;
}

void ref_model_free(ref_model *rm) {
    if (!rm) return;
    for (int il = 0; il < rm->n_all; il++)
        for (int w = 0; w < 3; w++) {
            for (int64_t e = 0; e < rm->m->hp.n_expert; e++) free(rm->layers[il].exp_cache[w][e]);
            free(rm->layers[il].exp_cache[w]);
        }
    for (int i = 0; i < rm->n_owned; i++) free(rm->owned[i]);
    free(rm);
}

const model *ref_model_of(const ref_model *rm) { return rm->m; }

/* Row r of a matrix as floats: the cached row, or dequantized into buf. */
static const float *mat_row(const ref_mat *m, int64_t r, float *buf) {
    HEARTH_CHECK(r >= 0 && r < m->n_rows);
    if (m->f) return m->f + r * m->n_in;
    quant_dequantize_row(m->q->type, (const char *)m->q->data + r * m->q->row_bytes, buf, m->n_in);
    return buf;
}

/* y[r] = row (row0 + r) · x for r in [0, n): a matrix-vector product on a row range. */
static void matvec(ref_seq *s, const ref_mat *m, int64_t row0, int64_t n, const double *x, double *y) {
    const uint32_t t = m->q->type;
    if (s->act_round && quant_vec_dot_type(t) != QT_F32) { /* the engine's 8-bit input blocks, exactly */
        for (int64_t i = 0; i < m->n_in; i++) s->xf[i] = (float)x[i];
        quant_quantize_act(t, s->xf, s->xblk, m->n_in);
        quant_dequantize_row(quant_vec_dot_type(t), s->xblk, s->xf, m->n_in);
        for (int64_t i = 0; i < m->n_in; i++) s->xr[i] = s->xf[i];
        x = s->xr;
    }
    for (int64_t r = 0; r < n; r++) y[r] = dot_fd(mat_row(m, row0 + r, s->row), x, m->n_in);
}

/* ---------------------------------------------------------------- sequence */

ref_seq *ref_seq_new(ref_model *rm, int64_t max_tokens) {
    const model_hparams *hp = &rm->m->hp;
    HEARTH_CHECK(max_tokens > 0);
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const int64_t S = hp->ssm_d_state, Gv = hp->ssm_dt_rank, C = hp_conv_dim(hp), W = hp->ssm_d_conv;
    const int64_t L = rm->n_all, K = hp->n_expert_used, X = hp->n_expert; /* the MTP block's layer too */
    const int64_t Fm = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp, Fmax = hp->n_ff > Fm ? hp->n_ff : Fm;
    ref_seq *s = xcalloc(1, sizeof *s);
    s->rm = rm;
    s->max_tokens = max_tokens;
    for (int il = 0; il < L; il++) {
        if (rm->layers[il].recurrent) {
            s->lane[il] = xcalloc((size_t)(Gv * S * S), sizeof(double));
            s->ring[il] = xcalloc((size_t)((W - 1) * C), sizeof(double));
        } else {
            s->kv_k[il] = xcalloc((size_t)(max_tokens * Hkv * D), sizeof(double));
            s->kv_v[il] = xcalloc((size_t)(max_tokens * Hkv * D), sizeof(double));
        }
    }
    s->experts = xcalloc((size_t)(L * K), sizeof(int32_t));
    s->own = xcalloc((size_t)(L * K), sizeof(int32_t));
    s->probs_all = xcalloc((size_t)(L * hp->n_expert), sizeof(double));
    s->expert_w = xcalloc((size_t)(L * K), sizeof(double));
    s->hidden = xcalloc((size_t)(L * E), sizeof(double));
    s->row = xcalloc((size_t)rm->max_row, sizeof(float));
    s->xf = xcalloc((size_t)rm->max_row, sizeof(float));
    s->xr = xcalloc((size_t)rm->max_row, sizeof(double));
    s->xblk = xcalloc((size_t)rm->max_row, sizeof(float)); /* 8-bit blocks take < 4 bytes a value */
#define D_ALLOC(n) ((double *)xcalloc((size_t)(n), sizeof(double)))
    s->x = D_ALLOC(E); s->h = D_ALLOC(E); s->out = D_ALLOC(E); s->moe_out = D_ALLOC(E);
    s->qkv = D_ALLOC(C); s->y = D_ALLOC(C); s->z = D_ALLOC(Gv * S); s->bb = D_ALLOC(Gv); s->aa = D_ALLOC(Gv);
    s->o = D_ALLOC((Gv * S > H * D ? Gv * S : H * D));
    s->qg = D_ALLOC(2 * H * D); s->k = D_ALLOC(Hkv * D); s->v = D_ALLOC(Hkv * D);
    s->scores = D_ALLOC(max_tokens); s->att = D_ALLOC(H * D);
    s->probs = D_ALLOC(X); s->g = D_ALLOC(Fmax); s->u = D_ALLOC(Fmax); s->eo = D_ALLOC(E);
#undef D_ALLOC
    return s;
}

ref_seq *ref_seq_clone(const ref_seq *src) {
    const model_hparams *hp = &src->rm->m->hp;
    ref_seq *s = ref_seq_new(src->rm, src->max_tokens);
    const int64_t Hkv = hp->n_head_kv, D = hp->head_dim, S = hp->ssm_d_state, Gv = hp->ssm_dt_rank;
    const int64_t C = hp_conv_dim(hp), W = hp->ssm_d_conv, L = src->rm->n_all, K = hp->n_expert_used;
    s->pos = src->pos;
    s->act_round = src->act_round;
    for (int il = 0; il < L; il++) {
        if (src->lane[il]) memcpy(s->lane[il], src->lane[il], (size_t)(Gv * S * S) * sizeof(double));
        if (src->ring[il]) memcpy(s->ring[il], src->ring[il], (size_t)((W - 1) * C) * sizeof(double));
        if (src->kv_k[il]) {
            memcpy(s->kv_k[il], src->kv_k[il], (size_t)(src->max_tokens * Hkv * D) * sizeof(double));
            memcpy(s->kv_v[il], src->kv_v[il], (size_t)(src->max_tokens * Hkv * D) * sizeof(double));
        }
    }
    memcpy(s->experts, src->experts, (size_t)(L * K) * sizeof(int32_t));
    memcpy(s->own, src->own, (size_t)(L * K) * sizeof(int32_t));
    memcpy(s->probs_all, src->probs_all, (size_t)(L * hp->n_expert) * sizeof(double));
    memcpy(s->expert_w, src->expert_w, (size_t)(L * K) * sizeof(double));
    memcpy(s->hidden, src->hidden, (size_t)(L * hp->n_embd) * sizeof(double));
    return s;
}

void ref_seq_free(ref_seq *s) {
    if (!s) return;
    for (int il = 0; il < MODEL_MAX_LAYERS; il++) {
        free(s->kv_k[il]); free(s->kv_v[il]); free(s->lane[il]); free(s->ring[il]);
    }
    free(s->experts); free(s->own); free(s->probs_all); free(s->expert_w); free(s->hidden); free(s->row); free(s->xf); free(s->xr); free(s->xblk);
    free(s->x); free(s->h); free(s->out); free(s->moe_out);
    free(s->qkv); free(s->y); free(s->z); free(s->bb); free(s->aa); free(s->o);
    free(s->qg); free(s->k); free(s->v); free(s->scores); free(s->att);
    free(s->probs); free(s->g); free(s->u); free(s->eo);
    free(s);
}

/* ---------------------------------------------------------------- layers */

static void gdn_mixer(ref_seq *s, int il, const double *h, double *out) {
    const model_hparams *hp = &s->rm->m->hp;
    const ref_layer *l = &s->rm->layers[il];
    const int64_t S = hp->ssm_d_state, Gk = hp->ssm_n_group, Gv = hp->ssm_dt_rank;
    const int64_t C = hp_conv_dim(hp), W = hp->ssm_d_conv, E = hp->n_embd;
    const double eps = hp->rms_eps;
    double *ring = s->ring[il], *lane = s->lane[il];

    matvec(s, &l->qkv, 0, C, h, s->qkv);
    matvec(s, &l->gate_z, 0, Gv * S, h, s->z);
    matvec(s, &l->beta, 0, Gv, h, s->bb);
    matvec(s, &l->alpha, 0, Gv, h, s->aa);

    /* causal conv over [ring rows (oldest first), current row], then SiLU */
    for (int64_t c = 0; c < C; c++) {
        const double *w = l->conv + c * W;
        double acc = 0;
        for (int64_t j = 0; j < W - 1; j++) acc += w[j] * ring[j * C + c];
        acc += w[W - 1] * s->qkv[c];
        s->y[c] = silu(acc);
    }
    /* the ring keeps the last W-1 pre-conv rows */
    memmove(ring, ring + C, (size_t)((W - 2) * C) * sizeof(double));
    memcpy(ring + (W - 2) * C, s->qkv, (size_t)C * sizeof(double));

    double *q = s->y, *k = s->y + Gk * S, *v = s->y + 2 * Gk * S;
    const double qscale = 1.0 / sqrt((double)S);
    for (int64_t j = 0; j < Gk; j++) {
        l2norm(q + j * S, S, eps);
        l2norm(k + j * S, S, eps);
        for (int64_t i = 0; i < S; i++) q[j * S + i] *= qscale;
    }
    for (int64_t hh = 0; hh < Gv; hh++) {
        const int64_t kh = hh % Gk;
        const double beta = sigmoid(s->bb[hh]);
        const double g = l->a[hh] * softplus(s->aa[hh] + l->dt[hh]);
        double *o = s->o + hh * S;
        ref_delta_step(lane + hh * S * S, S, q + kh * S, k + kh * S, v + hh * S, g, beta, o);
        ref_rmsnorm(o, S, eps, l->ssm_norm);
        for (int64_t i = 0; i < S; i++) o[i] *= silu(s->z[hh * S + i]);
    }
    matvec(s, &l->ssm_out, 0, E, s->o, out);
}

static void attn_mixer(ref_seq *s, int il, const double *h, double *out) {
    const model_hparams *hp = &s->rm->m->hp;
    const ref_layer *l = &s->rm->layers[il];
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, E = hp->n_embd;
    const int64_t pos = s->pos, group = H / Hkv;
    const double eps = hp->rms_eps, theta = hp->rope_theta;

    matvec(s, &l->wq, 0, 2 * H * D, h, s->qg);
    matvec(s, &l->wk, 0, Hkv * D, h, s->k);
    matvec(s, &l->wv, 0, Hkv * D, h, s->v);
    for (int64_t j = 0; j < Hkv; j++) {
        ref_rmsnorm(s->k + j * D, D, eps, l->k_norm);
        ref_rope(s->k + j * D, hp->rope_dims, pos, theta, hp->rope_sections);
    }
    memcpy(s->kv_k[il] + pos * Hkv * D, s->k, (size_t)(Hkv * D) * sizeof(double));
    memcpy(s->kv_v[il] + pos * Hkv * D, s->v, (size_t)(Hkv * D) * sizeof(double));

    const double scale = 1.0 / sqrt((double)D);
    for (int64_t hh = 0; hh < H; hh++) {
        double *q = s->qg + hh * 2 * D;            /* query half; gate half follows */
        const double *gate = q + D;
        ref_rmsnorm(q, D, eps, l->q_norm);
        ref_rope(q, hp->rope_dims, pos, theta, hp->rope_sections);
        const int64_t kv = hh / group;
        for (int64_t t = 0; t <= pos; t++)
            s->scores[t] = dot_dd(q, s->kv_k[il] + (t * Hkv + kv) * D, D) * scale;
        softmax(s->scores, pos + 1);
        double *o = s->att + hh * D;
        for (int64_t i = 0; i < D; i++) o[i] = 0;
        for (int64_t t = 0; t <= pos; t++) {
            const double *vt = s->kv_v[il] + (t * Hkv + kv) * D;
            for (int64_t i = 0; i < D; i++) o[i] += s->scores[t] * vt[i];
        }
        for (int64_t i = 0; i < D; i++) o[i] *= sigmoid(gate[i]);
    }
    matvec(s, &l->wo, 0, E, s->att, out);
}

void ref_mixer(ref_seq *s, int il, const double *h, double *out) {
    HEARTH_CHECK(il >= 0 && il < s->rm->n_all);
    HEARTH_CHECK(s->pos < s->max_tokens);
    if (s->rm->layers[il].recurrent) gdn_mixer(s, il, h, out);
    else attn_mixer(s, il, h, out);
}

/* Expert e's rows [e*rows, (e+1)*rows) of an expert tensor: *row0 is where they start in
 * the returned matrix. Non-F32 experts are dequantized once, on first use, while the
 * budget lasts; past it they are dequantized row by row at every use. */
static ref_mat expert_mat(ref_model *rm, const ref_mat *m, float **slot, int64_t e, int64_t rows, int64_t *row0) {
    *row0 = e * rows;
    if (m->f) return *m;
    if (!*slot) {
        const size_t bytes = (size_t)(rows * m->n_in) * sizeof(float);
        if (rm->cached_bytes + bytes > rm->budget) return *m;
        float *f = xmalloc(bytes);
        for (int64_t r = 0; r < rows; r++)
            quant_dequantize_row(m->q->type, (const char *)m->q->data + (e * rows + r) * m->q->row_bytes, f + r * m->n_in,
                                 m->n_in);
        rm->cached_bytes += bytes;
        *slot = f;
    }
    *row0 = 0;
    return (ref_mat){.q = m->q, .f = *slot, .n_in = m->n_in, .n_rows = rows};
}

/* y = down(silu(gate·x) ⊙ up·x), F the hidden width, rows starting at gate0/up0/down0 */
static void swiglu(ref_seq *s, const ref_mat *gate, int64_t gate0, const ref_mat *up, int64_t up0,
                   const ref_mat *down, int64_t down0, int64_t F, const double *x, double *y) {
    const int64_t E = s->rm->m->hp.n_embd;
    matvec(s, gate, gate0, F, x, s->g);
    matvec(s, up, up0, F, x, s->u);
    for (int64_t i = 0; i < F; i++) s->g[i] = silu(s->g[i]) * s->u[i];
    matvec(s, down, down0, E, s->g, y);
}

void ref_moe(ref_seq *s, int il, const double *h2, double *out) {
    const model_hparams *hp = &s->rm->m->hp;
    const ref_layer *l = &s->rm->layers[il];
    const int64_t E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp;
    int32_t *ids = s->experts + il * K;
    double *wts = s->expert_w + il * K;
    if (hp->dense) { /* qwen35: down(silu(gate h2) * up h2) */
        swiglu(s, &l->gate_d, 0, &l->up_d, 0, &l->down_d, 0, hp->n_ff, h2, out);
        return;
    }

    matvec(s, &l->router, 0, X, h2, s->probs);
    softmax(s->probs, X);
    double sum = 0;
    for (int64_t k = 0; k < K; k++) {             /* top-K, ties to the lower index */
        int64_t best = -1;
        for (int64_t e = 0; e < X; e++) {
            bool taken = false;
            for (int64_t j = 0; j < k; j++) taken |= ids[j] == e;
            if (!taken && (best < 0 || s->probs[e] > s->probs[best])) best = e;
        }
        ids[k] = (int32_t)best;
        wts[k] = s->probs[best];
        sum += wts[k];
    }
    for (int64_t k = 0; k < K; k++) wts[k] /= sum;
    memcpy(s->own + il * K, ids, sizeof(int32_t) * (size_t)K);
    memcpy(s->probs_all + il * X, s->probs, sizeof(double) * (size_t)X);
    if (s->forced) { /* an engine's routing, so that two runs compare arithmetic, not choices */
        sum = 0;
        for (int64_t k = 0; k < K; k++) {
            ids[k] = s->forced[il * K + k];
            HEARTH_CHECK(ids[k] >= 0 && ids[k] < X);
            wts[k] = s->probs[ids[k]];
            sum += wts[k];
        }
        for (int64_t k = 0; k < K; k++) wts[k] /= sum;
    }

    for (int64_t i = 0; i < E; i++) out[i] = 0;
    for (int64_t k = 0; k < K; k++) {
        const int64_t e = ids[k];
        int64_t g0, u0, d0;
        const ref_mat gm = expert_mat(s->rm, &l->gate_exps, &l->exp_cache[0][e], e, F, &g0);
        const ref_mat um = expert_mat(s->rm, &l->up_exps, &l->exp_cache[1][e], e, F, &u0);
        const ref_mat dm = expert_mat(s->rm, &l->down_exps, &l->exp_cache[2][e], e, E, &d0);
        swiglu(s, &gm, g0, &um, u0, &dm, d0, F, h2, s->eo);
        for (int64_t i = 0; i < E; i++) out[i] += wts[k] * s->eo[i];
    }
    swiglu(s, &l->gate_sh, 0, &l->up_sh, 0, &l->down_sh, 0, hp->n_ff_shexp, h2, s->eo);
    const double sg = sigmoid(dot_dd(l->gate_inp_sh, h2, E));
    for (int64_t i = 0; i < E; i++) out[i] += sg * s->eo[i];
}

/* layer il on the residual stream s->x: x += mixer(rmsnorm(x) * attn_norm), then x +=
 * moe(rmsnorm(x) * post_attention_norm) (the trunk's layers and the MTP block's alike) */
static void layer_step(ref_seq *s, int il) {
    const int64_t E = s->rm->m->hp.n_embd;
    const double eps = s->rm->m->hp.rms_eps;
    const ref_layer *l = &s->rm->layers[il];
    memcpy(s->h, s->x, (size_t)E * sizeof(double));
    ref_rmsnorm(s->h, E, eps, l->attn_norm);
    ref_mixer(s, il, s->h, s->out);
    for (int64_t i = 0; i < E; i++) s->x[i] += s->out[i];
    memcpy(s->h, s->x, (size_t)E * sizeof(double));
    ref_rmsnorm(s->h, E, eps, l->post_norm);
    ref_moe(s, il, s->h, s->moe_out);
    for (int64_t i = 0; i < E; i++) s->x[i] += s->moe_out[i];
}

void ref_step(ref_seq *s, int32_t token, double *logits) {
    const ref_model *rm = s->rm;
    const model_hparams *hp = &rm->m->hp;
    const int64_t E = hp->n_embd;
    const double eps = hp->rms_eps;
    HEARTH_CHECK(token >= 0 && token < hp->n_vocab);
    HEARTH_CHECK(s->pos < s->max_tokens);

    const float *emb = mat_row(&rm->token_embd, token, s->row);
    for (int64_t i = 0; i < E; i++) s->x[i] = emb[i];
    for (int il = 0; il < hp->n_layer; il++) {
        layer_step(s, il);
        memcpy(s->hidden + il * E, s->x, (size_t)E * sizeof(double));
    }
    if (logits) {
        memcpy(s->h, s->x, (size_t)E * sizeof(double));
        ref_rmsnorm(s->h, E, eps, rm->output_norm);
        matvec(s, &rm->output, 0, hp->n_vocab, s->h, logits);
    }
    ref_seq_advance(s);
}

void ref_seq_head_input(const ref_seq *s, double *h) {
    const model_hparams *hp = &s->rm->m->hp;
    memcpy(h, s->hidden + (hp->n_layer - 1) * hp->n_embd, (size_t)hp->n_embd * sizeof(double));
    ref_rmsnorm(h, hp->n_embd, hp->rms_eps, s->rm->output_norm);
}

void ref_mtp_row(ref_seq *s, int64_t pos, int32_t token, const double *h_prev, double *h_out, double *logits) {
    const ref_model *rm = s->rm;
    const model_hparams *hp = &rm->m->hp;
    const int64_t E = hp->n_embd;
    const double eps = hp->rms_eps;
    const int il = (int)hp->n_layer;
    HEARTH_CHECK(rm->m->has_mtp && token >= 0 && token < hp->n_vocab && pos >= 0 && pos < s->max_tokens);
    const int64_t saved = s->pos;
    const int32_t *forced = s->forced;
    s->pos = pos, s->forced = NULL; /* the block's layer at the token's position, routed by itself */
    double *cat = xmalloc(sizeof(double) * (size_t)(2 * E));
    const float *emb = mat_row(&rm->token_embd, token, s->row);
    for (int64_t i = 0; i < E; i++) cat[i] = emb[i], cat[E + i] = h_prev ? h_prev[i] : 0.0;
    ref_rmsnorm(cat, E, eps, rm->enorm);
    ref_rmsnorm(cat + E, E, eps, rm->hnorm);
    matvec(s, &rm->eh_proj, 0, E, cat, s->x);
    layer_step(s, il);
    ref_rmsnorm(s->x, E, eps, rm->head_norm);
    if (h_out) memcpy(h_out, s->x, (size_t)E * sizeof(double));
    if (logits) matvec(s, &rm->output, 0, hp->n_vocab, s->x, logits);
    free(cat);
    s->pos = saved, s->forced = forced;
}

void ref_seq_advance(ref_seq *s) {
    HEARTH_CHECK(s->pos < s->max_tokens);
    s->pos++;
}

/* ---------------------------------------------------------------- introspection */

int64_t ref_seq_pos(const ref_seq *s) { return s->pos; }
double *ref_seq_lane(ref_seq *s, int il) { return s->lane[il]; }
double *ref_seq_ring(ref_seq *s, int il) { return s->ring[il]; }
const double *ref_seq_kv_k(const ref_seq *s, int il) { return s->kv_k[il]; }
const double *ref_seq_kv_v(const ref_seq *s, int il) { return s->kv_v[il]; }
const int32_t *ref_seq_experts(const ref_seq *s, int il) { return s->experts + il * s->rm->m->hp.n_expert_used; }
const int32_t *ref_seq_own_experts(const ref_seq *s, int il) { return s->own + il * s->rm->m->hp.n_expert_used; }
const double *ref_seq_router_probs(const ref_seq *s, int il) { return s->probs_all + il * s->rm->m->hp.n_expert; }
void ref_seq_force_experts(ref_seq *s, const int32_t *experts) { s->forced = experts; }
void ref_seq_round_activations(ref_seq *s, bool on) { s->act_round = on; }
const double *ref_seq_expert_weights(const ref_seq *s, int il) {
    return s->expert_w + il * s->rm->m->hp.n_expert_used;
}
const double *ref_seq_hidden(const ref_seq *s, int il) { return s->hidden + il * s->rm->m->hp.n_embd; }
