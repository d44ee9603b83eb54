// common.cuh: what every kernel file of the CUDA engine shares: launches (programmatic
// dependent launch) and their error returns, the stream cast, and reductions in one fixed
// tree (so every lane, every launch and every row get the same bits).
#ifndef HEARTH_CUDA_COMMON_CUH
#define HEARTH_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "engine/cuda/kernels.h"
}

#define CUDA_TRY(call, e)                                                                       \
    do {                                                                                        \
        cudaError_t err_ = (call);                                                              \
        if (err_ != cudaSuccess) return herr_set(e, "%s: %s", #call, cudaGetErrorString(err_)); \
    } while (0)

#define STREAM(st) ((cudaStream_t)(st))

// Programmatic dependent launch (sm_90): a kernel queued on the engine's stream by
// launch_k may be started while the kernel before it finishes, so its launch and its first
// loads overlap that kernel's tail. Every such kernel calls pdl_wait in every block before
// it reads what an earlier kernel wrote, writes what an earlier kernel reads, or returns
// (so a kernel ends only after the one before it: the stream's order holds from any kernel
// to every later one), and pdl_go once it runs, which lets the next kernel's blocks be
// placed as this one's drain. Only what no kernel writes (the weights) is read before
// pdl_wait. hk_pdl(false) launches plainly (HEARTH_CUDA_PDL=0), the kernels unchanged.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_go() { asm volatile("griddepcontrol.launch_dependents;" :::); }
__device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_go();
}

extern bool hk_pdl_on;

template <typename... P, typename... A>
static cudaError_t launch_k(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, void *st, A &&...args) {
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = STREAM(st);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = hk_pdl_on ? 1 : 0;
    c.attrs = at;
    c.numAttrs = 1;
    return cudaLaunchKernelEx(&c, kernel, static_cast<A &&>(args)...);
}

// launch_k, returning -1 with e set (naming the calling function) when the launch failed
#define LAUNCH(e, kernel, grid, block, smem, st, ...)                                                   \
    do {                                                                                                \
        cudaError_t err_ = launch_k(kernel, grid, block, smem, st, __VA_ARGS__);                        \
        if (err_ != cudaSuccess) {                                                                      \
            cudaGetLastError();                                                                         \
            return herr_set(e, "%s: %s", __func__, cudaGetErrorString(err_));                           \
        }                                                                                               \
    } while (0)

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
