/* attn_avx2.c: the AVX2/FMA kernels behind attn.c's attend_task: up to 4 query heads that
 * share one KV head, scored against the key rows two at a time (each key row is loaded once
 * for all the heads), softmax, then the weighted sum of value rows in 16-wide column strips
 * kept in registers; and the same for up to 4 consecutive rows of a sequence at once, key
 * block by key block (attend_rows: each key and value row read once for all the rows' heads).
 * Each head's arithmetic is the same whatever the number of heads and rows done together, so
 * results do not depend on how the work is split. Called only after quant_simd_active() (the
 * CPU check); D must be a multiple of 16. */
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

KINLINE void attend_heads(const float *q, int64_t q_stride, const void *k, const void *v, int64_t kv_stride,
                          int64_t n_keys, int64_t D, float scale, float *sc, float *o, int64_t o_stride, const int NG,
                          const bool f16) {
    score_keys(q, q_stride, k, kv_stride, 0, n_keys, D, scale, sc, n_keys, NG, f16);
    /* softmax per head, in key order; sc becomes the probabilities */
    for (int g = 0; g < NG; g++) {
        float *s = sc + g * n_keys, mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < n_keys; i++) mx = s[i] > mx ? s[i] : mx;
        for (int64_t i = 0; i < n_keys; i++) {
            s[i] = expf(s[i] - mx);
            sum += s[i];
        }
        const float inv = 1.0f / sum;
        for (int64_t i = 0; i < n_keys; i++) s[i] *= inv;
    }
    /* o = sum_j p_j v_j, 16 columns at a time, one FMA chain per (head, 8 columns) */
    for (int64_t d = 0; d < D; d += 16) {
        __m256 acc[4][2];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
        sum_values(v, kv_stride, d, 0, n_keys, sc, n_keys, acc, NG, f16);
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            _mm256_storeu_ps(o + g * o_stride + d, acc[g][0]);
            _mm256_storeu_ps(o + g * o_stride + d + 8, acc[g][1]);
        }
    }
}

void cpu_attend_heads_avx2(int ng, const float *q, int64_t q_stride, const void *k, const void *v, bool f16,
                           int64_t kv_stride, int64_t n_keys, int64_t D, float scale, float *sc, float *o,
                           int64_t o_stride) {
#define AH(NG)                                                                                                   \
    case NG:                                                                                                     \
        if (f16) attend_heads(q, q_stride, k, v, kv_stride, n_keys, D, scale, sc, o, o_stride, NG, true);        \
        else attend_heads(q, q_stride, k, v, kv_stride, n_keys, D, scale, sc, o, o_stride, NG, false);           \
        return;
    switch (ng) { AH(1) AH(2) AH(3) AH(4) default: HEARTH_DIE("attend: %d heads", ng); }
#undef AH
}

/* Rows r < nr of one sequence (consecutive positions: row r sees keys [0, n_keys[r])), each
 * with ng query heads, against one KV head: every head's scores, softmax and sums exactly as
 * attend_heads makes them (a score is one FMA chain over D in pairs of keys or alone at an odd
 * end; a sum adds the keys in order per 8 columns), but the loops run key block by key block,
 * so a block of AM_ROWS_KB key and value rows is read from memory once for all nr * ng heads
 * instead of once a row: a prompt's rows at depth streamed the whole prefix per row. The
 * partial sums wait in acc between blocks (a float stored and loaded keeps its bits). */
#define AR_KB 32 /* keys a block: 16 KB of f16 key rows at D 256, in L1 */
KINLINE void attend_rows(int nr, const float *q, int64_t q_row, int64_t q_stride, const void *k, const void *v,
                         int64_t kv_stride, const int64_t *n_keys, int64_t D, float scale, float *sc, int64_t sc_stride,
                         float *acc, float *o, int64_t o_row, int64_t o_stride, const int NG, const bool f16) {
    int64_t nmax = 0;
    for (int r = 0; r < nr; r++) nmax = n_keys[r] > nmax ? n_keys[r] : nmax;
    for (int64_t kb = 0; kb < nmax; kb += AR_KB)
        for (int r = 0; r < nr; r++) {
            const int64_t e = kb + AR_KB < n_keys[r] ? kb + AR_KB : n_keys[r];
            if (e > kb) score_keys(q + r * q_row, q_stride, k, kv_stride, kb, e, D, scale, sc + (int64_t)r * NG * sc_stride, sc_stride, NG, f16);
        }
    for (int r = 0; r < nr; r++)
        for (int g = 0; g < NG; g++) {
            float *s = sc + ((int64_t)r * NG + g) * sc_stride, mx = -INFINITY, sum = 0;
            const int64_t n = n_keys[r];
            for (int64_t i = 0; i < n; i++) mx = s[i] > mx ? s[i] : mx;
            for (int64_t i = 0; i < n; i++) {
                s[i] = expf(s[i] - mx);
                sum += s[i];
            }
            const float inv = 1.0f / sum;
            for (int64_t i = 0; i < n; i++) s[i] *= inv;
        }
    memset(acc, 0, sizeof(float) * (size_t)(nr * NG * D));
    for (int64_t kb = 0; kb < nmax; kb += AR_KB)
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
