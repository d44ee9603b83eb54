/* backend.h: what a backend implements behind engine.h, and the engine's own fields. Only
 * engine.c and the backends include it; callers (the CLI, the server, the gates) see
 * engine.h alone. engine.c checks every argument a caller can get wrong and keeps each
 * sequence's bookkeeping (position, prefix hashes, staleness); a backend's functions are
 * called with valid arguments only. */
#ifndef HEARTH_ENGINE_BACKEND_H
#define HEARTH_ENGINE_BACKEND_H

#include "engine/engine.h"

typedef struct engine_backend {
    const char *name;
    void (*free)(engine *eng);
    /* spans are valid: distinct sequences, in range, within the context */
    int (*run)(engine *eng, const engine_span *spans, int n_spans, herr *e);
    void (*seq_clear)(engine *eng, int seq);
    void (*save)(engine *eng, int seq, engine_point *p);          /* lanes and rings out */
    void (*restore)(engine *eng, int seq, const engine_point *p); /* lanes and rings in */
    void (*kv_read)(engine *eng, int seq, int64_t a, int64_t b, void *data);
    void (*kv_write)(engine *eng, int seq, int64_t a, int64_t b, const void *data);
    bool argmax; /* run fills ARGMAX spans' tokens itself; else engine.c asks for LAST and argmaxes */
    /* a point's buffers, where the backend wants its own host memory (the CUDA engine's
     * pinned pages, which it copies into asynchronously); NULL or a NULL result: calloc */
    void *(*point_alloc)(engine *eng, size_t bytes);
    void (*point_dealloc)(void *p);
    /* engine_mtp_draft's work (valid arguments, k >= 1 within the context); NULL: no MTP */
    void (*mtp_draft)(engine *eng, int seq, int32_t token, int k, int32_t *out, float *logits);
} engine_backend;

/* A sequence as engine.c tracks it: rows [0, pos) of KV, hash[i] the prefix hash of ids
 * [0, i) (hash[0] = the model id); stale when KV rows were written without the state. */
typedef struct engine_seq_meta {
    int64_t pos;
    bool stale;
    uint64_t *hash;         /* n_ctx + 1 */
} engine_seq_meta;

struct engine {
    const engine_backend *be;
    const model *m;
    engine_opts opts;       /* as resolved at open */
    engine_info info;
    engine_stats stats;
    engine_seq_meta *seqs;  /* n_seq_max */
    int64_t cache_used;
    /* spare points: freed points' buffers and those engine_point_reserve made ahead, for the
     * next engine_point_new. Fresh buffers cost a pass dearly: writing a point into fresh
     * pages costs ~10x the copy itself (page faults: 46 ms against 4 ms for a q36 point off
     * the GPU, bench/RESULTS.md), and pinning one (CUDA) takes tens of ms. Counted in the
     * cache budget (spare_bytes): pinned pages cannot be swapped out, so a pool outside
     * --cache-ram would be host memory that no flag bounds. */
    engine_point **spare;   /* spare_cap */
    int n_spare, spare_cap;
    int64_t spare_bytes;
    float *argmax_rows;     /* the logits rows engine_run asks for on an ARGMAX span's behalf */
    int n_argmax_rows;
    int32_t *route_trace;   /* debug.h: experts chosen, (rows of the call in span order, n_layer, K) */
    /* run scratch, sized at open: which spans touch which sequence */
    int *seq_seen;          /* n_seq_max */
};

/* The shared half of engine_open: resolves the options and fills the fields above. */
int engine_init(engine *eng, const engine_backend *be, const model *m, const engine_opts *o, herr *e);
void engine_fini(engine *eng);

/* Backends' constructors. */
int engine_open_cpu(engine **out, const model *m, const engine_opts *o, herr *e);
int engine_open_cuda(engine **out, const model *m, const engine_opts *o, herr *e); /* HEARTH_CUDA builds */
int cuda_takes_model(const model *m, herr *e); /* HEARTH_CUDA builds: 0 when the CUDA engine has kernels for m's shapes */

/* Hash helpers: a prefix hash extended by one id. */
uint64_t engine_hash_step(uint64_t h, int32_t id);

#endif
