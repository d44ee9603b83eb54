// argmax.cuh: the greedy token's kernel, device code only (argmax.cu holds the host wrapper;
// tests/unit/test_argmax_emu.cc runs the same kernel and scratch layout on the CPU under
// tests/unit/cuda_emu.h). The choice is sampler_argmax's: the lowest id among equal maxima,
// NaN never chosen, and id 0 when the row starts with NaN (its scan keeps id 0 then, since
// nothing compares greater than NaN). That choice is a function of the row alone, so the
// order in which blocks and lanes meet changes nothing.
#ifndef HEARTH_CUDA_ARGMAX_CUH
#define HEARTH_CUDA_ARGMAX_CUH

#define AM_BLOCKS 32  /* blocks a row: each scans V / 32 values */
#define AM_THREADS 256

// (v, i) is better than (bv, bi): larger, or equal with a lower id; NaN never is
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void am_warp(float &bv, int &bi) {
    for (int off = 16; off; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (am_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
}

// the block's best of (bv, bi) over its threads, in thread 0
__device__ __forceinline__ void am_block(float &bv, int &bi) {
    __shared__ float sv[AM_THREADS / 32];
    __shared__ int si[AM_THREADS / 32];
    am_warp(bv, bi);
    const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (lane == 0) sv[w] = bv, si[w] = bi;
    __syncthreads();
    if (w == 0) {
        bv = lane < AM_THREADS / 32 ? sv[lane] : -INFINITY;
        bi = lane < AM_THREADS / 32 ? si[lane] : INT32_MAX;
        am_warp(bv, bi);
    }
}

// grid (AM_BLOCKS, rows): block b of row r scans its slice of logits row r0 + r, leaves its
// best in part; the row's last block to finish (a ticket, reset for the next launch) takes
// the best of the AM_BLOCKS parts into tok[r]
__global__ void __launch_bounds__(AM_THREADS) argmax_kernel(const float *logits, int64_t V, float *part_v, int *part_i,
                                                            unsigned *ticket, int32_t *tok) {
    pdl_enter();
    const int64_t r = blockIdx.y;
    const float *row = logits + r * V;
    const int64_t per = (V + AM_BLOCKS - 1) / AM_BLOCKS, a = blockIdx.x * per, b = a + per < V ? a + per : V;
    float bv = -INFINITY;
    int bi = INT32_MAX;
    for (int64_t i = a + threadIdx.x; i < b; i += AM_THREADS) {
        const float v = row[i];
        if (am_better(v, (int)i, bv, bi)) bv = v, bi = (int)i;
    }
    am_block(bv, bi);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        part_v[r * AM_BLOCKS + blockIdx.x] = bv;
        part_i[r * AM_BLOCKS + blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(&ticket[r], 1u) == AM_BLOCKS - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    const int lane = threadIdx.x;
    bv = -INFINITY, bi = INT32_MAX;
    if (lane < AM_BLOCKS) bv = ((volatile float *)part_v)[r * AM_BLOCKS + lane], bi = ((volatile int *)part_i)[r * AM_BLOCKS + lane];
    am_warp(bv, bi);
    if (lane == 0) {
        tok[r] = row[0] != row[0] || bi == INT32_MAX ? 0 : bi; /* NaN first, or nothing but NaN: id 0 */
        ticket[r] = 0;
    }
}

// the scratch of a launch over `rows` rows: the tickets first, so that row r's stays at the
// same place whatever the number of rows and a launch finds the zeros the last one left
// (laid after the partial sums, they moved with the row count: a launch of fewer rows then
// read partial sums as tickets and wrote no token), then the partial values and ids
__host__ __device__ inline size_t am_scratch_bytes(int64_t rows) {
    return (size_t)rows * AM_BLOCKS * (sizeof(float) + sizeof(int) + sizeof(unsigned));
}
__host__ __device__ inline void am_layout(void *scratch, int64_t rows, unsigned **ticket, float **pv, int **pi) {
    *ticket = (unsigned *)scratch;
    *pv = (float *)(*ticket + rows * AM_BLOCKS);
    *pi = (int *)(*pv + rows * AM_BLOCKS);
}

#endif
