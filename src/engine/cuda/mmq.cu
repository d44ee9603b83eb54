// mmq.cu: the CUDA engine's matrix products. Quantized weights (Q4_K, Q5_K, Q6_K, Q8_0)
// meet their input rows rounded to 8 bits (hk_act) in integer products: per 256-block of a
// K-quant (per 32-block of Q8_0) the integer sums are exact whichever way they are formed,
// and the block is finished with quant_dot_ref's float expression and added to the row's
// sum in block order. Two paths form the sums: a warp per output row with dp4a over 1..8
// input rows (gemv_*: decode), and int8 tensor cores over tiles of 64 outputs x 16..64
// input rows (mmq_*: prompts). They give the same bits for every row, so a row's result
// does not depend on which path its call took or what shared its tile. Float weights (F32,
// F16, BF16) take fmm_*: a warp per output over f32 inputs, one fixed order per row.
//
// Dims: M outputs, K inputs, n input rows; a K-quant row has nb = K/256 blocks.
#include <cuda_fp16.h>
#include <stdio.h>

#include "engine/cuda/common.cuh"
#include "engine/cuda/dq.cuh"
#include "engine/cuda/act.cuh"
#include "engine/cuda/tail.cuh"
#include "engine/cuda/gemv.cuh"
#include "engine/cuda/mmq.cuh"

extern "C" int hk_moe_tile_for(int64_t n_routed, int X) { return n_routed >= 32 * (int64_t)X ? 32 : 16; }

// wait until at most n (0..7) of this thread's groups are in flight (the count is an immediate)
__device__ __forceinline__ void cp_wait_upto(int n) {
    switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
    }
}

// gemv_kernel's one-row form (NR = 1: decode's products, the experts' pairs) with its rows
// staged: warp w of block b takes `rounds` groups of RW consecutive rows (round r: rows
// ((b rounds + r) 4 + w) RW ..), copies all of their bytes (and scales) into shared memory
// with cp.async, every copy issued before any is used (a group a round), then runs the same
// lanes (gemv_row) on the copies as they land: the same loads and arithmetic as gemv_kernel,
// so the same bits, with a block's whole share of the weights in flight at once instead of
// IT steps of one row a lane in registers. The launcher (gemv_go) checks that rows are whole
// 16-byte pieces (scales 4-byte), that a group never straddles w and w2, and the room.
#define GS_MAX_ROUNDS 8
// a warp's share of the stage (weights, then scales), each part whole 16-byte pieces so that
// every warp's copies start 16-byte aligned
__host__ __device__ constexpr size_t gs_up16(size_t b) { return (b + 15) / 16 * 16; }
template <int T, int IT, int G, bool SW>
__global__ void __launch_bounds__(128) gemv_staged_kernel(hk_w w, hk_w ws, hk_act a, const int32_t *sel, int64_t n_routed,
                                                          int in_div, int64_t sh_row0, float *y, int64_t ys, bool add,
                                                          hk_w w2, hk_w ws2, float *y2, gv_sw sw, int rounds) {
    gv_more mo = {};
    mo.ys2 = ys;
    constexpr int RW = 32 / G;
    extern __shared__ __align__(16) int8_t gs_mem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t Mt = w.M + w2.M, rb = w.row_bytes, db = w.dd ? 2 * w.dd_row : 0;
    const size_t swb = SW ? sw_bytes(sw.F) : 0, wpart = gs_up16((size_t)rounds * RW * rb);
    uint8_t *wst = (uint8_t *)gs_mem + swb + warp * (wpart + gs_up16((size_t)rounds * RW * db)), *dst = wst + wpart;
    if (sel) pdl_enter(); /* the expert is a kernel's output */
    for (int r = 0; r < rounds; r++) { /* the copies of every round, one group each */
        const int64_t first = (((int64_t)blockIdx.x * rounds + r) * 4 + warp) * RW;
        if (first < Mt) {
            const int64_t nrow = Mt - first < RW ? Mt - first : RW;
            const gv_at at = gv_locate(first, blockIdx.y, w, ws, w2, ws2, y, ys, y2, mo, sel, n_routed, in_div, sh_row0);
            for (int64_t i = lane; i < nrow * rb / 16; i += 32) cp16(wst + (size_t)r * RW * rb + 16 * i, at.wrow + 16 * i);
            for (int64_t i = lane; i < nrow * db / 4; i += 32)
                cp4(dst + (size_t)r * RW * db + 4 * i, (const uint8_t *)at.dd + 4 * i);
        }
        cp_commit();
    }
    if (!sel) pdl_enter(); /* the inputs are a kernel's output; the weights are not */
    int64_t ar[1] = {0};
    if (SW) {
        a = sw_row<T>(sw, gv_locate(0, blockIdx.y, w, ws, w2, ws2, y, ys, y2, mo, sel, n_routed, in_div, sh_row0).ar0, gs_mem);
    } else {
        ar[0] = gv_locate(0, blockIdx.y, w, ws, w2, ws2, y, ys, y2, mo, sel, n_routed, in_div, sh_row0).ar0;
    }
    for (int r = 0; r < rounds; r++) {
        cp_wait_upto(rounds - 1 - r);
        __syncwarp();
        const int64_t first = (((int64_t)blockIdx.x * rounds + r) * 4 + warp) * RW;
        if (first >= Mt) continue; /* the same in every lane of the warp */
        const int j = lane / G;
        const bool live = first + j < Mt;
        const int jj = live ? j : (int)(Mt - 1 - first); /* a group past the last row runs one, writes nothing */
        float acc[1];
        gemv_row<T, 1, IT, G>(wst + (size_t)(r * RW + jj) * rb, db ? (const uint16_t *)(dst + (size_t)(r * RW + jj) * db) : NULL,
                              w.K, a, ar, 1, false, acc);
        if ((lane & (G - 1)) == 0 && live) {
            const gv_at at = gv_locate(first + j, blockIdx.y, w, ws, w2, ws2, y, ys, y2, mo, sel, n_routed, in_div, sh_row0);
            float *yp = at.y + at.yrow0 * at.ys + at.o;
            *yp = add ? FADD(*yp, acc[0]) : acc[0];
        }
    }
}

// ------------------------------------------------------------------ mmq: int8 tensor cores

static bool mmq_nf = true; /* the second form of the Q4_K / Q5_K block (mmq.cuh) */
extern "C" void hk_mmq_form(bool nf) { mmq_nf = nf; }
/* launch bounds for more blocks an SM: 3 for tiles of 64 rows (62 KB of shared memory each at
 * Q4_K), 4 for 32 and 16, fewer where shared memory holds fewer (HEARTH_CUDA_MMQ_OCC=0:
 * uncapped registers, the form before) */
static bool mmq_occ = true;
extern "C" void hk_mmq_occ(bool on) { mmq_occ = on; }

template <int T, int NT, bool NF, int MB> static int mmq_go_mb(void *st, const hk_w *w, const hk_act *a, int64_t n, const int32_t *offs,
                                                               const int32_t *list, const int32_t *tiles, int64_t grid_y,
                                                               int in_div, float *y, int64_t ys, bool add, herr *e) {
    static bool ready = false;
    constexpr int bytes = mq_smem<T, NT>::TOTAL;
    if (!ready) {
        CUDA_TRY(cudaFuncSetAttribute(mmq_kernel<T, NT, NF, MB>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), e);
        ready = true;
    }
    dim3 g(blocks_of(w->M, MM_BM), (unsigned)grid_y);
    LAUNCH(e, (mmq_kernel<T, NT, NF, MB>), g, 128, bytes, st, *w, *a, n, offs, list, tiles, in_div, y, ys, add);
    return 0;
}
template <int T, int NT, bool NF> static int mmq_go(void *st, const hk_w *w, const hk_act *a, int64_t n, const int32_t *offs,
                                                    const int32_t *list, const int32_t *tiles, int64_t grid_y, int in_div,
                                                    float *y, int64_t ys, bool add, herr *e) {
    constexpr int fit = 227 * 1024 / mq_smem<T, NT>::TOTAL; /* blocks an SM's shared memory holds (Q8_0 at 64 rows: 2) */
    constexpr int MB = (NT >= 8 ? 3 : 4) < fit ? (NT >= 8 ? 3 : 4) : fit;
    if (mmq_occ) return mmq_go_mb<T, NT, NF, MB>(st, w, a, n, offs, list, tiles, grid_y, in_div, y, ys, add, e);
    return mmq_go_mb<T, NT, NF, 1>(st, w, a, n, offs, list, tiles, grid_y, in_div, y, ys, add, e);
}

template <int T, int NT> static int mmq_launch(void *st, const hk_w *w, const hk_act *a, int64_t n, const int32_t *offs,
                                               const int32_t *list, const int32_t *tiles, int64_t grid_y, int in_div,
                                               float *y, int64_t ys, bool add, herr *e) {
    constexpr bool two = T == QT_Q4_K || T == QT_Q5_K; /* the types with a second form */
    if (two && mmq_nf) return mmq_go<T, NT, two>(st, w, a, n, offs, list, tiles, grid_y, in_div, y, ys, add, e);
    return mmq_go<T, NT, false>(st, w, a, n, offs, list, tiles, grid_y, in_div, y, ys, add, e);
}

// ------------------------------------------------------------------ float weights

#define FM_TILE 8  /* rows per weight-row read */

// NT rows against weight row wr: lane l takes the groups of eight weights c = l, l+32, ...
// (dq8), each row's sum in that order with fma, then the warp tree: a row's bits are the
// same whatever NT and whichever rows share the tile. The weights of FM_AHEAD groups are
// loaded before the first is used (the order of the sums is the same); with wait set,
// pdl_enter follows the first of those loads (gemv_row).
#define FM_AHEAD 4
template <int T, int NT>
__device__ __forceinline__ void fm_rows(const uint8_t *wr, int64_t K, const float *const *xr, bool wait, float *acc) {
    const int lane = threadIdx.x & 31;
    const int64_t ng = K / 8;
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i] = 0.0f;
    bool entered = !wait;
    for (int64_t c0 = lane; c0 < ng; c0 += 32 * FM_AHEAD) {
        float wv[FM_AHEAD][8];
#pragma unroll
        for (int u = 0; u < FM_AHEAD; u++)
            if (c0 + 32 * u < ng) dq8<T>(wr, c0 + 32 * u, wv[u]);
        if (!entered) pdl_enter(), entered = true;
#pragma unroll
        for (int u = 0; u < FM_AHEAD; u++) {
            const int64_t c = c0 + 32 * u;
            if (c >= ng) break;
#pragma unroll
            for (int i = 0; i < NT; i++) {
                const float4 p = ((const float4 *)xr[i])[2 * c], q = ((const float4 *)xr[i])[2 * c + 1];
                const float *v = wv[u];
                float s = acc[i];
                s = fmaf(v[0], p.x, s), s = fmaf(v[1], p.y, s), s = fmaf(v[2], p.z, s), s = fmaf(v[3], p.w, s);
                s = fmaf(v[4], q.x, s), s = fmaf(v[5], q.y, s), s = fmaf(v[6], q.z, s), s = fmaf(v[7], q.w, s);
                acc[i] = s;
            }
        }
    }
    if (!entered) pdl_enter(); /* a lane with no group */
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i] = warp_sum(acc[i]);
}

// a warp per output o (4 per block); dense: blockIdx.y is the tile of rows FM_TILE y ..; pairs
// (sel set): blockIdx.y is pair p as in gemv_kernel. tail (dense): the launch's last block
// then does its work (tail.cuh).
template <int T>
__device__ __forceinline__ void fmm_body(const hk_w &w, const hk_w &ws, const float *x, int64_t xs, int64_t n,
                                         const int32_t *sel, int64_t n_routed, int in_div, int64_t sh_row0, float *y,
                                         int64_t ys, bool add) {
    const int64_t o = (int64_t)blockIdx.x * 4 + threadIdx.x / 32;
    if (o >= w.M || sel) pdl_enter(); /* the dense rows enter after their first weights' loads (fm_rows) */
    if (o >= w.M) return;
    if (sel) {
        const int64_t p = blockIdx.y;
        const uint8_t *wr = p < n_routed ? (const uint8_t *)w.d + (size_t)sel[p] * w.slice_bytes + (size_t)o * w.row_bytes
                                         : (const uint8_t *)ws.d + (size_t)o * ws.row_bytes;
        const float *xr[1] = {x + (p < n_routed ? p / in_div : p - n_routed + sh_row0) * xs};
        float acc[1];
        fm_rows<T, 1>(wr, w.K, xr, false, acc);
        if ((threadIdx.x & 31) == 0) y[p * ys + o] = acc[0];
        return;
    }
    const uint8_t *wr = (const uint8_t *)w.d + (size_t)o * w.row_bytes;
    const int64_t pb = (int64_t)blockIdx.y * FM_TILE; /* this block's tile of rows */
    const int nt = n - pb < FM_TILE ? (int)(n - pb) : FM_TILE;
    const float *xr[FM_TILE];
#pragma unroll
    for (int i = 0; i < FM_TILE; i++) xr[i] = x + (pb + (i < nt ? i : 0)) * xs;
    float acc[FM_TILE];
    if (nt == 1) fm_rows<T, 1>(wr, w.K, xr, true, acc);
    else if (nt <= 4) fm_rows<T, 4>(wr, w.K, xr, true, acc);
    else fm_rows<T, FM_TILE>(wr, w.K, xr, true, acc);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int i = 0; i < FM_TILE; i++) { /* unrolled: acc indexed by a variable would live in local memory */
            if (i >= nt) break;
            float *yp = y + (pb + i) * ys + o;
            *yp = add ? FADD(*yp, acc[i]) : acc[i];
        }
}
template <int T>
__global__ void __launch_bounds__(128) fmm_kernel(hk_w w, hk_w ws, const float *x, int64_t xs, int64_t n,
                                                  const int32_t *sel, int64_t n_routed, int in_div, int64_t sh_row0,
                                                  float *y, int64_t ys, bool add, const __grid_constant__ hk_tail tail) {
    fmm_body<T>(w, ws, x, xs, n, sel, n_routed, in_div, sh_row0, y, ys, add);
    if (tail.kind) tail_run<1u << HK_TAIL_NORM | 1u << HK_TAIL_ROUTE>(tail, y, gridDim.x * gridDim.y, 0, 1, 1, 0, 0);
}

// Float weights over a prompt's rows (the router: 257 outputs of 2048 inputs a row): fmm_body
// reads its weight row once per 8 rows and each row once per output, which made the router
// 7% of a 32k-deep pass (352 us a layer for 2048 rows on an H100). Here a warp holds FT_O
// outputs x FT_R rows, so every weight group it loads serves FT_R rows and every input group
// FT_O outputs; a block is FT_WO x FT_WR warps (8 outputs x 32 rows). Each (output, row) is
// fm_rows' arithmetic exactly: lane l sums the groups c = l, l + 32, ... in order with fma,
// then warp_sum; so a row's bits are those of a one-row product (decode), whatever the tile.
#define FT_O 4
#define FT_R 8
#define FT_WO 2
#define FT_WR 4
#define FT_MIN_ROWS 16 /* fewer rows: fmm_kernel (its rows share the weight reads well enough) */
template <int T>
__global__ void __launch_bounds__(32 * FT_WO * FT_WR) fmm_tile_kernel(hk_w w, const float *x, int64_t xs, int64_t n, float *y,
                                                                     int64_t ys, bool add) {
    pdl_enter();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t o0 = ((int64_t)blockIdx.x * FT_WO + warp % FT_WO) * FT_O, r0 = ((int64_t)blockIdx.y * FT_WR + warp / FT_WO) * FT_R;
    if (o0 >= w.M || r0 >= n) return;
    const uint8_t *wr[FT_O];
    const float *xr[FT_R];
#pragma unroll
    for (int i = 0; i < FT_O; i++) wr[i] = (const uint8_t *)w.d + (size_t)min(o0 + i, w.M - 1) * w.row_bytes; /* clamped: not written */
#pragma unroll
    for (int k = 0; k < FT_R; k++) xr[k] = x + min(r0 + k, n - 1) * xs;
    float acc[FT_O][FT_R];
#pragma unroll
    for (int i = 0; i < FT_O; i++)
#pragma unroll
        for (int k = 0; k < FT_R; k++) acc[i][k] = 0.0f;
    const int64_t ng = w.K / 8;
    for (int64_t c = lane; c < ng; c += 32) {
        float wv[FT_O][8];
#pragma unroll
        for (int i = 0; i < FT_O; i++) dq8<T>(wr[i], c, wv[i]);
#pragma unroll
        for (int k = 0; k < FT_R; k++) {
            const float4 p = ((const float4 *)xr[k])[2 * c], q = ((const float4 *)xr[k])[2 * c + 1];
#pragma unroll
            for (int i = 0; i < FT_O; i++) {
                const float *v = wv[i];
                float s = acc[i][k];
                s = fmaf(v[0], p.x, s), s = fmaf(v[1], p.y, s), s = fmaf(v[2], p.z, s), s = fmaf(v[3], p.w, s);
                s = fmaf(v[4], q.x, s), s = fmaf(v[5], q.y, s), s = fmaf(v[6], q.z, s), s = fmaf(v[7], q.w, s);
                acc[i][k] = s;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < FT_O; i++)
#pragma unroll
        for (int k = 0; k < FT_R; k++) {
            const float v = warp_sum(acc[i][k]); /* every lane holds the sum; lane FT_R i + k writes it */
            if (lane == FT_R * i + k && o0 + i < w.M && r0 + k < n) {
                float *yp = y + (r0 + k) * ys + o0 + i;
                *yp = add ? FADD(*yp, v) : v;
            }
        }
}

static bool is_float(uint32_t t) { return t == QT_F32 || t == QT_F16 || t == QT_BF16; }
// HEARTH_CUDA_FM_TILE=0 (hk_fm_tile): prompt rows of float weights through fmm_kernel, to
// time the two forms against each other (their bits are the same)
static bool fm_tile_off = false;
extern "C" void hk_fm_tile(bool on) { fm_tile_off = !on; }

// HEARTH_CUDA_GEMV_STAGE=1 (hk_gemv_stage): one-row products through gemv_staged_kernel. Off
// by default until a GPU run has checked and timed it (bench/device_f7.sh's forms).
static bool gs_on = false;
extern "C" void hk_gemv_stage(bool on) { gs_on = on; }

// rounds a block of gemv_staged_kernel takes for Mt rows x pairs: as many as 48 KB of shared
// memory holds (at most GS_MAX_ROUNDS) while the grid keeps at least two blocks an SM
// (132 SMs); 0 where the rows cannot be staged (not whole 16-byte pieces, scales not whole
// 4-byte pieces, a group of rows across w and w2, a slice not 16-byte aligned)
static int gs_rounds(const hk_w &w, const hk_w &w2, const hk_w &ws, const hk_w &ws2, int RW, int64_t pairs, size_t swb) {
    const size_t rb = w.row_bytes, db = w.dd ? 2 * w.dd_row : 0;
    auto fits = [&](const hk_w &x) { /* rows and scales laid as w's, slices on 16 and 4 bytes */
        return !x.d || (x.row_bytes == rb && (x.dd ? 2 * x.dd_row : 0) == db && x.slice_bytes % 16 == 0 && (2 * x.dd_slice) % 4 == 0);
    };
    if (rb % 16 || (RW * db) % 4 || (w2.M && w.M % (4 * RW)) || !fits(w) || !fits(w2) || !fits(ws) || !fits(ws2)) return 0;
    const int64_t groups = (w.M + w2.M + 4 * RW - 1) / (4 * RW);
    int r = GS_MAX_ROUNDS;
    while (r > 0 && swb + 4 * (gs_up16((size_t)r * RW * rb) + gs_up16((size_t)r * RW * db)) > 48 * 1024) r--;
    while (r > 1 && (groups + r - 1) / r * pairs < 264) r--;
    return r;
}

// one instantiation of gemv_kernel (or, one input row and staging on, gemv_staged_kernel)
// over the rows of w and w2 (and the pairs, when sel is set)
template <int T, int NR, int IT, int G, bool SW>
static int gemv_go(void *st, const hk_w &w, const hk_w &ws, const hk_w &w2, const hk_w &ws2, const hk_act &a, int64_t n,
                   const int32_t *sel, int64_t n_routed, int64_t n_pairs, int in_div, int64_t sh_row0, float *y, int64_t ys,
                   bool add, float *y2, const gv_sw &sw, const gv_more &mo, const hk_tail &tail, herr *e) {
    const size_t swb = SW ? sw_bytes(sw.F) : 0;
    const unsigned py = sel ? (unsigned)n_pairs : 1u;
    const bool plain = !mo.w3.M && !mo.w4.M && !tail.kind && mo.ys2 == ys; /* the staged form takes neither */
    const int rounds = NR == 1 && gs_on && plain ? gs_rounds(w, w2, ws, ws2, 32 / G, py, swb) : 0;
    if (rounds > 0) {
        const size_t db = w.dd ? 2 * w.dd_row : 0,
                     smem = swb + 4 * (gs_up16((size_t)rounds * (32 / G) * w.row_bytes) + gs_up16((size_t)rounds * (32 / G) * db));
        dim3 g(blocks_of(w.M + w2.M, 4 * (32 / G) * rounds), py);
        LAUNCH(e, (gemv_staged_kernel<T, IT, G, SW>), g, 128, smem, st, w, ws, a, sel, n_routed, in_div, sh_row0, y, ys, add,
               w2, ws2, y2, sw, rounds);
        return 0;
    }
    dim3 g(blocks_of(w.M + w2.M + mo.w3.M + mo.w4.M, 4 * (32 / G)), py);
    if (plain)
        LAUNCH(e, (gemv_kernel<T, NR, IT, G, SW, false>), g, 128, swb, st, w, ws, a, n, sel, n_routed, in_div, sh_row0, y, ys,
               add, w2, ws2, y2, sw, mo, tail);
    else
        LAUNCH(e, (gemv_kernel<T, NR, IT, G, SW, true>), g, 128, swb, st, w, ws, a, n, sel, n_routed, in_div, sh_row0, y, ys,
               add, w2, ws2, y2, sw, mo, tail);
    return 0;
}

// One input row (decode, or the pairs of experts): lanes per row and steps in flight from the
// row's block count nb (gemv_kernel); a few rows: the whole warp per row, 4 steps in flight.
// sw set: the pairs' SwiGLU inputs made in the launch (one input row).
template <int T> static int gemv_launch(void *st, const hk_w *w, const hk_w *ws, const hk_act *a, int64_t n,
                                        const int32_t *sel, int64_t n_routed, int64_t n_pairs, int in_div, int64_t sh_row0,
                                        float *y, int64_t ys, bool add, const hk_w *w2, const hk_w *ws2, float *y2,
                                        const gv_sw *sw, herr *e, const gv_more *mo = NULL, const hk_tail *tail = NULL) {
    const hk_w none = {0};
    const hk_w &wsv = ws ? *ws : none, &w2v = w2 ? *w2 : none, &ws2v = ws2 ? *ws2 : none;
    const gv_sw swv = sw ? *sw : gv_sw{NULL, NULL, 0};
    gv_more mov = {};
    if (mo) mov = *mo;
    else mov.ys2 = ys;
    const hk_tail tv = tail ? *tail : hk_tail{};
    constexpr int LPB = gv<T>::LPB;
    const int64_t nb = w->K / gv<T>::BLK;
#define GV(NR, IT, G, SW) \
    gemv_go<T, NR, IT, G, SW>(st, *w, wsv, w2v, ws2v, *a, n, sel, n_routed, n_pairs, in_div, sh_row0, y, ys, add, y2, swv, mov, \
                              tv, e)
#define GV1(IT, G) (sw ? GV(1, IT, G, true) : GV(1, IT, G, false))
    if (sel || n == 1) {
        if (LPB * nb <= 8) return GV1(1, 8);
        if (LPB * nb <= 16) return GV1(1, 16);
        const int64_t steps = (nb + 32 / LPB - 1) / (32 / LPB);
        return steps <= 1 ? GV1(1, 32) : steps <= 2 ? GV1(2, 32) : GV1(4, 32);
    }
    if (n == 2) return GV(2, 4, 32, false);
    if (n <= 4) return GV(4, 4, 32, false);
    return GV(8, 4, 32, false);
#undef GV1
#undef GV
}

#define GEMV_MAX_ROWS TAIL_ROWS

template <int T> static int qmatmul(void *st, const hk_w *w, const hk_act *a, int64_t n, float *y, int64_t ys, bool add,
                                    herr *e) {
    if (n <= GEMV_MAX_ROWS) return gemv_launch<T>(st, w, NULL, a, n, NULL, 0, 0, 1, 0, y, ys, add, NULL, NULL, NULL, NULL, e);
    if (n >= 64) return mmq_launch<T, 8>(st, w, a, n, NULL, NULL, NULL, (n + 63) / 64, 1, y, ys, add, e);
    return mmq_launch<T, 4>(st, w, a, n, NULL, NULL, NULL, (n + 31) / 32, 1, y, ys, add, e);
}

static int check_act(const hk_w *w, const hk_act *a, herr *e);

extern "C" int hk_matmul2(void *st, const hk_w *w, const hk_w *w2, const hk_act *a, int64_t n, float *y, float *y2, int64_t ys,
                          herr *e) {
    if (n == 0) return 0;
    if (n > GEMV_MAX_ROWS || is_float(w->type) || w2->type != w->type || w2->K != w->K)
        return hk_matmul(st, w, NULL, 0, a, n, y, ys, false, e) < 0 ? -1 : hk_matmul(st, w2, NULL, 0, a, n, y2, ys, false, e);
    if (check_act(w, a, e) < 0) return -1;
    switch (w->type) {
    case QT_Q4_K: return gemv_launch<QT_Q4_K>(st, w, NULL, a, n, NULL, 0, 0, 1, 0, y, ys, false, w2, NULL, y2, NULL, e);
    case QT_Q5_K: return gemv_launch<QT_Q5_K>(st, w, NULL, a, n, NULL, 0, 0, 1, 0, y, ys, false, w2, NULL, y2, NULL, e);
    case QT_Q6_K: return gemv_launch<QT_Q6_K>(st, w, NULL, a, n, NULL, 0, 0, 1, 0, y, ys, false, w2, NULL, y2, NULL, e);
    case QT_Q8_0: return gemv_launch<QT_Q8_0>(st, w, NULL, a, n, NULL, 0, 0, 1, 0, y, ys, false, w2, NULL, y2, NULL, e);
    default: return herr_set(e, "hk_matmul2: weights of type %s", qtype_name(w->type));
    }
}

static int check_act(const hk_w *w, const hk_act *a, herr *e) {
    const bool wants80 = w->type == QT_Q8_0;
    if (!a || !a->q) return herr_set(e, "a %s product without rounded inputs", qtype_name(w->type));
    if (a->K != w->K || a->q80 != wants80 || w->K % 256)
        return herr_set(e, "a %s product of %lld inputs given %s rows of %lld", qtype_name(w->type), (long long)w->K,
                        a->q80 ? "Q8_0" : "Q8_K", (long long)a->K);
    return 0;
}

extern "C" int hk_matmul(void *st, const hk_w *w, const float *x, int64_t xs, const hk_act *a, int64_t n, float *y,
                         int64_t ys, bool add, herr *e) {
    if (n == 0) return 0;
    if (is_float(w->type)) {
        if (w->K % 8 || xs % 4) return herr_set(e, "hk_matmul: rows of %lld weights (stride %lld) are no groups of 8", (long long)w->K, (long long)xs);
        if (n >= FT_MIN_ROWS && !fm_tile_off) {
            dim3 g(blocks_of(w->M, FT_O * FT_WO), blocks_of(n, FT_R * FT_WR));
            DQ_DISPATCH(w->type, LAUNCH(e, fmm_tile_kernel<T_>, g, 32 * FT_WO * FT_WR, 0, st, *w, x, xs, n, y, ys, add));
            return 0;
        }
        const hk_w none = {0};
        dim3 g(blocks_of(w->M, 4), blocks_of(n, FM_TILE));
        DQ_DISPATCH(w->type, LAUNCH(e, fmm_kernel<T_>, g, 128, 0, st, *w, none, x, xs, n, (const int32_t *)NULL, 0, 1, 0, y, ys, add,
                                    hk_tail{}));
        return 0;
    }
    if (check_act(w, a, e) < 0) return -1;
    switch (w->type) {
    case QT_Q4_K: return qmatmul<QT_Q4_K>(st, w, a, n, y, ys, add, e);
    case QT_Q5_K: return qmatmul<QT_Q5_K>(st, w, a, n, y, ys, add, e);
    case QT_Q6_K: return qmatmul<QT_Q6_K>(st, w, a, n, y, ys, add, e);
    case QT_Q8_0: return qmatmul<QT_Q8_0>(st, w, a, n, y, ys, add, e);
    default: return herr_set(e, "hk_matmul: weights of type %s", qtype_name(w->type));
    }
}

extern "C" int hk_tail_rows(void) { return GEMV_MAX_ROWS; }

extern "C" int hk_matmul_tail(void *st, const hk_w *w, const float *x, int64_t xs, const hk_act *a, int64_t n, float *y,
                              int64_t ys, bool add, const hk_tail *t, herr *e) {
    if (n == 0) return 0;
    if (is_float(w->type)) {
        if (w->K % 8 || xs % 4) return herr_set(e, "hk_matmul_tail: rows of %lld weights (stride %lld) are no groups of 8", (long long)w->K, (long long)xs);
        const hk_w none = {0};
        dim3 g(blocks_of(w->M, 4), blocks_of(n, FM_TILE));
        DQ_DISPATCH(w->type, LAUNCH(e, fmm_kernel<T_>, g, 128, 0, st, *w, none, x, xs, n, (const int32_t *)NULL, 0, 1, 0, y, ys, add, *t));
        return 0;
    }
    if (check_act(w, a, e) < 0) return -1;
    if (n > GEMV_MAX_ROWS) return herr_set(e, "hk_matmul_tail: %lld rows (a tail takes at most %d)", (long long)n, GEMV_MAX_ROWS);
#define MT(TT) gemv_launch<TT>(st, w, NULL, a, n, NULL, 0, 0, 1, 0, y, ys, add, NULL, NULL, NULL, NULL, e, NULL, t)
    switch (w->type) {
    case QT_Q4_K: return MT(QT_Q4_K);
    case QT_Q5_K: return MT(QT_Q5_K);
    case QT_Q6_K: return MT(QT_Q6_K);
    case QT_Q8_0: return MT(QT_Q8_0);
    default: return herr_set(e, "hk_matmul_tail: weights of type %s", qtype_name(w->type));
    }
#undef MT
}

// up to 4 weights of one type over the same rows in one launch (gv_locate's segments)
template <int T> static int qmatmul_n(void *st, const hk_out *o, int k, const hk_act *a, int64_t n, herr *e) {
    gv_more mo = {};
    mo.ys2 = k > 1 ? o[1].ys : o[0].ys;
    if (k > 2) mo.w3 = *o[2].w, mo.y3 = o[2].y, mo.ys3 = o[2].ys;
    if (k > 3) mo.w4 = *o[3].w, mo.y4 = o[3].y, mo.ys4 = o[3].ys;
    return gemv_launch<T>(st, o[0].w, NULL, a, n, NULL, 0, 0, 1, 0, o[0].y, o[0].ys, false, k > 1 ? o[1].w : NULL, NULL,
                          k > 1 ? o[1].y : NULL, NULL, e, &mo, NULL);
}

extern "C" int hk_matmul_n(void *st, const hk_out *out, int n_out, const hk_act *a, int64_t n, herr *e) {
    for (int i = 0; i < n_out;) {
        const hk_w *w = out[i].w;
        int k = 1;
        if (n > 0 && n <= GEMV_MAX_ROWS && !is_float(w->type))
            while (k < 4 && i + k < n_out && out[i + k].w->type == w->type && out[i + k].w->K == w->K) k++;
        if (k == 1) {
            if (hk_matmul(st, w, NULL, 0, a, n, out[i].y, out[i].ys, false, e) < 0) return -1;
        } else {
            if (check_act(w, a, e) < 0) return -1;
            int rc;
            switch (w->type) {
            case QT_Q4_K: rc = qmatmul_n<QT_Q4_K>(st, out + i, k, a, n, e); break;
            case QT_Q5_K: rc = qmatmul_n<QT_Q5_K>(st, out + i, k, a, n, e); break;
            case QT_Q6_K: rc = qmatmul_n<QT_Q6_K>(st, out + i, k, a, n, e); break;
            case QT_Q8_0: rc = qmatmul_n<QT_Q8_0>(st, out + i, k, a, n, e); break;
            default: rc = herr_set(e, "hk_matmul_n: weights of type %s", qtype_name(w->type));
            }
            if (rc < 0) return -1;
        }
        i += k;
    }
    return 0;
}

// the same rows from row r0 on
static hk_act act_from(const hk_act *a, int64_t r0) {
    hk_act b = *a;
    b.q += r0 * a->K;
    b.d += r0 * (a->q80 ? a->K / 32 : a->K / 256);
    if (b.s) b.s += r0 * (a->K / 32);
    return b;
}

template <int T> static int qmoe(void *st, const hk_w *w, const hk_w *ws, const int32_t *sel, int64_t n_routed,
                                 int64_t n_pairs, int in_div, int64_t sh_row0, const hk_act *a, const hk_moe_sorted *so,
                                 float *y, int64_t ys, const hk_w *w2, const hk_w *ws2, float *y2, herr *e) {
    if (!so) return gemv_launch<T>(st, w, ws, a, 1, sel, n_routed, n_pairs, in_div, sh_row0, y, ys, false, w2, ws2, y2, NULL, e);
    if (so->tile != 16 && so->tile != 32) return herr_set(e, "hk_moe_matmul: tiles of %d pairs (16 or 32)", so->tile);
    for (int k = 0; k < (w2 ? 2 : 1); k++) {
        const hk_w *wk = k ? w2 : w, *wsk = k ? ws2 : ws;
        float *yk = k ? y2 : y;
        if (n_routed && (so->tile == 32 ? mmq_launch<T, 4>(st, wk, a, n_routed, so->offs, so->list, so->tiles, so->max_tiles,
                                                           in_div, yk, ys, false, e)
                                         : mmq_launch<T, 2>(st, wk, a, n_routed, so->offs, so->list, so->tiles, so->max_tiles,
                                                           in_div, yk, ys, false, e)) < 0)
            return -1;
        if (wsk && n_pairs > n_routed) { /* the shared expert over its rows, into the pairs past the routed ones */
            const hk_act as = act_from(a, sh_row0);
            if (qmatmul<T>(st, wsk, &as, n_pairs - n_routed, yk + n_routed * ys, ys, false, e) < 0) return -1;
        }
    }
    return 0;
}

static int moe_check(const hk_w *w, const hk_w *ws, const hk_act *a, herr *e) {
    if (ws && (ws->type != w->type || ws->K != w->K || ws->M != w->M))
        return herr_set(e, "hk_moe_matmul: the shared expert (%s) and the experts (%s) differ in type or shape",
                        qtype_name(ws->type), qtype_name(w->type));
    if (is_float(w->type)) return herr_set(e, "hk_moe_matmul: float experts take hk_moe_matmul_f32");
    return check_act(w, a, e);
}

extern "C" int hk_moe_matmul2(void *st, const hk_w *w, const hk_w *ws, const hk_w *w2, const hk_w *ws2, const int32_t *sel,
                              int64_t n_routed, int64_t n_pairs, int in_div, int64_t sh_row0, const hk_act *a,
                              const hk_moe_sorted *sorted, float *y, float *y2, int64_t ys, herr *e) {
    if (n_pairs == 0) return 0;
    if (moe_check(w, ws, a, e) < 0 || (w2 && moe_check(w2, ws2, a, e) < 0)) return -1;
    if (w2 && (w2->type != w->type || w2->K != w->K)) return herr_set(e, "hk_moe_matmul2: the two weights differ in type");
    switch (w->type) {
    case QT_Q4_K: return qmoe<QT_Q4_K>(st, w, ws, sel, n_routed, n_pairs, in_div, sh_row0, a, sorted, y, ys, w2, ws2, y2, e);
    case QT_Q5_K: return qmoe<QT_Q5_K>(st, w, ws, sel, n_routed, n_pairs, in_div, sh_row0, a, sorted, y, ys, w2, ws2, y2, e);
    case QT_Q6_K: return qmoe<QT_Q6_K>(st, w, ws, sel, n_routed, n_pairs, in_div, sh_row0, a, sorted, y, ys, w2, ws2, y2, e);
    case QT_Q8_0: return qmoe<QT_Q8_0>(st, w, ws, sel, n_routed, n_pairs, in_div, sh_row0, a, sorted, y, ys, w2, ws2, y2, e);
    default: return herr_set(e, "hk_moe_matmul: experts of type %s", qtype_name(w->type));
    }
}

extern "C" int hk_moe_matmul(void *st, const hk_w *w, const hk_w *ws, const int32_t *sel, int64_t n_routed, int64_t n_pairs,
                             int in_div, int64_t sh_row0, const hk_act *a, const hk_moe_sorted *sorted, float *y,
                             int64_t ys, herr *e) {
    return hk_moe_matmul2(st, w, ws, NULL, NULL, sel, n_routed, n_pairs, in_div, sh_row0, a, sorted, y, NULL, ys, e);
}

extern "C" int hk_moe_down_swiglu(void *st, const hk_w *w, const hk_w *ws, const int32_t *sel, int64_t n_routed,
                                  int64_t n_pairs, const float *g, const float *u, float *y, int64_t ys, const hk_tail *t,
                                  herr *e) {
    if (n_pairs == 0) return 0;
    const int64_t F = w->K;
    const hk_act none = {NULL, NULL, NULL, F, w->type == QT_Q8_0};
    if (ws && (ws->type != w->type || ws->K != w->K || ws->M != w->M))
        return herr_set(e, "hk_moe_down_swiglu: the shared expert (%s) and the experts (%s) differ in type or shape",
                        qtype_name(ws->type), qtype_name(w->type));
    if (F % 256) return herr_set(e, "hk_moe_down_swiglu: rows of %lld cannot be rounded in blocks of 256", (long long)F);
    if (t && t->kind == HK_TAIL_COMBINE && (ys != t->E || w->M != t->E))
        return herr_set(e, "hk_moe_down_swiglu: a combine of rows of %lld over outputs of %lld", (long long)t->E, (long long)w->M);
    const gv_sw sw = {g, u, F};
#define DS(TT) gemv_launch<TT>(st, w, ws, &none, 1, sel, n_routed, n_pairs, 1, n_routed, y, ys, false, NULL, NULL, NULL, &sw, e, NULL, t)
    switch (w->type) {
    case QT_Q4_K: return DS(QT_Q4_K);
    case QT_Q5_K: return DS(QT_Q5_K);
    case QT_Q6_K: return DS(QT_Q6_K);
    case QT_Q8_0: return DS(QT_Q8_0);
#undef DS
    default: return herr_set(e, "hk_moe_down_swiglu: experts of type %s", qtype_name(w->type));
    }
}

extern "C" int hk_moe_matmul_f32(void *st, const hk_w *w, const hk_w *ws, const int32_t *sel, int64_t n_routed,
                                 int64_t n_pairs, int in_div, int64_t sh_row0, const float *x, int64_t xs, float *y,
                                 int64_t ys, herr *e) {
    if (n_pairs == 0) return 0;
    if (!is_float(w->type)) return herr_set(e, "hk_moe_matmul_f32: experts of type %s", qtype_name(w->type));
    if (w->K % 8 || xs % 4) return herr_set(e, "hk_moe_matmul_f32: rows of %lld are no groups of 8", (long long)w->K);
    if (ws && ws->type != w->type) return herr_set(e, "hk_moe_matmul_f32: the shared expert's type differs");
    const hk_w none = {0};
    dim3 g(blocks_of(w->M, 4), (unsigned)n_pairs);
    DQ_DISPATCH(w->type, LAUNCH(e, fmm_kernel<T_>, g, 128, 0, st, *w, ws ? *ws : none, x, xs, n_pairs, sel, n_routed,
                                in_div, sh_row0, y, ys, false, hk_tail{}));
    return 0;
}
