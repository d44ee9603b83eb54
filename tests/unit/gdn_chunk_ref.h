/* gdn_chunk_ref.h: what the chunked delta rule's tests share (test_gdn_chunk.cc on the CPU
 * emulation, test_cuda.c on a GPU; C that compiles as C++): random rows in the model's
 * ranges, the float64 sequential recurrence, and the error bound of the kernels' own order of
 * operations (gdn_chunk.cuh) by running error analysis. Pieces start at row `from` of a
 * stream, chunks of 64 rows from there (no anchors). */
#ifndef HEARTH_GDN_CHUNK_REF_H
#define HEARTH_GDN_CHUNK_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { GR_DS = 128, GR_C = 64 };

typedef struct gr_stream {
    int Gk, Gv;
    int64_t rows, cd;
    float *cv, *a, *b, *lane; /* (rows, cd), (rows, Gv), (rows, Gv), the start state (Gv, 128, 128) */
} gr_stream;

static double gr_urand(uint64_t *s) { /* [0, 1) */
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (double)(*s >> 11) * 0x1p-53;
}
static double gr_nrand(uint64_t *s) { return sqrt(-2.0 * log(1.0 - gr_urand(s))) * cos(6.283185307179586 * gr_urand(s)); }

/* one sequence's rows as conv_norm_kernel leaves them: q L2-normed and scaled by 1/sqrt(128),
 * k L2-normed, v a SiLU output; beta = sigmoid(x); a = ssm_a softplus(x + dt) with the
 * model's ranges (ssm_a = -exp(A_log), A in [1, 16]; the dt bias of a dt in [0.001, 0.1]),
 * so a lies in about [-10, -1e-4]: per-row decays from ~1 to ~0. The start state is random
 * (entries ~ N(0, 0.3^2)), so S0 takes part from the first chunk. */
static gr_stream gr_stream_new(int64_t rows, int Gk, int Gv, uint64_t *rng) {
    const int64_t cd = 2 * Gk * GR_DS + Gv * GR_DS;
    gr_stream s = {Gk, Gv, rows, cd, (float *)malloc(sizeof(float) * (size_t)(rows * cd)),
                   (float *)malloc(sizeof(float) * (size_t)(rows * Gv)), (float *)malloc(sizeof(float) * (size_t)(rows * Gv)),
                   (float *)malloc(sizeof(float) * (size_t)(Gv * GR_DS * GR_DS))};
    float *ssm_a = (float *)malloc(sizeof(float) * (size_t)Gv), *dt = (float *)malloc(sizeof(float) * (size_t)Gv);
    for (int h = 0; h < Gv; h++) {
        ssm_a[h] = -(float)(1.0 + 15.0 * gr_urand(rng));
        const double d = exp(log(0.001) + gr_urand(rng) * (log(0.1) - log(0.001)));
        dt[h] = (float)log(expm1(d));
    }
    for (int64_t r = 0; r < rows; r++) {
        float *row = s.cv + r * cd;
        for (int hh = 0; hh < 2 * Gk; hh++) {
            double ss = 0;
            for (int i = 0; i < GR_DS; i++) row[hh * GR_DS + i] = (float)gr_nrand(rng), ss += (double)row[hh * GR_DS + i] * row[hh * GR_DS + i];
            const float sc = (float)(1.0 / sqrt(ss + 1e-6)) * (hh < Gk ? 1.0f / sqrtf((float)GR_DS) : 1.0f);
            for (int i = 0; i < GR_DS; i++) row[hh * GR_DS + i] *= sc;
        }
        for (int64_t i = 0; i < Gv * GR_DS; i++) {
            const float x = (float)(1.5 * gr_nrand(rng));
            row[2 * Gk * GR_DS + i] = x / (1.0f + expf(-x));
        }
        for (int h = 0; h < Gv; h++) {
            s.b[r * Gv + h] = 1.0f / (1.0f + expf(-(float)(2.0 * gr_nrand(rng))));
            const float av = (float)(1.5 * gr_nrand(rng)) + dt[h];
            s.a[r * Gv + h] = ssm_a[h] * (av > 20.0f ? av : log1pf(expf(av)));
        }
    }
    for (int64_t i = 0; i < (int64_t)Gv * GR_DS * GR_DS; i++) s.lane[i] = (float)(0.3 * gr_nrand(rng));
    free(ssm_a), free(dt);
    return s;
}

static void gr_stream_free(gr_stream *s) { free(s->cv), free(s->a), free(s->b), free(s->lane); }

/* rows [from, from + len) of s from start state init: o (len, Gv, 128) and the end state
 * (Gv, 128, 128) by S = g S; d = beta (v - S^T k); S += k d^T; o = S^T q, in float64 */
static void gr_sequential(const gr_stream *s, int64_t from, int64_t len, const float *init, double *o, double *lane) {
    const int Gk = s->Gk, Gv = s->Gv;
    for (int64_t i = 0; i < (int64_t)Gv * GR_DS * GR_DS; i++) lane[i] = init[i];
    double d[GR_DS];
    for (int64_t t = 0; t < len; t++) {
        const float *row = s->cv + (from + t) * s->cd;
        for (int h = 0; h < Gv; h++) {
            const float *q = row + (h % Gk) * GR_DS, *k = row + Gk * GR_DS + (h % Gk) * GR_DS, *v = row + 2 * Gk * GR_DS + h * GR_DS;
            const double g = exp((double)s->a[(from + t) * Gv + h]), beta = s->b[(from + t) * Gv + h];
            double *S = lane + (size_t)h * GR_DS * GR_DS;
            for (int i = 0; i < GR_DS * GR_DS; i++) S[i] *= g;
            for (int c = 0; c < GR_DS; c++) {
                double x = 0;
                for (int r = 0; r < GR_DS; r++) x += S[r * GR_DS + c] * k[r];
                d[c] = beta * (v[c] - x);
            }
            for (int r = 0; r < GR_DS; r++)
                for (int c = 0; c < GR_DS; c++) S[r * GR_DS + c] += k[r] * d[c];
            for (int c = 0; c < GR_DS; c++) {
                double x = 0;
                for (int r = 0; r < GR_DS; r++) x += S[r * GR_DS + c] * q[r];
                o[(t * Gv + h) * GR_DS + c] = x;
            }
        }
    }
}

/* Running error analysis (Higham, "Accuracy and Stability of Numerical Algorithms" 3.3): the
 * kernels' own sequence of float operations replayed in double on (value, bound) pairs, bound
 * >= |float result - exact result| to first order. A rounded operation adds u (|value| +
 * bound), u = 2^-24; an operation's inputs carry their bounds (a product: |x| dy + |y| dx +
 * dx dy); expf adds 2 ulp (CUDA's documented maximum, glibc's is less: 4u |value|) to the
 * propagated exp(x) (e^dx - 1). The inputs (rows, gates, start state) are exact: kernel and
 * reference read the same floats. So each output's and state entry's bound comes from the
 * data and the order of operations: it grows with the sums' lengths (128 over the key dim,
 * up to 64 over a chunk's rows), with the terms' sizes (the triangular solve's growth
 * included) and from chunk to chunk through S0. */
typedef struct gr_ev {
    double v, d;
} gr_ev;
#define GR_U 0x1p-24
static gr_ev gr_ex(float f) { gr_ev r = {(double)f, 0.0}; return r; }
static gr_ev gr_rnd(double v, double d) { gr_ev r = {v, d + GR_U * (fabs(v) + d)}; return r; }
static gr_ev gr_mul(gr_ev x, gr_ev y) { return gr_rnd(x.v * y.v, fabs(x.v) * y.d + fabs(y.v) * x.d + x.d * y.d); }
static gr_ev gr_add(gr_ev x, gr_ev y) { return gr_rnd(x.v + y.v, x.d + y.d); }
static gr_ev gr_sub(gr_ev x, gr_ev y) { return gr_rnd(x.v - y.v, x.d + y.d); }
static gr_ev gr_fma(gr_ev x, gr_ev y, gr_ev z) { return gr_rnd(x.v * y.v + z.v, fabs(x.v) * y.d + fabs(y.v) * x.d + x.d * y.d + z.d); }
static gr_ev gr_exp(gr_ev x) {
    const double v = exp(x.v);
    gr_ev r = {v, v * expm1(x.d) + 4 * GR_U * v * exp(x.d)};
    return r;
}
static gr_ev gr_dot(const float *x, const float *y) { /* gc_dot128: one chain, ascending */
    gr_ev s = {0, 0};
    for (int i = 0; i < GR_DS; i++) s = gr_fma(gr_ex(x[i]), gr_ex(y[i]), s);
    return s;
}

/* the bounds of o (len, Gv, 128) and of the end state (Gv, 128, 128) for rows [from, from +
 * len) of s from init, chunks of 64 from `from`: gdn_chunk.cuh's operations in gr_ev */
static void gr_bounds(const gr_stream *s, int64_t from, int64_t len, const float *init, double *ob, double *lb) {
    const int Gk = s->Gk, Gv = s->Gv;
    gr_ev *S = (gr_ev *)malloc(sizeof(gr_ev) * GR_DS * GR_DS), *G = (gr_ev *)malloc(sizeof(gr_ev) * GR_C);
    gr_ev *nA = (gr_ev *)malloc(sizeof(gr_ev) * GR_C * GR_C), *QK = (gr_ev *)malloc(sizeof(gr_ev) * GR_C * GR_C);
    gr_ev *W = (gr_ev *)malloc(sizeof(gr_ev) * GR_C * GR_DS), *U = (gr_ev *)malloc(sizeof(gr_ev) * GR_C * GR_DS);
    gr_ev *Vp = (gr_ev *)malloc(sizeof(gr_ev) * GR_C * GR_DS), *cf = (gr_ev *)malloc(sizeof(gr_ev) * GR_C);
    for (int h = 0; h < Gv; h++) {
        for (int i = 0; i < GR_DS * GR_DS; i++) S[i] = gr_ex(init[(size_t)h * GR_DS * GR_DS + i]);
        for (int64_t c0 = 0; c0 < len; c0 += GR_C) {
            const int L = (int)(len - c0 < (int64_t)GR_C ? len - c0 : (int64_t)GR_C);
            const float *rows = s->cv + (from + c0) * s->cd;
#define GR_Q(i) (rows + (i) * s->cd + (h % Gk) * GR_DS)
#define GR_K(i) (rows + (i) * s->cd + Gk * GR_DS + (h % Gk) * GR_DS)
#define GR_V(i) (rows + (i) * s->cd + 2 * Gk * GR_DS + h * GR_DS)
#define GR_B(i) gr_ex(s->b[(from + c0 + (i)) * Gv + h])
            for (int i = 0; i < L; i++) {
                const gr_ev ai = gr_ex(s->a[(from + c0 + i) * Gv + h]);
                G[i] = i ? gr_add(G[i - 1], ai) : ai;
            }
            for (int i = 0; i < L; i++)
                for (int j = 0; j <= i; j++) {
                    const gr_ev dec = gr_exp(gr_sub(G[i], G[j]));
                    if (j < i) {
                        gr_ev t = gr_mul(gr_mul(GR_B(i), gr_dot(GR_K(i), GR_K(j))), dec);
                        t.v = -t.v;
                        nA[i * GR_C + j] = t;
                    }
                    QK[i * GR_C + j] = gr_mul(gr_dot(GR_Q(i), GR_K(j)), dec);
                }
            for (int i = 0; i < L; i++) {
                const gr_ev bg = gr_mul(GR_B(i), gr_exp(G[i]));
                for (int c = 0; c < GR_DS; c++) {
                    gr_ev w = gr_mul(bg, gr_ex(GR_K(i)[c])), u = gr_mul(GR_B(i), gr_ex(GR_V(i)[c]));
                    for (int j = 0; j < i; j++) w = gr_fma(nA[i * GR_C + j], W[j * GR_DS + c], w), u = gr_fma(nA[i * GR_C + j], U[j * GR_DS + c], u);
                    W[i * GR_DS + c] = w, U[i * GR_DS + c] = u;
                }
            }
            for (int i = 0; i < L; i++)
                for (int c = 0; c < GR_DS; c++) {
                    gr_ev pw = {0, 0}, pq = {0, 0}; /* one chain each over the key dim */
                    for (int r = 0; r < GR_DS; r++) {
                        pw = gr_fma(W[i * GR_DS + r], S[r * GR_DS + c], pw);
                        pq = gr_fma(gr_ex(GR_Q(i)[r]), S[r * GR_DS + c], pq);
                    }
                    Vp[i * GR_DS + c] = gr_sub(U[i * GR_DS + c], pw);
                    gr_ev acc = gr_mul(gr_exp(G[i]), pq);
                    for (int j = 0; j <= i; j++) acc = gr_fma(QK[i * GR_C + j], Vp[j * GR_DS + c], acc);
                    ob[((c0 + i) * Gv + h) * GR_DS + c] = acc.d;
                }
            const int e = L - 1;
            for (int j = 0; j <= e; j++) cf[j] = gr_exp(gr_sub(G[e], G[j]));
            const gr_ev dg = gr_exp(G[e]);
            for (int r = 0; r < GR_DS; r++)
                for (int c = 0; c < GR_DS; c++) {
                    gr_ev acc = gr_mul(dg, S[r * GR_DS + c]);
                    for (int j = 0; j <= e; j++) acc = gr_fma(gr_mul(cf[j], gr_ex(GR_K(j)[r])), Vp[j * GR_DS + c], acc);
                    S[r * GR_DS + c] = acc;
                }
#undef GR_Q
#undef GR_K
#undef GR_V
#undef GR_B
        }
        for (int i = 0; i < GR_DS * GR_DS; i++) lb[(size_t)h * GR_DS * GR_DS + i] = S[i].d;
    }
    free(S), free(G), free(nA), free(QK), free(W), free(U), free(Vp), free(cf);
}

/* |got - ref| <= bound (plus float64's own error in the references) for every entry */
typedef struct gr_stats {
    double max_err, max_ratio, max_bound;
    int64_t bad, n;
} gr_stats;
static void gr_compare(const float *got, const double *ref, const double *bound, int64_t n, gr_stats *st) {
    for (int64_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - ref[i]), b = bound[i] + 1e-12 * (1.0 + fabs(ref[i]));
        st->bad += !(err <= b);
        st->max_err = fmax(st->max_err, err);
        st->max_ratio = fmax(st->max_ratio, err / b);
        st->max_bound = fmax(st->max_bound, b);
    }
    st->n += n;
}

#endif
