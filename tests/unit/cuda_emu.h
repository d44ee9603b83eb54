/* cuda_emu.h: a CPU emulation of the CUDA execution model, enough to run the GDN chunk
 * kernels (src/engine/cuda/gdn_chunk.cuh) and the argmax (argmax.cuh) in unit tests on a
 * machine without a GPU (C++). Each thread of a block is a fiber (ucontext). __syncthreads()
 * parks a thread until every live thread of the block is parked there; a warp shuffle
 * (__shfl_sync, __shfl_xor_sync, full mask) parks it until every live thread of its warp
 * has published its value, then again until every one has read: the barriers are real,
 * and a thread parked at one kind while the rest of its block or warp waits at the other is
 * a deadlock the emulation reports (CUDA leaves that undefined). Blocks run one after
 * another (in the order emu::order names: as listed, reversed or shuffled), so atomics are
 * plain read-modify-writes and __threadfence a no-op. Static
 * __shared__ variables are function statics (one copy, shared by the block's threads);
 * dynamic shared memory (HK_DYN_SMEM) is one buffer per block, filled with NaN so a read
 * before a write shows. The __fmaf_rn family is fmaf and plain float operations: compile
 * with -ffp-contract=off so no product and sum are fused behind the test's back, and
 * -fno-strict-aliasing (float4 loads of float arrays). Also here, for the one-row products
 * and their tails (tests/unit/test_fused_emu.cc): int4, uint4, uint2, __dp4a, __vsub4, the
 * f16 conversions (round to nearest even), __float2int_rn, __ldcg (a plain load: blocks run
 * one after another). For the tensor-core attention (src/engine/cuda/attn_mma.cuh,
 * tests/unit/test_attn_emu.cc): mma16816 (mma.sync m16n8k16, f16 operands, f32
 * accumulators: each D element is C plus its 16 exact products summed in double, rounded
 * once; the GPU's tensor cores round their own way, so only the kernels' structure and
 * bounds carry over, not their bits), ldsm4 and ldsm4t (ldmatrix x4, plain and .trans,
 * every lane's row address exchanged through the warp), cp16 (cp.async of 16 bytes: a plain
 * copy; cp_commit and cp_wait are no-ops), __all_sync (a warp barrier like a shuffle's). Not emulated: other votes, streams, PDL (pdl_wait, pdl_go, pdl_enter are
 * no-ops), the memory model across blocks. For the prompt rows' quantized products
 * (src/engine/cuda/mmq.cuh, tests/unit/test_mmq_emu.cc): mma_k32 and mma_k16 (int8 tensor
 * cores, exact). For the wgmma form of the prompt attention (src/engine/cuda/attn_wg.cuh):
 * wg_n32 and wg_pv (wgmma m64nNk16 with shared-memory descriptors, the mma16816 arithmetic per
 * element), named barriers (bar_sync parks until n threads have arrived, bar_arrive counts
 * without parking), the copy engine's tensor fetch and its mbarriers (tma_box, mb_*: below). */
#ifndef HEARTH_CUDA_EMU_H
#define HEARTH_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n))) /* GNU: may stand among the specifiers (__shared__ __align__(16) float) */
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
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
enum wait_kind { READY, AT_BLOCK, AT_WARP, AT_NAMED, DONE };
struct fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    wait_kind wait;
    int bar; /* the named barrier it waits at (AT_NAMED) */
};
inline int named_count[16]; /* arrivals at each named barrier since it last opened */
/* each round runs the ready threads last first instead of first first: a block's later warps
 * get ahead of its earlier ones up to the next barrier (what a missing barrier between them
 * lets happen shows) */
inline bool threads_reversed = false;
inline std::vector<fiber> fibers;
inline std::function<void()> body;
inline int64_t n_barriers;         /* block barriers passed, summed over blocks (a test may report it) */
inline std::vector<uint32_t> shfl; /* a shuffle's published values, one a thread */
inline std::vector<const void *> wptr; /* a warp exchange's published pointers, one a thread */

inline void trampoline() {
    body();
    fibers[cur].wait = DONE; /* uc_link returns to the scheduler */
}

inline void park(wait_kind k) {
    fibers[cur].wait = k;
    if (swapcontext(&fibers[cur].ctx, &sched) != 0) abort();
}
inline void sync_threads() { park(AT_BLOCK); }
inline void sync_warp() { park(AT_WARP); }

/* runs one block of the current launch: every thread a fiber of body; each round runs the
 * ready threads up to their next barrier, then opens every warp whose live threads all wait
 * at a shuffle, and the block's barrier once every live thread waits there */
inline void run_block(unsigned nthreads) {
    const size_t stack_bytes = 64 * 1024;
    fibers.resize(nthreads);
    thread_idx.resize(nthreads);
    shfl.assign(nthreads, 0);
    wptr.assign(nthreads, nullptr);
    for (unsigned t = 0; t < nthreads; t++) {
        fiber &fb = fibers[t];
        fb.stack.resize(stack_bytes);
        fb.wait = READY;
        thread_idx[t] = {t % block_dim.x, (t / block_dim.x) % block_dim.y, t / (block_dim.x * block_dim.y)};
        if (getcontext(&fb.ctx) != 0) abort();
        fb.ctx.uc_stack.ss_sp = fb.stack.data();
        fb.ctx.uc_stack.ss_size = stack_bytes;
        fb.ctx.uc_link = &sched;
        makecontext(&fb.ctx, trampoline, 0);
    }
    for (int i = 0; i < 16; i++) named_count[i] = 0;
    for (;;) {
        for (unsigned u = 0; u < nthreads; u++) {
            const unsigned t = threads_reversed ? nthreads - 1 - u : u;
            if (fibers[t].wait != READY) continue;
            cur = (int)t;
            if (swapcontext(&sched, &fibers[t].ctx) != 0) abort();
        }
        bool ready = false; /* released by a named barrier during the round */
        for (unsigned t = 0; t < nthreads; t++) ready |= fibers[t].wait == READY;
        if (ready) continue;
        bool live = false, opened = false, all_block = true;
        for (unsigned w0 = 0; w0 < nthreads; w0 += 32) {
            bool any = false, all_warp = true;
            for (unsigned t = w0; t < w0 + 32 && t < nthreads; t++) {
                if (fibers[t].wait == DONE) continue;
                any = live = true;
                all_warp &= fibers[t].wait == AT_WARP;
                all_block &= fibers[t].wait == AT_BLOCK;
            }
            if (any && all_warp) {
                for (unsigned t = w0; t < w0 + 32 && t < nthreads; t++)
                    if (fibers[t].wait == AT_WARP) fibers[t].wait = READY;
                opened = true;
            }
        }
        if (!live) break;
        if (!opened && all_block) {
            for (unsigned t = 0; t < nthreads; t++)
                if (fibers[t].wait == AT_BLOCK) fibers[t].wait = READY;
            n_barriers++;
            opened = true;
        }
        if (!opened) {
            fprintf(stderr, "cuda_emu: block (%u, %u, %u) deadlocks: threads wait at a warp shuffle, a named barrier and "
                            "__syncthreads\n",
                    block_idx.x, block_idx.y, block_idx.z);
            abort();
        }
    }
}

/* The order a launch runs its blocks in (a GPU promises none): FORWARD, x fastest; REVERSE;
 * SHUFFLED, a permutation drawn from order_seed (advanced at every launch). A last-block tail
 * must give the same bits whichever block comes last; blocks still run one at a time, so
 * what an order can show is a ticket or a tail that counts on a particular block being the
 * last, not a write that another block sees late (the memory model is not emulated). */
enum block_order { FORWARD, REVERSE, SHUFFLED };
inline block_order order = FORWARD;
inline uint64_t order_seed = 1;
/* kernel<<<grid, block, smem>>>(args...), blocks in `order` */
template <typename... P, typename... A>
inline void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, A... args) {
    grid_dim = grid;
    block_dim = block;
    body = [&]() { kernel(args...); };
    std::vector<emu_uint3> blocks;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) blocks.push_back({x, y, z});
    if (order == REVERSE)
        for (size_t i = 0, j = blocks.size(); i + 1 < j; i++, j--) std::swap(blocks[i], blocks[j - 1]);
    else if (order == SHUFFLED)
        for (size_t i = blocks.size(); i > 1; i--) { /* Fisher-Yates, splitmix64 draws */
            uint64_t r = (order_seed += 0x9e3779b97f4a7c15ull);
            r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
            r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
            std::swap(blocks[i - 1], blocks[(size_t)((r ^ (r >> 31)) % i)]);
        }
    for (const emu_uint3 &bi : blocks) {
        block_idx = bi;
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
inline void __threadfence() {}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned o = *p;
    *p = o + v;
    return o;
}
inline int atomicAdd(int *p, int v) {
    const int o = *p;
    *p = o + v;
    return o;
}
/* lane src's v (full warp): every lane publishes, waits for the warp, reads, waits again so
 * no lane publishes the next shuffle's value before all have read this one */
template <typename T> inline T emu_shfl(T v, int src_lane) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    const int t = emu::cur, base = t & ~31;
    uint32_t u;
    memcpy(&u, &v, 4);
    emu::shfl[t] = u;
    emu::sync_warp();
    u = emu::shfl[base + (src_lane & 31)];
    emu::sync_warp();
    T r;
    memcpy(&r, &u, 4);
    return r;
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src_lane) { return emu_shfl(v, src_lane); }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask) { return emu_shfl(v, (emu::cur & 31) ^ mask); }
/* every lane of the warp votes (full mask; blocks of whole warps): 1 when pred holds in all */
inline int __all_sync(unsigned, int pred) {
    const int t = emu::cur, base = t & ~31;
    emu::shfl[t] = pred ? 1u : 0u;
    emu::sync_warp();
    int r = 1;
    for (int i = 0; i < 32; i++) r &= emu::shfl[base + i] != 0;
    emu::sync_warp();
    return r;
}
inline void pdl_enter() {}
inline void pdl_wait() {}
inline void pdl_go() {}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
/* c + the four signed byte products of a and b */
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
/* a - b per byte, modulo 256 */
inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= ((((a >> (8 * i)) & 0xffu) - ((b >> (8 * i)) & 0xffu)) & 0xffu) << (8 * i);
    return r;
}
template <typename T> inline T __ldcg(const T *p) { return *p; }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline float __fdiv_rn(float a, float b) { return a / b; }
struct __half {
    uint16_t x;
};
inline __half __ushort_as_half(uint16_t u) { return __half{u}; }
inline uint16_t __half_as_ushort(__half h) { return h.x; }
inline float __half2float(__half h) {
    const uint32_t s = (uint32_t)(h.x >> 15) << 31, ex = (h.x >> 10) & 31, m = h.x & 1023;
    uint32_t u;
    if (ex == 31) u = s | 0x7f800000u | (m << 13);
    else if (ex) u = s | ((ex + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else { /* subnormal: m 2^-24 */
        const float f = ldexpf((float)m, -24);
        memcpy(&u, &f, 4);
        u |= s;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline __half __float2half_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
    const float a = fabsf(f);
    if (a != a) return __half{(uint16_t)(s | 0x7e00u)};
    if (a >= 65520.0f) return __half{(uint16_t)(s | 0x7c00u)}; /* rounds to infinity */
    if (a < ldexpf(1.0f, -14)) /* subnormal (or zero): a multiple of 2^-24, to nearest even */
        return __half{(uint16_t)(s | (uint16_t)nearbyintf(ldexpf(a, 24)))};
    int e;
    const float fr = frexpf(a, &e); /* a = fr 2^e, fr in [0.5, 1) */
    uint32_t m = (uint32_t)nearbyintf(ldexpf(fr, 11)); /* 11 significant bits, to nearest even */
    if (m == 2048) m = 1024, e++;
    return __half{(uint16_t)(s | (uint16_t)((e + 14) << 10) | (uint16_t)(m - 1024))};
}
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

/* every lane's p, in lane order (full warp): published, the warp waited for, copied, waited
 * for again, so what they point at (a lane's registers: its fiber's stack) holds meanwhile */
inline void emu_warp_ptrs(const void *p, const void *out[32]) {
    const int t = emu::cur, base = t & ~31;
    emu::wptr[t] = p;
    emu::sync_warp();
    for (int i = 0; i < 32; i++) out[i] = emu::wptr[base + i];
}
inline void emu_warp_done() { emu::sync_warp(); }
inline float emu_h(uint32_t u, int hi) { return __half2float(__ushort_as_half((uint16_t)(hi ? u >> 16 : u & 0xffffu))); }
/* The tensor cores' exchange of fragments, for mma.sync m16n8kK: every lane's A and B
 * registers read through the warp, D[q] = C[q] + the sum over k of A(row, k) B(k, col) in Acc.
 * A register holds P elements (f16: 2, int8: 4), elt(register, i) the i-th; a lane group of 4
 * holds 4 P consecutive k, registers split at k = 4 P: a[0] row lane/4, k P (lane%4) .. + P - 1;
 * a[1] row + 8; a[2] k + 4 P; a[3] both; b[0] k as a[0]'s, col lane/4; b[1] k + 4 P; d[0..1]
 * row lane/4, cols 2 (lane%4) + {0, 1}; d[2..3] row + 8. */
template <int P, int K, typename Acc, typename T, typename Elt>
inline void emu_mma(T d[4], const uint32_t *a, const uint32_t *b, Elt elt) {
    struct ops {
        const uint32_t *a, *b;
    } mine = {a, b};
    const void *all[32];
    emu_warp_ptrs(&mine, all);
    const int lane = emu::cur & 31;
    T r[4];
    for (int q = 0; q < 4; q++) {
        const int row = lane / 4 + 8 * (q / 2), col = 2 * (lane % 4) + q % 2;
        Acc acc = d[q];
        for (int k = 0; k < K; k++) {
            const int g = (k % (4 * P)) / P, hi = k >= 4 * P;
            const ops *pa = (const ops *)all[4 * (row % 8) + g], *pb = (const ops *)all[4 * col + g];
            acc += (Acc)elt(pa->a[(row >= 8) + 2 * hi], k % P) * (Acc)elt(pb->b[hi], k % P);
        }
        r[q] = (T)acc;
    }
    emu_warp_done();
    for (int q = 0; q < 4; q++) d[q] = r[q];
}
/* d += a b, f16 pairs packed low element first, f32 accumulators: each D element is C plus its
 * 16 exact products summed in double, rounded once */
inline void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    emu_mma<2, 16, double>(d, a, b, [](uint32_t u, int i) { return (double)emu_h(u, i); });
}
/* ldmatrix x4: lanes 8i..8i+7 give the row addresses of matrix i (8 halves each); r[i] of
 * lane t is matrix i's row t/4, halves 2 (t%4) and + 1; transposed (tr): its column t/4,
 * rows 2 (t%4) and + 1 */
inline void emu_ldsm4(uint32_t r[4], const void *p, bool tr) {
    const void *all[32];
    emu_warp_ptrs(p, all);
    const int t = emu::cur & 31;
    uint32_t v[4];
    for (int i = 0; i < 4; i++) {
        uint16_t lo, hi;
        if (!tr) {
            const uint16_t *row = (const uint16_t *)all[8 * i + t / 4];
            lo = row[2 * (t % 4)], hi = row[2 * (t % 4) + 1];
        } else {
            lo = ((const uint16_t *)all[8 * i + 2 * (t % 4)])[t / 4];
            hi = ((const uint16_t *)all[8 * i + 2 * (t % 4) + 1])[t / 4];
        }
        v[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    emu_warp_done();
    for (int i = 0; i < 4; i++) r[i] = v[i];
}
/* d += a b on int8 tensor cores (mma.sync m16n8k32 / m16n8k16, s8 x s8, s32 accumulators:
 * exact, as the GPU's); k16: a[0], a[1] and b[0] alone */
inline int64_t emu_s8(uint32_t u, int i) { return (int8_t)(u >> (8 * i)); }
inline void mma_k32(int c[4], const uint32_t a[4], const uint32_t b[2]) { emu_mma<4, 32, int64_t>(c, a, b, emu_s8); }
inline void mma_k16(int c[4], const uint32_t a[2], uint32_t b) { emu_mma<4, 16, int64_t>(c, a, &b, emu_s8); }
/* a named barrier of a pair of warps: the whole block's here (every thread calls it) */
inline void pair_sync(int) { __syncthreads(); }
/* named barrier id of n threads (bar.sync / bar.arrive): an arrival counts; the n-th opens it
 * for every thread parked there; bar_sync parks until then, bar_arrive goes on */
inline bool emu_named(int id, int n) {
    if (++emu::named_count[id] < n) return false;
    emu::named_count[id] = 0;
    for (auto &f : emu::fibers)
        if (f.wait == emu::AT_NAMED && f.bar == id) f.wait = emu::READY;
    return true;
}
inline void bar_sync(int id, int n) {
    if (emu_named(id, n)) return;
    emu::fibers[emu::cur].bar = id;
    emu::park(emu::AT_NAMED);
}
inline void bar_arrive(int id, int n) { emu_named(id, n); }
/* wgmma (a warpgroup's m64nNk16, f16 operands, f32 accumulators), computed at the call: fence,
 * commit, wait and the proxy fence have nothing to order. Each D element is C plus its 16
 * exact products summed in double, rounded once: the emulated mma16816's arithmetic, so a
 * chain of either gives the same bits here as on the GPU, where test_cuda's attn_matches_ref checks
 * it. Shared-memory operands through their descriptors: a start (bytes from the block's
 * dynamic shared memory, >> 4), leading (LBO) and stride (SBO) byte offsets, and the swizzle
 * mode (bits 62-63), which must be 1 (128-byte; the form's only layout). The swizzle is of the
 * address: byte a is read at a ^ (((a >> 7) & 7) << 4), the atoms of 8 rows x 128 bytes
 * 1,024-aligned (so a start is at most 127 bytes into an atom's first row, k-steps 32 apart:
 * anything else aborts). */
inline void wg_fence() {}
inline void wg_commit() {}
inline void wg_wait0() {}
inline void wg_wait1() {}
inline void async_fence() {}
inline void wg_pin(float &) {}
inline uint32_t wg_saddr(const void *p) { return (uint32_t)((const char *)p - (const char *)emu::dyn.data()); }
inline uint64_t wg_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    const size_t a = (size_t)((const char *)p - (const char *)emu::dyn.data());
    if (a % 16 || a >> 18 || lbo % 16 || sbo % 16 || lbo >> 18 || sbo >> 18) abort(); /* outside what 14 bits of >> 4 hold */
    if (a % 1024 >= 128 || a % 32) abort(); /* not where the swizzled layouts' starts lie */
    return (uint64_t)(a >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | (uint64_t)1 << 62;
}
inline size_t emu_desc_start(uint64_t d) { return (size_t)(d & 0x3FFF) << 4; }
inline size_t emu_lbo(uint64_t d) { return (size_t)((d >> 16) & 0x3FFF) << 4; }
inline size_t emu_sbo(uint64_t d) { return (size_t)((d >> 32) & 0x3FFF) << 4; }
/* the half at byte a (from the start of the block's dynamic shared memory) as the descriptor's
 * swizzle reads it */
inline double emu_desc_half(uint64_t d, size_t a) {
    if ((d >> 62) != 1) abort();
    a ^= ((a >> 7) & 7) << 4;
    uint16_t h;
    memcpy(&h, (const char *)emu::dyn.data() + a, 2);
    return (double)__half2float(__ushort_as_half(h));
}
/* element (row r, k) of a K-major operand: rows 128 bytes apart, 8-row groups SBO apart, k
 * along the row (LBO unused); element (k, n) of an N-major one: k-rows 128 bytes apart (64 n
 * each), 8-k groups SBO apart, 64-n columns LBO apart (PTX ISA, canonical layouts with 128-byte
 * swizzling) */
inline double emu_kmaj(uint64_t d, int r, int k) {
    return emu_desc_half(d, emu_desc_start(d) + (r / 8) * emu_sbo(d) + (r % 8) * 128 + k * 2);
}
inline double emu_nmaj(uint64_t d, int k, int n) {
    return emu_desc_half(d, emu_desc_start(d) + (n / 64) * emu_lbo(d) + (k / 8) * emu_sbo(d) + (k % 8) * 128 + (n % 64) * 2);
}
/* the thread's accumulators: warp w of the warpgroup holds rows 16 w .. 16 w + 15 as mma.sync's
 * C, d[j][q] at row 16 w + lane/4 + 8 (q/2), column 8 j + 2 (lane%4) + q%2 */
inline void wg_n32(float (*d)[4], uint64_t da, uint64_t db) {
    const int w = (emu::cur & 127) >> 5, lane = emu::cur & 31;
    for (int j = 0; j < 4; j++)
        for (int q = 0; q < 4; q++) {
            const int row = 16 * w + lane / 4 + 8 * (q / 2), col = 8 * j + 2 * (lane % 4) + q % 2;
            double acc = d[j][q];
            for (int k = 0; k < 16; k++) acc += emu_kmaj(da, row, k) * emu_kmaj(db, col, k);
            d[j][q] = (float)acc;
        }
}
/* scale-d 0: d = A B (d not read) */
inline void wg_n32z(float (*d)[4], uint64_t da, uint64_t db) {
    for (int j = 0; j < 4; j++) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    wg_n32(d, da, db);
}
/* A from registers (mma.sync's A fragment of the warp's 16 rows: read through the warp), B
 * N-major; scale-d acc: o = P V where acc is false (o not read) */
template <int N> inline void wg_pv(float (*o)[4], const uint32_t a[4], uint64_t db, bool acc) {
    if (!acc)
        for (int j = 0; j < N / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    const void *all[32];
    emu_warp_ptrs(a, all);
    const int lane = emu::cur & 31;
    for (int j = 0; j < N / 8; j++)
        for (int q = 0; q < 4; q++) {
            const int row = lane / 4 + 8 * (q / 2), col = 8 * j + 2 * (lane % 4) + q % 2;
            double acc = o[j][q];
            for (int k = 0; k < 16; k++) {
                const uint32_t *src = (const uint32_t *)all[4 * (row % 8) + (k % 8) / 2];
                acc += (double)emu_h(src[(row >= 8) + 2 * (k >= 8)], k % 2) * emu_nmaj(db, k, col);
            }
            o[j][q] = (float)acc;
        }
    emu_warp_done();
}
/* The copy engine's tensor fetch (TMA, attn_wg.cuh) and its mbarriers. A view (wg_map) of
 * cols halves x rows rows, rows cols halves apart; tma_box copies the box of 64 halves x 32 rows
 * at (x, y) at the ask, rows past the view zero, into dst (1,024-aligned: else abort) in the
 * 128-byte swizzle as the wgmma reads above undo it, and counts its 4,096 bytes on the
 * mbarrier. An mbarrier (one arrival a phase, as the form makes them): the bytes still due, an
 * arrived flag and the phase's parity; mb_expect arrives and adds the bytes, a phase ends when
 * it has arrived and none are due. mb_wait on a phase not ended aborts: in the emulation the
 * copies run at the ask, so a wait that could spin means a wait placed before its ask. */
struct wg_map {
    const uint16_t *base;
    int64_t cols, rows;
};
inline void mb_init(uint64_t *b, int n) {
    if (n != 1) abort();
    *b = 0;
}
inline void mb_init_fence() {}
inline void emu_mb_end(uint64_t *b) {
    if ((uint32_t)*b == 0 && (*b >> 32 & 1)) *b = (*b & ~((1ull << 33) - 1)) ^ (1ull << 40);
}
inline void mb_expect(uint64_t *b, uint32_t bytes) {
    if (*b >> 32 & 1) abort(); /* a second arrival in one phase */
    *b = (*b & ~0xFFFFFFFFull) | (uint32_t)((uint32_t)*b + bytes) | 1ull << 32;
    emu_mb_end(b);
}
inline void tma_box(void *dst, const wg_map *m, int x, int y, uint64_t *b) {
    const size_t a0 = (size_t)((const char *)dst - (const char *)emu::dyn.data());
    if (a0 % 1024 || x % 8) abort();
    for (int r = 0; r < 32; r++)
        for (int c = 0; c < 8; c++) {
            uint16_t piece[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            const int64_t row = (int64_t)y + r, col = (int64_t)x + 8 * c;
            if (row < m->rows && col < m->cols) memcpy(piece, m->base + row * m->cols + col, 16);
            size_t a = a0 + (size_t)(128 * r + 16 * c);
            a ^= ((a >> 7) & 7) << 4;
            memcpy((char *)emu::dyn.data() + a, piece, 16);
        }
    *b = (*b & ~0xFFFFFFFFull) | (uint32_t)((uint32_t)*b - 4096u);
    emu_mb_end(b);
}
inline void mb_wait(uint64_t *b, uint32_t parity) {
    if ((uint32_t)(*b >> 40 & 1) == parity) {
        fprintf(stderr, "cuda_emu: a wait on an mbarrier phase whose copies were not all asked for\n");
        abort();
    }
}
inline void ldsm4(uint32_t r[4], const void *p) { emu_ldsm4(r, p, false); }
inline void ldsm4t(uint32_t r[4], const void *p) { emu_ldsm4(r, p, true); }
inline void cp16(void *smem, const void *gmem) { memcpy(smem, gmem, 16); }
inline void cp_commit() {}
template <int N> inline void cp_wait() {}
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

#endif
