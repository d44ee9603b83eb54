/* gdn_avx2.c: the AVX2/FMA forms of gdn.c's two vector primitives (a dot product and a
 * row accumulation y = s0 y0 + sum_m c_m x_m with y held in registers). Each output
 * element sees the same operations in the same order whatever the caller's row or chunk
 * count, so the chunked delta rule keeps its bit-exact points. Called only after
 * quant_simd_active() (the CPU check). */
#include "engine/cpu/cpu.h"

#include <immintrin.h>

float cpu_gdn_dot_avx2(const float *x, const float *y, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++) r += x[i] * y[i];
    return r;
}

/* y[b] = s0 * y0[b] (0 when y0 is NULL) + sum_{j<m} c[j] * x[j * xs + b], for b < n, one FMA
 * per term in order of j; 64 columns at a time in 8 registers. y may be y0 (each strip is
 * read before it is written); no x row may overlap y. */
void cpu_gdn_rows_acc_avx2(float *y, const float *y0, float s0, const float *x, int64_t xs, const float *c,
                           int64_t m, int64_t n) {
    const __m256 vs0 = _mm256_set1_ps(s0);
    int64_t b = 0;
    for (; b + 64 <= n; b += 64) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            acc[k] = y0 ? _mm256_mul_ps(vs0, _mm256_loadu_ps(y0 + b + 8 * k)) : _mm256_setzero_ps();
        const float *xr = x + b;
        for (int64_t j = 0; j < m; j++, xr += xs) {
            const __m256 cj = _mm256_broadcast_ss(c + j);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) acc[k] = _mm256_fmadd_ps(cj, _mm256_loadu_ps(xr + 8 * k), acc[k]);
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) _mm256_storeu_ps(y + b + 8 * k, acc[k]);
    }
    for (; b + 8 <= n; b += 8) {
        __m256 acc = y0 ? _mm256_mul_ps(vs0, _mm256_loadu_ps(y0 + b)) : _mm256_setzero_ps();
        for (int64_t j = 0; j < m; j++) acc = _mm256_fmadd_ps(_mm256_broadcast_ss(c + j), _mm256_loadu_ps(x + j * xs + b), acc);
        _mm256_storeu_ps(y + b, acc);
    }
    for (; b < n; b++) {
        float acc = y0 ? s0 * y0[b] : 0.0f;
        for (int64_t j = 0; j < m; j++) acc = fmaf(c[j], x[j * xs + b], acc);
        y[b] = acc;
    }
}
