/* kernels.h: the CUDA engine's kernels behind a C face, for backend.c (the .cu files hold
 * them: base.cu memory, norms and embedding; mmq.cu the matrix products; moe.cu routing
 * and the expert combine; gdn.cu the recurrent layer; attn.cu attention). Device pointers
 * unless a name says h_. Every launcher queues on the stream st (a cudaStream_t) and
 * returns 0, or -1 with e set when the launch failed; hk_sync reports what failed while
 * running.
 *
 * Bits: every kernel computes a row's outputs from that row's inputs alone, in one fixed
 * order of operations that does not look at how many rows share the launch or where they
 * sit (no split-K, no atomics in a sum, reductions in a fixed tree), so the engine's batch
 * invariance and its marks (a point equals a prefill up to it) hold on the GPU as on the
 * CPU. Matrix products of quantized weights round their input rows to 8-bit blocks as the
 * CPU does (Q8_K for K-quants, Q8_0 for Q8_0: quant_quantize_act's bytes), sum each
 * block's integer products exactly (tensor cores or dp4a, whichever a launch takes) and
 * finish every block with quant_dot_ref's float expression, in block order: the GPU's
 * product of a row is the CPU reference dot's bits, whatever path computed it. */
#ifndef HEARTH_CUDA_KERNELS_H
#define HEARTH_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight on the device: M rows of K weights; 3-D: slices (experts) of M rows. Layouts:
 * F32, F16, BF16, Q4_K and Q5_K as in the file (row_bytes per row). Q6_K and Q8_0 are
 * repacked at upload so every block starts 16-byte aligned: Q6_K keeps a block's first
 * 208 bytes (ql, qh, scales) in d and its f16 scale in dd (one per block); Q8_0 keeps the
 * K int8 weights of a row in d and the f16 scales in dd (K/32 per row). */
typedef struct hk_w {
    const void *d;
    const uint16_t *dd;
    uint32_t type;
    int64_t K, M;
    size_t row_bytes, slice_bytes;  /* d: bytes per row, per slice */
    size_t dd_row, dd_slice;        /* dd: halfs per row, per slice */
} hk_w;

/* Activation rows rounded for the integer products: q (rows, K) int8; Q8_K: d (rows, K/256)
 * the block scales and s (rows, K/32) the sums of q over 32; Q8_0: d (rows, K/32) the f16
 * scale as a float, s unused. Sized for `rows` rows of K at open. */
typedef struct hk_act {
    int8_t *q;
    float *d;
    int32_t *s;
    int64_t K;
    bool q80;   /* Q8_0 blocks, else Q8_K */
} hk_act;

/* one span's rows in a pass: rows [r0, r0 + n) of sequence seq, its first at position pos0;
 * its marks are marks[mark0 .. mark0 + n_marks) */
typedef struct hk_piece {
    int64_t r0, n, pos0;
    int32_t seq, mark0, n_marks, pad;
} hk_piece;

/* a point to take after row m of its piece (1 <= m <= n), into staging slot `slot` */
typedef struct hk_mark {
    int64_t m;
    int32_t slot, piece;
} hk_mark;

/* a GDN chunk of a pass (the chunked delta rule, the default): rows [c0, c0 + n) of piece
 * `piece`, n <= 64, laid from the piece's start (on its span's grid) and restarted at the
 * span's anchors; a pass's chunks are in piece order, piece p's at pchunk[p] .. pchunk[p + 1] */
typedef struct hk_chunk {
    int32_t piece, c0, n, pad;
} hk_chunk;

/* the chunked delta rule's pass scratch, rows of the pass up to R: w, u (R, Gv, 128),
 * qk (R, Gv, 64), g (R, Gv) */
typedef struct hk_gdn_scratch {
    float *w, *u, *qk, *g;
} hk_gdn_scratch;

/* attention query tile: rows [r0, r0 + n) of one piece (so one sequence, consecutive
 * positions from pos0) */
typedef struct hk_qtile {
    int32_t r0, n, seq, pad;
    int64_t pos0;
} hk_qtile;

/* Work a launch's last block does once every block's outputs are in (tail.cuh: decode's
 * fusions), with the bits of the separate launch it replaces. cnt: tickets in device memory,
 * zero before the launch and left zero after it (HK_TAIL_COMBINE takes as many as the
 * product has slices of 4 warps' rows, plus one; the others one).
 *   HK_TAIL_NORM: h (n, E) = hk_rmsnorm of x's rows with weight nw, rounded into a and a2
 *   HK_TAIL_ROUTE: sel, wsel = hk_moe_route of the launch's logits (rows at stride ls; X, K)
 *   HK_TAIL_COMBINE: x = hk_moe_combine of the launch's pair outputs (gl at stride gls, so,
 *     wsel, K), then with nw set the next norm as HK_TAIL_NORM */
enum { HK_TAIL_NONE = 0, HK_TAIL_NORM, HK_TAIL_ROUTE, HK_TAIL_COMBINE };
typedef struct hk_tail {
    int kind, X, K;
    unsigned *cnt;
    int64_t n, E, ls, gls;
    float *x, *h, *wsel;
    const float *nw, *gl, *so;
    int32_t *sel;
    float eps;
    hk_act a, a2;
} hk_tail;

/* decode's gated norm as the delta rule's tail (every piece of the pass one row): the last of a
 * row's blocks over two value heads makes their 256 values as hk_gdn_gated_norm does (z, nw,
 * eps; o written back, rounded into a); tickets cnt, n_pieces * Gv / 2. z NULL: none. */
typedef struct hk_gtail {
    const float *z, *nw;
    float eps;
    hk_act a;
    unsigned *cnt;
} hk_gtail;

/* decode's conv in the chunked delta rule's launch (every piece one row, heads of 128, 4
 * taps): each block makes its key head's q and k and its value columns from the input
 * products' row qkv and the rings, as hk_gdn_conv_norm makes them (taps w, gates from the raw
 * products braw, araw with ssm_a, dt, eps), and the rings (points into stage0) are written
 * by the blocks that read them, a key head's q and k rings by the last of its readers
 * (tickets cnt, n_pieces * Gk). qkv NULL: none (cv, b, a are read as made by the conv). */
typedef struct hk_gconv {
    const float *qkv, *w, *ssm_a, *dt, *braw, *araw;
    float *ring0, *stage0;
    size_t ring_stride, stage_stride;
    float eps;
    unsigned *cnt;
} hk_gconv;

/* ---- base.cu ---- */
int hk_malloc(void **p, size_t bytes, herr *e);
void hk_free(void *p);
int hk_host_alloc(void **p, size_t bytes, herr *e);  /* pinned host memory */
void hk_host_free(void *p);
int hk_stream_new(void **st, herr *e);
/* programmatic dependent launch of the kernels (common.cuh), on unless turned off */
void hk_pdl(bool on);
void hk_gemv_stage(bool on); /* one-row products staged through shared memory (mmq.cu) */
void hk_fm_tile(bool on);    /* float weights over prompt rows in warp tiles (mmq.cu; on by default) */
void hk_mmq_form(bool nf);   /* the second form of mmq.cuh's Q4_K / Q5_K block (on by default) */
void hk_mmq_occ(bool on);   /* mmq_kernel's launch bounds for 3 (64-row tiles) or 4 blocks an SM (on by default) */
int hk_gdn_wide(int mode);  /* the chunked delta rule's state kernel in 512 threads: 0 never, 1 where its blocks fit the SMs
                             * (the default), 2 always; -1 for another mode */
void hk_stream_free(void *st);
int hk_h2d(void *d, const void *h, size_t n, herr *e);             /* synchronous: done for every stream */
int hk_d2h(void *h, const void *d, size_t n, herr *e);
int hk_h2d_async(void *st, void *d, const void *h, size_t n, herr *e);
int hk_d2h_async(void *st, void *h, const void *d, size_t n, herr *e);
int hk_memset(void *d, int v, size_t n, herr *e);
int hk_sync(herr *e);
int hk_stream_sync(void *st, herr *e);
int hk_mem_info(size_t *free_b, size_t *total_b, herr *e);
bool hk_type_ok(uint32_t t); /* a weight type the kernels read */
/* Uploads the file's rows of a weight (host src, the file's layout) into w's GPU layout;
 * w->d and w->dd allocated by the caller with hk_w_bytes's sizes. */
void hk_w_bytes(uint32_t type, int64_t K, int64_t rows, size_t *d_bytes, size_t *dd_bytes);
int hk_w_upload(hk_w *w, const void *src, int64_t rows, size_t src_row_bytes, herr *e);

/* Graphs: capture the launches queued on st between begin and end into *graph (an
 * executable graph), then replay it. */
int hk_capture_begin(void *st, herr *e);
int hk_capture_end(void *st, void **graph, herr *e);
int hk_graph_launch(void *st, void *graph, herr *e);
void hk_graph_free(void *graph);

/* Events for the op profile (HEARTH_CUDA_PROFILE): recorded on st, ms between two */
int hk_event_new(void **ev, herr *e);
void hk_event_free(void *ev);
int hk_event_record(void *st, void *ev, herr *e);
float hk_event_ms(void *a, void *b);
/* tok[r] = sampler_argmax of logits row r (rows x V), on the GPU; scratch: hk_argmax_scratch(rows)
 * bytes, zeroed once (its tickets return to zero after every launch) */
size_t hk_argmax_scratch(int64_t rows);
int hk_argmax(void *st, const float *logits, int64_t V, int64_t rows, void *scratch, int32_t *tok, herr *e);

/* an event for ordering alone (no timing), and a stream made to wait for it */
int hk_event_new_sync(void **ev, herr *e);
int hk_stream_wait(void *st, void *ev, herr *e);

/* x (n, E) = rows ids of the embedding te (E = te->K; te in the file's layout) */
int hk_embed(void *st, const hk_w *te, const int32_t *ids, int64_t n, float *x, herr *e);
/* y[i] (n, E) = rmsnorm(x[rows ? rows[i] : i]) * w; then, where a is set, y's rows rounded
 * into a (and into a2) */
int hk_rmsnorm(void *st, const float *x, const int32_t *rows, const float *w, float *y, int64_t n, int64_t E, float eps,
               hk_act *a, hk_act *a2, herr *e);
/* a (n rows of K) = x rounded (quant_quantize_act's bytes and scales) */
int hk_quantize(void *st, const float *x, int64_t xs, int64_t n, hk_act *a, herr *e);

/* ---- mmq.cu ---- */
/* y[r * ys + o] (+)= W[o] . x[r], r < n, o < M; float weights read x (f32, stride xs),
 * quantized ones read a (x rounded by hk_quantize for that type). add: y += the product
 * (the residual), one add per element after the product's last block. */
int hk_matmul(void *st, const hk_w *w, const float *x, int64_t xs, const hk_act *a, int64_t n, float *y, int64_t ys,
              bool add, herr *e);

/* two products of the same rows (a, n rows) and shape of output rows (ys): y = W x, y2 = W2 x,
 * in one launch where both are quantized alike and n is a few rows (decode) */
int hk_matmul2(void *st, const hk_w *w, const hk_w *w2, const hk_act *a, int64_t n, float *y, float *y2, int64_t ys,
               herr *e);
/* products of the same rows a (n rows) by several weights, out[i].y (stride ys) = W_i a: where
 * n <= hk_tail_rows() the runs of weights of one type share a launch (up to 4), else one each */
typedef struct hk_out {
    const hk_w *w;
    float *y;
    int64_t ys;
} hk_out;
int hk_matmul_n(void *st, const hk_out *out, int n_out, const hk_act *a, int64_t n, herr *e);
/* hk_matmul whose launch ends with tail t (HK_TAIL_NORM: of y's rows, x = y; HK_TAIL_ROUTE:
 * of y's rows as logits); n <= hk_tail_rows() for quantized weights */
int hk_matmul_tail(void *st, const hk_w *w, const float *x, int64_t xs, const hk_act *a, int64_t n, float *y, int64_t ys,
                   bool add, const hk_tail *t, herr *e);
int hk_tail_rows(void); /* input rows up to which products take one launch a few rows (and tails) */

/* Expert products over pairs p < n_pairs (a pair: an activation row and an expert):
 * y[p * ys + o] = W_{sel[p]}[o] . act[p / in_div], o < M. Pairs at or past n_routed use the
 * shared expert ws (when set) instead: y[p] = Ws[o] . act[p - n_routed + sh_row0]. With
 * sorted = NULL every pair runs on its own (a few pairs: decode); else sorted (from
 * hk_moe_sort) groups the routed pairs by expert for the tensor cores. A pair's bits are the
 * same either way. */
typedef struct hk_moe_sorted {
    const int32_t *offs;   /* X + 1 offsets of each expert's pairs in list */
    const int32_t *list;   /* the routed pairs grouped by expert */
    const int32_t *tiles;  /* the count, then (expert, first index in list) of each tile of `tile` pairs */
    int64_t max_tiles;     /* grid size: n_routed / tile + min(X, n_routed) bounds the tiles */
    int tile;              /* pairs per tile: hk_moe_tile_for's (16 or 32), as hk_moe_sort laid them */
} hk_moe_sorted;
int hk_moe_matmul(void *st, const hk_w *w, const hk_w *ws, const int32_t *sel, int64_t n_routed, int64_t n_pairs,
                  int in_div, int64_t sh_row0, const hk_act *a, const hk_moe_sorted *sorted, float *y, int64_t ys,
                  herr *e);
/* two weights over the same pairs and rows in one launch (the gate and the up products):
 * y from w (and ws), y2 from w2 (and ws2) */
int hk_moe_matmul2(void *st, const hk_w *w, const hk_w *ws, const hk_w *w2, const hk_w *ws2, const int32_t *sel,
                   int64_t n_routed, int64_t n_pairs, int in_div, int64_t sh_row0, const hk_act *a,
                   const hk_moe_sorted *sorted, float *y, float *y2, int64_t ys, herr *e);
/* the experts' down product (pairs one by one: a few rows) whose input rows are made in the
 * launch: pair p reads silu(g) * u of row p (rows of F = w->K), rounded as hk_swiglu_quant
 * rounds it (the bits of hk_swiglu_quant then hk_moe_matmul with in_div 1, sh_row0 n_routed);
 * t (or NULL): HK_TAIL_COMBINE over the outputs y (ys = E) */
int hk_moe_down_swiglu(void *st, const hk_w *w, const hk_w *ws, const int32_t *sel, int64_t n_routed, int64_t n_pairs,
                       const float *g, const float *u, float *y, int64_t ys, const hk_tail *t, herr *e);
/* the same for float experts over f32 rows x (stride xs), every pair on its own */
int hk_moe_matmul_f32(void *st, const hk_w *w, const hk_w *ws, const int32_t *sel, int64_t n_routed, int64_t n_pairs,
                      int in_div, int64_t sh_row0, const float *x, int64_t xs, float *y, int64_t ys, herr *e);
/* pairs per tensor-core tile for n_routed pairs over X experts: 32 once the experts average
 * 32 pairs (each expert's weights are then read from L2 by half as many tiles), else 16 */
int hk_moe_tile_for(int64_t n_routed, int X);

/* ---- moe.cu ---- */
/* per row (logits at stride ls): softmax over X logits, the top K (ties: the lower id), weights
 * renormalised; X <= 512 */
int hk_moe_route(void *st, const float *logits, int64_t ls, int64_t n, int X, int K, int32_t *sel, float *wsel, herr *e);
/* the n_pairs routed pairs grouped by expert (offs, list, tiles of `tile` pairs: hk_moe_sorted), on the GPU */
int hk_moe_sort(void *st, const int32_t *sel, int64_t n_pairs, int X, int tile, int32_t *offs, int32_t *list, int32_t *tiles,
                herr *e);
/* g = silu(g) * u for n_pairs rows of F, then rounded into a (for the down product) */
int hk_swiglu_quant(void *st, const float *g, const float *u, int64_t n_pairs, int64_t F, hk_act *a, herr *e);
/* x[r] += sum_k wsel[r,k] eo[r*K+k] (slot order) + sigmoid(gl[r * gls]) so[r] (the shared
 * expert, gl its gate logit h2 . gs); then, with nw set, the next layer's norm of the new x
 * as hk_rmsnorm makes it (into h, rounded into a and a2) */
int hk_moe_combine(void *st, float *x, const float *gl, int64_t gls, const float *eo, const float *so, const float *wsel,
                   int64_t n, int64_t E, int K, const float *nw, float *h, float eps, hk_act *a, hk_act *a2, herr *e);

/* ---- gdn.cu ---- */
/* GDN. rings: layer gi's ring of sequence s at ring0 + s * seq_stride, (dc-1, cd) rows.
 * conv and norms: cv (n, cd) = silu(causal conv of [ring; qkv rows of the piece]), its q and
 * k heads (S channels) L2-normed (q also times 1/sqrt(S)); per row b = sigmoid(b), a = A *
 * softplus(a + dt). ring_too (every piece one row): each channel's ring written as
 * hk_gdn_ring writes it, in the same launch; 2: the same, a lane's channels' windows loaded
 * at once where the heads are 128 and the taps 4 (the same bits). ring_too 0 (a prompt) at
 * that shape also loads them at once (the same bits). */
int hk_gdn_conv_norm(void *st, const float *qkv, float *ring0, size_t seq_stride, const float *w, const int32_t *row_piece,
                     const hk_piece *pieces, int64_t n, const hk_mark *marks, float *stage0, size_t stage_stride,
                     int ring_too, float *cv, float *b, float *a, const float *ssm_a, const float *dt, int64_t S,
                     int64_t Gk, int64_t Gv, int64_t cd, int64_t dc, float eps, herr *e);
/* ring points (into stage0 + slot * stage_stride) and each piece's new ring, written over the
 * old; after hk_gdn_conv_norm (which reads the old) */
int hk_gdn_ring(void *st, const float *qkv, float *ring0, size_t seq_stride, const hk_piece *pieces, int n_pieces,
                const hk_mark *marks, int n_marks, float *stage0, size_t stage_stride, int64_t cd, int64_t dc, herr *e);
/* the gated delta rule, row by row per (piece, value head, column group); lanes of sequence
 * s at lane0 + s * seq_stride, (Gv, S, S) with rows the key dim; points into stage0 + slot *
 * stage_stride; o (n, Gv*S). S must be 128. */
int hk_gdn_delta(void *st, const float *cv, const float *b, const float *a, float *lane0, size_t seq_stride,
                 const hk_piece *pieces, int n_pieces, const hk_mark *marks, float *stage0, size_t stage_stride,
                 int64_t S, int64_t Gk, int64_t Gv, int64_t cd, const hk_gtail *gt, float *o, herr *e);
/* the same rule in the chunked WY form (gdn_chunk.cuh): the same lanes, points and o, the
 * pass's chunks in chunks / pchunk (n_pieces + 1 entries); n rows in the pass. A pass whose
 * pieces are all one row (decode) is one launch; others a prep launch and a state launch. */
int hk_gdn_chunk(void *st, const float *cv, const float *b, const float *a, float *lane0, size_t seq_stride,
                 const hk_piece *pieces, int n_pieces, const hk_chunk *chunks, const int32_t *pchunk, int64_t n,
                 const hk_mark *marks, float *stage0, size_t stage_stride, int64_t S, int64_t Gk, int64_t Gv, int64_t cd,
                 const hk_gdn_scratch *sc, const hk_gconv *gc, const hk_gtail *gt, float *o, herr *e);
/* o (n, Gv*S) = rmsnorm per head (weight nw, S) * silu(z), then rounded into a */
int hk_gdn_gated_norm(void *st, float *o, const float *z, const float *nw, int64_t n, int64_t S, int64_t Gv, float eps,
                      hk_act *a, herr *e);

/* ---- attn.cu ---- */
/* attention: per row, q heads (in qf: per head [q D | gate D]) and k heads RMS-normed and
 * roped, k and v stored at the row's position in its sequence's cache (f16 or f32; layer base
 * k0/v0, sequence s at + s * seq_stride elements) */
int hk_attn_prep(void *st, float *qf, float *k, const float *v, const float *qn, const float *kn, const int32_t *row_seq,
                 const int64_t *pos, int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t rope_dims, float theta,
                 float eps, void *k0, void *v0, size_t seq_stride, bool f16, herr *e);
/* ao (n, H*D) = softmax(q k^T / sqrt(D)) v over keys [0, pos] of the row's sequence, times
 * sigmoid(gate). Keys in segments of seg rows (fixed per engine), each over blocks of
 * ATTN_KB keys in order with a running max; then the segments merged in order. tiles:
 * n_tiles query tiles of at most hk_attn_tile_rows(H / Hkv, f16) rows, n_one of them of one
 * row (with f16 rows these take the decode form; the kernels launched depend on it, and
 * on hk_attn_split); part: scratch of n * H * n_seg * hk_attn_part_floats(D) floats. Every row takes the same path
 * whatever shares its tile. With f16 rows and G <= 16 on tensor cores (attn_mma.cuh), else
 * in f32 on CUDA cores. a (or NULL; heads of whole 256-blocks): ao's rows also rounded into
 * a (hk_quantize's bytes). kv_rows: the rows k0 and v0 hold (sequences x positions; the
 * wgmma form's copy-engine fetch reads no row past them). */
int hk_attn(void *st, const float *qf, const hk_qtile *tiles, int n_tiles, int n_one, const int64_t *pos, int64_t n,
            int64_t H, int64_t Hkv, int64_t D, const void *k0, const void *v0, size_t seq_stride, int64_t kv_rows, bool f16,
            int64_t seg, int64_t n_seg, float *part, float *ao, hk_act *a, herr *e);
/* query rows per tile: 64 query vectors / G with f16 KV rows and G <= 16 (the tensor-core
 * form, attn_mma.cuh), else 32 / G (0: no kernel for G) */
int hk_attn_tile_rows(int64_t G, bool f16);
/* the tensor-core prompt kernel: (8, the default) two warpgroups on wgmma (64 vectors a tile,
 * attn_wg.cuh), its mma.sync forms in tiles of 6 or 4 warps, or (0) in pairs of warps; -1 for
 * another count. Tiles change rows (hk_attn_tile_rows), never bits */
#define HK_ATTN_FORM_DEFAULT 8
int hk_attn_form(int warps);
/* the multi-row tiles' split form (a CTA per segment, then a fold over the rows; the same
 * bits): 0 never (the default), 1 when the pass's multi-row tiles times Hkv are fewer than
 * the device's SMs, 2 always (tests); -1 for another mode */
int hk_attn_split(int mode);
/* the wgmma form's K and V blocks through the copy engine (TMA: 1, the default, where the
 * driver makes the views) or every thread's cp.async (0); the same bits; -1 for another value */
int hk_attn_tma(int on);
int64_t hk_attn_part_floats(int64_t D);

#ifdef __cplusplus
}
#endif

#endif
