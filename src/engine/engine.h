/* engine.h: the one contract both backends implement (README "The engine contract").
 * An engine is one loaded model on one device, sized once at open: n_seq_max sequences
 * (slots, named by index) of up to n_ctx rows each, their KV rows under a KV budget, and
 * a budget for the host copies a scheduler keeps (points and KV ranges). After open,
 * nothing is allocated on the run path; exceeding a budget is an error naming the flag.
 *
 * engine_run takes spans: (sequence, ids, marks -> points, logits wanted). A decode step is
 * a one-row span; a prompt span runs in the same call as other sequences' decode rows.
 * Batch invariance: a sequence's logits, KV rows and state are the same bits whatever else
 * is in the call. GDN chunks are laid from each span's start and from each of its anchors,
 * so bits depend on the span boundaries and anchors a caller chooses and on nothing else: a
 * span anchored at a is the same bits as two spans cut at a, in one pass instead of two.
 *
 * A point is a host copy of a sequence's recurrent state (lanes and rings) after row pos-1,
 * with its provenance: the hash of the model's identity and the ids [0, pos). The KV rows
 * below pos are the rest of the state; they travel as KV ranges (engine_kv_read/write), so
 * a prompt cache can keep them once along a shared prefix. A restore refuses a point whose
 * KV prefix the sequence does not hold exactly.
 *
 * Dims: V = vocab. Logits are f32 rows of V. */
#ifndef HEARTH_ENGINE_H
#define HEARTH_ENGINE_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "model/model.h"
#include "base/util.h"

typedef struct engine engine;

typedef enum engine_device { ENGINE_AUTO = 0, ENGINE_CPU, ENGINE_CUDA } engine_device;

typedef struct engine_opts {
    engine_device device;   /* auto: CUDA where a GPU is found, else the CPU (engine_info says which) */
    int n_threads;          /* CPU threads (0 = all cores) */
    int64_t n_ctx;          /* rows per sequence (0 = min(model's, 4096)) */
    int n_seq_max;          /* sequences (0 = 1) */
    int64_t kv_budget;      /* bytes of KV rows for all sequences (0 = what n_seq_max x n_ctx needs) */
    int64_t cache_budget;   /* bytes of points and KV ranges the caller may hold (0 = 1 GiB) */
    bool kv_f16;            /* KV rows stored as f16 (else f32) */
    bool mtp;               /* the model's MTP block runs beside every pass (its KV rows kept, one
                             * more attention layer's, in KV ranges too), so engine_mtp_draft can
                             * draft; needs a file with the block (model.has_mtp); CPU engine */
} engine_opts;

/* What a scheduler needs to know. */
typedef struct engine_info {
    const char *backend;    /* "cpu" or "cuda" */
    const char *why;        /* how auto chose, in words */
    int64_t chunk;          /* GDN chunk rows, laid from each span's start and anchor */
    int64_t rows_per_pass;  /* at most this many rows of one span per forward pass (a multiple
                             * of chunk); engine_piece_end says where a pass's piece ends */
    bool act_f32;           /* matrix inputs stay f32 (CUDA); else rounded to 8-bit blocks (Q8_K,
                             * Q8_0) for the quantized dot products (CPU) */
    int64_t n_ctx;
    int64_t n_vocab;        /* V: the width of a logits row */
    int n_seq_max;
    int n_threads;
    size_t kv_bytes_per_token;  /* all attention layers, K and V */
    size_t point_bytes;         /* one point */
    int64_t cache_budget, cache_used; /* bytes; cache_used: the points and KV ranges callers hold */
    int n_spare;                /* spare point buffers the engine holds (engine_point_reserve) */
    int64_t spare_bytes;        /* their bytes, in the cache budget beside cache_used */
    uint64_t model_id;          /* identity of the model's weights and shapes (hashed at open; with
                             * the MTP block's KV rows another, as its KV ranges are wider) */
    bool mtp;                   /* engine_mtp_draft drafts (engine_opts.mtp) */
} engine_info;

/* A copy of the recurrent state after row pos-1: for every GDN layer (in layer order) the
 * lane (Gv x S x S f32, rows = key dim) and the ring (d_conv-1 pre-conv rows x conv_dim
 * f32, oldest first). Made by engine_point_new (counted in cache_budget). */
typedef struct engine_point {
    int64_t pos;            /* -1 until filled */
    uint64_t hash;          /* provenance: hash of the model id and ids [0, pos) */
    uint64_t model_id;
    int64_t n_gdn;          /* GDN layers */
    size_t lane_floats;     /* per layer */
    size_t ring_floats;     /* per layer */
    float *lanes;           /* n_gdn * lane_floats */
    float *rings;           /* n_gdn * ring_floats */
    void (*dealloc)(void *); /* how lanes and rings are freed: the backend's point_dealloc, or free */
} engine_point;

/* KV rows [a, b) of one sequence, every attention layer's K then V rows, in the engine's KV
 * type, with the prefix hash after each row (hash[i - a] covers ids [0, i + 1)) and the
 * hash of [0, a). Made by engine_kv_read (counted in cache_budget). */
typedef struct engine_kv {
    int64_t a, b;
    uint64_t model_id;
    uint64_t hash_a;        /* hash of ids [0, a) */
    uint64_t *hash;         /* b - a entries */
    size_t bytes;           /* of data */
    void *data;
} engine_kv;

/* Which logits rows a span wants. ARGMAX: no logits, the last row's greedy token into
 * *token (sampler_argmax's choice: the lowest id among equal maxima, NaN never chosen but
 * at id 0); where the backend can (CUDA), only the id leaves the device. */
typedef enum engine_logits {
    ENGINE_LOGITS_NONE = 0,
    ENGINE_LOGITS_LAST,
    ENGINE_LOGITS_ALL,
    ENGINE_LOGITS_ARGMAX
} engine_logits;

/* One sequence's rows in a call: ids[0..n) appended at the sequence's position. marks
 * (0 < m <= n, relative to the span, ascending) ask for points: points[i] receives the
 * state a prefill of exactly rows [0, marks[i]) of this span would leave. anchors (0 < a <
 * n, ascending) restart the GDN chunk grid: the rows from a on are the bits a span starting
 * at a would give (a chat's message starts, so a turn resumed there matches a cold run).
 * logits receives the last row (LAST, V floats) or every row (ALL, n x V); token the last
 * row's greedy token (ARGMAX). */
typedef struct engine_span {
    int seq;
    const int32_t *ids;
    int64_t n;
    const int64_t *marks;
    int n_marks;
    engine_point *const *points;
    const int64_t *anchors;
    int n_anchors;
    engine_logits want;
    float *logits;
    int32_t *token;
} engine_span;

/* Counters a caller (tests, bench, the server's /metrics) may read. */
typedef struct engine_stats {
    int64_t n_calls;        /* engine_run calls */
    int64_t n_passes;       /* forward passes */
    int64_t n_rows;         /* rows run */
    int64_t n_points;       /* points taken by marks */
    double t_points;        /* CPU seconds spent taking points, summed over threads */
    int64_t n_point_allocs; /* point buffers engine_point_new had to make (no spare): an
                             * allocation (a pin, on CUDA) on a pass's or a save's path */
    int64_t n_point_reserved;   /* point buffers made ahead by engine_point_reserve */
    int64_t n_spare_releases;   /* spares freed to make room in the budget for a take */
} engine_stats;

int engine_open(engine **out, const model *m, const engine_opts *o, herr *e);
/* The memory one sequence of engine_open(m, o) takes (its KV rows for the whole context, its
 * lanes, rings and prefix hashes): on the GPU with the CUDA engine, in RAM with the CPU's. For
 * a caller sizing sequences beyond its slots from a byte budget (hearth serve --cache-gpu).
 * 0 when o's context is not one engine_open takes. */
int64_t engine_seq_bytes(const model *m, const engine_opts *o);
void engine_free(engine *eng);
engine_info engine_get_info(const engine *eng);
engine_stats engine_get_stats(const engine *eng);

/* Runs every span in one call (as few passes as the spans' lengths allow). Errors (nothing
 * has run): a bad sequence index, the same sequence twice, an empty span, an id outside the
 * vocabulary, bad marks, a span past the context, a sequence that needs a restore. */
int engine_run(engine *eng, const engine_span *spans, int n_spans, herr *e);

/* Where the piece of sp that starts at row `from` ends, given at most `most` rows (a
 * multiple of chunk): on the span's chunk grid (chunks of `chunk` rows from its start,
 * restarted at each anchor) or at its end. `from` must be on that grid (0, or an earlier
 * piece's end). A caller that cuts a prompt into spans cuts it here, with the prompt's own
 * anchors, so the cut moves no bit. */
int64_t engine_piece_end(const int64_t *anchors, int n_anchors, int64_t n, int64_t from, int64_t most, int64_t chunk);

/* Rows held by a sequence (its position). */
int64_t engine_seq_pos(const engine *eng, int seq);
/* Empties a sequence (position 0, zero state). */
void engine_seq_clear(engine *eng, int seq);

/* Points: allocation is fallible and counted in cache_budget. engine_point_new hands out a
 * spare's buffers where one is held (no allocation), else makes new ones (counted in
 * n_point_allocs); engine_point_free keeps the buffers as a spare. Spares count in the cache
 * budget too (cache_used + spare_bytes <= cache_budget), and a take the budget cannot fit
 * frees spares first, so --cache-ram bounds every byte a cache holds, spare or not. */
int engine_point_new(engine *eng, engine_point **out, herr *e);
void engine_point_free(engine *eng, engine_point *p);
/* Makes spare point buffers (pages touched; pinned on CUDA) until n are held, as far as the
 * budget's free room and memory allow, before a pass needs them (a server's start). Returns
 * the spares held. */
int engine_point_reserve(engine *eng, int n);
/* The two halves of a reserve, for a caller that allocates on a thread of its own while the
 * engine runs: engine_point_make may run on any thread (it reads the model's shapes and calls
 * the backend's allocator, nothing else of the engine): a point's buffers, pages touched,
 * outside the budget; NULL when out of memory. engine_point_adopt, on the engine's thread,
 * keeps them as a spare where the budget has room (true), else frees them (false). */
engine_point *engine_point_make(engine *eng);
bool engine_point_adopt(engine *eng, engine_point *p);
size_t engine_point_size(const engine_point *p);
/* dst (a point of the same shape) becomes a copy of src: its fields and state, in its own buffers */
void engine_point_copy(engine_point *dst, const engine_point *src);
/* Copies a sequence's live state into a point (pos = its position). */
int engine_save(engine *eng, int seq, engine_point *p, herr *e);
/* The sequence resumes at p->pos: lanes and rings from the point, KV rows >= pos dropped.
 * Refused unless the sequence holds KV rows [0, p->pos) made from the same ids by the same
 * model (checked by hash), so a point is never silently used on a stale prefix. */
int engine_restore(engine *eng, int seq, const engine_point *p, herr *e);

/* KV ranges: copy rows [a, b) out of a sequence (counted in cache_budget), or into one.
 * engine_kv_write needs the sequence to hold rows [0, kv->a) of the same prefix (checked by
 * hash); it replaces the rows from a on with the range's, and leaves the sequence's
 * recurrent state stale (engine_run refuses it) until engine_restore of a point at a row
 * the sequence now holds. */
int engine_kv_read(engine *eng, int seq, int64_t a, int64_t b, engine_kv **out, herr *e);
int engine_kv_write(engine *eng, int seq, const engine_kv *kv, herr *e);
void engine_kv_free(engine *eng, engine_kv *kv);
/* An empty range of rows [a, b) (data and hashes unset), counted in cache_budget: for a
 * caller that fills one from a file; engine_kv_write checks it like any other. */
int engine_kv_new(engine *eng, int64_t a, int64_t b, engine_kv **out, herr *e);

/* Speculative decoding with the model's MTP block (engine_opts.mtp). With `token` the id the
 * sequence takes next (at its position p), drafts up to k ids greedily into out[0..): the
 * block reads the trunk's last hidden row and token for out[0], then its own hidden row and
 * out[i - 1] for out[i]; logits (NULL, or k rows of V) receives the block's logits. It writes only the block's KV rows at positions p .. p + k - 1 (a
 * pass over those positions writes them again) and changes nothing a pass's outputs depend
 * on. Returns how many it drafted: k, or fewer where the context ends; -1 (nothing done) on
 * a bad argument or an engine opened without mtp.
 *
 * The caller verifies the drafts with one span [token, out[0], .., out[k - 1]] anchored at
 * every row (so each row has a decode step's bits) and marked at rows 1..k; it keeps the
 * first j drafts whose logits agree, and restores the point of mark j + 1 where j < k. The
 * block's input after a restore is the trunk's row at p - 1 when the sequence's last pass
 * ran it (the verify pass), else zeros; its KV rows below p are those the passes wrote. */
int engine_mtp_draft(engine *eng, int seq, int32_t token, int k, int32_t *out, float *logits, herr *e);

/* Drops KV rows >= pos; refuses when a lane would need rewinding (pos != position). */
int engine_truncate(engine *eng, int seq, int64_t pos, herr *e);

/* The hash a point or KV range of these ids would carry (ids [0, n) from the start). */
uint64_t engine_ids_hash(const engine *eng, const int32_t *ids, int64_t n);

#endif
