/* backend.c: the CUDA backend of engine.h (host side, C; the kernels are in the .cu files
 * behind kernels.h).
 *
 * The model's tensors are copied to the GPU at open (Q6_K and Q8_0 repacked, kernels.h);
 * every sequence's state (the GDN lanes and rings, the attention layers' KV rows) lives there
 * for the engine's life. A call's spans are cut into passes where the CPU cuts them
 * (engine_piece_end: at most CUDA_UBATCH rows of a span per pass, on its chunk grid; fewer where
 * a span wants more logits rows than a pass returns), and a
 * pass runs layer by layer over all its rows on one stream, with no host sync until its
 * logits and points are copied out. Matrix inputs are rounded to 8-bit blocks as the CPU
 * rounds them; every kernel computes a row from that row alone in a fixed order (kernels.h),
 * so the bits of one sequence do not depend on what shares its call.
 *
 * Graphs: a pass's launches depend only on its shape (rows, pieces, marks, logits rows,
 * attention tiles); its data (ids, positions, pieces) travel in one copy before it. The
 * second time a shape is seen its launches are captured into a CUDA graph, replayed after
 * that (decode steps repeat one shape), which removes most of a step's launch cost. */
#include "engine/backend.h"
#include "engine/cuda/kernels.h"
#include "engine/cuda/cuda.h"
#include "engine/mutant.h"
#include "format/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_CHUNK 64
#define CUDA_UBATCH 2048  /* rows of a span per pass: each pass reads every expert's weights once */
#define LOGITS_CAP 512    /* logits rows a pass returns (a span wanting all of them takes more passes) */
#define GEMV_ROWS 8   /* rows up to which the experts run pair by pair (no sort) */
/* tickets (tail.cuh): the combine's one per slice of at least 1 output row and one; the
 * delta rule's launch takes the gated norm's from 0 and the conv's from TICKETS_CONV */
#define TICKETS_CONV 512
#define TICKETS(E) ((size_t)(E) + 2 > 2 * TICKETS_CONV ? (size_t)(E) + 2 : 2 * TICKETS_CONV)
#define N_GRAPHS 8

typedef struct cuda_layer {
    hk_w attn_norm, post_norm;
    hk_w attn_qkv, attn_gate, ssm_conv1d, ssm_dt, ssm_a, ssm_beta, ssm_alpha, ssm_norm, ssm_out;
    hk_w attn_q, attn_k, attn_v, attn_out, attn_q_norm, attn_k_norm;
    hk_w ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
    hk_w ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
    hk_w ffn_gate, ffn_up, ffn_down; /* qwen35's dense MLP: gate, up (E, n_ff), down (n_ff, E); the MoE's absent */
    hk_w router;            /* ffn_gate_inp with the shared expert's gate (ffn_gate_inp_shexp) as row X,
                             * when both are F32: one product gives the routing logits and that gate */
    int gi, ai;             /* index among the GDN / attention layers */
    bool sh_fused;          /* the shared expert runs as one more pair of the routed products */
} cuda_layer;

/* a pass's inputs, laid out identically in pinned host memory and on the device */
typedef struct pass_io {
    size_t ids, row_seq, row_piece, lrows, pos, pieces, marks, tiles, chunks, pchunk, bytes;
} pass_io;

typedef struct graph_entry {
    int64_t n, n_logits, n_argmax, use;
    int n_pieces, n_marks, n_tiles, n_one;
    void *exec;
} graph_entry;

/* HEARTH_CUDA_PROFILE=1: an event after every op of a pass (graphs off), the time between
 * events summed per op name over the engine's life and printed to stderr when it closes */
#define PROF_EVENTS 2048
#define PROF_OPS 48
typedef struct prof {
    void *ev[PROF_EVENTS];
    const char *at[PROF_EVENTS];  /* the op that ended at event i */
    int n;
    const char *name[PROF_OPS];
    double ms[PROF_OPS];
    int64_t calls[PROF_OPS], passes;
} prof;

typedef struct cuda_engine {
    engine base;
    prof *prof;
    void *st;               /* the stream every launch queues on */
    cuda_layer layers[MODEL_MAX_LAYERS];
    hk_w token_embd, output_norm, output;
    void *wmem[MODEL_MAX_LAYERS * 64 + 16];
    int n_wmem;
    int64_t n_gdn, n_attn, R, seg, n_seg;
    size_t lane_floats, ring_floats, kv_row;  /* kv_row: elements of one KV row */
    bool f16;
    float *lanes, *rings;   /* [seq][gdn layer][lane_floats | ring_floats] */
    void *kc[MODEL_MAX_LAYERS], *vc[MODEL_MAX_LAYERS]; /* per attention layer: [seq][n_ctx][kv_row] */
    /* pass scratch, R rows */
    float *x, *h, *qkv, *cv, *z, *gb, *ga, *o, *qf, *k, *v, *ao, *part, *rlog, *sgl, *wsel, *g, *u, *sg, *su, *eo, *so;
    /* sg, su (R, Fs): the gate and up rows of the MLP run apart, the shared expert's (Fs = n_ff_shexp)
     * or the dense MLP's (Fs = n_ff); the MoE's (rlog .. u, eo, so; sel .. mtiles) NULL where dense */
    float *logits;
    hk_act ax8k, ax80;      /* the layer input's rows (n_embd) rounded */
    hk_act ao8k, ao80;      /* the mixer's output rows (GDN value dim or H*D) rounded */
    hk_act af8k, af80;      /* the experts' SwiGLU rows (n_ff_exp), one per pair */
    hk_act as8k, as80;      /* the SwiGLU rows of the MLP run apart (sg): the shared expert's, or the dense MLP's */
    int32_t *sel, *offs, *list, *mtiles;
    pass_io io;
    uint8_t *h_io, *d_io;   /* the pass's inputs: pinned host, device */
    float *stage_lanes, *stage_rings;
    int64_t stage_cap;      /* points the staging area holds */
    float *h_logits;        /* pinned host copy of a pass's logits rows */
    int32_t *d_tok, *h_tok; /* an ARGMAX span's greedy token (LOGITS_CAP), device and pinned host */
    void *am_scratch;
    int32_t *h_sel;         /* host copy of a layer's choices (route trace) */
    graph_entry graphs[N_GRAPHS];
    int64_t graph_clock;
    const char *no_graphs;  /* HEARTH_CUDA_GRAPHS=0 turns them off */
    /* points: a GDN layer's lanes are copied to the points' (pinned) host buffers on the copy
     * stream cs as soon as that layer's delta rule has staged them, while the pass goes on;
     * gdn_done[gi] orders the copy after the layer. HEARTH_CUDA_PINNED_POINTS=0: points in
     * calloc'd memory, copied at the pass's end */
    void *cs;
    void *gdn_done[MODEL_MAX_LAYERS];
    bool pinned_points;
    /* the delta rule in the chunked form (gdn_chunk.cuh), its scratch and each pass's chunk
     * table in io; HEARTH_CUDA_GDN_CHUNK=0: row by row (delta_kernel) instead */
    bool gdn_chunk;
    bool moe_tile16; /* HEARTH_CUDA_MOE_TILE=16: experts' tiles of 16 pairs whatever their count */
    hk_gdn_scratch gsc;
    /* decode's fused launches (passes of at most hk_tail_rows() rows): a layer's input
     * products in one launch, the conv in the chunked delta rule's launch and the gated norm
     * as its tail, the post-mixer norm as the output product's tail, the route as the
     * router's, the combine and the next norm as the down product's (tail.cuh), with tickets
     * in `tickets`; and, in every pass, the attention's rounding in its merge's launch.
     * Each is a part (FU_*); FU_DEFAULT are on unless HEARTH_CUDA_FUSE names others ("1"
     * all, "0" none, or a list of names: fuse_parts). Every part gives its separate
     * launches' bits (test_cuda's fused_tails_match_apart, gated_tail_matches_apart,
     * conv_in_matches_apart) and was timed alone (bench/device_fuse_parts.sh) */
    unsigned fuse;
    unsigned *tickets;
} cuda_engine;

static void cuda_free(engine *eng);

#define TRY(x) \
    do {       \
        if ((x) < 0) return -1; \
    } while (0)

static void prof_mark(cuda_engine *ce, const char *op) {
    prof *p = ce->prof;
    herr e;
    if (!p || p->n >= PROF_EVENTS) return;
    if (!p->ev[p->n] && hk_event_new(&p->ev[p->n], &e) < 0) return;
    p->at[p->n] = op;
    hk_event_record(ce->st, p->ev[p->n++], &e);
}

/* after the pass has synced: each op's time into its name's sum */
static void prof_collect(cuda_engine *ce) {
    prof *p = ce->prof;
    if (!p) return;
    for (int i = 1; i < p->n; i++) {
        int k = 0;
        while (k < PROF_OPS && p->name[k] && strcmp(p->name[k], p->at[i])) k++;
        if (k == PROF_OPS) continue;
        p->name[k] = p->at[i];
        p->ms[k] += hk_event_ms(p->ev[i - 1], p->ev[i]);
        p->calls[k]++;
    }
    p->passes++;
    p->n = 0;
}

static void prof_print(cuda_engine *ce) {
    prof *p = ce->prof;
    if (!p || !p->passes) return;
    double total = 0;
    for (int k = 0; k < PROF_OPS && p->name[k]; k++) total += p->ms[k];
    fprintf(stderr, "cuda profile: %lld passes, %.3f ms of GPU time\n| op | ms | %% | calls | us/call |\n|---|---:|---:|---:|---:|\n",
            (long long)p->passes, total);
    for (int k = 0; k < PROF_OPS && p->name[k]; k++)
        fprintf(stderr, "| %s | %.3f | %.1f | %lld | %.2f |\n", p->name[k], p->ms[k], 100 * p->ms[k] / total,
                (long long)p->calls[k], 1e3 * p->ms[k] / (double)p->calls[k]);
}

/* an op of the pass: its launches, then (profiling) an event named after it */
#define OP(name, x)                 \
    do {                            \
        if ((x) < 0) return -1;     \
        if (ce->prof) prof_mark(ce, name); \
    } while (0)

static int alloc_w(cuda_engine *ce, void **p, size_t bytes, herr *e) {
    if (hk_malloc(p, bytes, e) < 0) return -1;
    if (*p) ce->wmem[ce->n_wmem++] = *p;
    return 0;
}

/* a tensor to the GPU; file_layout keeps the file's blocks (the embedding, read a row at a time) */
static int up(cuda_engine *ce, const qtensor *t, hk_w *w, bool want_f32, bool file_layout, herr *e) {
    *w = (hk_w){0};
    if (!t->data) return 0; /* a tensor the layer kind does not have */
    if (want_f32 && t->type != QT_F32) return herr_set(e, "%s: the CUDA engine reads it as F32, the file has %s", t->name, qtype_name(t->type));
    if (!hk_type_ok(t->type)) return herr_set(e, "%s: type %s is not read by the CUDA engine", t->name, qtype_name(t->type));
    const int64_t K = t->ne[0], M = t->ne[1] > 0 ? t->ne[1] : 1;
    int64_t rows = 1;
    for (int d = 1; d < GGUF_MAX_DIMS; d++) rows *= t->ne[d] > 0 ? t->ne[d] : 1;
    const bool repack = !file_layout && (t->type == QT_Q6_K || t->type == QT_Q8_0);
    if (!file_layout && t->type != QT_F32 && t->type != QT_F16 && t->type != QT_BF16 && K % 256)
        return herr_set(e, "%s: rows of %lld %s weights (the CUDA engine takes whole blocks of 256)", t->name, (long long)K,
                        qtype_name(t->type));
    size_t db, ddb;
    if (repack) hk_w_bytes(t->type, K, rows, &db, &ddb);
    else db = t->row_bytes * (size_t)rows, ddb = 0;
    void *d = NULL, *dd = NULL;
    if (alloc_w(ce, &d, db, e) < 0 || alloc_w(ce, &dd, ddb, e) < 0) return -1;
    const size_t rb = db / (size_t)rows, ddr = ddb / sizeof(uint16_t) / (size_t)rows;
    *w = (hk_w){.d = d, .dd = dd, .type = t->type, .K = K, .M = M, .row_bytes = rb, .slice_bytes = rb * (size_t)M,
                .dd_row = ddr, .dd_slice = ddr * (size_t)M};
    if (repack) return hk_w_upload(w, t->data, rows, t->row_bytes, e);
    return hk_h2d(d, t->data, db, e);
}

static bool same_shape(const hk_w *a, const hk_w *b) { return a->type == b->type && a->K == b->K && a->M == b->M; }

static int upload(cuda_engine *ce, herr *e) {
    const model *m = ce->base.m;
    if (up(ce, &m->token_embd, &ce->token_embd, false, true, e) < 0 || up(ce, &m->output_norm, &ce->output_norm, true, false, e) < 0 ||
        up(ce, &m->output, &ce->output, false, false, e) < 0)
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
            {&L->ffn_down_shexp, &C->ffn_down_shexp, false}, {&L->ffn_gate, &C->ffn_gate, false},
            {&L->ffn_up, &C->ffn_up, false}, {&L->ffn_down, &C->ffn_down, false},
        };
        for (size_t k = 0; k < sizeof list / sizeof list[0]; k++)
            if (up(ce, list[k].t, list[k].w, list[k].f32, false, e) < 0) return -1;
        C->gi = L->recurrent ? gi++ : -1;
        C->ai = L->recurrent ? -1 : ai++;
        if (m->hp.dense) continue; /* no router, no experts: an absent weight reads as F32 (type 0) */
        if (C->ffn_gate_inp.type == QT_F32) {
            const int64_t E = C->ffn_gate_inp.K, X = C->ffn_gate_inp.M;
            void *d;
            if (alloc_w(ce, &d, sizeof(float) * (size_t)((X + 1) * E), e) < 0 ||
                hk_h2d(d, L->ffn_gate_inp.data, sizeof(float) * (size_t)(X * E), e) < 0 ||
                hk_h2d((float *)d + X * E, L->ffn_gate_inp_shexp.data, sizeof(float) * (size_t)E, e) < 0)
                return -1;
            C->router = (hk_w){.d = d, .type = QT_F32, .K = E, .M = X + 1, .row_bytes = sizeof(float) * (size_t)E,
                               .slice_bytes = sizeof(float) * (size_t)((X + 1) * E)};
        }
        C->sh_fused = same_shape(&C->ffn_gate_shexp, &C->ffn_gate_exps) && same_shape(&C->ffn_up_shexp, &C->ffn_up_exps) &&
                      same_shape(&C->ffn_down_shexp, &C->ffn_down_exps);
    }
    return 0;
}

#define F(p) ((const float *)(p).d)

static int act_alloc(hk_act *a, int64_t rows, int64_t K, bool q80, herr *e) {
    *a = (hk_act){.K = K, .q80 = q80};
    if (K % 256) return 0; /* never rounded: the weights there are float (upload checked) */
    if (hk_malloc((void **)&a->q, (size_t)(rows * K), e) < 0 ||
        hk_malloc((void **)&a->d, sizeof(float) * (size_t)(rows * (q80 ? K / 32 : K / 256)), e) < 0 ||
        (!q80 && hk_malloc((void **)&a->s, sizeof(int32_t) * (size_t)(rows * K / 32), e) < 0))
        return -1;
    return 0;
}

static void act_free(hk_act *a) {
    hk_free(a->q);
    hk_free(a->d);
    hk_free(a->s);
}

/* the rounded rows a weight's product reads (NULL for float weights) */
static const hk_act *act_for(const hk_w *w, const hk_act *a8k, const hk_act *a80) {
    if (w->type == QT_F32 || w->type == QT_F16 || w->type == QT_BF16) return NULL;
    return w->type == QT_Q8_0 ? a80 : a8k;
}

/* the buffer of a (sized for rows of a->K) as rows of K <= a->K: NULL for float weights */
static hk_act *act_view(const hk_act *a, int64_t K, hk_act *view) {
    if (!a) return NULL;
    *view = *a;
    view->K = K;
    return view;
}

static bool needs(const hk_w *w, bool q80) {
    if (!w->d || w->type == QT_F32 || w->type == QT_F16 || w->type == QT_BF16) return false;
    return (w->type == QT_Q8_0) == q80;
}

/* the pass scratch and the sequences' state; -1 naming the flags to lower when it does not fit */
static int alloc_state(cuda_engine *ce, herr *e) {
    const engine *eng = &ce->base;
    const model_hparams *hp = &eng->m->hp;
    const int64_t R = ce->R, E = hp->n_embd, cd = hp_conv_dim(hp), Vd = hp_value_dim(hp), Gv = hp->ssm_dt_rank;
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, X = hp->n_expert, K = hp->n_expert_used;
    const int64_t F = hp->n_ff_exp, V = hp->n_vocab, n_ctx = eng->opts.n_ctx, ns = eng->opts.n_seq_max;
    const int64_t Fs = hp->dense ? hp->n_ff : hp->n_ff_shexp; /* the MLP run apart (sg, su, as8k, as80) */
    const int64_t P = R * K + R; /* pairs: routed, then the shared expert's rows */
    const int64_t Od = Vd > H * D ? Vd : H * D;
    const size_t f = sizeof(float);
    /* the router's, the experts' and the combine's buffers are sized times moe: none where dense
     * (X and K are 0 there) */
    const size_t moe = hp->dense ? 0 : 1;
    struct { void **p; size_t bytes; } bufs[] = {
        {(void **)&ce->lanes, f * ce->lane_floats * (size_t)(ns * ce->n_gdn)},
        {(void **)&ce->rings, f * ce->ring_floats * (size_t)(ns * ce->n_gdn)},
        {(void **)&ce->x, f * (size_t)(R * E)}, {(void **)&ce->h, f * (size_t)(R * E)},
        {(void **)&ce->qkv, f * (size_t)(R * cd)}, {(void **)&ce->cv, f * (size_t)(R * cd)},
        {(void **)&ce->z, f * (size_t)(R * Vd)}, {(void **)&ce->o, f * (size_t)(R * Vd)},
        {(void **)&ce->gb, f * (size_t)(R * Gv)}, {(void **)&ce->ga, f * (size_t)(R * Gv)},
        {(void **)&ce->qf, f * (size_t)(R * 2 * H * D)}, {(void **)&ce->k, f * (size_t)(R * Hkv * D)},
        {(void **)&ce->v, f * (size_t)(R * Hkv * D)}, {(void **)&ce->ao, f * (size_t)(R * H * D)},
        /* every row of a pass: the f32 kernels and the split form write every row's segments,
         * the f16 decode form its one-row tiles'. H n_seg PART(D) floats a row: 16 heads of 256
         * at 64k context (n_seg 128): 16 x 128 x 260 x 4 = 2,129,920 bytes a row, 4.37 GB at
         * R = 2050 rows */
        {(void **)&ce->part, f * (size_t)(R * H * ce->n_seg * hk_attn_part_floats(D))},
        {(void **)&ce->rlog, moe * f * (size_t)(R * (X + 1))}, {(void **)&ce->sgl, moe * f * (size_t)R},
        {(void **)&ce->wsel, moe * f * (size_t)(R * K)},
        {(void **)&ce->g, moe * f * (size_t)(P * F)}, {(void **)&ce->u, moe * f * (size_t)(P * F)},
        {(void **)&ce->sg, f * (size_t)(R * Fs)}, {(void **)&ce->su, f * (size_t)(R * Fs)},
        {(void **)&ce->eo, moe * f * (size_t)(P * E)}, {(void **)&ce->so, moe * f * (size_t)(R * E)},
        {(void **)&ce->logits, f * (size_t)LOGITS_CAP * (size_t)V}, {(void **)&ce->d_tok, 4 * (size_t)LOGITS_CAP},
        {&ce->am_scratch, hk_argmax_scratch(LOGITS_CAP)},
        {(void **)&ce->tickets, sizeof(unsigned) * TICKETS(E)},
        {(void **)&ce->sel, moe * 4 * (size_t)(R * K)}, {(void **)&ce->offs, moe * 4 * (size_t)(X + 1)},
        {(void **)&ce->list, moe * 4 * (size_t)(R * K)}, {(void **)&ce->mtiles, moe * 4 * (size_t)(2 * (R * K + X) + 2)},
        {(void **)&ce->d_io, ce->io.bytes},
        {(void **)&ce->gsc.w, ce->gdn_chunk ? f * (size_t)(R * Vd) : 0},
        {(void **)&ce->gsc.u, ce->gdn_chunk ? f * (size_t)(R * Vd) : 0},
        {(void **)&ce->gsc.qk, ce->gdn_chunk ? f * (size_t)(R * Gv * CUDA_CHUNK) : 0},
        {(void **)&ce->gsc.g, ce->gdn_chunk ? f * (size_t)(R * Gv) : 0},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (hk_malloc(bufs[i].p, bufs[i].bytes, e) < 0) /* 0 bytes: NULL */
            return herr_wrap(e, "--device cuda: the GPU has no room for %d sequences of %lld tokens (lower -c or -np)",
                             (int)ns, (long long)n_ctx);
    /* the rounded rows, in each format some weight of the site reads */
    bool x8k = needs(&ce->output, false), x80 = needs(&ce->output, true), o8k = false, o80 = false, f8k = false,
         f80 = false, s8k = false, s80 = false;
    for (int il = 0; il < hp->n_layer; il++) {
        const cuda_layer *C = &ce->layers[il];
        const hk_w *xs[] = {&C->attn_qkv, &C->attn_gate, &C->ssm_beta, &C->ssm_alpha, &C->attn_q, &C->attn_k,
                            &C->attn_v, &C->ffn_gate_exps, &C->ffn_up_exps, &C->ffn_gate_shexp, &C->ffn_up_shexp,
                            &C->ffn_gate, &C->ffn_up};
        for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) x8k |= needs(xs[k], false), x80 |= needs(xs[k], true);
        o8k |= needs(&C->ssm_out, false) || needs(&C->attn_out, false);
        o80 |= needs(&C->ssm_out, true) || needs(&C->attn_out, true);
        f8k |= needs(&C->ffn_down_exps, false), f80 |= needs(&C->ffn_down_exps, true);
        if (!C->sh_fused) s8k |= needs(&C->ffn_down_shexp, false), s80 |= needs(&C->ffn_down_shexp, true);
        s8k |= needs(&C->ffn_down, false), s80 |= needs(&C->ffn_down, true); /* dense (absent: false) */
    }
    struct { hk_act *a; bool want; int64_t rows, K; bool q80; } acts[] = {
        {&ce->ax8k, x8k, R, E, false}, {&ce->ax80, x80, R, E, true}, {&ce->ao8k, o8k, R, Od, false},
        {&ce->ao80, o80, R, Od, true}, {&ce->af8k, f8k, P, F, false}, {&ce->af80, f80, P, F, true},
        {&ce->as8k, s8k, R, Fs, false}, {&ce->as80, s80, R, Fs, true},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        *acts[i].a = (hk_act){.K = acts[i].K, .q80 = acts[i].q80};
        if (acts[i].want && act_alloc(acts[i].a, acts[i].rows, acts[i].K, acts[i].q80, e) < 0)
            return herr_wrap(e, "--device cuda: the GPU has no room for the rounded rows (lower -np)");
    }
    const size_t kv_bytes = (ce->f16 ? 2 : 4) * ce->kv_row * (size_t)n_ctx * (size_t)ns;
    for (int il = 0; il < hp->n_layer; il++) {
        const int ai = ce->layers[il].ai;
        if (ai < 0) continue;
        if (hk_malloc(&ce->kc[ai], kv_bytes, e) < 0 || hk_malloc(&ce->vc[ai], kv_bytes, e) < 0)
            return herr_wrap(e, "--device cuda: the GPU has no room for the KV rows of %d sequences of %lld tokens "
                             "(lower -c or -np)", (int)ns, (long long)n_ctx);
        if (hk_memset(ce->kc[ai], 0, kv_bytes, e) < 0 || hk_memset(ce->vc[ai], 0, kv_bytes, e) < 0) return -1;
    }
    if (hk_memset(ce->lanes, 0, f * ce->lane_floats * (size_t)(ns * ce->n_gdn), e) < 0 ||
        hk_memset(ce->rings, 0, f * ce->ring_floats * (size_t)(ns * ce->n_gdn), e) < 0)
        return -1;
    if (hk_memset(ce->am_scratch, 0, hk_argmax_scratch(LOGITS_CAP), e) < 0 ||
        hk_memset(ce->tickets, 0, sizeof(unsigned) * TICKETS(E), e) < 0)
        return -1;
    if (hk_host_alloc((void **)&ce->h_io, ce->io.bytes, e) < 0 ||
        hk_host_alloc((void **)&ce->h_logits, f * (size_t)LOGITS_CAP * (size_t)V, e) < 0 ||
        hk_host_alloc((void **)&ce->h_tok, 4 * (size_t)LOGITS_CAP, e) < 0)
        return herr_wrap(e, "--device cuda");
    return 0;
}

static void graphs_drop(cuda_engine *ce) {
    for (int i = 0; i < N_GRAPHS; i++) {
        hk_graph_free(ce->graphs[i].exec);
        ce->graphs[i] = (graph_entry){0};
    }
}

static int stage_reserve(cuda_engine *ce, int64_t n_points, herr *e) {
    if (n_points <= ce->stage_cap) return 0;
    graphs_drop(ce); /* they point at the old staging area */
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
    int64_t n, n_logits;    /* logits rows: the first n_logits - n_argmax are copied out */
    int64_t n_argmax;       /* the last n_argmax are argmaxed on the GPU, only the ids copied */
    int n_pieces, n_marks, n_tiles, n_one; /* n_one: tiles of one row (attention's decode form) */
    const int64_t *row_call;
    float *const *logit_row;
    engine_point *const *mark_point;
    bool copy_lanes;        /* the points' lanes are copied on cs layer by layer (no graph) */
} pass;

#define IO(ce, field, type) ((type *)((ce)->d_io + (ce)->io.field))

/* the pass's points' lanes of GDN layer gi, from the staging area to their host buffers, on
 * the copy stream once the layer's delta rule is done (cuda_run waits for cs after the pass) */
static int lanes_out(cuda_engine *ce, int64_t gi, const pass *p, herr *e) {
    const size_t bytes = sizeof(float) * ce->lane_floats, slot = ce->lane_floats * (size_t)ce->n_gdn;
    TRY(hk_event_record(ce->st, ce->gdn_done[gi], e));
    TRY(hk_stream_wait(ce->cs, ce->gdn_done[gi], e));
    for (int i = 0; i < p->n_marks; i++)
        TRY(hk_d2h_async(ce->cs, p->mark_point[i]->lanes + (size_t)gi * ce->lane_floats,
                         ce->stage_lanes + (size_t)i * slot + (size_t)gi * ce->lane_floats, bytes, e));
    return 0;
}

static bool is_float_w(const hk_w *w) { return w->type == QT_F32 || w->type == QT_F16 || w->type == QT_BF16; }

/* decode's fused launches, part by part (HEARTH_CUDA_FUSE's names in fuse_names) */
enum {
    FU_IN = 1 << 0,      /* a layer's input products in one launch */
    FU_CONV = 1 << 1,    /* the conv loaded at once, in the chunked delta rule's launch where it can */
    FU_GATED = 1 << 2,   /* the gated norm as the delta rule's tail */
    FU_NORM = 1 << 3,    /* the post-mixer norm as the output product's tail */
    FU_ROUTE = 1 << 4,   /* the route as the router's tail */
    FU_COMBINE = 1 << 5, /* the combine and the next norm as the down product's tail (dense: the next norm) */
    FU_MERGE = 1 << 6,   /* the attention's rounding in its merge (every pass) */
    FU_ALL = (1 << 7) - 1,
    /* on an H100 (bench/RESULTS.md, 2026-12-05) conv and gated together took decode from 297
     * to 316-320 t/s; in and merge alone +1-2% but nothing on top of those two; the one-block
     * tails lost (norm -3%, combine -6%: the separate kernel already waits, resident, at its
     * PDL gate) and route was even */
    FU_DEFAULT = FU_CONV | FU_GATED
};
static const char *const fuse_names[] = {"in", "conv", "gated", "norm", "route", "combine", "merge"};

/* HEARTH_CUDA_FUSE's value as parts: "1" all, "0" none, else names joined by commas */
static int fuse_parts(const char *v, unsigned *parts, herr *e) {
    *parts = 0;
    if (!strcmp(v, "1")) *parts = FU_ALL;
    if (!strcmp(v, "0") || !strcmp(v, "1")) return 0;
    for (const char *s = v; *s;) {
        const size_t len = strcspn(s, ",");
        size_t k = 0;
        while (k < sizeof fuse_names / sizeof *fuse_names && (strlen(fuse_names[k]) != len || strncmp(s, fuse_names[k], len))) k++;
        if (k == sizeof fuse_names / sizeof *fuse_names) {
            char all[64] = "";
            for (size_t j = 0; j < sizeof fuse_names / sizeof *fuse_names; j++)
                snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", j ? ", " : "", fuse_names[j]);
            return herr_set(e, "HEARTH_CUDA_FUSE: no part named '%.*s' (1, 0, or a list of %s)", (int)len, s, all);
        }
        *parts |= 1u << k;
        s += len + (s[len] == ',');
    }
    return 0;
}

/* whether a pass of n rows takes decode's fused launch `part` */
static bool fuse_pass(const cuda_engine *ce, int64_t n, unsigned part) { return (ce->fuse & part) && n <= hk_tail_rows(); }

/* the layer's mixer output product (ssm_out or attn_out) */
static const hk_w *out_w(const cuda_layer *C) { return C->gi >= 0 ? &C->ssm_out : &C->attn_out; }

/* a product of n rows added to the residual x; tail_nw set: the norm of the new x by that
 * weight (into h and the rounded rows) is its launch's tail */
static int residual_product(cuda_engine *ce, const hk_w *w, const float *in, int64_t K, const hk_act *a, int64_t n,
                            const float *tail_nw, herr *e) {
    const model_hparams *hp = &ce->base.m->hp;
    const int64_t E = hp->n_embd;
    if (!tail_nw) return hk_matmul(ce->st, w, in, K, a, n, ce->x, E, true, e);
    const hk_tail t = {.kind = HK_TAIL_NORM, .cnt = ce->tickets, .n = n, .E = E, .x = ce->x, .h = ce->h,
                       .nw = tail_nw, .eps = hp->rms_eps, .a = ce->ax8k, .a2 = ce->ax80};
    return hk_matmul_tail(ce->st, w, in, K, a, n, ce->x, E, true, &t, e);
}

/* the mixer's output product, added to the residual x; fused: the layer's post-mixer norm
 * (into h and the rounded rows) is its tail, else forward() launches it */
static bool norm_in_tail(const cuda_engine *ce, const cuda_layer *C, int64_t n) { return fuse_pass(ce, n, FU_NORM) && !is_float_w(out_w(C)); }
static int out_product(cuda_engine *ce, const cuda_layer *C, const hk_w *w, const float *in, int64_t K, const hk_act *a,
                       int64_t n, herr *e) {
    return residual_product(ce, w, in, K, a, n, norm_in_tail(ce, C, n) ? (const float *)C->post_norm.d : NULL, e);
}

static int gdn_layer(cuda_engine *ce, const cuda_layer *C, const pass *p, herr *e) {
    const model_hparams *hp = &ce->base.m->hp;
    void *st = ce->st;
    const int64_t n = p->n, E = hp->n_embd, cd = hp_conv_dim(hp), Vd = hp_value_dim(hp), Gv = hp->ssm_dt_rank;
    const int64_t S = hp->ssm_d_state, Gk = hp->ssm_n_group, dc = hp->ssm_d_conv;
    const size_t lstride = ce->lane_floats * (size_t)ce->n_gdn, rstride = ce->ring_floats * (size_t)ce->n_gdn;
    float *lane0 = ce->lanes + (size_t)C->gi * ce->lane_floats, *ring0 = ce->rings + (size_t)C->gi * ce->ring_floats;
    float *sl = ce->stage_lanes ? ce->stage_lanes + (size_t)C->gi * ce->lane_floats : NULL;
    float *sr = ce->stage_rings ? ce->stage_rings + (size_t)C->gi * ce->ring_floats : NULL;
    const hk_piece *pieces = IO(ce, pieces, hk_piece);
    const hk_mark *marks = IO(ce, marks, hk_mark);
#define AX(w) act_for(&(w), &ce->ax8k, &ce->ax80)
    const hk_act *ain = AX(C->attn_qkv);
    if (fuse_pass(ce, n, FU_IN) && ain && ain == AX(C->attn_gate) && ain == AX(C->ssm_beta) && ain == AX(C->ssm_alpha)) {
        /* the four products of the layer's input, the runs of one type a launch each */
        const hk_out outs[] = {{&C->attn_qkv, ce->qkv, cd}, {&C->attn_gate, ce->z, Vd}, {&C->ssm_beta, ce->gb, Gv},
                               {&C->ssm_alpha, ce->ga, Gv}};
        OP("gdn in", hk_matmul_n(st, outs, 4, ain, n, e));
    } else {
        OP("gdn qkv", hk_matmul(st, &C->attn_qkv, ce->h, E, ain, n, ce->qkv, cd, false, e));
        OP("gdn z", hk_matmul(st, &C->attn_gate, ce->h, E, AX(C->attn_gate), n, ce->z, Vd, false, e));
        if (AX(C->ssm_beta) && AX(C->ssm_beta) == AX(C->ssm_alpha))
            OP("gdn beta alpha", hk_matmul2(st, &C->ssm_beta, &C->ssm_alpha, AX(C->ssm_beta), n, ce->gb, ce->ga, Gv, e));
        else {
            OP("gdn beta alpha", hk_matmul(st, &C->ssm_beta, ce->h, E, AX(C->ssm_beta), n, ce->gb, Gv, false, e));
            OP("gdn beta alpha", hk_matmul(st, &C->ssm_alpha, ce->h, E, AX(C->ssm_alpha), n, ce->ga, Gv, false, e));
        }
    }
    const bool ring_too = n == p->n_pieces; /* decode: every piece one row, its ring written by the conv's launch */
    const bool conv_fast = ring_too && fuse_pass(ce, n, FU_CONV);
    /* decode, fused, chunked, the model's heads and taps: the conv is made in the delta rule's launch */
    const bool conv_in = conv_fast && ce->gdn_chunk && S == 128 && dc == 4 && Gv % Gk == 0;
    const hk_gconv gcv = {.qkv = ce->qkv, .w = F(C->ssm_conv1d), .ssm_a = F(C->ssm_a), .dt = F(C->ssm_dt), .braw = ce->gb,
                          .araw = ce->ga, .ring0 = ring0, .stage0 = sr, .ring_stride = rstride, .stage_stride = rstride,
                          .eps = hp->rms_eps, .cnt = ce->tickets + TICKETS_CONV};
    if (!conv_in)
        OP("gdn conv norm", hk_gdn_conv_norm(st, ce->qkv, ring0, rstride, F(C->ssm_conv1d), IO(ce, row_piece, int32_t), pieces, n,
                                             marks, sr, rstride, conv_fast ? 2 : ring_too ? 1 : 0, ce->cv, ce->gb, ce->ga,
                                             F(C->ssm_a), F(C->ssm_dt), S, Gk, Gv, cd, dc, hp->rms_eps, e));
    if (!ring_too)
        OP("gdn ring", hk_gdn_ring(st, ce->qkv, ring0, rstride, pieces, p->n_pieces, marks, p->n_marks, sr, rstride, cd, dc, e));
    /* decode, fused: the gated norm is the delta rule's tail */
    hk_act aov, *ao = act_view(act_for(&C->ssm_out, &ce->ao8k, &ce->ao80), Vd, &aov);
    const hk_act none = {0};
    const hk_gtail gt = {.z = ce->z, .nw = F(C->ssm_norm), .eps = hp->rms_eps, .a = ao ? *ao : none, .cnt = ce->tickets};
    const hk_gtail *gtp = ring_too && fuse_pass(ce, n, FU_GATED) && Gv % 2 == 0 ? &gt : NULL;
    if (ce->gdn_chunk)
        OP("gdn delta", hk_gdn_chunk(st, ce->cv, ce->gb, ce->ga, lane0, lstride, pieces, p->n_pieces, IO(ce, chunks, hk_chunk),
                                     IO(ce, pchunk, int32_t), n, marks, sl, lstride, S, Gk, Gv, cd, &ce->gsc,
                                     conv_in ? &gcv : NULL, gtp, ce->o, e));
    else
        OP("gdn delta", hk_gdn_delta(st, ce->cv, ce->gb, ce->ga, lane0, lstride, pieces, p->n_pieces, marks, sl, lstride, S, Gk,
                                     Gv, cd, gtp, ce->o, e));
    if (p->copy_lanes) TRY(lanes_out(ce, C->gi, p, e));
    if (!gtp) OP("gdn gated norm", hk_gdn_gated_norm(st, ce->o, ce->z, F(C->ssm_norm), n, S, Gv, hp->rms_eps, ao, e));
    OP("gdn out", out_product(ce, C, &C->ssm_out, ce->o, Vd, ao, n, e));
    return 0;
}

static int attn_layer(cuda_engine *ce, const cuda_layer *C, const pass *p, herr *e) {
    const model_hparams *hp = &ce->base.m->hp;
    void *st = ce->st;
    const int64_t n = p->n, E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const size_t sstride = ce->kv_row * (size_t)ce->base.opts.n_ctx;
    if (fuse_pass(ce, n, FU_IN) && AX(C->attn_q) && AX(C->attn_q) == AX(C->attn_k) && AX(C->attn_q) == AX(C->attn_v)) {
        const hk_out outs[] = {{&C->attn_q, ce->qf, 2 * H * D}, {&C->attn_k, ce->k, Hkv * D}, {&C->attn_v, ce->v, Hkv * D}};
        OP("attn in", hk_matmul_n(st, outs, 3, AX(C->attn_q), n, e));
    } else {
        OP("attn q", hk_matmul(st, &C->attn_q, ce->h, E, AX(C->attn_q), n, ce->qf, 2 * H * D, false, e));
        OP("attn k v", hk_matmul(st, &C->attn_k, ce->h, E, AX(C->attn_k), n, ce->k, Hkv * D, false, e));
        OP("attn k v", hk_matmul(st, &C->attn_v, ce->h, E, AX(C->attn_v), n, ce->v, Hkv * D, false, e));
    }
    OP("attn prep", hk_attn_prep(st, ce->qf, ce->k, ce->v, F(C->attn_q_norm), F(C->attn_k_norm), IO(ce, row_seq, int32_t),
                     IO(ce, pos, int64_t), n, H, Hkv, D, hp->rope_dims, hp->rope_theta, hp->rms_eps, ce->kc[C->ai],
                     ce->vc[C->ai], sstride, ce->f16, e));
    /* fused: the rounding for the out product in the merge's launch (heads of whole 256-blocks) */
    hk_act aov, *ao = act_view(act_for(&C->attn_out, &ce->ao8k, &ce->ao80), H * D, &aov);
    const bool round_in = ao && (ce->fuse & FU_MERGE) && D % 256 == 0 && D <= 1024;
    OP("attn", hk_attn(st, ce->qf, IO(ce, tiles, hk_qtile), p->n_tiles, p->n_one, IO(ce, pos, int64_t), n, H, Hkv, D, ce->kc[C->ai],
                ce->vc[C->ai], sstride, ce->base.opts.n_ctx * ce->base.opts.n_seq_max, ce->f16, ce->seg, ce->n_seg, ce->part, ce->ao,
                round_in ? ao : NULL, e));
    if (ao && !round_in) OP("attn round", hk_quantize(st, ce->ao, H * D, n, ao, e));
    OP("attn out", out_product(ce, C, &C->attn_out, ce->ao, H * D, ao, n, e));
    return 0;
}

/* the MoE block of layer il; its combine also makes the next layer's normed input (next_norm) */
static int moe_layer(cuda_engine *ce, int il, const cuda_layer *C, const float *next_norm, const pass *p, herr *e) {
    engine *eng = &ce->base;
    const model_hparams *hp = &eng->m->hp;
    void *st = ce->st;
    const int64_t n = p->n, E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp, Fs = hp->n_ff_shexp;
    const bool fused = C->sh_fused, gu_f = is_float_w(&C->ffn_gate_exps), dn_f = is_float_w(&C->ffn_down_exps);
    const int64_t nr = n * K, np = nr + (fused ? n : 0); /* pairs: routed, then the shared expert's rows */
    /* the routing logits and the shared expert's gate logit (gl, at stride gls) */
    const float *gl;
    int64_t ls, gls;
    const bool route_tail = fuse_pass(ce, n, FU_ROUTE) && C->router.d;
    if (route_tail) { /* the route is the router's tail */
        const hk_tail t = {.kind = HK_TAIL_ROUTE, .cnt = ce->tickets, .n = n, .ls = X + 1, .X = (int)X, .K = (int)K,
                           .sel = ce->sel, .wsel = ce->wsel};
        OP("moe router", hk_matmul_tail(st, &C->router, ce->h, E, NULL, n, ce->rlog, X + 1, false, &t, e));
        ls = gls = X + 1, gl = ce->rlog + X;
    } else if (C->router.d) {
        OP("moe router", hk_matmul(st, &C->router, ce->h, E, NULL, n, ce->rlog, X + 1, false, e));
        ls = gls = X + 1, gl = ce->rlog + X;
    } else {
        const hk_w gw = {.d = C->ffn_gate_inp_shexp.d, .type = QT_F32, .K = E, .M = 1, .row_bytes = sizeof(float) * (size_t)E,
                         .slice_bytes = sizeof(float) * (size_t)E};
        OP("moe router", hk_matmul(st, &C->ffn_gate_inp, ce->h, E, AX(C->ffn_gate_inp), n, ce->rlog, X, false, e));
        OP("moe router", hk_matmul(st, &gw, ce->h, E, NULL, n, ce->sgl, 1, false, e));
        ls = X, gls = 1, gl = ce->sgl;
    }
    if (!route_tail) OP("moe route", hk_moe_route(st, ce->rlog, ls, n, (int)X, (int)K, ce->sel, ce->wsel, e));
    if (eng->route_trace) { /* tests compare the experts chosen: (row of the call, layer, K) */
        TRY(hk_stream_sync(st, e));
        TRY(hk_d2h(ce->h_sel, ce->sel, sizeof(int32_t) * (size_t)(n * K), e));
        for (int64_t r = 0; r < n; r++)
            memcpy(eng->route_trace + (size_t)(p->row_call[r] * hp->n_layer + il) * (size_t)K, ce->h_sel + r * K,
                   sizeof(int32_t) * (size_t)K);
    }
    /* a prompt's pairs grouped by expert for the tensor cores; a few rows run pair by pair */
    hk_moe_sorted so, *sp = NULL;
    if (n > GEMV_ROWS && !(gu_f && dn_f)) {
        const int tile = ce->moe_tile16 ? 16 : hk_moe_tile_for(nr, (int)X);
        OP("moe sort", hk_moe_sort(st, ce->sel, nr, (int)X, tile, ce->offs, ce->list, ce->mtiles, e));
        so = (hk_moe_sorted){.offs = ce->offs, .list = ce->list, .tiles = ce->mtiles,
                             .max_tiles = nr / tile + (X < nr ? X : nr), .tile = tile};
        sp = &so;
    }
    const hk_w *wsg = fused ? &C->ffn_gate_shexp : NULL, *wsu = fused ? &C->ffn_up_shexp : NULL;
    const hk_w *wsd = fused ? &C->ffn_down_shexp : NULL;
    if (gu_f) {
        OP("moe gate up", hk_moe_matmul_f32(st, &C->ffn_gate_exps, wsg, ce->sel, nr, np, (int)K, 0, ce->h, E, ce->g, F, e));
        OP("moe gate up", hk_moe_matmul_f32(st, &C->ffn_up_exps, wsu, ce->sel, nr, np, (int)K, 0, ce->h, E, ce->u, F, e));
    } else {
        const hk_act *ax = AX(C->ffn_gate_exps);
        OP("moe gate up", hk_moe_matmul2(st, &C->ffn_gate_exps, wsg, &C->ffn_up_exps, wsu, ce->sel, nr, np, (int)K, 0, ax, sp,
                                         ce->g, ce->u, F, e));
    }
    hk_act *af = (hk_act *)act_for(&C->ffn_down_exps, &ce->af8k, &ce->af80);
    hk_act *x8k = ce->ax8k.q ? &ce->ax8k : NULL, *x80 = ce->ax80.q ? &ce->ax80 : NULL;
    const bool combine_tail = fuse_pass(ce, n, FU_COMBINE) && fused && !dn_f && !sp;
    if (combine_tail) { /* the combine and the next layer's norm are the down product's tail */
        const hk_tail t = {.kind = HK_TAIL_COMBINE, .cnt = ce->tickets, .n = n, .E = E, .K = (int)K, .x = ce->x, .gl = gl,
                           .gls = gls, .so = ce->eo + nr * E, .wsel = ce->wsel, .nw = next_norm, .h = ce->h,
                           .eps = hp->rms_eps, .a = ce->ax8k, .a2 = ce->ax80};
        OP("moe down", hk_moe_down_swiglu(st, &C->ffn_down_exps, wsd, ce->sel, nr, np, ce->g, ce->u, ce->eo, E, &t, e));
        return 0;
    }
    if (!dn_f && !sp) /* a few rows: the SwiGLU rows made inside the down product's launch */
        OP("moe down", hk_moe_down_swiglu(st, &C->ffn_down_exps, wsd, ce->sel, nr, np, ce->g, ce->u, ce->eo, E, NULL, e));
    else {
        OP("moe swiglu", hk_swiglu_quant(st, ce->g, ce->u, np, F, af, e));
        if (dn_f) OP("moe down", hk_moe_matmul_f32(st, &C->ffn_down_exps, wsd, ce->sel, nr, np, 1, nr, ce->g, F, ce->eo, E, e));
        else OP("moe down", hk_moe_matmul(st, &C->ffn_down_exps, wsd, ce->sel, nr, np, 1, nr, af, sp, ce->eo, E, e));
    }
    const float *so_rows = ce->eo + nr * E;
    if (!fused) { /* the shared expert apart (its shape differs from the experts') */
        hk_act *as = (hk_act *)act_for(&C->ffn_down_shexp, &ce->as8k, &ce->as80);
        OP("moe shared", hk_matmul(st, &C->ffn_gate_shexp, ce->h, E, AX(C->ffn_gate_shexp), n, ce->sg, Fs, false, e));
        OP("moe shared", hk_matmul(st, &C->ffn_up_shexp, ce->h, E, AX(C->ffn_up_shexp), n, ce->su, Fs, false, e));
        OP("moe shared", hk_swiglu_quant(st, ce->sg, ce->su, n, Fs, as, e));
        OP("moe shared", hk_matmul(st, &C->ffn_down_shexp, ce->sg, Fs, as, n, ce->so, E, false, e));
        so_rows = ce->so;
    }
    OP("moe combine", hk_moe_combine(st, ce->x, gl, gls, ce->eo, so_rows, ce->wsel, n, E, (int)K, next_norm, ce->h,
                                     hp->rms_eps, x8k, x80, e));
    return 0;
}

/* qwen35's dense MLP of a layer, in place of moe_layer: x += down(silu(gate h) * up h), h the
 * post-mixer norm's rows, as the shared expert runs apart (the CPU's mlp_layer: the same
 * rounding of h and of the SwiGLU rows); then, as the MoE's combine does, the next layer's
 * norm of the new x (next_norm; NULL after the last layer) into h and the rounded rows:
 * fused (FU_COMBINE, quantized down weights), the down product's tail */
static int mlp_layer(cuda_engine *ce, const cuda_layer *C, const float *next_norm, const pass *p, herr *e) {
    const model_hparams *hp = &ce->base.m->hp;
    void *st = ce->st;
    const int64_t n = p->n, E = hp->n_embd, Fd = hp->n_ff;
    const hk_act *ag = AX(C->ffn_gate);
    if (ag && ag == AX(C->ffn_up)) /* both read the same rounded rows: one launch for a few rows */
        OP("mlp gate up", hk_matmul2(st, &C->ffn_gate, &C->ffn_up, ag, n, ce->sg, ce->su, Fd, e));
    else {
        OP("mlp gate up", hk_matmul(st, &C->ffn_gate, ce->h, E, ag, n, ce->sg, Fd, false, e));
        OP("mlp gate up", hk_matmul(st, &C->ffn_up, ce->h, E, AX(C->ffn_up), n, ce->su, Fd, false, e));
    }
    hk_act *as = (hk_act *)act_for(&C->ffn_down, &ce->as8k, &ce->as80);
    OP("mlp swiglu", hk_swiglu_quant(st, ce->sg, ce->su, n, Fd, as, e));
    const bool norm_tail = next_norm && fuse_pass(ce, n, FU_COMBINE) && !is_float_w(&C->ffn_down);
    OP("mlp down", residual_product(ce, &C->ffn_down, ce->sg, Fd, as, n, norm_tail ? next_norm : NULL, e));
    hk_act *x8k = ce->ax8k.q ? &ce->ax8k : NULL, *x80 = ce->ax80.q ? &ce->ax80 : NULL;
    if (next_norm && !norm_tail) OP("norm", hk_rmsnorm(st, ce->x, NULL, next_norm, ce->h, n, E, hp->rms_eps, x8k, x80, e));
    return 0;
}

/* the pass's launches, from the embedding to the logits rows (no host sync unless a route trace is on) */
static int forward(cuda_engine *ce, const pass *p, herr *e) {
    const model *m = ce->base.m;
    const model_hparams *hp = &m->hp;
    void *st = ce->st;
    const int64_t n = p->n, E = hp->n_embd, V = hp->n_vocab;
    if (ce->prof) prof_mark(ce, "start");
    OP("embed", hk_embed(st, &ce->token_embd, IO(ce, ids, int32_t), n, ce->x, e));
    hk_act *x8k = ce->ax8k.q ? &ce->ax8k : NULL, *x80 = ce->ax80.q ? &ce->ax80 : NULL;
    for (int il = 0; il < hp->n_layer; il++) {
        const cuda_layer *C = &ce->layers[il];
        if (il == 0) /* later layers' input norms come from the end of the previous layer's FFN (moe_layer, mlp_layer) */
            OP("norm", hk_rmsnorm(st, ce->x, NULL, F(C->attn_norm), ce->h, n, E, hp->rms_eps, x8k, x80, e));
        TRY(C->gi >= 0 ? gdn_layer(ce, C, p, e) : attn_layer(ce, C, p, e));
        if (!norm_in_tail(ce, C, n))
            OP("norm", hk_rmsnorm(st, ce->x, NULL, F(C->post_norm), ce->h, n, E, hp->rms_eps, x8k, x80, e));
        const float *next_norm = il + 1 < hp->n_layer ? F(ce->layers[il + 1].attn_norm) : NULL;
        TRY(hp->dense ? mlp_layer(ce, C, next_norm, p, e) : moe_layer(ce, il, C, next_norm, p, e));
    }
    if (p->n_logits) {
        const hk_act *ax = AX(ce->output);
        OP("norm", hk_rmsnorm(st, ce->x, IO(ce, lrows, int32_t), F(ce->output_norm), ce->h, p->n_logits, E, hp->rms_eps,
                       ax == &ce->ax8k ? x8k : NULL, ax == &ce->ax80 ? x80 : NULL, e));
        OP("output", hk_matmul(st, &ce->output, ce->h, E, ax, p->n_logits, ce->logits, V, false, e));
        const int64_t nc = p->n_logits - p->n_argmax;
        if (nc) OP("logits copy", hk_d2h_async(st, ce->h_logits, ce->logits, sizeof(float) * (size_t)V * (size_t)nc, e));
        if (p->n_argmax) {
            OP("argmax", hk_argmax(st, ce->logits + (size_t)nc * (size_t)V, V, p->n_argmax, ce->am_scratch, ce->d_tok, e));
            OP("argmax copy", hk_d2h_async(st, ce->h_tok, ce->d_tok, sizeof(int32_t) * (size_t)p->n_argmax, e));
        }
    }
    return 0;
}
#undef AX

/* runs the pass: replays its graph, captures one the second time its shape is seen, or
 * launches it plainly */
static int run_pass(cuda_engine *ce, const pass *p, herr *e) {
    engine *eng = &ce->base;
    /* a pass with points copies into their buffers, which a graph would hold fixed */
    if (ce->no_graphs || ce->prof || eng->route_trace || p->copy_lanes) return forward(ce, p, e);
    graph_entry *hit = NULL, *free_e = NULL, *old = &ce->graphs[0];
    for (int i = 0; i < N_GRAPHS; i++) {
        graph_entry *g = &ce->graphs[i];
        if (g->use && g->n == p->n && g->n_logits == p->n_logits && g->n_argmax == p->n_argmax && g->n_pieces == p->n_pieces &&
            g->n_marks == p->n_marks &&
            g->n_tiles == p->n_tiles && g->n_one == p->n_one)
            hit = g;
        if (!g->use && !free_e) free_e = g;
        if (g->use < old->use) old = g;
    }
    ce->graph_clock++;
    if (hit && hit->exec) {
        hit->use = ce->graph_clock;
        return hk_graph_launch(ce->st, hit->exec, e);
    }
    if (!hit) { /* first sight: remember the shape, run it plainly */
        graph_entry *g = free_e ? free_e : old;
        hk_graph_free(g->exec);
        *g = (graph_entry){.n = p->n, .n_logits = p->n_logits, .n_argmax = p->n_argmax, .n_pieces = p->n_pieces, .n_marks = p->n_marks,
                           .n_tiles = p->n_tiles, .n_one = p->n_one, .use = ce->graph_clock};
        return forward(ce, p, e);
    }
    /* second sight: capture, then launch */
    TRY(hk_capture_begin(ce->st, e));
    int rc = forward(ce, p, e);
    void *exec = NULL;
    herr e2;
    if (hk_capture_end(ce->st, &exec, rc < 0 ? &e2 : e) < 0 && rc == 0) return -1;
    if (rc < 0) return -1;
    hit->exec = exec;
    hit->use = ce->graph_clock;
    return hk_graph_launch(ce->st, exec, e);
}

static size_t io_add(size_t *at, size_t bytes) {
    const size_t a = *at;
    *at += (bytes + 255) & ~(size_t)255;
    return a;
}

static int cuda_run(engine *eng, const engine_span *spans, int n_spans, herr *e) {
    cuda_engine *ce = (cuda_engine *)eng;
    const model_hparams *hp = &eng->m->hp;
    const int64_t V = hp->n_vocab, R = ce->R;
    const int qt = hk_attn_tile_rows(hp->n_head / hp->n_head_kv, ce->f16);
    int64_t *done = xcalloc((size_t)n_spans, sizeof *done), *call0 = xcalloc((size_t)n_spans, sizeof *call0);
    int64_t *row_call = xmalloc(sizeof(int64_t) * (size_t)R);
    float **logit_row = xmalloc(sizeof(float *) * (size_t)R);
    engine_point **mark_point = xmalloc(sizeof(engine_point *) * (size_t)R);
    int32_t *am_row = xmalloc(sizeof(int32_t) * LOGITS_CAP), **am_tok = xmalloc(sizeof(int32_t *) * LOGITS_CAP);
    int32_t *ids = (int32_t *)(ce->h_io + ce->io.ids), *row_seq = (int32_t *)(ce->h_io + ce->io.row_seq);
    int32_t *row_piece = (int32_t *)(ce->h_io + ce->io.row_piece), *lrows = (int32_t *)(ce->h_io + ce->io.lrows);
    int64_t *pos = (int64_t *)(ce->h_io + ce->io.pos);
    hk_piece *pieces = (hk_piece *)(ce->h_io + ce->io.pieces);
    hk_mark *marks = (hk_mark *)(ce->h_io + ce->io.marks);
    hk_qtile *tiles = (hk_qtile *)(ce->h_io + ce->io.tiles);
    hk_chunk *chunks = ce->gdn_chunk ? (hk_chunk *)(ce->h_io + ce->io.chunks) : NULL;
    int32_t *pchunk = ce->gdn_chunk ? (int32_t *)(ce->h_io + ce->io.pchunk) : NULL;
    int rc = 0;
    for (int i = 0; i < n_spans; i++) call0[i] = i ? call0[i - 1] + spans[i - 1].n : 0;
    for (;;) {
        int64_t n = 0, n_logits = 0, n_am = 0; /* rows copied out; rows argmaxed (ARGMAX spans' last) */
        int np = 0, nm = 0, nt = 0, nc = 0, n_one = 0;
        for (int i = 0; i < n_spans; i++) {
            const engine_span *sp = &spans[i];
            if (done[i] == sp->n) continue;
            /* the delta rule runs row by row here, so no bit depends on the grid; the pieces
             * still end where the CPU's do */
            int64_t len = engine_piece_end(sp->anchors, sp->n_anchors, sp->n, done[i], CUDA_UBATCH, CUDA_CHUNK) - done[i];
            /* mutant: a marked call split into two passes at its first mark */
            if (MUTANT("extra_pass") && sp->n_marks && sp->marks[0] > done[i] && sp->marks[0] < done[i] + len)
                len = sp->marks[0] - done[i];
            if (sp->want == ENGINE_LOGITS_ALL && len > LOGITS_CAP - n_logits - n_am) {
                len = LOGITS_CAP - n_logits - n_am;
                /* the chunked delta rule's bits depend on the chunk grid: the next pass must
                 * start on it, so the cut is the grid's (0 rows: the next pass takes it) */
                if (ce->gdn_chunk)
                    len = engine_piece_end(sp->anchors, sp->n_anchors, sp->n, done[i], len / CUDA_CHUNK * CUDA_CHUNK,
                                           CUDA_CHUNK) - done[i];
            }
            if (len <= 0 || n + len > R) continue; /* the next pass takes it */
            if ((sp->want == ENGINE_LOGITS_LAST || sp->want == ENGINE_LOGITS_ARGMAX) && done[i] + len == sp->n &&
                n_logits + n_am == LOGITS_CAP)
                continue;
            const int64_t pos0 = eng->seqs[sp->seq].pos + done[i];
            hk_piece *pc = &pieces[np];
            *pc = (hk_piece){.r0 = n, .n = len, .pos0 = pos0, .seq = sp->seq, .mark0 = nm};
            for (int k = 0; k < sp->n_marks; k++)
                if (sp->marks[k] > done[i] && sp->marks[k] <= done[i] + len) {
                    marks[nm] = (hk_mark){.m = sp->marks[k] - done[i], .slot = nm, .piece = np};
                    mark_point[nm++] = sp->points[k];
                    pc->n_marks++;
                }
            if (chunks) { /* chunks of CUDA_CHUNK rows from the piece's start, restarted at the anchors */
                pchunk[np] = nc;
                const bool anchor_skip = MUTANT("anchor_skip"); /* mutant: the chunks not restarted at anchors */
                int k = 0;
                for (int64_t c0 = 0, end; c0 < len; c0 = end) {
                    end = len - c0 < CUDA_CHUNK ? len : c0 + CUDA_CHUNK;
                    while (k < sp->n_anchors && sp->anchors[k] - done[i] <= c0) k++;
                    if (k < sp->n_anchors && sp->anchors[k] - done[i] < end && !anchor_skip) end = sp->anchors[k] - done[i];
                    chunks[nc++] = (hk_chunk){.piece = np, .c0 = (int32_t)c0, .n = (int32_t)(end - c0)};
                }
                pchunk[np + 1] = nc;
            }
            for (int64_t t0 = 0; t0 < len; t0 += qt)
                tiles[nt++] = (hk_qtile){.r0 = (int32_t)(n + t0), .n = (int32_t)(len - t0 < qt ? len - t0 : qt),
                                         .seq = sp->seq, .pos0 = pos0 + t0};
            for (int t = nt - (int)((len + qt - 1) / qt); t < nt; t++) n_one += tiles[t].n == 1;
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
                if (sp->want == ENGINE_LOGITS_ARGMAX && at == sp->n - 1) am_row[n_am] = (int32_t)r, am_tok[n_am++] = sp->token;
            }
            done[i] += len;
            n += len;
            np++;
        }
        if (n == 0) break;
        for (int64_t k = 0; k < n_am; k++) lrows[n_logits + k] = am_row[k]; /* after the rows copied out */
        if (stage_reserve(ce, nm, e) < 0 || hk_h2d_async(ce->st, ce->d_io, ce->h_io, ce->io.bytes, e) < 0) {
            rc = -1;
            break;
        }
        pass p = {.n = n, .n_logits = n_logits + n_am, .n_argmax = n_am, .n_pieces = np, .n_marks = nm, .n_tiles = nt, .n_one = n_one, .row_call = row_call,
                  .logit_row = logit_row, .mark_point = mark_point, .copy_lanes = nm > 0 && ce->pinned_points};
        /* the copy stream is waited for even when the pass failed: its copies read the staging
         * area and write the points, which must not move under it */
        const int prc = run_pass(ce, &p, e);
        if (prc < 0 || hk_stream_sync(ce->st, e) < 0 || hk_stream_sync(ce->cs, e) < 0) {
            if (prc < 0) {
                herr e2;
                hk_stream_sync(ce->cs, &e2);
            }
            rc = -1;
            break;
        }
        prof_collect(ce);
        if (n_logits) { /* the caller's rows from the pinned copy */
            int64_t k = 0;
            for (int64_t r = 0; r < n; r++)
                if (logit_row[r]) memcpy(logit_row[r], ce->h_logits + (size_t)(k++) * (size_t)V, sizeof(float) * (size_t)V);
        }
        for (int64_t k = 0; k < n_am; k++) *am_tok[k] = ce->h_tok[k];
        for (int i = 0; i < nm && rc == 0; i++) { /* the points of the pass, from the staging area */
            engine_point *pt = mark_point[i];
            const float *ring = ce->stage_rings + (size_t)i * ce->ring_floats * (size_t)ce->n_gdn;
            if (MUTANT("live_ring")) /* mutant: points taken from the live ring after the pass */
                ring = ce->rings + (size_t)pieces[marks[i].piece].seq * ce->ring_floats * (size_t)ce->n_gdn;
            if ((!p.copy_lanes && hk_d2h(pt->lanes, ce->stage_lanes + (size_t)i * ce->lane_floats * (size_t)ce->n_gdn,
                                         sizeof(float) * ce->lane_floats * (size_t)ce->n_gdn, e) < 0) ||
                hk_d2h(pt->rings, ring, sizeof(float) * ce->ring_floats * (size_t)ce->n_gdn, e) < 0)
                rc = -1;
        }
        if (rc < 0) break;
        eng->stats.n_passes++;
        eng->stats.n_rows += n;
        eng->stats.n_points += nm;
    }
    free(done), free(call0), free(row_call), free(logit_row), free(mark_point), free(am_row), free(am_tok);
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
    if (!MUTANT("restore_ring_skip")) /* mutant: restore copies the lanes, not the rings */
        hk_h2d(ce->rings + (size_t)seq * ce->ring_floats * (size_t)ce->n_gdn, p->rings,
               sizeof(float) * ce->ring_floats * (size_t)ce->n_gdn, &e);
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
    if (ce->prof) {
        prof_print(ce);
        for (int i = 0; i < PROF_EVENTS; i++) hk_event_free(ce->prof->ev[i]);
        free(ce->prof);
    }
    graphs_drop(ce);
    for (int i = 0; i < ce->n_wmem; i++) hk_free(ce->wmem[i]);
    void *bufs[] = {ce->lanes, ce->rings, ce->x, ce->h, ce->qkv, ce->cv, ce->z, ce->o, ce->gb, ce->ga, ce->qf, ce->k,
                    ce->v, ce->ao, ce->part, ce->rlog, ce->sgl, ce->wsel, ce->g, ce->u, ce->sg, ce->su, ce->eo, ce->so,
                    ce->logits, ce->d_tok, ce->am_scratch, ce->tickets, ce->sel, ce->offs, ce->list, ce->mtiles, ce->d_io, ce->stage_lanes,
                    ce->stage_rings, ce->gsc.w, ce->gsc.u, ce->gsc.qk, ce->gsc.g};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) hk_free(bufs[i]);
    hk_act *acts[] = {&ce->ax8k, &ce->ax80, &ce->ao8k, &ce->ao80, &ce->af8k, &ce->af80, &ce->as8k, &ce->as80};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) act_free(acts[i]);
    for (int i = 0; i < MODEL_MAX_LAYERS; i++) {
        hk_free(ce->kc[i]);
        hk_free(ce->vc[i]);
    }
    hk_host_free(ce->h_io);
    hk_host_free(ce->h_logits);
    hk_host_free(ce->h_tok);
    free(ce->h_sel);
    for (int i = 0; i < MODEL_MAX_LAYERS; i++) hk_event_free(ce->gdn_done[i]);
    hk_stream_free(ce->cs);
    hk_stream_free(ce->st);
    engine_fini(eng);
    free(ce);
}

/* point buffers in pinned host memory (the copy runs at the bus's rate, 1.2 ms a q36 point
 * against ~4 ms pageable, and can overlap the pass; bench/RESULTS.md); NULL (so calloc) when
 * pinning fails or is turned off */
static void *cuda_point_alloc(engine *eng, size_t bytes) {
    void *p = NULL;
    herr e;
    return ((cuda_engine *)eng)->pinned_points && hk_host_alloc(&p, bytes, &e) == 0 ? p : NULL;
}

static const engine_backend cuda_backend = {
    .argmax = true,
    .point_alloc = cuda_point_alloc,
    .point_dealloc = hk_host_free,
    .name = "cuda",
    .free = cuda_free,
    .run = cuda_run,
    .seq_clear = cuda_seq_clear,
    .save = cuda_save,
    .restore = cuda_restore,
    .kv_read = cuda_kv_read,
    .kv_write = cuda_kv_write,
};

int cuda_takes_model(const model *m, herr *e) {
    const model_hparams *hp = &m->hp;
    if (hp->ssm_d_state != 128)
        return herr_set(e, "the CUDA engine takes ssm_d_state 128, this model has %lld", (long long)hp->ssm_d_state);
    if (!hk_attn_tile_rows(hp->n_head / hp->n_head_kv, false) || (hp->head_dim != 128 && hp->head_dim != 256))
        return herr_set(e, "the CUDA engine takes head dims 128 or 256 and 1..32 query heads per KV head "
                        "(this model: %lld, %lld of %lld)", (long long)hp->head_dim, (long long)hp->n_head,
                        (long long)hp->n_head_kv);
    return 0;
}

int engine_open_cuda(engine **out, const model *m, const engine_opts *o, herr *e) {
    if (hcuda_device_count(e) <= 0) return herr_wrap(e, "--device cuda");
    if (cuda_takes_model(m, e) < 0) return herr_wrap(e, "--device cuda");
    const model_hparams *hp = &m->hp;
    cuda_engine *ce = xcalloc(1, sizeof *ce);
    engine *eng = &ce->base;
    if (engine_init(eng, &cuda_backend, m, o, e) < 0 || hk_stream_new(&ce->st, e) < 0 || hk_stream_new(&ce->cs, e) < 0) {
        cuda_free(eng);
        return -1;
    }
    for (int i = 0; i < MODEL_MAX_LAYERS; i++)
        if (hk_event_new_sync(&ce->gdn_done[i], e) < 0) {
            cuda_free(eng);
            return -1;
        }
    /* on the H200 (bench/RESULTS.md, 2026-12-05) two points added 21-23 ms to a 4096-row pass
     * copied after it from device to calloc'd memory, and -2..-10 ms (inside the noise) copied
     * to pinned memory layer by layer during it */
    const char *pin = getenv("HEARTH_CUDA_PINNED_POINTS");
    ce->pinned_points = !(pin && !strcmp(pin, "0"));
    const char *g = getenv("HEARTH_CUDA_GRAPHS"), *pr = getenv("HEARTH_CUDA_PROFILE");
    ce->no_graphs = g && !strcmp(g, "0") ? "off" : NULL;
    const char *pdl = getenv("HEARTH_CUDA_PDL"); /* 0: every kernel launched plainly (to measure what PDL buys) */
    hk_pdl(!(pdl && !strcmp(pdl, "0")));
    const char *gs = getenv("HEARTH_CUDA_GEMV_STAGE"); /* 1: one-row products staged (not yet the default) */
    hk_gemv_stage(gs && !strcmp(gs, "1"));
    const char *ft = getenv("HEARTH_CUDA_FM_TILE"); /* 0: float weights' prompt rows through the one-warp form */
    hk_fm_tile(!(ft && !strcmp(ft, "0")));
    const char *mf = getenv("HEARTH_CUDA_MMQ_NF"); /* 0: mmq.cuh's first form of the Q4_K / Q5_K block */
    hk_mmq_form(!(mf && !strcmp(mf, "0")));
    const char *aw = getenv("HEARTH_CUDA_ATTN_WHOLE"); /* 0: attn_mma.cuh's prompt kernel in pairs of warps; 4, 6: warps;
                                                         * 8 (the default): two warpgroups on wgmma (attn_wg.cuh) */
    char *aw_end = NULL;
    const long aw_n = aw && *aw ? strtol(aw, &aw_end, 10) : HK_ATTN_FORM_DEFAULT;
    if ((aw_end && *aw_end) || aw_n < 0 || aw_n > 8 || hk_attn_form((int)aw_n) < 0) {
        herr_set(e, "HEARTH_CUDA_ATTN_WHOLE=%s: 0 (pairs of warps), 4 or 6 (warps of the whole form), 8 (two warpgroups on wgmma)", aw);
        cuda_free(eng);
        return -1;
    }
    /* 1 (the default): a pass of few multi-row tiles (tiles x Hkv under the SM count: a short
     * prompt or tool result at depth) through the prompt kernel's split form (attn_mma.cuh),
     * the same bits; 0 never */
    const char *as = getenv("HEARTH_CUDA_ATTN_SPLIT");
    if (as && *as && strcmp(as, "0") && strcmp(as, "1")) {
        herr_set(e, "HEARTH_CUDA_ATTN_SPLIT=%s: 0 (never) or 1 (passes of few multi-row tiles)", as);
        cuda_free(eng);
        return -1;
    }
    hk_attn_split(as && !strcmp(as, "0") ? 0 : 1);
    const char *tm = getenv("HEARTH_CUDA_WG_TMA"); /* 0: the wgmma form's blocks by every thread's cp.async, not the copy engine */
    if (tm && *tm && strcmp(tm, "0") && strcmp(tm, "1") && strcmp(tm, "2")) {
        herr_set(e, "HEARTH_CUDA_WG_TMA=%s: 1 (the copy engine fetches the wgmma form's blocks, asked by one thread), 2 (asked by a "
                    "lane of each warp) or 0 (every thread's cp.async)", tm);
        cuda_free(eng);
        return -1;
    }
    hk_attn_tma(tm && *tm ? tm[0] - '0' : 1);
    const char *mo = getenv("HEARTH_CUDA_MMQ_OCC"); /* 0: mmq_kernel's registers uncapped (two blocks an SM at 64 rows) */
    hk_mmq_occ(!(mo && !strcmp(mo, "0")));
    const char *gw = getenv("HEARTH_CUDA_GDN_WIDE"); /* 0: the delta rule's state kernel always in 256 threads */
    hk_gdn_wide(gw && !strcmp(gw, "0") ? 0 : 1);
    const char *gc = getenv("HEARTH_CUDA_GDN_CHUNK");
    ce->gdn_chunk = !(gc && !strcmp(gc, "0"));
    const char *mt = getenv("HEARTH_CUDA_MOE_TILE");
    ce->moe_tile16 = mt && !strcmp(mt, "16");
    const char *fu = getenv("HEARTH_CUDA_FUSE");
    ce->fuse = FU_DEFAULT;
    if (fu && fuse_parts(fu, &ce->fuse, e) < 0) {
        cuda_free(eng);
        return -1;
    }
    if (pr && *pr && strcmp(pr, "0")) ce->prof = xcalloc(1, sizeof *ce->prof);
    ce->f16 = eng->opts.kv_f16;
    ce->R = CUDA_UBATCH + eng->opts.n_seq_max;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->is_recurrent[il]) ce->n_gdn++;
        else ce->n_attn++;
    }
    /* attention segments: 256 keys, or more on long contexts so that a row has at most 128
     * (HEARTH_CUDA_SEG: another base, a multiple of 32, for measuring; at most 256 a row).
     * bench/RESULTS.md has the sweep: 512 left decode at depth latency-bound (16 serial
     * blocks a CTA), 128 made the merge of 257 segments cost more than it saved at 32k. */
    const int64_t n_ctx = eng->opts.n_ctx;
    const char *sg = getenv("HEARTH_CUDA_SEG");
    const int64_t seg_env = sg ? atoll(sg) : 0, max_seg = seg_env > 0 ? 256 : 128;
    ce->seg = seg_env > 0 && seg_env % 32 == 0 ? seg_env : 256;
    if (n_ctx > max_seg * ce->seg) ce->seg = ((n_ctx + max_seg - 1) / max_seg + 31) / 32 * 32;
    ce->n_seg = (n_ctx + ce->seg - 1) / ce->seg;
    ce->lane_floats = (size_t)(hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state);
    ce->ring_floats = (size_t)((hp->ssm_d_conv - 1) * hp_conv_dim(hp));
    ce->kv_row = (size_t)(hp->n_head_kv * hp->head_dim);
    if (!hp->dense) ce->h_sel = xmalloc(sizeof(int32_t) * (size_t)(ce->R * hp->n_expert_used)); /* route traces */
    const int64_t R = ce->R;
    size_t at = 0;
    ce->io.ids = io_add(&at, 4 * (size_t)R);
    ce->io.row_seq = io_add(&at, 4 * (size_t)R);
    ce->io.row_piece = io_add(&at, 4 * (size_t)R);
    ce->io.lrows = io_add(&at, 4 * (size_t)R);
    ce->io.pos = io_add(&at, 8 * (size_t)R);
    ce->io.pieces = io_add(&at, sizeof(hk_piece) * (size_t)eng->opts.n_seq_max);
    ce->io.marks = io_add(&at, sizeof(hk_mark) * (size_t)R);
    ce->io.tiles = io_add(&at, sizeof(hk_qtile) * (size_t)R);
    if (ce->gdn_chunk) { /* at most one chunk a row */
        ce->io.chunks = io_add(&at, sizeof(hk_chunk) * (size_t)R);
        ce->io.pchunk = io_add(&at, sizeof(int32_t) * (size_t)(eng->opts.n_seq_max + 1));
    }
    ce->io.bytes = at;
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
    eng->info.act_f32 = false;
    *out = eng;
    return 0;
}
