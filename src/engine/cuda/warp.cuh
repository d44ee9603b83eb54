// warp.cuh: the device helpers every kernel shares: programmatic dependent launch's wait and
// go, reductions in one fixed tree (so every lane, every launch and every row get the same
// bits), the activations. Device code only: also compiled on the CPU under
// tests/unit/cuda_emu.h (which has its own no-op pdl_wait, pdl_go, pdl_enter).
#ifndef HEARTH_CUDA_WARP_CUH
#define HEARTH_CUDA_WARP_CUH

#include <math.h>

// a kernel's dynamic shared memory as floats (cuda_emu.h has its own)
#ifndef HK_DYN_SMEM
#define HK_DYN_SMEM(name) extern __shared__ __align__(16) float name[]
#endif

#ifndef HEARTH_CUDA_EMU_H
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
#endif

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
