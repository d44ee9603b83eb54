/* cpu.h: the CPU backend's internals, shared by its files (one file per op kind):
 * the engine and sequence structs, the scratch arena, and the op entry points.
 * Dims: n = rows in the batch, E = hidden, S = GDN head dim, Gk/Gv = key/value heads,
 * H/Hkv/D = attention heads/KV heads/head dim, X/K = experts/used, F/Fs = expert widths. */
#ifndef HEARTH_CPU_H
#define HEARTH_CPU_H

#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <stdatomic.h>
#include "engine/backend.h"
#include "engine/cpu/arena.h"
#include "engine/cpu/pool.h"
#include "engine/cpu/state.h"

#define QT_COUNT_MAX 64 /* >= QT_COUNT */
#define CPU_CHUNK 64    /* GDN chunk rows (the WY form), laid from the start of each span */
#define CPU_UBATCH 512  /* rows of one span per forward pass; a multiple of CPU_CHUNK so chunks stay aligned */

/* A point to fill inside a pass: mark row m (relative to its piece's start, 0 < m <= n). */
typedef struct cpu_mark {
    int64_t m;
    engine_point *p;
} cpu_mark;

/* One span's rows inside one pass: pass rows [r0, r0 + n) of sequence s, the first at
 * position pos0. A span longer than CPU_UBATCH is cut into pieces on its chunk grid
 * (engine_piece_end), whatever else shares the call (batch invariance). The chunks restart
 * at the anchors (rows relative to the piece, 0 < a < n). */
typedef struct cpu_piece {
    cpu_seq *s;
    int64_t r0, n, pos0;
    const cpu_mark *marks;
    int n_marks;
    const int64_t *anchors;
    int n_anchors;
} cpu_piece;

/* One forward pass: its rows and, per row, the piece, position and sequence. */
typedef struct cpu_batch {
    int64_t n;
    const int32_t *ids;     /* (n) */
    const cpu_piece *pieces;
    int n_pieces;
    const int32_t *row_piece; /* (n) */
    const int64_t *pos;     /* (n) absolute positions */
    cpu_seq *const *row_seq;/* (n) */
    const int64_t *row_call;/* (n) the row's index in the call (route trace) */
    float *const *logit_row;/* (n) where a row's logits go, NULL when not wanted */
    int64_t n_logits;       /* rows with logits */
} cpu_batch;

/* A matrix-times-rows job: y[out_row(r)][o] = W_slice[o] . xq[in_row(r)] for r < n, o < M. */
typedef struct mm_job {
    const qtensor *w;
    int64_t slice;          /* index along ne[2] (expert), 0 for 2-D */
    const uint8_t *xq;      /* activation rows quantized to W's vec-dot type */
    size_t xq_stride;
    const int32_t *in_rows; /* NULL: row r */
    int64_t n;
    float *y;
    int64_t y_stride;
    const int32_t *out_rows;/* NULL: row r */
    float *const *y_row;    /* if set, row r's output goes to y_row[r] (y and out_rows unused) */
} mm_job;

typedef struct cpu_engine {
    engine base;
    pool *pool;
    int nth;
    bool kv_f16;
    bool mtp;               /* engine_opts.mtp: the MTP block's KV rows made in every pass */
    cpu_seq *seqs;          /* n_seq_max */
    cpu_arena ar;
    int64_t rows_max;       /* rows one pass holds: CPU_UBATCH + n_seq_max */
    _Atomic int64_t point_ns; /* CPU time spent taking points, summed over threads */
} cpu_engine;

/* scratch for the current pass (arena.h) */
static inline void *cpu_scratch(cpu_engine *ce, size_t bytes) { return cpu_arena_get(&ce->ar, bytes); }

/* matmul.c */
size_t cpu_act_bytes(uint32_t wtype, int64_t K);                 /* bytes of one quantized row */
void cpu_quantize_rows(cpu_engine *ce, uint32_t wtype, const float *x, int64_t x_stride, int64_t n, int64_t K,
                       uint8_t *xq, size_t xq_stride);
void cpu_matmul_jobs(cpu_engine *ce, const mm_job *jobs, int n_jobs);
/* convenience: y (n, M) = x (n, K) . W^T, quantizing x on the way */
void cpu_matmul(cpu_engine *ce, const qtensor *w, const float *x, int64_t n, float *y);

/* Rows x (n, K) quantized on demand, once per vec-dot type, for the weights that read them. */
typedef struct act_cache {
    const float *x;
    int64_t n, K;
    uint8_t *buf[QT_COUNT_MAX];
} act_cache;
#define ACT_CACHE(x_, n_, K_) ((act_cache){.x = (x_), .n = (n_), .K = (K_)})
const uint8_t *cpu_act(cpu_engine *ce, act_cache *ac, uint32_t wtype, size_t *stride);

/* the same rows x (n, K) times several weights of input dim K, in one parallel pass */
void cpu_project(cpu_engine *ce, const float *x, int64_t n, const qtensor *const *ws, float *const *ys, int count);

/* ops.c: row-wise helpers (single-threaded per call; callers parallelise over rows) */
void cpu_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);
static inline float cpu_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float cpu_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* gdn.c: one Gated DeltaNet layer over a pass's pieces (the chunked form per piece;
 * a one-row piece is one chunk of one row). h (n, E) in, out (n, E) out. */
void cpu_gdn_layer(cpu_engine *ce, int il, const cpu_batch *b, const float *h, float *out, int64_t gdn_index);
size_t cpu_gdn_scratch(const model_hparams *hp, int64_t n, int nth);
/* attn.c: one attention layer; row r is at position b->pos[r] of b->row_seq[r]. */
void cpu_attn_layer(cpu_engine *ce, int il, const cpu_batch *b, const float *h, float *out);
void cpu_attn_kv(cpu_engine *ce, int il, const cpu_batch *b, const float *h); /* K and V rows stored, no attention */
size_t cpu_attn_scratch(const model_hparams *hp, int64_t n, int64_t n_ctx, int nth);
/* gdn_avx2.c: the delta rule's primitives (see gdn.c); AVX2/FMA, after quant_simd_active() */
float cpu_gdn_dot_avx2(const float *x, const float *y, int64_t n);
void cpu_gdn_rows_acc_avx2(float *y, const float *y0, float s0, const float *x, int64_t xs, const float *c,
                           int64_t m, int64_t n);
/* attn_avx2.c: y = e^x for x <= 0 (the attention's softmax exponential; relative error below
 * 2^-23 where e^x is normal, 0 below -104) */
void cpu_exp_avx2(const float *x, float *y, int64_t n);
/* attn_avx2.c: nr (1..8) rows of one sequence (row r: q + r q_row, keys [0, n_keys[r]),
 * o + r o_row), each with ng (1..4) query heads (rows of q at q_stride, of o at o_stride),
 * against one KV head's rows k, v (f32 or f16, row stride kv_stride elements): scores,
 * softmax, o = sum p v; each row's bits those it has alone, every key and value row read once
 * for all of them. sc: nr * ng rows of sc_stride >= max n_keys floats; acc: nr * ng * D
 * floats. AVX2/FMA: call after quant_simd_active(). */
void cpu_attend_rows_avx2(int nr, int ng, const float *q, int64_t q_row, int64_t q_stride, const void *k, const void *v,
                          bool f16, int64_t kv_stride, const int64_t *n_keys, int64_t D, float scale, float *sc,
                          int64_t sc_stride, float *acc, float *o, int64_t o_row, int64_t o_stride);
/* moe.c: the MoE FFN of layer il: h2 (n, E) in, out (n, E). */
void cpu_moe_layer(cpu_engine *ce, int il, const cpu_batch *b, const float *h2, float *out);
/* the layer's FFN: the MoE, or qwen35's dense MLP (moe.c) */
void cpu_ffn_layer(cpu_engine *ce, int il, const cpu_batch *b, const float *h2, float *out);
size_t cpu_ffn_scratch(const model_hparams *hp, int64_t n);
size_t cpu_moe_scratch(const model_hparams *hp, int64_t n);
/* matmul.c: scratch of cpu_matmul / cpu_project / cpu_matmul_jobs for n rows of input dim K */
size_t cpu_act_scratch(int64_t n, int64_t K, int n_types);
size_t cpu_jobs_scratch(int n_jobs);

#endif
