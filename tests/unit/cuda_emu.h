/* cuda_emu.h: a CPU emulation of the CUDA execution model, enough to run the GDN chunk
 * kernels (src/engine/cuda/gdn_chunk.cuh) in a unit test on a machine without a GPU (C++).
 * Each thread of a block is a fiber (ucontext), so __syncthreads() is a real barrier: a
 * round runs every live thread up to its next barrier (or its end) before any goes past it.
 * Blocks run one after another. Static __shared__ variables are function statics (one copy,
 * shared by the block's threads; blocks do not overlap); dynamic shared memory (HK_DYN_SMEM)
 * is one buffer per block, filled with NaN so a read before a write shows. The __fmaf_rn
 * family is fmaf and plain float operations: compile with -ffp-contract=off so no product
 * and sum are fused behind the test's back, and -fno-strict-aliasing (float4 loads of float
 * arrays). Not emulated: warps (no shuffles, votes or
 * warp-synchronous code), atomics, streams, PDL (pdl_enter is a no-op). */
#ifndef HEARTH_CUDA_EMU_H
#define HEARTH_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct emu_uint3 {
    unsigned x, y, z;
};

namespace emu {
inline emu_uint3 block_idx;
inline dim3 grid_dim, block_dim;
inline std::vector<emu_uint3> thread_idx;
inline int cur;                    /* the running thread */
inline std::vector<float> dyn;     /* dynamic shared memory of the running block */
inline ucontext_t sched;           /* the block's scheduler */
struct fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done;
};
inline std::vector<fiber> fibers;
inline std::function<void()> body;
inline int64_t n_barriers;         /* barriers passed, summed over blocks (a test may report it) */

inline void trampoline() {
    body();
    fibers[cur].done = true; /* uc_link returns to the scheduler */
}

inline void sync_threads() {
    if (swapcontext(&fibers[cur].ctx, &sched) != 0) abort();
}

/* runs one block of the current launch: every thread a fiber of f */
inline void run_block(unsigned nthreads) {
    const size_t stack_bytes = 64 * 1024;
    fibers.resize(nthreads);
    thread_idx.resize(nthreads);
    for (unsigned t = 0; t < nthreads; t++) {
        fiber &fb = fibers[t];
        fb.stack.resize(stack_bytes);
        fb.done = false;
        thread_idx[t] = {t % block_dim.x, (t / block_dim.x) % block_dim.y, t / (block_dim.x * block_dim.y)};
        if (getcontext(&fb.ctx) != 0) abort();
        fb.ctx.uc_stack.ss_sp = fb.stack.data();
        fb.ctx.uc_stack.ss_size = stack_bytes;
        fb.ctx.uc_link = &sched;
        makecontext(&fb.ctx, trampoline, 0);
    }
    for (;;) {
        bool live = false;
        for (unsigned t = 0; t < nthreads; t++) {
            if (fibers[t].done) continue;
            cur = (int)t;
            if (swapcontext(&sched, &fibers[t].ctx) != 0) abort();
            live = true;
        }
        if (!live) break;
        n_barriers++;
    }
}

/* kernel<<<grid, block, smem>>>(args...), blocks in order x fastest */
template <typename... P, typename... A>
inline void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, A... args) {
    grid_dim = grid;
    block_dim = block;
    body = [&]() { kernel(args...); };
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                block_idx = {x, y, z};
                dyn.assign(smem_bytes / sizeof(float) + 1, NAN);
                run_block(block.x * block.y * block.z);
            }
}
} // namespace emu

#define blockIdx (emu::block_idx)
#define threadIdx (emu::thread_idx[emu::cur])
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define HK_DYN_SMEM(name) float *name = emu::dyn.data()

inline void __syncthreads() { emu::sync_threads(); }
inline void pdl_enter() {}
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, sizeof i);
    return i;
}

#endif
