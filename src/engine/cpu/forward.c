/* forward.c: the CPU backend of engine.h: a call's spans packed into forward passes, the
 * pass itself (layer by layer over all its rows), and the backend table.
 *
 * Packing keeps every sequence's bits independent of the rest of the call: a span is cut
 * into pieces of up to CPU_UBATCH rows on its own chunk grid (engine_piece_end), whatever
 * else is in the call, and a
 * pass takes at most one piece of each span, in order, up to rows_max rows. Every op is per
 * row (matmuls: one quant_dot per output; MoE: experts summed in slot order; attention:
 * one row's keys) or per piece (the GDN chunks), so which pieces share a pass moves no bit. */
#include "engine/cpu/cpu.h"
#include "format/quant.h"
#include "engine/mutant.h"

#include <stdlib.h>
#include <string.h>

typedef struct fwd_ctx {
    cpu_engine *ce;
    const model *m;
    const int32_t *ids;
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
    const int64_t src = c->rows ? c->rows[r] : r;
    cpu_rmsnorm(c->x + src * E, c->norm_w, c->h + r * E, E, c->m->hp.rms_eps);
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

static void forward(cpu_engine *ce, const cpu_batch *b) {
    const model *m = ce->base.m;
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, n = b->n;
    fwd_ctx c = {.ce = ce, .m = m, .ids = b->ids};
    c.x = cpu_scratch(ce, sizeof(float) * (size_t)(n * E));
    c.h = cpu_scratch(ce, sizeof(float) * (size_t)(n * E));
    float *y = cpu_scratch(ce, sizeof(float) * (size_t)(n * E));
    const size_t mark = cpu_arena_mark(&ce->ar); /* each op's scratch is given back after it */
    pool_for(ce->pool, n, embed_task, &c);
    int64_t gdn_index = 0;
    add_ctx ac = {c.x, y, n * E};
    const int64_t add_tasks = (ac.n + ADD_BLOCK - 1) / ADD_BLOCK;
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer *L = &m->layers[il];
        c.norm_w = L->attn_norm.data;
        pool_for(ce->pool, n, norm_task, &c);
        if (L->recurrent) cpu_gdn_layer(ce, il, b, c.h, y, gdn_index++);
        else cpu_attn_layer(ce, il, b, c.h, y);
        cpu_arena_rewind(&ce->ar, mark);
        pool_for(ce->pool, add_tasks, add_task, &ac);
        c.norm_w = L->post_norm.data;
        pool_for(ce->pool, n, norm_task, &c);
        cpu_moe_layer(ce, il, b, c.h, y);
        cpu_arena_rewind(&ce->ar, mark);
        pool_for(ce->pool, add_tasks, add_task, &ac);
    }
    if (!b->n_logits) return;
    /* final norm and the output projection, for the rows whose logits are wanted, in one job
     * so the output matrix is read once */
    int32_t *rows = cpu_scratch(ce, sizeof(int32_t) * (size_t)b->n_logits);
    float **dst = cpu_scratch(ce, sizeof(float *) * (size_t)b->n_logits);
    int64_t k = 0;
    for (int64_t r = 0; r < n; r++)
        if (b->logit_row[r]) {
            rows[k] = (int32_t)r;
            dst[k++] = b->logit_row[r];
        }
    fwd_ctx fc = c;
    fc.rows = rows;
    fc.norm_w = m->output_norm.data;
    pool_for(ce->pool, k, norm_task, &fc);
    const qtensor *w = &m->output;
    const size_t xs = cpu_act_bytes(w->type, E);
    uint8_t *xq = cpu_scratch(ce, xs * (size_t)k);
    cpu_quantize_rows(ce, w->type, c.h, E, k, E, xq, xs);
    mm_job j = {.w = w, .xq = xq, .xq_stride = xs, .n = k, .y_row = dst};
    cpu_matmul_jobs(ce, &j, 1);
}

/* The per-pass arrays of cpu_run, then forward()'s rows, then the largest op, then the
 * output projection: the arena's size, computed once at open (arena.h). */
static size_t pass_arrays(int64_t R, int n_seq) {
    return arena_round(sizeof(int32_t) * (size_t)R) + arena_round(sizeof(cpu_piece) * (size_t)n_seq) +
           arena_round(sizeof(cpu_mark) * (size_t)R) + arena_round(sizeof(int64_t) * (size_t)R) +
           arena_round(sizeof(int32_t) * (size_t)R) +
           arena_round(sizeof(int64_t) * (size_t)R) + arena_round(sizeof(cpu_seq *) * (size_t)R) +
           arena_round(sizeof(int64_t) * (size_t)R) + arena_round(sizeof(float *) * (size_t)R) +
           2 * arena_round(sizeof(int64_t) * (size_t)n_seq);
}

static size_t scratch_bound(const model_hparams *hp, int64_t R, int64_t n_ctx, int nth, int n_seq) {
    const int64_t E = hp->n_embd;
    size_t ops = cpu_moe_scratch(hp, R), g = cpu_gdn_scratch(hp, R, nth), a = cpu_attn_scratch(hp, R, n_ctx, nth);
    ops = ops > g ? ops : g;
    ops = ops > a ? ops : a;
    const size_t out = arena_round(sizeof(int32_t) * (size_t)R) + arena_round(sizeof(float *) * (size_t)R) +
                       cpu_act_scratch(R, E, 1) + cpu_jobs_scratch(1);
    return pass_arrays(R, n_seq) + 3 * arena_round(sizeof(float) * (size_t)(R * E)) + (ops > out ? ops : out);
}

static int cpu_run(engine *eng, const engine_span *spans, int n_spans, herr *e) {
    cpu_engine *ce = (cpu_engine *)eng;
    const int64_t V = eng->m->hp.n_vocab, R = ce->rows_max;
    cpu_arena_rewind(&ce->ar, 0);
    int64_t *done = cpu_scratch(ce, sizeof(int64_t) * (size_t)n_spans);
    int64_t *call0 = cpu_scratch(ce, sizeof(int64_t) * (size_t)n_spans); /* the span's first row in the call */
    for (int i = 0; i < n_spans; i++) {
        done[i] = 0;
        call0[i] = i ? call0[i - 1] + spans[i - 1].n : 0;
    }
    const size_t base = cpu_arena_mark(&ce->ar);
    for (;;) {
        cpu_arena_rewind(&ce->ar, base);
        int32_t *ids = cpu_scratch(ce, sizeof(int32_t) * (size_t)R);
        cpu_piece *pieces = cpu_scratch(ce, sizeof(cpu_piece) * (size_t)eng->opts.n_seq_max);
        cpu_mark *marks = cpu_scratch(ce, sizeof(cpu_mark) * (size_t)R);
        int64_t *anchors = cpu_scratch(ce, sizeof(int64_t) * (size_t)R);
        int32_t *row_piece = cpu_scratch(ce, sizeof(int32_t) * (size_t)R);
        int64_t *pos = cpu_scratch(ce, sizeof(int64_t) * (size_t)R);
        cpu_seq **row_seq = cpu_scratch(ce, sizeof(cpu_seq *) * (size_t)R);
        int64_t *row_call = cpu_scratch(ce, sizeof(int64_t) * (size_t)R);
        float **logit_row = cpu_scratch(ce, sizeof(float *) * (size_t)R);
        int64_t n = 0, n_logits = 0, n_marks = 0, n_anchors = 0;
        int np = 0;
        for (int i = 0; i < n_spans; i++) {
            const engine_span *sp = &spans[i];
            if (done[i] == sp->n) continue;
            int64_t len = engine_piece_end(sp->anchors, sp->n_anchors, sp->n, done[i], CPU_UBATCH, CPU_CHUNK) - done[i];
            if (MUTANT("piece_from_start")) /* mutant: pieces every CPU_UBATCH rows, off the anchors' grid */
                len = sp->n - done[i] < CPU_UBATCH ? sp->n - done[i] : CPU_UBATCH;
            /* mutant: a marked call split into two passes at its first mark */
            if (MUTANT("extra_pass") && sp->n_marks && sp->marks[0] > done[i] && sp->marks[0] < done[i] + len)
                len = sp->marks[0] - done[i];
            if (n + len > R) continue; /* the next pass takes it */
            cpu_piece *pc = &pieces[np];
            *pc = (cpu_piece){.s = &ce->seqs[sp->seq], .r0 = n, .n = len, .pos0 = eng->seqs[sp->seq].pos + done[i],
                              .marks = marks + n_marks, .anchors = anchors + n_anchors};
            for (int k = 0; k < sp->n_marks; k++)
                if (sp->marks[k] > done[i] && sp->marks[k] <= done[i] + len)
                    marks[n_marks + pc->n_marks++] = (cpu_mark){.m = sp->marks[k] - done[i], .p = sp->points[k]};
            n_marks += pc->n_marks;
            for (int k = 0; k < sp->n_anchors; k++)
                if (sp->anchors[k] > done[i] && sp->anchors[k] < done[i] + len)
                    anchors[n_anchors + pc->n_anchors++] = sp->anchors[k] - done[i];
            n_anchors += pc->n_anchors;
            for (int64_t k = 0; k < len; k++) {
                const int64_t at = done[i] + k, r = n + k;
                ids[r] = sp->ids[at];
                row_piece[r] = np;
                pos[r] = pc->pos0 + k;
                row_seq[r] = pc->s;
                row_call[r] = call0[i] + at;
                logit_row[r] = sp->want == ENGINE_LOGITS_ALL                     ? sp->logits + at * V
                               : sp->want == ENGINE_LOGITS_LAST && at == sp->n - 1 ? sp->logits
                                                                                   : NULL;
                n_logits += logit_row[r] != NULL;
            }
            done[i] += len;
            n += len;
            np++;
        }
        if (n == 0) break;
        cpu_batch b = {.n = n, .ids = ids, .pieces = pieces, .n_pieces = np, .row_piece = row_piece, .pos = pos,
                       .row_seq = row_seq, .row_call = row_call, .logit_row = logit_row, .n_logits = n_logits};
        forward(ce, &b);
        eng->stats.n_passes++;
        eng->stats.n_rows += n;
        eng->stats.n_points += n_marks;
    }
    eng->stats.t_points = (double)atomic_load(&ce->point_ns) * 1e-9;
    (void)e;
    return 0;
}

static void cpu_seq_clear(engine *eng, int seq) { cpu_state_zero(&((cpu_engine *)eng)->seqs[seq], &eng->m->hp); }

static void cpu_save(engine *eng, int seq, engine_point *p) {
    cpu_state_copy(&((cpu_engine *)eng)->seqs[seq], &eng->m->hp, p, true);
}

static void cpu_restore(engine *eng, int seq, const engine_point *p) {
    cpu_state_copy(&((cpu_engine *)eng)->seqs[seq], &eng->m->hp, (engine_point *)p, false);
}

static void cpu_kv_read(engine *eng, int seq, int64_t a, int64_t b, void *data) {
    cpu_engine *ce = (cpu_engine *)eng;
    cpu_state_kv(&ce->seqs[seq], &eng->m->hp, ce->kv_f16, a, b, data, true);
}

static void cpu_kv_write(engine *eng, int seq, int64_t a, int64_t b, const void *data) {
    cpu_engine *ce = (cpu_engine *)eng;
    cpu_state_kv(&ce->seqs[seq], &eng->m->hp, ce->kv_f16, a, b, (void *)data, false);
}

static void cpu_free(engine *eng) {
    cpu_engine *ce = (cpu_engine *)eng;
    if (ce->pool) pool_free(ce->pool);
    cpu_state_free(ce->seqs, eng->opts.n_seq_max, &eng->m->hp);
    cpu_arena_free(&ce->ar);
    engine_fini(eng);
    free(ce);
}

static const engine_backend cpu_backend = {
    .name = "cpu",
    .free = cpu_free,
    .run = cpu_run,
    .seq_clear = cpu_seq_clear,
    .save = cpu_save,
    .restore = cpu_restore,
    .kv_read = cpu_kv_read,
    .kv_write = cpu_kv_write,
};

int engine_open_cpu(engine **out, const model *m, const engine_opts *o, herr *e) {
    cpu_engine *ce = xcalloc(1, sizeof *ce);
    engine *eng = &ce->base;
    if (engine_init(eng, &cpu_backend, m, o, e) < 0) {
        cpu_free(eng);
        return -1;
    }
    const model_hparams *hp = &m->hp;
    ce->nth = eng->opts.n_threads;
    ce->kv_f16 = eng->opts.kv_f16;
    ce->rows_max = CPU_UBATCH + eng->opts.n_seq_max;
    if (cpu_state_new(&ce->seqs, hp, eng->opts.n_seq_max, eng->opts.n_ctx, ce->kv_f16, e) < 0) {
        cpu_free(eng);
        return -1;
    }
    const size_t bound = scratch_bound(hp, ce->rows_max, eng->opts.n_ctx, ce->nth, eng->opts.n_seq_max);
    if (cpu_arena_init(&ce->ar, bound) < 0) {
        cpu_free(eng);
        return herr_set(e, "cannot allocate %.1f MiB of scratch for passes of %lld rows: lower -np or -t", (double)bound / (1 << 20),
                        (long long)ce->rows_max);
    }
    ce->pool = pool_new(ce->nth);
    eng->info.backend = "cpu";
    eng->info.chunk = CPU_CHUNK;
    eng->info.rows_per_pass = CPU_UBATCH;
    *out = eng;
    return 0;
}
