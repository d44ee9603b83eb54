/* forward.c: the CPU backend of engine.h: sequence state, the scratch arena, and the
 * forward pass that runs layer by layer over a batch of rows (a prompt's rows, chunked
 * GDN; or one row per sequence for a decode step, sequential GDN). */
#include "engine/cpu/cpu.h"
#include "format/quant.h"
#include "engine/mutant.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- scratch arena: blocks kept across passes, so after the first pass nothing is allocated ---- */
#define ARENA_BLOCKS 64
typedef struct arena {
    uint8_t *block[ARENA_BLOCKS];
    size_t size[ARENA_BLOCKS];
    int cur;
    size_t used;
} arena;

typedef struct cpu_engine_full {
    cpu_engine ce;
    arena ar;
} cpu_engine_full;

void *cpu_scratch(cpu_engine *ce, size_t bytes) {
    arena *a = &((cpu_engine_full *)ce)->ar;
    bytes = (bytes + 63) & ~(size_t)63;
    for (;;) {
        if (a->block[a->cur] && a->used + bytes <= a->size[a->cur]) {
            void *p = a->block[a->cur] + a->used;
            a->used += bytes;
            return p;
        }
        if (a->block[a->cur]) {
            a->cur++;
            a->used = 0;
            if (a->cur >= ARENA_BLOCKS) HEARTH_DIE("scratch arena exhausted");
        }
        if (!a->block[a->cur]) {
            size_t sz = bytes > ((size_t)64 << 20) ? bytes : ((size_t)64 << 20);
            a->block[a->cur] = xmalloc_aligned(64, sz);
            a->size[a->cur] = sz;
        }
    }
}

static void scratch_reset(cpu_engine *ce) {
    arena *a = &((cpu_engine_full *)ce)->ar;
    a->cur = 0;
    a->used = 0;
}

/* ---- sequences ---- */
static void cpu_seq_free(engine *eng, seq *s);

/* The KV rows are the one size a user sets (-c): a request too large for this machine's
 * memory is an error that says so, not an abort. */
static seq *cpu_seq_new(engine *eng, herr *e) {
    const model_hparams *hp = &eng->m->hp;
    seq *s = xcalloc(1, sizeof *s);
    s->n_ctx = eng->opts.n_ctx;
    s->kv_f16 = eng->opts.kv_f16;
    const size_t kv_row = (size_t)(hp->n_head_kv * hp->head_dim) * (s->kv_f16 ? 2 : 4);
    size_t kv_bytes = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->is_recurrent[il]) {
            s->lane[il] = calloc((size_t)(hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state), sizeof(float));
            s->ring[il] = calloc((size_t)((hp->ssm_d_conv - 1) * hp_conv_dim(hp)), sizeof(float));
            if (!s->lane[il] || !s->ring[il]) goto oom;
        } else {
            s->k[il] = malloc(kv_row * (size_t)s->n_ctx);
            s->v[il] = malloc(kv_row * (size_t)s->n_ctx);
            kv_bytes += 2 * kv_row * (size_t)s->n_ctx;
            if (!s->k[il] || !s->v[il]) goto oom;
        }
    }
    return s;
oom:
    cpu_seq_free(eng, s);
    herr_set(e, "cannot allocate a sequence of %lld tokens (%.1f MiB of KV rows so far): lower -c", (long long)eng->opts.n_ctx,
             (double)kv_bytes / (1 << 20));
    return NULL;
}

static void cpu_seq_free(engine *eng, seq *s) {
    for (int il = 0; il < eng->m->hp.n_layer; il++) {
        free(s->k[il]);
        free(s->v[il]);
        free(s->lane[il]);
        free(s->ring[il]);
    }
    free(s);
}

static int64_t cpu_seq_pos(const seq *s) { return s->pos; }

/* ---- the forward pass ---- */
typedef struct fwd_ctx {
    cpu_engine *ce;
    const model *m;
    const int32_t *ids;
    int64_t n;
    float *x, *h;
    const float *norm_w;
    const int32_t *rows;   /* final norm: which rows */
} fwd_ctx;

static void embed_task(void *arg, int64_t r, int thread) {
    fwd_ctx *c = arg;
    const qtensor *te = &c->m->token_embd;
    const int64_t E = c->m->hp.n_embd;
    quant_dequantize_row(te->type, (const uint8_t *)te->data + (size_t)c->ids[r] * te->row_bytes, c->x + r * E, E);
}

static void norm_task(void *arg, int64_t r, int thread) {
    fwd_ctx *c = arg;
    const int64_t E = c->m->hp.n_embd;
    {
        int64_t src = c->rows ? c->rows[r] : r;
        cpu_rmsnorm(c->x + src * E, c->norm_w, c->h + r * E, E, c->m->hp.rms_eps);
    }
}

typedef struct add_ctx {
    float *x;
    const float *y;
    int64_t n;
} add_ctx;

#define ADD_BLOCK 4096
static void add_task(void *arg, int64_t t, int thread) {
    add_ctx *c = arg;
    int64_t i0 = t * ADD_BLOCK, i1 = i0 + ADD_BLOCK < c->n ? i0 + ADD_BLOCK : c->n;
    for (int64_t i = i0; i < i1; i++) c->x[i] += c->y[i];
}

static void forward(cpu_engine *ce, seq **seqs, const int32_t *ids, const int64_t *pos, int64_t n, bool chunked,
                    const cpu_mark *marks, int n_marks, float *logits, bool all_logits) {
    const model *m = ce->base.m;
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd;
    scratch_reset(ce);
    fwd_ctx c = {.ce = ce, .m = m, .ids = ids, .n = n};
    c.x = cpu_scratch(ce, sizeof(float) * (size_t)(n * E));
    c.h = cpu_scratch(ce, sizeof(float) * (size_t)(n * E));
    float *y = cpu_scratch(ce, sizeof(float) * (size_t)(n * E));
    pool_for(ce->pool, n, embed_task, &c);
    int64_t gdn_index = 0;
    add_ctx ac = {c.x, y, n * E};
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer *L = &m->layers[il];
        c.norm_w = L->attn_norm.data;
        pool_for(ce->pool, c.n, norm_task, &c);
        if (L->recurrent) cpu_gdn_layer(ce, il, seqs, n, chunked, c.h, y, marks, n_marks, gdn_index++);
        else cpu_attn_layer(ce, il, seqs, pos, n, c.h, y);
        pool_for(ce->pool, (ac.n + ADD_BLOCK - 1) / ADD_BLOCK, add_task, &ac);
        c.norm_w = L->post_norm.data;
        pool_for(ce->pool, c.n, norm_task, &c);
        cpu_moe_layer(ce, il, c.h, n, y);
        pool_for(ce->pool, (ac.n + ADD_BLOCK - 1) / ADD_BLOCK, add_task, &ac);
    }
    if (!logits) return;
    /* final norm and the output projection, for the rows whose logits are wanted */
    int64_t n_out = all_logits ? n : 1;
    int32_t *rows = cpu_scratch(ce, sizeof(int32_t) * (size_t)n_out);
    for (int64_t r = 0; r < n_out; r++) rows[r] = (int32_t)(all_logits ? r : n - 1);
    fwd_ctx fc = c;
    fc.n = n_out;
    fc.rows = rows;
    fc.norm_w = m->output_norm.data;
    pool_for(ce->pool, fc.n, norm_task, &fc);
    cpu_matmul(ce, &m->output, c.h, n_out, logits);
}

static int cpu_prefill(engine *eng, seq *s, const int32_t *ids, int64_t n, const int64_t *marks, int n_marks,
                       point *points, float *logits, bool all_logits, herr *e) {
    cpu_engine *ce = (cpu_engine *)eng;
    const int64_t V = eng->m->hp.n_vocab, start = s->pos;
    int64_t *pos = xmalloc(sizeof(int64_t) * CPU_UBATCH);
    seq **seqs = xmalloc(sizeof(seq *) * CPU_UBATCH);
    cpu_mark *um = xmalloc(sizeof(cpu_mark) * (size_t)(n_marks + 1));
    eng->stats.n_prefill_calls++;
    /* mutant: a marked call split into two passes at its first mark */
    const int64_t split = MUTANT("extra_pass") && n_marks > 0 && marks[0] < n ? marks[0] : 0;
    for (int64_t u0 = 0; u0 < n;) {
        int64_t un = n - u0 < CPU_UBATCH ? n - u0 : CPU_UBATCH;
        if (split && u0 < split && u0 + un > split) un = split - u0;
        int nm = 0;
        for (int i = 0; i < n_marks; i++)
            if (marks[i] > u0 && marks[i] <= u0 + un) {
                um[nm].m = marks[i] - u0;
                um[nm].p = &points[i];
                points[i].pos = start + marks[i];
                nm++;
            }
        for (int64_t r = 0; r < un; r++) {
            pos[r] = s->pos + r;
            seqs[r] = s;
        }
        const bool last = u0 + un == n;
        float *lg = !logits ? NULL : all_logits ? logits + u0 * V : last ? logits : NULL;
        ce->route_row0 = u0;
        forward(ce, seqs, ids + u0, pos, un, true, um, nm, lg, all_logits);
        eng->stats.n_passes++;
        eng->stats.n_points += nm;
        s->pos += un;
        u0 += un;
    }
    eng->stats.t_points = (double)atomic_load(&ce->point_ns) * 1e-9;
    free(pos);
    free(seqs);
    free(um);
    (void)e;
    return 0;
}

static int cpu_step(engine *eng, seq **seqs, const int32_t *ids, int n_seqs, float *logits, herr *e) {
    cpu_engine *ce = (cpu_engine *)eng;
    int64_t *pos = xmalloc(sizeof(int64_t) * (size_t)n_seqs);
    for (int i = 0; i < n_seqs; i++) pos[i] = seqs[i]->pos;
    for (int64_t r0 = 0; r0 < n_seqs; r0 += CPU_UBATCH) {
        int64_t un = n_seqs - r0 < CPU_UBATCH ? n_seqs - r0 : CPU_UBATCH;
        ce->route_row0 = r0;
        forward(ce, seqs + r0, ids + r0, pos + r0, un, false, NULL, 0, logits ? logits + r0 * eng->m->hp.n_vocab : NULL,
                true);
    }
    for (int i = 0; i < n_seqs; i++) seqs[i]->pos++;
    eng->stats.n_step_calls++;
    free(pos);
    (void)e;
    return 0;
}

static void copy_state(const model_hparams *hp, const point *p, seq *s, bool to_point) {
    int64_t g = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        if (!hp->is_recurrent[il]) continue;
        float *pl = p->lanes + (size_t)g * p->lane_floats, *pr = p->rings + (size_t)g * p->ring_floats;
        if (to_point) {
            memcpy(pl, s->lane[il], sizeof(float) * p->lane_floats);
            memcpy(pr, s->ring[il], sizeof(float) * p->ring_floats);
        } else {
            memcpy(s->lane[il], pl, sizeof(float) * p->lane_floats);
            memcpy(s->ring[il], pr, sizeof(float) * p->ring_floats);
        }
        g++;
    }
}

static int cpu_restore(engine *eng, seq *s, const point *p, herr *e) {
    const model_hparams *hp = &eng->m->hp;
    if (MUTANT("restore_ring_skip")) { /* mutant: the lanes are restored, the rings are not */
        for (int il = 0, g = 0; il < hp->n_layer; il++)
            if (hp->is_recurrent[il]) memcpy(s->lane[il], p->lanes + (size_t)g++ * p->lane_floats, sizeof(float) * p->lane_floats);
    } else {
        copy_state(hp, p, s, false);
    }
    s->pos = p->pos;
    (void)e;
    return 0;
}

static void cpu_snapshot(engine *eng, const seq *s, point *p) {
    copy_state(&eng->m->hp, p, (seq *)s, true);
    p->pos = s->pos;
}

static int cpu_truncate(engine *eng, seq *s, int64_t pos, herr *e) {
    if (pos == s->pos) return 0;
    if (pos > s->pos) return herr_set(e, "cannot truncate to %lld: the sequence holds %lld rows", (long long)pos, (long long)s->pos);
    for (int il = 0; il < eng->m->hp.n_layer; il++)
        if (eng->m->hp.is_recurrent[il])
            return herr_set(e, "cannot truncate to %lld: the recurrent state at that row is gone; restore a point instead",
                            (long long)pos);
    s->pos = pos; /* a model without recurrent layers: KV rows alone */
    return 0;
}

static void cpu_free(engine *eng) {
    cpu_engine_full *f = (cpu_engine_full *)eng;
    pool_free(f->ce.pool);
    for (int i = 0; i < ARENA_BLOCKS; i++) free(f->ar.block[i]);
    free(f);
}

static const engine_backend cpu_backend = {
    .name = "cpu",
    .free = cpu_free,
    .seq_new = cpu_seq_new,
    .seq_free = cpu_seq_free,
    .prefill = cpu_prefill,
    .step = cpu_step,
    .restore = cpu_restore,
    .truncate = cpu_truncate,
    .seq_pos = cpu_seq_pos,
    .snapshot = cpu_snapshot,
};

int engine_open_cpu(engine **out, const model *m, const engine_opts *o, herr *e) {
    cpu_engine_full *f = xcalloc(1, sizeof *f);
    engine *eng = &f->ce.base;
    eng->be = &cpu_backend;
    eng->m = m;
    eng->opts = o ? *o : (engine_opts){0};
    if (eng->opts.n_threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        eng->opts.n_threads = nc > 0 ? (int)nc : 1;
    }
    if (eng->opts.n_threads > 512) {
        int want = eng->opts.n_threads;
        free(f);
        return herr_set(e, "-t %d: at most 512 threads", want);
    }
    if (eng->opts.n_ctx <= 0) eng->opts.n_ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    if (eng->opts.n_ctx > m->hp.n_ctx_train) {
        int64_t want = eng->opts.n_ctx;
        free(f);
        return herr_set(e, "context of %lld tokens exceeds the model's %lld", (long long)want, (long long)m->hp.n_ctx_train);
    }
    f->ce.nth = eng->opts.n_threads;
    f->ce.pool = pool_new(f->ce.nth);
    *out = eng;
    return 0;
}
