// tail.cuh: decode's fusions by the last block. A launch whose blocks each write a share of
// a row (a product's outputs) cannot normalise or route that row itself; its last block to
// finish can (a ticket, as argmax.cuh takes one): it sees every block's writes and does the
// work a separate kernel did after the launch, with that kernel's very arithmetic (the
// device functions below are the ones those kernels call), so a pass's bits do not depend
// on whether its launches were fused. Tickets are reset by the block that takes the last,
// so a launch finds the zeros the one before it left.
//
// Kinds (hk_tail, kernels.h): HK_TAIL_NORM (hk_rmsnorm of the rows just written),
// HK_TAIL_ROUTE (hk_moe_route of the logits just written), HK_TAIL_COMBINE (hk_moe_combine
// of the experts' outputs just written: a row range's last block combines that range, and
// the last of those makes the next layer's norm); and the delta rule's gated norm (hk_gtail:
// gated_tail, which the delta-rule kernels of gdn.cu and gdn_chunk.cuh call). tail_last, the
// ticket, also serves gdn_conv.cuh's conv in the delta rule (a key head's rings).
#ifndef HEARTH_CUDA_TAIL_CUH
#define HEARTH_CUDA_TAIL_CUH

#include "engine/cuda/warp.cuh"
#include "engine/cuda/act.cuh"

#define ROUTE_MAX_X 512 /* experts a warp routes: 16 per lane, in registers */

// the 8 floats at p (16-byte aligned) in two loads, through L2 like the scalar reads they stand for
__device__ __forceinline__ void load8(const float *p, float v[8]) {
    const float4 u = __ldcg((const float4 *)p), w = __ldcg((const float4 *)p + 1);
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w, v[4] = w.x, v[5] = w.y, v[6] = w.z, v[7] = w.w;
}

// The sum of squares of a row of E, the same bits in any warp of any launch: lane l adds
// x[i]^2 for i = l, l + 32, ... in order, then the warp's tree. Read through L2 (__ldcg): a
// tail reads rows other blocks of its launch wrote.
__device__ __forceinline__ float row_ss(const float *xr, int64_t E) {
    float s = 0.0f;
#pragma unroll 8
    for (int64_t i = threadIdx.x & 31; i < E; i += 32) {
        const float v = __ldcg(xr + i);
        s += v * v;
    }
    return warp_sum(s);
}

// row_ss of a row staged in shared memory (the same chain per lane, the same tree)
__device__ __forceinline__ float row_ss_sm(const float *sm, int64_t E) {
    float s = 0.0f;
#pragma unroll 8
    for (int64_t i = threadIdx.x & 31; i < E; i += 32) {
        const float v = sm[i];
        s += v * v;
    }
    return warp_sum(s);
}

// y = rmsnorm(x row) * w, rounded into a and a2 (row r): every warp of the block sums the row
// itself (row_ss), then norm_row spreads the elements over the block's warps
__device__ __forceinline__ void rms_row(const float *xr, const float *w, float *y, int64_t E, float eps, int64_t r,
                                        const hk_act &a, const hk_act &a2) {
    const float ss = row_ss(xr, E);
    norm_row(xr, w, y, E, 1.0f / sqrtf(ss / (float)E + eps), r, a, a2);
}

// rms_row for a block of E / 8 threads that holds the row in registers, thread t its values
// 8t..8t+7 in x (so warp w holds 256-block w, laid as norm_vals takes it): the row staged in
// sm (E floats) once, every warp's sum of squares from there (row_ss's chain and tree), then
// each thread's own values. The row is read from memory once instead of once a warp
// (rms_row's row_ss) and again for the products; the bits are rms_row's.
__device__ __forceinline__ void rms_regs(const float x[8], float *sm, const float *w, float *y, int64_t E, float eps,
                                         int64_t r, const hk_act &a, const hk_act &a2) {
    float4 *s4 = (float4 *)(sm + 8 * threadIdx.x);
    s4[0] = make_float4(x[0], x[1], x[2], x[3]);
    s4[1] = make_float4(x[4], x[5], x[6], x[7]);
    __syncthreads();
    const float ss = row_ss_sm(sm, E);
    norm_vals(x, w, y, 1.0f / sqrtf(ss / (float)E + eps), r, threadIdx.x / 32, a, a2);
}

// One warp routes one row (logits l): p = softmax(l) (max and sum by the warp's fixed tree),
// kept in registers (lane l: x = l + 32u), then K rounds of the largest p not taken (ties:
// the lower id), the weights renormalised in slot order.
__device__ __forceinline__ void route_row(const float *l, int X, int K, int32_t *sel, float *wsel) {
    const int lane = threadIdx.x & 31, per = (X + 31) / 32;
    float pv[ROUTE_MAX_X / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int u = 0; u < ROUTE_MAX_X / 32; u++) {
        const int x = lane + 32 * u;
        pv[u] = u < per && x < X ? __ldcg(l + x) : -INFINITY;
        mx = fmaxf(mx, pv[u]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < ROUTE_MAX_X / 32; u++) {
        const int x = lane + 32 * u;
        if (u < per && x < X) sum += expf(pv[u] - mx);
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int u = 0; u < ROUTE_MAX_X / 32; u++) {
        const int x = lane + 32 * u;
        pv[u] = u < per && x < X ? expf(pv[u] - mx) / sum : -1.0f; /* -1: not an expert */
    }
    float wsum = 0.0f, mine_w = 0.0f;
    int mine_x = 0;
    for (int k = 0; k < K; k++) {
        float bp = -1.0f;
        int bx = X;
#pragma unroll
        for (int u = 0; u < ROUTE_MAX_X / 32; u++)
            if (pv[u] > bp) bp = pv[u], bx = lane + 32 * u; /* ascending x: the first of equals stays */
        for (int off = 16; off; off >>= 1) {
            const float op = __shfl_xor_sync(0xffffffffu, bp, off);
            const int ox = __shfl_xor_sync(0xffffffffu, bx, off);
            if (op > bp || (op == bp && ox < bx)) bp = op, bx = ox;
        }
#pragma unroll
        for (int u = 0; u < ROUTE_MAX_X / 32; u++)
            if (lane + 32 * u == bx) pv[u] = -2.0f; /* taken */
        if (lane == k) mine_w = bp, mine_x = bx;
        wsum += bp;
    }
    if (lane < K) {
        sel[lane] = mine_x;
        wsel[lane] = mine_w / wsum;
    }
}

// element i of row r after the MoE block: x + ((sum_k wsel[r,k] eo[rK + k][i], slot order)
// + sg so[r][i]), sg = sigmoid of the shared expert's gate logit
__device__ __forceinline__ float combine_elem(const float *x, const float *eo, const float *so, const float *wsel, float sg,
                                              int64_t r, int64_t i, int64_t E, int K) {
    float o = 0;
    for (int k = 0; k < K; k++) o += __ldcg(wsel + r * K + k) * __ldcg(eo + (r * K + k) * E + i);
    return __ldcg(x + r * E + i) + (o + sg * __ldcg(so + r * E + i));
}

// Ticket `t` of cnt: true in the block that takes the last of `total` (every block's writes
// before its ticket are then visible to it); that block returns the ticket to zero. Every
// thread of the block calls it.
__device__ __forceinline__ bool tail_last(unsigned *cnt, unsigned total) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt, 1u) == total - 1;
        if (last) *cnt = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// The kinds' work, each its own function, not inlined, so that a product ending with one
// keeps its own registers (the route's 16 a lane would raise every product's count).
//
// The norm of the tail's rows, spread over the block's warps: warp w sums the squares of rows
// w, w + nw, ... (row_ss: any warp's bits), then the (row, 256-block) pieces go round the
// warps (norm_blk, as norm_row makes them); rows not of whole 256-blocks: rms_row a row at a time.
#define TAIL_ROWS 8 /* rows a tail takes (hk_tail_rows) */
static __device__ __noinline__ void tail_norm(const hk_tail &t) {
    if (t.E % 256 || t.n > TAIL_ROWS) {
        for (int64_t r = 0; r < t.n; r++) rms_row(t.x + r * t.E, t.nw, t.h + r * t.E, t.E, t.eps, r, t.a, t.a2);
        return;
    }
    __shared__ float sc[TAIL_ROWS];
    const int warp = threadIdx.x / 32, nw = blockDim.x / 32, lane = threadIdx.x & 31;
    for (int64_t r = warp; r < t.n; r += nw) {
        const float ss = row_ss(t.x + r * t.E, t.E);
        if (lane == 0) sc[r] = 1.0f / sqrtf(ss / (float)t.E + t.eps);
    }
    __syncthreads();
    const int64_t nb = t.E / 256;
    for (int64_t j = warp; j < t.n * nb; j += nw)
        norm_blk(t.x + (j / nb) * t.E, t.nw, t.h + (j / nb) * t.E, sc[j / nb], j / nb, j % nb, t.a, t.a2);
}
static __device__ __noinline__ void tail_route(const hk_tail &t, const float *y) {
    for (int64_t r = threadIdx.x / 32; r < t.n; r += blockDim.x / 32)
        route_row(y + r * t.ls, t.X, t.K, t.sel + r * t.K, t.wsel + r * t.K);
}
static __device__ __noinline__ void tail_combine(const hk_tail &t, const float *y, int64_t i0, int64_t i1) {
    for (int64_t j = threadIdx.x; j < t.n * (i1 - i0); j += blockDim.x) {
        const int64_t r = j / (i1 - i0), i = i0 + j % (i1 - i0);
        const float sg = sigm(__ldcg(t.gl + r * t.gls));
        t.x[r * t.E + i] = combine_elem(t.x, y, t.so, t.wsel, sg, r, i, t.E, t.K);
    }
}

// The tail of a launch of `blocks` blocks, of the kinds in KINDS (a mask of 1 << kind). y:
// the rows the launch wrote (the logits; the experts' outputs). For the combine, `range` is
// the block's slice of a row's outputs [i0, i1), `ranges` how many slices there are and
// `per` how many blocks write each slice (a slice's tickets: cnt[range]; the slices' ticket:
// cnt[ranges]).
template <unsigned KINDS>
__device__ __forceinline__ void tail_run(const hk_tail &t, const float *y, unsigned blocks, unsigned range, unsigned ranges,
                                         unsigned per, int64_t i0, int64_t i1) {
    if ((KINDS >> HK_TAIL_NORM & 1) && t.kind == HK_TAIL_NORM) {
        if (tail_last(t.cnt, blocks)) tail_norm(t);
    } else if ((KINDS >> HK_TAIL_ROUTE & 1) && t.kind == HK_TAIL_ROUTE) {
        if (tail_last(t.cnt, blocks)) tail_route(t, y);
    } else if ((KINDS >> HK_TAIL_COMBINE & 1) && t.kind == HK_TAIL_COMBINE) {
        if (!tail_last(t.cnt + range, per)) return;
        tail_combine(t, y, i0, i1);
        if (t.nw && tail_last(t.cnt + ranges, ranges)) tail_norm(t);
    }
}

// A warp's gated norm of block blk (256 values: value heads 2 blk, 2 blk + 1) of row r of o
// (rows of Vd): a head's sum of squares over its 16 lanes (a fixed xor tree), x = x * scale *
// nw * silu(z), written back and rounded into a (when set). o read through L2: the delta
// rule's last block reads what its other blocks wrote (hk_gtail: gated_tail below).
#define GN_DS 128
__device__ __forceinline__ void gated_blk(float *o, const float *z, const float *nw, int64_t r, int64_t blk, int64_t Vd,
                                          float eps, const hk_act &a) {
    const int lane = threadIdx.x & 31;
    const int64_t i0 = r * Vd + blk * 256 + 8 * lane;
    const int d0 = (8 * lane) % GN_DS;
    float v[8], zv[8], ss = 0;
    load8(o + i0, v); /* every load of the lane at once (float4): the values loaded one by one */
    load8(z + i0, zv);
#pragma unroll
    for (int i = 0; i < 8; i++) ss += v[i] * v[i];
    for (int off = 1; off < 16; off <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float sc = 1.0f / sqrtf(ss / (float)GN_DS + eps);
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = v[i] * sc * nw[d0 + i] * silu(zv[i]);
#pragma unroll
    for (int i = 0; i < 8; i++) o[i0 + i] = v[i];
    if (a.q) round_into(a, r, blk, v);
}

// the gated-norm tail of a decode pass's delta rule (hk_gtail: gated_tail below): block (h, piece) of a grid
// (Gv * 4, n_pieces); the last of the 8 blocks of heads 2j, 2j + 1 makes block j of the row
__device__ __forceinline__ void gated_tail(const hk_gtail &gt, float *o, int64_t r, int64_t h, int64_t Gv) {
    if (tail_last(gt.cnt + blockIdx.y * (Gv / 2) + h / 2, 8) && threadIdx.x < 32)
        gated_blk(o, gt.z, gt.nw, r, h / 2, Gv * GN_DS, gt.eps, gt.a);
}

// ---- the separate launches the tails stand for (prompt passes, and decode without the part):
// each calls the device function its tail calls (templates only so that every file that
// includes this header may hold them: one definition however many include it)

// grid (n, ceil(K/256 / 8)), 256 threads: warp w of block y rounds block 8y + w of row n
template <int = 0>
__global__ void quantize_kernel(const float *x, int64_t xs, hk_act a) {
    pdl_enter();
    const int64_t r = blockIdx.x, blk = (int64_t)blockIdx.y * 8 + threadIdx.x / 32;
    if (blk >= a.K / 256) return;
    const int lane = threadIdx.x & 31;
    const float4 *p = (const float4 *)(x + r * xs + blk * 256 + 8 * lane);
    const float4 u = p[0], w = p[1];
    const float v[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
    round_into(a, r, blk, v);
}

// block per row, NORM_THREADS threads: rms_row, whose sum of squares any warp of any launch
// makes alike (decode's fused launches make the same rows in their last block)
#define NORM_THREADS 256
template <int = 0>
__global__ void rmsnorm_kernel(const float *x, const int32_t *rows, const float *w, float *y, int64_t E, float eps,
                               hk_act a, hk_act a2) {
    pdl_enter();
    const int64_t r = blockIdx.x, src = rows ? rows[r] : r;
    rms_row(x + src * E, w, y + r * E, E, eps, r, a, a2);
}

// a warp per row: route_row
template <int = 0>
__global__ void route_kernel(const float *logits, int64_t ls, int64_t n, int X, int K, int32_t *sel, float *wsel) {
    pdl_enter();
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r < n) route_row(logits + r * ls, X, K, sel + r * K, wsel + r * K);
}

// block per row, 512 threads: x[r][i] = combine_elem; then, with nw, the next
// layer's RMSNorm of the new row (rms_row, as hk_rmsnorm makes it) into h, rounded into a and a2
template <int = 0>
__global__ void combine_kernel(float *x, const float *gl, int64_t gls, const float *eo, const float *so, const float *wsel,
                               int64_t E, int K, const float *nw, float *h, float eps, hk_act a, hk_act a2) {
    pdl_enter();
    const int64_t r = blockIdx.x;
    const float sg = sigm(gl[r * gls]);
    for (int64_t i = threadIdx.x; i < E; i += blockDim.x) {
        x[r * E + i] = combine_elem(x, eo, so, wsel, sg, r, i, E, K);
    }
    if (!nw) return;
    __threadfence(); /* the new row in L2, where rms_row reads it (__ldcg) */
    __syncthreads();
    rms_row(x + r * E, nw, h + r * E, E, eps, r, a, a2);
}

// The row forms (rows_form: E whole 256-blocks, at most 8192, the rows 16-byte aligned): a
// block of E / 8 threads per row, thread t its values 8t..8t+7, every load of the row issued
// at once (float4) and the norm by rms_regs; dynamic shared memory of E floats. The kernels
// above read a row once a warp in dependent steps (a latency per step, the row again per
// warp): at a prompt's 2,048 rows they were latency-bound (the norm ~50 us, the combine
// ~130 us a call on an H100). Each element's arithmetic is theirs, in their order.
#define ROWS_MAX_E 8192
#define ROWS_MAX_K 8 /* the combine's experts a row in registers */
static inline bool rows_form(int64_t E, const void *p, const void *q, const void *s, const void *t) {
    return E % 256 == 0 && E <= ROWS_MAX_E && ((uintptr_t)p | (uintptr_t)q | (uintptr_t)s | (uintptr_t)t) % 16 == 0;
}

// rmsnorm_kernel's row form
template <int = 0>
__global__ void rmsnorm_rows_kernel(const float *x, const int32_t *rows, const float *w, float *y, int64_t E, float eps,
                                    hk_act a, hk_act a2) {
    HK_DYN_SMEM(sm);
    pdl_enter();
    const int64_t r = blockIdx.x, src = rows ? rows[r] : r;
    float v[8];
    load8(x + src * E + 8 * threadIdx.x, v);
    rms_regs(v, sm, w, y + r * E, E, eps, r, a, a2);
}

// combine_kernel's row form (K <= ROWS_MAX_K): a thread's 8 elements, combine_elem's sum per
// element (slot order, the same expression) from the K experts' values loaded at once
template <int = 0>
__global__ void combine_rows_kernel(float *x, const float *gl, int64_t gls, const float *eo, const float *so,
                                    const float *wsel, int64_t E, int K, const float *nw, float *h, float eps, hk_act a,
                                    hk_act a2) {
    HK_DYN_SMEM(sm);
    pdl_enter();
    const int64_t r = blockIdx.x, i0 = 8 * threadIdx.x;
    float ev[ROWS_MAX_K][8], wk[ROWS_MAX_K], xv[8], sv[8], v[8];
#pragma unroll
    for (int k = 0; k < ROWS_MAX_K; k++)
        if (k < K) load8(eo + (r * K + k) * E + i0, ev[k]), wk[k] = __ldcg(wsel + r * K + k);
    load8(x + r * E + i0, xv);
    load8(so + r * E + i0, sv);
    const float sg = sigm(gl[r * gls]);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float o = 0;
#pragma unroll
        for (int k = 0; k < ROWS_MAX_K; k++)
            if (k < K) o += wk[k] * ev[k][j];
        v[j] = xv[j] + (o + sg * sv[j]);
    }
    float4 *xo = (float4 *)(x + r * E + i0);
    xo[0] = make_float4(v[0], v[1], v[2], v[3]);
    xo[1] = make_float4(v[4], v[5], v[6], v[7]);
    if (nw) rms_regs(v, sm, nw, h + r * E, E, eps, r, a, a2);
}

// block per row, a warp per 256 values (two heads of 128: gated_blk), or fewer warps taking
// blocks w, w + warps, ... (hk_gdn_gated_norm gives a row of up to 32 blocks its warps: one
// block a warp, so no warp waits on its first block's loads before it issues the next's)
template <int = 0>
__global__ void gated_norm_kernel(float *o, const float *z, const float *nw, int64_t Vd, float eps, hk_act a) {
    pdl_enter();
    for (int64_t blk = threadIdx.x / 32; blk < Vd / 256; blk += blockDim.x / 32) gated_blk(o, z, nw, blockIdx.x, blk, Vd, eps, a);
}

#endif
