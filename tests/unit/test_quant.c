/* test_quant.c: block types against derived error bounds, f16/bf16 exhaustively, the AVX2
 * dots against the scalar ones, and everything against ggml's own answers
 * (tests/fixtures/quant/, written by tools/peer/make_quant_fixtures.sh).
 * U below is the float unit roundoff 2^-24; every tolerance is derived beside its use. */
#include "harness.h"
#include "format/quant.h"
#include "base/util.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#define U 0x1p-24

static const uint32_t QTYPES[] = {QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q8_K};

/* ---- inputs ---- */

enum dist { D_GAUSS, D_UNIFORM, D_OUTLIERS, D_OFFSET, D_TINY, D_SPARSE, D_COUNT };
static const char *dist_name[D_COUNT] = {"gauss", "uniform", "outliers", "offset", "tiny", "sparse"};

static void gen(enum dist dist, uint64_t key, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = rng_normal(key, (uint64_t)i), u = rng_unit(key ^ 0x55, (uint64_t)i);
        switch (dist) {
        case D_GAUSS: x[i] = g; break;
        case D_UNIFORM: x[i] = 2 * u - 1; break;
        case D_OUTLIERS: x[i] = u < 0.02f ? 40 * g : g; break;   /* a few values 40x the rest */
        case D_OFFSET: x[i] = 2.5f + 0.4f * u; break;              /* all positive: mins matter */
        /* small but with block scales still normal f16 (>= 2^-14), which the bounds assume */
        case D_TINY: x[i] = 0.02f * g; break;
        default: x[i] = u < 0.85f ? 0 : g; break;                  /* mostly exact zeros */
        }
    }
}

static bool quiet_nan16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

/* ---- type table ---- */

TEST(type_table) {
    CHECK(qtype_block_elems(QT_Q4_K) == 256 && qtype_block_bytes(QT_Q4_K) == 144);
    CHECK(qtype_block_elems(QT_Q5_K) == 256 && qtype_block_bytes(QT_Q5_K) == 176);
    CHECK(qtype_block_elems(QT_Q6_K) == 256 && qtype_block_bytes(QT_Q6_K) == 210);
    CHECK(qtype_block_elems(QT_Q8_K) == 256 && qtype_block_bytes(QT_Q8_K) == 292);
    CHECK(qtype_block_elems(QT_Q8_0) == 32 && qtype_block_bytes(QT_Q8_0) == 34);
    CHECK(qtype_block_bytes(QT_BF16) == 2 && qtype_block_bytes(QT_F32) == 4);
    CHECK(qtype_block_bytes(QT_Q2_K) == 84 && qtype_block_bytes(QT_Q3_K) == 110);
    CHECK(qtype_block_bytes(23) == 136 && qtype_block_elems(39) == 32 && qtype_block_bytes(39) == 17);
    CHECK(strcmp(qtype_name(QT_Q4_K), "q4_K") == 0 && strcmp(qtype_name(QT_BF16), "bf16") == 0);
    CHECK(strcmp(qtype_name(20), "iq4_nl") == 0 && strcmp(qtype_name(29), "iq1_m") == 0);
    CHECK(strcmp(qtype_name(4), "type4") == 0 && strcmp(qtype_name(1000), "type1000") == 0);
    CHECK(!qtype_known(4) && !qtype_known(31) && !qtype_known(43) && !qtype_known(0xffffffffu));
    CHECK(qtype_row_bytes(QT_Q4_K, 512) == 288 && qtype_row_bytes(QT_Q4_K, 100) == 0);
    CHECK(qtype_row_bytes(QT_F16, 7) == 14 && qtype_row_bytes(4, 32) == 0);
    int nsup = 0;
    for (uint32_t t = 0; t < 64; t++) nsup += qtype_supported(t);
    CHECK(nsup == 8 && qtype_supported(QT_Q8_K) && !qtype_supported(QT_Q4_0));
    CHECK(quant_vec_dot_type(QT_Q6_K) == QT_Q8_K && quant_vec_dot_type(QT_Q8_0) == QT_Q8_0);
    CHECK(quant_vec_dot_type(QT_BF16) == QT_F32 && quant_vec_dot_type(QT_F16) == QT_F32);
    CHECK(quant_act_row_bytes(QT_Q4_K, 512) == 584 && quant_act_row_bytes(QT_Q8_0, 64) == 68);
    CHECK(quant_act_row_bytes(QT_F16, 10) == 40);
}

/* ---- f16 / bf16 ---- */

__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) { return _cvtss_sh(f, 0); }

TEST(f16_exhaustive) {
    int bad_rt = 0, bad_tie = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((f16_t)h);
        if (quiet_nan16((uint16_t)h)) {
            bad_rt += !isnan(f) || !quiet_nan16(f32_to_f16(f));
            continue;
        }
        bad_rt += f32_to_f16(f) != h;
        /* the midpoint to the next value up (exact in float) rounds to the even one, and
         * one float ulp either side of it rounds to the nearer one */
        uint32_t mag = h & 0x7fff;
        if (mag >= 0x7bff) continue; /* 65504 and up: overflow edges, checked below */
        double lo = f16_to_f32((f16_t)mag), hi = f16_to_f32((f16_t)(mag + 1));
        float mid = (float)((lo + hi) / 2), sign = (h & 0x8000) ? -1.0f : 1.0f;
        uint16_t even = (mag & 1) ? (uint16_t)(mag + 1) : (uint16_t)mag, s = (uint16_t)(h & 0x8000);
        bad_tie += f32_to_f16(sign * mid) != (s | even);
        bad_tie += f32_to_f16(sign * nextafterf(mid, 0)) != (s | mag);
        bad_tie += f32_to_f16(sign * nextafterf(mid, INFINITY)) != (s | (mag + 1));
    }
    CHECK_MSG(bad_rt == 0, "%d f16 values do not round-trip", bad_rt);
    CHECK_MSG(bad_tie == 0, "%d midpoint roundings wrong", bad_tie);
    CHECK(f32_to_f16(1.0f) == 0x3c00 && f32_to_f16(-2.0f) == 0xc000 && f32_to_f16(-0.0f) == 0x8000);
    CHECK(f32_to_f16(65504.f) == 0x7bff && f32_to_f16(65519.99f) == 0x7bff);
    CHECK(f32_to_f16(65520.f) == 0x7c00 && f32_to_f16(-1e10f) == 0xfc00 && f32_to_f16(INFINITY) == 0x7c00);
    CHECK(f32_to_f16(0x1p-24f) == 0x0001 && f32_to_f16(0x1p-25f) == 0 && f32_to_f16(0x1.8p-24f) == 0x0002);
    CHECK(f32_to_f16(0x1.000002p-25f) == 0x0001 && f32_to_f16(1e-30f) == 0 && f32_to_f16(-1e-45f) == 0x8000);
    CHECK(f32_to_f16(1.0f / 3) == 0x3555 && f32_to_f16(0x1p-14f) == 0x0400);
    CHECK(f16_to_f32(0x3555) == 0.333251953125f && f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(isinf(f16_to_f32(0xfc00)) && f16_to_f32(0xfc00) < 0);
    CHECK(quiet_nan16(f32_to_f16(NAN)) && quiet_nan16(f32_to_f16(-NAN)));
    /* against the F16C instruction on many random bit patterns (NaNs included) */
    if (__builtin_cpu_supports("f16c")) {
        int bad_hw = 0;
        for (uint64_t i = 0; i < 2000000; i++) {
            uint32_t bits = (uint32_t)rng_at(71, i);
            float f;
            memcpy(&f, &bits, 4);
            bad_hw += f32_to_f16(f) != hw_f32_to_f16(f);
        }
        CHECK_MSG(bad_hw == 0, "%d of 2M random floats differ from F16C", bad_hw);
    }
}

TEST(bf16_exhaustive) {
    int bad_rt = 0, bad_tie = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_f32((bf16_t)h);
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) {
            bf16_t r = f32_to_bf16(f);
            bad_rt += !isnan(f) || (r & 0x7f80) != 0x7f80 || !(r & 0x40);
            continue;
        }
        bad_rt += f32_to_bf16(f) != h;
        uint32_t mag = h & 0x7fff;
        if (mag >= 0x7f7f) continue;
        uint32_t lo_bits = mag << 16, mid_bits = lo_bits + 0x8000; /* exact midpoint */
        uint16_t s = (uint16_t)(h & 0x8000), even = (uint16_t)((mag & 1) ? mag + 1 : mag);
        float mid;
        uint32_t b = mid_bits | ((uint32_t)s << 16);
        memcpy(&mid, &b, 4);
        bad_tie += f32_to_bf16(mid) != (s | even);
        bad_tie += f32_to_bf16(nextafterf(mid, 0)) != (s | mag);
        bad_tie += f32_to_bf16(nextafterf(mid, s ? -INFINITY : INFINITY)) != (s | (mag + 1));
    }
    CHECK_MSG(bad_rt == 0, "%d bf16 values do not round-trip", bad_rt);
    CHECK_MSG(bad_tie == 0, "%d midpoint roundings wrong", bad_tie);
    CHECK(f32_to_bf16(1.0f) == 0x3f80 && f32_to_bf16(3.4e38f) == 0x7f80 && f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(f32_to_bf16(1.00390625f) == 0x3f80 && f32_to_bf16(1.01171875f) == 0x3f82);
    CHECK(isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

/* ---- round trips ---- */

/* max over a row of |x - dequant(quant(x))| / bound, with the bound per element below */
typedef struct { double worst_ratio, rms, rms_x; } rt_stats;

/* largest |x| of each block of be values */
static double block_amax(const float *x, int be) {
    double m = 0;
    for (int i = 0; i < be; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* Per-element error bound of one block (be values), derived from the quantizer:
 *  Q8_0/Q8_K: d = amax/127; q = round(x * (1/d)) is off from x/d by <= 1/2 + 127 * 2.01U;
 *    the dequant product adds <= 128 d U: |e| <= d (0.5 + 400U) for Q8_K. Q8_0 quantizes
 *    with the float d but stores d in f16 (relative 2^-11 while d is a normal f16), and
 *    |q| <= 127 multiplies that change: |e| <= d (0.5 + 127 2^-11 + 400U).
 *  Q4_K/Q5_K (N = 15/31 levels), per 32-value sub-block, lo = min(x, 0), hi = max x,
 *    s0 = (hi - lo)/N: the fit's first candidate (step s0 from lo) errs <= s0/2 per value;
 *    the kept fit has weighted squared error sum_k w_k e_k^2 no larger, with weights
 *    w_k = rms(x) + |x_k|, so each e_i <= s0/2 sqrt(W/w_i). Storing scale and min on the
 *    6-bit grids of steps D = f16(d) and Dm = f16(dmin) moves them by <= (D + dD)/2 + 63 dD
 *    (dD = f16 rounding of D: max(D 2^-11, 2^-25)); re-quantizing to the nearest stored
 *    level is no worse than keeping the fit's levels, so |e| grows by <= N |step change| +
 *    |min change|; float arithmetic adds <= 64U(|x| + 63 N D + 63 Dm).
 *  Q6_K, per 16-value group (symmetric, weights x^2): the first candidate (step amax/32)
 *    errs <= s0 = amax/32 per value (the clipped end); the fit keeps
 *    sum_k x_k^2 e_k^2 <= s0^2 sum x^2, so e_i <= s0 sqrt(sum x^2)/|x_i| (useless near 0:
 *    nearest_level covers those); the 8-bit group scales on step D move the step by
 *    <= (D + dD)/2 + 128 dD, times at most 32 levels; plus float slop as above. */
static void bounds_block(uint32_t t, const float *x, const void *blk, double *bound) {
    if (t == QT_Q8_0 || t == QT_Q8_K) {
        int be = t == QT_Q8_0 ? 32 : 256;
        double d = block_amax(x, be) / 127;
        double f16_shift = t == QT_Q8_0 ? 127 * 0x1p-11 : 0;
        for (int i = 0; i < be; i++) bound[i] = d * (0.5 + f16_shift + 400 * U);
        return;
    }
    if (t == QT_Q4_K || t == QT_Q5_K) {
        int N = t == QT_Q4_K ? 15 : 31;
        const block_q4_K *b4 = blk;
        const block_q5_K *b5 = blk;
        double D = f16_to_f32(t == QT_Q4_K ? b4->d : b5->d), Dm = f16_to_f32(t == QT_Q4_K ? b4->dmin : b5->dmin);
        double dD = fmax(D * 0x1p-11, 0x1p-25), dDm = fmax(Dm * 0x1p-11, 0x1p-25);
        double move = N * ((D + dD) / 2 + 63 * dD) + (Dm + dDm) / 2 + 63 * dDm;
        for (int j = 0; j < 8; j++) {
            const float *xs = x + 32 * j;
            double lo = 0, hi = xs[0], sx2 = 0, W = 0;
            for (int l = 0; l < 32; l++) { lo = fmin(lo, xs[l]); hi = fmax(hi, xs[l]); sx2 += (double)xs[l] * xs[l]; }
            double av = sqrt(sx2 / 32), s0 = (hi - lo) / N;
            for (int l = 0; l < 32; l++) W += av + fabs(xs[l]);
            for (int l = 0; l < 32; l++) {
                double wi = av + fabs(xs[l]);
                double fit = wi > 0 ? s0 / 2 * sqrt(W / wi) * (1 + 1e-3) : 0;
                bound[32 * j + l] = fit + move + 64 * U * (fabs(xs[l]) + 63 * N * D + 63 * Dm);
            }
        }
        return;
    }
    /* Q6_K */
    const block_q6_K *b6 = blk;
    double D = fabs(f16_to_f32(b6->d)), dD = fmax(D * 0x1p-11, 0x1p-25);
    double move = 32 * ((D + dD) / 2 + 128 * dD);
    for (int g = 0; g < 16; g++) {
        const float *xs = x + 16 * g;
        double sx2 = 0, s0 = block_amax(xs, 16) / 32;
        for (int l = 0; l < 16; l++) sx2 += (double)xs[l] * xs[l];
        for (int l = 0; l < 16; l++) {
            double fit = xs[l] != 0 ? s0 * sqrt(sx2) / fabs(xs[l]) * (1 + 1e-3) : INFINITY;
            bound[16 * g + l] = fit + move + 64 * U * (fabs(xs[l]) + 127 * 32 * D);
        }
    }
}

static rt_stats round_trip(uint32_t t, const float *x, int64_t n) {
    size_t rb = qtype_row_bytes(t, n);
    uint8_t *q = xmalloc(rb);
    float *y = xmalloc((size_t)n * 4);
    double *bound = xmalloc(256 * sizeof(double));
    quant_quantize_row(t, x, q, n);
    quant_dequantize_row(t, q, y, n);
    int64_t be = qtype_block_elems(t);
    size_t bb = qtype_block_bytes(t);
    rt_stats s = {0, 0, 0};
    for (int64_t b = 0; b < n / be; b++) {
        bounds_block(t, x + b * be, q + b * bb, bound);
        for (int64_t i = 0; i < be; i++) {
            double e = fabs((double)x[b * be + i] - y[b * be + i]);
            s.rms += e * e;
            s.rms_x += (double)x[b * be + i] * x[b * be + i];
            double r = e == 0 ? 0 : e / bound[i];
            if (!(r <= s.worst_ratio)) s.worst_ratio = r; /* NaN sticks */
        }
    }
    s.rms = sqrt(s.rms / n);
    s.rms_x = sqrt(s.rms_x / n);
    free(q); free(y); free(bound);
    return s;
}

TEST(round_trip_bounds) {
    const int64_t n = 256 * 16;
    float *x = xmalloc(n * 4);
    for (size_t k = 0; k < sizeof QTYPES / sizeof QTYPES[0]; k++) {
        uint32_t t = QTYPES[k];
        for (int dist = 0; dist < D_COUNT; dist++) {
            for (uint64_t rep = 0; rep < 4; rep++) {
                gen((enum dist)dist, rng_key(rep, dist_name[dist]) + t, x, n);
                rt_stats s = round_trip(t, x, n);
                CHECK_MSG(s.worst_ratio <= 1, "%s %s: error %.3g x its bound", qtype_name(t),
                          dist_name[dist], s.worst_ratio);
                if (rep == 0 && getenv("HEARTH_TEST_VERBOSE"))
                    printf("    %-5s %-9s rms err/rms x %.2e, worst err/bound %.3f\n", qtype_name(t),
                           dist_name[dist], s.rms / s.rms_x, s.worst_ratio);
            }
        }
    }
    /* all zero and constant blocks come back exactly (constant: Q8 types and K-quant mins) */
    for (size_t k = 0; k < sizeof QTYPES / sizeof QTYPES[0]; k++) {
        uint32_t t = QTYPES[k];
        memset(x, 0, 512 * 4);
        rt_stats s = round_trip(t, x, 512);
        CHECK_MSG(s.worst_ratio == 0, "%s: zeros not exact", qtype_name(t));
    }
    /* f16/bf16: nearest representable, relative 2^-11 / 2^-8 (or the subnormal step) */
    for (int dist = 0; dist < D_COUNT; dist++) {
        gen((enum dist)dist, 99 + (uint64_t)dist, x, n);
        uint16_t *h = xmalloc(n * 2);
        float *y = xmalloc(n * 4);
        int bad = 0;
        quant_quantize_row(QT_F16, x, h, n);
        quant_dequantize_row(QT_F16, h, y, n);
        for (int64_t i = 0; i < n; i++) bad += fabsf(x[i] - y[i]) > fmaxf(fabsf(x[i]) * 0x1p-11f, 0x1p-25f);
        quant_quantize_row(QT_BF16, x, h, n);
        quant_dequantize_row(QT_BF16, h, y, n);
        for (int64_t i = 0; i < n; i++) bad += fabsf(x[i] - y[i]) > fabsf(x[i]) * 0x1p-8f;
        CHECK_MSG(bad == 0, "%s: %d f16/bf16 values off", dist_name[dist], bad);
        free(h); free(y);
    }
    free(x);
}

/* Grid of one block, found through dequantize alone: all levels 0, then all levels 1. */
static void k_grid(uint32_t t, const void *blk, double *base, double *step) {
    size_t bb = qtype_block_bytes(t);
    uint8_t c0[256], c1[256];
    float v0[256], v1[256];
    memcpy(c0, blk, bb);
    memcpy(c1, blk, bb);
    if (t == QT_Q6_K) {
        block_q6_K *a = (block_q6_K *)c0, *b = (block_q6_K *)c1;
        memset(a->ql, 0, sizeof a->ql); memset(a->qh, 0, sizeof a->qh);
        memset(b->ql, 0x11, sizeof b->ql); memset(b->qh, 0, sizeof b->qh);
    } else if (t == QT_Q5_K) {
        block_q5_K *a = (block_q5_K *)c0, *b = (block_q5_K *)c1;
        memset(a->qs, 0, sizeof a->qs); memset(a->qh, 0, sizeof a->qh);
        memset(b->qs, 0x11, sizeof b->qs); memset(b->qh, 0, sizeof b->qh);
    } else {
        block_q4_K *a = (block_q4_K *)c0, *b = (block_q4_K *)c1;
        memset(a->qs, 0, sizeof a->qs);
        memset(b->qs, 0x11, sizeof b->qs);
    }
    quant_dequantize_row(t, c0, v0, 256);
    quant_dequantize_row(t, c1, v1, 256);
    for (int i = 0; i < 256; i++) { base[i] = v0[i]; step[i] = (double)v1[i] - v0[i]; }
}

/* Each value goes to the nearest level of the grid its block stores (so packing, scale
 * decoding and clamping are right), up to the float rounding of the dequantization
 * (3 roundings of terms <= |base| + N |step|). */
TEST(nearest_level) {
    const uint32_t kt[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K};
    const int64_t n = 256 * 8;
    float *x = xmalloc(n * 4), *y = xmalloc(n * 4);
    uint8_t *q = xmalloc(qtype_row_bytes(QT_Q5_K, n) + 1024);
    double base[256], step[256];
    for (int k = 0; k < 3; k++) {
        uint32_t t = kt[k];
        int levels = t == QT_Q4_K ? 16 : t == QT_Q5_K ? 32 : 64;
        int bad = 0;
        for (int dist = 0; dist < D_COUNT; dist++) {
            gen((enum dist)dist, 500 + 10 * (uint64_t)dist + t, x, n);
            quant_quantize_row(t, x, q, n);
            quant_dequantize_row(t, q, y, n);
            for (int64_t b = 0; b < n / 256; b++) {
                k_grid(t, q + b * qtype_block_bytes(t), base, step);
                for (int i = 0; i < 256; i++) {
                    double xv = x[b * 256 + i], best = INFINITY;
                    for (int L = 0; L < levels; L++) best = fmin(best, fabs(xv - (base[i] + L * step[i])));
                    double tol = 4 * U * (fabs(base[i]) + levels * fabs(step[i])) + 1e-30;
                    if (fabs(xv - y[b * 256 + i]) > best + tol) {
                        if (bad++ < 3)
                            fprintf(stderr, "    %s %s x=%g got %g best %g\n", qtype_name(t), dist_name[dist],
                                    xv, y[b * 256 + i], best);
                    }
                }
            }
        }
        CHECK_MSG(bad == 0, "%s: %d values not on their nearest level", qtype_name(t), bad);
    }
    free(x); free(y); free(q);
}

/* ---- dots ---- */

/* magnitude helpers: per element |w| + 2|m| bounds the weight's parts (scale*level and
 * min) before they cancel; m comes from dequantizing the block with all levels 0 */
static void weight_parts(uint32_t t, const void *w, int64_t n, float *deq, double *mag) {
    quant_dequantize_row(t, w, deq, n);
    if (t != QT_Q4_K && t != QT_Q5_K) {
        for (int64_t i = 0; i < n; i++) mag[i] = fabs(deq[i]);
        return;
    }
    double base[256], step[256];
    for (int64_t b = 0; b < n / 256; b++) {
        k_grid(t, (const uint8_t *)w + b * qtype_block_bytes(t), base, step);
        for (int i = 0; i < 256; i++) mag[b * 256 + i] = fabs(deq[b * 256 + i]) + 2 * fabs(base[i]);
    }
}

static void random_act_q8_k(uint64_t key, block_q8_K *a, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        a[b].d = 0.01f + rng_unit(key, (uint64_t)b);
        for (int i = 0; i < 256; i++) a[b].qs[i] = (int8_t)((int)(rng_at(key + 1, (uint64_t)(b * 256 + i)) % 255) - 127);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += a[b].qs[16 * g + l];
            a[b].bsums[g] = (int16_t)s;
        }
    }
}

/* random bytes for a weight block, with finite f16 scales (any level pattern is legal) */
static void random_weight_blocks(uint32_t t, uint64_t key, uint8_t *w, int64_t nb) {
    size_t bb = qtype_block_bytes(t);
    for (size_t i = 0; i < nb * bb; i++) w[i] = (uint8_t)rng_at(key, i);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * bb;
        f16_t d = f32_to_f16(0.001f + 0.01f * rng_unit(key + 7, (uint64_t)b));
        f16_t dm = f32_to_f16(0.001f + 0.01f * rng_unit(key + 8, (uint64_t)b));
        if (t == QT_Q6_K) memcpy(&((block_q6_K *)p)->d, &d, 2);
        else if (t == QT_Q8_0) memcpy(&((block_q8_0 *)p)->d, &d, 2);
        else { memcpy(p, &d, 2); memcpy(p + 2, &dm, 2); }
        if (t == QT_Q8_0) /* no -128: neither quantizer emits it, and the kernels rely on that */
            for (int i = 0; i < 32; i++) if (((block_q8_0 *)p)->qs[i] == -128) ((block_q8_0 *)p)->qs[i] = -127;
    }
}

TEST(simd_matches_scalar) {
    if (!quant_simd_active()) SKIP(getenv("HEARTH_NO_SIMD") ? "HEARTH_NO_SIMD set" : "CPU lacks AVX2/FMA/F16C");
    const int64_t max_n = 256 * 9;
    uint8_t *w = xmalloc(qtype_row_bytes(QT_F32, max_n));
    uint8_t *a = xmalloc(qtype_row_bytes(QT_F32, max_n) + 4096);
    float *x = xmalloc(max_n * 4), *wf = xmalloc(max_n * 4);
    /* K-quants: integer sums exact on both paths and the same float finish: same bits */
    const uint32_t kt[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K};
    int bad_k = 0, runs = 0;
    for (int k = 0; k < 3; k++)
        for (int64_t nb = 1; nb <= 9; nb++)
            for (uint64_t r = 0; r < 30; r++) {
                uint64_t key = rng_key(r * 100 + (uint64_t)nb, qtype_name(kt[k]));
                if (r % 2) random_weight_blocks(kt[k], key, w, nb);
                else { gen((enum dist)(r / 2 % D_COUNT), key, x, nb * 256); quant_quantize_row(kt[k], x, w, nb * 256); }
                if (r % 3) random_act_q8_k(key + 3, (block_q8_K *)a, nb);
                else { gen(D_GAUSS, key + 3, x, nb * 256); quant_quantize_act(kt[k], x, a, nb * 256); }
                float s = quant_dot_ref(kt[k], w, a, nb * 256), v = quant_dot_avx2(kt[k], w, a, nb * 256);
                if (memcmp(&s, &v, 4)) {
                    if (bad_k++ < 3) fprintf(stderr, "    %s nb=%lld: scalar %.9g avx2 %.9g\n", qtype_name(kt[k]), (long long)nb, s, v);
                }
                runs++;
            }
    CHECK_MSG(bad_k == 0, "%d of %d K-quant dots differ", bad_k, runs);

    /* Q8_0: scalar adds block by block; AVX2 keeps 2 x 8 lanes of FMA sums then adds 4
     * ways. Both are exact integer block sums times the same d_b, so each differs from the
     * exact sum by <= (nb + 5) U sum_b |d_b| sum_i |qw_i qa_i| (a term sees at most nb+5
     * roundings): bound (2 nb + 10) U T. */
    int bad_q8 = 0;
    for (int64_t nb = 1; nb <= 70; nb += 3)
        for (uint64_t r = 0; r < 10; r++) {
            uint64_t key = rng_key(r, "q8_0") + (uint64_t)nb;
            random_weight_blocks(QT_Q8_0, key, w, nb);
            gen((enum dist)(r % D_COUNT), key + 1, x, nb * 32);
            quant_quantize_act(QT_Q8_0, x, a, nb * 32);
            const block_q8_0 *bw = (const block_q8_0 *)w, *ba = (const block_q8_0 *)a;
            double T = 0;
            for (int64_t b = 0; b < nb; b++) {
                double sa = 0;
                for (int i = 0; i < 32; i++) sa += fabs((double)bw[b].qs[i] * ba[b].qs[i]);
                T += fabs((double)(f16_to_f32(bw[b].d) * f16_to_f32(ba[b].d))) * sa;
            }
            double s = quant_dot_ref(QT_Q8_0, w, a, nb * 32), v = quant_dot_avx2(QT_Q8_0, w, a, nb * 32);
            if (!(fabs(s - v) <= (2.0 * nb + 10) * U * T)) bad_q8++;
        }
    CHECK_MSG(bad_q8 == 0, "%d Q8_0 dots outside the bound", bad_q8);

    /* float rows, any length (tails): AVX2 lanes see <= n/32 + 2 FMAs, then <= 5 adds of the
     * combine, <= 7 of the tail and 1 final; the reference sums in double then rounds once:
     * |diff| <= (n/32 + 20) U sum |w a|. */
    const uint32_t ft[] = {QT_F32, QT_F16, QT_BF16};
    int bad_f = 0;
    for (int k = 0; k < 3; k++)
        for (int64_t n = 1; n <= max_n; n = n * 3 / 2 + 1)
            for (uint64_t r = 0; r < 4; r++) {
                uint64_t key = rng_key(r + (uint64_t)n, qtype_name(ft[k]));
                gen((enum dist)(r % D_COUNT), key, x, n);
                quant_quantize_row(ft[k], x, w, n);
                quant_dequantize_row(ft[k], w, wf, n);
                gen(D_GAUSS, key + 1, (float *)a, n);
                double T = 0;
                for (int64_t i = 0; i < n; i++) T += fabs((double)wf[i] * ((float *)a)[i]);
                double s = quant_dot_ref(ft[k], w, a, n), v = quant_dot_avx2(ft[k], w, a, n);
                if (!(fabs(s - v) <= (n / 32.0 + 20) * U * T)) {
                    if (bad_f++ < 3) fprintf(stderr, "    %s n=%lld: %.9g vs %.9g\n", qtype_name(ft[k]), (long long)n, s, v);
                }
            }
    CHECK_MSG(bad_f == 0, "%d float dots outside the bound", bad_f);
    CHECK(quant_dot(QT_Q4_K, w, a, 0) == 0);
    free(w); free(a); free(x); free(wf);
}

/* quant_dot_rows (several weight rows x several activation rows) gives each pair the bits
 * of its single quant_dot, for every type and any shape (groups of 4 and their tails) */
TEST(dot_rows_match_single) {
    const uint32_t types[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q8_0, QT_F32, QT_F16, QT_BF16};
    enum { MAXW = 5, MAXA = 11, MAXNB = 3 };
    const int64_t max_n = 256 * MAXNB;
    float *x = xmalloc(max_n * 4);
    uint8_t *w = xmalloc(MAXW * qtype_row_bytes(QT_F32, max_n));
    uint8_t *act = xmalloc(MAXA * qtype_row_bytes(QT_F32, max_n));
    float *out = xmalloc(sizeof(float) * MAXA * (MAXW + 3));
    int bad = 0, bad_ref = 0, runs = 0;
    for (int k = 0; k < 7; k++)
        for (uint64_t r = 0; r < 40; r++) {
            const uint32_t t = types[k];
            uint64_t key = rng_key(r, qtype_name(t));
            const int64_t nb = 1 + (int64_t)(rng_at(key, 1) % MAXNB), n = nb * 256;
            const int nw = 1 + (int)(rng_at(key, 2) % MAXW), na = 1 + (int)(rng_at(key, 3) % MAXA);
            const size_t wb = qtype_row_bytes(t, n), ab = quant_act_row_bytes(t, n);
            const size_t ys = MAXW + 3; /* output rows wider than nw: nothing outside [0, nw) is written */
            for (int o = 0; o < nw; o++) {
                if (t == QT_Q4_K || t == QT_Q5_K || t == QT_Q6_K || t == QT_Q8_0) {
                    if (r % 2) random_weight_blocks(t, key + 10 + (uint64_t)o, w + o * wb, n / qtype_block_elems(t));
                    else { gen((enum dist)(r / 2 % D_COUNT), key + 10 + (uint64_t)o, x, n); quant_quantize_row(t, x, w + o * wb, n); }
                } else {
                    gen((enum dist)(r % D_COUNT), key + 10 + (uint64_t)o, x, n);
                    quant_quantize_row(t, x, w + o * wb, n);
                }
            }
            const void *a[MAXA];
            float *y[MAXA];
            for (int i = 0; i < na; i++) {
                gen((enum dist)((r + (uint64_t)i) % D_COUNT), key + 100 + (uint64_t)i, x, n);
                quant_quantize_act(t, x, act + i * ab, n);
                a[i] = act + i * ab;
                y[i] = out + i * ys;
            }
            for (int ref = 0; ref < 2; ref++) {
                for (size_t i = 0; i < MAXA * ys; i++) out[i] = -7.0f;
                if (ref) quant_dot_rows_ref(t, n, w, wb, nw, a, na, y);
                else quant_dot_rows(t, n, w, wb, nw, a, na, y);
                for (int i = 0; i < na; i++)
                    for (int o = 0; o < (int)ys; o++) {
                        float want = o >= nw ? -7.0f : ref ? quant_dot_ref(t, w + o * wb, a[i], n) : quant_dot(t, w + o * wb, a[i], n);
                        if (memcmp(&want, &y[i][o], 4)) {
                            if ((ref ? bad_ref : bad) < 3)
                                fprintf(stderr, "    %s%s nw=%d na=%d n=%lld pair (%d,%d): %.9g vs %.9g\n", qtype_name(t),
                                        ref ? " ref" : "", nw, na, (long long)n, o, i, want, y[i][o]);
                            if (ref) bad_ref++;
                            else bad++;
                        }
                    }
            }
            runs++;
        }
    CHECK_MSG(bad == 0, "%d pairs of quant_dot_rows differ from quant_dot (%d runs)", bad, runs);
    CHECK_MSG(bad_ref == 0, "%d pairs of quant_dot_rows_ref differ from quant_dot_ref", bad_ref);
    free(x); free(w); free(act); free(out);
}

/* where the AVX-512 tiles are in use, the AVX2 tiles are checked the same way in a child
 * (HEARTH_NO_AVX512=1; the choice is made once per process) */
TEST(dot_rows_avx2_tiles) {
    if (!quant_avx512_active()) SKIP("the AVX-512 tiles are off: dot_rows_match_single covered the AVX2 ones");
    char cmd[600], exe[512];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) SKIP("no /proc/self/exe");
    exe[len] = 0;
    snprintf(cmd, sizeof cmd, "HEARTH_NO_AVX512=1 '%s' --dot-rows >/dev/null", exe);
    CHECK_MSG(system(cmd) == 0, "dot_rows_match_single failed with HEARTH_NO_AVX512=1");
}

/* dot(w, quantize_act(x)) against sum dequant(w)_i x_i in double. Two parts:
 *  activation quantization: |x - xhat| <= da (0.5 + 400U) for Q8_K (da = block amax/127);
 *    for Q8_0 the x86 form scales by 127/amax but stores d in f16, so the level is off by
 *    <= 127 * 2^-11 more: da (1 + 2^-11)(0.5 + 0.063);
 *  float arithmetic: dequant rounds each weight within 3U of its parts, the dot's block
 *    finish and sum see <= nb + 8 roundings: (nb + 12) U sum_i mag_i (|x_i| + da_i). */
TEST(dot_vs_float64) {
    const uint32_t all[] = {QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_F32, QT_F16, QT_BF16};
    const int64_t n = 256 * 6;
    float *x = xmalloc(n * 4), *wx = xmalloc(n * 4), *deq = xmalloc(n * 4);
    double *mag = xmalloc(n * sizeof(double));
    uint8_t *w = xmalloc(n * 4), *a = xmalloc(n * 4 + 4096);
    int bad = 0, runs = 0;
    for (int k = 0; k < 7; k++) {
        uint32_t t = all[k];
        int64_t abe = quant_vec_dot_type(t) == QT_Q8_0 ? 32 : 256;
        for (int dw = 0; dw < D_COUNT; dw++)
            for (int dx = 0; dx < D_COUNT; dx++) {
                uint64_t key = rng_key((uint64_t)(dw * 10 + dx), qtype_name(t));
                gen((enum dist)dw, key, wx, n);
                gen((enum dist)dx, key + 1, x, n);
                quant_quantize_row(t, wx, w, n);
                weight_parts(t, w, n, deq, mag);
                quant_quantize_act(t, x, a, n);
                double ref = 0, band_a = 0, band_f = 0;
                bool is_float = quant_vec_dot_type(t) == QT_F32;
                double per = quant_vec_dot_type(t) == QT_Q8_0 ? (1 + 0x1p-11) * 0.563 : 0.5 + 400 * U;
                for (int64_t b = 0; b < n / abe; b++) {
                    double da = is_float ? 0 : block_amax(x + b * abe, (int)abe) / 127;
                    for (int64_t i = b * abe; i < (b + 1) * abe; i++) {
                        ref += (double)deq[i] * x[i];
                        band_a += fabs(deq[i]) * da * per;
                        band_f += mag[i] * (fabs(x[i]) + da);
                    }
                }
                double nb = (double)n / qtype_block_elems(t);
                if (is_float) nb = n / 32.0 + 8;
                double band = band_a + (nb + 12) * U * band_f * 1.01;
                float got = quant_dot(t, w, a, n);
                runs++;
                if (!(fabs(got - ref) <= band)) {
                    if (bad++ < 4) fprintf(stderr, "    %s w:%s x:%s got %.9g ref %.9g band %.3g\n", qtype_name(t),
                                           dist_name[dw], dist_name[dx], got, ref, band);
                }
            }
    }
    CHECK_MSG(bad == 0, "%d of %d dots outside their band", bad, runs);
    free(x); free(wx); free(deq); free(mag); free(w); free(a);
}

TEST(quantize_act_float_copy) {
    float x[40], y[40];
    gen(D_GAUSS, 3, x, 40);
    quant_quantize_act(QT_BF16, x, y, 40);
    CHECK(memcmp(x, y, sizeof x) == 0);
}

/* ---- against ggml ---- */

typedef struct {
    uint32_t type, n, act_type, q_bytes, act_bytes, has_dot;
    float *x, *deq, *a, dot;
    uint8_t *q, *act;
} fixture;

static const char *fixture_dir(void) {
    const char *d = getenv("HEARTH_FIXTURES");
    return d ? d : "tests/fixtures";
}

static bool read_fixture(const char *name, fixture *f) {
    char path[1024];
    snprintf(path, sizeof path, "%s/quant/%s.bin", fixture_dir(), name);
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    char magic[4];
    uint32_t h[6];
    bool ok = fread(magic, 1, 4, fp) == 4 && !memcmp(magic, "HQK1", 4) && fread(h, 4, 6, fp) == 6 && h[1] <= 65536 &&
              h[3] <= (1u << 20) && h[4] <= (1u << 20);
    if (ok) {
        f->type = h[0]; f->n = h[1]; f->act_type = h[2]; f->q_bytes = h[3]; f->act_bytes = h[4]; f->has_dot = h[5];
        f->x = xmalloc(f->n * 4); f->deq = xmalloc(f->n * 4); f->a = xmalloc(f->n * 4);
        f->q = xmalloc(f->q_bytes + 1); f->act = xmalloc(f->act_bytes + 1);
        ok = fread(f->x, 4, f->n, fp) == f->n && fread(f->q, 1, f->q_bytes, fp) == f->q_bytes &&
             fread(f->deq, 4, f->n, fp) == f->n && fread(f->a, 4, f->n, fp) == f->n &&
             fread(f->act, 1, f->act_bytes, fp) == f->act_bytes && fread(&f->dot, 4, 1, fp) == 1;
    }
    fclose(fp);
    return ok;
}

TEST(ggml_known_answers) {
    const char *names[] = {"q8_0", "q4_K", "q5_K", "q6_K", "q8_K", "f16", "bf16"};
    const uint32_t types[] = {QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q8_K, QT_F16, QT_BF16};
    int found = 0;
    for (int k = 0; k < 7; k++) {
        fixture f;
        if (!read_fixture(names[k], &f)) {
            CHECK_MSG(0, "fixture %s/quant/%s.bin missing or malformed", fixture_dir(), names[k]);
            continue;
        }
        found++;
        uint32_t t = types[k];
        CHECK(f.type == t && qtype_row_bytes(t, f.n) == f.q_bytes);
        if (f.type != t || qtype_row_bytes(t, f.n) != f.q_bytes) continue;
        uint8_t *q = xmalloc(f.q_bytes);
        float *y = xmalloc(f.n * 4);
        quant_quantize_row(t, f.x, q, f.n);
        size_t first = 0;
        while (first < f.q_bytes && q[first] == f.q[first]) first++;
        CHECK_MSG(first == f.q_bytes, "%s: quantized bytes differ from ggml's from byte %zu", names[k], first);
        quant_dequantize_row(t, f.q, y, f.n);
        CHECK_MSG(memcmp(y, f.deq, f.n * 4) == 0, "%s: dequantized floats differ from ggml's", names[k]);
        if (f.has_dot) {
            /* the activation exactly as ggml's CPU backend quantizes it */
            uint8_t *act = xmalloc(quant_act_row_bytes(t, f.n) + 1);
            quant_quantize_act(t, f.a, act, f.n);
            if (quant_vec_dot_type(t) != QT_F32) {
                CHECK_MSG(f.act_bytes == quant_act_row_bytes(t, f.n) && memcmp(act, f.act, f.act_bytes) == 0,
                          "%s: activation bytes differ from ggml's", names[k]);
            } else { /* ggml dots f16/bf16 activations: the fixture chose values exact in both */
                uint16_t h;
                int inexact = 0;
                for (uint32_t i = 0; i < f.n; i++) {
                    h = t == QT_F16 ? f32_to_f16(f.a[i]) : f32_to_bf16(f.a[i]);
                    inexact += (t == QT_F16 ? f16_to_f32(h) : bf16_to_f32(h)) != f.a[i];
                }
                CHECK(inexact == 0);
            }
            /* same operands, different float order: each side within (rounds) U T of the
             * exact value, where a term meets <= nb + 8 roundings in ggml's lane-wise sums
             * (nb/16 + 8 for its f16 rows) and <= nb + 5 in hearth's (n/32 + 20 for float
             * rows): |diff| <= (2 nb + 16) U T, and (n/4 + 40) U T for float rows. */
            double *mag = xmalloc(f.n * sizeof(double));
            float *ad = xmalloc(f.n * 4);
            weight_parts(t, f.q, f.n, y, mag);
            if (quant_vec_dot_type(t) == QT_F32) memcpy(ad, f.a, f.n * 4);
            else quant_dequantize_row(quant_vec_dot_type(t), act, ad, f.n);
            double T = 0;
            for (uint32_t i = 0; i < f.n; i++) T += mag[i] * fabs(ad[i]);
            double nb = (double)f.n / qtype_block_elems(t);
            double tol = quant_vec_dot_type(t) == QT_F32 ? (f.n / 4.0 + 40) * U * T : (2 * nb + 16) * U * T * 1.01;
            float mine = quant_dot(t, f.q, act, f.n), mine_ref = quant_dot_ref(t, f.q, act, f.n);
            CHECK_MSG(fabs((double)mine - f.dot) <= tol, "%s: dot %.9g vs ggml %.9g (tol %.3g)", names[k], mine, f.dot, tol);
            CHECK_MSG(fabs((double)mine_ref - f.dot) <= tol, "%s: scalar dot %.9g vs ggml %.9g (tol %.3g)", names[k],
                      mine_ref, f.dot, tol);
            if (getenv("HEARTH_TEST_VERBOSE"))
                printf("    %-5s dot hearth %.9g ggml %.9g diff %.2e tol %.2e\n", names[k], mine, f.dot,
                       fabs((double)mine - f.dot), tol);
            free(act); free(mag); free(ad);
        }
        free(q); free(y);
        free(f.x); free(f.deq); free(f.a); free(f.q); free(f.act);
    }
    CHECK(found == 7);
}

/* HEARTH_NO_SIMD=1 turns the kernels off: checked in a child, since the choice is made
 * once per process */
TEST(no_simd_env) {
    char cmd[600], exe[512];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) SKIP("no /proc/self/exe");
    exe[len] = 0;
    snprintf(cmd, sizeof cmd, "HEARTH_NO_SIMD=1 '%s' --simd-state", exe);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    char out[16] = "";
    CHECK(fgets(out, sizeof out, p) != NULL);
    pclose(p);
    CHECK_MSG(strncmp(out, "off", 3) == 0, "HEARTH_NO_SIMD=1 left the kernels %s", out);
    bool cpu = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const char *env = getenv("HEARTH_NO_SIMD");
    if (!env || !*env || !strcmp(env, "0")) CHECK(quant_simd_active() == cpu);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--dot-rows")) {
        CHECK(!quant_avx512_active());
        RUN(dot_rows_match_single);
        return harness_done();
    }
    if (argc > 1 && !strcmp(argv[1], "--simd-state")) {
        puts(quant_simd_active() ? "on" : "off");
        return 0;
    }
    RUN(type_table);
    RUN(f16_exhaustive);
    RUN(bf16_exhaustive);
    RUN(round_trip_bounds);
    RUN(nearest_level);
    RUN(simd_matches_scalar);
    RUN(dot_rows_match_single);
    RUN(dot_rows_avx2_tiles);
    RUN(dot_vs_float64);
    RUN(quantize_act_float_copy);
    RUN(ggml_known_answers);
    RUN(no_simd_env);
    return harness_done();
}
