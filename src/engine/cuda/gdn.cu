// gdn.cu: the Gated DeltaNet layer's kernels: the causal conv over [ring; rows] with the L2
// norms and gates (and, in decode, the rings), the rings (points and the hand-off to the next
// pass), the delta rule row by row, and the gated RMSNorm fused with the rounding for the
// out-projection.
//
// The delta rule (S the lane, 128 x 128, rows the key dim): per row, S = exp(g) S; d = beta
// (v - S^T k); S += k d^T; o = S^T q. A column of S needs only itself, so a block takes 32
// columns of one value head (4 blocks a head): warp w holds rows 32w..32w+31 of the block's
// columns in registers (lane = column), its partial dots meet in shared memory and are
// summed in one fixed order. A point after row m is the columns as they stand then, so
// marks are exact by construction and never change the pass.
//
// The engine's default is instead the chunked WY form of gdn_chunk.cuh (hk_gdn_chunk below:
// other bits, the same contract); HEARTH_CUDA_GDN_CHUNK=0 (backend.c) runs this row rule.
#include "engine/cuda/common.cuh"
#include "engine/cuda/act.cuh"
#include "engine/cuda/tail.cuh"

// Planted defects for the gates (src/engine/mutant.h): this file is compiled a second time
// with -DHEARTH_MUTANTS into the gates' library only; there KMUT(bit) reads the defect named
// by HEARTH_MUTANT (copied to the device at the first GDN launch), elsewhere it is the
// constant 0 and the defects are compiled out.
enum {
    M_NEIGHBOUR = 1 << 0,     /* neighbour_leak: a piece's conv reads the pass rows before it */
    M_RING_SKIP = 1 << 1,     /* ring_skip: a mark's ring not copied */
    M_RING_REVERSE = 1 << 2,  /* ring_reverse: the ring handed to the next pass in reverse order */
    M_COPY_LATE = 1 << 3,     /* copy_late: a lane point copied one row late */
    M_COPY_EARLY = 1 << 4,    /* copy_early_decay: a lane copied before its row's decay and update */
    M_POINT_INPLACE = 1 << 5, /* point_inplace: the copy moves the live state's bits */
    M_DECAY_SKIP = 1 << 6,    /* decay_skip: a lane point forgets the decay of the state before its
                               * chunk (the chunked form only: the row rule has no chunk) */
};
#ifdef HEARTH_MUTANTS
extern "C" bool mutant_on(const char *name);
static __constant__ unsigned gdn_mut;
#define KMUT(bit) (gdn_mut & (bit))
static int mut_load(herr *e) {
    static bool done;
    if (done) return 0;
    static const struct { const char *name; unsigned bit; } table[] = {
        {"neighbour_leak", M_NEIGHBOUR}, {"ring_skip", M_RING_SKIP}, {"ring_reverse", M_RING_REVERSE},
        {"copy_late", M_COPY_LATE}, {"copy_early_decay", M_COPY_EARLY}, {"point_inplace", M_POINT_INPLACE},
        {"decay_skip", M_DECAY_SKIP}};
    unsigned m = 0;
    for (const auto &t : table) m |= mutant_on(t.name) ? t.bit : 0u;
    CUDA_TRY(cudaMemcpyToSymbol(gdn_mut, &m, sizeof m), e);
    CUDA_TRY(cudaDeviceSynchronize(), e); /* the engine's stream does not wait for the legacy one */
    done = true;
    return 0;
}
#else
#define KMUT(bit) 0u
static int mut_load(herr *) { return 0; }
#endif


#include "engine/cuda/gdn_conv.cuh"
#include "engine/cuda/gdn_chunk.cuh"

extern "C" int hk_gdn_conv_norm(void *st, const float *qkv, float *ring0, size_t seq_stride, const float *w,
                                const int32_t *row_piece, const hk_piece *pieces, int64_t n, const hk_mark *marks,
                                float *stage0, size_t stage_stride, int ring_too, float *cv, float *b, float *a,
                                const float *ssm_a, const float *dt, int64_t S, int64_t Gk, int64_t Gv, int64_t cd,
                                int64_t dc, float eps, herr *e) {
    if (n == 0) return 0;
    if (mut_load(e) < 0) return -1;
    if (S % 32 || cd % S || dc - 1 > RING_MAX)
        return herr_set(e, "hk_gdn_conv_norm: heads of %lld channels, a conv of %lld taps", (long long)S, (long long)dc);
    dim3 g(blocks_of(cd / S, 8), (unsigned)n);
    LAUNCH(e, conv_norm_kernel, g, 256, 0, st, qkv, ring0, seq_stride, w, row_piece, pieces, marks, stage0,
           stage_stride, ring_too, cv, b, a, ssm_a, dt, S, Gk, Gv, cd, dc, eps);
    return 0;
}

extern "C" int hk_gdn_ring(void *st, const float *qkv, float *ring0, size_t seq_stride, const hk_piece *pieces, int n_pieces,
                           const hk_mark *marks, int n_marks, float *stage0, size_t stage_stride, int64_t cd, int64_t dc,
                           herr *e) {
    if (n_pieces == 0) return 0;
    if (dc - 1 > RING_MAX) return herr_set(e, "hk_gdn_ring: a conv of %lld taps", (long long)dc);
    dim3 g(blocks_of(cd, 256), (unsigned)n_pieces);
    LAUNCH(e, ring_kernel, g, 256, 0, st, qkv, ring0, seq_stride, pieces, marks, stage0, stage_stride, cd, dc);
    return 0;
}

#define DS 128   /* the lane's side */
#define DCOLS 32 /* columns per block */
#define DCH 16   /* rows staged in shared memory at a time */

// grid (Gv * 4, n_pieces), 128 threads: value head h = blockIdx.x / 4, columns
// c0..c0+31 (c0 = 32 (blockIdx.x % 4)); warp w holds st[i] = S[32w + i][c0 + lane].
__global__ void __launch_bounds__(128) delta_kernel(const float *cv, const float *b, const float *a, float *lane0,
                                                    size_t seq_stride, const hk_piece *pieces, const hk_mark *marks,
                                                    float *stage0, size_t stage_stride, int64_t Gk, int64_t Gv, int64_t cd,
                                                    hk_gtail gt, float *o) {
    pdl_enter();
    __shared__ __align__(16) float qs[DCH][DS], ks[DCH][DS], vs[DCH][DCOLS];
    __shared__ float bs[DCH], gs[DCH];
    __shared__ float part[4][DCOLS];
    const int64_t h = blockIdx.x / 4, hk = h % Gk, c0 = (int64_t)(blockIdx.x % 4) * DCOLS;
    const hk_piece *pc = &pieces[blockIdx.y];
    const int tid = threadIdx.x, w = tid / 32, lane = tid & 31;
    const int64_t col = c0 + lane;
    float *lane_p = lane0 + (size_t)pc->seq * seq_stride + (size_t)(h * DS * DS);
    float st[32];
#pragma unroll
    for (int i = 0; i < 32; i++) st[i] = lane_p[(32 * w + i) * DS + col];
    int mk = 0;
    /* a chunk of DCH rows' q, k (8 float4 a thread), the block's v columns (one float4), beta
     * and gate: the next chunk's loads are in flight while this one is computed */
    float4 pq[8], pv;
    float pb = 0.0f, pg = 0.0f;
    auto fetch = [&](int64_t t0) {
        const int nrows = pc->n - t0 < DCH ? (int)(pc->n - t0) : DCH;
#pragma unroll
        for (int it = 0; it < 8; it++) {
            const int i = tid + 128 * it, rr = i / 64, c4 = i % 64;
            pq[it] = make_float4(0, 0, 0, 0);
            if (rr < nrows) {
                const float *row = cv + (pc->r0 + t0 + rr) * cd;
                pq[it] = c4 < 32 ? ((const float4 *)(row + hk * DS))[c4] : ((const float4 *)(row + Gk * DS + hk * DS))[c4 - 32];
            }
        }
        const int rv = tid / 8, c8 = tid % 8;
        pv = rv < nrows ? ((const float4 *)(cv + (pc->r0 + t0 + rv) * cd + 2 * Gk * DS + h * DS + c0))[c8] : make_float4(0, 0, 0, 0);
        if (tid < nrows) pb = b[(pc->r0 + t0 + tid) * Gv + h], pg = a[(pc->r0 + t0 + tid) * Gv + h];
    };
    fetch(0);
    for (int64_t t0 = 0; t0 < pc->n; t0 += DCH) {
        const int nrows = pc->n - t0 < DCH ? (int)(pc->n - t0) : DCH;
        __syncthreads(); /* the previous rows are done with the stage */
#pragma unroll
        for (int it = 0; it < 8; it++) {
            const int i = tid + 128 * it, rr = i / 64, c4 = i % 64;
            if (c4 < 32) *(float4 *)&qs[rr][4 * c4] = pq[it];
            else *(float4 *)&ks[rr][4 * (c4 - 32)] = pq[it];
        }
        *(float4 *)&vs[tid / 8][4 * (tid % 8)] = pv;
        if (tid < nrows) bs[tid] = pb, gs[tid] = expf(pg);
        __syncthreads();
        if (t0 + DCH < pc->n) fetch(t0 + DCH);
        for (int rr = 0; rr < nrows; rr++) {
            const float eg = gs[rr];
            if (KMUT(M_COPY_EARLY))
                for (; mk < pc->n_marks && marks[pc->mark0 + mk].m == t0 + rr + 1; mk++) {
                    float *dst = stage0 + (size_t)marks[pc->mark0 + mk].slot * stage_stride + (size_t)(h * DS * DS);
                    for (int i = 0; i < 32; i++) dst[(32 * w + i) * DS + col] = st[i];
                }
            const float *kk = ks[rr] + 32 * w, *qq = qs[rr] + 32 * w;
            float kv = 0;
#pragma unroll
            for (int i = 0; i < 32; i++) {
                st[i] *= eg;
                kv = fmaf(st[i], kk[i], kv);
            }
            part[w][lane] = kv;
            __syncthreads();
            kv = (part[0][lane] + part[1][lane]) + (part[2][lane] + part[3][lane]);
            const float d = bs[rr] * (vs[rr][lane] - kv);
            float out = 0;
#pragma unroll
            for (int i = 0; i < 32; i++) {
                st[i] = fmaf(kk[i], d, st[i]);
                out = fmaf(st[i], qq[i], out);
            }
            __syncthreads(); /* every warp has read part */
            part[w][lane] = out;
            __syncthreads();
            if (w == 0) {
                const int64_t r = pc->r0 + t0 + rr;
                o[r * (Gv * DS) + h * DS + col] = (part[0][lane] + part[1][lane]) + (part[2][lane] + part[3][lane]);
            }
            const int64_t t = t0 + rr;
            while (mk < pc->n_marks && marks[pc->mark0 + mk].m + (KMUT(M_COPY_LATE) ? 1 : 0) == t + 1) {
                float *dst = stage0 + (size_t)marks[pc->mark0 + mk].slot * stage_stride + (size_t)(h * DS * DS);
                if (KMUT(M_POINT_INPLACE))
                    for (int i = 0; i < 32; i++) st[i] = __int_as_float(__float_as_int(st[i]) ^ 1);
#pragma unroll
                for (int i = 0; i < 32; i++) dst[(32 * w + i) * DS + col] = st[i];
                mk++;
            }
            __syncthreads(); /* part is read before the next row writes it */
        }
    }
#pragma unroll
    for (int i = 0; i < 32; i++) lane_p[(32 * w + i) * DS + col] = st[i];
    if (gt.z) gated_tail(gt, o, pc->r0, h, Gv);
}

extern "C" int hk_gdn_delta(void *st, const float *cv, const float *b, const float *a, float *lane0, size_t seq_stride,
                            const hk_piece *pieces, int n_pieces, const hk_mark *marks, float *stage0, size_t stage_stride,
                            int64_t S, int64_t Gk, int64_t Gv, int64_t cd, const hk_gtail *gt, float *o, herr *e) {
    if (S != DS) return herr_set(e, "the CUDA engine's delta rule takes ssm_d_state %d, not %lld", DS, (long long)S);
    if (n_pieces == 0) return 0;
    if (gt && gt->z && Gv % 2) return herr_set(e, "hk_gdn_delta: a gated-norm tail over %lld value heads", (long long)Gv);
    const hk_gtail none = {0};
    dim3 g((unsigned)(Gv * 4), (unsigned)n_pieces);
    LAUNCH(e, delta_kernel, g, 128, 0, st, cv, b, a, lane0, seq_stride, pieces, marks, stage0, stage_stride, Gk, Gv, cd,
           gt ? *gt : none, o);
    return 0;
}

// the chunked form (gdn_chunk.cuh): decode (every piece one row) is the state kernel alone,
// making its row's W, U and QK itself; a prompt pass runs the prep over its chunks first
extern "C" int hk_gdn_chunk(void *st, const float *cv, const float *b, const float *a, float *lane0, size_t seq_stride,
                            const hk_piece *pieces, int n_pieces, const hk_chunk *chunks, const int32_t *pchunk, int64_t n,
                            const hk_mark *marks, float *stage0, size_t stage_stride, int64_t S, int64_t Gk, int64_t Gv,
                            int64_t cd, const hk_gdn_scratch *sc, const hk_gconv *gc, const hk_gtail *gt, float *o,
                            herr *e) {
    if (S != GC_DS) return herr_set(e, "the CUDA engine's delta rule takes ssm_d_state %d, not %lld", GC_DS, (long long)S);
    if (n_pieces == 0) return 0;
    if (gc && gc->qkv && (n != n_pieces || Gv % Gk || cd != (2 * Gk + Gv) * S))
        return herr_set(e, "hk_gdn_chunk: the conv in the launch over %lld rows in %d pieces, %lld value heads on %lld", (long long)n,
                        n_pieces, (long long)Gv, (long long)Gk);
    const hk_gconv gnone = {0};
    if (gt && gt->z && (Gv % 2 || n != n_pieces))
        return herr_set(e, "hk_gdn_chunk: a gated-norm tail over %lld value heads, %lld rows in %d pieces", (long long)Gv,
                        (long long)n, n_pieces);
    const hk_gtail none = {0};
    if (mut_load(e) < 0) return -1;
    static bool attrs_set;
    const size_t prep_smem = sizeof(float) * gc_prep_smem_floats(), state_smem = sizeof(float) * gc_state_smem_floats(GC_C);
    if (!attrs_set) { /* over the 48 KB a block gets unasked; set before the first (never captured) pass */
        CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_smem), e);
        CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_state_kernel<GC_C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)state_smem), e);
        attrs_set = true;
    }
    const dim3 gs((unsigned)(Gv * 4), (unsigned)n_pieces);
    if (n == n_pieces) {
        LAUNCH(e, gdn_chunk_state_kernel<1>, gs, GC_THREADS, sizeof(float) * gc_state_smem_floats(1), st, cv, b, a, lane0, seq_stride,
               pieces, chunks, pchunk, marks, stage0, stage_stride, Gk, Gv, cd, (const float *)NULL, (const float *)NULL,
               (const float *)NULL, (const float *)NULL, gc ? *gc : gnone, gt ? *gt : none, o);
        return 0;
    }
    /* the chunks' count is read on the device (anchors add chunks): the grid depends only on
     * the pass's shape (n, n_pieces), so a captured graph serves every pass of that shape */
    const dim3 gp((unsigned)Gv, (unsigned)((n + GC_C - 1) / GC_C + n_pieces));
    LAUNCH(e, gdn_chunk_prep_kernel, gp, 256, prep_smem, st, cv, b, a, pieces, chunks, pchunk, n_pieces, Gk, Gv, cd, sc->w,
           sc->u, sc->qk, sc->g);
    LAUNCH(e, gdn_chunk_state_kernel<GC_C>, gs, GC_THREADS, state_smem, st, cv, b, a, lane0, seq_stride, pieces, chunks, pchunk,
           marks, stage0, stage_stride, Gk, Gv, cd, (const float *)sc->w, (const float *)sc->u, (const float *)sc->qk,
           (const float *)sc->g, gnone, none, o);
    return 0;
}

extern "C" int hk_gdn_gated_norm(void *st, float *o, const float *z, const float *nw, int64_t n, int64_t S, int64_t Gv,
                                 float eps, hk_act *a, herr *e) {
    if (n == 0) return 0;
    if (S != DS || (Gv * S) % 256) return herr_set(e, "hk_gdn_gated_norm: %lld heads of %lld", (long long)Gv, (long long)S);
    hk_act none = {0};
    LAUNCH(e, gated_norm_kernel<>, (unsigned)n, 256, 0, st, o, z, nw, Gv * S, eps, a ? *a : none);
    return 0;
}
