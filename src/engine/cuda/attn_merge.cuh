// attn_merge.cuh: the attention's last step, the segments of a row's head merged, with the
// rounding of its output for the out product (decode's fused form); device code only, also
// run on the CPU under tests/unit/cuda_emu.h (test_fused_emu).
#ifndef HEARTH_CUDA_ATTN_MERGE_CUH
#define HEARTH_CUDA_ATTN_MERGE_CUH

#include "engine/cuda/warp.cuh"
#include "engine/cuda/act.cuh"

#define PART(D) ((D) + 4) /* floats per (row, head, segment) partial: o, then max and sum; a multiple of 4 keeps o's float4s aligned */

// every thread of a block of D (whole 256-blocks): its value of row r's head h, rounded into
// a from the very floats written, as hk_quantize rounds them
__device__ __forceinline__ void merge_round(const hk_act &a, int64_t r, int64_t h, int64_t D, float val) {
    __shared__ float vs[1024];
    const int64_t d = threadIdx.x;
    vs[d] = val;
    __syncthreads();
    const int w = (int)(d / 32), lane = (int)(d & 31);
    if (w < D / 256) {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = vs[256 * w + 8 * lane + i];
        round_into(a, r, h * (D / 256) + w, v);
    }
}

// block per (row, head), D threads: the segments [0, pos / seg] merged in order, times
// sigmoid(gate); with a set (D whole blocks of 256: the head's own blocks of the row), the
// head's values also rounded into a, from the very floats written, as hk_quantize rounds them
__global__ void attn_merge_kernel(const float *qf, const int64_t *pos, int64_t H, int64_t D, int64_t seg, int64_t n_seg,
                                  const float *part, float *ao, hk_act a) {
    pdl_enter();
    const int64_t h = blockIdx.x, r = blockIdx.y, d = threadIdx.x;
    const int64_t ns = pos[r] / seg + 1;
    const float *pp = part + ((r * H + h) * n_seg) * PART(D);
    float mx = -INFINITY;
#pragma unroll 8
    for (int64_t s = 0; s < ns; s++) mx = fmaxf(mx, pp[s * PART(D) + D]);
    float L = 0, O = 0;
#pragma unroll 8
    for (int64_t s = 0; s < ns; s++) {
        const float f = expf(pp[s * PART(D) + D] - mx);
        L += pp[s * PART(D) + D + 1] * f;
        O += pp[s * PART(D) + d] * f;
    }
    const float gate = qf[r * 2 * H * D + h * 2 * D + D + d];
    const float val = O / L * sigm(gate);
    ao[r * H * D + h * D + d] = val;
    if (a.q) merge_round(a, r, h, D, val);
}

#endif
