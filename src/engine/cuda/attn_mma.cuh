// attn_mma.cuh: attention over f16 KV rows on tensor cores (mma.sync m16n8k16, f16
// operands, f32 accumulators), for prompt rows at any depth and for decode rows, with one
// arithmetic for both. Device code only: also run on the CPU under tests/unit/cuda_emu.h
// (tests/unit/test_attn_emu.cc), which emulates mma16816, ldsm4/ldsm4t and cp16.
//
// A row's path is fixed by positions alone, as in attn.cu's f32 kernels: its keys [0, pos]
// are cut at absolute multiples of seg (segments) and of AM_KB inside them (blocks). A warp
// holds 16 query vectors (a vector: one row's query head; the G heads of a KV head packed
// together, so a K/V block is read once for all of them) and steps through a segment's
// blocks in order (am_qk, am_step): S = Q Kᵀ as two chains over the low and the high half of
// D in 16-wide steps, added once (a prompt tile's pair of warps makes a half each); scores in base-2
// units (times log2(e) / sqrt(D), so every exponential is one exp2f); per vector the block's
// max, the running max m moved to it only where it passes m by AM_TAU (then l and o
// rescaled), p = exp2f(s - m) rounded to f16 (the P operand, and what the sum adds, so the
// weights sum to exactly what divides them), o += P V in two 16-key steps.
// A vector with no key in a block leaves m, l and o as they were (its p are 0, its alpha 1).
// Each segment starts from m = -inf, l = 0, o = 0; then the segments are folded in order
// (am_fold: (M, L, O) with (m, l, o), explicit roundings). The prompt kernel folds in the
// block as it goes and writes the row's output; the decode form (one-row tiles, every
// segment a block of its own, for parallelism at depth) writes each segment's (o, m, l) and
// attn_fold_kernel folds them with the same am_fold; the prompt kernel's split form (a pass
// of few tiles at depth: a CTA per tile and segment) writes the same partials and
// attn_fold_rows_kernel folds them likewise. So a row gives the same bits alone, in a
// decode step, in any tile, in either form and in any cut of its prompt into passes
// (test_attn_emu checks the structure under the emulation, test_cuda's attn_matches_ref the
// bits on a GPU).
#ifndef HEARTH_CUDA_ATTN_MMA_CUH
#define HEARTH_CUDA_ATTN_MMA_CUH

#include <stdint.h>

#include "engine/cuda/warp.cuh"
#include "engine/cuda/attn_merge.cuh"

#ifndef HEARTH_CUDA_EMU_H
// the 64 threads of warps 2 pr and 2 pr + 1 meet (named barrier 1 + pr; 0 is __syncthreads')
__device__ __forceinline__ void pair_sync(int pr) { asm volatile("bar.sync %0, 64;" ::"r"(1 + pr) : "memory"); }
// d += a b (m16n8k16: a 16x16 row-major, b 16x8 column-major, f16 pairs; d f32)
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// four 8x8 f16 matrices from shared memory, lanes 8i..8i+7 giving matrix i's row addresses
__device__ __forceinline__ void ldsm4(uint32_t r[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm4t(uint32_t r[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void cp16(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#endif

// planted defects, only under tests/unit/test_attn_emu.cc: 1 every vector of a tile sees
// the keys of its last row (causality broken inside a tile), 2 the tile kernel's segments
// not restarted (one running softmax over all keys; the split form's CTA walks one segment,
// so it has nothing to restart; the wgmma form's next segment adding to the last one's o), 4 the decode form's warps all writing the first quarter of
// the dims, 8 the split form's fold taking a row's segments last first, 16 the split form's
// CTA of a tile's last segment writing no partial, 32 the wgmma form's warpgroups folding
// without waiting for each other (attn_wg.cuh), 64 the wgmma form's warpgroup not fetching
// its next segment's first block (attn_wg.cuh), 128 its TMA fetch not zeroing a block's rows
// past its keys (attn_wg.cuh)
#ifndef AMUT
#define AMUT(bit) 0
#endif

#define AM_KB 32           /* keys per block (attn.cu's ATTN_KB: a segment is whole blocks) */
#define AM_T 128           /* threads of the decode form: 4 warps */
#define AM_TP 256          /* threads of the prompt kernel: 8 warps, 4 pairs */
#define AM_QV 64           /* query vectors of a prompt tile: 16 a pair of warps (the whole form: 16 W, W warps) */
#define AM_TAU 8.0f        /* how far (base 2) a block's max may pass the running one before o is rescaled */

__device__ __forceinline__ uint16_t am_h(float x) { return __half_as_ushort(__float2half_rn(x)); }
__device__ __forceinline__ uint32_t am_h2(float lo, float hi) { return (uint32_t)am_h(lo) | (uint32_t)am_h(hi) << 16; }
#ifndef HEARTH_CUDA_EMU_H
// am_h2 in one instruction (cvt's f16x2 form: each half rounded to nearest even, as am_h)
__device__ __forceinline__ uint32_t am_pack(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(lo), "f"(hi));
    return r;
}
// a weight's exponential, 2^x, where it is rounded to f16 next: the unit's ex2 alone, where
// exp2f wraps it in a test and two multiplies for results below 2^-126 (subnormal in f32).
// For x >= -126 the two are the same instruction on the same input; below, both are under
// 2^-126, which f16 (least subnormal 2^-24) rounds to 0: so am_h(am_ex2(x)) = am_h(exp2f(x))
// for every x, -inf included (both 0)
__device__ __forceinline__ float am_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#else
inline uint32_t am_pack(float lo, float hi) { return am_h2(lo, hi); }
inline float am_ex2(float x) { return exp2f(x); }
#endif

// shared memory, in halves unless named: rows of D halves padded by 8 (16 bytes), so the 8
// rows one ldmatrix reads fall on distinct banks
template <int D> struct am_cfg {
    static constexpr int RS = D + 8;
    static constexpr int STAGE = 2 * AM_KB * RS;                   /* a block's K rows, then its V rows */
    static constexpr int KV_BYTES = 2 * 2 * STAGE;                 /* two stages (decode) */
    static constexpr int O_FLOATS = D / 4;                         /* a prompt thread's folded outputs: 2 vectors, D/2 dims */
    static constexpr int SX_FLOATS = 20;                           /* a lane's 16 half-scores, exchanged in a pair as
                                                                    * float4 (pitch 20: a quarter-warp's stores on distinct banks) */
    static constexpr int PROMPT_BYTES = 2 * AM_QV * RS + 3 * 2 * STAGE + 4 * AM_TP * (O_FLOATS + SX_FLOATS); /* three stages */
    static constexpr int DECODE_BYTES = 2 * 16 * RS + KV_BYTES;
    static constexpr int OW_FLOATS = D / 2;                        /* a whole-form thread's folded outputs: 2 vectors, D dims */
    /* the whole form with W warps (16 W vectors): three stages up to 4 warps, then two (six
     * warps' Q rows and outputs leave room for no more in 227 KiB) */
    __host__ __device__ static constexpr int whole_stages(int W) { return W <= 4 ? 3 : 2; }
    static constexpr int whole_bytes(int W) { return 2 * 16 * W * RS + whole_stages(W) * 2 * STAGE + 4 * 32 * W * OW_FLOATS; }
    /* its split form: no folded outputs, so three stages at any W (D = 256, W = 6: 152,064) */
    static constexpr int whole_split_bytes(int W) { return 2 * 16 * W * RS + 3 * 2 * STAGE; }
};

// all NTH threads: keys [kb, kb + nk) of K and V (f16, key j at base + j Hkv D) into a stage
// by cp.async, rows nk..AM_KB - 1 zeroed (a p of 0 times them must be 0, never NaN); commits.
// Thread t's pieces are fixed: column t % C of rows t / C + u NTH / C, K's rows then V's, so
// the only sums a block does are the two row pointers (the kernel is bound by issued
// instructions, not by its copies: ncu on an H100, bench/RESULTS.md)
template <int D, int NTH>
__device__ __forceinline__ void am_fetch(uint16_t *stg, const uint16_t *K0, const uint16_t *V0, size_t base, int64_t Hkv,
                                         int64_t kb, int nk) {
    constexpr int C = D / 8, RS = am_cfg<D>::RS, RP = NTH / C, H = (AM_KB + RP - 1) / RP; /* 16-byte pieces of a row;
                                                                                           * rows a pass; a thread's per matrix */
    static_assert(NTH % C == 0, "a thread's pieces: one column, whole rows apart");
    const int stride = (int)(Hkv * D), j0 = (int)threadIdx.x / C, c8 = 8 * ((int)threadIdx.x % C);
    const size_t at = base + (size_t)kb * (size_t)stride;
    const uint16_t *Kr = K0 + at + c8, *Vr = V0 + at + c8;
    uint16_t *sk = stg + j0 * RS + c8, *sv = sk + AM_KB * RS;
#pragma unroll
    for (int u = 0; u < H; u++) {
        const int j = j0 + u * RP;
        if (AM_KB % RP && j >= AM_KB) break; /* the last pass's rows past the block (when RP does not divide it) */
        if (j < nk) {
            cp16(sk + u * RP * RS, Kr + j * stride);
            cp16(sv + u * RP * RS, Vr + j * stride);
        } else {
            *(uint4 *)(sk + u * RP * RS) = make_uint4(0u, 0u, 0u, 0u);
            *(uint4 *)(sv + u * RP * RS) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    cp_commit();
}

// One warp's half of a block's scores: S (16 vectors x AM_KB keys, C fragments: S[j] keys
// 8 j .. 8 j + 7) = the warp's rows of Qw (f16, stride RS) times the block's K rows, over the
// dims of 16-wide steps [ks0, ks0 + D/32), in order. A score is its low half (dims < D/2)
// plus its high half, added once (am_sum): the prompt kernel's two warps of a pair make a
// half each, the decode form's warps both; so every form adds the same two chains.
template <int D>
__device__ __forceinline__ void am_qk(const uint16_t *Qw, const uint16_t *Kb, int ks0, float (*S)[4]) {
    constexpr int RS = am_cfg<D>::RS;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < 4; j++) S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.0f;
#pragma unroll 4
    for (int ks = ks0; ks < ks0 + D / 32; ks++) {
        uint32_t a[4];
        ldsm4(a, Qw + (lane & 15) * RS + 16 * ks + 8 * (lane >> 4));
#pragma unroll
        for (int np = 0; np < 2; np++) { /* keys 16 np .. 16 np + 15: two n-tiles of 8 */
            uint32_t b[4];
            ldsm4(b, Kb + (16 * np + (lane & 7) + 8 * (lane >> 4)) * RS + 16 * ks + 8 * ((lane >> 3) & 1));
            mma16816(S[2 * np], a, b);
            mma16816(S[2 * np + 1], a, b + 2);
        }
    }
}
// am_qk with the warp's Q fragments of those steps held in registers (qa[ks - ks0], as
// ldsm4 loads them): the same mma on the same operands, so the same sums
template <int D>
__device__ __forceinline__ void am_qk_reg(const uint32_t (*qa)[4], const uint16_t *Kb, int ks0, float (*S)[4]) {
    constexpr int RS = am_cfg<D>::RS;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < 4; j++) S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < D / 32; k++) {
#pragma unroll
        for (int np = 0; np < 2; np++) {
            uint32_t b[4];
            ldsm4(b, Kb + (16 * np + (lane & 7) + 8 * (lane >> 4)) * RS + 16 * (ks0 + k) + 8 * ((lane >> 3) & 1));
            mma16816(S[2 * np], qa[k], b);
            mma16816(S[2 * np + 1], qa[k], b + 2);
        }
    }
}
__device__ __forceinline__ void am_sum(float (*S)[4], float (*lo)[4], float (*hi)[4]) {
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) S[j][c] = __fadd_rn(lo[j][c], hi[j][c]);
}

// am_step's softmax of vector i (lane holds S[j][2 i + e]): the block's max of its keys
// (those below lim; ALL: lim is AM_KB, no per-key test), alpha, p = 2^(s - max) rounded to
// f16 into P[j][i] (pairs), their sum into l
template <bool ALL>
__device__ __forceinline__ void am_soft(float (*S)[4], int i, int lim, float scale, float &m, float &l, float &alpha,
                                        uint32_t (*P)[2]) {
    const int lane = threadIdx.x & 31;
    float bmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float s = __fmul_rn(S[j][2 * i + e], scale);
            S[j][2 * i + e] = s;
            if (ALL || 8 * j + 2 * (lane & 3) + e < lim) bmax = fmaxf(bmax, s);
        }
    bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, 1));
    bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, 2));
    /* the max the p are taken against moves only when the block's exceeds it by AM_TAU (or
     * on the first block with keys): p <= 2^AM_TAU, exact in f16's range, and o is rescaled
     * (64 products a vector) only then instead of on most blocks */
    const float mn = m == -INFINITY || bmax > m + AM_TAU ? fmaxf(m, bmax) : m;
    alpha = mn == m ? 1.0f : exp2f(m - mn);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float p[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const bool in = ALL || 8 * j + 2 * (lane & 3) + e < lim;
            p[e] = in ? am_ex2(S[j][2 * i + e] - mn) : 0.0f;
        }
        const uint32_t pair = am_pack(p[0], p[1]);
        P[j][i] = pair;
        sum = __fadd_rn(sum, __half2float(__ushort_as_half((uint16_t)(pair & 0xFFFFu))));
        sum = __fadd_rn(sum, __half2float(__ushort_as_half((uint16_t)(pair >> 16))));
    }
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
    l = __fmaf_rn(l, alpha, sum);
    m = mn;
}

// One warp's step over the block of keys [kb, kb + AM_KB) from its 16 vectors' scores S
// (am_qk's halves added): the lane holds vectors lane/4 (i = 0) and lane/4 + 8 (i = 1):
// kend[i] ends that vector's keys (exclusive, absolute; <= kb: none in this block), m[i],
// l[i] its running max (base-2 units) and sum, and o[t][2 i + e] its output at dim
// d0 + 8 t + 2 (lane % 4) + e, t < NT, from the block's V rows Vb. Every dim's sums run in one
// order whatever NT and d0, so a warp holding a slice of the dims gets the bits of any other.
// scale: am_scale(D).
// am_weigh is its first half: the softmax of both vectors into P (the p rounded to f16, pairs
// of keys 8 j + 2 (lane % 4) + e, e = 0, 1, of vector i at P[j][i]: the P operand) and o
// rescaled where a max moved; the wgmma form (attn_wg.cuh) runs it on its accumulators too.
// (am_weigh_p, the softmax alone, and am_rescale, o's part, apart for the wgmma form, which
// runs the softmax of a block while the tensor cores still add the last one's P V into o)
__device__ __forceinline__ void am_weigh_p(float (*S)[4], int64_t kb, const int64_t kend[2], float scale, float m[2], float l[2],
                                           float alpha[2], uint32_t (*P)[2]) {
    int lim[2];
#pragma unroll
    for (int i = 0; i < 2; i++) lim[i] = (int)max((int64_t)0, min((int64_t)AM_KB, kend[i] - kb)); /* the vector's keys in the block */
    /* most blocks: no key to leave out for any of the warp's vectors (a warp-wide vote, so the
     * shuffles inside stay uniform); the same bits either way. Both vectors in one branch, so
     * their two chains of dependent steps can be interleaved (with two warps a scheduler, the
     * wgmma form stalled a third of its cycles on such chains: ncu, eighteenth session) */
    if (__all_sync(0xffffffffu, lim[0] == AM_KB && lim[1] == AM_KB)) {
        am_soft<true>(S, 0, AM_KB, scale, m[0], l[0], alpha[0], P);
        am_soft<true>(S, 1, AM_KB, scale, m[1], l[1], alpha[1], P);
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (__all_sync(0xffffffffu, lim[i] == AM_KB)) am_soft<true>(S, i, lim[i], scale, m[i], l[i], alpha[i], P);
            else am_soft<false>(S, i, lim[i], scale, m[i], l[i], alpha[i], P);
        }
    }
}
template <int NT> __device__ __forceinline__ void am_rescale(float (*o)[4], const float alpha[2]) {
    if (alpha[0] != 1.0f) /* o times 1 is o: once a vector's max settles, nothing to do */
#pragma unroll
        for (int t = 0; t < NT; t++) o[t][0] = __fmul_rn(o[t][0], alpha[0]), o[t][1] = __fmul_rn(o[t][1], alpha[0]);
    if (alpha[1] != 1.0f)
#pragma unroll
        for (int t = 0; t < NT; t++) o[t][2] = __fmul_rn(o[t][2], alpha[1]), o[t][3] = __fmul_rn(o[t][3], alpha[1]);
}
template <int NT>
__device__ __forceinline__ void am_weigh(float (*S)[4], int64_t kb, const int64_t kend[2], float scale, float m[2], float l[2],
                                         float (*o)[4], uint32_t (*P)[2]) {
    float alpha[2];
    am_weigh_p(S, kb, kend, scale, m, l, alpha, P);
    am_rescale<NT>(o, alpha);
}
template <int D, int NT>
__device__ __forceinline__ void am_step(float (*S)[4], const uint16_t *Vb, int d0, int64_t kb, const int64_t kend[2],
                                        float scale, float m[2], float l[2], float (*o)[4]) {
    constexpr int RS = am_cfg<D>::RS;
    const int lane = threadIdx.x & 31;
    uint32_t P[4][2];
    am_weigh<NT>(S, kb, kend, scale, m, l, o, P);
#pragma unroll
    for (int ks = 0; ks < 2; ks++) { /* keys 16 ks .. 16 ks + 15 */
        const uint32_t a[4] = {P[2 * ks][0], P[2 * ks][1], P[2 * ks + 1][0], P[2 * ks + 1][1]};
#pragma unroll
        for (int np = 0; np < NT / 2; np++) { /* dims d0 + 16 np .. + 15: two n-tiles */
            uint32_t b[4];
            ldsm4t(b, Vb + (16 * ks + (lane & 7) + 8 * ((lane >> 3) & 1)) * RS + d0 + 16 * np + 8 * (lane >> 4));
            mma16816(o[2 * np], a, b);
            mma16816(o[2 * np + 1], a, b + 2);
        }
    }
}

// the fold of a segment's (m, l) into (M, L): the weights of the old and the new; M takes
// the larger max. The first segment (M = -inf, L = O = 0) comes out as itself: a = 0, b = 1.
__device__ __forceinline__ void am_fold_w(float &M, float &L, float m, float l, float &a, float &b) {
    const float mn = fmaxf(M, m);
    a = exp2f(M - mn), b = exp2f(m - mn);
    L = __fadd_rn(__fmul_rn(L, a), __fmul_rn(l, b));
    M = mn;
}
__device__ __forceinline__ float am_fold_o(float O, float o, float a, float b) {
    return __fadd_rn(__fmul_rn(O, a), __fmul_rn(o, b));
}
// a prompt kernel's fold of the segment that began at k_lo into a thread's (M, L) and its
// folded outputs (output 4 t + 2 i + e at Of[(4 t + 2 i + e) NTH], Of the thread's first):
// each of its two vectors with keys in the segment (kend[i] > k_lo), with am_fold_w / am_fold_o
template <int NT, int NTH>
__device__ __forceinline__ void am_fold_seg(const int64_t kend[2], int64_t k_lo, const float m[2], const float l[2],
                                            const float (*o)[4], float M[2], float L[2], float *Of) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (kend[i] <= k_lo) continue; /* no key of this vector in the segment */
        float a, b;
        am_fold_w(M[i], L[i], m[i], l[i], a, b);
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float *O = Of + (4 * t + 2 * i + e) * NTH;
                *O = am_fold_o(*O, o[t][2 * i + e], a, b);
            }
    }
}
// the scores' factor: 1/sqrt(D) in base-2 units (two roundings)
__device__ __forceinline__ float am_scale(int D) { return __fmul_rn(1.0f / sqrtf((float)D), 1.4426950408889634f); }
// a head's output from its folded O and L, times the gate's sigmoid
__device__ __forceinline__ float am_out(float O, float L, float gate) { return __fmul_rn(__fdiv_rn(O, L), sigm(gate)); }

// the prompt kernel: grid (tiles, Hkv), AM_TP threads; tiles taken last first (the longest
// rows of a pass first). A tile of n > 1 rows packs its n G vectors (vector v: row v / G,
// head kvh G + v % G) into 4 pairs of warps, 16 vectors a pair; a pair's warps make the low
// and the high half of its scores, swap them through shared memory, run the same softmax and
// each its half of the output dims. The block walks every key block up to the tile's last row,
// segment by segment, folding each into O (shared memory, a thread its own floats) and M, L
// (registers), and writes the rows' outputs to ao. One-row tiles are the decode form's.
template <int D>
__global__ void __launch_bounds__(AM_TP) attn_mma_tile_kernel(const float *qf, const hk_qtile *tiles, int n_tiles, int64_t H,
                                                              int64_t Hkv, const uint16_t *K0, const uint16_t *V0,
                                                              size_t seq_stride, int64_t seg, float *ao) {
    pdl_enter();
    using C = am_cfg<D>;
    constexpr int NT = D / 16, RS = C::RS; /* n-tiles of a warp's half of the dims */
    HK_DYN_SMEM(sm);
    uint16_t *Qs = (uint16_t *)sm, *stg = Qs + AM_QV * RS;
    float *Of = (float *)(stg + 3 * C::STAGE);
    float4 *Sx = (float4 *)(Of + C::O_FLOATS * AM_TP); /* thread t's half-scores at Sx[t SX_FLOATS / 4 + j] */
    const hk_qtile tile = tiles[n_tiles - 1 - (int)blockIdx.x];
    if (tile.n == 1) return;
    const int G = (int)(H / Hkv), nv = tile.n * G, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int pr = warp >> 1, half = warp & 1, mate = tid ^ 32; /* the pair, the half, the other warp's lane */
    const int64_t kvh = blockIdx.y, last = tile.pos0 + tile.n - 1;
    for (int i = tid; i < AM_QV * (D / 4); i += AM_TP) {
        const int v = i / (D / 4), d4 = i % (D / 4);
        float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (v < nv) q = ((const float4 *)(qf + (int64_t)(tile.r0 + v / G) * 2 * H * D + (kvh * G + v % G) * 2 * D))[d4];
        uint16_t *d = Qs + v * RS + 4 * d4;
        d[0] = am_h(q.x), d[1] = am_h(q.y), d[2] = am_h(q.z), d[3] = am_h(q.w);
    }
    int64_t kend[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int v = 16 * pr + (lane >> 2) + 8 * i;
        kend[i] = v < nv ? (AMUT(1) ? last + 1 : tile.pos0 + v / G + 1) : 0;
    }
    const int vlast = min(nv, 16 * pr + 16) - 1; /* the pair's last live vector: its keys end the pair's */
    const int64_t wend = 16 * pr < nv ? tile.pos0 + vlast / G + 1 : 0;
    const float scale = am_scale(D);
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f}, m[2], l[2], o[NT][4];
    for (int i = 0; i < C::O_FLOATS; i++) Of[i * AM_TP + tid] = 0.0f;
    __syncthreads(); /* Qs */
    uint32_t qa[D / 32][4]; /* the warp's 16 vectors, its half of the dims: A fragments of its score steps */
#pragma unroll
    for (int k = 0; k < D / 32; k++) ldsm4(qa[k], Qs + (16 * pr + (lane & 15)) * RS + 16 * (half * (D / 32) + k) + 8 * (lane >> 4));
    const size_t base = (size_t)tile.seq * seq_stride + (size_t)(kvh * D);
    /* three stages: block kb's, the next one's in flight, and the one fetched into the stage
     * block kb - AM_KB left, which every warp is done with once it passes this block's first
     * barrier: one block barrier a block, and the pair's own for the half-scores */
    am_fetch<D, AM_TP>(stg, K0, V0, base, Hkv, 0, (int)min((int64_t)AM_KB, last + 1));
    if (AM_KB <= last) am_fetch<D, AM_TP>(stg + C::STAGE, K0, V0, base, Hkv, AM_KB, (int)min((int64_t)AM_KB, last + 1 - AM_KB));
    else cp_commit();
    int buf = 0;
    /* the segment [k_lo, k_lo + seg) holding block kb, followed by sums (seg is whole blocks):
     * a 64-bit remainder a block cost more issued instructions than the block's softmax */
    int64_t k_lo = 0;
    for (int64_t kb = 0; kb <= last; kb += AM_KB, buf = buf == 2 ? 0 : buf + 1) {
        if (kb == k_lo && !(AMUT(2) && kb > 0)) { /* a segment starts */
#pragma unroll
            for (int i = 0; i < 2; i++) m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
        }
        cp_wait<1>();
        __syncthreads(); /* this block's K and V, every thread's copies (and Qs the first time); the last block's stage and Sx read */
        if (kb + 2 * AM_KB <= last)
            am_fetch<D, AM_TP>(stg + (buf == 0 ? 2 : buf - 1) * C::STAGE, K0, V0, base, Hkv, kb + 2 * AM_KB,
                               (int)min((int64_t)AM_KB, last + 1 - kb - 2 * AM_KB));
        else cp_commit();
        const uint16_t *Kb = stg + buf * C::STAGE;
        const bool live = kb < wend; /* the same for both warps of a pair */
        float mine[4][4];
        if (live) {
            am_qk_reg<D>(qa, Kb, half * (D / 32), mine);
#pragma unroll
            for (int j = 0; j < 4; j++) Sx[tid * (C::SX_FLOATS / 4) + j] = make_float4(mine[j][0], mine[j][1], mine[j][2], mine[j][3]);
        }
        pair_sync(pr); /* the pair's half-scores */
        if (live) {
            float other[4][4], S[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float4 x = Sx[mate * (C::SX_FLOATS / 4) + j];
                other[j][0] = x.x, other[j][1] = x.y, other[j][2] = x.z, other[j][3] = x.w;
            }
            if (half == 0) am_sum(S, mine, other);
            else am_sum(S, other, mine);
            am_step<D, NT>(S, Kb + AM_KB * RS, half * (D / 2), kb, kend, scale, m, l, o);
        }
        const bool seg_end = kb + AM_KB == k_lo + seg;
        if (seg_end || kb + AM_KB > last) am_fold_seg<NT, AM_TP>(kend, k_lo, m, l, o, M, L, Of + tid); /* the segment ends */
        if (seg_end) k_lo += seg;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int v = 16 * pr + (lane >> 2) + 8 * i;
        if (v >= nv) continue;
        const int64_t r = tile.r0 + v / G, h = kvh * G + v % G;
        const float *gate = qf + r * 2 * H * D + h * 2 * D + D;
        float *out = ao + r * H * D + h * D;
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = half * (D / 2) + 8 * t + 2 * (lane & 3) + e;
                out[d] = am_out(Of[(4 * t + 2 * i + e) * AM_TP + tid], L[i], gate[d]);
            }
    }
}

// The prompt kernel's whole form: the same grid and arithmetic as attn_mma_tile_kernel, tiles
// of 16 W vectors, W warps; a warp holds its 16 vectors' scores and every output dim: it makes
// both halves of a score itself, as the decode form does (am_qk over the low, then the high
// 16-wide steps, added once by am_sum), so the pairs' exchange through shared memory, their
// barrier and the second warp's copy of the softmax are gone; o holds D/8 n-tiles. Every sum
// is the pair form's in the same order, so the bits are the same (test_attn_emu checks that
// under the emulation, test_cuda on a GPU). Q stays in shared memory (a warp reads its
// fragments each block): held in registers beside o it would not fit. Folded outputs take
// D/2 floats a thread of shared memory, so W is at most 6 (with two stages).
//
// SPLIT (attn_mma_whole_split_kernel): grid (tiles, Hkv, n_seg), the CTA of segment s walks
// only that segment's keys [s seg, min((s + 1) seg, last + 1)) of the tile, from m = -inf,
// l = 0, o = 0 as the whole form starts every segment, over the same blocks with the same
// per-vector key ends, and writes each vector's (o, m, l) of the segment into part where the
// decode form writes it, instead of folding it: attn_fold_rows_kernel then folds the segments
// in order with the same am_fold_w / am_fold_o. So the split form gives the whole form's bits
// by construction, with n_seg times the CTAs for the passes of few tiles at depth (a short
// prompt after 40k rows: 2 CTAs of the whole form walk every key serially).
template <int D, int W, bool SPLIT>
__device__ __forceinline__ void am_whole(const float *qf, const hk_qtile *tiles, int n_tiles, int64_t H, int64_t Hkv,
                                         const uint16_t *K0, const uint16_t *V0, size_t seq_stride, int64_t seg,
                                         int64_t n_seg, float *part, float *ao) {
    pdl_enter();
    using C = am_cfg<D>;
    constexpr int NT = D / 8, RS = C::RS, OW = C::OW_FLOATS, NTH = 32 * W, QV = 16 * W, NS = SPLIT ? 3 : C::whole_stages(W);
    HK_DYN_SMEM(sm);
    uint16_t *Qs = (uint16_t *)sm, *stg = Qs + QV * RS;
    float *Of = (float *)(stg + NS * C::STAGE); /* thread t's folded output i at Of[i NTH + t] (the whole form) */
    const hk_qtile tile = tiles[n_tiles - 1 - (int)blockIdx.x];
    if (tile.n == 1) return;
    const int64_t kvh = blockIdx.y, last = tile.pos0 + tile.n - 1;
    /* the keys the CTA walks, [k0, kstop): every key up to the tile's last row, or (SPLIT)
     * segment s's (none when it starts past the last row) */
    const int64_t s = SPLIT ? (int64_t)blockIdx.z : 0, k0 = s * seg, kstop = SPLIT ? min(k0 + seg, last + 1) : last + 1;
    if (SPLIT && k0 > last) return;
    const int G = (int)(H / Hkv), nv = tile.n * G, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < QV * (D / 4); i += NTH) {
        const int v = i / (D / 4), d4 = i % (D / 4);
        float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (v < nv) q = ((const float4 *)(qf + (int64_t)(tile.r0 + v / G) * 2 * H * D + (kvh * G + v % G) * 2 * D))[d4];
        uint16_t *d = Qs + v * RS + 4 * d4;
        d[0] = am_h(q.x), d[1] = am_h(q.y), d[2] = am_h(q.z), d[3] = am_h(q.w);
    }
    int64_t kend[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int v = 16 * warp + (lane >> 2) + 8 * i;
        kend[i] = v < nv ? (AMUT(1) ? last + 1 : tile.pos0 + v / G + 1) : 0;
    }
    const int vlast = min(nv, 16 * warp + 16) - 1; /* the warp's last live vector: its keys end the warp's */
    const int64_t wend = 16 * warp < nv ? tile.pos0 + vlast / G + 1 : 0;
    const float scale = am_scale(D);
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f}, m[2], l[2], o[NT][4];
    if (!SPLIT)
        for (int i = 0; i < OW; i++) Of[i * NTH + tid] = 0.0f;
    const uint16_t *Qw = Qs + 16 * warp * RS;
    const size_t base = (size_t)tile.seq * seq_stride + (size_t)(kvh * D);
    am_fetch<D, NTH>(stg, K0, V0, base, Hkv, k0, (int)min((int64_t)AM_KB, kstop - k0));
    if (NS == 3) {
        if (k0 + AM_KB < kstop) am_fetch<D, NTH>(stg + C::STAGE, K0, V0, base, Hkv, k0 + AM_KB, (int)min((int64_t)AM_KB, kstop - k0 - AM_KB));
        else cp_commit();
    }
    int buf = 0;
    int64_t k_lo = k0;
    for (int64_t kb = k0; kb < kstop; kb += AM_KB, buf = buf == NS - 1 ? 0 : buf + 1) {
        if (kb == k_lo && !(AMUT(2) && kb > k0)) {
#pragma unroll
            for (int i = 0; i < 2; i++) m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
        }
        if (NS == 3) { /* block kb's stage, the next one's in flight, the one two back refilled */
            cp_wait<1>();
            __syncthreads(); /* this block's K and V (and Qs the first time); the stage two blocks back free */
            if (kb + 2 * AM_KB < kstop)
                am_fetch<D, NTH>(stg + (buf == 0 ? 2 : buf - 1) * C::STAGE, K0, V0, base, Hkv, kb + 2 * AM_KB,
                                 (int)min((int64_t)AM_KB, kstop - kb - 2 * AM_KB));
            else cp_commit();
        } else { /* two stages: block kb's, and the next one's fetched while kb is worked */
            cp_wait<0>();
            __syncthreads(); /* this block's K and V (and Qs the first time); the other stage free */
            if (kb + AM_KB < kstop)
                am_fetch<D, NTH>(stg + (buf ^ 1) * C::STAGE, K0, V0, base, Hkv, kb + AM_KB, (int)min((int64_t)AM_KB, kstop - kb - AM_KB));
        }
        const uint16_t *Kb = stg + buf * C::STAGE;
        if (kb < wend) {
            float lo[4][4], hi[4][4], S[4][4];
            am_qk<D>(Qw, Kb, 0, lo);
            am_qk<D>(Qw, Kb, D / 32, hi);
            am_sum(S, lo, hi);
            am_step<D, NT>(S, Kb + AM_KB * RS, 0, kb, kend, scale, m, l, o);
        }
        const bool seg_end = kb + AM_KB == k_lo + seg;
        if (!SPLIT && (seg_end || kb + AM_KB >= kstop)) am_fold_seg<NT, NTH>(kend, k_lo, m, l, o, M, L, Of + tid);
        if (seg_end) k_lo += seg;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int v = 16 * warp + (lane >> 2) + 8 * i;
        if (v >= nv) continue;
        const int64_t r = tile.r0 + v / G, h = kvh * G + v % G;
        if (SPLIT) { /* the segment's partial, where the decode form puts it; none for a vector without keys in it */
            if (kend[i] <= k0 || (AMUT(16) && kstop == last + 1)) continue;
            float *pp = part + ((r * H + h) * n_seg + s) * PART(D);
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 2; e++) pp[8 * t + 2 * (lane & 3) + e] = o[t][2 * i + e];
            if ((lane & 3) == 0) pp[D] = m[i], pp[D + 1] = l[i];
            continue;
        }
        const float *gate = qf + r * 2 * H * D + h * 2 * D + D;
        float *out = ao + r * H * D + h * D;
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = 8 * t + 2 * (lane & 3) + e;
                out[d] = am_out(Of[(4 * t + 2 * i + e) * NTH + tid], L[i], gate[d]);
            }
    }
}
template <int D, int W>
__global__ void __launch_bounds__(32 * W) attn_mma_whole_kernel(const float *qf, const hk_qtile *tiles, int n_tiles, int64_t H,
                                                               int64_t Hkv, const uint16_t *K0, const uint16_t *V0,
                                                               size_t seq_stride, int64_t seg, float *ao) {
    am_whole<D, W, false>(qf, tiles, n_tiles, H, Hkv, K0, V0, seq_stride, seg, 1, nullptr, ao);
}
// the split form: grid (tiles, Hkv, n_seg), 32 W threads, am_cfg<D>::whole_split_bytes(W)
// of shared memory; the multi-row tiles' partials into part (one-row tiles return: the decode
// form's), for attn_fold_rows_kernel
template <int D, int W>
__global__ void __launch_bounds__(32 * W) attn_mma_whole_split_kernel(const float *qf, const hk_qtile *tiles, int n_tiles,
                                                                     int64_t H, int64_t Hkv, const uint16_t *K0,
                                                                     const uint16_t *V0, size_t seq_stride, int64_t seg,
                                                                     int64_t n_seg, float *part) {
    am_whole<D, W, true>(qf, tiles, n_tiles, H, Hkv, K0, V0, seq_stride, seg, n_seg, part, nullptr);
}

// the decode form: grid (tiles, Hkv, n_seg), AM_T threads, for the one-row tiles (others
// return): segment blockIdx.z of the row's keys, its G vectors in one warp's 16 (the rest
// zero); every warp makes both halves of the scores, the same sums, and the output dims
// [D/4 w, D/4 (w + 1)). Writes (o, m, l) per (row, head, segment) into part as attn.cu's
// kernels lay it out.
template <int D>
__global__ void __launch_bounds__(AM_T) attn_mma_split_kernel(const float *qf, const hk_qtile *tiles, int64_t H, int64_t Hkv,
                                                              const uint16_t *K0, const uint16_t *V0, size_t seq_stride,
                                                              int64_t seg, int64_t n_seg, float *part) {
    pdl_enter();
    using C = am_cfg<D>;
    constexpr int NT = D / 32, RS = C::RS;
    HK_DYN_SMEM(sm);
    uint16_t *Qs = (uint16_t *)sm, *stg = Qs + 16 * RS;
    const hk_qtile tile = tiles[blockIdx.x];
    const int64_t s = blockIdx.z, P = tile.pos0, k_lo = s * seg;
    if (tile.n != 1 || k_lo > P) return;
    const int64_t k_hi = min(k_lo + seg, P + 1), kvh = blockIdx.y;
    const int G = (int)(H / Hkv), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, d0 = AMUT(4) ? 0 : warp * (D / 4);
    for (int i = tid; i < 16 * (D / 4); i += AM_T) {
        const int v = i / (D / 4), d4 = i % (D / 4);
        float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (v < G) q = ((const float4 *)(qf + (int64_t)tile.r0 * 2 * H * D + (kvh * G + v) * 2 * D))[d4];
        uint16_t *d = Qs + v * RS + 4 * d4;
        d[0] = am_h(q.x), d[1] = am_h(q.y), d[2] = am_h(q.z), d[3] = am_h(q.w);
    }
    int64_t kend[2];
#pragma unroll
    for (int i = 0; i < 2; i++) kend[i] = (lane >> 2) + 8 * i < G ? P + 1 : 0;
    const float scale = am_scale(D);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    const size_t base = (size_t)tile.seq * seq_stride + (size_t)(kvh * D);
    am_fetch<D, AM_T>(stg, K0, V0, base, Hkv, k_lo, (int)min((int64_t)AM_KB, k_hi - k_lo));
    int buf = 0;
    for (int64_t kb = k_lo; kb < k_hi; kb += AM_KB, buf ^= 1) {
        if (kb + AM_KB < k_hi) am_fetch<D, AM_T>(stg + (buf ^ 1) * C::STAGE, K0, V0, base, Hkv, kb + AM_KB, (int)min((int64_t)AM_KB, k_hi - kb - AM_KB));
        else cp_commit();
        cp_wait<1>();
        __syncthreads();
        const uint16_t *Kb = stg + buf * C::STAGE;
        float lo[4][4], hi[4][4], S[4][4];
        am_qk<D>(Qs, Kb, 0, lo);
        am_qk<D>(Qs, Kb, D / 32, hi);
        am_sum(S, lo, hi);
        am_step<D, NT>(S, Kb + AM_KB * RS, d0, kb, kend, scale, m, l, o);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int v = (lane >> 2) + 8 * i;
        if (v >= G) continue;
        float *pp = part + (((int64_t)tile.r0 * H + kvh * G + v) * n_seg + s) * PART(D);
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 2; e++) pp[d0 + 8 * t + 2 * (lane & 3) + e] = o[t][2 * i + e];
        if (warp == 0 && (lane & 3) == 0) pp[D] = m[i], pp[D + 1] = l[i];
    }
}

// thread d of head blockIdx.x: row r's partials of segments [0, ns) folded in order with
// am_fold (the prompt kernel's arithmetic; last_first: the fold_rows defect, last segment
// first), the output as am_out into ao; rounded into a as attn_merge_kernel does where a is set
__device__ __forceinline__ void am_fold_row(const float *qf, int64_t H, int64_t D, int64_t n_seg, const float *part, float *ao,
                                            const hk_act &a, int64_t r, int64_t ns, bool last_first) {
    const int64_t h = blockIdx.x, d = threadIdx.x;
    const float *pp = part + ((r * H + h) * n_seg) * PART(D);
    float M = -INFINITY, L = 0.0f, O = 0.0f;
    for (int64_t i = 0; i < ns; i++) {
        const int64_t s = last_first ? ns - 1 - i : i;
        float wa, wb;
        am_fold_w(M, L, pp[s * PART(D) + D], pp[s * PART(D) + D + 1], wa, wb);
        O = am_fold_o(O, pp[s * PART(D) + d], wa, wb);
    }
    const float val = am_out(O, L, qf[r * 2 * H * D + h * 2 * D + D + d]);
    ao[r * H * D + h * D + d] = val;
    if (a.q) merge_round(a, r, h, D, val);
}

// grid (H, tiles), D threads: a one-row tile's head, its segments [0, pos / seg] folded in
// order with am_fold (the prompt kernel's arithmetic), the output as am_out; rounded into a
// as attn_merge_kernel does where a is set
__global__ void attn_fold_kernel(const float *qf, const hk_qtile *tiles, int64_t H, int64_t D, int64_t seg, int64_t n_seg,
                                 const float *part, float *ao, hk_act a) {
    pdl_enter();
    const hk_qtile tile = tiles[blockIdx.y];
    if (tile.n != 1) return;
    am_fold_row(qf, H, D, n_seg, part, ao, a, tile.r0, tile.pos0 / seg + 1, false);
}


// grid (H, n), D threads: the split form's fold (every row of the pass has its partials in
// part: the multi-row tiles' from attn_mma_whole_split_kernel, the one-row tiles' from
// attn_mma_split_kernel): row r's head, its segments [0, pos[r] / seg] folded in order with
// attn_fold_kernel's arithmetic (so the whole form's), the output as am_out; rounded into a
// as attn_merge_kernel does where a is set
__global__ void attn_fold_rows_kernel(const float *qf, const int64_t *pos, int64_t H, int64_t D, int64_t seg, int64_t n_seg,
                                      const float *part, float *ao, hk_act a) {
    pdl_enter();
    const int64_t r = blockIdx.y;
    am_fold_row(qf, H, D, n_seg, part, ao, a, r, pos[r] / seg + 1, AMUT(8));
}

#endif
