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
#include "engine/sampler.h"

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

/* ---- the MTP block (engine_opts.mtp) ----
 * Its row at position p reads the trunk's last hidden row at p - 1 after output_norm (h) and
 * the embedding e of the id at p (llama.cpp's pairing; zeros for h at p = 0):
 *   x = eh_proj [enorm(e); hnorm(h)], then one attention layer with its MoE (layers[n_layer],
 *   residuals as the trunk's), head_norm, the trunk's output matrix.
 * A pass makes the block's KV rows for all its rows (x, attn_norm, K and V: nothing else of
 * the block is read later); engine_mtp_draft runs the whole block a row at a time. */
typedef struct mtp_ctx {
    const model *m;
    const cpu_batch *b;
    const float *hn;   /* (n, E) the pass's rows' h */
    float *cat;        /* (n, 2E) [enorm(e); hnorm(h at p - 1)] */
} mtp_ctx;

/* [enorm(e of id); hnorm(h)] into cat (2E) */
static void mtp_input(const model *m, int32_t id, const float *h, float *cat) {
    const qtensor *te = &m->token_embd;
    const int64_t E = m->hp.n_embd;
    float *ce = MUTANT("mtp_swap") ? cat + E : cat, *ch = MUTANT("mtp_swap") ? cat : cat + E; /* mutant: [h; e] */
    quant_dequantize_row(te->type, (const uint8_t *)te->data + (size_t)id * te->row_bytes, ce, E);
    cpu_rmsnorm(ce, m->mtp.enorm.data, ce, E, m->hp.rms_eps);
    cpu_rmsnorm(h, m->mtp.hnorm.data, ch, E, m->hp.rms_eps);
}

static void mtp_input_task(void *arg, int64_t r, int thread) {
    mtp_ctx *c = arg;
    const int64_t E = c->m->hp.n_embd;
    const cpu_piece *pc = &c->b->pieces[c->b->row_piece[r]];
    mtp_input(c->m, c->b->ids[r], r > pc->r0 ? c->hn + (r - 1) * E : pc->s->mtp_h, c->cat + r * 2 * E);
}

/* the block's KV rows for the pass's rows, then each sequence's h and kept rows */
static void mtp_pass(cpu_engine *ce, const cpu_batch *b, const float *hn) {
    const model *m = ce->base.m;
    const int64_t E = m->hp.n_embd, n = b->n;
    const int il = (int)m->hp.n_layer;
    const size_t mark = cpu_arena_mark(&ce->ar);
    mtp_ctx c = {.m = m, .b = b, .hn = hn, .cat = cpu_scratch(ce, sizeof(float) * (size_t)(n * 2 * E))};
    float *x = cpu_scratch(ce, sizeof(float) * (size_t)(n * E));
    pool_for(ce->pool, n, mtp_input_task, &c);
    cpu_matmul(ce, &m->mtp.eh_proj, c.cat, n, x);
    for (int64_t r = 0; r < n; r++) cpu_rmsnorm(x + r * E, m->layers[il].attn_norm.data, x + r * E, E, m->hp.rms_eps);
    if (!MUTANT("mtp_kv_skip")) cpu_attn_kv(ce, il, b, x); /* mutant: the block's KV rows of a pass not made */
    for (int i = 0; i < b->n_pieces; i++) {
        const cpu_piece *pc = &b->pieces[i];
        cpu_seq *s = pc->s;
        const int64_t keep = pc->n < CPU_MTP_KEEP ? pc->n : CPU_MTP_KEEP, r1 = pc->r0 + pc->n;
        memcpy(s->mtp_h, hn + (r1 - 1) * E, sizeof(float) * (size_t)E);
        memcpy(s->mtp_rows, hn + (r1 - keep) * E, sizeof(float) * (size_t)(keep * E));
        s->mtp_pos0 = pc->pos0 + pc->n - keep;
        s->mtp_n = keep;
    }
    cpu_arena_rewind(&ce->ar, mark);
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
        cpu_ffn_layer(ce, il, b, c.h, y);
        cpu_arena_rewind(&ce->ar, mark);
        pool_for(ce->pool, add_tasks, add_task, &ac);
    }
    if (ce->mtp) { /* every row's h after the final norm: the MTP block's input */
        fwd_ctx fc = c;
        fc.norm_w = m->output_norm.data;
        pool_for(ce->pool, n, norm_task, &fc);
        mtp_pass(ce, b, c.h);
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
    if (ce->mtp) { /* the rows, normed above, packed as the plain path packs them */
        for (int64_t i = 0; i < k; i++) memmove(c.h + i * E, c.h + (int64_t)rows[i] * E, sizeof(float) * (size_t)E);
    } else {
        fwd_ctx fc = c;
        fc.rows = rows;
        fc.norm_w = m->output_norm.data;
        pool_for(ce->pool, k, norm_task, &fc);
    }
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
    size_t ops = cpu_ffn_scratch(hp, R), g = cpu_gdn_scratch(hp, R, nth), a = cpu_attn_scratch(hp, R, n_ctx, nth);
    ops = ops > g ? ops : g;
    ops = ops > a ? ops : a;
    const size_t out = arena_round(sizeof(int32_t) * (size_t)R) + arena_round(sizeof(float *) * (size_t)R) +
                       cpu_act_scratch(R, E, 1) + cpu_jobs_scratch(1);
    return pass_arrays(R, n_seq) + 3 * arena_round(sizeof(float) * (size_t)(R * E)) + (ops > out ? ops : out);
}

/* the MTP block's pass (its inputs, x, and K and V's scratch: within the attention layer's
 * bound), or a draft step's rows and logits */
static size_t mtp_scratch(const model_hparams *hp, int64_t R, int64_t n_ctx, int nth) {
    const int64_t E = hp->n_embd;
    const size_t pass = 3 * arena_round(sizeof(float) * (size_t)(R * E)) + cpu_attn_scratch(hp, R, n_ctx, nth);
    const size_t draft = 6 * arena_round(sizeof(float) * (size_t)(2 * E)) + arena_round(sizeof(float) * (size_t)hp->n_vocab) +
                         8 * arena_round(64) + cpu_attn_scratch(hp, 1, n_ctx, nth) + cpu_ffn_scratch(hp, 1) +
                         cpu_act_scratch(1, E, 1) + cpu_jobs_scratch(1);
    return pass + draft;
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
    cpu_seq *s = &((cpu_engine *)eng)->seqs[seq];
    cpu_state_copy(s, &eng->m->hp, (engine_point *)p, false);
    /* the MTP block's h: the trunk's row at pos - 1 where the last pass kept it (a verify pass),
     * else zeros (mutant: left at the last pass's last row) */
    if (s->mtp_h && !MUTANT("mtp_h_last")) {
        const int64_t E = eng->m->hp.n_embd, q = p->pos - 1;
        if (q >= s->mtp_pos0 && q < s->mtp_pos0 + s->mtp_n) memcpy(s->mtp_h, s->mtp_rows + (q - s->mtp_pos0) * E, sizeof(float) * (size_t)E);
        else memset(s->mtp_h, 0, sizeof(float) * (size_t)E);
    }
}

static void cpu_kv_read(engine *eng, int seq, int64_t a, int64_t b, void *data) {
    cpu_engine *ce = (cpu_engine *)eng;
    cpu_state_kv(&ce->seqs[seq], &eng->m->hp, ce->kv_f16, a, b, data, true);
}

static void cpu_kv_write(engine *eng, int seq, int64_t a, int64_t b, const void *data) {
    cpu_engine *ce = (cpu_engine *)eng;
    cpu_state_kv(&ce->seqs[seq], &eng->m->hp, ce->kv_f16, a, b, (void *)data, false);
    ce->seqs[seq].mtp_n = 0; /* rows written from elsewhere: the kept h rows may not be theirs */
}

/* engine_mtp_draft: the whole MTP block a row at a time (the comment above mtp_ctx), greedy */
static void cpu_mtp_draft(engine *eng, int seq, int32_t token, int k, int32_t *out, float *out_logits) {
    cpu_engine *ce = (cpu_engine *)eng;
    const model *m = eng->m;
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab, p0 = eng->seqs[seq].pos;
    const int il = (int)hp->n_layer;
    const model_layer *L = &m->layers[il];
    cpu_seq *s = &ce->seqs[seq];
    cpu_arena_rewind(&ce->ar, 0);
    float *h = cpu_scratch(ce, sizeof(float) * (size_t)E), *cat = cpu_scratch(ce, sizeof(float) * (size_t)(2 * E));
    float *x = cpu_scratch(ce, sizeof(float) * (size_t)E), *hn = cpu_scratch(ce, sizeof(float) * (size_t)E);
    float *y = cpu_scratch(ce, sizeof(float) * (size_t)E), *logits = cpu_scratch(ce, sizeof(float) * (size_t)V);
    int32_t *ids = cpu_scratch(ce, sizeof(int32_t)), *row_piece = cpu_scratch(ce, sizeof(int32_t));
    int64_t *pos = cpu_scratch(ce, sizeof(int64_t)), *row_call = cpu_scratch(ce, sizeof(int64_t));
    cpu_seq **row_seq = cpu_scratch(ce, sizeof(cpu_seq *));
    float **logit_row = cpu_scratch(ce, sizeof(float *));
    cpu_piece *pc = cpu_scratch(ce, sizeof(cpu_piece));
    memcpy(h, s->mtp_h, sizeof(float) * (size_t)E);
    row_piece[0] = 0, row_call[0] = 0, row_seq[0] = s, logit_row[0] = NULL;
    const size_t base = cpu_arena_mark(&ce->ar);
    for (int i = 0; i < k; i++) {
        cpu_arena_rewind(&ce->ar, base);
        ids[0] = i ? out[i - 1] : token;
        pos[0] = p0 + i;
        *pc = (cpu_piece){.s = s, .r0 = 0, .n = 1, .pos0 = p0 + i};
        const cpu_batch b = {.n = 1, .ids = ids, .pieces = pc, .n_pieces = 1, .row_piece = row_piece, .pos = pos,
                             .row_seq = row_seq, .row_call = row_call, .logit_row = logit_row};
        mtp_input(m, ids[0], h, cat);
        cpu_matmul(ce, &m->mtp.eh_proj, cat, 1, x);
        cpu_rmsnorm(x, L->attn_norm.data, hn, E, hp->rms_eps);
        cpu_attn_layer(ce, il, &b, hn, y);
        for (int64_t j = 0; j < E; j++) x[j] += y[j];
        cpu_rmsnorm(x, L->post_norm.data, hn, E, hp->rms_eps);
        cpu_ffn_layer(ce, il, &b, hn, y);
        for (int64_t j = 0; j < E; j++) x[j] += y[j];
        cpu_rmsnorm(x, m->mtp.head_norm.data, h, E, hp->rms_eps);
        cpu_matmul(ce, &m->output, h, 1, logits);
        out[i] = sampler_argmax(logits, V);
        if (out_logits) memcpy(out_logits + (size_t)i * (size_t)V, logits, sizeof(float) * (size_t)V);
    }
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
    .mtp_draft = cpu_mtp_draft,
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
    ce->mtp = eng->opts.mtp;
    ce->rows_max = CPU_UBATCH + eng->opts.n_seq_max;
    if (cpu_state_new(&ce->seqs, hp, eng->opts.n_seq_max, eng->opts.n_ctx, ce->kv_f16, ce->mtp, e) < 0) {
        cpu_free(eng);
        return -1;
    }
    const size_t bound = scratch_bound(hp, ce->rows_max, eng->opts.n_ctx, ce->nth, eng->opts.n_seq_max) +
                         (ce->mtp ? mtp_scratch(hp, ce->rows_max, eng->opts.n_ctx, ce->nth) : 0);
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
