// gdn.cu: the Gated DeltaNet layer's kernels: the causal conv over [ring; rows] with the L2
// norms and gates (and, in decode, the rings), the rings (points and the hand-off to the next
// pass), the delta rule row by row, and the gated RMSNorm fused with the rounding for the
// out-projection.
//
// The delta rule row by row (gdn_row.cuh; S the lane, 128 x 128, rows the key dim): per
// row, S = exp(g) S; d = beta (v - S^T k); S += k d^T; o = S^T q. A column of S needs only
// itself, so a block takes 32 columns of one value head (4 blocks a head): warp w holds rows
// 32w..32w+31 of the block's columns in registers (lane = column), its partial dots meet in
// shared memory and are summed in one fixed order. A point after row m is the columns as
// they stand then, so marks are exact by construction and never change the pass.
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
    const int form = ring_too == 0 && S == 4 * 32 && dc == CONV_FAST ? CONV_PROMPT : ring_too;
    LAUNCH(e, conv_norm_kernel, g, 256, 0, st, qkv, ring0, seq_stride, w, row_piece, pieces, marks, stage0,
           stage_stride, form, cv, b, a, ssm_a, dt, S, Gk, Gv, cd, dc, eps);
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

#include "engine/cuda/gdn_row.cuh"

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

/* the state kernel of chunks of 64 in 512 threads or 256: the same bits (each entry's chains
 * are the same whichever thread makes them). 512 (one block an SM, 16 warps) where the pass's
 * blocks (4 Gv a piece) fit the SMs at once: one piece of 2,048 rows at 32 heads 0.640 ms
 * against 0.802 on an H100; 256 (two blocks an SM) where they do not: four pieces of 512 rows
 * 0.480 against 0.645 (test_cuda's gdn timings, bench/RESULTS.md, thirteenth session).
 * HEARTH_CUDA_GDN_WIDE=0: always 256; hk_gdn_wide(2): always 512 (test_cuda compares the two) */
static int gc_wide = 1; /* 0 never, 1 where the blocks fit the SMs, 2 always (tests) */
static int gc_sms = 0;  /* the device's SMs, read at the first launch */
extern "C" int hk_gdn_wide(int mode) {
    if (mode < 0 || mode > 2) return -1;
    gc_wide = mode;
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
        CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_state_kernel<GC_C, GC_THREADS_WIDE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)state_smem), e);
        if (dev_sms(&gc_sms, e) < 0) return -1;
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
    if (gc_wide == 2 || (gc_wide == 1 && Gv * 4 * n_pieces <= gc_sms)) /* the grid's shape alone: a captured graph keeps its choice */
        LAUNCH(e, (gdn_chunk_state_kernel<GC_C, GC_THREADS_WIDE>), gs, GC_THREADS_WIDE, state_smem, st, cv, b, a, lane0, seq_stride,
               pieces, chunks, pchunk, marks, stage0, stage_stride, Gk, Gv, cd, (const float *)sc->w, (const float *)sc->u,
               (const float *)sc->qk, (const float *)sc->g, gnone, none, o);
    else
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
    const int64_t warps = Gv * S / 256 < 32 ? Gv * S / 256 : 32;
    LAUNCH(e, gated_norm_kernel<>, (unsigned)n, (unsigned)(32 * warps), 0, st, o, z, nw, Gv * S, eps, a ? *a : none);
    return 0;
}
