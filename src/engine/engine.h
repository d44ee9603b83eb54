/* engine.h: the one interface both backends implement (DESIGN.md "The engine interface").
 * An engine is one loaded model on one device; a seq is one sequence's state (KV rows,
 * GDN lanes and rings, position) on that device; a point is a host copy of a sequence's
 * recurrent state at a row, taken inside a prompt pass (marks) or restored later.
 *
 * Dims: V = vocab, E = hidden. Logits are f32 rows of V. */
#ifndef HEARTH_ENGINE_H
#define HEARTH_ENGINE_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "model/model.h"
#include "base/util.h"

typedef struct engine engine;
typedef struct seq seq;

typedef struct engine_opts {
    int n_threads;          /* CPU threads (0 = all cores) */
    int64_t n_ctx;          /* tokens per sequence (0 = min(model's, 4096)) */
    bool kv_f16;            /* KV rows stored as f16 (else f32) */
} engine_opts;

/* A copy of the recurrent state after row pos-1: for every GDN layer (in layer order) the
 * lane (Gv x S x S f32, rows = key dim) and the ring (d_conv-1 pre-conv rows x conv_dim f32).
 * Attention layers need no copy: their KV rows below pos are the point's. */
typedef struct point {
    int64_t pos;
    int64_t n_gdn;          /* GDN layers */
    size_t lane_floats;     /* per layer */
    size_t ring_floats;     /* per layer */
    float *lanes;           /* n_gdn * lane_floats */
    float *rings;           /* n_gdn * ring_floats */
} point;

size_t point_bytes(const point *p);
void point_alloc(point *p, const model_hparams *hp);
void point_free(point *p);

/* Counters a caller (tests, bench, the server's /metrics) may read. */
typedef struct engine_stats {
    int64_t n_prefill_calls;    /* prompt calls */
    int64_t n_passes;           /* forward passes run for prompts (one per call up to the batch size) */
    int64_t n_step_calls;
    int64_t n_points;           /* points taken */
    double t_points;            /* CPU seconds spent taking points, summed over threads */
} engine_stats;

/* The backend's functions; engine.c dispatches through them. */
typedef struct engine_backend {
    const char *name;
    void (*free)(engine *eng);
    seq *(*seq_new)(engine *eng, herr *e);
    void (*seq_free)(engine *eng, seq *s);
    int (*prefill)(engine *eng, seq *s, const int32_t *ids, int64_t n, const int64_t *marks, int n_marks,
                   point *points, float *logits, bool all_logits, herr *e);
    int (*step)(engine *eng, seq **seqs, const int32_t *ids, int n_seqs, float *logits, herr *e);
    int (*restore)(engine *eng, seq *s, const point *p, herr *e);
    int (*truncate)(engine *eng, seq *s, int64_t pos, herr *e);
    int64_t (*seq_pos)(const seq *s);
    /* introspection for tests: copy the live state into a point (pos = current position) */
    void (*snapshot)(engine *eng, const seq *s, point *p);
} engine_backend;

struct engine {
    const engine_backend *be;
    const model *m;
    engine_opts opts;
    engine_stats stats;
    int32_t *route_trace;   /* if set: experts chosen, (rows of the call, n_layer, K); a step's rows are its sequences */
};

int engine_open_cpu(engine **out, const model *m, const engine_opts *o, herr *e);
void engine_free(engine *eng);

seq *engine_seq_new(engine *eng, herr *e);
void engine_seq_free(engine *eng, seq *s);
int64_t engine_seq_pos(engine *eng, const seq *s);

/* One prompt pass over ids[0..n) appended at the sequence's position: one call, one pass.
 * marks (0 < m <= n, relative to the call, ascending) ask for points: points[i] receives the
 * state a prefill of exactly rows [0, marks[i]) would leave (points must be allocated with
 * point_alloc). logits (may be NULL) receives the last row's logits, or every row's when
 * all_logits (n x V). Refuses (error) a pass past the context. */
int engine_prefill(engine *eng, seq *s, const int32_t *ids, int64_t n, const int64_t *marks, int n_marks,
                   point *points, float *logits, bool all_logits, herr *e);
/* One decode step for n_seqs sequences, one token each; logits n_seqs x V. */
int engine_step(engine *eng, seq **seqs, const int32_t *ids, int n_seqs, float *logits, herr *e);
/* The sequence resumes at p->pos: lanes and rings from the point, KV rows >= pos dropped. */
int engine_restore(engine *eng, seq *s, const point *p, herr *e);
/* Drops KV rows >= pos; refuses when a lane would need it (pos != current position). */
int engine_truncate(engine *eng, seq *s, int64_t pos, herr *e);
void engine_snapshot(engine *eng, const seq *s, point *p);

#endif
