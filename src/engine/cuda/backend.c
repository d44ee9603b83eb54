/* backend.c: the CUDA backend of engine.h (host side, C; the kernels are kernels.cu).
 *
 * The model's tensors are copied to the GPU at open; every sequence's state (the GDN lanes
 * and rings, the attention layers' KV rows) lives there for the engine's life. A call's spans
 * are cut into passes as the CPU cuts them (pieces of CUDA_UBATCH rows from each span's start,
 * at most one piece of a span per pass), and a pass runs layer by layer over all its rows.
 * Every kernel computes a row from that row alone in a fixed order (kernels.h), so the bits of
 * one sequence do not depend on what shares its call. Marks: the delta rule runs row by row,
 * so the lane after row m is the state a prefill ending at m leaves, written out as the pass
 * goes by (into a staging area, copied to the points when the pass ends); the pass itself is
 * not changed by them. */
#include "engine/backend.h"
#include "engine/cuda/kernels.h"
#include "engine/cuda/cuda.h"
#include "format/quant.h"

#include <stdlib.h>
#include <string.h>

#define CUDA_CHUNK 64
#define CUDA_UBATCH 512

typedef struct cuda_layer {
    hk_w attn_norm, post_norm;
    hk_w attn_qkv, attn_gate, ssm_conv1d, ssm_dt, ssm_a, ssm_beta, ssm_alpha, ssm_norm, ssm_out;
    hk_w attn_q, attn_k, attn_v, attn_out, attn_q_norm, attn_k_norm;
    hk_w ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
    hk_w ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
    int gi, ai;             /* index among the GDN / attention layers */
} cuda_layer;

typedef struct cuda_engine {
    engine base;
    cuda_layer layers[MODEL_MAX_LAYERS];
    hk_w token_embd, output_norm, output;
    void *wmem[MODEL_MAX_LAYERS * 32 + 8];
    int n_wmem;
    int64_t n_gdn, n_attn, R;
    size_t lane_floats, ring_floats, kv_row;  /* kv_row: elements of one KV row */
    bool f16;
    float *lanes, *rings;   /* [seq][gdn layer][lane_floats | ring_floats] */
    void *kc[MODEL_MAX_LAYERS], *vc[MODEL_MAX_LAYERS]; /* per attention layer: [seq][n_ctx][kv_row] */
    /* pass scratch, R rows */
    float *x, *h, *y, *qkv, *cv, *z, *gb, *ga, *o, *qf, *k, *v, *ao, *scores, *rlog, *wsel, *g, *u, *sg, *su, *eo, *so;
    float *logits, *ring_tmp;
    int32_t *ids, *row_seq, *row_piece, *sel, *counts, *offs, *list, *lrows;
    int64_t *pos;
    hk_piece *pieces;
    hk_mark *marks;
    float *stage_lanes, *stage_rings;
    int64_t stage_cap;      /* points the staging area holds */
    float *h_logits;        /* host copy of a pass's logits rows */
    int64_t h_logits_cap;
    int32_t *h_sel;         /* host copy of a layer's choices (route trace) */
} cuda_engine;

static void cuda_free(engine *eng);

static int up(cuda_engine *ce, const qtensor *t, hk_w *w, bool want_f32, herr *e) {
    *w = (hk_w){0};
    if (!t->data) return 0; /* a tensor the layer kind does not have */
    if (want_f32 && t->type != QT_F32) return herr_set(e, "%s: the CUDA engine reads it as F32, the file has %s", t->name, qtype_name(t->type));
    if (!hk_type_ok(t->type)) return herr_set(e, "%s: type %s is not read by the CUDA engine", t->name, qtype_name(t->type));
    int64_t rows = 1;
    for (int d = 1; d < GGUF_MAX_DIMS; d++) rows *= t->ne[d] > 0 ? t->ne[d] : 1;
    const size_t bytes = t->row_bytes * (size_t)rows;
    void *d;
    if (hk_malloc(&d, bytes, e) < 0) return -1;
    ce->wmem[ce->n_wmem++] = d;
    if (hk_h2d(d, t->data, bytes, e) < 0) return -1;
    *w = (hk_w){.d = d, .type = t->type, .K = t->ne[0], .M = t->ne[1] > 0 ? t->ne[1] : 1, .row_bytes = t->row_bytes,
                .slice_bytes = t->row_bytes * (size_t)(t->ne[1] > 0 ? t->ne[1] : 1)};
    return 0;
}

static int upload(cuda_engine *ce, herr *e) {
    const model *m = ce->base.m;
    if (up(ce, &m->token_embd, &ce->token_embd, false, e) < 0 || up(ce, &m->output_norm, &ce->output_norm, true, e) < 0 ||
        up(ce, &m->output, &ce->output, false, e) < 0)
        return -1;
    int gi = 0, ai = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        cuda_layer *C = &ce->layers[il];
        const struct { const qtensor *t; hk_w *w; bool f32; } list[] = {
            {&L->attn_norm, &C->attn_norm, true}, {&L->post_norm, &C->post_norm, true},
            {&L->attn_qkv, &C->attn_qkv, false}, {&L->attn_gate, &C->attn_gate, false},
            {&L->ssm_conv1d, &C->ssm_conv1d, true}, {&L->ssm_dt, &C->ssm_dt, true}, {&L->ssm_a, &C->ssm_a, true},
            {&L->ssm_beta, &C->ssm_beta, false}, {&L->ssm_alpha, &C->ssm_alpha, false},
            {&L->ssm_norm, &C->ssm_norm, true}, {&L->ssm_out, &C->ssm_out, false},
            {&L->attn_q, &C->attn_q, false}, {&L->attn_k, &C->attn_k, false}, {&L->attn_v, &C->attn_v, false},
            {&L->attn_out, &C->attn_out, false}, {&L->attn_q_norm, &C->attn_q_norm, true},
            {&L->attn_k_norm, &C->attn_k_norm, true}, {&L->ffn_gate_inp, &C->ffn_gate_inp, false},
            {&L->ffn_gate_exps, &C->ffn_gate_exps, false}, {&L->ffn_up_exps, &C->ffn_up_exps, false},
            {&L->ffn_down_exps, &C->ffn_down_exps, false}, {&L->ffn_gate_inp_shexp, &C->ffn_gate_inp_shexp, true},
            {&L->ffn_gate_shexp, &C->ffn_gate_shexp, false}, {&L->ffn_up_shexp, &C->ffn_up_shexp, false},
            {&L->ffn_down_shexp, &C->ffn_down_shexp, false},
        };
        for (size_t k = 0; k < sizeof list / sizeof list[0]; k++)
            if (up(ce, list[k].t, list[k].w, list[k].f32, e) < 0) return -1;
        C->gi = L->recurrent ? gi++ : -1;
        C->ai = L->recurrent ? -1 : ai++;
    }
    return 0;
}

#define F(p) ((const float *)(p).d)

/* the pass scratch and the sequences' state; -1 naming the flags to lower when it does not fit */
static int alloc_state(cuda_engine *ce, herr *e) {
    const engine *eng = &ce->base;
    const model_hparams *hp = &eng->m->hp;
    const int64_t R = ce->R, E = hp->n_embd, cd = hp_conv_dim(hp), Vd = hp_value_dim(hp), Gv = hp->ssm_dt_rank;
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, X = hp->n_expert, K = hp->n_expert_used;
    const int64_t F = hp->n_ff_exp, Fs = hp->n_ff_shexp, V = hp->n_vocab, n_ctx = eng->opts.n_ctx, ns = eng->opts.n_seq_max;
    const size_t f = sizeof(float);
    struct { void **p; size_t bytes; } bufs[] = {
        {(void **)&ce->lanes, f * ce->lane_floats * (size_t)(ns * ce->n_gdn)},
        {(void **)&ce->rings, f * ce->ring_floats * (size_t)(ns * ce->n_gdn)},
        {(void **)&ce->x, f * (size_t)(R * E)}, {(void **)&ce->h, f * (size_t)(R * E)}, {(void **)&ce->y, f * (size_t)(R * E)},
        {(void **)&ce->qkv, f * (size_t)(R * cd)}, {(void **)&ce->cv, f * (size_t)(R * cd)},
        {(void **)&ce->z, f * (size_t)(R * Vd)}, {(void **)&ce->o, f * (size_t)(R * Vd)},
        {(void **)&ce->gb, f * (size_t)(R * Gv)}, {(void **)&ce->ga, f * (size_t)(R * Gv)},
        {(void **)&ce->qf, f * (size_t)(R * 2 * H * D)}, {(void **)&ce->k, f * (size_t)(R * Hkv * D)},
        {(void **)&ce->v, f * (size_t)(R * Hkv * D)}, {(void **)&ce->ao, f * (size_t)(R * H * D)},
        {(void **)&ce->scores, f * (size_t)(R * H) * (size_t)n_ctx},
        {(void **)&ce->rlog, f * (size_t)(R * X)}, {(void **)&ce->wsel, f * (size_t)(R * K)},
        {(void **)&ce->g, f * (size_t)(R * K * F)}, {(void **)&ce->u, f * (size_t)(R * K * F)},
        {(void **)&ce->sg, f * (size_t)(R * Fs)}, {(void **)&ce->su, f * (size_t)(R * Fs)},
        {(void **)&ce->eo, f * (size_t)(R * K * E)}, {(void **)&ce->so, f * (size_t)(R * E)},
        {(void **)&ce->logits, f * (size_t)R * (size_t)V}, {(void **)&ce->ring_tmp, f * ce->ring_floats * (size_t)ns},
        {(void **)&ce->ids, 4 * (size_t)R}, {(void **)&ce->row_seq, 4 * (size_t)R}, {(void **)&ce->row_piece, 4 * (size_t)R},
        {(void **)&ce->sel, 4 * (size_t)(R * K)}, {(void **)&ce->counts, 4 * (size_t)(X + 1)},
        {(void **)&ce->offs, 4 * (size_t)(2 * X + 2)}, {(void **)&ce->list, 4 * (size_t)(R * K)},
        {(void **)&ce->lrows, 4 * (size_t)R}, {(void **)&ce->pos, 8 * (size_t)R},
        {(void **)&ce->pieces, sizeof(hk_piece) * (size_t)ns}, {(void **)&ce->marks, sizeof(hk_mark) * (size_t)R},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (hk_malloc(bufs[i].p, bufs[i].bytes, e) < 0)
            return herr_wrap(e, "--device cuda: the GPU has no room for %d sequences of %lld tokens (lower -c or -np)",
                             (int)ns, (long long)n_ctx);
    const size_t kv_bytes = (ce->f16 ? 2 : 4) * ce->kv_row * (size_t)n_ctx * (size_t)ns;
    for (int il = 0; il < hp->n_layer; il++) {
        const int ai = ce->layers[il].ai;
        if (ai < 0) continue;
        if (hk_malloc(&ce->kc[ai], kv_bytes, e) < 0 || hk_malloc(&ce->vc[ai], kv_bytes, e) < 0)
            return herr_wrap(e, "--device cuda: the GPU has no room for the KV rows of %d sequences of %lld tokens "
                             "(lower -c or -np)", (int)ns, (long long)n_ctx);
    }
    if (hk_memset(ce->lanes, 0, f * ce->lane_floats * (size_t)(ns * ce->n_gdn), e) < 0 ||
        hk_memset(ce->rings, 0, f * ce->ring_floats * (size_t)(ns * ce->n_gdn), e) < 0)
        return -1;
    return 0;
}

static int stage_reserve(cuda_engine *ce, int64_t n_points, herr *e) {
    if (n_points <= ce->stage_cap) return 0;
    hk_free(ce->stage_lanes);
    hk_free(ce->stage_rings);
    ce->stage_lanes = ce->stage_rings = NULL;
    ce->stage_cap = 0;
    const size_t per = (size_t)ce->n_gdn * sizeof(float);
    if (hk_malloc((void **)&ce->stage_lanes, per * ce->lane_floats * (size_t)n_points, e) < 0 ||
        hk_malloc((void **)&ce->stage_rings, per * ce->ring_floats * (size_t)n_points, e) < 0)
        return herr_wrap(e, "no room on the GPU for the %lld points of one pass", (long long)n_points);
    ce->stage_cap = n_points;
    return 0;
}

/* one pass's rows, as cuda_run laid them out (host copies of what went to the device) */
typedef struct pass {
    int64_t n, n_logits;
    int n_pieces, n_marks;
    const int64_t *row_call;
    float *const *logit_row;
    engine_point *const *mark_point;
} pass;

#define TRY(x) \
    do {       \
        if ((x) < 0) return -1; \
    } while (0)

static int gdn_layer(cuda_engine *ce, const cuda_layer *C, const pass *p, herr *e) {
    const model_hparams *hp = &ce->base.m->hp;
    const int64_t n = p->n, E = hp->n_embd, cd = hp_conv_dim(hp), Vd = hp_value_dim(hp), Gv = hp->ssm_dt_rank;
    const int64_t S = hp->ssm_d_state, Gk = hp->ssm_n_group, dc = hp->ssm_d_conv;
    const size_t lstride = ce->lane_floats * (size_t)ce->n_gdn, rstride = ce->ring_floats * (size_t)ce->n_gdn;
    float *lane0 = ce->lanes + (size_t)C->gi * ce->lane_floats, *ring0 = ce->rings + (size_t)C->gi * ce->ring_floats;
    float *sl = ce->stage_lanes ? ce->stage_lanes + (size_t)C->gi * ce->lane_floats : NULL;
    float *sr = ce->stage_rings ? ce->stage_rings + (size_t)C->gi * ce->ring_floats : NULL;
    TRY(hk_matmul(&C->attn_qkv, ce->h, E, n, ce->qkv, cd, e));
    TRY(hk_matmul(&C->attn_gate, ce->h, E, n, ce->z, Vd, e));
    TRY(hk_matmul(&C->ssm_beta, ce->h, E, n, ce->gb, Gv, e));
    TRY(hk_matmul(&C->ssm_alpha, ce->h, E, n, ce->ga, Gv, e));
    TRY(hk_gdn_conv(ce->qkv, ring0, rstride, F(C->ssm_conv1d), ce->row_piece, ce->pieces, n, cd, dc, ce->cv, e));
    TRY(hk_gdn_ring(ce->qkv, ring0, rstride, ce->pieces, p->n_pieces, ce->marks, p->n_marks, sr, rstride, cd, dc,
                    ce->ring_tmp, e));
    TRY(hk_gdn_norm_gate(ce->cv, ce->gb, ce->ga, F(C->ssm_a), F(C->ssm_dt), n, S, Gk, Gv, cd, hp->rms_eps, e));
    TRY(hk_gdn_delta(ce->cv, ce->gb, ce->ga, lane0, lstride, ce->pieces, p->n_pieces, ce->marks, sl, lstride, S, Gk, Gv,
                     cd, ce->o, e));
    TRY(hk_gdn_gated_norm(ce->o, ce->z, F(C->ssm_norm), n, S, Gv, hp->rms_eps, e));
    return hk_matmul(&C->ssm_out, ce->o, Vd, n, ce->y, E, e);
}

static int attn_layer(cuda_engine *ce, const cuda_layer *C, const pass *p, herr *e) {
    const model_hparams *hp = &ce->base.m->hp;
    const int64_t n = p->n, E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const int64_t n_ctx = ce->base.opts.n_ctx;
    const size_t sstride = ce->kv_row * (size_t)n_ctx;
    TRY(hk_matmul(&C->attn_q, ce->h, E, n, ce->qf, 2 * H * D, e));
    TRY(hk_matmul(&C->attn_k, ce->h, E, n, ce->k, Hkv * D, e));
    TRY(hk_matmul(&C->attn_v, ce->h, E, n, ce->v, Hkv * D, e));
    TRY(hk_attn_prep(ce->qf, ce->k, ce->v, F(C->attn_q_norm), F(C->attn_k_norm), ce->row_seq, ce->pos, n, H, Hkv, D,
                     hp->rope_dims, hp->rope_theta, hp->rms_eps, ce->kc[C->ai], ce->vc[C->ai], sstride, ce->f16, e));
    TRY(hk_attn(ce->qf, ce->row_seq, ce->pos, n, H, Hkv, D, ce->kc[C->ai], ce->vc[C->ai], sstride, ce->f16, ce->scores,
                n_ctx, ce->ao, e));
    return hk_matmul(&C->attn_out, ce->ao, H * D, n, ce->y, E, e);
}

static int moe_layer(cuda_engine *ce, int il, const cuda_layer *C, const pass *p, herr *e) {
    engine *eng = &ce->base;
    const model_hparams *hp = &eng->m->hp;
    const int64_t n = p->n, E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp, Fs = hp->n_ff_shexp;
    TRY(hk_matmul(&C->ffn_gate_inp, ce->h, E, n, ce->rlog, X, e));
    TRY(hk_moe_route(ce->rlog, n, (int)X, (int)K, ce->sel, ce->wsel, e));
    if (eng->route_trace) { /* tests compare the experts chosen: (row of the call, layer, K) */
        TRY(hk_d2h(ce->h_sel, ce->sel, sizeof(int32_t) * (size_t)(n * K), e));
        for (int64_t r = 0; r < n; r++)
            memcpy(eng->route_trace + (size_t)(p->row_call[r] * hp->n_layer + il) * (size_t)K, ce->h_sel + r * K,
                   sizeof(int32_t) * (size_t)K);
    }
    TRY(hk_moe_sort(ce->sel, n * K, (int)X, ce->counts, ce->offs, ce->list, e));
    TRY(hk_moe_matmul(&C->ffn_gate_exps, (int)X, n * K, ce->offs, ce->list, (int)K, ce->h, E, ce->g, F, e));
    TRY(hk_moe_matmul(&C->ffn_up_exps, (int)X, n * K, ce->offs, ce->list, (int)K, ce->h, E, ce->u, F, e));
    TRY(hk_matmul(&C->ffn_gate_shexp, ce->h, E, n, ce->sg, Fs, e));
    TRY(hk_matmul(&C->ffn_up_shexp, ce->h, E, n, ce->su, Fs, e));
    TRY(hk_swiglu(ce->g, ce->u, n * K * F, e));
    TRY(hk_swiglu(ce->sg, ce->su, n * Fs, e));
    TRY(hk_moe_matmul(&C->ffn_down_exps, (int)X, n * K, ce->offs, ce->list, 1, ce->g, F, ce->eo, E, e));
    TRY(hk_matmul(&C->ffn_down_shexp, ce->sg, Fs, n, ce->so, E, e));
    return hk_moe_combine(ce->h, F(C->ffn_gate_inp_shexp), ce->eo, ce->so, ce->wsel, ce->y, n, E, (int)K, e);
}

static int forward(cuda_engine *ce, const pass *p, herr *e) {
    const model *m = ce->base.m;
    const model_hparams *hp = &m->hp;
    const int64_t n = p->n, E = hp->n_embd, V = hp->n_vocab;
    TRY(hk_embed(&ce->token_embd, ce->ids, n, ce->x, e));
    for (int il = 0; il < hp->n_layer; il++) {
        const cuda_layer *C = &ce->layers[il];
        TRY(hk_rmsnorm(ce->x, NULL, F(C->attn_norm), ce->h, n, E, hp->rms_eps, e));
        TRY(C->gi >= 0 ? gdn_layer(ce, C, p, e) : attn_layer(ce, C, p, e));
        TRY(hk_add(ce->x, ce->y, n * E, e));
        TRY(hk_rmsnorm(ce->x, NULL, F(C->post_norm), ce->h, n, E, hp->rms_eps, e));
        TRY(moe_layer(ce, il, C, p, e));
        TRY(hk_add(ce->x, ce->y, n * E, e));
    }
    if (p->n_logits) {
        TRY(hk_rmsnorm(ce->x, ce->lrows, F(ce->output_norm), ce->h, p->n_logits, E, hp->rms_eps, e));
        TRY(hk_matmul(&ce->output, ce->h, E, p->n_logits, ce->logits, V, e));
        if (p->n_logits > ce->h_logits_cap) {
            free(ce->h_logits);
            ce->h_logits = malloc(sizeof(float) * (size_t)V * (size_t)p->n_logits);
            ce->h_logits_cap = ce->h_logits ? p->n_logits : 0;
            if (!ce->h_logits) return herr_set(e, "cannot allocate the host copy of %lld logits rows", (long long)p->n_logits);
        }
        TRY(hk_d2h(ce->h_logits, ce->logits, sizeof(float) * (size_t)V * (size_t)p->n_logits, e));
        int64_t k = 0;
        for (int64_t r = 0; r < n; r++)
            if (p->logit_row[r]) memcpy(p->logit_row[r], ce->h_logits + (size_t)(k++) * (size_t)V, sizeof(float) * (size_t)V);
    }
    /* the points of the pass, from the staging area */
    for (int i = 0; i < p->n_marks; i++) {
        engine_point *pt = p->mark_point[i];
        TRY(hk_d2h(pt->lanes, ce->stage_lanes + (size_t)i * ce->lane_floats * (size_t)ce->n_gdn,
                   sizeof(float) * ce->lane_floats * (size_t)ce->n_gdn, e));
        TRY(hk_d2h(pt->rings, ce->stage_rings + (size_t)i * ce->ring_floats * (size_t)ce->n_gdn,
                   sizeof(float) * ce->ring_floats * (size_t)ce->n_gdn, e));
    }
    return hk_sync(e);
}

static int cuda_run(engine *eng, const engine_span *spans, int n_spans, herr *e) {
    cuda_engine *ce = (cuda_engine *)eng;
    const int64_t V = eng->m->hp.n_vocab, R = ce->R;
    const int ns = eng->opts.n_seq_max;
    int64_t *done = xcalloc((size_t)n_spans, sizeof *done), *call0 = xcalloc((size_t)n_spans, sizeof *call0);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)R), *row_seq = xmalloc(sizeof(int32_t) * (size_t)R);
    int32_t *row_piece = xmalloc(sizeof(int32_t) * (size_t)R), *lrows = xmalloc(sizeof(int32_t) * (size_t)R);
    int64_t *pos = xmalloc(sizeof(int64_t) * (size_t)R), *row_call = xmalloc(sizeof(int64_t) * (size_t)R);
    float **logit_row = xmalloc(sizeof(float *) * (size_t)R);
    hk_piece *pieces = xmalloc(sizeof(hk_piece) * (size_t)ns);
    hk_mark *marks = xmalloc(sizeof(hk_mark) * (size_t)R);
    engine_point **mark_point = xmalloc(sizeof(engine_point *) * (size_t)R);
    int rc = 0;
    for (int i = 0; i < n_spans; i++) call0[i] = i ? call0[i - 1] + spans[i - 1].n : 0;
    for (;;) {
        int64_t n = 0, n_logits = 0;
        int np = 0, nm = 0;
        for (int i = 0; i < n_spans; i++) {
            const engine_span *sp = &spans[i];
            if (done[i] == sp->n) continue;
            /* the delta rule runs row by row here, so no bit depends on the grid; the pieces
             * still end where the CPU's do */
            const int64_t len = engine_piece_end(sp->anchors, sp->n_anchors, sp->n, done[i], CUDA_UBATCH, CUDA_CHUNK) - done[i];
            if (n + len > R) continue; /* the next pass takes it */
            hk_piece *pc = &pieces[np];
            *pc = (hk_piece){.r0 = n, .n = len, .seq = sp->seq, .mark0 = nm};
            for (int k = 0; k < sp->n_marks; k++)
                if (sp->marks[k] > done[i] && sp->marks[k] <= done[i] + len) {
                    marks[nm] = (hk_mark){.m = sp->marks[k] - done[i], .slot = nm, .piece = np};
                    mark_point[nm++] = sp->points[k];
                    pc->n_marks++;
                }
            const int64_t pos0 = eng->seqs[sp->seq].pos + done[i];
            for (int64_t k = 0; k < len; k++) {
                const int64_t at = done[i] + k, r = n + k;
                ids[r] = sp->ids[at];
                row_piece[r] = np;
                row_seq[r] = sp->seq;
                pos[r] = pos0 + k;
                row_call[r] = call0[i] + at;
                logit_row[r] = sp->want == ENGINE_LOGITS_ALL                       ? sp->logits + at * V
                               : sp->want == ENGINE_LOGITS_LAST && at == sp->n - 1 ? sp->logits
                                                                                   : NULL;
                if (logit_row[r]) lrows[n_logits++] = (int32_t)r;
            }
            done[i] += len;
            n += len;
            np++;
        }
        if (n == 0) break;
        if (stage_reserve(ce, nm, e) < 0 || hk_h2d(ce->ids, ids, sizeof(int32_t) * (size_t)n, e) < 0 ||
            hk_h2d(ce->row_seq, row_seq, sizeof(int32_t) * (size_t)n, e) < 0 ||
            hk_h2d(ce->row_piece, row_piece, sizeof(int32_t) * (size_t)n, e) < 0 ||
            hk_h2d(ce->pos, pos, sizeof(int64_t) * (size_t)n, e) < 0 ||
            hk_h2d(ce->lrows, lrows, sizeof(int32_t) * (size_t)n_logits, e) < 0 ||
            hk_h2d(ce->pieces, pieces, sizeof(hk_piece) * (size_t)np, e) < 0 ||
            hk_h2d(ce->marks, marks, sizeof(hk_mark) * (size_t)nm, e) < 0) {
            rc = -1;
            break;
        }
        pass p = {.n = n, .n_logits = n_logits, .n_pieces = np, .n_marks = nm, .row_call = row_call,
                  .logit_row = logit_row, .mark_point = mark_point};
        if (forward(ce, &p, e) < 0) {
            rc = -1;
            break;
        }
        eng->stats.n_passes++;
        eng->stats.n_rows += n;
        eng->stats.n_points += nm;
    }
    free(done), free(call0), free(ids), free(row_seq), free(row_piece), free(lrows), free(pos), free(row_call);
    free(logit_row), free(pieces), free(marks), free(mark_point);
    return rc;
}

/* the backend table's copies return nothing: a failed copy (a GPU fault) leaves the sticky
 * error for the next run to report */
static void cuda_seq_clear(engine *eng, int seq) {
    cuda_engine *ce = (cuda_engine *)eng;
    herr e;
    hk_memset(ce->lanes + (size_t)seq * ce->lane_floats * (size_t)ce->n_gdn, 0,
              sizeof(float) * ce->lane_floats * (size_t)ce->n_gdn, &e);
    hk_memset(ce->rings + (size_t)seq * ce->ring_floats * (size_t)ce->n_gdn, 0,
              sizeof(float) * ce->ring_floats * (size_t)ce->n_gdn, &e);
}

static void cuda_save(engine *eng, int seq, engine_point *p) {
    cuda_engine *ce = (cuda_engine *)eng;
    herr e;
    hk_d2h(p->lanes, ce->lanes + (size_t)seq * ce->lane_floats * (size_t)ce->n_gdn, sizeof(float) * ce->lane_floats * (size_t)ce->n_gdn, &e);
    hk_d2h(p->rings, ce->rings + (size_t)seq * ce->ring_floats * (size_t)ce->n_gdn, sizeof(float) * ce->ring_floats * (size_t)ce->n_gdn, &e);
}

static void cuda_restore(engine *eng, int seq, const engine_point *p) {
    cuda_engine *ce = (cuda_engine *)eng;
    herr e;
    hk_h2d(ce->lanes + (size_t)seq * ce->lane_floats * (size_t)ce->n_gdn, p->lanes, sizeof(float) * ce->lane_floats * (size_t)ce->n_gdn, &e);
    hk_h2d(ce->rings + (size_t)seq * ce->ring_floats * (size_t)ce->n_gdn, p->rings, sizeof(float) * ce->ring_floats * (size_t)ce->n_gdn, &e);
}

/* KV rows [a, b): every attention layer's K rows then V rows, packed (the CPU's layout) */
static void kv_copy(cuda_engine *ce, int seq, int64_t a, int64_t b, uint8_t *data, bool to_data) {
    const size_t esz = ce->f16 ? 2 : 4, row = esz * ce->kv_row, len = row * (size_t)(b - a);
    const size_t at = row * ((size_t)seq * (size_t)ce->base.opts.n_ctx + (size_t)a);
    herr e;
    for (int64_t ai = 0; ai < ce->n_attn; ai++) {
        uint8_t *k = (uint8_t *)ce->kc[ai] + at, *v = (uint8_t *)ce->vc[ai] + at;
        if (to_data) {
            hk_d2h(data, k, len, &e);
            hk_d2h(data + len, v, len, &e);
        } else {
            hk_h2d(k, data, len, &e);
            hk_h2d(v, data + len, len, &e);
        }
        data += 2 * len;
    }
}

static void cuda_kv_read(engine *eng, int seq, int64_t a, int64_t b, void *data) {
    kv_copy((cuda_engine *)eng, seq, a, b, data, true);
}

static void cuda_kv_write(engine *eng, int seq, int64_t a, int64_t b, const void *data) {
    kv_copy((cuda_engine *)eng, seq, a, b, (uint8_t *)data, false);
}

static void cuda_free(engine *eng) {
    cuda_engine *ce = (cuda_engine *)eng;
    for (int i = 0; i < ce->n_wmem; i++) hk_free(ce->wmem[i]);
    void *bufs[] = {ce->lanes, ce->rings, ce->x, ce->h, ce->y, ce->qkv, ce->cv, ce->z, ce->o, ce->gb, ce->ga, ce->qf,
                    ce->k, ce->v, ce->ao, ce->scores, ce->rlog, ce->wsel, ce->g, ce->u, ce->sg, ce->su, ce->eo, ce->so,
                    ce->logits, ce->ring_tmp, ce->ids, ce->row_seq, ce->row_piece, ce->sel, ce->counts, ce->offs,
                    ce->list, ce->lrows, ce->pos, ce->pieces, ce->marks, ce->stage_lanes, ce->stage_rings};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) hk_free(bufs[i]);
    for (int i = 0; i < MODEL_MAX_LAYERS; i++) {
        hk_free(ce->kc[i]);
        hk_free(ce->vc[i]);
    }
    free(ce->h_logits);
    free(ce->h_sel);
    engine_fini(eng);
    free(ce);
}

static const engine_backend cuda_backend = {
    .name = "cuda",
    .free = cuda_free,
    .run = cuda_run,
    .seq_clear = cuda_seq_clear,
    .save = cuda_save,
    .restore = cuda_restore,
    .kv_read = cuda_kv_read,
    .kv_write = cuda_kv_write,
};

int engine_open_cuda(engine **out, const model *m, const engine_opts *o, herr *e) {
    if (hcuda_device_count(e) <= 0) return herr_wrap(e, "--device cuda");
    const model_hparams *hp = &m->hp;
    if (hp->ssm_d_state != 128)
        return herr_set(e, "--device cuda: the CUDA engine takes ssm_d_state 128, this model has %lld", (long long)hp->ssm_d_state);
    cuda_engine *ce = xcalloc(1, sizeof *ce);
    engine *eng = &ce->base;
    if (engine_init(eng, &cuda_backend, m, o, e) < 0) {
        cuda_free(eng);
        return -1;
    }
    ce->f16 = eng->opts.kv_f16;
    ce->R = CUDA_UBATCH + eng->opts.n_seq_max;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->is_recurrent[il]) ce->n_gdn++;
        else ce->n_attn++;
    }
    ce->lane_floats = (size_t)(hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state);
    ce->ring_floats = (size_t)((hp->ssm_d_conv - 1) * hp_conv_dim(hp));
    ce->kv_row = (size_t)(hp->n_head_kv * hp->head_dim);
    ce->h_sel = xmalloc(sizeof(int32_t) * (size_t)(ce->R * hp->n_expert_used));
    if (upload(ce, e) < 0) {
        herr_wrap(e, "--device cuda: loading the weights (a smaller file, or --device cpu)");
        cuda_free(eng);
        return -1;
    }
    if (alloc_state(ce, e) < 0) {
        cuda_free(eng);
        return -1;
    }
    eng->info.backend = "cuda";
    eng->info.chunk = CUDA_CHUNK;
    eng->info.rows_per_pass = CUDA_UBATCH;
    eng->info.act_f32 = true;
    *out = eng;
    return 0;
}
