// kernels.cu: the CUDA engine's kernels (kernels.h). This first form is plain: f32
// activations, weights dequantized in the inner loop (dq.cuh), a warp per output with the
// rows of a launch taken MM_TILE at a time so a weight row is read once per tile, the delta
// rule row by row with a lane column per thread, attention with the scores in scratch.
// Every reduction is one fixed tree per row, so a row's bits do not depend on its
// neighbours in the launch (kernels.h).
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>

extern "C" {
#include "engine/cuda/kernels.h"
}
#include "engine/cuda/dq.cuh"

#define LAUNCHED(e)                                                                              \
    do {                                                                                         \
        cudaError_t err_ = cudaGetLastError();                                                   \
        if (err_ != cudaSuccess) return herr_set(e, "%s: %s", __func__, cudaGetErrorString(err_)); \
    } while (0)

#define CUDA_TRY(call, e)                                                                         \
    do {                                                                                          \
        cudaError_t err_ = (call);                                                                \
        if (err_ != cudaSuccess) return herr_set(e, "%s: %s", #call, cudaGetErrorString(err_)); \
    } while (0)

static unsigned blocks_of(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

extern "C" int hk_malloc(void **p, size_t bytes, herr *e) {
    *p = NULL;
    if (bytes == 0) return 0;
    cudaError_t err = cudaMalloc(p, bytes);
    if (err != cudaSuccess) {
        *p = NULL;
        cudaGetLastError(); /* an out-of-memory is not sticky: clear it */
        return herr_set(e, "cannot allocate %.1f MiB on the GPU: %s", (double)bytes / (1 << 20), cudaGetErrorString(err));
    }
    return 0;
}
extern "C" void hk_free(void *p) {
    if (p) cudaFree(p);
}
extern "C" int hk_h2d(void *d, const void *h, size_t n, herr *e) {
    if (n) CUDA_TRY(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), e);
    return 0;
}
extern "C" int hk_d2h(void *h, const void *d, size_t n, herr *e) {
    if (n) CUDA_TRY(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), e);
    return 0;
}
extern "C" int hk_memset(void *d, int v, size_t n, herr *e) {
    if (n) CUDA_TRY(cudaMemset(d, v, n), e);
    return 0;
}
extern "C" int hk_sync(herr *e) {
    CUDA_TRY(cudaDeviceSynchronize(), e);
    return 0;
}
extern "C" int hk_mem_info(size_t *free_b, size_t *total_b, herr *e) {
    CUDA_TRY(cudaMemGetInfo(free_b, total_b), e);
    return 0;
}
extern "C" bool hk_type_ok(uint32_t t) {
    bool ok = false;
    DQ_DISPATCH(t, ok = T_ >= 0);
    return ok;
}

// ------------------------------------------------------------------ reductions

// the sum of v over the warp, the same tree (and bits) in every lane
__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// the block's sum (blockDim.x a multiple of 32, at most 1024), in every thread
__device__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(t);
}
__device__ float block_max(float v, float *sh) {
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(t);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

// ------------------------------------------------------------------ embedding, norms, adds

template <int T> __global__ void embed_kernel(const uint8_t *w, size_t row_bytes, const int32_t *ids, int64_t E, float *x) {
    const int64_t r = blockIdx.y;
    const uint8_t *row = w + (size_t)ids[r] * row_bytes;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < E; i += (int64_t)gridDim.x * blockDim.x)
        x[r * E + i] = dq<T>(row, i);
}

extern "C" int hk_embed(const hk_w *te, const int32_t *ids, int64_t n, float *x, herr *e) {
    if (n == 0) return 0;
    dim3 g(blocks_of(te->K, 256), (unsigned)n);
    DQ_DISPATCH(te->type, (embed_kernel<T_><<<g, 256>>>((const uint8_t *)te->d, te->row_bytes, ids, te->K, x)));
    LAUNCHED(e);
    return 0;
}

#define NORM_THREADS 256
__global__ void rmsnorm_kernel(const float *x, const int32_t *rows, const float *w, float *y, int64_t E, float eps) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x, src = rows ? rows[r] : r;
    const float *xr = x + src * E;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < E; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    const float sc = 1.0f / sqrtf(ss / (float)E + eps);
    for (int64_t i = threadIdx.x; i < E; i += blockDim.x) y[r * E + i] = xr[i] * sc * w[i];
}

extern "C" int hk_rmsnorm(const float *x, const int32_t *rows, const float *w, float *y, int64_t n, int64_t E, float eps,
                          herr *e) {
    if (n == 0) return 0;
    rmsnorm_kernel<<<(unsigned)n, NORM_THREADS>>>(x, rows, w, y, E, eps);
    LAUNCHED(e);
    return 0;
}

__global__ void add_kernel(float *x, const float *y, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" int hk_add(float *x, const float *y, int64_t n, herr *e) {
    if (n == 0) return 0;
    add_kernel<<<blocks_of(n, 256), 256>>>(x, y, n);
    LAUNCHED(e);
    return 0;
}

__global__ void swiglu_kernel(float *g, const float *u, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu(g[i]) * u[i];
}

extern "C" int hk_swiglu(float *g, const float *u, int64_t n, herr *e) {
    if (n == 0) return 0;
    swiglu_kernel<<<blocks_of(n, 256), 256>>>(g, u, n);
    LAUNCHED(e);
    return 0;
}

// ------------------------------------------------------------------ matmul

#define MM_TILE 8   /* rows per weight-row read */
#define MM_WARPS 4  /* outputs per block */

// NT rows (of the pairs or rows at p[]) against weight row wr: lane l takes the groups of
// eight weights c = l, l+32, ... (dq8), each row's sum in that order, then the warp tree.
// A row's bits are the same whatever NT and whichever rows share the tile.
template <int T, int NT>
__device__ __forceinline__ void mm_rows(const uint8_t *wr, int64_t K, const float *const *xr, float *acc) {
    const int lane = threadIdx.x;
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i] = 0.0f;
    for (int64_t c = lane; c < K / 8; c += 32) {
        float w[8];
        dq8<T>(wr, c, w);
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const float4 a = ((const float4 *)xr[i])[2 * c], b = ((const float4 *)xr[i])[2 * c + 1];
            float s = acc[i];
            s = fmaf(w[0], a.x, s), s = fmaf(w[1], a.y, s), s = fmaf(w[2], a.z, s), s = fmaf(w[3], a.w, s);
            s = fmaf(w[4], b.x, s), s = fmaf(w[5], b.y, s), s = fmaf(w[6], b.z, s), s = fmaf(w[7], b.w, s);
            acc[i] = s;
        }
    }
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i] = warp_sum(acc[i]);
}

// One warp per output o; rows 0..n (or, with offs, expert blockIdx.y's pairs) up to MM_TILE
// at a time: a weight row is read once per tile. K is a multiple of 8 (hk_matmul checks).
template <int T>
__global__ void matmul_kernel(const uint8_t *w, size_t row_bytes, size_t slice_bytes, int64_t K, int64_t M, const float *x,
                              int64_t xs, float *y, int64_t ys, int64_t n, const int32_t *offs, const int32_t *list,
                              int in_div, int X) {
    const int64_t o = (int64_t)blockIdx.x * MM_WARPS + threadIdx.y;
    if (o >= M) return;
    int64_t p0 = 0, p1 = n;
    const uint8_t *W = w;
    if (offs) { /* blockIdx.y: the how-many-th expert that has pairs */
        if ((int)blockIdx.y >= offs[X + 1]) return;
        const int ex = offs[X + 2 + blockIdx.y];
        p0 = offs[ex];
        p1 = offs[ex + 1];
        W = w + (size_t)ex * slice_bytes;
    }
    const uint8_t *wr = W + (size_t)o * row_bytes;
    for (int64_t pb = p0; pb < p1; pb += MM_TILE) {
        const int nt = p1 - pb < MM_TILE ? (int)(p1 - pb) : MM_TILE;
        const float *xr[MM_TILE];
        int64_t yr[MM_TILE];
#pragma unroll
        for (int i = 0; i < MM_TILE; i++) {
            const int64_t p = pb + (i < nt ? i : 0);
            xr[i] = x + (list ? list[p] / in_div : p) * xs;
            yr[i] = list ? list[p] : p;
        }
        float acc[MM_TILE];
        if (nt == 1) mm_rows<T, 1>(wr, K, xr, acc);
        else if (nt <= 4) mm_rows<T, 4>(wr, K, xr, acc);
        else mm_rows<T, MM_TILE>(wr, K, xr, acc);
        if (threadIdx.x == 0)
            for (int i = 0; i < nt; i++) y[yr[i] * ys + o] = acc[i];
    }
}

extern "C" int hk_matmul(const hk_w *w, const float *x, int64_t xs, int64_t n, float *y, int64_t ys, herr *e) {
    if (n == 0) return 0;
    if (w->K % 8 || xs % 4) return herr_set(e, "hk_matmul: rows of %lld weights (stride %lld) are no groups of 8", (long long)w->K, (long long)xs);
    dim3 b(32, MM_WARPS), g(blocks_of(w->M, MM_WARPS));
    DQ_DISPATCH(w->type, (matmul_kernel<T_><<<g, b>>>((const uint8_t *)w->d, w->row_bytes, 0, w->K, w->M, x, xs, y, ys, n,
                                                      NULL, NULL, 1, 0)));
    LAUNCHED(e);
    return 0;
}

extern "C" int hk_moe_matmul(const hk_w *w, int X, int64_t n_pairs, const int32_t *offs, const int32_t *list, int in_div,
                             const float *x, int64_t xs, float *y, int64_t ys, herr *e) {
    if (n_pairs == 0) return 0;
    if (w->K % 8 || xs % 4) return herr_set(e, "hk_moe_matmul: rows of %lld weights (stride %lld) are no groups of 8", (long long)w->K, (long long)xs);
    /* one block row per expert that can have pairs */
    dim3 b(32, MM_WARPS), g(blocks_of(w->M, MM_WARPS), (unsigned)(n_pairs < X ? n_pairs : X));
    DQ_DISPATCH(w->type, (matmul_kernel<T_><<<g, b>>>((const uint8_t *)w->d, w->row_bytes, w->slice_bytes, w->K, w->M, x,
                                                      xs, y, ys, 0, offs, list, in_div, X)));
    LAUNCHED(e);
    return 0;
}

// ------------------------------------------------------------------ MoE routing

// one thread per row: softmax, then K rounds of the best not yet taken (ties: the lower id)
__global__ void route_kernel(const float *logits, int64_t n, int X, int K, int32_t *sel, float *wsel) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    const float *l = logits + r * X;
    float mx = -INFINITY, sum = 0;
    for (int x = 0; x < X; x++) mx = l[x] > mx ? l[x] : mx;
    for (int x = 0; x < X; x++) sum += expf(l[x] - mx);
    int32_t *s = sel + r * K;
    float *w = wsel + r * K, wsum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        float bp = 0;
        for (int x = 0; x < X; x++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= s[j] == x;
            const float p = expf(l[x] - mx) / sum;
            if (!taken && (best < 0 || p > bp)) best = x, bp = p;
        }
        s[k] = best;
        w[k] = bp;
        wsum += bp;
    }
    for (int k = 0; k < K; k++) w[k] /= wsum;
}

extern "C" int hk_moe_route(const float *logits, int64_t n, int X, int K, int32_t *sel, float *wsel, herr *e) {
    if (n == 0) return 0;
    route_kernel<<<blocks_of(n, 64), 64>>>(logits, n, X, K, sel, wsel);
    LAUNCHED(e);
    return 0;
}

__global__ void count_kernel(const int32_t *sel, int64_t n, int32_t *counts) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&counts[sel[i]], 1);
}

// one thread: offsets from counts, counts turned into each expert's fill cursor, and the
// experts that have pairs, ascending, after the offsets (offs[X + 1] of them from offs[X + 2])
__global__ void scan_kernel(int32_t *counts, int X, int32_t *offs) {
    int32_t at = 0, na = 0;
    for (int x = 0; x < X; x++) {
        offs[x] = at;
        if (counts[x]) offs[X + 2 + na++] = x;
        at += counts[x];
        counts[x] = offs[x];
    }
    offs[X] = at;
    offs[X + 1] = na;
}

__global__ void fill_kernel(const int32_t *sel, int64_t n, int32_t *cursor, int32_t *list) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) list[atomicAdd(&cursor[sel[i]], 1)] = (int32_t)i;
}

extern "C" int hk_moe_sort(const int32_t *sel, int64_t n_pairs, int X, int32_t *counts, int32_t *offs, int32_t *list,
                           herr *e) {
    CUDA_TRY(cudaMemsetAsync(counts, 0, sizeof(int32_t) * (size_t)(X + 1)), e);
    if (n_pairs) count_kernel<<<blocks_of(n_pairs, 256), 256>>>(sel, n_pairs, counts);
    scan_kernel<<<1, 1>>>(counts, X, offs);
    if (n_pairs) fill_kernel<<<blocks_of(n_pairs, 256), 256>>>(sel, n_pairs, counts, list);
    LAUNCHED(e);
    return 0;
}

__global__ void combine_kernel(const float *h2, const float *gs, const float *eo, const float *so, const float *wsel,
                               float *out, int64_t E, int K) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x;
    float d = 0;
    for (int64_t i = threadIdx.x; i < E; i += blockDim.x) d += h2[r * E + i] * gs[i];
    const float sg = sigm(block_sum(d, sh));
    for (int64_t i = threadIdx.x; i < E; i += blockDim.x) {
        float o = 0;
        for (int k = 0; k < K; k++) o += wsel[r * K + k] * eo[(r * K + k) * E + i];
        out[r * E + i] = o + sg * so[r * E + i];
    }
}

extern "C" int hk_moe_combine(const float *h2, const float *gs, const float *eo, const float *so, const float *wsel,
                              float *out, int64_t n, int64_t E, int K, herr *e) {
    if (n == 0) return 0;
    combine_kernel<<<(unsigned)n, NORM_THREADS>>>(h2, gs, eo, so, wsel, out, E, K);
    LAUNCHED(e);
    return 0;
}

// ------------------------------------------------------------------ GDN

// row j (0..dc-1) of the concatenation [ring; piece rows] ending at pass row r, channel ch
__device__ __forceinline__ float conv_x(const float *qkv, const float *ring, const hk_piece *pc, int64_t r, int64_t j,
                                        int64_t cd, int64_t dc, int64_t ch) {
    const int64_t idx = r - pc->r0 - (dc - 1) + j;
    return idx >= 0 ? qkv[(pc->r0 + idx) * cd + ch] : ring[(idx + dc - 1) * cd + ch];
}

__global__ void conv_kernel(const float *qkv, const float *ring0, size_t seq_stride, const float *w, const int32_t *row_piece,
                            const hk_piece *pieces, int64_t cd, int64_t dc, float *cv) {
    const int64_t r = blockIdx.y, ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= cd) return;
    const hk_piece *pc = &pieces[row_piece[r]];
    const float *ring = ring0 + (size_t)pc->seq * seq_stride;
    float s = 0;
    for (int64_t j = 0; j < dc; j++) s += w[ch * dc + j] * conv_x(qkv, ring, pc, r, j, cd, dc, ch);
    cv[r * cd + ch] = silu(s);
}

extern "C" int hk_gdn_conv(const float *qkv, const float *ring0, size_t seq_stride, const float *w, const int32_t *row_piece,
                           const hk_piece *pieces, int64_t n, int64_t cd, int64_t dc, float *cv, herr *e) {
    if (n == 0) return 0;
    dim3 g(blocks_of(cd, 256), (unsigned)n);
    conv_kernel<<<g, 256>>>(qkv, ring0, seq_stride, w, row_piece, pieces, cd, dc, cv);
    LAUNCHED(e);
    return 0;
}

// blockIdx.y < n_marks: a mark's ring (the dc-1 rows after its end row); else piece
// blockIdx.y - n_marks's new ring into tmp
__global__ void ring_kernel(const float *qkv, const float *ring0, size_t seq_stride, const hk_piece *pieces,
                            const hk_mark *marks, int n_marks, float *stage0, size_t stage_stride, int64_t cd, int64_t dc,
                            float *tmp) {
    const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= cd) return;
    const int y = blockIdx.y;
    const hk_piece *pc;
    int64_t end;
    float *dst;
    if (y < n_marks) {
        pc = &pieces[marks[y].piece];
        end = pc->r0 + marks[y].m - 1;
        dst = stage0 + (size_t)marks[y].slot * stage_stride;
    } else {
        pc = &pieces[y - n_marks];
        end = pc->r0 + pc->n - 1;
        dst = tmp + (size_t)(y - n_marks) * (size_t)((dc - 1) * cd);
    }
    const float *ring = ring0 + (size_t)pc->seq * seq_stride;
    for (int64_t j = 0; j < dc - 1; j++) dst[j * cd + ch] = conv_x(qkv, ring, pc, end, j + 1, cd, dc, ch);
}

__global__ void ring_commit_kernel(float *ring0, size_t seq_stride, const hk_piece *pieces, const float *tmp, int64_t len) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    const int p = blockIdx.y;
    ring0[(size_t)pieces[p].seq * seq_stride + i] = tmp[(size_t)p * len + i];
}

extern "C" int hk_gdn_ring(const float *qkv, float *ring0, size_t seq_stride, const hk_piece *pieces, int n_pieces,
                           const hk_mark *marks, int n_marks, float *stage0, size_t stage_stride, int64_t cd, int64_t dc,
                           float *tmp, herr *e) {
    if (n_pieces == 0) return 0;
    dim3 g(blocks_of(cd, 256), (unsigned)(n_marks + n_pieces));
    ring_kernel<<<g, 256>>>(qkv, ring0, seq_stride, pieces, marks, n_marks, stage0, stage_stride, cd, dc, tmp);
    const int64_t len = (dc - 1) * cd;
    dim3 g2(blocks_of(len, 256), (unsigned)n_pieces);
    ring_commit_kernel<<<g2, 256>>>(ring0, seq_stride, pieces, tmp, len);
    LAUNCHED(e);
    return 0;
}

// block per row, a warp per head: q and k heads L2-normed; gates per value head
__global__ void norm_gate_kernel(float *cv, float *b, float *a, const float *ssm_a, const float *dt, int64_t S, int64_t Gk,
                                 int64_t Gv, int64_t cd, float eps) {
    const int64_t r = blockIdx.x;
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    const float qscale = 1.0f / sqrtf((float)S);
    for (int64_t hk = wid; hk < 2 * Gk; hk += nw) {
        float *x = cv + r * cd + hk * S;
        float ss = 0;
        for (int64_t i = lane; i < S; i += 32) ss += x[i] * x[i];
        ss = warp_sum(ss);
        float sc = 1.0f / sqrtf(ss + eps);
        if (hk < Gk) sc *= qscale;
        for (int64_t i = lane; i < S; i += 32) x[i] *= sc;
    }
    for (int64_t h = threadIdx.x; h < Gv; h += blockDim.x) {
        const float av = a[r * Gv + h] + dt[h];
        b[r * Gv + h] = sigm(b[r * Gv + h]);
        a[r * Gv + h] = ssm_a[h] * (av > 20.0f ? av : log1pf(expf(av)));
    }
}

extern "C" int hk_gdn_norm_gate(float *cv, float *b, float *a, const float *ssm_a, const float *dt, int64_t n, int64_t S,
                                int64_t Gk, int64_t Gv, int64_t cd, float eps, herr *e) {
    if (n == 0) return 0;
    norm_gate_kernel<<<(unsigned)n, 256>>>(cv, b, a, ssm_a, dt, S, Gk, Gv, cd, eps);
    LAUNCHED(e);
    return 0;
}

// The gated delta rule, one (value head, piece) per block, thread c owns column c of the
// lane (st[a] = S[a][c], a the key dim). Per row: S = exp(g) S; d = beta (v - S^T k);
// S += k d^T; o = S^T q. A point after row m is the column as it stands then.
#define DELTA_S 128
__global__ void __launch_bounds__(DELTA_S) delta_kernel(const float *cv, const float *b, const float *a, float *lane0,
                                                        size_t seq_stride, const hk_piece *pieces, const hk_mark *marks,
                                                        float *stage0, size_t stage_stride, int64_t Gk, int64_t Gv,
                                                        int64_t cd, float *o) {
    __shared__ float ks[DELTA_S], qs[DELTA_S];
    const int64_t h = blockIdx.x, hk = h % Gk, S = DELTA_S;
    const hk_piece *pc = &pieces[blockIdx.y];
    const int c = threadIdx.x;
    float *lane = lane0 + (size_t)pc->seq * seq_stride + (size_t)(h * S * S);
    float st[DELTA_S];
#pragma unroll
    for (int i = 0; i < DELTA_S; i++) st[i] = lane[i * S + c];
    int mk = 0;
    for (int64_t t = 0; t < pc->n; t++) {
        const int64_t r = pc->r0 + t;
        const float *row = cv + r * cd;
        __syncthreads();
        qs[c] = row[hk * S + c];
        ks[c] = row[Gk * S + hk * S + c];
        __syncthreads();
        const float v = row[2 * Gk * S + h * S + c], beta = b[r * Gv + h], eg = expf(a[r * Gv + h]);
        float kv = 0;
#pragma unroll
        for (int i = 0; i < DELTA_S; i++) {
            st[i] *= eg;
            kv = fmaf(st[i], ks[i], kv);
        }
        const float d = beta * (v - kv);
        float out = 0;
#pragma unroll
        for (int i = 0; i < DELTA_S; i++) {
            st[i] = fmaf(ks[i], d, st[i]);
            out = fmaf(st[i], qs[i], out);
        }
        o[r * (Gv * S) + h * S + c] = out;
        while (mk < pc->n_marks && marks[pc->mark0 + mk].m == t + 1) {
            float *dst = stage0 + (size_t)marks[pc->mark0 + mk].slot * stage_stride + (size_t)(h * S * S);
#pragma unroll
            for (int i = 0; i < DELTA_S; i++) dst[i * S + c] = st[i];
            mk++;
        }
    }
#pragma unroll
    for (int i = 0; i < DELTA_S; i++) lane[i * S + c] = st[i];
}

extern "C" int hk_gdn_delta(const float *cv, const float *b, const float *a, float *lane0, size_t seq_stride,
                            const hk_piece *pieces, int n_pieces, const hk_mark *marks, float *stage0, size_t stage_stride,
                            int64_t S, int64_t Gk, int64_t Gv, int64_t cd, float *o, herr *e) {
    if (S != DELTA_S) return herr_set(e, "the CUDA engine's delta rule takes ssm_d_state %d, not %lld", DELTA_S, (long long)S);
    if (n_pieces == 0) return 0;
    dim3 g((unsigned)Gv, (unsigned)n_pieces);
    delta_kernel<<<g, DELTA_S>>>(cv, b, a, lane0, seq_stride, pieces, marks, stage0, stage_stride, Gk, Gv, cd, o);
    LAUNCHED(e);
    return 0;
}

// block per (row, head): RMSNorm over S with nw, times silu(z)
__global__ void gated_norm_kernel(float *o, const float *z, const float *nw, int64_t S, int64_t Gv, float eps) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.y, h = blockIdx.x;
    float *x = o + (r * Gv + h) * S;
    const float *zz = z + (r * Gv + h) * S;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, sh);
    const float sc = 1.0f / sqrtf(ss / (float)S + eps);
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x) x[i] = x[i] * sc * nw[i] * silu(zz[i]);
}

extern "C" int hk_gdn_gated_norm(float *o, const float *z, const float *nw, int64_t n, int64_t S, int64_t Gv, float eps,
                                 herr *e) {
    if (n == 0) return 0;
    dim3 g((unsigned)Gv, (unsigned)n);
    gated_norm_kernel<<<g, 128>>>(o, z, nw, S, Gv, eps);
    LAUNCHED(e);
    return 0;
}

// ------------------------------------------------------------------ attention

// one warp: RMSNorm x (D) by w in place, then NeoX RoPE on its first rope_dims dims
__device__ void norm_rope(float *x, const float *w, int64_t D, int64_t rope_dims, int64_t pos, float theta, float eps) {
    const int lane = threadIdx.x % 32;
    float ss = 0;
    for (int64_t i = lane; i < D; i += 32) ss += x[i] * x[i];
    ss = warp_sum(ss);
    const float sc = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = lane; i < D; i += 32) x[i] = x[i] * sc * w[i];
    __syncwarp();
    const int64_t half = rope_dims / 2;
    for (int64_t i = lane; i < half; i += 32) {
        const double ang = (double)pos * pow((double)theta, -2.0 * (double)i / (double)rope_dims);
        const float c = (float)cos(ang), s = (float)sin(ang);
        const float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x0 * s + x1 * c;
    }
    __syncwarp();
}

// block per row, a warp per head; then the row's k and v into the cache
__global__ void attn_prep_kernel(float *qf, float *k, const float *v, const float *qn, const float *kn,
                                 const int32_t *row_seq, const int64_t *pos, int64_t H, int64_t Hkv, int64_t D,
                                 int64_t rope_dims, float theta, float eps, void *k0, void *v0, size_t seq_stride, bool f16) {
    const int64_t r = blockIdx.x;
    const int wid = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int64_t h = wid; h < H + Hkv; h += nw) {
        if (h < H) norm_rope(qf + r * 2 * H * D + h * 2 * D, qn, D, rope_dims, pos[r], theta, eps);
        else norm_rope(k + r * Hkv * D + (h - H) * D, kn, D, rope_dims, pos[r], theta, eps);
    }
    __syncthreads();
    const size_t at = (size_t)row_seq[r] * seq_stride + (size_t)(pos[r] * Hkv * D);
    for (int64_t i = threadIdx.x; i < Hkv * D; i += blockDim.x) {
        const float kk = k[r * Hkv * D + i], vv = v[r * Hkv * D + i];
        if (f16) {
            ((__half *)k0)[at + i] = __float2half_rn(kk);
            ((__half *)v0)[at + i] = __float2half_rn(vv);
        } else {
            ((float *)k0)[at + i] = kk;
            ((float *)v0)[at + i] = vv;
        }
    }
}

extern "C" int hk_attn_prep(float *qf, float *k, const float *v, const float *qn, const float *kn, const int32_t *row_seq,
                            const int64_t *pos, int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t rope_dims,
                            float theta, float eps, void *k0, void *v0, size_t seq_stride, bool f16, herr *e) {
    if (n == 0) return 0;
    attn_prep_kernel<<<(unsigned)n, 256>>>(qf, k, v, qn, kn, row_seq, pos, H, Hkv, D, rope_dims, theta, eps, k0, v0,
                                           seq_stride, f16);
    LAUNCHED(e);
    return 0;
}

__device__ __forceinline__ float kv_at(const void *base, size_t i, bool f16) {
    return f16 ? __half2float(((const __half *)base)[i]) : ((const float *)base)[i];
}

#define ATTN_THREADS 128
// block per (head, row): scores into scratch, max and sum by the block tree, then each
// thread one output dim over the keys in order; times sigmoid(gate)
__global__ void attn_kernel(const float *qf, const int32_t *row_seq, const int64_t *pos, int64_t H, int64_t Hkv, int64_t D,
                            const void *k0, const void *v0, size_t seq_stride, bool f16, float *scores, int64_t n_ctx,
                            float *ao) {
    __shared__ float sh[32];
    const int64_t h = blockIdx.x, r = blockIdx.y, hk = h / (H / Hkv), n_keys = pos[r] + 1;
    const float *q = qf + r * 2 * H * D + h * 2 * D;
    const size_t base = (size_t)row_seq[r] * seq_stride + (size_t)(hk * D);
    float *sc = scores + (size_t)(r * H + h) * (size_t)n_ctx;
    const float scale = 1.0f / sqrtf((float)D);
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n_keys; j += blockDim.x) {
        const size_t kr = base + (size_t)(j * Hkv * D);
        float d = 0;
        for (int64_t i = 0; i < D; i++) d = fmaf(q[i], kv_at(k0, kr + i, f16), d);
        sc[j] = d * scale;
        mx = fmaxf(mx, sc[j]);
    }
    mx = block_max(mx, sh);
    float sum = 0;
    for (int64_t j = threadIdx.x; j < n_keys; j += blockDim.x) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    sum = block_sum(sum, sh);
    __syncthreads(); /* every score written before any thread reads them all */
    const float inv = 1.0f / sum;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        float o = 0;
        for (int64_t j = 0; j < n_keys; j++) o = fmaf(sc[j] * inv, kv_at(v0, base + (size_t)(j * Hkv * D) + i, f16), o);
        ao[r * H * D + h * D + i] = o * sigm(q[D + i]);
    }
}

extern "C" int hk_attn(const float *qf, const int32_t *row_seq, const int64_t *pos, int64_t n, int64_t H, int64_t Hkv,
                       int64_t D, const void *k0, const void *v0, size_t seq_stride, bool f16, float *scores, int64_t n_ctx,
                       float *ao, herr *e) {
    if (n == 0) return 0;
    dim3 g((unsigned)H, (unsigned)n);
    attn_kernel<<<g, ATTN_THREADS>>>(qf, row_seq, pos, H, Hkv, D, k0, v0, seq_stride, f16, scores, n_ctx, ao);
    LAUNCHED(e);
    return 0;
}
