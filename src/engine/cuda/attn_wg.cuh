// attn_wg.cuh: the prompt attention's whole form on Hopper's warpgroup MMA (wgmma.mma_async,
// f16 operands, f32 accumulators), for the multi-row tiles of a pass with f16 KV rows. Device
// code only; also run on the CPU under tests/unit/cuda_emu.h (test_attn_emu), which emulates
// wgmma through the shared-memory descriptors below and the named barriers.
//
// The arithmetic is attn_mma.cuh's, step for step: a vector's keys cut into segments of seg
// and blocks of AM_KB by position; per block S = Q Kᵀ as two chains of 16-wide steps over the
// low and the high half of D, added once (am_sum); am_weigh's softmax and rescale; o += P V in
// two 16-key steps; each segment from m = -inf, l = 0, o = 0, folded in order with am_fold_w /
// am_fold_o. Only the instruction changes: a warpgroup's m64n32k16 for the scores (Q and K
// from shared memory) and m64nDk16 for P V (P from registers, in mma.sync's A layout; V from
// shared memory, read N-major), where the whole form issues mma.sync m16n8k16 per warp. A
// wgmma's accumulator rows 16 w .. 16 w + 15 are warp w's, laid out as mma.sync's C, so S and
// o are the arrays am_weigh already takes. That the two instructions give the same sums over
// the same k-steps is a fact of the GPU (an H100 gave them, fifteenth session); test_cuda's
// attn_matches_ref checks this form against the others bit for bit.
//
// A CTA: one tile of up to WG_QV vectors (8 rows of 8 heads), two warpgroups. Warpgroup g
// walks the tile's segments g, g + 2, ... as one stream of blocks (two K slots and two V
// slots of its own), pipelined inside itself as FlashAttention-3 does: block j + 1's scores
// are issued before block j's P V, and its softmax is made while P V runs; the two
// warpgroups overlap each other's softmax with their products too. Both fold into one O in
// shared memory, in segment order: named barrier 3 passes warpgroup 1 once warpgroup 0 has
// folded the segment before, barrier 4 the other way. Shared memory: Q (f16), the eight
// slots, O (f32), each vector's M and L, and up to 1,024 bytes to align the first: 232,448
// bytes at D = 256, an H100's most a block.
//
// Shared-memory layout of Q, K and V: PTX's 128-byte swizzle. A matrix of R rows (vectors or
// keys) of D halves is cut into columns of 64 halves (128 bytes); column a takes R x 128 bytes
// from a R 128, row r at r 128 inside it, and the row's 16-byte piece c (halves 8 c .. 8 c + 7
// of the column) at slot c ^ (r % 8): each 8 rows are a 1,024-byte atom, 1,024-aligned. As a
// K-major operand (Q, K: the scores' A and B) the stride offset steps 8 rows (1,024 bytes), the
// leading offset is unused, and a 16-wide k-step starts 32 bytes further in its row (the
// swizzle is of the address, so an offset start inside the atom reads the same slots); as an
// N-major B (V: keys are K, dims N) the leading offset steps a column (64 dims, R 128 bytes)
// and the stride offset 8 keys (1,024): PTX ISA, "Shared Memory Matrix Layout", canonical
// layouts with 128B swizzling. The fetch gives each 8 lanes one key's 128 contiguous bytes
// (4 whole sectors) and 8 distinct slots of one shared row (no bank conflict); without the
// swizzle, Nsight Compute on an H100 counted half the L2 sectors and two thirds of the shared
// wavefronts excess (bench/RESULTS.md, fifteenth session).
#ifndef HEARTH_CUDA_ATTN_WG_CUH
#define HEARTH_CUDA_ATTN_WG_CUH

#include "engine/cuda/attn_mma.cuh"
#ifndef HEARTH_CUDA_EMU_H
#include <cuda.h> /* CUtensorMap */
#endif

#ifndef HEARTH_CUDA_EMU_H
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// the generic proxy's shared-memory writes (cp.async, stores) made visible to wgmma's reads
__device__ __forceinline__ void async_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
// keeps the compiler from moving a read of an accumulator across a wgmma wait (or a write
// across its issue): the register passes through an opaque statement in order
__device__ __forceinline__ void wg_pin(float &x) { asm volatile("" : "+f"(x)::"memory"); }
// a shared-memory address (for the 1,024-byte alignment of the swizzle's atoms)
__device__ __forceinline__ uint32_t wg_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
// a shared-memory matrix descriptor: start address, leading and stride byte offsets (each
// >> 4, 14 bits), base offset 0 (the atoms 1,024-aligned), 128-byte swizzle (mode 1, bits 62-63)
__device__ __forceinline__ uint64_t wg_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    const uint32_t a = wg_saddr(p);
    return (uint64_t)((a >> 4) & 0x3FFF) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 | (uint64_t)((sbo >> 4) & 0x3FFF) << 32 |
           (uint64_t)1 << 62;
}

/* the accumulators' operand numbers: %0 .. %15, .. %63, .. %127 */
#define WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_R16                                                                                   \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "            \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "            \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_R64                                                                                   \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "            \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "            \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_ACC16 "{" WG_R0 "}"
#define WG_ACC64 "{" WG_R0 ", " WG_R16 "}"
#define WG_ACC128 "{" WG_R0 ", " WG_R16 ", " WG_R64 "}"

/* the operands "+f" of 4 accumulator rows of d (rows of 4 floats), then of 16 and 32 rows */
#define WG_OUT16(d)                                                                                                   \
    "+f"((d)[0][0]), "+f"((d)[0][1]), "+f"((d)[0][2]), "+f"((d)[0][3]), "+f"((d)[1][0]), "+f"((d)[1][1]),           \
        "+f"((d)[1][2]), "+f"((d)[1][3]), "+f"((d)[2][0]), "+f"((d)[2][1]), "+f"((d)[2][2]), "+f"((d)[2][3]),       \
        "+f"((d)[3][0]), "+f"((d)[3][1]), "+f"((d)[3][2]), "+f"((d)[3][3])
#define WG_SET16(d)                                                                                                   \
    "=f"((d)[0][0]), "=f"((d)[0][1]), "=f"((d)[0][2]), "=f"((d)[0][3]), "=f"((d)[1][0]), "=f"((d)[1][1]),           \
        "=f"((d)[1][2]), "=f"((d)[1][3]), "=f"((d)[2][0]), "=f"((d)[2][1]), "=f"((d)[2][2]), "=f"((d)[2][3]),       \
        "=f"((d)[3][0]), "=f"((d)[3][1]), "=f"((d)[3][2]), "=f"((d)[3][3])
#define WG_OUT64(d) WG_OUT16(d), WG_OUT16((d) + 4), WG_OUT16((d) + 8), WG_OUT16((d) + 12)
#define WG_OUT128(d) WG_OUT64(d), WG_OUT64((d) + 16)

// d (m64n32, f32) += A B: A (64 x 16) and B (16 x 32) from shared memory, both K-major
__device__ __forceinline__ void wg_n32(float (*d)[4], uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " WG_ACC16 ", %16, %17, 1, 1, 1, 0, 0;"
                 : WG_OUT16(d)
                 : "l"(da), "l"(db));
}
// d = A B, a chain's first step: scale-d 0 (d not read), so no 16 moves of zeros before it.
// The unit's sum of the step's 16 products is rounded once into d either way, and 0 + x is x
// (but for the sign of a zero sum, which no score's use sees: its max and exponential)
__device__ __forceinline__ void wg_n32z(float (*d)[4], uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " WG_ACC16 ", %16, %17, 0, 1, 1, 0, 0;"
                 : WG_SET16(d)
                 : "l"(da), "l"(db));
}
// o (m64nN, f32) = (acc ? o : 0) + A B: A (64 x 16) from registers (mma.sync's A fragment of
// the warp's 16 rows), B (16 x N) from shared memory, N-major. acc false (wgmma's scale-d 0, o
// not read) where a segment's first step sets o afresh, with no 128 moves of zeros before it:
// 0 + x is x in the unit's one rounding, but for the sign of a zero sum, which no fold keeps
// (am_fold_o adds the segment's o to an O that starts at +0, and +0 + -0 is +0)
template <int N> __device__ __forceinline__ void wg_pv(float (*o)[4], const uint32_t a[4], uint64_t db, bool acc);
template <> __device__ __forceinline__ void wg_pv<256>(float (*o)[4], const uint32_t a[4], uint64_t db, bool acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " WG_ACC128 ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}"
                 : WG_OUT128(o)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"((int)acc));
}
template <> __device__ __forceinline__ void wg_pv<128>(float (*o)[4], const uint32_t a[4], uint64_t db, bool acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_ACC64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"
                 : WG_OUT64(o)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"((int)acc));
}

// The tensor-memory-accelerator fetch (TMA): one thread of a warpgroup asks the copy engine
// for a box of a 2-D view of the cache (wg_map: halves x rows, made on the host by
// cuTensorMapEncodeTiled with the 128-byte swizzle, attn.cu), and it lands in shared memory in
// the layout above, counted on an mbarrier (arrive with the bytes expected, then a wait on the
// phase's parity). Rows past the view's end come as zeros.
typedef CUtensorMap wg_map;
__device__ __forceinline__ void mb_init(uint64_t *b, int n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(wg_saddr(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mb_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mb_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(wg_saddr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mb_wait(uint64_t *b, uint32_t parity) {
    uint32_t ok;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(ok)
                     : "r"(wg_saddr(b)), "r"(parity)
                     : "memory");
    } while (!ok);
}
// the box of 64 halves x AM_KB rows at (x halves, y rows) into dst (1,024-aligned), counted on b
__device__ __forceinline__ void tma_box(void *dst, const wg_map *m, int x, int y, uint64_t *b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
                     wg_saddr(dst)),
                 "l"((uint64_t)m), "r"(x), "r"(y), "r"(wg_saddr(b))
                 : "memory");
}
#endif

// a descriptor d moved on by h halves (h a multiple of 8: whole 16-byte steps): its start
// field is the address >> 4, and no shared address of a block passes 14 bits of it (256 KB),
// so the add never carries out of the field, nor out of d's low word: a 32-bit add. A tile
// works out its three descriptors once (wg_desc's shifts and masks) and each k-step's by one add.
__device__ __forceinline__ uint64_t wg_desc_add(uint64_t d, uint32_t h) {
    return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (h >> 3));
}

// a wgmma's A operand in registers is read while it runs: N words kept where they are (live,
// in order) until after the wait that ends it
template <int N> __device__ __forceinline__ void wg_pin_u(uint32_t *x) {
#pragma unroll
    for (int j = 0; j < N; j++) asm volatile("" : "+r"(x[j])::"memory");
}
// wg_pin over rows [0, R) of accumulators (rows of 4 floats)
template <int R> __device__ __forceinline__ void wg_pin_rows(float (*x)[4]) {
#pragma unroll
    for (int j = 0; j < R; j++) wg_pin(x[j][0]), wg_pin(x[j][1]), wg_pin(x[j][2]), wg_pin(x[j][3]);
}

#define WG_QV 64  /* query vectors of a tile: a warpgroup's M */
#define WG_T 256  /* threads: two warpgroups */
#define WG_NS 2   /* blocks a warpgroup holds: K and V slots of each */

template <int D> struct wg_cfg {
    static constexpr int Q_HALVES = WG_QV * D;
    static constexpr int STAGE = 2 * AM_KB * D; /* a block's K and V rows (in a K slot and a V slot) */
    static constexpr int O_FLOATS = WG_QV * D;  /* the folded outputs (the kernel's Of2: pairs a thread) */
    /* + M and L, + 1,024 for the atoms' alignment: 232,448 at D = 256, an H100's most */
    static constexpr int BYTES = 2 * Q_HALVES + 2 * 2 * WG_NS * STAGE + 4 * O_FLOATS + 4 * 2 * 2 * 128 + 1024;
};
// where row r's halves d .. d + 7 (d a multiple of 8) start in the swizzled layout (see the
// top) of a matrix of R rows
template <int R> __device__ __forceinline__ int wg_at(int r, int d) {
    return (d >> 6) * R * 64 + r * 64 + ((((d >> 3) & 7) ^ (r & 7)) << 3);
}

// where a thread's pieces of a K or V block go: piece p = t + 128 u of a matrix (t the
// thread's index in its warpgroup) is key (p / 8) % AM_KB, 16-byte piece 8 ((p / 8) / AM_KB) +
// p % 8 of its row, so each 8 lanes read one key's 128 contiguous bytes and write one shared
// row. With j0 = t / 8 (< 16) that is key j0 + 16 (u % 2), column u / 2: in shared memory at
// s0 + 1,024 u halves (s0 = 64 j0 + 8 ((t % 8) ^ (j0 % 8)): wg_at's, key j0 + 16 having j0's
// swizzle), in the cache at g0 + 16 stride (u % 2) + 64 (u / 2) halves from the block's first
// key (g0 = j0 stride + 8 (t % 8)). Worked out once a tile, not at every piece.
struct wg_pieces {
    int s0, j0;
    int64_t g0, g16; /* g16: 16 keys' stride */
};
__device__ __forceinline__ wg_pieces wg_pieces_of(int t, int64_t stride) {
    const int j0 = t >> 3;
    return wg_pieces{64 * j0 + (((t & 7) ^ (j0 & 7)) << 3), j0, j0 * stride + 8 * (t & 7), 16 * stride};
}

// keys [kb, kb + nk) of one matrix, K or V (at M0 + blk: blk the halves to key kb), into a
// slot in the swizzled layout, rows nk..AM_KB - 1 zeroed (a p of 0 times them must be 0, never
// NaN); commits nothing. A whole block (nk = AM_KB, the same for every thread of the
// warpgroup) takes no test a piece: two row pointers a block, each piece a constant offset from
// one of them (which the copy instruction holds), where the SASS had ~35 instructions a pair of
// pieces, the 64-bit sums redone at each
template <int D>
__device__ __forceinline__ void wg_fetch(uint16_t *slot, const uint16_t *M0, size_t blk, const wg_pieces &pc, int nk) {
    constexpr int PER = AM_KB * (D / 8) / 128; /* pieces of a matrix a thread */
    const uint16_t *g = M0 + (blk + (size_t)pc.g0), *g16 = g + pc.g16;
    uint16_t *sp = slot + pc.s0;
    if (nk == AM_KB) {
#pragma unroll
        for (int u = 0; u < PER; u++) cp16(sp + 1024 * u, ((u & 1) ? g16 : g) + 64 * (u >> 1));
    } else {
#pragma unroll
        for (int u = 0; u < PER; u++) {
            if (pc.j0 + 16 * (u & 1) < nk) cp16(sp + 1024 * u, ((u & 1) ? g16 : g) + 64 * (u >> 1));
            else *(uint4 *)(sp + 1024 * u) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// a block's scores into the two chains lo (dims < D/2) and hi, issued (not waited): Q's
// descriptor qd, the K slot's kd; k-step ks at column ks / 4, 16 (ks % 4) halves into its rows;
// each chain's first step sets its accumulators (wg_n32z)
template <int D> __device__ __forceinline__ void wg_scores(float (*lo)[4], float (*hi)[4], uint64_t qd, uint64_t kd) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const uint64_t a = wg_desc_add(qd, (ks >> 2) * WG_QV * 64 + (ks & 3) * 16),
                       b = wg_desc_add(kd, (ks >> 2) * AM_KB * 64 + (ks & 3) * 16);
        if (ks == 0) wg_n32z(lo, a, b);
        else if (ks < D / 32) wg_n32(lo, a, b);
        else if (ks == D / 32) wg_n32z(hi, a, b);
        else wg_n32(hi, a, b);
    }
}

// grid (tiles, Hkv), WG_T threads, wg_cfg<D>::BYTES of shared memory; tiles taken last first;
// one-row tiles return (the decode form's). Writes the multi-row tiles' outputs to ao.
// TMA: K and V blocks fetched by the copy engine (km, vm: the layer's K and V cache as views
// of Hkv D halves x rows, a sequence's rows seq_stride / (Hkv D) apart) instead of by every
// thread's cp.async; the same bytes land in the same places (a block's rows past its keys
// zeroed after they land), so the same sums. Else km and vm are not read.
// spread (TMA): a block's boxes asked for by lane 0 of each warp (warp c: box c of K and of V),
// else all by the warpgroup's first thread; the bytes counted on the mbarrier by that thread
// either way (an mbarrier's phase ends once its one arrival is in and no byte is due, so the
// boxes may land before or after it)
template <int D, bool TMA>
__global__ void __launch_bounds__(WG_T, 1) attn_wg_kernel(const float *qf, const hk_qtile *tiles, int n_tiles, int64_t H,
                                                        int64_t Hkv, const uint16_t *K0, const uint16_t *V0, size_t seq_stride,
                                                        int64_t seg, float *ao, const __grid_constant__ wg_map km,
                                                        const __grid_constant__ wg_map vm, bool spread) {
    pdl_enter();
    using C = wg_cfg<D>;
    constexpr int NT = D / 8, KH = AM_KB * D; /* KH: a slot's halves (one block's K or V rows) */
    constexpr uint32_t QKL = 16, QKS = 1024, VL = 128 * AM_KB, VS = 1024; /* descriptor offsets, bytes (see the top) */
    HK_DYN_SMEM(sm_raw);
    /* the swizzle's atoms on 1,024-byte boundaries of the shared window (BYTES holds the pad) */
    const uint32_t pad = (1024 - (wg_saddr(sm_raw) & 1023)) & 1023;
    float *sm = sm_raw + pad / 4;
    uint16_t *Qs = (uint16_t *)sm, *stg = Qs + C::Q_HALVES;
    float *Of = (float *)(stg + 2 * WG_NS * C::STAGE), *Ms = Of + C::O_FLOATS, *Ls = Ms + 2 * 128;
    float2 *Of2 = (float2 *)Of; /* thread t's outputs 8 j + 2 (lane % 4) + e of vector i at Of2[(2 j + i) 128 + t], e = .x, .y */
    /* TMA's four mbarriers (two a warpgroup): in the pad before the atoms where it holds 32
     * bytes, else in what the pad leaves of BYTES' last 1,024 (at least 993 bytes) */
    uint64_t *mbs = pad >= 32 ? (uint64_t *)sm_raw : (uint64_t *)(Ls + 2 * 128);
    const hk_qtile tile = tiles[n_tiles - 1 - (int)blockIdx.x];
    if (tile.n == 1) return;
    const int64_t kvh = blockIdx.y, last = tile.pos0 + tile.n - 1;
    /* wg through a shuffle from lane 0: warp-uniform to the compiler, so the warpgroup's stage
     * and its descriptors live in uniform registers (wgmma reads its descriptors from them; made
     * in a thread's own registers, each k-step's took two more moves) */
    const int G = (int)(H / Hkv), nv = tile.n * G, tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), t = tid & 127,
              lane = tid & 31, warp = t >> 5;
    for (int i = tid; i < WG_QV * (D / 4); i += WG_T) {
        const int v = i / (D / 4), d = 4 * (i % (D / 4));
        float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (v < nv) q = *(const float4 *)(qf + (int64_t)(tile.r0 + v / G) * 2 * H * D + (kvh * G + v % G) * 2 * D + d);
        uint16_t *h = Qs + wg_at<WG_QV>(v, d & ~7) + (d & 7);
        h[0] = am_h(q.x), h[1] = am_h(q.y), h[2] = am_h(q.z), h[3] = am_h(q.w);
    }
    for (int i = tid; i < C::O_FLOATS; i += WG_T) Of[i] = 0.0f;
    for (int i = tid; i < 2 * 128; i += WG_T) Ms[i] = -INFINITY, Ls[i] = 0.0f;
    uint64_t *mb = mbs + 2 * wg; /* the warpgroup's: a fetch group of iteration j counts on mb[j % 2] */
    if (TMA && t == 0) {
        mb_init(mb, 1), mb_init(mb + 1, 1);
        mb_init_fence();
    }
    int64_t kend[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int v = 16 * warp + (lane >> 2) + 8 * i;
        kend[i] = v < nv ? (AMUT(1) ? last + 1 : tile.pos0 + v / G + 1) : 0;
    }
    const float scale = am_scale(D);
    const size_t base = (size_t)tile.seq * seq_stride + (size_t)(kvh * D);
    const int64_t kstride = Hkv * D; /* halves from one key to the next */
    const wg_pieces pc = wg_pieces_of(t, kstride);
    uint16_t *mine = stg + wg * WG_NS * C::STAGE; /* the warpgroup's K slots 0 and 1, then its V slots 0 and 1 */
    /* Q's descriptor, and K's and V's in slot 0 (see the top) */
    const uint64_t qd = wg_desc(Qs, QKL, QKS), kd = wg_desc(mine, QKL, QKS), vd = wg_desc(mine + 2 * KH, VL, VS);
    const int64_t n_seg_t = last / seg + 1; /* the tile's segments */
    async_fence();
    __syncthreads(); /* Q, O, M and L; the mbarriers made */
    if (wg < n_seg_t) {
        /* The warpgroup's blocks in one stream: segments wg, wg + 2, ..., each's blocks in
         * order; block j (of segment s0; the first at key k0) has its K and its V in slot j % 2,
         * j + 1 at (s1, k1), j + 2 at (s2, k2). Iteration j issues block j + 1's scores, then block j's
         * P V; makes block j + 1's softmax while the tensor cores run P V; waits for it; folds
         * where block j ends a segment; rescales o for block j + 1. The copies run an
         * iteration ahead: K of j + 2 into the slot block j's scores left, V of j + 1 into the
         * slot block j - 1's P V left, in one group that iteration j + 1 waits for. The sums
         * are the same as one block after the other (am_weigh_p then am_rescale is am_weigh);
         * only when the instructions run moves. */
        const int sg = (int)seg, end = (int)last + 1;
        auto seg_stop = [&](int s) { return min(s * sg + sg, end); };
        /* TMA: the sequence's first row in the view; a slot's four (D = 256) boxes of 64 halves */
        const int row0 = TMA ? (int)((size_t)tile.seq * seq_stride / (size_t)kstride) : 0;
        constexpr uint32_t KB = 2 * KH; /* a block's bytes (K or V) */
        /* TMA: the boxes this thread asks for, [c0, c1) (none: c0 = c1) */
        const int c0 = spread ? (lane == 0 ? warp : D / 64) : (t == 0 ? 0 : D / 64), c1 = spread ? min(warp + 1, D / 64) : D / 64;
        auto fetch = [&](uint16_t *slot, const uint16_t *M0, int s, int kb, const wg_map *m, uint64_t *b) {
            if (TMA) {
                for (int c = c0; c < c1; c++) tma_box(slot + c * AM_KB * 64, m, (int)(kvh * D) + 64 * c, row0 + kb, b);
            } else {
                wg_fetch<D>(slot, M0, base + (size_t)kb * (size_t)kstride, pc, min(AM_KB, seg_stop(s) - kb));
            }
        };
        /* TMA: rows nk.. of a slot that landed whole zeroed (a p of 0 times them must be 0, never
         * NaN); every 16-byte piece of those rows, so the swizzle does not matter */
        auto zero_rows = [&](uint16_t *slot, int nk) {
            const int per = (AM_KB - nk) * 8; /* pieces a column */
            for (int i = t; i < (D / 64) * per; i += 128)
                *(uint4 *)(slot + (i / per) * AM_KB * 64 + (nk + (i % per) / 8) * 64 + 8 * (i % 8)) = make_uint4(0u, 0u, 0u, 0u);
        };
        auto next = [&](int &s, int &kb) {
            kb += AM_KB;
            if (kb >= seg_stop(s)) s += 2, kb = s * sg;
        };
        int s0 = wg, k0 = wg * (int)seg, s1 = s0, k1 = k0, s2, k2; /* positions < 2^31 (hk_attn's context) */
        next(s1, k1);
        s2 = s1, k2 = k1;
        next(s2, k2);
        int nk_cur = min(AM_KB, seg_stop(s0) - k0); /* block j's keys (< AM_KB: the tile's last block) */
        uint32_t ph = 0;                            /* TMA: bit b the parity of mb[b]'s next phase */
        if (TMA) {
            if (t == 0) mb_expect(mb, KB), mb_expect(mb + 1, s1 < n_seg_t && !AMUT(64) ? 2 * KB : KB);
            fetch(mine, K0, s0, k0, &km, mb);
            if (s1 < n_seg_t && !AMUT(64)) fetch(mine + KH, K0, s1, k1, &km, mb + 1);
            fetch(mine + 2 * KH, V0, s0, k0, &vm, mb + 1);
            bar_sync(1 + wg, 128); /* (the copies asked for before any thread waits: the emulation runs them at the ask) */
            mb_wait(mb, 0);
            ph = 1;
            if (nk_cur < AM_KB && !AMUT(128)) zero_rows(mine, nk_cur);
        } else {
            fetch(mine, K0, s0, k0, &km, mb);
            cp_commit();
            if (s1 < n_seg_t && !AMUT(64)) fetch(mine + KH, K0, s1, k1, &km, mb);
            fetch(mine + 2 * KH, V0, s0, k0, &vm, mb);
            cp_commit(); /* K of block 1 and V of block 0: iteration 0's group */
            cp_wait<1>();
        }
        async_fence();
        bar_sync(1 + wg, 128); /* K of block 0, every thread's pieces */
        float lo[4][4], hi[4][4], S[4][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2], o[NT][4];
        uint32_t P[4][2];
        wg_fence();
        wg_scores<D>(lo, hi, qd, kd);
        wg_commit();
        wg_wait0();
        wg_pin_rows<4>(lo), wg_pin_rows<4>(hi);
        am_sum(S, lo, hi);
        am_weigh_p(S, k0, kend, scale, m, l, alpha, P);
        /* (o is set by the first P V, fresh below; zeroed once a tile only so that the asm's
         * read-write operands never read an unset register) */
#pragma unroll
        for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
        bool fresh = true; /* o holds no block of the segment yet: the next P V sets it (wg_pv's scale-d) */
        for (uint32_t slot = 0;; slot ^= 1) {
            const bool more = s1 < n_seg_t, ends = !more || s1 != s0; /* a block j + 1; block j its segment's last */
            const int nk_next = more ? min(AM_KB, seg_stop(s1) - k1) : AM_KB;
            if (TMA) {
                bar_sync(1 + wg, 128); /* slots read by j's scores and j - 1's P V free in every warp; j - 1's group asked for */
                mb_wait(mb + (slot ^ 1), (ph >> (slot ^ 1)) & 1u); /* K of j + 1 and V of j */
                ph ^= 1u << (slot ^ 1);
                if ((nk_next < AM_KB || nk_cur < AM_KB) && !AMUT(128)) {
                    if (nk_next < AM_KB) zero_rows(mine + (slot ^ 1) * KH, nk_next);
                    if (nk_cur < AM_KB) zero_rows(mine + (2 + slot) * KH, nk_cur);
                    async_fence();
                    bar_sync(1 + wg, 128);
                }
            } else {
                cp_wait<0>();
                async_fence();
                bar_sync(1 + wg, 128); /* K of j + 1 and V of j, every thread's pieces; slots read by j's scores and j - 1's P V free */
            }
            wg_fence();
            /* block j + 1's scores, issued on every path (after the stream's last block, over
             * whatever the other slot holds, and not read): under a test ptxas cannot tell that
             * wg_wait1 below waits for them, and runs every wgmma of the form one at a time (its
             * C7514) */
            wg_scores<D>(lo, hi, qd, wg_desc_add(kd, (slot ^ 1) * KH));
            wg_commit();
#pragma unroll
            for (int ks = 0; ks < 2; ks++) { /* keys 16 ks .. 16 ks + 15: rows 16 ks .. of every column */
                const uint32_t a[4] = {P[2 * ks][0], P[2 * ks][1], P[2 * ks + 1][0], P[2 * ks + 1][1]};
                wg_pv<D>(o, a, wg_desc_add(vd, slot * KH + 16u * ks * 64), ks > 0 || !fresh || AMUT(2));
            }
            wg_commit();
            fresh = false;
            const bool k_next = s2 < n_seg_t && !(AMUT(64) && k2 == s2 * seg);
            if (TMA) {
                if (more) { /* (k_next only where more) */
                    if (t == 0) mb_expect(mb + slot, k_next ? 2 * KB : KB);
                    if (k_next) fetch(mine + slot * KH, K0, s2, k2, &km, mb + slot);
                    fetch(mine + (2 + (slot ^ 1)) * KH, V0, s1, k1, &vm, mb + slot);
                }
            } else {
                if (k_next) fetch(mine + slot * KH, K0, s2, k2, &km, mb);
                if (more) fetch(mine + (2 + (slot ^ 1)) * KH, V0, s1, k1, &vm, mb);
                cp_commit();
            }
            uint32_t Pn[4][2];
            wg_wait1(); /* j + 1's scores; j's P V may run on */
            wg_pin_rows<4>(lo), wg_pin_rows<4>(hi);
            if (more) am_sum(S, lo, hi);
            if (ends) { /* o final for block j's segment before j + 1's softmax begins the next */
                wg_wait0();
                wg_pin_rows<NT>(o);
                wg_pin_u<8>(&P[0][0]);
                /* the fold, in segment order: segment s0 after s0 - 1 (the other warpgroup's) */
                if (s0 > 0 && !AMUT(32)) bar_sync(wg ? 3 : 4, WG_T);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const bool act = kend[i] > s0 * seg; /* else no key of this vector in the segment */
                    float a = 1.0f, b = 1.0f;
                    if (act) {
                        float M = Ms[i * 128 + t], L = Ls[i * 128 + t];
                        am_fold_w(M, L, m[i], l[i], a, b);
                        Ms[i * 128 + t] = M, Ls[i * 128 + t] = L;
                    }
                    /* O a is O where a is 1 (the segment's max below the running one: most
                     * segments but the first), so the warp skips that product when all its
                     * vectors' a are 1 */
                    const bool a1 = __all_sync(0xffffffffu, !act || a == 1.0f);
                    if (!act) continue;
                    if (a1)
#pragma unroll
                        for (int j = 0; j < NT; j++) {
                            float2 *O = Of2 + (2 * j + i) * 128 + t, v = *O;
                            v.x = __fadd_rn(v.x, __fmul_rn(o[j][2 * i], b)), v.y = __fadd_rn(v.y, __fmul_rn(o[j][2 * i + 1], b));
                            *O = v;
                        }
                    else
#pragma unroll
                        for (int j = 0; j < NT; j++) {
                            float2 *O = Of2 + (2 * j + i) * 128 + t, v = *O;
                            v.x = am_fold_o(v.x, o[j][2 * i], a, b), v.y = am_fold_o(v.y, o[j][2 * i + 1], a, b);
                            *O = v;
                        }
                }
                if (s0 + 1 < n_seg_t && !AMUT(32)) bar_arrive(wg ? 4 : 3, WG_T);
                fresh = true; /* the next segment's o: set by its first P V (neither zeroed nor rescaled here) */
                m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;
            }
            if (more) am_weigh_p(S, k1, kend, scale, m, l, alpha, Pn); /* while j's P V runs, but at a segment's end */
            /* j's P V: o holds blocks .. j; P free. On every path (after a fold nothing is left to
             * wait for): ptxas proves the accumulators' reads safe only so, and otherwise runs
             * every wgmma of the form one at a time (its C7514) */
            wg_wait0();
            wg_pin_rows<NT>(o);
            wg_pin_u<8>(&P[0][0]);
            if (!more) break;
            if (!fresh) am_rescale<NT>(o, alpha); /* (a segment's first block: its alpha 0, o set by its P V) */
#pragma unroll
            for (int j = 0; j < 4; j++) P[j][0] = Pn[j][0], P[j][1] = Pn[j][1];
            s0 = s1, s1 = s2, k1 = k2; /* (k0 is the first block's alone) */
            nk_cur = nk_next;
            next(s2, k2);
        }
    }
    __syncthreads(); /* every segment folded */
    { /* warpgroup g writes its threads' vector i = g */
        const int i = wg, v = 16 * warp + (lane >> 2) + 8 * i;
        if (v < nv) {
            const int64_t r = tile.r0 + v / G, h = kvh * G + v % G;
            const float *gate = qf + r * 2 * H * D + h * 2 * D + D;
            float *out = ao + r * H * D + h * D;
            const float L = Ls[i * 128 + t];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int d = 8 * j + 2 * (lane & 3) + e;
                    out[d] = am_out(e ? Of2[(2 * j + i) * 128 + t].y : Of2[(2 * j + i) * 128 + t].x, L, gate[d]);
                }
        }
    }
}

#endif
