/* engine.c: the backend-neutral half of the engine interface: argument checks that any
 * caller can trip (they return errors, never abort) and dispatch to the backend. */
#include "engine/engine.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int64_t n_gdn_layers(const model_hparams *hp) {
    int64_t n = 0;
    for (int64_t il = 0; il < hp->n_layer; il++) n += hp->is_recurrent[il];
    return n;
}

void point_alloc(point *p, const model_hparams *hp) {
    memset(p, 0, sizeof *p);
    p->n_gdn = n_gdn_layers(hp);
    p->lane_floats = (size_t)(hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state);
    p->ring_floats = (size_t)((hp->ssm_d_conv - 1) * hp_conv_dim(hp));
    p->lanes = xcalloc((size_t)p->n_gdn * p->lane_floats, sizeof(float));
    p->rings = xcalloc((size_t)p->n_gdn * p->ring_floats, sizeof(float));
    p->pos = -1;
}

size_t point_bytes(const point *p) {
    return (size_t)p->n_gdn * (p->lane_floats + p->ring_floats) * sizeof(float) + sizeof *p;
}

void point_free(point *p) {
    free(p->lanes);
    free(p->rings);
    memset(p, 0, sizeof *p);
}

void engine_free(engine *eng) {
    if (eng) eng->be->free(eng);
}

seq *engine_seq_new(engine *eng, herr *e) { return eng->be->seq_new(eng, e); }
void engine_seq_free(engine *eng, seq *s) { if (s) eng->be->seq_free(eng, s); }
int64_t engine_seq_pos(engine *eng, const seq *s) { return eng->be->seq_pos(s); }
void engine_snapshot(engine *eng, const seq *s, point *p) { eng->be->snapshot(eng, s, p); }

static int check_ids(const engine *eng, const int32_t *ids, int64_t n, herr *e) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= eng->m->hp.n_vocab)
            return herr_set(e, "token id %" PRId32 " at index %" PRId64 " is outside the vocabulary [0, %" PRId64 ")",
                            ids[i], i, eng->m->hp.n_vocab);
    return 0;
}

int engine_prefill(engine *eng, seq *s, const int32_t *ids, int64_t n, const int64_t *marks, int n_marks,
                   point *points, float *logits, bool all_logits, herr *e) {
    if (n <= 0) return herr_set(e, "empty prompt");
    if (check_ids(eng, ids, n, e) < 0) return -1;
    int64_t pos = eng->be->seq_pos(s);
    if (pos + n > eng->opts.n_ctx)
        return herr_set(e, "prompt of %" PRId64 " tokens at position %" PRId64 " exceeds the context of %" PRId64
                        " tokens", n, pos, eng->opts.n_ctx);
    for (int i = 0; i < n_marks; i++) {
        if (marks[i] < 1 || marks[i] > n)
            return herr_set(e, "mark %" PRId64 " is outside (0, %" PRId64 "]", marks[i], n);
        if (i && marks[i] <= marks[i - 1]) return herr_set(e, "marks must be strictly ascending");
    }
    return eng->be->prefill(eng, s, ids, n, marks, n_marks, points, logits, all_logits, e);
}

int engine_step(engine *eng, seq **seqs, const int32_t *ids, int n_seqs, float *logits, herr *e) {
    if (n_seqs <= 0) return herr_set(e, "no sequences to step");
    if (check_ids(eng, ids, n_seqs, e) < 0) return -1;
    for (int i = 0; i < n_seqs; i++)
        if (eng->be->seq_pos(seqs[i]) + 1 > eng->opts.n_ctx)
            return herr_set(e, "sequence %d is full: the context holds %" PRId64 " tokens", i, eng->opts.n_ctx);
    return eng->be->step(eng, seqs, ids, n_seqs, logits, e);
}

int engine_restore(engine *eng, seq *s, const point *p, herr *e) {
    if (p->pos < 0 || p->pos > eng->opts.n_ctx) return herr_set(e, "point position %" PRId64 " is invalid", p->pos);
    if (p->pos > eng->be->seq_pos(s))
        return herr_set(e, "point at %" PRId64 " is past the sequence's %" PRId64 " rows: its KV rows are missing",
                        p->pos, eng->be->seq_pos(s));
    return eng->be->restore(eng, s, p, e);
}

int engine_truncate(engine *eng, seq *s, int64_t pos, herr *e) {
    return eng->be->truncate(eng, s, pos, e);
}
