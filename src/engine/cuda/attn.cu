// attn.cu: the attention layer's kernels: per-head RMSNorm and RoPE with the rows' K and V
// stored in the cache, and causal softmax attention in f32, flash style.
//
// Every row takes one fixed path, whatever shares its launch: its keys [0, pos] are cut at
// absolute multiples of seg (segments, fixed per engine) and of ATTN_KB inside them (blocks);
// a segment runs its blocks in order with a running max (blocks past the row's position are
// skipped, and a block's sums take only the row's own keys, in order); then the segments are
// merged in order. A tile packs the G query heads of a KV head over consecutive rows of one
// piece (32 query vectors), so K and V are read once for all of them; a decode row is a tile
// of one row and takes the same path.
#include <cuda_fp16.h>
#include <cudaTypedefs.h>
#include <pthread.h>

#include "engine/cuda/common.cuh"
#include "engine/cuda/attn_merge.cuh"
#include "engine/cuda/attn_mma.cuh"
#include "engine/cuda/attn_wg.cuh"

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

// grid (n, H + Hkv), a warp per (row, head): a query head RMS-normed and roped in place; a KV
// head's k likewise, then its k and v stored at the row's position in its sequence's cache
__global__ void attn_prep_kernel(float *qf, float *k, const float *v, const float *qn, const float *kn,
                                 const int32_t *row_seq, const int64_t *pos, int64_t H, int64_t Hkv, int64_t D,
                                 int64_t rope_dims, float theta, float eps, void *k0, void *v0, size_t seq_stride, bool f16) {
    pdl_enter();
    const int64_t r = blockIdx.x, h = blockIdx.y;
    if (h < H) {
        norm_rope(qf + r * 2 * H * D + h * 2 * D, qn, D, rope_dims, pos[r], theta, eps);
        return;
    }
    const int64_t kh = h - H;
    float *kr = k + r * Hkv * D + kh * D;
    norm_rope(kr, kn, D, rope_dims, pos[r], theta, eps);
    const size_t at = (size_t)row_seq[r] * seq_stride + (size_t)(pos[r] * Hkv * D + kh * D);
    const float *vr = v + r * Hkv * D + kh * D;
    for (int64_t i = threadIdx.x; i < D; i += 32) {
        if (f16) {
            ((__half *)k0)[at + i] = __float2half_rn(kr[i]);
            ((__half *)v0)[at + i] = __float2half_rn(vr[i]);
        } else {
            ((float *)k0)[at + i] = kr[i];
            ((float *)v0)[at + i] = vr[i];
        }
    }
}

extern "C" int hk_attn_prep(void *st, float *qf, float *k, const float *v, const float *qn, const float *kn,
                            const int32_t *row_seq, const int64_t *pos, int64_t n, int64_t H, int64_t Hkv, int64_t D,
                            int64_t rope_dims, float theta, float eps, void *k0, void *v0, size_t seq_stride, bool f16,
                            herr *e) {
    if (n == 0) return 0;
    dim3 g((unsigned)n, (unsigned)(H + Hkv));
    LAUNCH(e, attn_prep_kernel, g, 32, 0, st, qf, k, v, qn, kn, row_seq, pos, H, Hkv, D, rope_dims, theta, eps, k0, v0, seq_stride, f16);
    return 0;
}


#define ATTN_QV 32   /* query vectors per tile: rows x the G heads of a KV head */
#define ATTN_KB 32   /* keys per block */
#define ATTN_T 128   /* threads: 8 per pair of query vectors */

extern "C" int64_t hk_attn_part_floats(int64_t D) { return PART(D); }
static bool mma_form(int64_t G, bool f16) { return f16 && G > 0 && G <= 16; }
/* the prompt kernel's form (kernels.h): 8, two warpgroups on wgmma (attn_wg.cuh): on an H100
 * pp2048 after 32,768 rows 21% faster than 6 warps of mma.sync, after 8,192 7% (bench/RESULTS.md,
 * 2026-12-07, sixteenth session); 6 and 4: the whole form in tiles of this many warps
 * (attn_mma.cuh), 0: its pairs */
static int am_warps = HK_ATTN_FORM_DEFAULT;
extern "C" int hk_attn_form(int warps) {
    if (warps != 0 && warps != 4 && warps != 6 && warps != 8) return -1;
    am_warps = warps;
    return 0;
}
/* the split form of the multi-row tiles (attn_mma.cuh: a CTA per (tile, KV head, segment),
 * then attn_fold_rows_kernel; the whole form's bits) for a pass of few tiles at depth, where
 * the whole form's (tiles x Hkv) CTAs walk every key serially on a GPU of many more SMs: 0
 * never, 1 when the pass's multi-row tiles times Hkv are fewer than the SMs (the default;
 * HEARTH_CUDA_ATTN_SPLIT=0 never), 2 always (tests). On an H100 (bench/RESULTS.md,
 * 2026-12-06, thirteenth session) test_cuda's attn_matches_ref passed with it, and a pass of
 * 64 rows after 32,768 went from 1,267 to 2,142 rows a second */
/* the wgmma form's K and V blocks fetched by the copy engine (TMA, attn_wg.cuh; the same
 * bytes in the same places, so the same bits) where the driver makes the cache's views: 1 (the
 * default; a warpgroup's first thread asks for a block's boxes), 2 (lane 0 of each warp asks
 * for its own box of K and of V), or by every thread's cp.async (0) */
static int am_tma = 1;
extern "C" int hk_attn_tma(int on) {
    if (on < 0 || on > 2) return -1;
    am_tma = on;
    return 0;
}
/* cuTensorMapEncodeTiled through the runtime (no link to the driver library): null where the
 * driver has none (the form then fetches by cp.async, the same bits). A view: cols halves x
 * rows rows, rows 2 cols bytes apart, boxes of 64 halves x AM_KB rows in the 128-byte swizzle,
 * rows past the end read as zeros. The last 64 views made are kept (a pass asks for the same
 * layers' views again: one search, no encode), under a lock (engines on other threads) */
static PFN_cuTensorMapEncodeTiled_v12000 am_encode;
static bool am_encode_tried;
struct am_view {
    const void *base;
    int64_t cols, rows;
    CUtensorMap map;
};
static am_view am_views[64];
static int am_n_views, am_next_view;
static pthread_mutex_t am_views_lock = PTHREAD_MUTEX_INITIALIZER;
static bool wg_view_locked(CUtensorMap *m, const void *base, int64_t cols, int64_t rows) {
    for (int i = 0; i < am_n_views; i++)
        if (am_views[i].base == base && am_views[i].cols == cols && am_views[i].rows == rows) return *m = am_views[i].map, true;
    if (!am_encode_tried) {
        am_encode_tried = true;
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050 /* (the unversioned call is deprecated from 13.0) */
        const cudaError_t r = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
#else
        const cudaError_t r = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q);
#endif
        if (r == cudaSuccess && q == cudaDriverEntryPointSuccess)
            am_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        else (void)cudaGetLastError();
    }
    if (!am_encode || (uintptr_t)base % 16 || rows >= ((int64_t)1 << 31) || cols % 64) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)(2 * cols)};
    const cuuint32_t box[2] = {64, AM_KB}, es[2] = {1, 1};
    if (am_encode(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void *)base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return false;
    am_views[am_next_view] = am_view{base, cols, rows, *m};
    am_next_view = (am_next_view + 1) % 64;
    if (am_n_views < 64) am_n_views++;
    return true;
}
static bool wg_view(CUtensorMap *m, const void *base, int64_t cols, int64_t rows) {
    pthread_mutex_lock(&am_views_lock);
    const bool ok = wg_view_locked(m, base, cols, rows);
    pthread_mutex_unlock(&am_views_lock);
    return ok;
}
static int am_split = 1;
static int am_sms = 0; /* the device's SMs, read at the first launch */
extern "C" int hk_attn_split(int mode) {
    if (mode < 0 || mode > 2) return -1;
    am_split = mode;
    return 0;
}
extern "C" int hk_attn_tile_rows(int64_t G, bool f16) {
    if (mma_form(G, f16)) return (int)((am_warps == 8 ? WG_QV : am_warps ? 16 * am_warps : AM_QV) / G);
    return G > 0 && G <= ATTN_QV && ATTN_QV % G == 0 ? (int)(ATTN_QV / G) : 0;
}

template <int D> struct at_smem {
    static constexpr int QS = D + 4, KS = D + 4; /* +4: key rows on distinct bank quads */
    static constexpr int BYTES = 4 * (ATTN_QV * QS + ATTN_KB * KS + ATTN_KB * D + ATTN_QV * (ATTN_KB + 1));
};

// grid (tiles, Hkv, n_seg), 128 threads. Thread (qp = tid / 8, j8 = tid % 8) holds query
// vectors v = 2 qp and 2 qp + 1 (vector v: row v / G of the tile, head kvh * G + v % G):
// their scores with keys j8 + 8u of a block, and their output dims 4 j8 + 32 u'. Per vector:
// a score is its D products summed in order; the block's max and sum take the 8 threads'
// keys by a fixed tree; the output adds the vector's own keys in order. Writes the segment's
// (o unnormalised, max, sum) per (row, head) into part.
template <int D>
__global__ void __launch_bounds__(ATTN_T) attn_kernel(const float *qf, const hk_qtile *tiles, int64_t H, int64_t Hkv,
                                                      const void *k0, const void *v0, size_t seq_stride, bool f16,
                                                      int64_t seg, int64_t n_seg, float *part) {
    pdl_enter();
    extern __shared__ __align__(16) float sm[];
    using L = at_smem<D>;
    constexpr int NO = D / 32; /* float4 groups of output dims per thread and vector */
    float *Qs = sm, *Ks = Qs + ATTN_QV * L::QS, *Vs = Ks + ATTN_KB * L::KS, *Ps = Vs + ATTN_KB * D;
    const hk_qtile tile = tiles[blockIdx.x];
    const int64_t kvh = blockIdx.y, s = blockIdx.z, G = H / Hkv;
    const int64_t k_lo = s * seg, last = tile.pos0 + tile.n - 1;
    if (k_lo > last) return;
    const int64_t k_hi = min((s + 1) * seg, last + 1); /* keys [k_lo, k_hi) of this CTA */
    const int tid = threadIdx.x, qp = tid / 8, j8 = tid % 8;
    int row[2];
    bool live[2];
    int64_t my_pos[2];
#pragma unroll
    for (int a = 0; a < 2; a++) {
        row[a] = (2 * qp + a) / (int)G;
        live[a] = row[a] < tile.n;
        my_pos[a] = tile.pos0 + row[a];
    }
    const float scale = 1.0f / sqrtf((float)D);
    for (int i = tid; i < ATTN_QV * (D / 4); i += ATTN_T) {
        const int vv = i / (D / 4), d4 = i % (D / 4), rr = vv / (int)G;
        float4 q = make_float4(0, 0, 0, 0);
        if (rr < tile.n) q = ((const float4 *)(qf + (int64_t)(tile.r0 + rr) * 2 * H * D + (kvh * G + vv % G) * 2 * D))[d4];
        *(float4 *)(Qs + vv * L::QS + 4 * d4) = q;
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[2][4 * NO];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int i = 0; i < 4 * NO; i++) o[a][i] = 0.0f;
    const size_t base = (size_t)tile.seq * seq_stride + (size_t)(kvh * D);
    for (int64_t kb = k_lo; kb < k_hi; kb += ATTN_KB) {
        const int nk = (int)min((int64_t)ATTN_KB, k_hi - kb);
        __syncthreads(); /* the last block's K, V and P are read */
        for (int i = tid; i < ATTN_KB * (D / 8); i += ATTN_T) {
            const int j = i / (D / 8), d8 = i % (D / 8);
            float kx[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (j < nk) {
                const size_t at = base + (size_t)((kb + j) * Hkv * D) + 8 * d8;
                if (f16) {
                    const uint4 ku = *(const uint4 *)((const __half *)k0 + at), vu = *(const uint4 *)((const __half *)v0 + at);
                    const __half2 *kh = (const __half2 *)&ku, *vh = (const __half2 *)&vu;
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const float2 kf = __half22float2(kh[q]), vf = __half22float2(vh[q]);
                        kx[2 * q] = kf.x, kx[2 * q + 1] = kf.y, vx[2 * q] = vf.x, vx[2 * q + 1] = vf.y;
                    }
                } else {
                    const float4 *kp = (const float4 *)((const float *)k0 + at), *vp = (const float4 *)((const float *)v0 + at);
                    const float4 a0 = kp[0], a1 = kp[1], b0 = vp[0], b1 = vp[1];
                    kx[0] = a0.x, kx[1] = a0.y, kx[2] = a0.z, kx[3] = a0.w, kx[4] = a1.x, kx[5] = a1.y, kx[6] = a1.z, kx[7] = a1.w;
                    vx[0] = b0.x, vx[1] = b0.y, vx[2] = b0.z, vx[3] = b0.w, vx[4] = b1.x, vx[5] = b1.y, vx[6] = b1.z, vx[7] = b1.w;
                }
            }
            float4 *kd = (float4 *)(Ks + j * L::KS + 8 * d8), *vd = (float4 *)(Vs + j * D + 8 * d8);
            kd[0] = make_float4(kx[0], kx[1], kx[2], kx[3]), kd[1] = make_float4(kx[4], kx[5], kx[6], kx[7]);
            vd[0] = make_float4(vx[0], vx[1], vx[2], vx[3]), vd[1] = make_float4(vx[4], vx[5], vx[6], vx[7]);
        }
        __syncthreads();
        /* each vector's own keys in this block: [kb, min(kb + nk, pos + 1)) */
        int nv[2];
#pragma unroll
        for (int a = 0; a < 2; a++) nv[a] = live[a] ? (int)max((int64_t)0, min((int64_t)nk, my_pos[a] + 1 - kb)) : 0;
        float sc[2][ATTN_KB / 8];
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int u = 0; u < ATTN_KB / 8; u++) sc[a][u] = 0.0f;
        {
            const float4 *q0 = (const float4 *)(Qs + (2 * qp) * L::QS), *q1 = (const float4 *)(Qs + (2 * qp + 1) * L::QS);
#pragma unroll 4
            for (int i = 0; i < D / 4; i++) {
                const float4 a = q0[i], b = q1[i];
#pragma unroll
                for (int u = 0; u < ATTN_KB / 8; u++) {
                    const float4 k = ((const float4 *)(Ks + (j8 + 8 * u) * L::KS))[i];
                    float x = sc[0][u], y = sc[1][u];
                    x = fmaf(a.x, k.x, x), x = fmaf(a.y, k.y, x), x = fmaf(a.z, k.z, x), x = fmaf(a.w, k.w, x);
                    y = fmaf(b.x, k.x, y), y = fmaf(b.y, k.y, y), y = fmaf(b.z, k.z, y), y = fmaf(b.w, k.w, y);
                    sc[0][u] = x, sc[1][u] = y;
                }
            }
        }
        float alpha[2], ps[2];
#pragma unroll
        for (int a = 0; a < 2; a++) {
            float bmax = -INFINITY;
#pragma unroll
            for (int u = 0; u < ATTN_KB / 8; u++) {
                sc[a][u] = __fmul_rn(sc[a][u], scale);
                if (j8 + 8 * u < nv[a]) bmax = fmaxf(bmax, sc[a][u]);
            }
            bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, 1));
            bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, 2));
            bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, 4));
            const float mn = fmaxf(m[a], bmax);
            alpha[a] = nv[a] > 0 ? expf(m[a] - mn) : 1.0f;
            float sum = 0;
#pragma unroll
            for (int u = 0; u < ATTN_KB / 8; u++) {
                const int j = j8 + 8 * u;
                const float p = j < nv[a] ? expf(sc[a][u] - mn) : 0.0f;
                Ps[(2 * qp + a) * (ATTN_KB + 1) + j] = p;
                sum += p;
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            sum += __shfl_xor_sync(0xffffffffu, sum, 4);
            ps[a] = sum;
            if (nv[a] > 0) m[a] = mn;
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < 2; a++) {
            if (nv[a] == 0) continue;
            l[a] = __fmaf_rn(l[a], alpha[a], ps[a]);
#pragma unroll
            for (int i = 0; i < 4 * NO; i++) o[a][i] = __fmul_rn(o[a][i], alpha[a]);
            const float *pr = Ps + (2 * qp + a) * (ATTN_KB + 1);
            for (int j = 0; j < nv[a]; j++) {
                const float p = pr[j];
                const float *vrow = Vs + j * D + 4 * j8;
#pragma unroll
                for (int u = 0; u < NO; u++) {
                    const float4 vv = *(const float4 *)(vrow + 32 * u);
                    o[a][4 * u] = fmaf(p, vv.x, o[a][4 * u]), o[a][4 * u + 1] = fmaf(p, vv.y, o[a][4 * u + 1]);
                    o[a][4 * u + 2] = fmaf(p, vv.z, o[a][4 * u + 2]), o[a][4 * u + 3] = fmaf(p, vv.w, o[a][4 * u + 3]);
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 2; a++) {
        if (!live[a]) continue;
        const int64_t h = kvh * G + (2 * qp + a) % G;
        float *pp = part + (((int64_t)(tile.r0 + row[a]) * H + h) * n_seg + s) * PART(D);
#pragma unroll
        for (int u = 0; u < NO; u++)
            *(float4 *)(pp + 32 * u + 4 * j8) = make_float4(o[a][4 * u], o[a][4 * u + 1], o[a][4 * u + 2], o[a][4 * u + 3]);
        if (j8 == 0) pp[D] = m[a], pp[D + 1] = l[a];
    }
}

// The decode form: a tile of one row (every tile of the launch), with the tile kernel's
// arithmetic element for element, spread over 8 warps instead of 4 threads a vector, and K
// and V blocks double-buffered by cp.async. A score is its D products summed in order by
// one lane (lane = key, warp = vector); the block's max is the warp's (exact in any order);
// the sum adds the keys j8 + 8u (u in order) per j8, then the tree over j8 by xor 1, 2, 4,
// as the tile kernel's 8 threads do; each output dim adds the vector's keys in order. The
// roundings are explicit (__fmul_rn, __fmaf_rn) in both kernels, so no contraction the
// compiler chooses in one of them alone moves a bit. test_cuda's attn_matches_ref checks
// rows decoded alone against the same rows in tiles, bit for bit.
#define ATTN_DT 256 /* threads of the decode form */
template <int D, typename T> struct ad_smem {
    static constexpr int KROW = D + 16 / (int)sizeof(T); /* elements: key rows 16 bytes apart in the banks */
    static constexpr int STAGE = (int)sizeof(T) * ATTN_KB * (KROW + D); /* one block's K and V */
    static constexpr int BYTES = 2 * STAGE + 4 * (ATTN_QV * D + ATTN_QV * (ATTN_KB + 1) + 4 * ATTN_QV);
};

__device__ __forceinline__ void load8(const __half *p, float *x) {
    const uint4 u = *(const uint4 *)p;
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const float2 f = __half22float2(h[q]);
        x[2 * q] = f.x, x[2 * q + 1] = f.y;
    }
}
__device__ __forceinline__ void load8(const float *p, float *x) {
    const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

// grid (rows, Hkv, n_seg), ATTN_DT threads; G = H / Hkv vectors (the row's query heads of
// KV head blockIdx.y); writes the segment's partials as attn_kernel does
template <int D, typename T>
__global__ void __launch_bounds__(ATTN_DT) attn_decode_kernel(const float *qf, const hk_qtile *tiles, int64_t H,
                                                              int64_t Hkv, const void *k0, const void *v0,
                                                              size_t seq_stride, int64_t seg, int64_t n_seg, float *part) {
    pdl_enter();
    extern __shared__ __align__(16) float sm[];
    using L = ad_smem<D, T>;
    constexpr int C16 = 16 / (int)sizeof(T);              /* elements per 16-byte copy */
    constexpr int OI = (ATTN_QV * (D / 8) + ATTN_DT - 1) / ATTN_DT; /* output items (8 dims of a vector) a thread may hold */
    float *Qs = (float *)((char *)sm + 2 * L::STAGE), *Ps = Qs + ATTN_QV * D;
    float *Ms = Ps + ATTN_QV * (ATTN_KB + 1), *Ls = Ms + ATTN_QV, *As = Ls + ATTN_QV;
    int *Nv = (int *)(As + ATTN_QV);
    const hk_qtile tile = tiles[blockIdx.x];
    const int G = (int)(H / Hkv);
    const int64_t kvh = blockIdx.y, s = blockIdx.z, P = tile.pos0;
    const int64_t k_lo = s * seg;
    if (k_lo > P) return;
    const int64_t k_hi = min((s + 1) * seg, P + 1);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const float scale = 1.0f / sqrtf((float)D);
    const size_t base = (size_t)tile.seq * seq_stride + (size_t)(kvh * D);
    const T *K0 = (const T *)k0, *V0 = (const T *)v0;
    auto fetch = [&](int64_t kb, T *dst) { /* keys [kb, kb + nk) of the block; the rest are never used */
        const int nk = (int)min((int64_t)ATTN_KB, k_hi - kb);
        for (int i = tid; i < 2 * ATTN_KB * (D / C16); i += ATTN_DT) {
            const int isv = i >= ATTN_KB * (D / C16), ii = isv ? i - ATTN_KB * (D / C16) : i;
            const int j = ii / (D / C16), c = ii % (D / C16);
            if (j >= nk) continue;
            const size_t at = base + (size_t)((kb + j) * Hkv * D) + (size_t)(c * C16);
            T *d = isv ? dst + ATTN_KB * L::KROW + j * D + c * C16 : dst + j * L::KROW + c * C16;
            cp16(d, (isv ? V0 : K0) + at);
        }
        asm volatile("cp.async.commit_group;");
    };
    for (int i = tid; i < G * D; i += ATTN_DT) {
        const int v = i / D, d = i % D;
        Qs[v * D + d] = qf[(int64_t)tile.r0 * 2 * H * D + (kvh * G + v) * 2 * D + d];
    }
    for (int v = tid; v < G; v += ATTN_DT) Ms[v] = -INFINITY, Ls[v] = 0.0f;
    float o[OI][8];
#pragma unroll
    for (int a = 0; a < OI; a++)
#pragma unroll
        for (int i = 0; i < 8; i++) o[a][i] = 0.0f;
    auto stage = [&](int b) { return (T *)((char *)sm + b * L::STAGE); };
    fetch(k_lo, stage(0));
    int buf = 0;
    for (int64_t kb = k_lo; kb < k_hi; kb += ATTN_KB, buf ^= 1) {
        if (kb + ATTN_KB < k_hi) fetch(kb + ATTN_KB, stage(buf ^ 1)); /* its buffer was last read before the last barrier */
        else asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        __syncthreads(); /* this block's K and V (every thread's copies) and Qs, Ms, Ls */
        const T *Kb = stage(buf), *Vb = stage(buf) + ATTN_KB * L::KROW;
        const int nv = (int)min((int64_t)ATTN_KB, P + 1 - kb); /* the row's keys in the block */
        for (int v = warp; v < G; v += ATTN_DT / 32) {
            const float *q = Qs + v * D;
            const T *kr = Kb + lane * L::KROW;
            float x = 0.0f;
#pragma unroll 4
            for (int d = 0; d < D; d += 8) {
                float kx[8];
                load8(kr + d, kx);
                const float4 qa = *(const float4 *)(q + d), qb = *(const float4 *)(q + d + 4);
                x = fmaf(qa.x, kx[0], x), x = fmaf(qa.y, kx[1], x), x = fmaf(qa.z, kx[2], x), x = fmaf(qa.w, kx[3], x);
                x = fmaf(qb.x, kx[4], x), x = fmaf(qb.y, kx[5], x), x = fmaf(qb.z, kx[6], x), x = fmaf(qb.w, kx[7], x);
            }
            const float sc = __fmul_rn(x, scale);
            const float bmax = warp_max(lane < nv ? sc : -INFINITY);
            const float m = Ms[v], mn = fmaxf(m, bmax);
            const float p = lane < nv ? expf(sc - mn) : 0.0f;
            Ps[v * (ATTN_KB + 1) + lane] = p;
            const int j8 = lane % 8;
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < ATTN_KB / 8; u++) sum += __shfl_sync(0xffffffffu, p, j8 + 8 * u);
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            sum += __shfl_xor_sync(0xffffffffu, sum, 4);
            if (lane == 0) {
                const float alpha = nv > 0 ? expf(m - mn) : 1.0f;
                As[v] = alpha, Nv[v] = nv;
                if (nv > 0) Ms[v] = mn, Ls[v] = __fmaf_rn(Ls[v], alpha, sum);
            }
        }
        __syncthreads(); /* Ps, As, Nv */
#pragma unroll
        for (int a = 0; a < OI; a++) {
            const int it = tid + a * ATTN_DT;
            if (it >= G * (D / 8)) break;
            const int v = it / (D / 8), d = 8 * (it % (D / 8)), n = Nv[v];
            if (n == 0) continue;
            const float alpha = As[v];
#pragma unroll
            for (int i = 0; i < 8; i++) o[a][i] = __fmul_rn(o[a][i], alpha);
            const float *pr = Ps + v * (ATTN_KB + 1);
            for (int j = 0; j < n; j++) {
                const float pj = pr[j];
                float vx[8];
                load8(Vb + j * D + d, vx);
#pragma unroll
                for (int i = 0; i < 8; i++) o[a][i] = fmaf(pj, vx[i], o[a][i]);
            }
        }
        __syncthreads(); /* the block's buffer and Ps are free */
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
    for (int a = 0; a < OI; a++) {
        const int it = tid + a * ATTN_DT;
        if (it >= G * (D / 8)) break;
        const int v = it / (D / 8), d = 8 * (it % (D / 8));
        float *pp = part + (((int64_t)tile.r0 * H + kvh * G + v) * n_seg + s) * PART(D);
        *(float4 *)(pp + d) = make_float4(o[a][0], o[a][1], o[a][2], o[a][3]);
        *(float4 *)(pp + d + 4) = make_float4(o[a][4], o[a][5], o[a][6], o[a][7]);
        if (d == 0) pp[D] = Ms[v], pp[D + 1] = Ls[v];
    }
}

template <int D, typename T> static int attn_decode_launch(void *st, const float *qf, const hk_qtile *tiles, int n_tiles,
                                                           int64_t H, int64_t Hkv, const void *k0, const void *v0,
                                                           size_t seq_stride, int64_t seg, int64_t n_seg, float *part,
                                                           herr *e) {
    static bool ready = false;
    constexpr int bytes = ad_smem<D, T>::BYTES;
    if (!ready) {
        CUDA_TRY(cudaFuncSetAttribute(attn_decode_kernel<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), e);
        ready = true;
    }
    dim3 g((unsigned)n_tiles, (unsigned)Hkv, (unsigned)n_seg);
    LAUNCH(e, (attn_decode_kernel<D, T>), g, ATTN_DT, bytes, st, qf, tiles, H, Hkv, k0, v0, seq_stride, seg, n_seg, part);
    return 0;
}

template <int D> static int attn_launch(void *st, const float *qf, const hk_qtile *tiles, int n_tiles, int64_t H,
                                        int64_t Hkv, const void *k0, const void *v0, size_t seq_stride, bool f16,
                                        int64_t seg, int64_t n_seg, float *part, herr *e) {
    static bool ready = false;
    constexpr int bytes = at_smem<D>::BYTES;
    if (!ready) {
        CUDA_TRY(cudaFuncSetAttribute(attn_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), e);
        ready = true;
    }
    dim3 g((unsigned)n_tiles, (unsigned)Hkv, (unsigned)n_seg);
    LAUNCH(e, attn_kernel<D>, g, ATTN_T, bytes, st, qf, tiles, H, Hkv, k0, v0, seq_stride, f16, seg, n_seg, part);
    return 0;
}

template <int D> static int mma_launch(void *st, const float *qf, const hk_qtile *tiles, int n_tiles, int n_one,
                                       const int64_t *pos, int64_t n, int64_t H, int64_t Hkv, const void *k0, const void *v0,
                                       size_t seq_stride, int64_t kv_rows, int64_t seg, int64_t n_seg, float *part, float *ao,
                                       hk_act *a, herr *e) {
    static bool ready = false;
    using C = am_cfg<D>;
    if (!ready) {
        CUDA_TRY(cudaFuncSetAttribute(attn_mma_tile_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::PROMPT_BYTES), e);
        CUDA_TRY(cudaFuncSetAttribute(attn_mma_whole_kernel<D, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::whole_bytes(4)), e);
        CUDA_TRY(cudaFuncSetAttribute(attn_mma_whole_kernel<D, 6>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::whole_bytes(6)), e);
        CUDA_TRY(cudaFuncSetAttribute(attn_mma_whole_split_kernel<D, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      C::whole_split_bytes(4)), e);
        CUDA_TRY(cudaFuncSetAttribute(attn_mma_whole_split_kernel<D, 6>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      C::whole_split_bytes(6)), e);
        CUDA_TRY(cudaFuncSetAttribute(attn_mma_split_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::DECODE_BYTES), e);
        CUDA_TRY(cudaFuncSetAttribute(attn_wg_kernel<D, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_cfg<D>::BYTES), e);
        CUDA_TRY(cudaFuncSetAttribute(attn_wg_kernel<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_cfg<D>::BYTES), e);
        if (dev_sms(&am_sms, e) < 0) return -1;
        ready = true;
    }
    const uint16_t *K0 = (const uint16_t *)k0, *V0 = (const uint16_t *)v0;
    const hk_act none = {0};
    /* the split form: its CTAs (tiles x Hkv x segments; those past a tile's last row return at
     * once) and then one fold over every row; part holds every row of the pass (hk_attn's
     * contract), so any pass fits. The choice reads counts alone, so a pass's graph (keyed,
     * among others, by n_tiles and n_one) always holds the same launches */
    const int n_multi = n_tiles - n_one;
    if (n_multi > 0 && (am_split == 2 || (am_split == 1 && (int64_t)n_multi * Hkv < am_sms))) {
        dim3 g((unsigned)n_tiles, (unsigned)Hkv, (unsigned)n_seg);
        if (n_one > 0)
            LAUNCH(e, attn_mma_split_kernel<D>, g, AM_T, C::DECODE_BYTES, st, qf, tiles, H, Hkv, K0, V0, seq_stride, seg, n_seg, part);
        if (am_warps == 6)
            LAUNCH(e, (attn_mma_whole_split_kernel<D, 6>), g, 192, C::whole_split_bytes(6), st, qf, tiles, n_tiles, H, Hkv, K0, V0,
                   seq_stride, seg, n_seg, part);
        else /* 4 warps, or the pairs' and the wgmma form's tiles: 64 vectors, 4 warps' worth */
            LAUNCH(e, (attn_mma_whole_split_kernel<D, 4>), g, 128, C::whole_split_bytes(4), st, qf, tiles, n_tiles, H, Hkv, K0, V0,
                   seq_stride, seg, n_seg, part);
        LAUNCH(e, attn_fold_rows_kernel, dim3((unsigned)H, (unsigned)n), (unsigned)D, 0, st, qf, pos, H, (int64_t)D, seg, n_seg,
               (const float *)part, ao, a ? *a : none);
        return 0;
    }
    if (n_one > 0) {
        dim3 g((unsigned)n_tiles, (unsigned)Hkv, (unsigned)n_seg);
        LAUNCH(e, attn_mma_split_kernel<D>, g, AM_T, C::DECODE_BYTES, st, qf, tiles, H, Hkv, K0, V0, seq_stride, seg, n_seg, part);
        const bool round_here = a && n_one == n_tiles;
        LAUNCH(e, attn_fold_kernel, dim3((unsigned)H, (unsigned)n_tiles), (unsigned)D, 0, st, qf, tiles, H, (int64_t)D, seg, n_seg,
               (const float *)part, ao, round_here ? *a : none);
    }
    if (n_one < n_tiles) {
        dim3 g((unsigned)n_tiles, (unsigned)Hkv);
        CUtensorMap km, vm; /* the views of the layer's cache (TMA), each a sequence's rows after the last's */
        if (am_warps == 8 && am_tma && wg_view(&km, k0, Hkv * D, kv_rows) && wg_view(&vm, v0, Hkv * D, kv_rows) &&
            seq_stride % (size_t)(Hkv * D) == 0)
            LAUNCH(e, (attn_wg_kernel<D, true>), g, WG_T, wg_cfg<D>::BYTES, st, qf, tiles, n_tiles, H, Hkv, K0, V0, seq_stride, seg, ao,
                   km, vm, am_tma == 2);
        else if (am_warps == 8) {
            memset(&km, 0, sizeof km);
            LAUNCH(e, (attn_wg_kernel<D, false>), g, WG_T, wg_cfg<D>::BYTES, st, qf, tiles, n_tiles, H, Hkv, K0, V0, seq_stride, seg,
                   ao, km, km, false);
        }
        else if (am_warps == 4)
            LAUNCH(e, attn_mma_whole_kernel<D, 4>, g, 128, C::whole_bytes(4), st, qf, tiles, n_tiles, H, Hkv, K0, V0, seq_stride, seg, ao);
        else if (am_warps == 6)
            LAUNCH(e, attn_mma_whole_kernel<D, 6>, g, 192, C::whole_bytes(6), st, qf, tiles, n_tiles, H, Hkv, K0, V0, seq_stride, seg, ao);
        else LAUNCH(e, attn_mma_tile_kernel<D>, g, AM_TP, C::PROMPT_BYTES, st, qf, tiles, n_tiles, H, Hkv, K0, V0, seq_stride, seg, ao);
        if (a && hk_quantize(st, ao, H * D, n, a, e) < 0) return -1; /* hk_quantize's bytes, as the merge's launch rounds */
    }
    return 0;
}

extern "C" int hk_attn(void *st, const float *qf, const hk_qtile *tiles, int n_tiles, int n_one, const int64_t *pos,
                       int64_t n, int64_t H, int64_t Hkv, int64_t D, const void *k0, const void *v0, size_t seq_stride,
                       int64_t kv_rows, bool f16, int64_t seg, int64_t n_seg, float *part, float *ao, hk_act *a, herr *e) {
    if (n == 0) return 0;
    if (a && (D % 256 || D > 1024 || a->K != H * D))
        return herr_set(e, "hk_attn: heads of %lld rounded into rows of %lld", (long long)D, (long long)a->K);
    const hk_act none = {0};
    if (mma_form(H / Hkv, f16) && seg % AM_KB == 0 && (D == 256 || D == 128)) {
        if (D == 256)
            return mma_launch<256>(st, qf, tiles, n_tiles, n_one, pos, n, H, Hkv, k0, v0, seq_stride, kv_rows, seg, n_seg, part, ao, a, e);
        return mma_launch<128>(st, qf, tiles, n_tiles, n_one, pos, n, H, Hkv, k0, v0, seq_stride, kv_rows, seg, n_seg, part, ao, a, e);
    }
    if (!hk_attn_tile_rows(H / Hkv, false) || seg % ATTN_KB)
        return herr_set(e, "hk_attn: %lld query heads over %lld KV heads (segments of %lld)", (long long)H, (long long)Hkv,
                        (long long)seg);
    if (D != 256 && D != 128) return herr_set(e, "hk_attn: head dim %lld (the CUDA engine takes 128 or 256)", (long long)D);
    int rc;
    if (n_tiles == n) { /* every tile one row: a decode step (the same bits, see above) */
        if (D == 256) rc = f16 ? attn_decode_launch<256, __half>(st, qf, tiles, n_tiles, H, Hkv, k0, v0, seq_stride, seg, n_seg, part, e)
                               : attn_decode_launch<256, float>(st, qf, tiles, n_tiles, H, Hkv, k0, v0, seq_stride, seg, n_seg, part, e);
        else rc = f16 ? attn_decode_launch<128, __half>(st, qf, tiles, n_tiles, H, Hkv, k0, v0, seq_stride, seg, n_seg, part, e)
                      : attn_decode_launch<128, float>(st, qf, tiles, n_tiles, H, Hkv, k0, v0, seq_stride, seg, n_seg, part, e);
    } else if (D == 256) {
        rc = attn_launch<256>(st, qf, tiles, n_tiles, H, Hkv, k0, v0, seq_stride, f16, seg, n_seg, part, e);
    } else {
        rc = attn_launch<128>(st, qf, tiles, n_tiles, H, Hkv, k0, v0, seq_stride, f16, seg, n_seg, part, e);
    }
    if (rc < 0) return -1;
    dim3 g((unsigned)H, (unsigned)n);
    LAUNCH(e, attn_merge_kernel, g, (unsigned)D, 0, st, qf, pos, H, D, seg, n_seg, part, ao, a ? *a : none);
    return 0;
}
