// gemv.cuh: the one-row products (decode's, and the experts' pairs): a group of lanes per
// output row over its quantized weights and the input rows rounded to 8 bits (mmq.cu's gemv
// launchers run them), with the inputs' SwiGLU made in the launch (SW) and decode's extras
// (EX: several weights over the same inputs, and a tail: tail.cuh). Device code only, so that
// tests/unit/test_fused_emu.cc runs the same kernels on the CPU under tests/unit/cuda_emu.h.
#ifndef HEARTH_CUDA_GEMV_CUH
#define HEARTH_CUDA_GEMV_CUH

#include <stdint.h>
#include "engine/cuda/warp.cuh"
#include "engine/cuda/act.cuh"
#include "engine/cuda/tail.cuh"
extern "C" {
#include "format/quant.h"
}

#define FADD(a, b) __fadd_rn(a, b)
#define FSUB(a, b) __fsub_rn(a, b)
#define FMUL(a, b) __fmul_rn(a, b)


__device__ __forceinline__ uint32_t ld32(const uint8_t *p) { return *(const uint32_t *)p; }

// the 6-bit scale and min of sub-block j (quant.c's k4_scale_min) from the 12 scale bytes
__device__ __forceinline__ void scale_min(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// the same from the 12 scale bytes as three little-endian words
__device__ __forceinline__ int byte_of(uint32_t a, uint32_t b, uint32_t c, int i) {
    const uint32_t w = i < 4 ? a : i < 8 ? b : c;
    return (int)((w >> (8 * (i & 3))) & 0xff);
}
__device__ __forceinline__ void scale_min_w(int j, uint32_t a, uint32_t b, uint32_t c, int *d, int *m) {
    if (j < 4) {
        *d = byte_of(a, b, c, j) & 63;
        *m = byte_of(a, b, c, j + 4) & 63;
    } else {
        *d = (byte_of(a, b, c, j + 4) & 0xF) | ((byte_of(a, b, c, j - 4) >> 6) << 4);
        *m = (byte_of(a, b, c, j + 4) >> 4) | ((byte_of(a, b, c, j) >> 6) << 4);
    }
}

// the signed scale of Q6_K sub-block s from the 16 scale bytes
__device__ __forceinline__ int scale6(const uint4 v, int s) {
    const uint32_t w = s < 4 ? v.x : s < 8 ? v.y : s < 12 ? v.z : v.w;
    return (int)(int8_t)((w >> (8 * (s & 3))) & 0xff);
}

// quant_dot_ref's block finish for Q4_K / Q5_K and Q6_K (d = da * dw, then the products)
__device__ __forceinline__ float term_kmin(float da, float dw, float dmin, int sumi, int summ) {
    return FSUB(FMUL(FMUL(da, dw), (float)sumi), FMUL(FMUL(da, dmin), (float)summ));
}
__device__ __forceinline__ float term_k6(float da, float dw, int sumi) { return FMUL(FMUL(da, dw), (float)sumi); }
__device__ __forceinline__ float term_q80(float dw, float da, int isum) { return FMUL((float)isum, FMUL(dw, da)); }

__device__ __forceinline__ int dot16(const uint32_t w[4], const int4 x) {
    int s = __dp4a((int)w[0], x.x, 0);
    s = __dp4a((int)w[1], x.y, s);
    s = __dp4a((int)w[2], x.z, s);
    return __dp4a((int)w[3], x.w, s);
}

// Q6_K's 6-bit weights of 4 positions as signed bytes: low 4 bits of ql (>> nsh), 2 high
// bits of qh (>> hsh), minus 32
__device__ __forceinline__ uint32_t q6_word(uint32_t ql, uint32_t qh, int nsh, int hsh) {
    const uint32_t v = ((ql >> nsh) & 0x0F0F0F0Fu) | (((qh >> hsh) & 0x03030303u) << 4);
    return __vsub4(v, 0x20202020u);
}

// ------------------------------------------------------------------ gemv: lane groups per output

// A K-quant block (256) takes 8 lanes, a Q8_0 block (32) 2 (LPB). An output row's lanes are a
// group of G: the whole warp, or 16 or 8 lanes where a row has only 2 or 1 K-quant blocks
// (Q8_0: 8), so that a warp takes 32 / G rows and no lane idles; a group covers G / LPB blocks
// a step, and the weight loads of IT steps are issued before the first step is used.
template <int T> struct gv {
    static constexpr int LPB = T == QT_Q8_0 ? 2 : 8;
    static constexpr int BLK = T == QT_Q8_0 ? 32 : 256;
};

// A lane's weight bytes for block b (see gemv_row): Q4_K: the header, 16 bytes of nibbles;
// Q5_K: also 16 bytes of high bits; Q6_K: 16 bytes of ql, of qh, the scales, the block scale;
// Q8_0: 16 weights and the block scale
template <int T> struct gv_part {
    uint4 a, b, c;
    float d;
};
template <int T>
__device__ __forceinline__ void gv_load(const uint8_t *wrow, const uint16_t *dd, int64_t b, int c, gv_part<T> &w) {
    if (T == QT_Q4_K || T == QT_Q5_K) {
        const uint8_t *blk = wrow + b * (T == QT_Q4_K ? 144 : 176);
        w.a = *(const uint4 *)blk;
        w.b = *(const uint4 *)(blk + (T == QT_Q4_K ? 16 : 48) + 16 * c);
        if (T == QT_Q5_K) w.c = *(const uint4 *)(blk + 16 + 16 * (c & 1));
    } else if (T == QT_Q6_K) {
        const uint8_t *blk = wrow + b * 208;
        const int half = c >> 2, qa = (c >> 1) & 1, lh = c & 1;
        w.a = *(const uint4 *)(blk + 64 * half + 32 * qa + 16 * lh);
        w.b = *(const uint4 *)(blk + 128 + 32 * half + 16 * lh);
        w.c = *(const uint4 *)(blk + 192);
        w.d = __half2float(__ushort_as_half(dd[b]));
    } else {
        w.a = *(const uint4 *)(wrow + b * 32 + 16 * c);
        w.d = __half2float(__ushort_as_half(dd[b]));
    }
}

// A lane's input bytes for block b of input row ar: Q4_K / Q5_K: 16 inputs of each of its two
// sub-blocks and their sums over 32; Q6_K: two pieces of 16; Q8_0: 16; and the block's scale
struct gv_x {
    int4 x0, x1;
    int s0, s1;
    float d;
};
template <int T> __device__ __forceinline__ void gv_xload(const hk_act &a, int64_t ar, int64_t K, int64_t b, int c, gv_x &x) {
    if (T == QT_Q4_K || T == QT_Q5_K) {
        const int j0 = 2 * (c >> 1), l0 = 16 * (c & 1);
        const int8_t *ap = a.q + ar * K + b * 256;
        const int32_t *sp = a.s + ar * (K / 32) + b * 8;
        x.x0 = *(const int4 *)(ap + 32 * j0 + l0);
        x.x1 = *(const int4 *)(ap + 32 * (j0 + 1) + l0);
        x.s0 = sp[j0];
        x.s1 = sp[j0 + 1];
        x.d = a.d[ar * (K / 256) + b];
    } else if (T == QT_Q6_K) {
        const int s0 = 8 * (c >> 2) + 2 * ((c >> 1) & 1) + (c & 1);
        const int8_t *ap = a.q + ar * K + b * 256;
        x.x0 = *(const int4 *)(ap + 16 * s0);
        x.x1 = *(const int4 *)(ap + 16 * (s0 + 4));
        x.d = a.d[ar * (K / 256) + b];
    } else {
        x.x0 = *(const int4 *)(a.q + ar * K + b * 32 + 16 * c);
        x.d = a.d[ar * (K / 32) + b];
    }
}

// lane c's share of a block's integer sums (sumi; summ: the mins' side, K-quants with mins),
// exact; the block's weight scales into dw and dmin
template <int T>
__device__ __forceinline__ void gv_sums(const gv_part<T> &w, const gv_x &x, int c, int *sumi, int *summ, float *dw,
                                        float *dmin) {
    if (T == QT_Q4_K || T == QT_Q5_K) {
        const int j0 = 2 * (c >> 1), j1 = j0 + 1;
        *dw = __half2float(__ushort_as_half((uint16_t)(w.a.x & 0xffff)));
        *dmin = __half2float(__ushort_as_half((uint16_t)(w.a.x >> 16)));
        int sc0, m0, sc1, m1;
        scale_min_w(j0, w.a.y, w.a.z, w.a.w, &sc0, &m0);
        scale_min_w(j1, w.a.y, w.a.z, w.a.w, &sc1, &m1);
        const uint32_t q[4] = {w.b.x, w.b.y, w.b.z, w.b.w};
        uint32_t w0[4], w1[4];
#pragma unroll
        for (int k = 0; k < 4; k++) w0[k] = q[k] & 0x0F0F0F0Fu, w1[k] = (q[k] >> 4) & 0x0F0F0F0Fu;
        if (T == QT_Q5_K) {
            const uint32_t hh[4] = {w.c.x, w.c.y, w.c.z, w.c.w};
#pragma unroll
            for (int k = 0; k < 4; k++)
                w0[k] |= ((hh[k] >> j0) & 0x01010101u) << 4, w1[k] |= ((hh[k] >> j1) & 0x01010101u) << 4;
        }
        *sumi = sc0 * dot16(w0, x.x0) + sc1 * dot16(w1, x.x1);
        *summ = (c & 1) == 0 ? m0 * x.s0 + m1 * x.s1 : 0; /* a sub-block pair's two lanes: one counts its mins */
    } else if (T == QT_Q6_K) {
        const int half = c >> 2, qa = (c >> 1) & 1, lh = c & 1;
        const int s0 = 8 * half + 2 * qa + lh, s1 = s0 + 4;
        const uint32_t l[4] = {w.a.x, w.a.y, w.a.z, w.a.w}, h[4] = {w.b.x, w.b.y, w.b.z, w.b.w};
        uint32_t w0[4], w1[4];
#pragma unroll
        for (int k = 0; k < 4; k++) w0[k] = q6_word(l[k], h[k], 0, 2 * qa), w1[k] = q6_word(l[k], h[k], 4, 2 * qa + 4);
        *sumi = scale6(w.c, s0) * dot16(w0, x.x0) + scale6(w.c, s1) * dot16(w1, x.x1);
        *summ = 0;
        *dw = w.d;
    } else {
        const uint32_t wq[4] = {w.a.x, w.a.y, w.a.z, w.a.w};
        *sumi = dot16(wq, x.x0);
        *summ = 0;
        *dw = w.d;
    }
}

// quant_dot_ref's finish of a block from its whole integer sums (da: the input block's scale)
template <int T> __device__ __forceinline__ float gv_term(float da, float dw, float dmin, int sumi, int summ) {
    if (T == QT_Q8_0) return term_q80(dw, da, sumi);
    if (T == QT_Q6_K) return term_k6(da, dw, sumi);
    return term_kmin(da, dw, dmin, sumi, summ);
}

// Row o of W (wrow: its main-plane row, dd: its scales) against NR input rows (ar[r], r <
// nr), on this lane's group of G lanes: acc[r] = the row's dot, the same in every lane of
// the group. The lanes of a block form its integer sums exactly; the block's term is
// quant_dot_ref's block finish; the terms are added in block order. The weights of IT steps
// are loaded before anything else; with wait set, pdl_enter follows them (the weights are no
// kernel's output), so they stream in while the kernel before this one ends. Where NR * IT
// is small the inputs' loads of all IT steps are issued next, before the first is used.
template <int T, int NR, int IT, int G>
__device__ __forceinline__ void gemv_row(const uint8_t *wrow, const uint16_t *dd, int64_t K, const hk_act &a,
                                         const int64_t *ar, int nr, bool wait, float *acc) {
    constexpr int LPB = gv<T>::LPB, BPS = G / LPB;
    constexpr bool PRE = NR * IT <= 4;
    const int lane = threadIdx.x & 31, base = lane & ~(G - 1), c = lane % LPB, bi = (lane - base) / LPB;
    const int64_t nb = K / gv<T>::BLK;
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    for (int64_t g0 = 0; g0 < nb; g0 += IT * BPS) {
        gv_part<T> wp[IT];
#pragma unroll
        for (int it = 0; it < IT; it++) {
            const int64_t b = g0 + it * BPS + bi;
            if (b < nb) gv_load<T>(wrow, dd, b, c, wp[it]);
        }
        if (wait && g0 == 0) pdl_enter();
        gv_x xp[PRE ? IT * NR : 1];
        if (PRE)
#pragma unroll
            for (int it = 0; it < IT; it++)
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    const int64_t b = g0 + it * BPS + bi;
                    if (r < nr && b < nb) gv_xload<T>(a, ar[r], K, b, c, xp[it * NR + r]);
                }
#pragma unroll
        for (int it = 0; it < IT; it++) {
            const int64_t b0 = g0 + it * BPS, b = b0 + bi;
            if (b0 >= nb) break; /* the same in every lane */
            int sumi[NR], summ[NR];
            float term[NR], da[NR], dw = 0.0f, dmin = 0.0f;
#pragma unroll
            for (int r = 0; r < NR; r++) sumi[r] = 0, summ[r] = 0, term[r] = 0.0f, da[r] = 0.0f;
            if (b < nb)
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    if (r >= nr) break;
                    gv_x xl;
                    if (!PRE) gv_xload<T>(a, ar[r], K, b, c, xl);
                    const gv_x &x = PRE ? xp[it * NR + r] : xl;
                    gv_sums<T>(wp[it], x, c, &sumi[r], &summ[r], &dw, &dmin);
                    da[r] = x.d;
                }
            /* exact integer sums over the block's lanes */
#pragma unroll
            for (int r = 0; r < NR; r++)
                for (int off = 1; off < LPB; off <<= 1) {
                    sumi[r] += __shfl_xor_sync(0xffffffffu, sumi[r], off);
                    summ[r] += __shfl_xor_sync(0xffffffffu, summ[r], off);
                }
            if (b < nb)
#pragma unroll
                for (int r = 0; r < NR; r++)
                    if (r < nr) term[r] = gv_term<T>(da[r], dw, dmin, sumi[r], summ[r]);
            /* the blocks' terms in block order, in every lane of the group */
#pragma unroll
            for (int i = 0; i < BPS; i++)
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    const float t = __shfl_sync(0xffffffffu, term[r], base + i * LPB);
                    if (b0 + i < nb) acc[r] = FADD(acc[r], t);
                }
        }
    }
}

// Where output row o of pair p reads and writes. Dense (sel NULL): rows of w, then of w2, of
// mo.w3 and of mo.w4 (several weights over the same inputs in one launch), each into its own
// output (y, y2, mo.y3, mo.y4 at strides ys, mo.ys2, ...); input rows from 0, output row 0
// on. Pairs (sel set): w's rows then w2's (the gate and up products); p < n_routed reads
// expert sel[p]'s slice and input row p / in_div, p >= n_routed the shared expert (ws, ws2)
// and input row p - n_routed + sh_row0; output row p.
struct gv_more {
    hk_w w3, w4;
    float *y3, *y4;
    int64_t ys2, ys3, ys4;
};
struct gv_at {
    const uint8_t *wrow;
    const uint16_t *dd;
    int64_t ar0, yrow0, o, ys;
    float *y;
};
template <bool EX = false>
__device__ __forceinline__ gv_at gv_locate(int64_t o, int64_t p, const hk_w &w, const hk_w &ws, const hk_w &w2,
                                           const hk_w &ws2, float *y, int64_t ys, float *y2, const gv_more &mo,
                                           const int32_t *sel, int64_t n_routed, int in_div, int64_t sh_row0) {
    /* field by field, never a pointer to a parameter (that would put them in local memory) */
    const int seg = o < w.M ? 0 : !EX || o < w.M + w2.M ? 1 : o < w.M + w2.M + mo.w3.M ? 2 : 3; /* mo: EX only */
    const bool shared = sel && p >= n_routed; /* the shared expert */
#define GV_PICK(f) (shared ? (seg ? ws2.f : ws.f) : seg == 0 ? w.f : seg == 1 ? w2.f : seg == 2 ? mo.w3.f : mo.w4.f)
    gv_at at;
    at.o = o - (seg > 0 ? w.M : 0) - (seg > 1 ? w2.M : 0) - (seg > 2 ? mo.w3.M : 0);
    at.y = seg == 0 ? y : seg == 1 ? y2 : seg == 2 ? mo.y3 : mo.y4;
    at.ys = seg == 0 ? ys : seg == 1 ? mo.ys2 : seg == 2 ? mo.ys3 : mo.ys4;
    at.yrow0 = sel ? p : 0;
    at.ar0 = !sel ? 0 : shared ? p - n_routed + sh_row0 : p / in_div;
    const int64_t ex = sel && !shared ? sel[p] : 0;
    const uint8_t *d = (const uint8_t *)GV_PICK(d);
    const uint16_t *dd = GV_PICK(dd);
    const size_t rb = GV_PICK(row_bytes), slice = shared ? 0 : GV_PICK(slice_bytes);
    const int64_t ddr = GV_PICK(dd_row), dds = shared ? 0 : GV_PICK(dd_slice);
#undef GV_PICK
    at.wrow = d + (size_t)ex * slice + (size_t)at.o * rb;
    at.dd = dd ? dd + (size_t)ex * (size_t)dds + (size_t)at.o * (size_t)ddr : NULL;
    return at;
}

// The SwiGLU rows that feed a down product made inside its launch (hk_moe_down_swiglu): a
// pair's input is silu(g) * u of its row (rows of F), rounded as hk_swiglu_quant rounds it
struct gv_sw {
    const float *g, *u;
    int64_t F;
};

// input row ar of sw made by the block's 4 warps (a warp per 256 values, as swiglu_kernel
// makes it) into mem, returned as a one-row activation; the block's barrier ends it
template <int T> __device__ __forceinline__ hk_act sw_row(const gv_sw &sw, int64_t ar, int8_t *mem) {
    hk_act sa;
    sa.q = mem;
    sa.d = (float *)(mem + sw.F);
    sa.s = (int32_t *)(mem + sw.F + 4 * (sw.F / 32));
    sa.K = sw.F;
    sa.q80 = T == QT_Q8_0;
    const int lane = threadIdx.x & 31;
    for (int64_t blk = threadIdx.x / 32; blk < sw.F / 256; blk += 4) {
        const int64_t i0 = ar * sw.F + blk * 256 + 8 * lane;
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = silu(sw.g[i0 + i]) * sw.u[i0 + i];
        round_into(sa, 0, blk, v);
    }
    __syncthreads();
    return sa;
}
__host__ __device__ constexpr size_t sw_bytes(int64_t F) { return (size_t)(F + 8 * (F / 32) + 15) / 16 * 16; }

// 4 warps, a group of G lanes per output row o (32 / G rows a warp; rows past w's M are w2's,
// mo's: gv_locate): dense, input rows 0..n (n <= NR), y[r][o]; pairs (NR = 1), blockIdx.y is
// pair p (gv_locate), y[p][o]. SW: the pair's input row is first made from sw into shared
// memory by the block's warps (sw_row), and read from there. EX (extras, their own
// instantiations so that the plain products keep their registers): mo's weights, and the
// tail (tail.cuh): the launch's last block then does its work (a block's slice of a row's
// outputs: its 4 warps' rows). The down product with its combine tail (SW, EX, one step: the
// experts' rows of 512) is held to 64 registers, 8 blocks an SM, as its plain form has them
// (56-64 there; the tail's call took it to 72; under the cap ptxas spills 16 bytes). The
// tail is a __grid_constant__ parameter: passed by reference into the non-inlined tails, a
// plain one is copied to local memory by every thread at entry.
template <int T, int NR, int IT, int G, bool SW, bool EX>
__global__ void __launch_bounds__(128, SW && EX && IT == 1 ? 8 : 1) gemv_kernel(hk_w w, hk_w ws, hk_act a, int64_t n, const int32_t *sel,
                                                   int64_t n_routed, int in_div, int64_t sh_row0, float *y, int64_t ys,
                                                   bool add, hk_w w2, hk_w ws2, float *y2, gv_sw sw, gv_more mo,
                                                   const __grid_constant__ hk_tail tail) {
    constexpr int RW = 32 / G;
    const int64_t Mt = w.M + w2.M + (EX ? mo.w3.M + mo.w4.M : 0), o0 = ((int64_t)blockIdx.x * 4 + threadIdx.x / 32) * RW;
    const bool dead = o0 >= Mt; /* a warp past the last row (with SW or a tail it stays for the block's barriers) */
    if (dead && !SW && !(EX && tail.kind)) {
        pdl_enter();
        return;
    }
    int64_t o = o0 + (threadIdx.x & 31) / G;
    const bool live = o < Mt;
    if (!live) o = Mt - 1; /* a group past the last row runs one (its lanes join the warp's shuffles), writes nothing */
    if (sel) pdl_enter(); /* the expert is a kernel's output */
    const gv_at at = gv_locate<EX>(o, blockIdx.y, w, ws, w2, ws2, y, ys, y2, mo, sel, n_routed, in_div, sh_row0);
    int64_t ar[NR];
    const int nr = sel ? 1 : (int)n;
#pragma unroll
    for (int r = 0; r < NR; r++) ar[r] = at.ar0 + r;
    if (SW) {
        HK_DYN_SMEM(sw_f);
        a = sw_row<T>(sw, at.ar0, (int8_t *)sw_f);
        ar[0] = 0;
    }
    if (!dead) {
        float acc[NR];
        gemv_row<T, NR, IT, G>(at.wrow, at.dd, w.K, a, ar, nr, !sel, acc);
        if ((threadIdx.x & (G - 1)) == 0 && live)
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if (r >= nr) break;
                float *yp = at.y + (at.yrow0 + r) * at.ys + at.o;
                *yp = add ? FADD(*yp, acc[r]) : acc[r];
            }
    } else if (!sel) {
        pdl_enter();
    }
    if (EX && tail.kind) {
        const int64_t i0 = (int64_t)blockIdx.x * 4 * RW, i1 = i0 + 4 * RW < Mt ? i0 + 4 * RW : Mt;
        tail_run<1u << HK_TAIL_NORM | 1u << HK_TAIL_COMBINE>(tail, y, gridDim.x * gridDim.y, blockIdx.x, gridDim.x, gridDim.y, i0, i1);
    }
}

#endif
