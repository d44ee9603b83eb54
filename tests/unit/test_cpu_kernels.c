/* test_cpu_kernels.c: the CPU engine's AVX2/FMA kernels (src/engine/cpu/gdn_avx2.c:
 * cpu_gdn_dot_avx2, cpu_gdn_rows_acc_avx2; src/engine/cpu/attn_avx2.c: cpu_attend_rows_avx2)
 * against their plain C twins (dotf_c, rows_acc_c in gdn.c and attend_head_c in attn.c,
 * static there, so their plain semantics are copied below operation for operation) and
 * against references in double precision, on fresh random inputs.
 *
 * Each kernel and its float twin must lie within a bound DERIVED beside it of the double
 * reference, so the bound is shown to hold (and to mean something) for both. The kernels
 * must also be deterministic (same inputs, same bits), rows_acc must be the FMA chain its
 * header documents, and the attention kernel must give each head the same bits whatever
 * the number of heads sharing the call (attn.c's attend_task relies on it: results do not
 * depend on how heads are split into tasks).
 *
 * Notation: u is the unit roundoff, UF = 2^-24 for float, UD = 2^-53 for double (round to
 * nearest: fl(a op b) = (a op b)(1 + d), |d| <= u, and fma rounds once). gam(k, u) is
 * gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability of Numerical Algorithms, Lemma
 * 3.1): a product of k factors (1 + d_i)^(+-1) with |d_i| <= u is 1 + t with |t| <= gamma_k.
 * For k u <= 0.01, gamma_k <= 1.0102 k u: the "c n 2^-24" of the usual rule, with c ~ 1.
 * Inputs are O(1) and never near under/overflow, so no absolute (subnormal) terms arise. */
#include "harness.h"
#include "engine/cpu/cpu.h"
#include "format/quant.h"
#include "base/util.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define UF 0x1p-24
#define UD 0x1p-53

static double gam(int64_t k, double u) {
    return (double)k * u / (1 - (double)k * u);
}

static const uint64_t SEEDS[] = {1, 2, 0x5eedULL};
#define N_SEEDS ((int)(sizeof SEEDS / sizeof SEEDS[0]))

static const char *no_simd_why(void) {
    return getenv("HEARTH_NO_SIMD")
               ? "AVX2 kernels off (HEARTH_NO_SIMD set): only the C twins are checked"
               : "CPU lacks AVX2/FMA/F16C (quant_simd_active() false): only the C twins are checked";
}

static bool same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

/* worst |err| / bound seen, for the report line */
typedef struct worst {
    double ratio, err, bound;
    int64_t values;
} worst;

static void track(worst *w, double err, double bound) {
    w->values++;
    if (isnan(w->ratio)) return;
    const double r = err == 0 ? 0 : err / bound; /* err > 0 at bound 0: inf; NaN stays */
    if (!(r <= w->ratio)) *w = (worst){r, err, bound, w->values};
}

static void report(const char *what, const worst *w) {
    printf("    %-34s worst |err|/bound %.3g (|err| %.3g, bound %.3g) over %lld values\n", what, w->ratio, w->err,
           w->bound, (long long)w->values);
}

/* inputs: 0 normal (signs mixed: cancellation), 1 uniform in [0.25, 1.25) (all positive),
 * 2 normal times 2^k, k uniform in -8..8 (magnitudes spread over 16 binades) */
#define N_DIST 3
static void gen(uint64_t key, int dist, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = rng_normal(key, (uint64_t)i), u = rng_unit(key ^ 0x9e3779b97f4a7c15ULL, (uint64_t)i);
        x[i] = dist == 0 ? g : dist == 1 ? 0.25f + u : ldexpf(g, (int)(u * 17.0f) - 8);
    }
}

/* ==== GDN dot ==== */

/* gdn.c's dotf_c, verbatim: left-to-right, each product rounded, then the add */
static float dotf_c(const float *x, const float *y, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

static const int64_t DOT_N[] = {0,  1,  2,  7,   8,   9,   15,  16,  17,  31,  32,  33,
                                63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 1000};
#define DOT_NMAX 1000

static void dot_suite(bool simd) {
    worst w = {0}, wl = {0}; /* all n; n >= 64 */
    float *xb = xmalloc(sizeof(float) * (DOT_NMAX + 8)), *yb = xmalloc(sizeof(float) * (DOT_NMAX + 8));
    for (int si = 0; si < N_SEEDS; si++)
        for (int dist = 0; dist < N_DIST; dist++)
            for (size_t ni = 0; ni < sizeof DOT_N / sizeof DOT_N[0]; ni++) {
                const int64_t n = DOT_N[ni];
                const int off = (int)((SEEDS[si] + (uint64_t)ni) % 8); /* unaligned starts too */
                float *x = xb + off, *y = yb + 7 - off;
                const uint64_t key = rng_at(rng_key(SEEDS[si], "dot"), (uint64_t)(ni * N_DIST + (size_t)dist));
                gen(key, dist, x, n);
                gen(key ^ 0xabcdefULL, dist, y, n);
                /* Reference: the products are exact in double (24 + 24 <= 53 significant bits),
                 * the n - 1 adds round: |ref - x.y| <= gam(n - 1, UD) sum |x_i y_i|. */
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    const double p = (double)x[i] * y[i];
                    ref += p;
                    mag += fabs(p);
                }
                /* Bound: in ANY summation order (dotf_c's left-to-right chain, or the kernel's
                 * 4 x 8 lanes of FMA chains, their pairwise combination, the horizontal sum and
                 * the scalar tail), each product x_i y_i passes through at most n roundings
                 * (its multiply, unless fused, and at most n - 1 adds on its way to the root):
                 * fl = sum x_i y_i (1 + t_i), |t_i| <= gam(n, UF) (Higham 3.1), so
                 * |fl - x.y| <= gam(n, UF) sum |x_i y_i|; plus the reference's own error. */
                const double bound = (gam(n, UF) + gam(n, UD)) * mag;
                const float r = simd ? cpu_gdn_dot_avx2(x, y, n) : dotf_c(x, y, n);
                const double err = fabs((double)r - ref);
                track(&w, err, bound);
                if (n >= 64) track(&wl, err, bound);
                CHECK_MSG(err <= bound, "%s dot seed %llu dist %d n %lld: %.9g vs ref %.17g, |err| %.3g > bound %.3g",
                          simd ? "avx2" : "twin", (unsigned long long)SEEDS[si], dist, (long long)n, r, ref, err,
                          bound);
                if (simd) {
                    const float r2 = cpu_gdn_dot_avx2(x, y, n);
                    CHECK_MSG(same_bits(&r, &r2, 1), "avx2 dot not deterministic: n %lld %.9g then %.9g", (long long)n,
                              r, r2);
                }
            }
    report(simd ? "cpu_gdn_dot_avx2 vs double:" : "dotf_c (C twin) vs double:", &w);
    report("  the same, n >= 64 only:", &wl);
    free(xb);
    free(yb);
}

TEST(gdn_dot_twin) {
    dot_suite(false);
}

TEST(gdn_dot_avx2) {
    if (!quant_simd_active()) SKIP(no_simd_why());
    dot_suite(true);
}

/* ==== GDN rows_acc ==== */

/* gdn.c's rows_acc_c, verbatim: y = s0 y0 (rounded), then one axpy per row j (product
 * rounded, then the add); y may be y0 */
static void rows_acc_c(float *y, const float *y0, float s0, const float *x, int64_t xs, const float *c, int64_t m,
                       int64_t n) {
    for (int64_t b = 0; b < n; b++) y[b] = y0 ? s0 * y0[b] : 0.0f;
    for (int64_t j = 0; j < m; j++)
        for (int64_t b = 0; b < n; b++) y[b] += c[j] * x[j * xs + b];
}

/* the order gdn_avx2.c documents for its kernel, element by element: s0 y0[b] rounded (0
 * without y0), then one fused multiply-add per term in order of j. The kernel must equal
 * this bit for bit (whatever strip, 64-wide, 8-wide or scalar tail, element b falls in):
 * that is what keeps the chunked delta rule's points exact. */
static void rows_acc_fma(float *y, const float *y0, float s0, const float *x, int64_t xs, const float *c, int64_t m,
                         int64_t n) {
    for (int64_t b = 0; b < n; b++) {
        float acc = y0 ? s0 * y0[b] : 0.0f;
        for (int64_t j = 0; j < m; j++) acc = fmaf(c[j], x[j * xs + b], acc);
        y[b] = acc;
    }
}

static const int64_t RA_M[] = {0, 1, 2, 3, 7, 17, 64, 65, 128};
static const int64_t RA_N[] = {0, 1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 200};
#define RA_MMAX 128
#define RA_NMAX 200
#define RA_GUARD 8
enum { Y0_NULL, Y0_SEPARATE, Y0_ALIAS, Y0_MODES };
static const char *y0_name[Y0_MODES] = {"y0 NULL", "y0 separate", "y == y0"};
#define N_S0 4

static void rows_acc_suite(bool simd) {
    worst w = {0}, wl = {0}; /* all m; m >= 64 */
    const float sentinel = -12345.5f;
    const int64_t xs_max = RA_NMAX + 5;
    float *x = xmalloc(sizeof(float) * (size_t)(RA_MMAX * xs_max)), *c = xmalloc(sizeof(float) * (RA_MMAX + 1));
    float *y0 = xmalloc(sizeof(float) * RA_NMAX), *y = xmalloc(sizeof(float) * (RA_NMAX + RA_GUARD));
    float *y2 = xmalloc(sizeof(float) * (RA_NMAX + RA_GUARD)), *yf = xmalloc(sizeof(float) * RA_NMAX);
    int64_t chains = 0;
    for (int si = 0; si < N_SEEDS; si++)
        for (size_t mi = 0; mi < sizeof RA_M / sizeof RA_M[0]; mi++)
            for (size_t ni = 0; ni < sizeof RA_N / sizeof RA_N[0]; ni++)
                for (int s0i = 0; s0i < N_S0; s0i++)
                    for (int mode = 0; mode < Y0_MODES; mode++)
                        for (int xsi = 0; xsi < 2; xsi++) {
                            const int64_t m = RA_M[mi], n = RA_N[ni], xs = n + 5 * xsi; /* xs = n as gdn.c, or padded */
                            const uint64_t key = rng_at(
                                rng_key(SEEDS[si], "rows_acc"),
                                (uint64_t)(((mi * 16 + ni) * N_S0 + (size_t)s0i) * 8 + (size_t)mode * 2 + (size_t)xsi));
                            const int dist = (int)(key % N_DIST);
                            gen(key, dist, x, m * xs);
                            gen(key ^ 1, 0, c, m);
                            gen(key ^ 2, dist, y0, n);
                            /* s0: 0, 1 (d = u + ...), a decay in (0, 1] (exp(g)), a negative value */
                            const float s0 = s0i == 0   ? 0.0f
                                             : s0i == 1 ? 1.0f
                                             : s0i == 2 ? 0.05f + 0.95f * rng_unit(key, 7)
                                                        : -1.375f;
                            const float *y0p = mode == Y0_NULL ? NULL : y0;
                            /* the call under test, into y (y holds y0 first when aliased) */
                            for (int64_t b = 0; b < n + RA_GUARD; b++)
                                y[b] = b < n && mode == Y0_ALIAS ? y0[b] : sentinel;
                            const float *y0arg = mode == Y0_ALIAS ? y : y0p;
                            if (simd)
                                cpu_gdn_rows_acc_avx2(y, y0arg, s0, x, xs, c, m, n);
                            else
                                rows_acc_c(y, y0arg, s0, x, xs, c, m, n);
                            for (int64_t b = n; b < n + RA_GUARD; b++)
                                CHECK_MSG(y[b] == sentinel, "rows_acc wrote past n = %lld (at %lld)", (long long)n,
                                          (long long)b);
                            for (int64_t b = 0; b < n; b++) {
                                /* Reference: every term t is exact in double (two floats' product);
                                 * the m adds round: |ref - y| <= gam(m, UD) sum |t|. */
                                double ref = 0, mag = 0;
                                if (y0p) ref = (double)s0 * y0[b], mag = fabs(ref);
                                for (int64_t j = 0; j < m; j++) {
                                    const double t = (double)c[j] * x[j * xs + b];
                                    ref += t;
                                    mag += fabs(t);
                                }
                                /* Bound: y[b] is a sum of m + 1 terms (m without y0). rows_acc_c: s0 y0
                                 * rounds once at its multiply and m times at the adds; c_j x_jb once at
                                 * its multiply and m - j times at the adds: <= m + 1 roundings each.
                                 * The kernel: s0 y0 rounds at the multiply and in each of the m FMAs;
                                 * c_j x_jb enters exact into its FMA and sees m - j roundings: <= m + 1.
                                 * So |y[b] - exact| <= gam(m + 1, UF) sum |t| (Higham 3.1), plus the
                                 * reference's own error. m = 0 without y0: bound 0, y must be exactly 0. */
                                const double bound = (gam(m + 1, UF) + gam(m + 1, UD)) * mag;
                                const double err = fabs((double)y[b] - ref);
                                track(&w, err, bound);
                                if (m >= 64) track(&wl, err, bound);
                                CHECK_MSG(err <= bound,
                                          "%s rows_acc seed %llu m %lld n %lld xs %lld s0 %g %s: y[%lld] = %.9g vs ref "
                                          "%.17g, |err| %.3g > bound %.3g",
                                          simd ? "avx2" : "twin", (unsigned long long)SEEDS[si], (long long)m,
                                          (long long)n, (long long)xs, s0, y0_name[mode], (long long)b, y[b], ref, err,
                                          bound);
                            }
                            if (!simd) continue;
                            /* the documented FMA chain, bit for bit */
                            rows_acc_fma(yf, y0p, s0, x, xs, c, m, n);
                            CHECK_MSG(same_bits(y, yf, n),
                                      "avx2 rows_acc m %lld n %lld %s: not the per-element FMA chain", (long long)m,
                                      (long long)n, y0_name[mode]);
                            chains += n;
                            /* determinism: again, from fresh buffers */
                            for (int64_t b = 0; b < n + RA_GUARD; b++)
                                y2[b] = b < n && mode == Y0_ALIAS ? y0[b] : sentinel;
                            cpu_gdn_rows_acc_avx2(y2, mode == Y0_ALIAS ? y2 : y0p, s0, x, xs, c, m, n);
                            CHECK_MSG(same_bits(y, y2, n + RA_GUARD),
                                      "avx2 rows_acc m %lld n %lld %s: not deterministic", (long long)m, (long long)n,
                                      y0_name[mode]);
                        }
    report(simd ? "cpu_gdn_rows_acc_avx2 vs double:" : "rows_acc_c (C twin) vs double:", &w);
    report("  the same, m >= 64 only:", &wl);
    if (simd)
        printf("    cpu_gdn_rows_acc_avx2: %lld elements checked bit for bit against the documented fmaf chain\n",
               (long long)chains);
    free(x);
    free(c);
    free(y0);
    free(y);
    free(y2);
    free(yf);
}

TEST(gdn_rows_acc_twin) {
    rows_acc_suite(false);
}

TEST(gdn_rows_acc_avx2) {
    if (!quant_simd_active()) SKIP(no_simd_why());
    rows_acc_suite(true);
}

/* ==== attention ==== */

/* attn.c's attend_head_c, operation for operation, with the engine's context replaced by
 * what it reads from it: k, v point at KV head hk's slice of row 0 (the engine's
 * s->k[il] + hk * D), rows kv_stride (= Hkv * D) elements apart, f16 or f32; kbuf is the
 * converted key row (sc + n_ctx there). */
static void attend_head_c(const float *q, const void *k, const void *v, bool f16, int64_t kv_stride, int64_t n_keys,
                          int64_t D, float scale, float *sc, float *kbuf, float *o) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n_keys; j++) {
        const float *kr;
        if (f16) {
            const f16_t *k16 = (const f16_t *)k + j * kv_stride;
            for (int64_t i = 0; i < D; i++) kbuf[i] = f16_to_f32(k16[i]);
            kr = kbuf;
        } else {
            kr = (const float *)k + j * kv_stride;
        }
        float d = 0;
        for (int64_t i = 0; i < D; i++) d += q[i] * kr[i];
        sc[j] = d * scale;
        if (sc[j] > mx) mx = sc[j];
    }
    float sum = 0;
    for (int64_t j = 0; j < n_keys; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    const float inv = 1.0f / sum;
    memset(o, 0, sizeof(float) * (size_t)D);
    for (int64_t j = 0; j < n_keys; j++) {
        const float p = sc[j] * inv;
        if (f16) {
            const f16_t *v16 = (const f16_t *)v + j * kv_stride;
            for (int64_t i = 0; i < D; i++) o[i] += p * f16_to_f32(v16[i]);
        } else {
            const float *vr = (const float *)v + j * kv_stride;
            for (int64_t i = 0; i < D; i++) o[i] += p * vr[i];
        }
    }
}

/* Relative error rho(u) of the computed probabilities p^_j against the exact softmax p_j of
 * the exact scores s_j = scale (q . k_j) (scale: the float the engine passes), n keys:
 *  1. score: d^ = fl(q . k_j) has |d^ - d| <= gam(D, u) A_j, A_j = sum_i |q_i k_ji| (the dot
 *     bound above; |d| <= A_j), then one rounding at the scale: |s^_j - s_j| <=
 *     scale A_j (gam(D) + u (1 + gam(D))) <= gam(D + 1, u) scale A_j <= eps := gam(D + 1, u) amax,
 *     amax = max_j scale A_j.
 *  2. the exact softmax of the perturbed scores, p~_j = p_j e^(e_j) / sum_i p_i e^(e_i) with
 *     |e_j| <= eps, lies in p_j [e^(-2 eps), e^(2 eps)].
 *  3. mx is one of the s^ exactly; s^_j - mx in [-R, 0], R <= range(s) + 2 eps, rounds with
 *     absolute error <= u R, and the exponential (expf; the kernel's
 *     cpu_exp_avx2, checked by exp_avx2) is within 1 ulp (relative 2u): each e^_j =
 *     exp(s^_j - mx)(1 + a_j), |a_j| <= alpha := (1 + 2u) e^(u R) - 1; in the ratio
 *     e^_j / sum e^_i these give a factor in [(1 - alpha)/(1 + alpha), (1 + alpha)/(1 - alpha)].
 *  4. the sum of n positive terms from 0 rounds n - 1 times per term at most (attend_head_c
 *     adds in order; the kernel in 8 lanes, then across them, fewer): S^ = S (1 + t),
 *     |t| <= gam(n - 1, u), so 1/S^ is within a factor [1/(1 + gam), 1/(1 - gam)] of 1/S;
 *     inv = fl(1/S^) and p^ = fl(e^ inv) round twice more: (1 + u)^2.
 *  The upper factor is e^(2 eps) (1 + alpha)/(1 - alpha) (1 + u)^2 / (1 - gam(n - 1)) =: 1 + rho,
 *  and the lower one is >= 1/(1 + rho) >= 1 - rho, so |p^_j - p_j| <= rho p_j. Both the
 *  kernel (the same softmax code) and attend_head_c follow these steps. */
static double attn_rho(double u, int64_t n, int64_t D, double amax, double range) {
    const double eps = gam(D + 1, u) * amax;
    const double alpha = expm1(u * (range + 2 * eps) + log1p(2 * u));
    return expm1(2 * eps + log1p(alpha) - log1p(-alpha) + 2 * log1p(u) - log1p(-gam(n - 1, u)));
}

/* Output o_d = sum_j p_j v_jd: the computed sum of n products p^_j v_jd (attend_head_c: each
 * product rounded, then n - 1 adds from 0; the kernel: one FMA chain per column) is within
 * gam(n, u) sum_j p^_j |v_jd| <= gam(n, u)(1 + rho) W_d of sum_j p^_j v_jd (the dot bound),
 * W_d = sum_j p_j |v_jd|; and |sum_j (p^_j - p_j) v_jd| <= rho W_d. So
 *   |o^_d - o_d| <= (gam(n, u)(1 + rho) + rho) W_d.
 * The double reference obeys the same bound with u = UD (its exp within 1 ulp too), which is
 * added; amax, range and W_d are taken from the double reference, whose relative error
 * (~1e-13) is far below the margins seen. */
static void attend_ref(const float *q, const float *kd, const float *vd, int64_t kv_stride, int64_t n, int64_t D,
                       float scale, double *p, double *o, double *bound) {
    double smax = -INFINITY, smin = INFINITY, amax = 0;
    for (int64_t j = 0; j < n; j++) {
        double d = 0, a = 0;
        for (int64_t i = 0; i < D; i++) {
            const double t = (double)q[i] * kd[j * kv_stride + i];
            d += t;
            a += fabs(t);
        }
        p[j] = (double)scale * d;
        amax = fmax(amax, (double)scale * a);
        smax = fmax(smax, p[j]);
        smin = fmin(smin, p[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < n; j++) sum += p[j] = exp(p[j] - smax);
    for (int64_t j = 0; j < n; j++) p[j] /= sum;
    const double rf = attn_rho(UF, n, D, amax, smax - smin), rd = attn_rho(UD, n, D, amax, smax - smin);
    const double kf = gam(n, UF) * (1 + rf) + rf, kdd = gam(n, UD) * (1 + rd) + rd;
    for (int64_t d = 0; d < D; d++) {
        double od = 0, wd = 0;
        for (int64_t j = 0; j < n; j++) {
            od += p[j] * vd[j * kv_stride + d];
            wd += p[j] * fabs((double)vd[j * kv_stride + d]);
        }
        o[d] = od;
        bound[d] = (kf + kdd) * wd;
    }
}

static const int64_t AT_D[] = {16, 48, 128, 256};
static const int64_t AT_N[] = {1, 2, 3, 17, 300};
static const float AT_QS[] = {1.0f, 3.0f}; /* query scale: scores of std ~1, and sharper (std ~3) */
#define AT_HKV 2                           /* KV heads in a cache row; the calls read KV head AT_HK's slice */
#define AT_HK 1
#define AT_GROUP 4 /* query heads of that KV head: H = 8; 4 is the most one call takes (ATTN_HEADS) */
#define AT_H (AT_HKV * AT_GROUP)
#define AT_DMAX 256
#define AT_NMAX 300
#define AT_GUARD 16

static void attend_suite(bool simd) {
    worst w = {0};
    const float sentinel = -9876.25f;
    const size_t rows = AT_NMAX + 2; /* two rows past the last key, NaN: must not be read */
    float *qf = xmalloc(sizeof(float) * AT_H * 2 * AT_DMAX);
    float *kf = xmalloc(sizeof(float) * rows * AT_HKV * AT_DMAX),
          *vf = xmalloc(sizeof(float) * rows * AT_HKV * AT_DMAX);
    f16_t *k16 = xmalloc(sizeof(f16_t) * rows * AT_HKV * AT_DMAX),
          *v16 = xmalloc(sizeof(f16_t) * rows * AT_HKV * AT_DMAX);
    float *ao = xmalloc(sizeof(float) * AT_H * AT_DMAX), *ao2 = xmalloc(sizeof(float) * AT_H * AT_DMAX);
    float *alone = xmalloc(sizeof(float) * AT_GROUP * AT_DMAX), *ot = xmalloc(sizeof(float) * AT_DMAX);
    float *sc = xmalloc(sizeof(float) * (AT_GROUP * AT_NMAX + AT_GUARD)), *kbuf = xmalloc(sizeof(float) * AT_DMAX);
    float *acc = xmalloc(sizeof(float) * (AT_GROUP * AT_DMAX + AT_GUARD)); /* the kernel's partial sums */
    double *p = xmalloc(sizeof(double) * AT_NMAX), *oref = xmalloc(sizeof(double) * AT_GROUP * AT_DMAX);
    double *bnd = xmalloc(sizeof(double) * AT_GROUP * AT_DMAX);
    int64_t split_checks = 0;
    for (int si = 0; si < N_SEEDS - 1; si++)
        for (size_t di = 0; di < sizeof AT_D / sizeof AT_D[0]; di++)
            for (size_t ni = 0; ni < sizeof AT_N / sizeof AT_N[0]; ni++)
                for (int f16 = 0; f16 < 2; f16++)
                    for (size_t qi = 0; qi < sizeof AT_QS / sizeof AT_QS[0]; qi++) {
                        const int64_t D = AT_D[di], n = AT_N[ni], kv_stride = AT_HKV * D;
                        const float scale = 1.0f / sqrtf((float)D); /* as attend_task */
                        const uint64_t key = rng_at(rng_key(SEEDS[si], "attend"),
                                                    (uint64_t)(((di * 8 + ni) * 2 + (size_t)f16) * 2 + qi));
                        /* q rows as the engine lays them: per head [query D | gate D]; the gate
                         * halves are NaN, so reading them shows */
                        for (int64_t h = 0; h < AT_H; h++)
                            for (int64_t i = 0; i < D; i++) {
                                qf[h * 2 * D + i] = AT_QS[qi] * rng_normal(key, (uint64_t)(h * 2 * D + i));
                                qf[h * 2 * D + D + i] = NAN;
                            }
                        for (int64_t j = 0; j < (int64_t)rows; j++)
                            for (int64_t i = 0; i < kv_stride; i++) {
                                const int64_t e = j * kv_stride + i;
                                float kx = rng_normal(key ^ 0x4b, (uint64_t)e),
                                      vx = rng_normal(key ^ 0x56, (uint64_t)e);
                                if (j >= n) kx = vx = NAN;
                                k16[e] = f32_to_f16(kx);
                                v16[e] = f32_to_f16(vx);
                                /* kf, vf: what the kernel reads, as floats (f16 decodes exactly) */
                                kf[e] = f16 ? f16_to_f32(k16[e]) : kx;
                                vf[e] = f16 ? f16_to_f32(v16[e]) : vx;
                            }
                        const void *kb = f16 ? (const void *)(k16 + AT_HK * D) : (const void *)(kf + AT_HK * D);
                        const void *vb = f16 ? (const void *)(v16 + AT_HK * D) : (const void *)(vf + AT_HK * D);
                        const float *qg = qf + AT_HK * AT_GROUP * 2 * D; /* the group's first head */
                        for (int64_t g = 0; g < AT_GROUP; g++)
                            attend_ref(qg + g * 2 * D, kf + AT_HK * D, vf + AT_HK * D, kv_stride, n, D, scale, p,
                                       oref + g * D, bnd + g * D);
                        char ctx[96];
                        snprintf(ctx, sizeof ctx, "D %lld n_keys %lld %s qscale %g seed %llu", (long long)D,
                                 (long long)n, f16 ? "f16" : "f32", (double)AT_QS[qi], (unsigned long long)SEEDS[si]);
                        if (!simd) {
                            for (int64_t g = 0; g < AT_GROUP; g++) {
                                for (int64_t j = 0; j < n; j++) sc[j] = NAN;
                                attend_head_c(qg + g * 2 * D, kb, vb, f16, kv_stride, n, D, scale, sc, kbuf, ot);
                                for (int64_t d = 0; d < D; d++) {
                                    const double err = fabs((double)ot[d] - oref[g * D + d]);
                                    track(&w, err, bnd[g * D + d]);
                                    CHECK_MSG(err <= bnd[g * D + d],
                                              "twin head %lld o[%lld] %.9g vs ref %.17g: |err| %.3g > %.3g; %s",
                                              (long long)g, (long long)d, ot[d], oref[g * D + d], err, bnd[g * D + d],
                                              ctx);
                                }
                            }
                            continue;
                        }
                        /* every (ng, first head h0) split of the group, ng = 1 first (each head
                         * alone): o at the engine's place for the heads (ao + hq D, o_stride D); the
                         * rest of ao and the scratch past ng n_keys must stay untouched; the scratch
                         * starts as garbage (NaN). Each call is made twice (into ao2, scratch 1e30
                         * the second time): same bits. */
                        for (int ng = 1; ng <= AT_GROUP; ng++)
                            for (int h0 = 0; h0 + ng <= AT_GROUP; h0++) {
                                const int64_t hq = AT_HK * AT_GROUP + h0; /* first query head of the call */
                                for (int rep = 0; rep < 2; rep++) {
                                    float *out = rep ? ao2 : ao;
                                    for (int64_t i = 0; i < AT_H * D; i++) out[i] = sentinel;
                                    for (int64_t i = 0; i < ng * n + AT_GUARD; i++) sc[i] = rep ? 1e30f : NAN;
                                    for (int64_t i = 0; i < ng * D + AT_GUARD; i++) acc[i] = rep ? 1e30f : NAN;
                                    cpu_attend_rows_avx2(1, ng, qf + hq * 2 * D, 0, 2 * D, kb, vb, f16, kv_stride, &n, D,
                                                         scale, sc, n, acc, out + hq * D, 0, D);
                                    for (int64_t i = ng * n; i < ng * n + AT_GUARD; i++)
                                        CHECK_MSG(rep ? sc[i] == 1e30f : isnan(sc[i]),
                                                  "scratch written past ng n_keys; %s", ctx);
                                    for (int64_t i = ng * D; i < ng * D + AT_GUARD; i++)
                                        CHECK_MSG(rep ? acc[i] == 1e30f : isnan(acc[i]),
                                                  "sums' scratch written past ng D; %s", ctx);
                                }
                                CHECK_MSG(same_bits(ao, ao2, AT_H * D), "ng %d h0 %d: not deterministic; %s", ng, h0,
                                          ctx);
                                for (int64_t i = 0; i < AT_H * D; i++)
                                    if (i < hq * D || i >= (hq + ng) * D)
                                        CHECK_MSG(ao[i] == sentinel, "o written outside its %d heads (at %lld); %s", ng,
                                                  (long long)i, ctx);
                                for (int gg = 0; gg < ng; gg++) {
                                    const int64_t g = h0 + gg;
                                    const float *og = ao + (hq + gg) * D;
                                    if (ng == 1) memcpy(alone + g * D, og, sizeof(float) * (size_t)D);
                                    CHECK_MSG(same_bits(og, alone + g * D, D),
                                              "head %lld computed with ng %d (first %d) differs from it alone; %s",
                                              (long long)g, ng, h0, ctx);
                                    split_checks++;
                                    for (int64_t d = 0; d < D; d++) {
                                        const double err = fabs((double)og[d] - oref[g * D + d]);
                                        track(&w, err, bnd[g * D + d]);
                                        CHECK_MSG(
                                            err <= bnd[g * D + d],
                                            "avx2 ng %d head %lld o[%lld] %.9g vs ref %.17g: |err| %.3g > %.3g; %s", ng,
                                            (long long)g, (long long)d, og[d], oref[g * D + d], err, bnd[g * D + d],
                                            ctx);
                                    }
                                }
                            }
                    }
    report(simd ? "cpu_attend_rows_avx2, one row, vs double:" : "attend_head_c (C twin) vs double:", &w);
    if (simd)
        printf("    cpu_attend_rows_avx2, one row: %lld (head, ng, first head) results checked bit for bit against the head "
               "computed alone\n",
               (long long)split_checks);
    free(qf);
    free(kf);
    free(vf);
    free(k16);
    free(v16);
    free(ao);
    free(ao2);
    free(alone);
    free(ot);
    free(sc);
    free(acc);
    free(kbuf);
    free(p);
    free(oref);
    free(bnd);
}

/* cpu_exp_avx2, the softmax's exponential: relative error <= 2^-23 (the "1 ulp" attn_rho takes)
 * against exp in double wherever e^x is a normal float, over every 61st float in [-104, 0]
 * (~18 million) and the ends; within 2^-149 (one subnormal step) where it is subnormal; 0
 * below -104 and at -inf. Prints the worst relative error in units of u = 2^-24. */
TEST(exp_avx2) {
    if (!quant_simd_active()) SKIP(no_simd_why());
    enum { CH = 4096 };
    static float x[CH], y[CH];
    const uint32_t top = 0xC2D00000u; /* -104.0f */
    double wrel = 0, worst_x = 0;
    int64_t checked = 0;
    uint32_t b = 0x80000000u; /* -0.0f, then down to -104 */
    while (b <= top) {
        int m = 0;
        for (; m < CH && b <= top; m++, b += 61) memcpy(&x[m], &b, 4);
        if (b > top && m < CH) x[m++] = -104.0f;
        cpu_exp_avx2(x, y, m);
        for (int i = 0; i < m; i++) {
            const double e = exp((double)x[i]), err = fabs((double)y[i] - e);
            if (e >= FLT_MIN) {
                const double rel = err / e;
                if (rel > wrel) wrel = rel, worst_x = x[i];
                CHECK_MSG(rel <= 0x1p-23, "exp(%.9g): %.9g against %.17g, relative error %.3g > 2^-23", x[i], y[i], e, rel);
            } else {
                CHECK_MSG(err <= 0x1p-149, "exp(%.9g) subnormal: %.9g against %.17g", x[i], y[i], e);
            }
            checked++;
        }
    }
    const float out[3] = {-104.5f, -1e30f, -INFINITY};
    cpu_exp_avx2(out, y, 3);
    for (int i = 0; i < 3; i++) CHECK_MSG(y[i] == 0.0f, "exp(%g) = %g, not 0", out[i], y[i]);
    printf("  %lld values in [-104, 0]: worst relative error %.3f u (at x = %.9g)\n", (long long)checked, wrel / 0x1p-24,
           worst_x);
}

TEST(attend_twin) {
    attend_suite(false);
}

TEST(attend_avx2) {
    if (!quant_simd_active()) SKIP(no_simd_why());
    attend_suite(true);
}

/* cpu_attend_rows_avx2: 1..8 consecutive rows (row r sees n0 + r keys) of 1..4 heads against
 * one KV head, key blocks shared: each row's heads give the bits of that row alone (nr = 1,
 * the decode step's call). Key and value rows past the tile's last key are NaN (a read of one shows), and
 * the tile's lengths cross a 32-key block's end and end odd and even. */
TEST(attend_rows_avx2) {
    if (!quant_simd_active()) SKIP(no_simd_why());
    const int64_t D = 256, Hkv = 2, kv_stride = Hkv * D, nmax = 144, H = 8, R = 8; /* R: rows a tile (ATTN_ROWS) */
    const int64_t n0s[] = {1, 30, 31, 63, 100, 136};
    float *qf = xmalloc(sizeof(float) * R * H * 2 * D), *kf = xmalloc(sizeof(float) * nmax * kv_stride),
          *vf = xmalloc(sizeof(float) * nmax * kv_stride);
    f16_t *k16 = xmalloc(sizeof(f16_t) * nmax * kv_stride), *v16 = xmalloc(sizeof(f16_t) * nmax * kv_stride);
    float *o = xmalloc(sizeof(float) * R * H * D), *o1 = xmalloc(sizeof(float) * 4 * D), *sc = xmalloc(sizeof(float) * R * 4 * nmax),
          *acc = xmalloc(sizeof(float) * R * 4 * D), *sc1 = xmalloc(sizeof(float) * 4 * nmax),
          *acc1 = xmalloc(sizeof(float) * 4 * D);
    int64_t checked = 0;
    for (size_t ni = 0; ni < sizeof n0s / sizeof n0s[0]; ni++)
        for (int f16 = 0; f16 < 2; f16++)
            for (int nr = 1; nr <= R; nr++)
                for (int ng = 1; ng <= 4; ng++) {
                    const int64_t n0 = n0s[ni], last = n0 + nr - 1;
                    const uint64_t key = rng_at(rng_key(SEEDS[0], "rows"), (uint64_t)((ni * 2 + (size_t)f16) * 32 + (size_t)((nr - 1) * 4 + ng - 1)));
                    for (int64_t i = 0; i < R * H * 2 * D; i++) qf[i] = 0.3f * rng_normal(key, (uint64_t)i);
                    for (int64_t e = 0; e < nmax * kv_stride; e++) {
                        const bool past = e / kv_stride >= last;
                        const float kx = past ? NAN : rng_normal(key ^ 0x4b, (uint64_t)e), vx = past ? NAN : rng_normal(key ^ 0x56, (uint64_t)e);
                        k16[e] = f32_to_f16(kx), v16[e] = f32_to_f16(vx), kf[e] = kx, vf[e] = vx;
                    }
                    const void *kb = f16 ? (const void *)(k16 + D) : (const void *)(kf + D); /* KV head 1 */
                    const void *vb = f16 ? (const void *)(v16 + D) : (const void *)(vf + D);
                    const float *q = qf + 4 * 2 * D; /* heads 4.. of each row: KV head 1's group */
                    int64_t nk[8];
                    for (int r = 0; r < nr; r++) nk[r] = n0 + r;
                    for (int64_t i = 0; i < R * H * D; i++) o[i] = NAN;
                    cpu_attend_rows_avx2(nr, ng, q, H * 2 * D, 2 * D, kb, vb, f16, kv_stride, nk, D, 1.0f / 16.0f, sc, last, acc, o,
                                         H * D, D);
                    for (int r = 0; r < nr; r++) {
                        cpu_attend_rows_avx2(1, ng, q + r * H * 2 * D, 0, 2 * D, kb, vb, f16, kv_stride, &nk[r], D, 1.0f / 16.0f, sc1,
                                             nk[r], acc1, o1, 0, D);
                        CHECK_MSG(!memcmp(o + r * H * D, o1, sizeof(float) * (size_t)(ng * D)),
                                  "rows: row %d of %d (%lld keys, %d heads, %s) differs from the row alone", r, nr,
                                  (long long)nk[r], ng, f16 ? "f16" : "f32");
                        checked++;
                    }
                }
    printf("  %lld rows of tiles (1..8 rows, 1..4 heads, f16 and f32, 1..143 keys) = each row alone, bit for bit\n",
           (long long)checked);
    free(qf), free(kf), free(vf), free(k16), free(v16), free(o), free(o1), free(sc), free(acc), free(sc1), free(acc1);
}

int main(void) {
    RUN(gdn_dot_twin);
    RUN(gdn_dot_avx2);
    RUN(gdn_rows_acc_twin);
    RUN(gdn_rows_acc_avx2);
    RUN(exp_avx2);
    RUN(attend_twin);
    RUN(attend_avx2);
    RUN(attend_rows_avx2);
    return harness_done();
}
