// moe.cu: the CUDA engine's expert routing (a warp per row: softmax, top K), the pairs
// grouped by expert into tensor-core tiles (one block, no host sync, so a pass can be
// captured in a graph), SwiGLU fused with the rounding for the down product, and the
// combine of the experts' outputs with the residual, in slot order.
#include <cuda_fp16.h>

#include "engine/cuda/common.cuh"
#include "engine/cuda/act.cuh"
#include "engine/cuda/tail.cuh"

extern "C" int hk_moe_route(void *st, const float *logits, int64_t ls, int64_t n, int X, int K, int32_t *sel, float *wsel,
                            herr *e) {
    if (n == 0) return 0;
    if (X > ROUTE_MAX_X || K > 32 || K > X) return herr_set(e, "hk_moe_route: %d of %d experts", K, X);
    LAUNCH(e, route_kernel<>, blocks_of(n, 4), 128, 0, st, logits, ls, n, X, K, sel, wsel);
    return 0;
}

// One block of 1024 threads: counts per expert, their exclusive scan (offs), each expert's
// tiles of `tile` pairs (tiles[0] = how many, then (expert, first index) each), and the
// list of pairs grouped by expert (atomics order a group's pairs: no result depends on it).
#define SORT_THREADS 1024
__global__ void __launch_bounds__(SORT_THREADS) sort_kernel(const int32_t *sel, int64_t n_pairs, int X, int tile,
                                                            int32_t *offs, int32_t *list, int32_t *tiles) {
    pdl_enter();
    __shared__ int cnt[ROUTE_MAX_X], at[ROUTE_MAX_X], tl[ROUTE_MAX_X];
    const int tid = threadIdx.x;
    for (int x = tid; x < X; x += SORT_THREADS) cnt[x] = 0;
    __syncthreads();
    for (int64_t i = tid; i < n_pairs; i += SORT_THREADS) atomicAdd(&cnt[sel[i]], 1);
    __syncthreads();
    if (tid == 0) { /* X <= 1024 steps: a few microseconds, once per MoE layer of a prompt pass */
        int a = 0, tt = 0;
        for (int x = 0; x < X; x++) {
            at[x] = a;
            tl[x] = tt;
            offs[x] = a;
            a += cnt[x];
            tt += (cnt[x] + tile - 1) / tile;
        }
        offs[X] = a;
        tiles[0] = tt;
    }
    __syncthreads();
    for (int x = tid; x < X; x += SORT_THREADS)
        for (int k = 0; k * tile < cnt[x]; k++) {
            tiles[1 + 2 * (tl[x] + k)] = x;
            tiles[2 + 2 * (tl[x] + k)] = at[x] + k * tile;
        }
    __syncthreads();
    for (int64_t i = tid; i < n_pairs; i += SORT_THREADS) list[atomicAdd(&at[sel[i]], 1)] = (int32_t)i;
}

extern "C" int hk_moe_sort(void *st, const int32_t *sel, int64_t n_pairs, int X, int tile, int32_t *offs, int32_t *list,
                           int32_t *tiles, herr *e) {
    if (X > ROUTE_MAX_X) return herr_set(e, "hk_moe_sort: %d experts", X);
    if (tile != 16 && tile != 32) return herr_set(e, "hk_moe_sort: tiles of %d pairs (16 or 32)", tile);
    LAUNCH(e, sort_kernel, 1, SORT_THREADS, 0, st, sel, n_pairs, X, tile, offs, list, tiles);
    return 0;
}

// grid (n_pairs, blocks of 256 / 8): warp w takes 256-block 8y + w of a pair's row: g =
// silu(g) * u written back, and rounded into a (when set)
__global__ void swiglu_kernel(float *g, const float *u, int64_t F, hk_act a) {
    pdl_enter();
    const int64_t r = blockIdx.x, blk = (int64_t)blockIdx.y * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (F % 256) { /* no rounding (checked by the launcher): plain elementwise */
        for (int64_t i = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; i < F; i += (int64_t)gridDim.y * blockDim.x)
            g[r * F + i] = silu(g[r * F + i]) * u[r * F + i];
        return;
    }
    if (blk >= F / 256) return;
    const int64_t i0 = r * F + blk * 256 + 8 * lane;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = silu(g[i0 + i]) * u[i0 + i];
#pragma unroll
    for (int i = 0; i < 8; i++) g[i0 + i] = v[i];
    if (a.q) round_into(a, r, blk, v);
}

extern "C" int hk_swiglu_quant(void *st, const float *g, const float *u, int64_t n_pairs, int64_t F, hk_act *a, herr *e) {
    if (n_pairs == 0) return 0;
    if (a && F % 256) return herr_set(e, "hk_swiglu_quant: rows of %lld cannot be rounded in blocks of 256", (long long)F);
    hk_act none = {0};
    dim3 gr((unsigned)n_pairs, F % 256 ? 1u : blocks_of(F / 256, 8));
    LAUNCH(e, swiglu_kernel, gr, 256, 0, st, (float *)g, u, F, a ? *a : none);
    return 0;
}

extern "C" int hk_moe_combine(void *st, float *x, const float *gl, int64_t gls, const float *eo, const float *so,
                              const float *wsel, int64_t n, int64_t E, int K, const float *nw, float *h, float eps,
                              hk_act *a, hk_act *a2, herr *e) {
    if (n == 0) return 0;
    hk_act none = {0};
    if (nw && (a || a2) && E % 256) return herr_set(e, "hk_moe_combine: rows of %lld cannot be rounded in blocks of 256", (long long)E);
    if (K <= ROWS_MAX_K && rows_form(E, x, eo, so, h))
        LAUNCH(e, combine_rows_kernel<>, (unsigned)n, (unsigned)(E / 8), sizeof(float) * (size_t)E, st, x, gl, gls, eo, so,
               wsel, E, K, nw, h, eps, a ? *a : none, a2 ? *a2 : none);
    else
        LAUNCH(e, combine_kernel<>, (unsigned)n, 512, 0, st, x, gl, gls, eo, so, wsel, E, K, nw, h, eps, a ? *a : none,
               a2 ? *a2 : none);
    return 0;
}
