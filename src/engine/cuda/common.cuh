// common.cuh: what every kernel file of the CUDA engine shares: error returns after a
// launch, the stream cast, and reductions in one fixed tree (so every lane, every launch
// and every row get the same bits).
#ifndef HEARTH_CUDA_COMMON_CUH
#define HEARTH_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "engine/cuda/kernels.h"
}

#define LAUNCHED(e)                                                                                \
    do {                                                                                           \
        cudaError_t err_ = cudaGetLastError();                                                     \
        if (err_ != cudaSuccess) return herr_set(e, "%s: %s", __func__, cudaGetErrorString(err_)); \
    } while (0)

#define CUDA_TRY(call, e)                                                                       \
    do {                                                                                        \
        cudaError_t err_ = (call);                                                              \
        if (err_ != cudaSuccess) return herr_set(e, "%s: %s", #call, cudaGetErrorString(err_)); \
    } while (0)

#define STREAM(st) ((cudaStream_t)(st))

static inline unsigned blocks_of(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

// the sum of v over the warp, the same tree (and bits) in every lane: a + b == b + a in
// IEEE arithmetic, so both lanes of each xor pair hold the same value at every level
__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// the block's sum (blockDim.x a multiple of 32, at most 1024), in every thread: each warp's
// by warp_sum, then the warps' in one more
__device__ __forceinline__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    const float t = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(t);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

#endif
