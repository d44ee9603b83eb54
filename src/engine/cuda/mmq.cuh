// mmq.cuh: the prompt rows' quantized products on int8 tensor cores (mmq_kernel; mmq.cu
// launches it): tiles of 64 outputs x 8 NT input rows, dense or an expert's pairs. Device
// code only, so that tests/unit/test_mmq_emu.cc runs the same kernel on the CPU under
// tests/unit/cuda_emu.h (which emulates mma_k32, mma_k16, mq_ldsm4 and the cp.async copies).
//
// Per 256-block of a K-quant the integer sums are exact whichever way they are formed, and
// the block is finished with quant_dot_ref's float expression (term_kmin, term_k6,
// term_q80) and added to the row's sum in block order: a row's bits do not depend on the
// tile, the form or what shared its tile (gemv.cuh's one-row path gives the same).
//
// Two forms of the Q4_K / Q5_K block (NF): the first (NF false) unpacks each sub-block's
// 6-bit scale and min per lane from bytes and forms the mins' sum sum_j m_j s_j (s_j: the
// input row's sum over sub-block j) with eight multiply-adds per output; the second reads
// the weights' and the inputs' fragments with ldmatrix, unpacks the scales as whole words,
// and forms the mins' sum on the tensor cores too: s_j = 128 a_j + b_j with a_j in
// [-32, 31] and b_j in [0, 127] (|s_j| <= 32 x 127), both int8, so sum_j m_j s_j =
// 128 (m . a) + (m . b), two m16n8k16 products over k = j (the upper 8 of the 16 zero).
// The same integers, so the same bits; fewer instructions per tensor-core step.
#ifndef HEARTH_CUDA_MMQ_CUH
#define HEARTH_CUDA_MMQ_CUH

#include <stdint.h>

#include "engine/cuda/warp.cuh"
#include "engine/cuda/gemv.cuh"

// planted defects, only under tests/unit/test_mmq_emu.cc: 1 the new form's mins' sum
// without its 128 (a_j taken as a_j / 128); 2 the new form's scales of sub-blocks 4..7
// without their high bits
#ifndef QMUT
#define QMUT(bit) 0
#endif

#ifndef HEARTH_CUDA_EMU_H
// cp.async: 16 or 4 bytes from global to shared memory without a register on the way; a
// thread's copies since its last commit form a group, and wait_group N returns once at most N
// of its groups are still in flight
__device__ __forceinline__ void cp16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp4(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// mma.sync m16n8k32 / m16n8k16, s8 x s8 -> s32 (PTX ISA's fragments: A rows g and g+8 of
// the 16, k 4t..4t+3 (and 16+4t..); B column g, the same k; C rows g, g+8, columns 2t, 2t+1;
// g = lane / 4, t = lane % 4)
__device__ __forceinline__ void mma_k32(int c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_k16(int c[4], const uint32_t a[2], uint32_t b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b));
}
// four 8x8 matrices of 16-bit pairs (here: 8 rows of 16 bytes each) from shared memory, lanes
// 8i..8i+7 giving matrix i's row addresses; r[i] of lane l: matrix i's row l / 4, bytes
// 4 (l % 4) .. + 3, which is an int8 A or B fragment's register
__device__ __forceinline__ void mq_ldsm4(uint32_t r[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
#else
inline void cp4(void *smem, const void *gmem) { memcpy(smem, gmem, 4); }
inline void cp_wait1() {}
inline void mq_ldsm4(uint32_t r[4], const void *p) { ldsm4(r, p); }
#endif



#define MM_BM 64   /* outputs per tile: 16 per warp */
#define MM_XS 272  /* bytes per input row in shared memory: 256 + 16, so the 8 rows of a fragment hit 8 bank quads */

// a tile's weight bytes per output row per 256 inputs, and their stride in shared memory
template <int T> struct mq {
    static constexpr int WB = T == QT_Q4_K ? 144 : T == QT_Q5_K ? 176 : T == QT_Q6_K ? 208 : 256;
    static constexpr int WS = T == QT_Q8_0 ? 272 : WB;  /* Q8_0's 256 would put the 8 rows on one bank */
};
template <int T, int NT> struct mq_smem {
    static constexpr int BN = 8 * NT;
    static constexpr int W = MM_BM * mq<T>::WS, X = BN * MM_XS, S = BN * 8 * 4, D = BN * 8 * 4;
    static constexpr int STAGE = W + X + S + D;
    static constexpr int TOTAL = 2 * STAGE + 2 * BN * 4;
};

// Tile of 64 outputs (blockIdx.x) x BN = 8 NT input rows (blockIdx.y): dense, rows y..y+BN
// of n; or an expert tile (tiles set: entry blockIdx.y of hk_moe_sort's table, pairs
// list[first..] of expert e, input rows pair / in_div, output rows the pairs). Two stages
// of shared memory filled by cp.async, one 256-block of K per stage. NF: the second form of
// the Q4_K / Q5_K block (the header); the other types have one form.
// MB: the blocks an SM the launch bounds ask room for (registers capped at 65536 / (128 MB));
// 1 leaves them uncapped (194 registers at NT = 8: two blocks an SM, 8 warps, latency-bound
// by ncu on an H100). The code is the same, so the bits are.
template <int T, int NT, bool NF, int MB = 1>
__global__ void __launch_bounds__(128, MB) mmq_kernel(hk_w w, hk_act a, int64_t n, const int32_t *offs, const int32_t *list,
                                                  const int32_t *tiles, int in_div, float *y, int64_t ys, bool add) {
    pdl_enter();
    HK_DYN_SMEM(smem_f);
    uint8_t *smem = (uint8_t *)smem_f;
    using L = mq_smem<T, NT>;
    constexpr int BN = L::BN, WB = mq<T>::WB, WS = mq<T>::WS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int32_t *arow = (int32_t *)(smem + 2 * L::STAGE), *orow = arow + BN;
    const uint8_t *W = (const uint8_t *)w.d;
    const uint16_t *DD = w.dd;
    int cnt;
    if (tiles) {
        if ((int)blockIdx.y >= tiles[0]) return;
        const int ex = tiles[1 + 2 * blockIdx.y], first = tiles[2 + 2 * blockIdx.y];
        cnt = min(BN, offs[ex + 1] - first);
        W += (size_t)ex * w.slice_bytes;
        if (DD) DD += (size_t)ex * w.dd_slice;
        for (int i = tid; i < BN; i += 128) {
            const int p = list[first + min(i, cnt - 1)];
            arow[i] = p / in_div;
            orow[i] = p;
        }
    } else {
        const int64_t t0 = (int64_t)blockIdx.y * BN;
        cnt = (int)min((int64_t)BN, n - t0);
        for (int i = tid; i < BN; i += 128) arow[i] = orow[i] = (int32_t)(t0 + min(i, cnt - 1));
    }
    __syncthreads();
    const int64_t K = w.K, nkb = K / 256, o0 = (int64_t)blockIdx.x * MM_BM;

    auto load = [&](int s, int64_t kb) {
        uint8_t *Ws = smem + s * L::STAGE, *Xs = Ws + L::W;
        int32_t *Ss = (int32_t *)(Xs + L::X);
        float *Ds = (float *)((uint8_t *)Ss + L::S);
        for (int i = tid; i < MM_BM * (WB / 16); i += 128) {
            const int r = i / (WB / 16), ch = i % (WB / 16);
            const int64_t o = min(o0 + r, w.M - 1);
            cp16(Ws + r * WS + 16 * ch, W + (size_t)o * w.row_bytes + (size_t)kb * WB + 16 * ch);
        }
        for (int i = tid; i < BN * 16; i += 128) {
            const int r = i >> 4, ch = i & 15;
            cp16(Xs + r * MM_XS + 16 * ch, a.q + (int64_t)arow[r] * K + kb * 256 + 16 * ch);
        }
        if (T == QT_Q4_K || T == QT_Q5_K)
            for (int i = tid; i < BN * 2; i += 128) {
                const int r = i >> 1, ch = i & 1;
                cp16(Ss + r * 8 + 4 * ch, a.s + (int64_t)arow[r] * (K / 32) + kb * 8 + 4 * ch);
            }
        if (T == QT_Q8_0)
            for (int i = tid; i < BN * 2; i += 128) {
                const int r = i >> 1, ch = i & 1;
                cp16(Ds + r * 8 + 4 * ch, a.d + (int64_t)arow[r] * (K / 32) + kb * 8 + 4 * ch);
            }
        else
            for (int i = tid; i < BN; i += 128) cp4(Ds + i * 8, a.d + (int64_t)arow[i] * (K / 256) + kb);
    };

    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) acc[i][k] = 0.0f;
    const int gr0 = 16 * warp + g, gr1 = gr0 + 8;                 /* this thread's two rows in the tile */
    const int64_t go0 = min(o0 + gr0, w.M - 1), go1 = min(o0 + gr1, w.M - 1);

    load(0, 0);
    cp_commit();
    for (int64_t kb = 0; kb < nkb; kb++) {
        if (kb + 1 < nkb) load((int)((kb + 1) & 1), kb + 1);
        cp_commit();
        cp_wait1();
        __syncthreads();
        const uint8_t *Ws = smem + (kb & 1) * L::STAGE, *Xs = Ws + L::W;
        const int32_t *Ss = (const int32_t *)(Xs + L::X);
        const float *Ds = (const float *)((const uint8_t *)Ss + L::S);
        const uint8_t *b0 = Ws + gr0 * WS, *b1 = Ws + gr1 * WS;
        if (NF && (T == QT_Q4_K || T == QT_Q5_K)) {
            constexpr int QS = T == QT_Q4_K ? 16 : 48;
            // ldmatrix rows: the weights' matrix i = lane / 8 is rows 16 warp + 8 (i & 1) .. + 7,
            // bytes 16 (i >> 1) .. + 15 of a 32-byte group (A's a[i]); the inputs' matrix i is
            // rows 8 nt .. + 7, bytes 16 (i & 1) of sub-block 2 jp + (i >> 1) (B's b[0], b[1] of
            // sub-block 2 jp, then of 2 jp + 1)
            const uint8_t *wl = Ws + (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * WS + 16 * (lane >> 4);
            const uint8_t *xl = Xs + (lane & 7) * MM_XS + 16 * ((lane >> 3) & 1) + 32 * (lane >> 4);
            // the 6-bit scales and mins of rows gr0, gr1 as bytes of words (sub-blocks 0..3, 4..7)
            uint32_t scw[2][2], mnw[2][2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint8_t *sp = (r ? b1 : b0) + 4;
                const uint32_t w0 = ld32(sp), w1 = ld32(sp + 4), w2 = ld32(sp + 8);
                scw[r][0] = w0 & 0x3F3F3F3Fu;
                scw[r][1] = (w2 & 0x0F0F0F0Fu) | (QMUT(2) ? 0u : (w0 >> 2) & 0x30303030u);
                mnw[r][0] = w1 & 0x3F3F3F3Fu;
                mnw[r][1] = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
            }
            // A of the mins' product: k = j, lanes t = 0, 1 hold j 0..3, 4..7; t = 2, 3 zero
            const uint32_t am[2] = {t == 0 ? mnw[0][0] : t == 1 ? mnw[0][1] : 0u, t == 0 ? mnw[1][0] : t == 1 ? mnw[1][1] : 0u};
            uint32_t qh[4] = {0u, 0u, 0u, 0u};
            if (T == QT_Q5_K) mq_ldsm4(qh, wl + 16); /* the fifth bits: rows' bytes 16..47 */
            int sumi[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int k = 0; k < 4; k++) sumi[nt][k] = 0;
#pragma unroll
            for (int jp = 0; jp < 4; jp++) { /* sub-blocks 2 jp and 2 jp + 1: one 32-byte group */
                uint32_t q[4], af[2][4];
                mq_ldsm4(q, wl + QS + 32 * jp);
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        af[h][k] = (q[k] >> (4 * h)) & 0x0F0F0F0Fu;
                        if (T == QT_Q5_K) af[h][k] |= ((qh[k] >> (2 * jp + h)) & 0x01010101u) << 4;
                    }
                const int s00 = (int)((scw[0][jp >> 1] >> (16 * (jp & 1))) & 0xFFu), s01 = (int)((scw[0][jp >> 1] >> (16 * (jp & 1) + 8)) & 0xFFu);
                const int s10 = (int)((scw[1][jp >> 1] >> (16 * (jp & 1))) & 0xFFu), s11 = (int)((scw[1][jp >> 1] >> (16 * (jp & 1) + 8)) & 0xFFu);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    uint32_t bx[4];
                    mq_ldsm4(bx, xl + 8 * nt * MM_XS + 64 * jp);
                    int c[4] = {0, 0, 0, 0}, e[4] = {0, 0, 0, 0};
                    mma_k32(c, af[0], bx);
                    mma_k32(e, af[1], bx + 2);
                    sumi[nt][0] += s00 * c[0] + s01 * e[0], sumi[nt][1] += s00 * c[1] + s01 * e[1];
                    sumi[nt][2] += s10 * c[2] + s11 * e[2], sumi[nt][3] += s10 * c[3] + s11 * e[3];
                }
            }
            const float dw0 = __half2float(__ushort_as_half(*(const uint16_t *)b0));
            const float dm0 = __half2float(__ushort_as_half(*(const uint16_t *)(b0 + 2)));
            const float dw1 = __half2float(__ushort_as_half(*(const uint16_t *)b1));
            const float dm1 = __half2float(__ushort_as_half(*(const uint16_t *)(b1 + 2)));
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                // the mins' sum: B is column 8 nt + g's sums s_j, j = 4 t .. 4 t + 3 (t < 2)
                const int4 sv = *(const int4 *)(Ss + (8 * nt + g) * 8 + 4 * (t & 1));
                const int sj[4] = {sv.x, sv.y, sv.z, sv.w};
                uint32_t ba = 0u, bb = 0u;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    ba |= ((uint32_t)(sj[i] >> 7) & 0xFFu) << (8 * i);
                    bb |= ((uint32_t)sj[i] & 0x7Fu) << (8 * i);
                }
                if (t >= 2) ba = bb = 0u;
                int summ[4] = {0, 0, 0, 0};
                mma_k16(summ, am, ba);
#pragma unroll
                for (int k = 0; k < 4; k++) summ[k] *= QMUT(1) ? 1 : 128;
                mma_k16(summ, am, bb);
                const int ta = 8 * nt + 2 * t;
                const float da = Ds[ta * 8], db = Ds[(ta + 1) * 8];
                acc[nt][0] = FADD(acc[nt][0], term_kmin(da, dw0, dm0, sumi[nt][0], summ[0]));
                acc[nt][1] = FADD(acc[nt][1], term_kmin(db, dw0, dm0, sumi[nt][1], summ[1]));
                acc[nt][2] = FADD(acc[nt][2], term_kmin(da, dw1, dm1, sumi[nt][2], summ[2]));
                acc[nt][3] = FADD(acc[nt][3], term_kmin(db, dw1, dm1, sumi[nt][3], summ[3]));
            }
        } else if (T == QT_Q4_K || T == QT_Q5_K) {
            constexpr int QS = T == QT_Q4_K ? 16 : 48;
            int sc0[8], m0[8], sc1[8], m1[8];
#pragma unroll
            for (int j = 0; j < 8; j++) scale_min(j, b0 + 4, &sc0[j], &m0[j]), scale_min(j, b1 + 4, &sc1[j], &m1[j]);
            int sumi[NT][4], summ[NT][4];
#pragma unroll
            for (int i = 0; i < NT; i++)
#pragma unroll
                for (int k = 0; k < 4; k++) sumi[i][k] = 0, summ[i][k] = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int off = QS + (j >> 1) * 32 + 4 * t, sh = (j & 1) * 4;
                uint32_t af[4] = {(ld32(b0 + off) >> sh) & 0x0F0F0F0Fu, (ld32(b1 + off) >> sh) & 0x0F0F0F0Fu,
                                  (ld32(b0 + off + 16) >> sh) & 0x0F0F0F0Fu, (ld32(b1 + off + 16) >> sh) & 0x0F0F0F0Fu};
                if (T == QT_Q5_K) {
                    af[0] |= ((ld32(b0 + 16 + 4 * t) >> j) & 0x01010101u) << 4;
                    af[1] |= ((ld32(b1 + 16 + 4 * t) >> j) & 0x01010101u) << 4;
                    af[2] |= ((ld32(b0 + 32 + 4 * t) >> j) & 0x01010101u) << 4;
                    af[3] |= ((ld32(b1 + 32 + 4 * t) >> j) & 0x01010101u) << 4;
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint8_t *xb = Xs + (8 * nt + g) * MM_XS + 32 * j + 4 * t;
                    const uint32_t bf[2] = {ld32(xb), ld32(xb + 16)};
                    int c[4] = {0, 0, 0, 0};
                    mma_k32(c, af, bf);
                    const int ta = 8 * nt + 2 * t, sa = Ss[ta * 8 + j], sb = Ss[(ta + 1) * 8 + j];
                    sumi[nt][0] += sc0[j] * c[0], sumi[nt][1] += sc0[j] * c[1];
                    sumi[nt][2] += sc1[j] * c[2], sumi[nt][3] += sc1[j] * c[3];
                    summ[nt][0] += m0[j] * sa, summ[nt][1] += m0[j] * sb;
                    summ[nt][2] += m1[j] * sa, summ[nt][3] += m1[j] * sb;
                }
            }
            const float dw0 = __half2float(__ushort_as_half(*(const uint16_t *)b0));
            const float dm0 = __half2float(__ushort_as_half(*(const uint16_t *)(b0 + 2)));
            const float dw1 = __half2float(__ushort_as_half(*(const uint16_t *)b1));
            const float dm1 = __half2float(__ushort_as_half(*(const uint16_t *)(b1 + 2)));
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int ta = 8 * nt + 2 * t;
                const float da = Ds[ta * 8], db = Ds[(ta + 1) * 8];
                acc[nt][0] = FADD(acc[nt][0], term_kmin(da, dw0, dm0, sumi[nt][0], summ[nt][0]));
                acc[nt][1] = FADD(acc[nt][1], term_kmin(db, dw0, dm0, sumi[nt][1], summ[nt][1]));
                acc[nt][2] = FADD(acc[nt][2], term_kmin(da, dw1, dm1, sumi[nt][2], summ[nt][2]));
                acc[nt][3] = FADD(acc[nt][3], term_kmin(db, dw1, dm1, sumi[nt][3], summ[nt][3]));
            }
        } else if (T == QT_Q6_K) {
            int sumi[NT][4];
#pragma unroll
            for (int i = 0; i < NT; i++)
#pragma unroll
                for (int k = 0; k < 4; k++) sumi[i][k] = 0;
#pragma unroll
            for (int s = 0; s < 16; s++) {
                const int half = s >> 3, quarter = (s >> 1) & 3, lh = s & 1;
                const int qlo = 64 * half + 32 * (quarter & 1) + 16 * lh + 4 * t, qho = 128 + 32 * half + 16 * lh + 4 * t;
                const int nsh = quarter >= 2 ? 4 : 0, hsh = 2 * quarter;
                const uint32_t af[2] = {q6_word(ld32(b0 + qlo), ld32(b0 + qho), nsh, hsh),
                                        q6_word(ld32(b1 + qlo), ld32(b1 + qho), nsh, hsh)};
                const int s0 = (int8_t)b0[192 + s], s1 = (int8_t)b1[192 + s];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint32_t bf = ld32(Xs + (8 * nt + g) * MM_XS + 16 * s + 4 * t);
                    int c[4] = {0, 0, 0, 0};
                    mma_k16(c, af, bf);
                    sumi[nt][0] += s0 * c[0], sumi[nt][1] += s0 * c[1];
                    sumi[nt][2] += s1 * c[2], sumi[nt][3] += s1 * c[3];
                }
            }
            const float dw0 = __half2float(__ushort_as_half(DD[go0 * w.dd_row + kb]));
            const float dw1 = __half2float(__ushort_as_half(DD[go1 * w.dd_row + kb]));
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int ta = 8 * nt + 2 * t;
                const float da = Ds[ta * 8], db = Ds[(ta + 1) * 8];
                acc[nt][0] = FADD(acc[nt][0], term_k6(da, dw0, sumi[nt][0]));
                acc[nt][1] = FADD(acc[nt][1], term_k6(db, dw0, sumi[nt][1]));
                acc[nt][2] = FADD(acc[nt][2], term_k6(da, dw1, sumi[nt][2]));
                acc[nt][3] = FADD(acc[nt][3], term_k6(db, dw1, sumi[nt][3]));
            }
        } else { /* Q8_0: eight 32-blocks per stage, each finished on its own, in order */
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int off = 32 * j + 4 * t;
                const uint32_t af[4] = {ld32(b0 + off), ld32(b1 + off), ld32(b0 + off + 16), ld32(b1 + off + 16)};
                const float dw0 = __half2float(__ushort_as_half(DD[go0 * w.dd_row + kb * 8 + j]));
                const float dw1 = __half2float(__ushort_as_half(DD[go1 * w.dd_row + kb * 8 + j]));
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint8_t *xb = Xs + (8 * nt + g) * MM_XS + off;
                    const uint32_t bf[2] = {ld32(xb), ld32(xb + 16)};
                    int c[4] = {0, 0, 0, 0};
                    mma_k32(c, af, bf);
                    const int ta = 8 * nt + 2 * t;
                    const float da = Ds[ta * 8 + j], db = Ds[(ta + 1) * 8 + j];
                    acc[nt][0] = FADD(acc[nt][0], term_q80(dw0, da, c[0]));
                    acc[nt][1] = FADD(acc[nt][1], term_q80(dw0, db, c[1]));
                    acc[nt][2] = FADD(acc[nt][2], term_q80(dw1, da, c[2]));
                    acc[nt][3] = FADD(acc[nt][3], term_q80(dw1, db, c[3]));
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int64_t o = o0 + (k < 2 ? gr0 : gr1);
            const int ti = 8 * nt + 2 * t + (k & 1);
            if (o < w.M && ti < cnt) {
                float *yp = y + (int64_t)orow[ti] * ys + o;
                *yp = add ? FADD(*yp, acc[nt][k]) : acc[nt][k];
            }
        }
}


#endif
