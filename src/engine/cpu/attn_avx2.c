/* attn_avx2.c: the AVX2/FMA kernel behind attn.c's attend_task: up to 8 consecutive rows of
 * a sequence (a decode step's one row among them), each with up to 4 query heads that share
 * one KV head, key block by key block: the key rows scored two at a time (each loaded once for
 * all the rows' heads), softmax, then the weighted sum of the value rows in 16-wide column
 * strips. Each head's arithmetic is the same whatever the number of heads and rows done
 * together, so results do not depend on how the work is split (a decode step's row = the same
 * row in a prompt's pass). Called only after quant_simd_active() (the CPU check); D must be a
 * multiple of 16. */
#include "engine/cpu/cpu.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define KINLINE static inline __attribute__((always_inline))

KINLINE __m256 ld8(const void *base, int64_t off, const bool f16) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + off)));
    return _mm256_loadu_ps((const float *)base + off);
}

KINLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for x <= 0 in 8 lanes (the softmax's s - max), relative error below 2^-23 (1 ulp) where
 * e^x is a normal float: x = n ln2 + r, |r| <= ln2 / 2, with ln2 in two parts (n ln2_hi is
 * exact for |n| < 2^9; the fma with ln2_lo rounds once, |r| u); e^r = 1 + (r + r^2 q(r)),
 * q the Taylor terms 1/2 .. 1/5040 (the truncation r^8 / 8! < 5e-9 relative), so the last two
 * roundings dominate: u |r + r^2 q| + u <= 1.45 u; in all < 1.85 u. Then times 2^n, exact as
 * two factors (the second only where e^x is subnormal). x < -104 gives 0 (e^-104 is below half
 * the least subnormal), as does -inf. test_cpu_kernels' exp_avx2 checks the bound. */
KINLINE __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-104.0f), zero = _mm256_setzero_ps();
    const __m256 gone = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);        /* ln2_hi: 9 bits */
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);               /* -(ln2 - ln2_hi) */
    __m256 q = _mm256_set1_ps(1.0f / 5040.0f);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 720.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 120.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 24.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 6.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.5f));
    const __m256 e = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_mul_ps(r, r), q, r));
    /* 2^n as 2^n1 2^n2: n1 = max(n, -126) a normal power, n2 = n - n1 in [-24, 0] */
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_max_epi32(ni, _mm256_set1_epi32(-126));
    const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, n1), _mm256_set1_epi32(127)), 23));
    return _mm256_blendv_ps(_mm256_mul_ps(_mm256_mul_ps(e, p1), p2), zero, gone);
}

/* y[0..m) = e^(x - sub) for the last m < 8 values of a row, the lanes past m as -inf (so 0);
 * returns the 8 lanes */
KINLINE __m256 exp8_tail(const float *x, float sub, int64_t m, float *y) {
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = j < m ? x[j] - sub : -INFINITY;
    const __m256 e = exp8(_mm256_loadu_ps(t));
    _mm256_storeu_ps(t, e);
    for (int j = 0; j < m; j++) y[j] = t[j];
    return e;
}

void cpu_exp_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    if (i < n) exp8_tail(x + i, 0.0f, n - i, y + i);
}

/* the softmax of s[0..n) in place: the max; e = exp8(s - max) and their sum, 8 lanes in key
 * order (the keys past n as -inf, so e = 0) then hsum8; each e times 1 / sum */
KINLINE void softmax_row(float *s, int64_t n) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + i));
    float m8[8], mx = -INFINITY;
    _mm256_storeu_ps(m8, vm);
    for (int j = 0; j < 8; j++) mx = m8[j] > mx ? m8[j] : mx;
    for (; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmx));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (i < n) sum = _mm256_add_ps(sum, exp8_tail(s + i, mx, n - i, s + i));
    const __m256 inv = _mm256_set1_ps(1.0f / hsum8(sum));
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), inv));
    for (; i < n; i++) s[i] *= _mm256_cvtss_f32(inv);
}

/* scores of keys [j0, j1) for NG heads (rows of q at q_stride) into s (a head's at s_stride):
 * one FMA chain per (head, key) over D, keys in pairs from j0 (even) and one alone at an odd
 * end, each score times scale */
KINLINE void score_keys(const float *q, int64_t q_stride, const void *k, int64_t kv_stride, int64_t j0, int64_t j1, int64_t D,
                        float scale, float *s, int64_t s_stride, const int NG, const bool f16) {
    int64_t j = j0;
    for (; j + 2 <= j1; j += 2) {
        __m256 acc[2][4];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) acc[0][g] = acc[1][g] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            __m256 k0 = ld8(k, j * kv_stride + d, f16), k1 = ld8(k, (j + 1) * kv_stride + d, f16);
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) {
                __m256 qv = _mm256_loadu_ps(q + g * q_stride + d);
                acc[0][g] = _mm256_fmadd_ps(qv, k0, acc[0][g]);
                acc[1][g] = _mm256_fmadd_ps(qv, k1, acc[1][g]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            s[g * s_stride + j] = hsum8(acc[0][g]) * scale;
            s[g * s_stride + j + 1] = hsum8(acc[1][g]) * scale;
        }
    }
    if (j < j1) {
        __m256 acc[4];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) acc[g] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            __m256 k0 = ld8(k, j * kv_stride + d, f16);
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * q_stride + d), k0, acc[g]);
        }
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) s[g * s_stride + j] = hsum8(acc[g]) * scale;
    }
}

/* a[g] (16 columns from d, as two vectors) += p[g][i] v[i] for keys [i0, i1) in order, p of
 * head g at s + g s_stride */
KINLINE void sum_values(const void *v, int64_t kv_stride, int64_t d, int64_t i0, int64_t i1, const float *s, int64_t s_stride,
                        __m256 a[4][2], const int NG, const bool f16) {
    for (int64_t i = i0; i < i1; i++) {
        __m256 v0 = ld8(v, i * kv_stride + d, f16), v1 = ld8(v, i * kv_stride + d + 8, f16);
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            __m256 p = _mm256_broadcast_ss(s + g * s_stride + i);
            a[g][0] = _mm256_fmadd_ps(p, v0, a[g][0]);
            a[g][1] = _mm256_fmadd_ps(p, v1, a[g][1]);
        }
    }
}

/* Rows r < nr of one sequence (consecutive positions: row r sees keys [0, n_keys[r])), each
 * with ng query heads, against one KV head. A head's arithmetic: a score is one FMA chain over
 * D (8 lanes, then hsum8) times scale, in pairs of keys or alone at an odd end; the softmax as
 * softmax_row makes it; a sum adds the keys in order per 8 columns. The loops run key block by key block,
 * so a block of AR_KB key and value rows is read from memory once for all nr * ng heads, and
 * the blocks two ahead are asked into L2 meanwhile. The partial sums wait in acc between
 * blocks (a float stored and loaded keeps its bits), so no bit depends on nr, ng or AR_KB. */
#define AR_KB 32 /* keys a block: 16 KB of f16 key rows at D 256, in L1 */
#define AR_PF 64 /* keys ahead that a block asks into L2: two blocks */

/* rows [j0, j0 + AR_KB) of a head's keys or values (those below nmax) asked into L2 while an
 * earlier block is worked on: at depth the rows come from L3 or memory, and the hardware's
 * prefetchers do not follow one head's half of each row (a timing harness on this box's Zen 4,
 * 4 rows x 4 heads, D 256, f16, 8,192 keys: 41-43 GFLOP/s without, 52-53 with, on one core).
 * A prefetch moves no bits. */
KINLINE void prefetch_rows(const void *base, int64_t kv_stride, int64_t j0, int64_t nmax, int64_t D, const bool f16) {
    const int64_t es = f16 ? 2 : 4, per_line = 64 / es;
    for (int64_t j = j0; j < j0 + AR_KB && j < nmax; j++)
        for (int64_t d = 0; d < D; d += per_line) _mm_prefetch((const char *)base + (j * kv_stride + d) * es, _MM_HINT_T1);
}
KINLINE void attend_rows(int nr, const float *q, int64_t q_row, int64_t q_stride, const void *k, const void *v,
                         int64_t kv_stride, const int64_t *n_keys, int64_t D, float scale, float *sc, int64_t sc_stride,
                         float *acc, float *o, int64_t o_row, int64_t o_stride, const int NG, const bool f16) {
    int64_t nmax = 0;
    for (int r = 0; r < nr; r++) nmax = n_keys[r] > nmax ? n_keys[r] : nmax;
    for (int64_t kb = 0; kb < nmax; kb += AR_KB) {
        prefetch_rows(k, kv_stride, kb + AR_PF, nmax, D, f16);
        for (int r = 0; r < nr; r++) {
            const int64_t e = kb + AR_KB < n_keys[r] ? kb + AR_KB : n_keys[r];
            if (e > kb) score_keys(q + r * q_row, q_stride, k, kv_stride, kb, e, D, scale, sc + (int64_t)r * NG * sc_stride, sc_stride, NG, f16);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int g = 0; g < NG; g++) softmax_row(sc + ((int64_t)r * NG + g) * sc_stride, n_keys[r]);
    memset(acc, 0, sizeof(float) * (size_t)(nr * NG * D));
    for (int64_t kb = 0; kb < nmax; kb += AR_KB) {
        prefetch_rows(v, kv_stride, kb + AR_PF, nmax, D, f16);
        for (int64_t d = 0; d < D; d += 16)
            for (int r = 0; r < nr; r++) {
                const int64_t e = kb + AR_KB < n_keys[r] ? kb + AR_KB : n_keys[r];
                if (e <= kb) continue;
                const float *s = sc + (int64_t)r * NG * sc_stride;
                float *ar = acc + (int64_t)r * NG * D;
                __m256 a[4][2];
#pragma GCC unroll 4
                for (int g = 0; g < NG; g++) a[g][0] = _mm256_loadu_ps(ar + g * D + d), a[g][1] = _mm256_loadu_ps(ar + g * D + d + 8);
                sum_values(v, kv_stride, d, kb, e, s, sc_stride, a, NG, f16);
#pragma GCC unroll 4
                for (int g = 0; g < NG; g++) _mm256_storeu_ps(ar + g * D + d, a[g][0]), _mm256_storeu_ps(ar + g * D + d + 8, a[g][1]);
            }
    }
    for (int r = 0; r < nr; r++)
        for (int g = 0; g < NG; g++) memcpy(o + r * o_row + g * o_stride, acc + ((int64_t)r * NG + g) * D, sizeof(float) * (size_t)D);
}

void cpu_attend_rows_avx2(int nr, int ng, const float *q, int64_t q_row, int64_t q_stride, const void *k, const void *v,
                          bool f16, int64_t kv_stride, const int64_t *n_keys, int64_t D, float scale, float *sc,
                          int64_t sc_stride, float *acc, float *o, int64_t o_row, int64_t o_stride) {
#define AR(NG)                                                                                                         \
    case NG:                                                                                                           \
        if (f16) attend_rows(nr, q, q_row, q_stride, k, v, kv_stride, n_keys, D, scale, sc, sc_stride, acc, o, o_row,  \
                             o_stride, NG, true);                                                                      \
        else attend_rows(nr, q, q_row, q_stride, k, v, kv_stride, n_keys, D, scale, sc, sc_stride, acc, o, o_row,      \
                         o_stride, NG, false);                                                                         \
        return;
    switch (ng) { AR(1) AR(2) AR(3) AR(4) default: HEARTH_DIE("attend rows: %d heads", ng); }
#undef AR
}
