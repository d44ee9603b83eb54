/* kernels.h: the CUDA engine's kernels behind a C face (kernels.cu), for backend.c. Device
 * pointers unless a name says h_. Every launcher queues on the default stream and returns 0,
 * or -1 with e set when the launch failed; hk_sync reports what failed while running.
 *
 * Every kernel computes a row's outputs from that row's inputs alone, in one fixed order of
 * operations that does not look at how many rows share the launch or where they sit (no
 * split-K, no atomics in a sum, reductions in a fixed tree): the engine's batch invariance
 * and its marks (a point equals a prefill up to it) rest on this, as on the CPU. Activations
 * stay f32; weights are dequantized in the inner loops from the file's blocks. */
#ifndef HEARTH_CUDA_KERNELS_H
#define HEARTH_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* a weight on the device: M rows of K weights (row_bytes each); 3-D: slices of M rows */
typedef struct hk_w {
    const void *d;
    uint32_t type;
    int64_t K, M;
    size_t row_bytes, slice_bytes;
} hk_w;

/* one span's rows in a pass: rows [r0, r0 + n) of sequence seq; its marks are
 * marks[mark0 .. mark0 + n_marks) */
typedef struct hk_piece {
    int64_t r0, n;
    int32_t seq, mark0, n_marks, pad;
} hk_piece;

/* a point to take after row m of its piece (1 <= m <= n), into staging slot `slot` */
typedef struct hk_mark {
    int64_t m;
    int32_t slot, piece;
} hk_mark;

int hk_malloc(void **p, size_t bytes, herr *e);
void hk_free(void *p);
int hk_h2d(void *d, const void *h, size_t n, herr *e);
int hk_d2h(void *h, const void *d, size_t n, herr *e);
int hk_memset(void *d, int v, size_t n, herr *e);
int hk_sync(herr *e);
int hk_mem_info(size_t *free_b, size_t *total_b, herr *e);
bool hk_type_ok(uint32_t t); /* a weight type the kernels read */

/* x (n, E) = rows ids of the embedding te (E = te->K) */
int hk_embed(const hk_w *te, const int32_t *ids, int64_t n, float *x, herr *e);
/* y[i] (n, E) = rmsnorm(x[rows ? rows[i] : i]) * w */
int hk_rmsnorm(const float *x, const int32_t *rows, const float *w, float *y, int64_t n, int64_t E, float eps, herr *e);
/* x += y, n floats */
int hk_add(float *x, const float *y, int64_t n, herr *e);
/* y[r * ys + o] = W[o] . x[r * xs], r < n, o < M */
int hk_matmul(const hk_w *w, const float *x, int64_t xs, int64_t n, float *y, int64_t ys, herr *e);

/* MoE: softmax over X logits per row, top K (ties: the lower id), weights renormalised */
int hk_moe_route(const float *logits, int64_t n, int X, int K, int32_t *sel, float *wsel, herr *e);
/* the n_pairs (row, slot) pairs grouped by expert: offs (2X + 2), list[offs[e]..offs[e+1]) =
 * the pairs r * K + slot of expert e (in no fixed order: each pair's result is its own);
 * offs[X + 1] experts have pairs, listed ascending from offs[X + 2]. counts: X + 1 ints. */
int hk_moe_sort(const int32_t *sel, int64_t n_pairs, int X, int32_t *counts, int32_t *offs, int32_t *list, herr *e);
/* for every expert e and pair p of it: y[list[p] * ys + o] = W_e[o] . x[(list[p] / in_div) * xs] */
int hk_moe_matmul(const hk_w *w, int X, int64_t n_pairs, const int32_t *offs, const int32_t *list, int in_div,
                  const float *x, int64_t xs, float *y, int64_t ys, herr *e);
/* g = silu(g) * u, n floats */
int hk_swiglu(float *g, const float *u, int64_t n, herr *e);
/* out (n, E) = sum_k wsel[r,k] eo[r*K+k] (slot order) + sigmoid(h2[r] . gs) so[r] */
int hk_moe_combine(const float *h2, const float *gs, const float *eo, const float *so, const float *wsel, float *out,
                   int64_t n, int64_t E, int K, herr *e);

/* GDN. rings: layer gi's ring of sequence s at ring0 + s * seq_stride, (dc-1, cd) rows;
 * conv: cv (n, cd) = silu(causal conv of [ring; qkv rows of the piece]) */
int hk_gdn_conv(const float *qkv, const float *ring0, size_t seq_stride, const float *w, const int32_t *row_piece,
                const hk_piece *pieces, int64_t n, int64_t cd, int64_t dc, float *cv, herr *e);
/* ring points (into stage0 + slot * stage_stride) and each piece's new ring (via tmp: n_pieces
 * rings), then written over the old */
int hk_gdn_ring(const float *qkv, float *ring0, size_t seq_stride, const hk_piece *pieces, int n_pieces,
                const hk_mark *marks, int n_marks, float *stage0, size_t stage_stride, int64_t cd, int64_t dc, float *tmp,
                herr *e);
/* per row: q and k heads L2-normed (q also times 1/sqrt(S)); b = sigmoid(b), a = A * softplus(a + dt) */
int hk_gdn_norm_gate(float *cv, float *b, float *a, const float *ssm_a, const float *dt, int64_t n, int64_t S, int64_t Gk,
                     int64_t Gv, int64_t cd, float eps, herr *e);
/* the gated delta rule, row by row per (piece, value head); lanes of sequence s at
 * lane0 + s * seq_stride, (Gv, S, S) with rows the key dim; points into stage0 + slot *
 * stage_stride; o (n, Gv*S). S must be 128. */
int hk_gdn_delta(const float *cv, const float *b, const float *a, float *lane0, size_t seq_stride,
                 const hk_piece *pieces, int n_pieces, const hk_mark *marks, float *stage0, size_t stage_stride,
                 int64_t S, int64_t Gk, int64_t Gv, int64_t cd, float *o, herr *e);
/* o (n, Gv*S) = rmsnorm per head (weight nw, S) * silu(z) */
int hk_gdn_gated_norm(float *o, const float *z, const float *nw, int64_t n, int64_t S, int64_t Gv, float eps, herr *e);

/* attention: per row, q heads (in qf: per head [q D | gate D]) and k heads RMS-normed and
 * roped, k and v stored at the row's position in its sequence's cache (f16 or f32; layer base
 * k0/v0, sequence s at + s * seq_stride elements) */
int hk_attn_prep(float *qf, float *k, const float *v, const float *qn, const float *kn, const int32_t *row_seq,
                 const int64_t *pos, int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t rope_dims, float theta,
                 float eps, void *k0, void *v0, size_t seq_stride, bool f16, herr *e);
/* ao (n, H*D) = softmax(q k^T / sqrt(D)) v over keys [0, pos] of the row's sequence, times
 * sigmoid(gate); scores: n * H * n_ctx floats of scratch */
int hk_attn(const float *qf, const int32_t *row_seq, const int64_t *pos, int64_t n, int64_t H, int64_t Hkv, int64_t D,
            const void *k0, const void *v0, size_t seq_stride, bool f16, float *scores, int64_t n_ctx, float *ao,
            herr *e);

#ifdef __cplusplus
}
#endif

#endif
