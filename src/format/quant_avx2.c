/* quant_avx2.c: the AVX2/FMA/F16C dot kernels behind quant_dot. Compiled with -mavx2 -mfma
 * -mf16c; nothing here may run before quant.c's CPU check. K-quant blocks reduce their
 * integer sums to one int and finish with quant.c's float expression, so they return the
 * same bits as the scalar path; Q8_0 and float rows keep lane-wise float accumulators. */
#include "format/quant.h"
#include "base/util.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
/* GCC in ISO C mode never fuses a*b+c; clang would, and the K-quant block finish must
 * round exactly like the scalar path */
#pragma clang fp contract(off)
#endif

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline float h2f(f16_t h) { return _cvtsh_ss(h); } /* exact, like f16_to_f32 */

/* Software prefetch for the one-row dots (decode). A decode step streams each weight matrix
 * from memory once; the hardware prefetcher alone kept one core at 4-6 GB/s on a Q4_K
 * matrix (its stream read 14 GB/s), because the dot's compute does not overlap its misses.
 * Asking for the lines PF_AHEAD bytes ahead of the block in use lifted that to 11-12 GB/s
 * (2048-4096 bytes measured alike, 512 too short). Rows of a matrix are contiguous, so
 * past a row's end this fetches the next row; a prefetch never faults. No bit changes. */
#define PF_AHEAD 3072
static inline void prefetch_ahead(const void *p, size_t bytes) {
    const char *c = (const char *)p + PF_AHEAD;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

/* ---- Q8_0 x Q8_0 ---- */

/* |x|*sign(y,x) lets maddubs (unsigned x signed) multiply two signed rows; it would be
 * wrong only for x = -128 with y = -128, and neither quantizer emits -128. Pair sums stay
 * below 2*127*128 < 32767, so maddubs never saturates. */
static inline __m256 q8_0_block(const block_q8_0 *x, const block_q8_0 *y, __m256 acc) {
    __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
    __m256i qy = _mm256_loadu_si256((const __m256i *)y->qs);
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
    __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    __m256 d = _mm256_set1_ps(h2f(x->d) * h2f(y->d));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p32), acc);
}

static float dot_q8_0(const block_q8_0 *x, const block_q8_0 *y, int64_t nb) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) { /* two chains hide the FMA latency */
        prefetch_ahead(x + i, 2 * sizeof *x);
        acc0 = q8_0_block(x + i, y + i, acc0);
        acc1 = q8_0_block(x + i + 1, y + i + 1, acc1);
    }
    if (i < nb) acc0 = q8_0_block(x + i, y + i, acc0);
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* ---- K-quants x Q8_K ---- */

/* pair_shuffle[j]: byte pattern that, applied to 16 int16 scales in both lanes, broadcasts
 * scale j to all 16 int16 slots (for madd with the 32 products of sub-block j) */
static const uint8_t pair_shuffle[8][32] = {
#define PS(j) {2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1, \
               2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1,2*j,2*j+1}
    PS(0), PS(1), PS(2), PS(3), PS(4), PS(5), PS(6), PS(7)
#undef PS
};

/* Q4_K/Q5_K scale bytes -> 8 scales (sc) and 8 mins (mn), 6 bits each, by whole words:
 * word 0/1 hold scales/mins 0-3 in their low 6 bits and the top 2 bits of 4-7, word 2 the
 * low nibbles of scales (low) and mins (high) 4-7 */
static inline void k4_unpack(const uint8_t *s, uint32_t sc[2], uint32_t mn[2]) {
    uint32_t w[3];
    memcpy(w, s, 12);
    sc[0] = w[0] & 0x3f3f3f3fu;
    mn[0] = w[1] & 0x3f3f3f3fu;
    sc[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    mn[1] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
}

/* sum over sub-blocks of min_j * (sum of the 32 activations of j), from the bsums */
static inline int k4_min_sum(const uint32_t mn[2], const int16_t *bsums) {
    __m256i bs = _mm256_loadu_si256((const __m256i *)bsums);
    __m128i b8 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    __m128i m16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)mn[1], (int)mn[0]));
    __m128i p = _mm_madd_epi16(m16, b8);
    p = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0xb1));
    return _mm_cvtsi128_si32(p);
}

static float dot_q4_k(const block_q4_K *x, const block_q8_K *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x);
        uint32_t sc[2], mn[2];
        k4_unpack(x[i].scales, sc, mn);
        int summ = k4_min_sum(mn, y[i].bsums);
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc[1], (int)sc[0])));
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q += 32, a += 64) {
            __m256i qb = _mm256_loadu_si256((const __m256i *)q);
            __m256i lo = _mm256_and_si256(qb, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
            __m256i s0 = _mm256_shuffle_epi8(sc16, _mm256_loadu_si256((const __m256i *)pair_shuffle[2 * j]));
            __m256i s1 = _mm256_shuffle_epi8(sc16, _mm256_loadu_si256((const __m256i *)pair_shuffle[2 * j + 1]));
            __m256i p0 = _mm256_madd_epi16(s0, _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)a)));
            __m256i p1 = _mm256_madd_epi16(s1, _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(a + 32))));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
        }
        int sumi = hsum_epi32(acc);
        float d = y[i].d * h2f(x[i].d), dmin = y[i].d * h2f(x[i].dmin);
        sum += d * (float)sumi - dmin * (float)summ;
    }
    return sum;
}

static float dot_q5_k(const block_q5_K *x, const block_q8_K *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x);
        uint32_t sc[2], mn[2];
        k4_unpack(x[i].scales, sc, mn);
        int summ = k4_min_sum(mn, y[i].bsums);
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc[1], (int)sc[0])));
        __m256i hb = _mm256_loadu_si256((const __m256i *)x[i].qh);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q += 32, a += 64) {
            __m256i qb = _mm256_loadu_si256((const __m256i *)q);
            /* bit 2j of each qh byte is the fifth bit of sub-block 2j, bit 2j+1 of 2j+1;
             * masked to one bit first, so the 16-bit shifts cannot leak between bytes */
            __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(hb, m1), 4);
            __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), m1), 4);
            hb = _mm256_srli_epi16(hb, 2);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(qb, m4), h0);
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), h1);
            __m256i s0 = _mm256_shuffle_epi8(sc16, _mm256_loadu_si256((const __m256i *)pair_shuffle[2 * j]));
            __m256i s1 = _mm256_shuffle_epi8(sc16, _mm256_loadu_si256((const __m256i *)pair_shuffle[2 * j + 1]));
            __m256i p0 = _mm256_madd_epi16(s0, _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)a)));
            __m256i p1 = _mm256_madd_epi16(s1, _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(a + 32))));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
        }
        int sumi = hsum_epi32(acc);
        float d = y[i].d * h2f(x[i].d), dmin = y[i].d * h2f(x[i].dmin);
        sum += d * (float)sumi - dmin * (float)summ;
    }
    return sum;
}

/* lane_pair[g]: 16 bytes g,..,g (8 times) then g+1,..: after sign extension to int16 this
 * puts scale g in the low 128-bit lane and scale g+1 in the high one, matching the two
 * 16-value groups that one 32-byte vector of Q6_K values spans */
static const uint8_t lane_pair[8][16] = {
#define LP(k) {2*k,2*k,2*k,2*k,2*k,2*k,2*k,2*k,2*k+1,2*k+1,2*k+1,2*k+1,2*k+1,2*k+1,2*k+1,2*k+1}
    LP(0), LP(1), LP(2), LP(3), LP(4), LP(5), LP(6), LP(7)
#undef LP
};

/* The 6-bit values are used unsigned (0..63) so maddubs applies; the -32 offset comes
 * back as 32 * sum_g scale_g * bsum_g, from the activation block sums. */
static float dot_q6_k(const block_q6_K *x, const block_q8_K *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(x + i, sizeof *x);
        __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
        const int8_t *a = y[i].qs;
        for (int h = 0; h < 2; h++, a += 128) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            for (int k = 0; k < 4; k++) {
                __m256i s = _mm256_cvtepi8_epi16(
                    _mm_shuffle_epi8(sc8, _mm_loadu_si128((const __m128i *)lane_pair[4 * h + k])));
                __m256i p = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(a + 32 * k)));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s, p));
            }
        }
        int sumi = hsum_epi32(acc);
        float d = y[i].d * h2f(x[i].d);
        sum += d * (float)sumi;
    }
    return sum;
}

/* ---- float rows x f32 activations ---- */

/* Four 8-lane FMA chains, then 8 at a time, then a scalar tail. */
#define FLOAT_DOT(LOAD8, SCALAR)                                                              \
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(),     \
           c3 = _mm256_setzero_ps();                                                          \
    int64_t i = 0;                                                                            \
    for (; i + 32 <= n; i += 32) {                                                            \
        prefetch_ahead(w + i, 32 * sizeof *w);                                                \
        c0 = _mm256_fmadd_ps(LOAD8(i), _mm256_loadu_ps(a + i), c0);                           \
        c1 = _mm256_fmadd_ps(LOAD8(i + 8), _mm256_loadu_ps(a + i + 8), c1);                   \
        c2 = _mm256_fmadd_ps(LOAD8(i + 16), _mm256_loadu_ps(a + i + 16), c2);                 \
        c3 = _mm256_fmadd_ps(LOAD8(i + 24), _mm256_loadu_ps(a + i + 24), c3);                 \
    }                                                                                         \
    for (; i + 8 <= n; i += 8) c0 = _mm256_fmadd_ps(LOAD8(i), _mm256_loadu_ps(a + i), c0);    \
    float tail = 0;                                                                           \
    for (; i < n; i++) tail += (SCALAR(i)) * a[i];                                            \
    return hsum_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3))) + tail;

static float dot_f32(const float *w, const float *a, int64_t n) {
#define LD(k) _mm256_loadu_ps(w + (k))
#define SC(k) w[k]
    FLOAT_DOT(LD, SC)
#undef LD
#undef SC
}

static float dot_f16(const f16_t *w, const float *a, int64_t n) {
#define LD(k) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + (k))))
#define SC(k) h2f(w[k])
    FLOAT_DOT(LD, SC)
#undef LD
#undef SC
}

static float dot_bf16(const bf16_t *w, const float *a, int64_t n) {
#define LD(k) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + (k)))), 16))
#define SC(k) bf16_to_f32(w[k])
    FLOAT_DOT(LD, SC)
#undef LD
#undef SC
}

float quant_dot_avx2(uint32_t t, const void *w, const void *a, int64_t n) {
    switch (t) {
    case QT_F32: return dot_f32(w, a, n);
    case QT_F16: return dot_f16(w, a, n);
    case QT_BF16: return dot_bf16(w, a, n);
    case QT_Q8_0: HEARTH_CHECK(n % QK8_0 == 0); return dot_q8_0(w, a, n / QK8_0);
    case QT_Q4_K: HEARTH_CHECK(n % QK_K == 0); return dot_q4_k(w, a, n / QK_K);
    case QT_Q5_K: HEARTH_CHECK(n % QK_K == 0); return dot_q5_k(w, a, n / QK_K);
    case QT_Q6_K: HEARTH_CHECK(n % QK_K == 0); return dot_q6_k(w, a, n / QK_K);
    default: return quant_dot_ref(t, w, a, n); /* Q8_K x Q8_K: not a weight type in practice */
    }
}

/* ---- tiles of NW weight rows x NA activation rows, NW * NA <= 4 ----
 * Each weight block is loaded, unpacked and its scales spread once for the NA activation
 * rows, and each activation block loaded once for the NW weight rows. Integer sums are
 * exact whatever the order, and the block finish runs lane-wise over the pairs (lane
 * p = w * NA + a) with the scalar path's expression (one IEEE multiply, subtract and add
 * per lane, no contraction), so each pair gets the bits that quant_dot gives it. NW and NA
 * are compile-time constants after inlining. */
#define ROWS_INLINE static inline __attribute__((always_inline))

/* lane p of the result = the sum of the 8 lanes of acc[p], for p < 4 */
ROWS_INLINE __m128i hsum4_epi32(const __m256i acc[4]) {
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* lane p = a * b for the pair's activation scale a and weight scale b (0 in unused lanes) */
ROWS_INLINE __m128 pair_scales(const float ya[4], const float xw[4], const int NW, const int NA) {
    float v[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
    for (int p = 0; p < NW * NA; p++) v[p] = ya[p % NA] * xw[p / NA];
    return _mm_loadu_ps(v);
}

/* lane p = w * NA + a of sum to yo[a][o + w]; lanes leave by rotation, not through memory
 * (a 4-byte reload of a 16-byte store may not forward) */
ROWS_INLINE void tile_store(__m128 sum, float *const *yo, int64_t o, const int NW, const int NA) {
#pragma GCC unroll 4
    for (int p = 0; p < NW * NA; p++) {
        _mm_store_ss(yo[p % NA] + o + p / NA, sum);
        sum = _mm_shuffle_ps(sum, sum, 0x39);
    }
}

ROWS_INLINE void tile_k4(const bool q5, const uint8_t *const *xw, size_t xb, const block_q8_K *const *y, int64_t nb,
                         float *const *yo, int64_t o, const int NW, const int NA) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
    __m128 sum = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        /* Q4_K and Q5_K share d, dmin, scales at the block start; qs follows qh in Q5_K */
        const block_q4_K *x4[4];
        __m128i m16[4];
        __m256i sc16[4], hb[4];
        float xd[4], xdm[4], ya[4];
#pragma GCC unroll 4
        for (int w = 0; w < NW; w++) {
            x4[w] = (const block_q4_K *)(xw[w] + (size_t)i * xb);
            uint32_t sc[2], mn[2];
            k4_unpack(x4[w]->scales, sc, mn);
            m16[w] = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)mn[1], (int)mn[0]));
            sc16[w] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc[1], (int)sc[0])));
            hb[w] = q5 ? _mm256_loadu_si256((const __m256i *)((const block_q5_K *)x4[w])->qh) : _mm256_setzero_si256();
            xd[w] = h2f(x4[w]->d);
            xdm[w] = h2f(x4[w]->dmin);
        }
        /* min sums: lane p = sum_j min_j(w) * bsum_j(a) */
        __m128i b8[4], pm[4];
#pragma GCC unroll 4
        for (int a = 0; a < NA; a++) {
            __m256i bs = _mm256_loadu_si256((const __m256i *)y[a][i].bsums);
            b8[a] = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            ya[a] = y[a][i].d;
        }
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) pm[p] = p < NW * NA ? _mm_madd_epi16(m16[p / NA], b8[p % NA]) : _mm_setzero_si128();
        __m128i summ = _mm_hadd_epi32(_mm_hadd_epi32(pm[0], pm[1]), _mm_hadd_epi32(pm[2], pm[3]));
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i s0[4], s1[4], lo[4], hi[4];
#pragma GCC unroll 4
            for (int w = 0; w < NW; w++) {
                const uint8_t *q = (q5 ? ((const block_q5_K *)x4[w])->qs : x4[w]->qs) + 32 * j;
                __m256i qb = _mm256_loadu_si256((const __m256i *)q);
                lo[w] = _mm256_and_si256(qb, m4);
                hi[w] = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
                if (q5) {
                    /* bit 2j of each qh byte is the fifth bit of sub-block 2j, bit 2j+1 of 2j+1 */
                    lo[w] = _mm256_or_si256(lo[w], _mm256_slli_epi16(_mm256_and_si256(hb[w], m1), 4));
                    hi[w] = _mm256_or_si256(hi[w], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb[w], 1), m1), 4));
                    hb[w] = _mm256_srli_epi16(hb[w], 2);
                }
                s0[w] = _mm256_shuffle_epi8(sc16[w], _mm256_loadu_si256((const __m256i *)pair_shuffle[2 * j]));
                s1[w] = _mm256_shuffle_epi8(sc16[w], _mm256_loadu_si256((const __m256i *)pair_shuffle[2 * j + 1]));
            }
#pragma GCC unroll 4
            for (int a = 0; a < NA; a++) {
                const __m256i a0 = _mm256_loadu_si256((const __m256i *)(y[a][i].qs + 64 * j));
                const __m256i a1 = _mm256_loadu_si256((const __m256i *)(y[a][i].qs + 64 * j + 32));
#pragma GCC unroll 4
                for (int w = 0; w < NW; w++) {
                    __m256i p0 = _mm256_madd_epi16(s0[w], _mm256_maddubs_epi16(lo[w], a0));
                    __m256i p1 = _mm256_madd_epi16(s1[w], _mm256_maddubs_epi16(hi[w], a1));
                    acc[w * NA + a] = _mm256_add_epi32(acc[w * NA + a], _mm256_add_epi32(p0, p1));
                }
            }
        }
        __m128 d = pair_scales(ya, xd, NW, NA), dmin = pair_scales(ya, xdm, NW, NA);
        __m128 t = _mm_sub_ps(_mm_mul_ps(d, _mm_cvtepi32_ps(hsum4_epi32(acc))), _mm_mul_ps(dmin, _mm_cvtepi32_ps(summ)));
        sum = _mm_add_ps(sum, t);
    }
    tile_store(sum, yo, o, NW, NA);
}

ROWS_INLINE void tile_q6_k(const uint8_t *const *xw, const block_q8_K *const *y, int64_t nb, float *const *yo,
                           int64_t o, const int NW, const int NA) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    __m128 sum = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const block_q6_K *x[4];
        __m128i sc8[4];
        float xd[4], ya[4];
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
        for (int w = 0; w < NW; w++) {
            x[w] = (const block_q6_K *)xw[w] + i;
            sc8[w] = _mm_loadu_si128((const __m128i *)x[w]->scales);
            xd[w] = h2f(x[w]->d);
            __m256i sc16 = _mm256_cvtepi8_epi16(sc8[w]);
#pragma GCC unroll 4
            for (int a = 0; a < NA; a++) {
                __m256i bs = _mm256_loadu_si256((const __m256i *)y[a][i].bsums);
                acc[w * NA + a] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
            }
        }
#pragma GCC unroll 4
        for (int a = 0; a < NA; a++) ya[a] = y[a][i].d;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i q[2][4]; /* NW <= 2: the half's 128 values of each weight row, unpacked once */
#pragma GCC unroll 2
            for (int w = 0; w < NW; w++) {
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(x[w]->ql + 64 * h));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(x[w]->ql + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(x[w]->qh + 32 * h));
                q[w][0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
                q[w][1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
                q[w][2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
                q[w][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            }
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i s[2];
#pragma GCC unroll 2
                for (int w = 0; w < NW; w++)
                    s[w] = _mm256_cvtepi8_epi16(
                        _mm_shuffle_epi8(sc8[w], _mm_loadu_si128((const __m128i *)lane_pair[4 * h + k])));
#pragma GCC unroll 4
                for (int a = 0; a < NA; a++) {
                    const __m256i av = _mm256_loadu_si256((const __m256i *)(y[a][i].qs + 128 * h + 32 * k));
#pragma GCC unroll 2
                    for (int w = 0; w < NW; w++)
                        acc[w * NA + a] = _mm256_add_epi32(acc[w * NA + a], _mm256_madd_epi16(s[w], _mm256_maddubs_epi16(q[w][k], av)));
                }
            }
        }
        __m128 d = pair_scales(ya, xd, NW, NA);
        sum = _mm_add_ps(sum, _mm_mul_ps(d, _mm_cvtepi32_ps(hsum4_epi32(acc))));
    }
    tile_store(sum, yo, o, NW, NA);
}

/* the NW x NA tiles over weight rows [0, nw) (a last single row when NW = 2 does not divide
 * nw), writing yo[a][o]; na = 2 takes 2 x 2 tiles, na = 3 or 4 one weight row at a time */
#define TILE_LOOP(SUFFIX)                                                                                   \
    for (int64_t o = 0; o < nw;) {                                                                          \
        const bool two = na == 2 && o + 1 < nw;                                                             \
        const uint8_t *xw[2] = {w + (size_t)o * w_stride, w + (size_t)(o + two) * w_stride};                \
        if (t == QT_Q6_K) {                                                                                 \
            if (two) tile_q6_k##SUFFIX(xw, y, nb, yo, o, 2, 2);                                             \
            else if (na == 4) tile_q6_k##SUFFIX(xw, y, nb, yo, o, 1, 4);                                    \
            else if (na == 3) tile_q6_k##SUFFIX(xw, y, nb, yo, o, 1, 3);                                    \
            else tile_q6_k##SUFFIX(xw, y, nb, yo, o, 1, 2);                                                 \
        } else {                                                                                            \
            const bool q5 = t == QT_Q5_K;                                                                   \
            const size_t xb = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);                                 \
            if (q5) {                                                                                       \
                if (two) tile_k4##SUFFIX(true, xw, xb, y, nb, yo, o, 2, 2);                                 \
                else if (na == 4) tile_k4##SUFFIX(true, xw, xb, y, nb, yo, o, 1, 4);                        \
                else if (na == 3) tile_k4##SUFFIX(true, xw, xb, y, nb, yo, o, 1, 3);                        \
                else tile_k4##SUFFIX(true, xw, xb, y, nb, yo, o, 1, 2);                                     \
            } else {                                                                                        \
                if (two) tile_k4##SUFFIX(false, xw, xb, y, nb, yo, o, 2, 2);                                \
                else if (na == 4) tile_k4##SUFFIX(false, xw, xb, y, nb, yo, o, 1, 4);                       \
                else if (na == 3) tile_k4##SUFFIX(false, xw, xb, y, nb, yo, o, 1, 3);                       \
                else tile_k4##SUFFIX(false, xw, xb, y, nb, yo, o, 1, 2);                                    \
            }                                                                                               \
        }                                                                                                   \
        o += two ? 2 : 1;                                                                                   \
    }

/* ---- the same tiles with AVX-512BW and VNNI (512-bit registers, picked at run time) ----
 * Two weight rows share each register: the low 256 bits hold row 0's values, the high
 * 256 row 1's, against one activation chunk broadcast to both halves, so one accumulator
 * per activation row serves both weight rows, and a last odd weight row is simply paired
 * with itself. Up to PAIR_ROWS activation rows go through a tile at once, in groups of 4,
 * and the block finish runs lane-wise over a group's 8 pairs with quant_dot's expression,
 * so every pair keeps its bits. VNNI's dpwssd fuses the scale madd with the accumulate
 * (pp512 -t 1 on small: ~460 -> ~505 tok/s); the paired rows, 8 activation rows and one
 * reduction per 8 pairs took it to ~635 (the per-block finish had cost as much as the
 * multiplies; 16 activation rows measured no faster). A CPU with AVX-512BW but no VNNI
 * (Skylake-SP) keeps the AVX2 tiles. */
#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define ROWS512_INLINE static inline __attribute__((always_inline)) AVX512_FN
#define PAIR_ROWS 8

/* [lo | hi] from two 32-byte loads */
ROWS512_INLINE __m512i load_pair(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}

ROWS512_INLINE __m512i bcast256(const void *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }

/* One transposing reduction for a group of 4 activation rows: t[2a] is activation row a's
 * accumulator, t[2a + 1] its side sums (Q4_K/Q5_K: mins x bsums; Q6_K: scales x bsums, for
 * the -32 offset), each [weight row 0 | weight row 1]. Lane w * 4 + a of the result is the
 * sum of pair (w, a)'s accumulator lanes, lane 8 + w * 4 + a that of its side sums. Each
 * level adds lanes of one pair only, so the sums are exact. */
ROWS512_INLINE __m512i reduce_pairs(const __m512i t[8]) {
    __m512i u[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        u[k] = _mm512_add_epi32(_mm512_shuffle_i64x2(t[2 * k], t[2 * k + 1], 0x88),
                                _mm512_shuffle_i64x2(t[2 * k], t[2 * k + 1], 0xdd));
    __m512i w0 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[0], u[1]), _mm512_unpackhi_epi64(u[0], u[1]));
    __m512i w1 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2], u[3]), _mm512_unpackhi_epi64(u[2], u[3]));
    __m512 f0 = _mm512_castsi512_ps(w0), f1 = _mm512_castsi512_ps(w1);
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(f0, f1, 0x88)),
                            _mm512_castps_si512(_mm512_shuffle_ps(f0, f1, 0xdd)));
}

/* activation row d of a group, [a0 a1 a2 a3] in every 128-bit lane (0 past the tile) */
ROWS512_INLINE __m128 group_d(const block_q8_K *const *y, int64_t i, int g, const int NA) {
    float v[4];
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) v[a] = 4 * g + a < NA ? y[4 * g + a][i].d : 0;
    return _mm_set_ps(v[3], v[2], v[1], v[0]);
}

/* lane w * 4 + a of a group's sum to yo[a][o + w], a < NA; the second weight row only when two */
ROWS512_INLINE void tile_store_pairs(__m256 sum, float *const *yo, int64_t o, bool two, const int NA) {
    const __m128 r0 = _mm256_castps256_ps128(sum), r1 = _mm256_extractf128_ps(sum, 1);
    if (!two) {
        tile_store(r0, yo, o, 1, NA);
        return;
    }
    const __m128 lo = _mm_unpacklo_ps(r0, r1), hi = _mm_unpackhi_ps(r0, r1); /* [a w0, a w1, ...] */
    _mm_storel_pi((__m64 *)(yo[0] + o), lo);
    if (NA > 1) _mm_storeh_pi((__m64 *)(yo[1] + o), lo);
    if (NA > 2) _mm_storel_pi((__m64 *)(yo[2] + o), hi);
    if (NA > 3) _mm_storeh_pi((__m64 *)(yo[3] + o), hi);
}

/* k4_unpack for two rows at once, from each row's first 16 bytes (d, dmin, the 12 scale
 * bytes b0-b11 at 4-15) in one 128-bit lane: per lane, bytes 0-7 take the 8 scales and
 * bytes 8-15 the 8 mins. k4_pick[0] places b0-3 | b8-11 | b4-7 | b8-11 (the low 6 bits of
 * scales/mins 0-3, the nibbles of 4-7), k4_pick[1] b0-3 and b4-7 under the scales/mins 4-7
 * their top 2 bits belong to (0x80: zero). */
static const uint8_t k4_pick[2][16] = {{4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15},
                                       {0x80, 0x80, 0x80, 0x80, 4, 5, 6, 7, 0x80, 0x80, 0x80, 0x80, 8, 9, 10, 11}};
static const uint8_t k4_low[16] = {0x3f, 0x3f, 0x3f, 0x3f, 0x0f, 0x0f, 0x0f, 0x0f, 0x3f, 0x3f, 0x3f, 0x3f, 0, 0, 0, 0};
static const uint8_t k4_high[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0f, 0x0f, 0x0f, 0x0f};
ROWS512_INLINE __m256i k4_unpack2(__m256i s) {
    const __m256i p = _mm256_shuffle_epi8(s, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k4_pick[0])));
    const __m256i q = _mm256_shuffle_epi8(s, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k4_pick[1])));
    /* masked after each 16-bit shift, so no bits cross bytes; 0xea: (a & b) | c */
    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(q, 2), _mm256_set1_epi8(0x30));
    const __m256i hi = _mm256_ternarylogic_epi32(_mm256_srli_epi16(p, 4),
                                                 _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k4_high)), top, 0xea);
    return _mm256_ternarylogic_epi32(p, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k4_low)), hi, 0xea);
}

/* int16 picks from k4_unpack2's bytes widened to int16: each min of row 0 (int16 8-15) and
 * row 1 (24-31) twice, filling an int32 lane to meet the bsums pair of its sub-block */
#define MP(h, j) 8 + 16 * h + j, 8 + 16 * h + j
static const int16_t k4_min_pick[32] = {MP(0, 0), MP(0, 1), MP(0, 2), MP(0, 3), MP(0, 4), MP(0, 5), MP(0, 6), MP(0, 7),
                                        MP(1, 0), MP(1, 1), MP(1, 2), MP(1, 3), MP(1, 4), MP(1, 5), MP(1, 6), MP(1, 7)};
#undef MP

/* x16 permutation for Q4_K/Q5_K: [d0, dmin0, d1, dmin1] to d of weight row 0 (lanes 0-3),
 * of row 1 (4-7), then dmin of row 0 (8-11) and row 1 (12-15) */
static const int32_t k4_scale_lanes[16] = {0, 0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3};

ROWS512_INLINE void tile_k4_512(const bool q5, const uint8_t *const *xw, size_t xb, const block_q8_K *const *y,
                                int64_t nb, float *const *yo, int64_t o, bool two, const int NA) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
    const __m512i xperm = _mm512_loadu_si512((const void *)k4_scale_lanes), mnpick = _mm512_loadu_si512((const void *)k4_min_pick);
    __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++) {
        /* Q4_K and Q5_K share d, dmin, scales at the block start; qs follows qh in Q5_K */
        const block_q4_K *x0 = (const block_q4_K *)(xw[0] + (size_t)i * xb), *x1 = (const block_q4_K *)(xw[1] + (size_t)i * xb);
        const __m256i head = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)x0)),
                                                     _mm_loadu_si128((const __m128i *)x1), 1);
        const __m512i u16 = _mm512_cvtepu8_epi16(k4_unpack2(head));
        /* the 8 scales of row 0 as int16 in lanes 0-1, of row 1 in lanes 2-3, for pair_shuffle */
        const __m512i sc = _mm512_shuffle_i64x2(u16, u16, 0xa0);
        const __m512i mn = _mm512_permutexvar_epi16(mnpick, u16);
        const __m512i hb = q5 ? load_pair(((const block_q5_K *)x0)->qh, ((const block_q5_K *)x1)->qh) : _mm512_setzero_si512();
        const uint8_t *q0 = q5 ? ((const block_q5_K *)x0)->qs : x0->qs, *q1 = q5 ? ((const block_q5_K *)x1)->qs : x1->qs;
        __m512i acc[PAIR_ROWS];
#pragma GCC unroll 8
        for (int a = 0; a < NA; a++) acc[a] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m512i qb = load_pair(q0 + 32 * j, q1 + 32 * j);
            __m512i lo = _mm512_and_si512(qb, m4), hi = _mm512_and_si512(_mm512_srli_epi16(qb, 4), m4);
            if (q5) { /* bit 2j of each qh byte is the fifth bit of sub-block 2j, bit 2j+1 of 2j+1 */
                lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(1 << (2 * j)))), lo, bit4);
                hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(2 << (2 * j)))), hi, bit4);
            }
            const __m512i sl = _mm512_shuffle_epi8(sc, bcast256(pair_shuffle[2 * j]));
            const __m512i sh = _mm512_shuffle_epi8(sc, bcast256(pair_shuffle[2 * j + 1]));
#pragma GCC unroll 8
            for (int a = 0; a < NA; a++) {
                acc[a] = _mm512_dpwssd_epi32(acc[a], sl, _mm512_maddubs_epi16(lo, bcast256(y[a][i].qs + 64 * j)));
                acc[a] = _mm512_dpwssd_epi32(acc[a], sh, _mm512_maddubs_epi16(hi, bcast256(y[a][i].qs + 64 * j + 32)));
            }
        }
        /* d | dmin of each pair: y.d * x.d, one float multiply each, like quant_dot's */
        const __m128i dd = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(head, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0)));
        const __m512 xd = _mm512_permutexvar_ps(xperm, _mm512_castps128_ps512(_mm_cvtph_ps(dd)));
#pragma GCC unroll 2
        for (int g = 0; g < (NA + 3) / 4; g++) {
            __m512i t[8];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const int a = 4 * g + k;
                t[2 * k] = a < NA ? acc[a] : _mm512_setzero_si512();
                t[2 * k + 1] = a < NA ? _mm512_madd_epi16(mn, bcast256(y[a][i].bsums))
                                      : _mm512_setzero_si512();
            }
            const __m512 si = _mm512_cvtepi32_ps(reduce_pairs(t)); /* sumi | summ */
            const __m512 pr = _mm512_mul_ps(si, _mm512_mul_ps(_mm512_broadcast_f32x4(group_d(y, i, g, NA)), xd));
            const __m256 dm = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(pr), 1));
            sum[g] = _mm256_add_ps(sum[g], _mm256_sub_ps(_mm512_castps512_ps256(pr), dm));
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < (NA + 3) / 4; g++) tile_store_pairs(sum[g], yo + 4 * g, o, two, NA - 4 * g < 4 ? NA - 4 * g : 4);
}

/* Q6_K scale picks for the 32 values of step s (groups 2s, 2s+1): int16 index per lane
 * into [row 0's 16 scales | row 1's 16] */
#define Q6S(s) {2*s,2*s,2*s,2*s,2*s,2*s,2*s,2*s, 2*s+1,2*s+1,2*s+1,2*s+1,2*s+1,2*s+1,2*s+1,2*s+1, \
                16+2*s,16+2*s,16+2*s,16+2*s,16+2*s,16+2*s,16+2*s,16+2*s, \
                17+2*s,17+2*s,17+2*s,17+2*s,17+2*s,17+2*s,17+2*s,17+2*s}
static const int16_t q6_scale_pick[8][32] = {Q6S(0), Q6S(1), Q6S(2), Q6S(3), Q6S(4), Q6S(5), Q6S(6), Q6S(7)};
#undef Q6S

/* The 6-bit values are used unsigned, as in dot_q6_k; 32 values of each row per step. */
ROWS512_INLINE void tile_q6_k_512(const uint8_t *const *xw, const block_q8_K *const *y, int64_t nb,
                                  float *const *yo, int64_t o, bool two, const int NA) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    /* d of weight row 0 in lanes 0-3, of row 1 in 4-7 */
    const __m256i xperm = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
    __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++) {
        const block_q6_K *x0 = (const block_q6_K *)xw[0] + i, *x1 = (const block_q6_K *)xw[1] + i;
        const __m512i sc = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)x0->scales)), _mm_loadu_si128((const __m128i *)x1->scales), 1));
        __m512i acc[PAIR_ROWS];
#pragma GCC unroll 8
        for (int a = 0; a < NA; a++) acc[a] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i l0 = load_pair(x0->ql + 64 * h, x1->ql + 64 * h);
            const __m512i l1 = load_pair(x0->ql + 64 * h + 32, x1->ql + 64 * h + 32);
            const __m512i qh = load_pair(x0->qh + 32 * h, x1->qh + 32 * h);
            /* value bits 4-5 from qh bits 2k..2k+1; masking after each 16-bit shift keeps bytes apart */
            __m512i q[4];
            q[0] = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30));
            q[1] = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30));
            q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(qh, m30));
            q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                                   _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i s = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)q6_scale_pick[4 * h + k]), sc);
#pragma GCC unroll 8
                for (int a = 0; a < NA; a++)
                    acc[a] = _mm512_dpwssd_epi32(acc[a], s, _mm512_maddubs_epi16(q[k], bcast256(y[a][i].qs + 128 * h + 32 * k)));
            }
        }
        const __m256 xd = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, 0, 0, (short)x1->d, (short)x0->d))), xperm);
#pragma GCC unroll 2
        for (int g = 0; g < (NA + 3) / 4; g++) {
            __m512i t[8];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const int a = 4 * g + k;
                t[2 * k] = a < NA ? acc[a] : _mm512_setzero_si512();
                t[2 * k + 1] = a < NA ? _mm512_madd_epi16(sc, bcast256(y[a][i].bsums))
                                      : _mm512_setzero_si512();
            }
            const __m512i r = reduce_pairs(t);
            const __m256i sumi = _mm256_sub_epi32(_mm512_castsi512_si256(r), _mm256_slli_epi32(_mm512_extracti64x4_epi64(r, 1), 5));
            const __m128 yd = group_d(y, i, g, NA);
            const __m256 d = _mm256_mul_ps(_mm256_set_m128(yd, yd), xd);
            sum[g] = _mm256_add_ps(sum[g], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi)));
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < (NA + 3) / 4; g++) tile_store_pairs(sum[g], yo + 4 * g, o, two, NA - 4 * g < 4 ? NA - 4 * g : 4);
}

/* two weight rows per tile (a last odd row paired with itself), na = 2..PAIR_ROWS activation rows */
static AVX512_FN void tiles_512(uint32_t t, const uint8_t *w, size_t w_stride, int64_t nw, const block_q8_K *const *y,
                                int na, int64_t nb, float *const *yo) {
    const bool q5 = t == QT_Q5_K;
    const size_t xb = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    for (int64_t o = 0; o < nw; o += 2) {
        const bool two = o + 1 < nw;
        const uint8_t *xw[2] = {w + (size_t)o * w_stride, w + (size_t)(o + two) * w_stride};
#define SHAPES(CALL)                      \
    switch (na) {                         \
    case 2: CALL(2); break;               \
    case 3: CALL(3); break;               \
    case 4: CALL(4); break;               \
    case 5: CALL(5); break;               \
    case 6: CALL(6); break;               \
    case 7: CALL(7); break;               \
    default: CALL(8); break;              \
    }
#define Q6(NA) tile_q6_k_512(xw, y, nb, yo, o, two, NA)
#define Q5(NA) tile_k4_512(true, xw, xb, y, nb, yo, o, two, NA)
#define Q4(NA) tile_k4_512(false, xw, xb, y, nb, yo, o, two, NA)
        if (t == QT_Q6_K) SHAPES(Q6)
        else if (q5) SHAPES(Q5)
        else SHAPES(Q4)
#undef Q6
#undef Q5
#undef Q4
#undef SHAPES
    }
}

static pthread_once_t avx512_once = PTHREAD_ONCE_INIT;
static bool avx512_on;
static void avx512_decide(void) {
    const char *env = getenv("HEARTH_NO_AVX512");
    if (env && *env && strcmp(env, "0") != 0) return;
    __builtin_cpu_init();
    avx512_on = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

bool quant_avx512_active(void) {
    pthread_once(&avx512_once, avx512_decide);
    return avx512_on;
}

static void tiles(uint32_t t, const uint8_t *w, size_t w_stride, int64_t nw, const block_q8_K *const *y, int na,
                  int64_t nb, float *const *yo) {
    TILE_LOOP()
}

void quant_dot_rows_avx2(uint32_t t, int64_t n, const void *w, size_t w_stride, int nw, const void *const *a, int na,
                         float *const *y) {
    if (t != QT_Q4_K && t != QT_Q5_K && t != QT_Q6_K) {
        for (int r = 0; r < na; r++)
            for (int o = 0; o < nw; o++) y[r][o] = quant_dot_avx2(t, (const uint8_t *)w + (size_t)o * w_stride, a[r], n);
        return;
    }
    HEARTH_CHECK(n % QK_K == 0);
    const bool wide = quant_avx512_active();
    const int group = wide ? PAIR_ROWS : 4;
    for (int r0 = 0; r0 < na; r0 += group) {
        const int m = na - r0 < group ? na - r0 : group;
        if (m == 1) { /* one row (decode): the single-row dot streams a large matrix from memory faster than tiles */
            for (int o = 0; o < nw; o++) y[r0][o] = quant_dot_avx2(t, (const uint8_t *)w + (size_t)o * w_stride, a[r0], n);
            continue;
        }
        float *const *yo = y + r0;
        const block_q8_K *const *ya = (const block_q8_K *const *)(a + r0);
        if (wide) tiles_512(t, w, w_stride, nw, ya, m, n / QK_K, yo);
        else tiles(t, w, w_stride, nw, ya, m, n / QK_K, yo);
    }
}
