/* quant.c: ggml block types in plain C: the type table, f16/bf16 conversion, dequantize,
 * the reference quantizers (bit-identical to ggml's quantize_row_*_ref, so their float
 * operations keep ggml's order; this file must build without FMA contraction, which
 * -std=c11 gives), the scalar dots, and the run-time switch to the AVX2 kernels. */
#include "format/quant.h"
#include "base/util.h"

#include <cpuid.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#pragma clang fp contract(off) /* GCC's ISO C mode already never fuses a*b+c */
#endif

/* ---- type table: every id ggml has defined, so any GGUF file can be listed ---- */

typedef struct {
    const char *name;
    int32_t blck;  /* elements per block; 0 for ids ggml retired */
    uint32_t size; /* bytes per block */
    bool supported;
} qtype_info;

#define QT_TABLE_N 43
static const qtype_info qtype_table[QT_TABLE_N] = {
    [0] = {"f32", 1, 4, true},        [1] = {"f16", 1, 2, true},
    [2] = {"q4_0", 32, 18, false},    [3] = {"q4_1", 32, 20, false},
    [6] = {"q5_0", 32, 22, false},    [7] = {"q5_1", 32, 24, false},
    [8] = {"q8_0", 32, 34, true},     [9] = {"q8_1", 32, 36, false},
    [10] = {"q2_K", 256, 84, false},  [11] = {"q3_K", 256, 110, false},
    [12] = {"q4_K", 256, 144, true},  [13] = {"q5_K", 256, 176, true},
    [14] = {"q6_K", 256, 210, true},  [15] = {"q8_K", 256, 292, true},
    [16] = {"iq2_xxs", 256, 66, false}, [17] = {"iq2_xs", 256, 74, false},
    [18] = {"iq3_xxs", 256, 98, false}, [19] = {"iq1_s", 256, 50, false},
    [20] = {"iq4_nl", 32, 18, false}, [21] = {"iq3_s", 256, 110, false},
    [22] = {"iq2_s", 256, 82, false}, [23] = {"iq4_xs", 256, 136, false},
    [24] = {"i8", 1, 1, false},       [25] = {"i16", 1, 2, false},
    [26] = {"i32", 1, 4, false},      [27] = {"i64", 1, 8, false},
    [28] = {"f64", 1, 8, false},      [29] = {"iq1_m", 256, 56, false},
    [30] = {"bf16", 1, 2, true},
    [34] = {"tq1_0", 256, 54, false}, [35] = {"tq2_0", 256, 66, false},
    [39] = {"mxfp4", 32, 17, false},  [40] = {"nvfp4", 64, 36, false},
    [41] = {"q1_0", 128, 18, false},  [42] = {"q2_0", 64, 18, false},
};

_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K layout");

bool qtype_known(uint32_t t) { return t < QT_TABLE_N && qtype_table[t].blck > 0; }
bool qtype_supported(uint32_t t) { return qtype_known(t) && qtype_table[t].supported; }
int64_t qtype_block_elems(uint32_t t) { return qtype_known(t) ? qtype_table[t].blck : 0; }
size_t qtype_block_bytes(uint32_t t) { return qtype_known(t) ? qtype_table[t].size : 0; }

const char *qtype_name(uint32_t t) {
    /* unknown ids get a name that shows the number, from a small ring of buffers so a
     * printf with two of them works; the text is only for messages */
    static _Thread_local char buf[4][24];
    static _Thread_local int next;
    if (qtype_known(t)) return qtype_table[t].name;
    char *b = buf[next++ & 3];
    snprintf(b, sizeof buf[0], "type%u", t);
    return b;
}

size_t qtype_row_bytes(uint32_t t, int64_t n) {
    if (!qtype_known(t) || n < 0) return 0;
    int64_t be = qtype_table[t].blck;
    if (n % be) return 0;
    return (size_t)(n / be) * qtype_table[t].size;
}

uint32_t quant_vec_dot_type(uint32_t t) {
    switch (t) {
    case QT_Q8_0: return QT_Q8_0;
    case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_Q8_K: return QT_Q8_K;
    default: return QT_F32;
    }
}

/* ---- f16 / bf16 ---- */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float f16_to_f32(f16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) { /* zero or subnormal: m * 2^-24 is exact in float */
        float v = (float)m * 0x1p-24f;
        return bits_f32(sign | f32_bits(v));
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13)); /* inf, NaN keeps payload */
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

f16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) /* NaN: quiet it, keep the top payload bits (what F16C does) */
        return sign | 0x7e00 | (uint16_t)((x >> 13) & 0x3ff);
    if (x >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 rounds to inf; inf stays inf */
    if (x < 0x38800000u) {
        /* below the smallest normal half: adding 0.5 makes the FPU round |f| to a multiple
         * of 2^-24 (the half subnormal step) with ties to even, in the default mode */
        float v = bits_f32(x) + 0.5f;
        return sign | (uint16_t)(f32_bits(v) - 0x3f000000u);
    }
    /* normal: rebias the exponent and round the 13 dropped bits to nearest even; a carry
     * out of the mantissa correctly bumps the exponent */
    uint32_t odd = (x >> 13) & 1;
    x += 0xc8000000u + 0xfffu + odd;
    return sign | (uint16_t)(x >> 13);
}

float bf16_to_f32(bf16_t h) { return bits_f32((uint32_t)h << 16); }

bf16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((x >> 16) | 0x40); /* quiet NaN */
    return (bf16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* ---- dequantize ---- */

/* the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K/Q5_K:
 * bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7, bytes 4-7 the
 * same for the mins, bytes 8-11 the low nibbles of scales and mins 4-7 */
static inline void k4_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void dequant_q8_0(const block_q8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++) y[i * QK8_0 + j] = b[i].qs[j] * d;
    }
}

static void dequant_q4_k(const block_q4_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int j = 0; j < QK_K / 32; j++) {
            uint8_t sc, m;
            k4_scale_min(j, b[i].scales, &sc, &m);
            float dl = d * sc, ml = dmin * m;
            /* pairs of sub-blocks share 32 bytes: low nibbles first, then high */
            const uint8_t *q = b[i].qs + 32 * (j / 2);
            int sh = (j & 1) * 4;
            for (int l = 0; l < 32; l++) y[32 * j + l] = dl * ((q[l] >> sh) & 0x0f) - ml;
        }
    }
}

static void dequant_q5_k(const block_q5_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int j = 0; j < QK_K / 32; j++) {
            uint8_t sc, m;
            k4_scale_min(j, b[i].scales, &sc, &m);
            float dl = d * sc, ml = dmin * m;
            const uint8_t *q = b[i].qs + 32 * (j / 2);
            int sh = (j & 1) * 4;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> sh) & 0x0f) | (((b[i].qh[l] >> j) & 1) << 4);
                y[32 * j + l] = dl * v - ml;
            }
        }
    }
}

/* 6-bit value of element k (0..255) of a Q6_K block, 0..63 (subtract 32 for the weight).
 * Each 128-half: ql[0..63] low nibbles of elements 0-63, high nibbles of 64-127; qh[0..31]
 * 2 bits each for elements l, l+32, l+64, l+96. */
static inline int q6_value(const block_q6_K *b, int k) {
    int h = k / 128, r = k % 128, quarter = r / 32, l = r % 32;
    const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
    int lo = (quarter & 1) ? ql[l + 32] : ql[l];
    lo = (quarter & 2) ? lo >> 4 : lo & 0x0f;
    int hi = (qh[l] >> (2 * quarter)) & 3;
    return lo | (hi << 4);
}

static void dequant_q6_k(const block_q6_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d);
        for (int h = 0; h < 2; h++) { /* the layout of q6_value, a 128-half at a time */
            const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            float *yh = y + 128 * h;
            for (int l = 0; l < 32; l++) {
                yh[l] = d * sc[l / 16] * (((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32);
                yh[l + 32] = d * sc[2 + l / 16] * (((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
                yh[l + 64] = d * sc[4 + l / 16] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                yh[l + 96] = d * sc[6 + l / 16] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
    }
}

static void dequant_q8_k(const block_q8_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++)
        for (int j = 0; j < QK_K; j++) y[i * QK_K + j] = b[i].d * b[i].qs[j];
}

void quant_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n) {
    int64_t be = qtype_block_elems(t);
    HEARTH_CHECK(be > 0 && n % be == 0);
    switch (t) {
    case QT_F32: memcpy(dst, src, (size_t)n * 4); return;
    case QT_F16: for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(((const f16_t *)src)[i]); return;
    case QT_BF16: for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(((const bf16_t *)src)[i]); return;
    case QT_Q8_0: dequant_q8_0(src, dst, n / QK8_0); return;
    case QT_Q4_K: dequant_q4_k(src, dst, n / QK_K); return;
    case QT_Q5_K: dequant_q5_k(src, dst, n / QK_K); return;
    case QT_Q6_K: dequant_q6_k(src, dst, n / QK_K); return;
    case QT_Q8_K: dequant_q8_k(src, dst, n / QK_K); return;
    default: HEARTH_DIE("dequantize: type %s is not supported", qtype_name(t));
    }
}

/* ---- reference quantizers ---- */

/* Round to nearest, ties to even, the way ggml does it: adding 1.5*2^23 leaves the integer
 * in the low mantissa bits. Valid for |v| < 2^22; out-of-range (or NaN) inputs are clamped
 * so garbage input cannot produce undefined behaviour. */
static inline int round_even(float v) {
    if (!(v > -4194303.f)) v = -4194303.f;
    if (v > 4194303.f) v = 4194303.f;
    float t = v + 12582912.f;
    return (int)(f32_bits(t) & 0x007fffff) - 0x00400000;
}

static void quantize_q8_0(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_f16(d);
        /* the reference rounds half away from zero here (roundf), unlike the K-quants */
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* ggml's search for an asymmetric 4/5-bit grid (scale, min) over n values: start from
 * the [min(x,0), max] range, then try nstep+1 slightly different scales, each refit by
 * weighted least squares for both scale and min, keeping the smallest weighted squared
 * error. Returns the scale, *neg_min = -min (>= 0). L gets the levels. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *neg_min, uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float lo = x[0], hi = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *neg_min = -lo;
        return 0.f;
    }
    float iscale = nmax / (hi - lo);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; i++) {
        int l = round_even(iscale * (x[i] - lo));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = scale * L[i] + lo - x[i];
        best_err += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (hi - lo);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = round_even(iscale * (x[i] - lo));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float s = (sum_w * sum_xl - sum_x * sum_l) / D;
            float m = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (m > 0) { /* the grid must reach down to 0: refit the scale alone */
                m = 0;
                s = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = s * Laux[i] + m - x[i];
                err += w[i] * (diff * diff);
            }
            if (err < best_err) {
                memcpy(L, Laux, (size_t)n);
                best_err = err;
                scale = s;
                lo = m;
            }
        }
    }
    *neg_min = -lo;
    return scale;
}

/* Q4_K and Q5_K share everything but the level count and the search parameters: per
 * 32-value sub-block a (scale, min) pair, both then quantized to 6 bits against the
 * block's largest, and the values re-quantized against the stored grid. */
static void quantize_k4_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                               uint8_t scales[K_SCALE_SIZE], f16_t *d_out, f16_t *dmin_out) {
    float sc[QK_K / 32], mn[QK_K / 32], w[32];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32);
        /* weights favour large values but never drop small ones to zero */
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        sc[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mn[j], Laux, rmin, 0.1f, nstep);
        if (sc[j] > max_scale) max_scale = sc[j];
        if (mn[j] > max_min) max_min = mn[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales, 0, K_SCALE_SIZE);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)round_even(inv_scale * sc[j]);
        uint8_t lm = (uint8_t)round_even(inv_min * mn[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            scales[j] = ls;
            scales[j + 4] = lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 0x0f) | ((lm & 0x0f) << 4));
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = f32_to_f16(max_scale / 63.f);
    *dmin_out = f32_to_f16(max_min / 63.f);
    float d = f16_to_f32(*d_out), dmin = f16_to_f32(*dmin_out);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t s, m;
        k4_scale_min(j, scales, &s, &m);
        float dl = d * s;
        if (!dl) continue; /* a zero scale keeps the fit's levels (they do not matter) */
        float ml = dmin * m;
        for (int l = 0; l < 32; l++) {
            int q = round_even((x[32 * j + l] + ml) / dl);
            L[32 * j + l] = (uint8_t)(q < 0 ? 0 : q > nmax ? nmax : q);
        }
    }
}

static void quantize_q4_k(const float *x, block_q4_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quantize_k4_scales(x, 15, -1.f, 20, L, y[i].scales, &y[i].d, &y[i].dmin);
        for (int j = 0; j < QK_K; j += 64)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void quantize_q5_k(const float *x, block_q5_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quantize_k4_scales(x, 31, -0.5f, 15, L, y[i].scales, &y[i].d, &y[i].dmin);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int j = 0; j < QK_K / 32; j++)
            for (int l = 0; l < 32; l++) {
                int v = L[32 * j + l];
                y[i].qh[l] |= (uint8_t)((v >> 4) << j);
                uint8_t *q = &y[i].qs[32 * (j / 2) + l];
                if (j & 1) *q = (uint8_t)((*q & 0x0f) | ((v & 0x0f) << 4));
                else *q = (uint8_t)(v & 0x0f);
            }
    }
}

/* ggml's symmetric fit (make_qx_quants with weights x^2) of n values to levels
 * [-nmax, nmax-1]: from the scale that maps the largest |x| to -nmax, try 18 nearby
 * scales and keep the least-squares best. L gets level + nmax. */
static float fit_scale_sym(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = round_even(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = round_even(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        /* sumlx^2/suml2 is the error reduction of the best scale for these levels */
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = round_even(iscale * x[i]);
                l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
                L[i] = (int8_t)(l + nmax);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static void quantize_q6_k(const float *x, block_q6_K *y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_abs = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            scales[g] = fit_scale_sym(16, 32, x + 16 * g, L + 16 * g);
            if (fabsf(scales[g]) > max_abs) {
                max_abs = fabsf(scales[g]);
                max_scale = scales[g];
            }
        }
        if (max_abs < 1e-15f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = f32_to_f16(1 / iscale);
        for (int g = 0; g < QK_K / 16; g++) {
            int s = round_even(iscale * scales[g]);
            y[i].scales[g] = (int8_t)(s > 127 ? 127 : s);
        }
        float d = f16_to_f32(y[i].d);
        for (int g = 0; g < QK_K / 16; g++) {
            float dl = d * y[i].scales[g];
            if (!dl) continue;
            for (int l = 0; l < 16; l++) {
                int q = round_even(x[16 * g + l] / dl);
                q = q < -32 ? -32 : q > 31 ? 31 : q;
                L[16 * g + l] = (int8_t)(q + 32);
            }
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0x0f) | ((Lh[l + 64] & 0x0f) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0x0f) | ((Lh[l + 96] & 0x0f) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) |
                                  ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

static void quantize_q8_k(const float *x, block_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]); /* ggml leaves bsums unwritten here; we zero them */
            continue;
        }
        /* -127 (not -128) so that both signs fit without saturation in the SIMD dots */
        float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = round_even(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[16 * g + l];
            y[i].bsums[g] = (int16_t)s;
        }
        y[i].d = 1 / iscale;
    }
}

bool quant_can_quantize(uint32_t t) {
    return t == QT_F32 || t == QT_F16 || t == QT_BF16 || t == QT_Q8_0 || t == QT_Q4_K || t == QT_Q5_K || t == QT_Q6_K ||
           t == QT_Q8_K;
}

void quant_quantize_row(uint32_t t, const float *src, void *dst, int64_t n) {
    int64_t be = qtype_block_elems(t);
    HEARTH_CHECK(be > 0 && n % be == 0);
    switch (t) {
    case QT_F32: memcpy(dst, src, (size_t)n * 4); return;
    case QT_F16: for (int64_t i = 0; i < n; i++) ((f16_t *)dst)[i] = f32_to_f16(src[i]); return;
    case QT_BF16: for (int64_t i = 0; i < n; i++) ((bf16_t *)dst)[i] = f32_to_bf16(src[i]); return;
    case QT_Q8_0: quantize_q8_0(src, dst, n / QK8_0); return;
    case QT_Q4_K: quantize_q4_k(src, dst, n / QK_K); return;
    case QT_Q5_K: quantize_q5_k(src, dst, n / QK_K); return;
    case QT_Q6_K: quantize_q6_k(src, dst, n / QK_K); return;
    case QT_Q8_K: quantize_q8_k(src, dst, n / QK_K); return;
    default: HEARTH_DIE("quantize: type %s is not supported", qtype_name(t));
    }
}

/* Q8_0 activations as ggml's x86 CPU backend makes them (quantize_row_q8_0 with AVX):
 * the multiplier is 127/amax and rounding is to nearest even, which differs in the last
 * bit now and then from the weight reference (1/d, roundf). */
static void quantize_act_q8_0(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        y[i].d = f32_to_f16(amax / 127.f);
        float id = amax != 0.0f ? 127.f / amax : 0.0f;
        for (int j = 0; j < QK8_0; j++) {
            int v = round_even(x[j] * id);
            y[i].qs[j] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
        }
    }
}

void quant_quantize_act(uint32_t wtype, const float *x, void *dst, int64_t n) {
    switch (quant_vec_dot_type(wtype)) {
    case QT_Q8_0: HEARTH_CHECK(n % QK8_0 == 0); quantize_act_q8_0(x, dst, n / QK8_0); return;
    case QT_Q8_K: HEARTH_CHECK(n % QK_K == 0); quantize_q8_k(x, dst, n / QK_K); return;
    default: memcpy(dst, x, (size_t)n * sizeof(float)); return;
    }
}

size_t quant_act_row_bytes(uint32_t wtype, int64_t n) {
    return qtype_row_bytes(quant_vec_dot_type(wtype), n);
}

/* ---- scalar dots: integer sums per block are exact; floats enter once per block ---- */

static float dot_q8_0(const block_q8_0 *x, const block_q8_0 *y, int64_t nb) {
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QK8_0; j++) s += x[i].qs[j] * y[i].qs[j];
        sum += (float)s * (f16_to_f32(x[i].d) * f16_to_f32(y[i].d));
    }
    return sum;
}

/* The AVX2 kernels finish each block with the same float expression as these, so for
 * K-quants the two paths give the same bits (the tests hold them to that). */
static float dot_q4_k(const block_q4_K *x, const block_q8_K *y, int64_t nb) {
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            uint8_t sc, m;
            k4_scale_min(j, x[i].scales, &sc, &m);
            const uint8_t *q = x[i].qs + 32 * (j / 2);
            const int8_t *a = y[i].qs + 32 * j;
            int sh = (j & 1) * 4, s = 0;
            for (int l = 0; l < 32; l++) s += ((q[l] >> sh) & 0x0f) * a[l];
            sumi += sc * s;
            /* the min multiplies the plain sum of the activations: the bsums */
            summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        float d = y[i].d * f16_to_f32(x[i].d), dmin = y[i].d * f16_to_f32(x[i].dmin);
        sum += d * (float)sumi - dmin * (float)summ;
    }
    return sum;
}

static float dot_q5_k(const block_q5_K *x, const block_q8_K *y, int64_t nb) {
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            uint8_t sc, m;
            k4_scale_min(j, x[i].scales, &sc, &m);
            const uint8_t *q = x[i].qs + 32 * (j / 2);
            const int8_t *a = y[i].qs + 32 * j;
            int sh = (j & 1) * 4, s = 0;
            for (int l = 0; l < 32; l++)
                s += (((q[l] >> sh) & 0x0f) | (((x[i].qh[l] >> j) & 1) << 4)) * a[l];
            sumi += sc * s;
            summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        float d = y[i].d * f16_to_f32(x[i].d), dmin = y[i].d * f16_to_f32(x[i].dmin);
        sum += d * (float)sumi - dmin * (float)summ;
    }
    return sum;
}

static float dot_q6_k(const block_q6_K *x, const block_q8_K *y, int64_t nb) {
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += (q6_value(&x[i], 16 * g + l) - 32) * y[i].qs[16 * g + l];
            sumi += x[i].scales[g] * s;
        }
        float d = y[i].d * f16_to_f32(x[i].d);
        sum += d * (float)sumi;
    }
    return sum;
}

static float dot_q8_k(const block_q8_K *x, const block_q8_K *y, int64_t nb) {
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QK_K; j++) s += x[i].qs[j] * y[i].qs[j];
        sum += (x[i].d * y[i].d) * (float)s;
    }
    return sum;
}

float quant_dot_ref(uint32_t t, const void *w, const void *a, int64_t n) {
    int64_t be = qtype_block_elems(t);
    HEARTH_CHECK(be > 0 && n % be == 0);
    const float *af = a;
    double acc = 0; /* float rows: the reference sums in double */
    switch (t) {
    case QT_F32:
        for (int64_t i = 0; i < n; i++) acc += (double)((const float *)w)[i] * af[i];
        return (float)acc;
    case QT_F16:
        for (int64_t i = 0; i < n; i++) acc += (double)f16_to_f32(((const f16_t *)w)[i]) * af[i];
        return (float)acc;
    case QT_BF16:
        for (int64_t i = 0; i < n; i++) acc += (double)bf16_to_f32(((const bf16_t *)w)[i]) * af[i];
        return (float)acc;
    case QT_Q8_0: return dot_q8_0(w, a, n / QK8_0);
    case QT_Q4_K: return dot_q4_k(w, a, n / QK_K);
    case QT_Q5_K: return dot_q5_k(w, a, n / QK_K);
    case QT_Q6_K: return dot_q6_k(w, a, n / QK_K);
    case QT_Q8_K: return dot_q8_k(w, a, n / QK_K);
    default: HEARTH_DIE("dot: type %s is not supported", qtype_name(t));
    }
}

/* ---- run-time dispatch ---- */

static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static bool simd_on;

static void simd_decide(void) {
    const char *env = getenv("HEARTH_NO_SIMD");
    if (env && *env && strcmp(env, "0") != 0) return;
    __builtin_cpu_init();
    /* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports lacks "f16c";
     * the AVX2 check already covers the OS saving YMM state */
    unsigned a, b, c, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    simd_on = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

bool quant_simd_active(void) {
    pthread_once(&simd_once, simd_decide);
    return simd_on;
}

float quant_dot(uint32_t t, const void *w, const void *a, int64_t n) {
    if (quant_simd_active()) return quant_dot_avx2(t, w, a, n);
    return quant_dot_ref(t, w, a, n);
}

void quant_dot_rows_ref(uint32_t t, int64_t n, const void *w, size_t w_stride, int nw, const void *const *a, int na,
                        float *const *y) {
    for (int r = 0; r < na; r++)
        for (int o = 0; o < nw; o++) y[r][o] = quant_dot_ref(t, (const uint8_t *)w + (size_t)o * w_stride, a[r], n);
}

void quant_dot_rows(uint32_t t, int64_t n, const void *w, size_t w_stride, int nw, const void *const *a, int na,
                    float *const *y) {
    if (quant_simd_active()) quant_dot_rows_avx2(t, n, w, w_stride, nw, a, na, y);
    else quant_dot_rows_ref(t, n, w, w_stride, nw, a, na, y);
}
