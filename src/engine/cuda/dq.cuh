// dq.cuh: one weight of a quantized row, read in place from its block (quant.h's layouts,
// ggml's). The _rn intrinsics keep nvcc from fusing into FMAs, so the rounding is the CPU's
// quant_dequantize_row: d*sc first, then times q, minus dmin*m. Shared by dequant.cu and
// kernels.cu; T is the qtype, known at compile time so the switch folds away.
#ifndef HEARTH_CUDA_DQ_CUH
#define HEARTH_CUDA_DQ_CUH

#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "format/quant.h"
}

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

__device__ __forceinline__ void k_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <int T> __device__ __forceinline__ float dq(const uint8_t *r, int64_t col) {
    if (T == QT_F32) return ((const float *)r)[col];
    if (T == QT_F16) return h2f(((const uint16_t *)r)[col]);
    if (T == QT_BF16) return __uint_as_float((uint32_t)((const uint16_t *)r)[col] << 16);
    if (T == QT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)r + col / QK8_0;
        return h2f(b->d) * (float)b->qs[col % QK8_0];
    }
    if (T == QT_Q4_K || T == QT_Q5_K) {
        const int j = (int)(col % QK_K), sub = j / 32, l = j % 32;
        const uint8_t *scales, *qs;
        uint16_t d, dmin;
        int hi = 0;
        if (T == QT_Q4_K) {
            const block_q4_K *b = (const block_q4_K *)r + col / QK_K;
            scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
        } else {
            const block_q5_K *b = (const block_q5_K *)r + col / QK_K;
            scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
            hi = ((b->qh[l] >> sub) & 1) << 4;
        }
        uint8_t sc, m;
        k_scale_min(sub, scales, &sc, &m);
        uint8_t q = qs[(sub / 2) * 32 + l];
        q = (uint8_t)(((sub & 1) ? (q >> 4) : (q & 0xF)) + hi);
        return __fsub_rn(__fmul_rn(__fmul_rn(h2f(d), (float)sc), (float)q), __fmul_rn(h2f(dmin), (float)m));
    }
    if (T == QT_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)r + col / QK_K;
        const int j = (int)(col % QK_K), half = j / 128, jj = j % 128, l = jj % 32, quarter = jj / 32;
        const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
        const int8_t *sc = b->scales + 8 * half;
        int q;
        switch (quarter) {
        case 0: q = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32; break;
        case 1: q = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32; break;
        case 2: q = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32; break;
        default: q = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32; break;
        }
        return __fmul_rn(__fmul_rn(h2f(b->d), (float)sc[l / 16 + 2 * quarter]), (float)q);
    }
    return __int_as_float(0x7fc00000);
}

// Eight weights [8c, 8c + 8) of a row: the same values as dq<T> at each column, with the
// block's scale read once (eight consecutive weights never cross a block or a sub-block).
template <int T> __device__ __forceinline__ void dq8(const uint8_t *r, int64_t c, float w[8]) {
    const int64_t col = 8 * c;
    if (T == QT_F32) {
        const float4 a = ((const float4 *)r)[2 * c], b = ((const float4 *)r)[2 * c + 1];
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else if (T == QT_F16 || T == QT_BF16) {
        const uint4 v = ((const uint4 *)r)[c];
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint16_t lo = (uint16_t)(u[j] & 0xffff), hi = (uint16_t)(u[j] >> 16);
            w[2 * j] = T == QT_F16 ? h2f(lo) : __uint_as_float((uint32_t)lo << 16);
            w[2 * j + 1] = T == QT_F16 ? h2f(hi) : __uint_as_float((uint32_t)hi << 16);
        }
    } else if (T == QT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)r + col / QK8_0;
        const float d = h2f(b->d);
        const int8_t *q = b->qs + col % QK8_0;
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = d * (float)q[j];
    } else if (T == QT_Q4_K || T == QT_Q5_K) {
        const int j0 = (int)(col % QK_K), sub = j0 / 32, l0 = j0 % 32;
        const uint8_t *scales, *qs, *qh = NULL;
        uint16_t d, dmin;
        if (T == QT_Q4_K) {
            const block_q4_K *b = (const block_q4_K *)r + col / QK_K;
            scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
        } else {
            const block_q5_K *b = (const block_q5_K *)r + col / QK_K;
            scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin, qh = b->qh;
        }
        uint8_t sc, m;
        k_scale_min(sub, scales, &sc, &m);
        const float ds = __fmul_rn(h2f(d), (float)sc), dm = __fmul_rn(h2f(dmin), (float)m);
        const uint2 qv = *(const uint2 *)(qs + (sub / 2) * 32 + l0);
        const uint32_t qw[2] = {qv.x, qv.y};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t q = (qw[j / 4] >> (8 * (j % 4))) & 0xff;
            q = (sub & 1) ? (q >> 4) : (q & 0xF);
            if (T == QT_Q5_K) q += ((qh[l0 + j] >> sub) & 1) << 4;
            w[j] = __fsub_rn(__fmul_rn(ds, (float)q), dm);
        }
    } else if (T == QT_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)r + col / QK_K;
        const int j0 = (int)(col % QK_K), half = j0 / 128, jj = j0 % 128, l0 = jj % 32, quarter = jj / 32;
        const uint8_t *ql = b->ql + 64 * half + (quarter & 1) * 32 + l0, *qh = b->qh + 32 * half + l0;
        const float ds = __fmul_rn(h2f(b->d), (float)b->scales[8 * half + l0 / 16 + 2 * quarter]);
        const int shift = 2 * quarter;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int lo = quarter < 2 ? (ql[j] & 0xF) : (ql[j] >> 4);
            const int q = (int)(lo | (((qh[j] >> shift) & 3) << 4)) - 32;
            w[j] = __fmul_rn(ds, (float)q);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __int_as_float(0x7fc00000);
    }
}

// runs the statement(s) with T_ the runtime type t as a constant; nothing for a type not read here
#define DQ_DISPATCH(t, ...)                          \
    switch (t) {                                      \
    case QT_F32: { constexpr int T_ = QT_F32; __VA_ARGS__; } break;   \
    case QT_F16: { constexpr int T_ = QT_F16; __VA_ARGS__; } break;   \
    case QT_BF16: { constexpr int T_ = QT_BF16; __VA_ARGS__; } break; \
    case QT_Q8_0: { constexpr int T_ = QT_Q8_0; __VA_ARGS__; } break; \
    case QT_Q4_K: { constexpr int T_ = QT_Q4_K; __VA_ARGS__; } break; \
    case QT_Q5_K: { constexpr int T_ = QT_Q5_K; __VA_ARGS__; } break; \
    case QT_Q6_K: { constexpr int T_ = QT_Q6_K; __VA_ARGS__; } break; \
    default: break;                                   \
    }

#endif
