/* engine.c: the backend-neutral half of engine.h: options resolved and budgets checked at
 * open, every argument a caller can get wrong checked (errors, never aborts), each
 * sequence's position and prefix hashes (the provenance points and KV ranges are checked
 * against), the cache budget, and dispatch to the backend. */
#include "engine/backend.h"
#ifdef HEARTH_CUDA
#include "engine/cuda/cuda.h"
#endif
#include "engine/debug.h"
#include "engine/mutant.h"
#include "engine/sampler.h"
#include "format/quant.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CACHE_BUDGET_DEFAULT ((int64_t)1 << 30)
/* the most spare points held, whatever the budget fits: only a tiny model's points come near
 * it (4096 q36 points would be 258 GB) */
#define SPARE_MAX 4096

uint64_t engine_hash_step(uint64_t h, int32_t id) { return rng_mix(h ^ rng_mix((uint64_t)(uint32_t)id + 0x51ed27u)); }

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = rng_mix(h ^ b[i]) + i;
    return h;
}

/* The model's identity: its shapes, its tensor table and a sample of each tensor's bytes
 * (the first 64 and the last 64): two files that differ in any weight block's scale at
 * the ends, in a shape or a type get different ids; reading all 21 GB at open would not
 * pay for the rest. */
static uint64_t model_identity(const model *m) {
    uint64_t h = hash_bytes(0x6865617274680001ull, &m->hp, sizeof m->hp);
    const gguf_file *f = m->file;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        h = hash_bytes(h, t->name, strlen(t->name));
        h = hash_bytes(h, &t->type, sizeof t->type);
        h = hash_bytes(h, t->ne, sizeof t->ne);
        const uint8_t *d = t->data;
        size_t k = t->nbytes < 64 ? t->nbytes : 64;
        h = hash_bytes(h, d, k);
        h = hash_bytes(h, d + t->nbytes - k, k);
    }
    return h;
}

static int64_t n_gdn_layers(const model_hparams *hp) {
    int64_t n = 0;
    for (int64_t il = 0; il < hp->n_layer; il++) n += hp->is_recurrent[il];
    return n;
}

/* an empty point of this model's shape: the one place its sizes are worked out */
static engine_point point_shape(const model_hparams *hp) {
    return (engine_point){.pos = -1, .n_gdn = n_gdn_layers(hp),
                          .lane_floats = (size_t)(hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state),
                          .ring_floats = (size_t)((hp->ssm_d_conv - 1) * hp_conv_dim(hp))};
}

int engine_init(engine *eng, const engine_backend *be, const model *m, const engine_opts *o, herr *e) {
    const model_hparams *hp = &m->hp;
    eng->be = be;
    eng->m = m;
    eng->opts = o ? *o : (engine_opts){0};
    engine_opts *op = &eng->opts;
    if (op->n_threads < 0 || op->n_threads > 512) return herr_set(e, "-t %d: expects 1 to 512 threads", op->n_threads);
    if (op->n_threads == 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        op->n_threads = nc > 0 ? (int)(nc < 512 ? nc : 512) : 1;
    }
    if (op->n_ctx < 0) return herr_set(e, "-c %" PRId64 ": the context must be positive", op->n_ctx);
    if (op->n_ctx == 0) op->n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (op->n_ctx > hp->n_ctx_train)
        return herr_set(e, "-c %" PRId64 ": exceeds the model's context of %" PRId64 " tokens", op->n_ctx, hp->n_ctx_train);
    if (op->n_seq_max < 0 || op->n_seq_max > 4096)
        return herr_set(e, "-np %d: expects 1 to 4096 sequences", op->n_seq_max);
    if (op->n_seq_max == 0) op->n_seq_max = 1;
    if (op->cache_budget < 0) return herr_set(e, "the cache budget must not be negative");
    if (op->cache_budget == 0) op->cache_budget = CACHE_BUDGET_DEFAULT;

    engine_info *in = &eng->info;
    in->n_ctx = op->n_ctx;
    in->n_vocab = hp->n_vocab;
    in->n_seq_max = op->n_seq_max;
    in->n_threads = op->n_threads;
    if (op->mtp && !m->has_mtp)
        return herr_set(e, "--spec-mtp: the model has no MTP block (nextn_predict_layers %" PRId64 ", blk.%" PRId64
                        " tensors %s): make one with hearth gen --mtp, or convert a checkpoint with its mtp.* tensors",
                        hp->n_layer_nextn, hp->n_layer, hp->n_layer_nextn ? "missing" : "none");
    if (op->mtp && !be->mtp_draft)
        return herr_set(e, "--spec-mtp: the %s engine has no MTP drafting yet (use --device cpu)", be->name);
    in->mtp = op->mtp;
    int64_t n_attn = hp->n_layer - n_gdn_layers(hp) + op->mtp;
    in->kv_bytes_per_token = (size_t)(2 * n_attn * hp->n_head_kv * hp->head_dim) * (op->kv_f16 ? 2 : 4);
    const engine_point shape = point_shape(hp);
    in->point_bytes = engine_point_size(&shape);
    in->cache_budget = op->cache_budget;
    /* KV rows are held per sequence for its whole context: the budget must cover them all */
    const double need = (double)in->kv_bytes_per_token * (double)op->n_ctx * (double)op->n_seq_max;
    if (op->kv_budget < 0) return herr_set(e, "the KV budget must not be negative");
    if (op->kv_budget == 0) op->kv_budget = need > (double)INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)need;
    if (need > (double)op->kv_budget)
        return herr_set(e, "KV rows for %d sequences of %" PRId64 " tokens need %.1f MiB, over the KV budget of %.1f MiB: "
                        "lower -c or -np, or raise --kv-budget", op->n_seq_max, op->n_ctx, need / (1 << 20),
                        (double)op->kv_budget / (1 << 20));
    in->model_id = model_identity(m);
    if (op->mtp) in->model_id = rng_mix(in->model_id ^ 0x6d74702d6b76ull); /* KV ranges with the block's rows */
    const int64_t fit = op->cache_budget / (int64_t)in->point_bytes;
    eng->spare_cap = fit < SPARE_MAX ? (int)fit : SPARE_MAX;
    eng->spare = xcalloc((size_t)eng->spare_cap + 1, sizeof *eng->spare);
    eng->seqs = xcalloc((size_t)op->n_seq_max, sizeof *eng->seqs);
    eng->seq_seen = xcalloc((size_t)op->n_seq_max, sizeof *eng->seq_seen);
    for (int s = 0; s < op->n_seq_max; s++) {
        eng->seqs[s].hash = malloc(sizeof(uint64_t) * (size_t)(op->n_ctx + 1));
        if (!eng->seqs[s].hash) return herr_set(e, "cannot allocate %d sequences of %" PRId64 " tokens: lower -c or -np",
                                                op->n_seq_max, op->n_ctx);
        eng->seqs[s].hash[0] = in->model_id;
    }
    return 0;
}

int64_t engine_seq_bytes(const model *m, const engine_opts *o) {
    const model_hparams *hp = &m->hp;
    int64_t n_ctx = o->n_ctx;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096; /* engine_init's default */
    if (n_ctx < 0 || n_ctx > hp->n_ctx_train) return 0;
    const int64_t n_attn = hp->n_layer - n_gdn_layers(hp) + (o->mtp && m->has_mtp);
    const int64_t kv = 2 * n_attn * hp->n_head_kv * hp->head_dim * (o->kv_f16 ? 2 : 4);
    const engine_point shape = point_shape(hp);
    return kv * n_ctx + (int64_t)engine_point_size(&shape) + (int64_t)sizeof(uint64_t) * (n_ctx + 1);
}

static void point_release(engine_point *p) {
    void (*dealloc)(void *) = p->dealloc ? p->dealloc : free;
    dealloc(p->lanes);
    dealloc(p->rings);
    free(p);
}

/* a point's lanes and rings (one float more each, so a zero-sized shape still allocates):
 * the backend's memory where it has its own, both or neither (not zeroed: a point is written
 * whole before it is read), else calloc's; false when out of memory */
static bool point_buffers(engine *eng, engine_point *p) {
    const size_t nl = (size_t)p->n_gdn * p->lane_floats + 1, nr = (size_t)p->n_gdn * p->ring_floats + 1;
    const engine_backend *be = eng->be;
    if (be->point_alloc) {
        p->lanes = be->point_alloc(eng, nl * sizeof(float));
        p->rings = p->lanes ? be->point_alloc(eng, nr * sizeof(float)) : NULL;
        p->dealloc = be->point_dealloc;
        if (p->rings) return true;
        if (p->lanes) be->point_dealloc(p->lanes);
    }
    p->dealloc = free;
    p->lanes = calloc(nl, sizeof(float));
    p->rings = calloc(nr, sizeof(float));
    return p->lanes && p->rings;
}

/* dst takes src's fields but keeps its own buffers (and how they are freed) */
static void point_header(engine_point *dst, const engine_point *src) {
    float *lanes = dst->lanes, *rings = dst->rings;
    void (*dealloc)(void *) = dst->dealloc;
    *dst = *src;
    dst->lanes = lanes;
    dst->rings = rings;
    dst->dealloc = dealloc;
}

void engine_point_copy(engine_point *dst, const engine_point *src) {
    point_header(dst, src);
    memcpy(dst->lanes, src->lanes, sizeof(float) * (size_t)src->n_gdn * src->lane_floats);
    memcpy(dst->rings, src->rings, sizeof(float) * (size_t)src->n_gdn * src->ring_floats);
}

void engine_fini(engine *eng) {
    while (eng->n_spare > 0) point_release(eng->spare[--eng->n_spare]);
    free(eng->spare);
    free(eng->argmax_rows);
    if (eng->seqs)
        for (int s = 0; s < eng->opts.n_seq_max; s++) free(eng->seqs[s].hash);
    free(eng->seqs);
    free(eng->seq_seen);
}

int engine_open(engine **out, const model *m, const engine_opts *o, herr *e) {
    engine_opts op = o ? *o : (engine_opts){0};
    const char *why = NULL;
    switch (op.device) {
    case ENGINE_CUDA:
#ifdef HEARTH_CUDA
        if (engine_open_cuda(out, m, &op, e) < 0) return -1;
        (*out)->info.why = "cuda: as asked";
        return 0;
#else
        return herr_set(e, "--device cuda: this build has no CUDA engine (nvcc was not found when it was built); use --device cpu");
#endif
    case ENGINE_AUTO: {
#ifdef HEARTH_CUDA
        herr none;
        const bool gpu = hcuda_device_count(&none) > 0;
        if (gpu && cuda_takes_model(m, &none) == 0) {
            if (engine_open_cuda(out, m, &op, e) < 0) return herr_wrap(e, "auto chose the GPU (--device cpu avoids it)");
            (*out)->info.why = "auto: a CUDA device was found";
            return 0;
        }
        /* a model the CUDA engine has no kernels for (the demo's heads of 64) runs on the CPU */
        why = gpu ? "auto: the CPU engine (the CUDA engine has no kernels for this model's "
                    "shapes; --device cuda says which)"
                  : "auto: the CPU engine (no CUDA device found)";
#else
        why = "auto: the CPU engine (built without CUDA)";
#endif
        break;
    }
    case ENGINE_CPU:
        why = "cpu: as asked";
        break;
    default:
        return herr_set(e, "unknown device %d", (int)op.device);
    }
    op.device = ENGINE_CPU;
    if (engine_open_cpu(out, m, &op, e) < 0) return -1;
    (*out)->info.why = why;
    return 0;
}

void engine_free(engine *eng) {
    if (eng) eng->be->free(eng);
}

engine_info engine_get_info(const engine *eng) {
    engine_info in = eng->info;
    in.cache_used = eng->cache_used;
    in.n_spare = eng->n_spare;
    in.spare_bytes = eng->spare_bytes;
    return in;
}

engine_stats engine_get_stats(const engine *eng) { return eng->stats; }

void engine_debug_route_trace(engine *eng, int32_t *buf) { eng->route_trace = buf; }

uint64_t engine_ids_hash(const engine *eng, const int32_t *ids, int64_t n) {
    uint64_t h = eng->info.model_id;
    for (int64_t i = 0; i < n; i++) h = engine_hash_step(h, ids[i]);
    return h;
}

static int check_seq(const engine *eng, int seq, herr *e) {
    if (seq < 0 || seq >= eng->opts.n_seq_max)
        return herr_set(e, "sequence %d does not exist: the engine holds %d (-np)", seq, eng->opts.n_seq_max);
    return 0;
}

int64_t engine_seq_pos(const engine *eng, int seq) {
    return seq >= 0 && seq < eng->opts.n_seq_max ? eng->seqs[seq].pos : -1;
}

void engine_seq_clear(engine *eng, int seq) {
    if (seq < 0 || seq >= eng->opts.n_seq_max) return;
    eng->seqs[seq].pos = 0;
    eng->seqs[seq].stale = false;
    eng->be->seq_clear(eng, seq);
}

int64_t engine_piece_end(const int64_t *anchors, int n_anchors, int64_t n, int64_t from, int64_t most, int64_t chunk) {
    const int64_t lim = from + most;
    if (lim >= n) return n;
    int k = 0;
    int64_t g = 0, end = from; /* g: the grid's latest restart */
    while (k < n_anchors && anchors[k] <= from) g = anchors[k++];
    while (k < n_anchors && anchors[k] <= lim) end = g = anchors[k++];
    const int64_t c = g + (lim - g) / chunk * chunk;
    return c > end ? c : end;
}

/* the backend's run; one without an argmax of its own gets LAST for an ARGMAX span, into
 * the engine's rows, and the token is taken here */
static int run_spans(engine *eng, const engine_span *spans, int n_spans, herr *e) {
    int na = 0;
    for (int i = 0; i < n_spans; i++) na += spans[i].want == ENGINE_LOGITS_ARGMAX;
    if (na == 0 || eng->be->argmax) return eng->be->run(eng, spans, n_spans, e);
    const int64_t V = eng->m->hp.n_vocab;
    if (na > eng->n_argmax_rows) {
        free(eng->argmax_rows);
        eng->argmax_rows = xmalloc(sizeof(float) * (size_t)(na * V));
        eng->n_argmax_rows = na;
    }
    engine_span *sp = xmalloc(sizeof *sp * (size_t)n_spans);
    memcpy(sp, spans, sizeof *sp * (size_t)n_spans);
    for (int i = 0, k = 0; i < n_spans; i++)
        if (sp[i].want == ENGINE_LOGITS_ARGMAX) sp[i].want = ENGINE_LOGITS_LAST, sp[i].logits = eng->argmax_rows + (k++) * V;
    const int rc = eng->be->run(eng, sp, n_spans, e);
    for (int i = 0; i < n_spans && rc == 0; i++)
        if (spans[i].want == ENGINE_LOGITS_ARGMAX) *spans[i].token = sampler_argmax(sp[i].logits, V);
    free(sp);
    return rc;
}

int engine_run(engine *eng, const engine_span *spans, int n_spans, herr *e) {
    if (n_spans <= 0) return herr_set(e, "no spans to run");
    const int64_t V = eng->m->hp.n_vocab;
    int rc = 0;
    for (int i = 0; i < n_spans && rc == 0; i++) {
        const engine_span *sp = &spans[i];
        if ((rc = check_seq(eng, sp->seq, e)) < 0) break;
        const engine_seq_meta *sm = &eng->seqs[sp->seq];
        if (eng->seq_seen[sp->seq]) {
            rc = herr_set(e, "span %d: sequence %d appears twice in one call", i, sp->seq);
            break;
        }
        eng->seq_seen[sp->seq] = 1;
        if (sp->n <= 0 || !sp->ids) { rc = herr_set(e, "span %d (sequence %d): no ids", i, sp->seq); break; }
        if (sm->stale) {
            rc = herr_set(e, "span %d: sequence %d holds KV rows without their state: restore a point first", i, sp->seq);
            break;
        }
        if (sm->pos + sp->n > eng->opts.n_ctx) {
            rc = herr_set(e, "span %d: %" PRId64 " tokens at position %" PRId64 " exceed the context of %" PRId64 " tokens (-c)",
                          i, sp->n, sm->pos, eng->opts.n_ctx);
            break;
        }
        for (int64_t k = 0; k < sp->n && rc == 0; k++)
            if (sp->ids[k] < 0 || sp->ids[k] >= V)
                rc = herr_set(e, "span %d: token id %" PRId32 " at index %" PRId64 " is outside the vocabulary [0, %" PRId64 ")",
                              i, sp->ids[k], k, V);
        for (int k = 0; k < sp->n_marks && rc == 0; k++) {
            if (sp->marks[k] < 1 || sp->marks[k] > sp->n)
                rc = herr_set(e, "span %d: mark at position %" PRId64 " is outside the span's positions (0, %" PRId64 "]", i,
                              sp->marks[k], sp->n);
            else if (k && sp->marks[k] <= sp->marks[k - 1])
                rc = herr_set(e, "span %d: marks must ascend (position %" PRId64 " after %" PRId64 ")", i, sp->marks[k],
                              sp->marks[k - 1]);
            else if (!sp->points || !sp->points[k])
                rc = herr_set(e, "span %d: mark %d has no point to fill", i, k);
        }
        for (int k = 0; k < sp->n_anchors && rc == 0; k++) {
            if (!sp->anchors || sp->anchors[k] < 1 || sp->anchors[k] >= sp->n)
                rc = herr_set(e, "span %d: anchor %d is outside the span's rows (0, %" PRId64 ")", i, k, sp->n);
            else if (k && sp->anchors[k] <= sp->anchors[k - 1])
                rc = herr_set(e, "span %d: anchors must ascend (row %" PRId64 " after %" PRId64 ")", i, sp->anchors[k],
                              sp->anchors[k - 1]);
        }
        if (rc == 0 && sp->n_anchors < 0) rc = herr_set(e, "span %d: a negative anchor count", i);
        if (rc == 0 && (sp->want < ENGINE_LOGITS_NONE || sp->want > ENGINE_LOGITS_ARGMAX))
            rc = herr_set(e, "span %d: want %d is none, last, all or argmax", i, (int)sp->want);
        else if (rc == 0 && sp->want == ENGINE_LOGITS_ARGMAX && !sp->token)
            rc = herr_set(e, "span %d: a greedy token wanted but nowhere to put it", i);
        else if (rc == 0 && sp->want != ENGINE_LOGITS_NONE && sp->want != ENGINE_LOGITS_ARGMAX && !sp->logits)
            rc = herr_set(e, "span %d: logits wanted but no buffer", i);
    }
    for (int i = 0; i < n_spans; i++)
        if (spans[i].seq >= 0 && spans[i].seq < eng->opts.n_seq_max) eng->seq_seen[spans[i].seq] = 0;
    if (rc < 0) return rc;
    if (run_spans(eng, spans, n_spans, e) < 0) return -1;
    /* provenance: the prefix hashes of the new rows, and each point's */
    for (int i = 0; i < n_spans; i++) {
        const engine_span *sp = &spans[i];
        engine_seq_meta *sm = &eng->seqs[sp->seq];
        const int64_t p0 = sm->pos;
        for (int64_t k = 0; k < sp->n; k++) sm->hash[p0 + k + 1] = engine_hash_step(sm->hash[p0 + k], sp->ids[k]);
        for (int k = 0; k < sp->n_marks; k++) {
            engine_point *p = sp->points[k];
            p->pos = p0 + sp->marks[k];
            p->hash = sm->hash[p->pos];
            p->model_id = eng->info.model_id;
        }
        sm->pos = p0 + sp->n;
    }
    eng->stats.n_calls++;
    return 0;
}

/* ---- points and KV ranges: host copies, counted in the cache budget ---- */

/* whether bytes more fit the budget beside what callers hold and the spares */
static bool cache_fits(const engine *eng, size_t bytes) {
    return (double)eng->cache_used + (double)eng->spare_bytes + (double)bytes <= (double)eng->opts.cache_budget;
}

static void spare_release(engine *eng) {
    engine_point *p = eng->spare[--eng->n_spare];
    eng->spare_bytes -= (int64_t)engine_point_size(p);
    point_release(p);
}

/* spares give way: a take the budget cannot fit beside them frees them (their buffers cost
 * an allocation again later, but the budget is the user's bound on the cache's memory) */
static int cache_take(engine *eng, size_t bytes, const char *what, herr *e) {
    while (eng->n_spare > 0 && !cache_fits(eng, bytes)) {
        spare_release(eng);
        eng->stats.n_spare_releases++;
    }
    if (!cache_fits(eng, bytes))
        return herr_set(e, "%s of %.1f MiB would pass the cache budget (%.1f of %.1f MiB in use): raise --cache-ram or free some",
                        what, (double)bytes / (1 << 20), (double)eng->cache_used / (1 << 20),
                        (double)eng->opts.cache_budget / (1 << 20));
    eng->cache_used += (int64_t)bytes;
    return 0;
}

size_t engine_point_size(const engine_point *p) {
    return (size_t)p->n_gdn * (p->lane_floats + p->ring_floats) * sizeof(float) + sizeof *p;
}

/* a point of the template's shape in buffers of its own; NULL when out of memory */
static engine_point *point_make(engine *eng, const engine_point *tmpl) {
    engine_point *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    *p = *tmpl;
    if (point_buffers(eng, p)) return p;
    point_release(p);
    return NULL;
}

int engine_point_new(engine *eng, engine_point **out, herr *e) {
    const engine_point tmpl = point_shape(&eng->m->hp);
    const size_t bytes = engine_point_size(&tmpl);
    if (eng->n_spare > 0) { /* in the budget already: its bytes move from the spares to the caller */
        engine_point *p = eng->spare[--eng->n_spare];
        eng->spare_bytes -= (int64_t)bytes;
        eng->cache_used += (int64_t)bytes;
        point_header(p, &tmpl); /* pos -1 until filled */
        *out = p;
        return 0;
    }
    if (cache_take(eng, bytes, "a point", e) < 0) return -1;
    engine_point *p = point_make(eng, &tmpl);
    if (!p) {
        eng->cache_used -= (int64_t)bytes;
        return herr_set(e, "out of memory for a point of %.1f MiB", (double)bytes / (1 << 20));
    }
    eng->stats.n_point_allocs++;
    *out = p;
    return 0;
}

void engine_point_free(engine *eng, engine_point *p) {
    if (!p) return;
    const int64_t bytes = (int64_t)engine_point_size(p);
    eng->cache_used -= bytes;
    if (eng->n_spare < eng->spare_cap) { /* its pages stay touched (and pinned) for the next take */
        eng->spare[eng->n_spare++] = p;
        eng->spare_bytes += bytes;
    } else {
        point_release(p);
    }
}

engine_point *engine_point_make(engine *eng) {
    const engine_point tmpl = point_shape(&eng->m->hp);
    engine_point *p = point_make(eng, &tmpl);
    if (!p) return NULL;
    /* every page touched now (calloc's are mapped lazily): a point written into fresh pages
     * pays their faults on the pass */
    memset(p->lanes, 0, sizeof(float) * (size_t)p->n_gdn * p->lane_floats);
    memset(p->rings, 0, sizeof(float) * (size_t)p->n_gdn * p->ring_floats);
    return p;
}

bool engine_point_adopt(engine *eng, engine_point *p) {
    const int64_t bytes = (int64_t)engine_point_size(p);
    if (eng->n_spare >= eng->spare_cap || !cache_fits(eng, (size_t)bytes)) {
        point_release(p);
        return false;
    }
    eng->spare[eng->n_spare++] = p;
    eng->spare_bytes += bytes;
    eng->stats.n_point_reserved++;
    return true;
}

int engine_point_reserve(engine *eng, int n) {
    const engine_point tmpl = point_shape(&eng->m->hp);
    const size_t bytes = engine_point_size(&tmpl);
    if (n > eng->spare_cap) n = eng->spare_cap;
    while (eng->n_spare < n && cache_fits(eng, bytes)) {
        engine_point *p = engine_point_make(eng);
        if (!p) break; /* out of memory: a take will say so when it needs one */
        engine_point_adopt(eng, p);
    }
    return eng->n_spare;
}

int engine_save(engine *eng, int seq, engine_point *p, herr *e) {
    if (check_seq(eng, seq, e) < 0) return -1;
    const engine_seq_meta *sm = &eng->seqs[seq];
    if (sm->stale) return herr_set(e, "sequence %d holds KV rows without their state: nothing to save", seq);
    eng->be->save(eng, seq, p);
    p->pos = sm->pos;
    p->hash = sm->hash[sm->pos];
    p->model_id = eng->info.model_id;
    return 0;
}

int engine_restore(engine *eng, int seq, const engine_point *p, herr *e) {
    if (check_seq(eng, seq, e) < 0) return -1;
    engine_seq_meta *sm = &eng->seqs[seq];
    if (p->model_id != eng->info.model_id) return herr_set(e, "the point was made by another model");
    if (p->pos < 0 || p->pos > eng->opts.n_ctx) return herr_set(e, "the point's position %" PRId64 " is invalid", p->pos);
    if (p->pos > sm->pos)
        return herr_set(e, "the point at position %" PRId64 " is past sequence %d's %" PRId64 " KV rows: write its KV range first",
                        p->pos, seq, sm->pos);
    if (sm->hash[p->pos] != p->hash && !MUTANT("stale_accept")) /* mutant: provenance not checked */
        return herr_set(e, "sequence %d's KV rows below position %" PRId64 " were made from other ids than the point's: refused",
                        seq, p->pos);
    eng->be->restore(eng, seq, p);
    sm->pos = p->pos;
    sm->stale = false;
    return 0;
}

int engine_kv_new(engine *eng, int64_t a, int64_t b, engine_kv **out, herr *e) {
    if (a < 0 || b <= a || b > eng->opts.n_ctx)
        return herr_set(e, "KV rows [%" PRId64 ", %" PRId64 ") do not fit the context of %" PRId64, a, b, eng->opts.n_ctx);
    const size_t bytes = eng->info.kv_bytes_per_token * (size_t)(b - a);
    const size_t total = bytes + sizeof(uint64_t) * (size_t)(b - a) + sizeof(engine_kv);
    if (cache_take(eng, total, "a KV range", e) < 0) return -1;
    engine_kv *kv = calloc(1, sizeof *kv);
    if (kv) {
        kv->data = malloc(bytes);
        kv->hash = malloc(sizeof(uint64_t) * (size_t)(b - a));
    }
    if (!kv || !kv->data || !kv->hash) {
        if (kv) { free(kv->data); free(kv->hash); free(kv); }
        eng->cache_used -= (int64_t)total;
        return herr_set(e, "out of memory for a KV range of %.1f MiB", (double)bytes / (1 << 20));
    }
    kv->a = a;
    kv->b = b;
    kv->bytes = bytes;
    kv->model_id = eng->info.model_id;
    *out = kv;
    return 0;
}

int engine_kv_read(engine *eng, int seq, int64_t a, int64_t b, engine_kv **out, herr *e) {
    if (check_seq(eng, seq, e) < 0) return -1;
    const engine_seq_meta *sm = &eng->seqs[seq];
    if (a < 0 || b <= a || b > sm->pos)
        return herr_set(e, "KV rows [%" PRId64 ", %" PRId64 ") are not inside sequence %d's [0, %" PRId64 ")", a, b, seq, sm->pos);
    engine_kv *kv;
    if (engine_kv_new(eng, a, b, &kv, e) < 0) return -1;
    kv->hash_a = sm->hash[a];
    memcpy(kv->hash, sm->hash + a + 1, sizeof(uint64_t) * (size_t)(b - a));
    eng->be->kv_read(eng, seq, a, b, kv->data);
    *out = kv;
    return 0;
}

int engine_kv_write(engine *eng, int seq, const engine_kv *kv, herr *e) {
    if (check_seq(eng, seq, e) < 0) return -1;
    engine_seq_meta *sm = &eng->seqs[seq];
    if (kv->model_id != eng->info.model_id) return herr_set(e, "the KV range was made by another model");
    if (kv->a < 0 || kv->b <= kv->a || kv->b > eng->opts.n_ctx)
        return herr_set(e, "KV rows [%" PRId64 ", %" PRId64 ") do not fit the context of %" PRId64, kv->a, kv->b,
                        eng->opts.n_ctx);
    if (kv->a > sm->pos)
        return herr_set(e, "KV rows from %" PRId64 " cannot follow sequence %d's %" PRId64 " rows", kv->a, seq, sm->pos);
    if (sm->hash[kv->a] != kv->hash_a)
        return herr_set(e, "sequence %d's rows below %" PRId64 " were made from other ids than the KV range's: refused", seq,
                        kv->a);
    eng->be->kv_write(eng, seq, kv->a, kv->b, kv->data);
    memcpy(sm->hash + kv->a + 1, kv->hash, sizeof(uint64_t) * (size_t)(kv->b - kv->a));
    sm->pos = kv->b;
    sm->stale = true;
    return 0;
}

void engine_kv_free(engine *eng, engine_kv *kv) {
    if (!kv) return;
    eng->cache_used -= (int64_t)(kv->bytes + sizeof(uint64_t) * (size_t)(kv->b - kv->a) + sizeof(engine_kv));
    free(kv->data);
    free(kv->hash);
    free(kv);
}

int engine_truncate(engine *eng, int seq, int64_t pos, herr *e) {
    if (check_seq(eng, seq, e) < 0) return -1;
    engine_seq_meta *sm = &eng->seqs[seq];
    if (pos == sm->pos) return 0;
    if (pos < 0 || pos > sm->pos)
        return herr_set(e, "cannot truncate sequence %d to %" PRId64 ": it holds %" PRId64 " rows", seq, pos, sm->pos);
    if (n_gdn_layers(&eng->m->hp) > 0 && !sm->stale)
        return herr_set(e, "cannot truncate sequence %d to %" PRId64 ": the recurrent state at that row is gone; restore a point",
                        seq, pos);
    sm->pos = pos; /* KV rows alone (no recurrent layers, or a stale sequence awaiting a restore) */
    return 0;
}

int engine_mtp_draft(engine *eng, int seq, int32_t token, int k, int32_t *out, float *logits, herr *e) {
    if (!eng->info.mtp) return herr_set(e, "the engine was opened without the MTP block (--spec-mtp)");
    if (check_seq(eng, seq, e) < 0) return -1;
    const engine_seq_meta *sm = &eng->seqs[seq];
    if (sm->stale) return herr_set(e, "sequence %d needs a restore before it drafts", seq);
    if (token < 0 || token >= eng->m->hp.n_vocab)
        return herr_set(e, "token %" PRId32 " is outside the vocabulary of %" PRId64, token, eng->m->hp.n_vocab);
    if (k < 1) return herr_set(e, "drafts: %d, expected at least 1", k);
    if ((int64_t)k > eng->opts.n_ctx - sm->pos) k = (int)(eng->opts.n_ctx - sm->pos);
    if (k == 0) return 0;
    eng->be->mtp_draft(eng, seq, token, k, out, logits);
    return k;
}
