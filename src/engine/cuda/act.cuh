// act.cuh: rounding activation rows to 8-bit blocks on the GPU, byte for byte as the CPU's
// quant_quantize_act does (Q8_K per 256 values, Q8_0 per 32), a warp per 256 values with lane
// l holding values 8l..8l+7. Included by every kernel file that writes an hk_act.
#ifndef HEARTH_CUDA_ACT_CUH
#define HEARTH_CUDA_ACT_CUH

#ifndef HEARTH_CUDA_EMU_H
#include <cuda_fp16.h>
#endif
#include "engine/cuda/warp.cuh"
extern "C" {
#include "engine/cuda/kernels.h"
}

// A warp rounds a block of 256 values, lane l holding v[0..8) = values 8l..8l+7, into Q8_K:
// the scale from the first value of the largest magnitude (quantize_q8_k's scan), q =
// round-to-even(iscale x) capped at 127, d = 1/iscale, s[j] = the sum of q over 32j..32j+31.
__device__ __forceinline__ void warp_q8k(const float v[8], int8_t *q, float *d, int32_t *s) {
    const int lane = threadIdx.x & 31;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = warp_max(amax);
    int first = 256;
#pragma unroll
    for (int i = 7; i >= 0; i--)
        if (fabsf(v[i]) == amax) first = 8 * lane + i;
    for (int off = 16; off; off >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, off));
    /* v[first & 7] by a tree of selects: an indexed read would put v in local memory */
    const int f = first & 7;
    const float m01 = f & 1 ? v[1] : v[0], m23 = f & 1 ? v[3] : v[2], m45 = f & 1 ? v[5] : v[4], m67 = f & 1 ? v[7] : v[6];
    const float m03 = f & 2 ? m23 : m01, m47 = f & 2 ? m67 : m45, mine = f & 4 ? m47 : m03;
    const float mx = __shfl_sync(0xffffffffu, mine, first >> 3);
    int qv[8];
    if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) qv[i] = 0;
        if (lane == 0) *d = 0.0f;
    } else {
        const float iscale = __fdiv_rn(-127.0f, mx);
#pragma unroll
        for (int i = 0; i < 8; i++) qv[i] = min(127, __float2int_rn(__fmul_rn(iscale, v[i])));
        if (lane == 0) *d = __fdiv_rn(1.0f, iscale);
    }
    uint32_t lo = 0, hi = 0;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) lo |= (uint32_t)(qv[i] & 0xff) << (8 * i), hi |= (uint32_t)(qv[4 + i] & 0xff) << (8 * i);
#pragma unroll
    for (int i = 0; i < 8; i++) sum += qv[i];
    *(uint2 *)(q + 8 * lane) = make_uint2(lo, hi);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if ((lane & 3) == 0) s[lane >> 2] = sum;
}

// The same warp layout into Q8_0 blocks of 32 (4 lanes each): d = f16(amax / 127), q =
// round-to-even(x * 127 / amax) within [-128, 127] (quantize_act_q8_0); d stored as the
// float of that f16.
__device__ __forceinline__ void warp_q80(const float v[8], int8_t *q, float *d) {
    const int lane = threadIdx.x & 31;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const __half dh = __float2half_rn(__fdiv_rn(amax, 127.0f));
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int x = max(-128, min(127, __float2int_rn(__fmul_rn(v[i], id))));
        if (i < 4) lo |= (uint32_t)(x & 0xff) << (8 * i);
        else hi |= (uint32_t)(x & 0xff) << (8 * (i - 4));
    }
    *(uint2 *)(q + 8 * lane) = make_uint2(lo, hi);
    if ((lane & 3) == 0) d[lane >> 2] = __half2float(dh);
}

// block 256 of row r (of K) of a: round v (the warp's 256 values) into it
__device__ __forceinline__ void round_into(const hk_act &a, int64_t r, int64_t blk, const float v[8]) {
    int8_t *q = a.q + r * a.K + blk * 256;
    if (a.q80) warp_q80(v, q, a.d + r * (a.K / 32) + blk * 8);
    else warp_q8k(v, q, a.d + r * (a.K / 256) + blk, a.s + r * (a.K / 32) + blk * 8);
}

// A warp's block blk (256 values) of y = x * sc * w (a row of E), lane l's x values 8l..8l+7
// of the block in x, rounded into a and a2 (row r) from the very floats it stored
__device__ __forceinline__ void norm_vals(const float x[8], const float *w, float *y, float sc, int64_t r, int64_t blk,
                                          const hk_act &a, const hk_act &a2) {
    const int64_t i0 = blk * 256 + 8 * (threadIdx.x & 31);
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = x[i] * sc * w[i0 + i];
    float4 *o = (float4 *)(y + i0);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
    if (a.q) round_into(a, r, blk, v);
    if (a2.q) round_into(a2, r, blk, v);
}

// norm_vals of x's block blk, read through L2 (__ldcg): a launch's last block normalises
// rows the launch's other blocks wrote (tail.cuh)
__device__ __forceinline__ void norm_blk(const float *xr, const float *w, float *y, float sc, int64_t r, int64_t blk,
                                         const hk_act &a, const hk_act &a2) {
    const int64_t i0 = blk * 256 + 8 * (threadIdx.x & 31);
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = __ldcg(xr + i0 + i);
    norm_vals(x, w, y, sc, r, blk, a, a2);
}

// y = x * sc * w over a row of E (any block of whole warps): where E is whole blocks of 256,
// warp w makes blocks w, w + nw, ... (norm_blk); else plain, a thread per element
__device__ __forceinline__ void norm_row(const float *xr, const float *w, float *y, int64_t E, float sc, int64_t r,
                                         const hk_act &a, const hk_act &a2) {
    if (E % 256) {
        for (int64_t i = threadIdx.x; i < E; i += blockDim.x) y[i] = __ldcg(xr + i) * sc * w[i];
        return;
    }
    for (int64_t blk = threadIdx.x / 32; blk < E / 256; blk += blockDim.x / 32) norm_blk(xr, w, y, sc, r, blk, a, a2);
}

#endif
