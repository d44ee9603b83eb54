/* gdn.c: the Gated DeltaNet layer on the CPU: projections, the causal conv over its ring,
 * L2 norms and gates, the delta rule in the chunked WY form, chunks laid from the start of
 * each span and restarted at its anchors (a decode row is a chunk of one row, so a step and a one-row prefill are the
 * same bits), the gated RMSNorm and out-projection.
 *
 * Chunk math (rows i, j inside one chunk; S0 the state before it; Gc the running sum of g):
 *   A_ij = beta_i (k_i . k_j) exp(Gc_i - Gc_j)             for j < i
 *   u_i  = beta_i v_i                 - sum_{j<i} A_ij u_j  (U = T (beta v), T = (I + A)^-1)
 *   w_i  = beta_i exp(Gc_i) k_i       - sum_{j<i} A_ij w_j  (W = T (beta exp(Gc) k))
 *   d_i  = u_i - w_i^T S0                                  (the delta of row i)
 *   o_i  = exp(Gc_i) S0^T q_i + sum_{j<=i} (q_i . k_j) exp(Gc_i - Gc_j) d_j
 *   S(r) = exp(Gc_r) S0 + sum_{j<=r} exp(Gc_r - Gc_j) k_j d_j^T   (state after row r)
 * Every row's quantities depend only on rows <= it, computed by loops that do not look at
 * the chunk's length, and S(r) is one function of the end row r: so the state at a mark
 * inside a chunk is, bit for bit, what a prefill ending there computes for its last,
 * partial chunk (DESIGN.md invariant 2), and the pass itself is unchanged by marks. */
#include "engine/cpu/cpu.h"
#include "format/quant.h"
#include "engine/mutant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the delta rule's two primitives, AVX2/FMA (gdn_avx2.c) after the CPU check or plain C;
 * either way one fixed order of operations per output element */
typedef struct gdn_ops {
    float (*dot)(const float *x, const float *y, int64_t n);
    void (*rows_acc)(float *y, const float *y0, float s0, const float *x, int64_t xs, const float *c, int64_t m,
                     int64_t n);
} gdn_ops;

typedef struct gdn_ctx {
    cpu_engine *ce;
    const model_hparams *hp;
    const model_layer *L;
    int il;
    const cpu_batch *bt;
    int64_t n;
    float *qkv;     /* (n, conv_dim) pre-conv rows */
    float *cv;      /* (n, conv_dim) conv + SiLU; q and k parts normalised in place */
    float *z;       /* (n, Vd) */
    float *b;       /* (n, Gv) beta after sigmoid */
    float *a;       /* (n, Gv) g (log decay) */
    float *o;       /* (n, Vd) delta-rule output, then gated-normed */
    int64_t gdn_index;
    float *thread_scratch;
    size_t thread_scratch_floats;
    gdn_ops ops;
} gdn_ctx;

/* pre-conv row x of the concatenation [ring; qkv] of row r's piece (j = 0..d_conv-1,
 * j = d_conv-1 is row r itself): a piece's rows are consecutive pass rows. */
static const float *conv_input_row(const gdn_ctx *c, int64_t r, int64_t j) {
    const int64_t dc = c->hp->ssm_d_conv, cd = hp_conv_dim(c->hp);
    const cpu_piece *pc = &c->bt->pieces[c->bt->row_piece[r]];
    const int64_t idx = r - pc->r0 - (dc - 1) + j; /* index into the piece's rows; negative reaches into the ring */
    if (idx >= 0) return c->qkv + (pc->r0 + idx) * cd;
    if (MUTANT("neighbour_leak") && pc->r0 + idx >= 0) /* mutant: the rows before a piece are its neighbour's */
        return c->qkv + (pc->r0 + idx) * cd;
    return pc->s->ring[c->il] + (idx + dc - 1) * cd;
}

static void conv_task(void *arg, int64_t r, int thread) {
    gdn_ctx *c = arg;
    const int64_t dc = c->hp->ssm_d_conv, cd = hp_conv_dim(c->hp);
    const float *w = c->L->ssm_conv1d.data; /* (conv_dim, d_conv): tap j of channel ch at ch*dc + j */
    {
        float *y = c->cv + r * cd;
        const float *x[16];
        for (int64_t j = 0; j < dc; j++) x[j] = conv_input_row(c, r, j);
        for (int64_t ch = 0; ch < cd; ch++) {
            float s = 0;
            for (int64_t j = 0; j < dc; j++) s += w[ch * dc + j] * x[j][ch];
            y[ch] = cpu_silu(s);
        }
    }
}

/* L2-normalise q and k per key head (x * rsqrt(sum x^2 + eps), as HF and llama.cpp do),
 * scale q by 1/sqrt(S); gates per value head. */
static void norm_gate_task(void *arg, int64_t r, int thread) {
    gdn_ctx *c = arg;
    const model_hparams *hp = c->hp;
    const int64_t S = hp->ssm_d_state, Gk = hp->ssm_n_group, Gv = hp->ssm_dt_rank, cd = hp_conv_dim(hp);
    const float eps = hp->rms_eps, qscale = 1.0f / sqrtf((float)S);
    const float *ssm_a = c->L->ssm_a.data, *dt = c->L->ssm_dt.data;
    {
        float *row = c->cv + r * cd;
        for (int64_t hk = 0; hk < 2 * Gk; hk++) { /* q heads then k heads */
            float *x = row + hk * S;
            float ss = 0;
            for (int64_t i = 0; i < S; i++) ss += x[i] * x[i];
            float sc = 1.0f / sqrtf(ss + eps);
            if (hk < Gk) sc *= qscale;
            for (int64_t i = 0; i < S; i++) x[i] *= sc;
        }
        for (int64_t h = 0; h < Gv; h++) {
            c->b[r * Gv + h] = cpu_sigmoid(c->b[r * Gv + h]);
            c->a[r * Gv + h] = ssm_a[h] * cpu_softplus(c->a[r * Gv + h] + dt[h]);
        }
    }
}

static float dotf_c(const float *x, const float *y, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

/* y[b] = s0 * y0[b] (0 when y0 is NULL) + sum_{j<m} c[j] * x[j * xs + b]: the plain C form,
 * term by term like a chain of axpys; y may be y0 */
static void rows_acc_c(float *y, const float *y0, float s0, const float *x, int64_t xs, const float *c, int64_t m,
                       int64_t n) {
    for (int64_t b = 0; b < n; b++) y[b] = y0 ? s0 * y0[b] : 0.0f;
    for (int64_t j = 0; j < m; j++)
        for (int64_t b = 0; b < n; b++) y[b] += c[j] * x[j * xs + b];
}

static gdn_ops gdn_ops_pick(void) {
    if (quant_simd_active()) return (gdn_ops){cpu_gdn_dot_avx2, cpu_gdn_rows_acc_avx2};
    return (gdn_ops){dotf_c, rows_acc_c};
}

/* The state after end row r of a chunk (see the header): dst may be S0 itself. */
static void chunk_end_state(const gdn_ops *ops, const float *S0, float *dst, int64_t S, const float *const *k,
                            const float *d, const float *Gc, int64_t r, bool for_point) {
    const float gl = Gc[r];
    /* mutant: a point's copy forgets the decay of the state before its chunk */
    const float decay = for_point && MUTANT("decay_skip") ? 1.0f : expf(gl);
    float coef[CPU_CHUNK], cf[CPU_CHUNK];
    for (int64_t j = 0; j <= r; j++) coef[j] = expf(gl - Gc[j]);
    for (int64_t a = 0; a < S; a++) {
        for (int64_t j = 0; j <= r; j++) cf[j] = coef[j] * k[j][a];
        ops->rows_acc(dst + a * S, S0 + a * S, decay, d, S, cf, r + 1, S);
    }
}

static void delta_chunked_head(gdn_ctx *c, const cpu_piece *pc, int64_t h, float *scratch) {
    const model_hparams *hp = c->hp;
    const int64_t S = hp->ssm_d_state, Gk = hp->ssm_n_group, Gv = hp->ssm_dt_rank, cd = hp_conv_dim(hp);
    const int64_t hk = h % Gk; /* GGUF's tiled V heads: value head h reads key head h % Gk */
    float *St = pc->s->lane[c->il] + h * S * S;
    float *Gc = scratch;                 /* C */
    float *u = Gc + CPU_CHUNK;           /* (C, S) */
    float *w = u + CPU_CHUNK * S;        /* (C, S) */
    float *d = w + CPU_CHUNK * S;        /* (C, S) */
    float *A = d + CPU_CHUNK * S;        /* (C, C): -A, the coefficients of the solve */
    float *cv = A + CPU_CHUNK * CPU_CHUNK; /* S: one row's coefficients */
    const gdn_ops *ops = &c->ops;
    const float *q[CPU_CHUNK], *k[CPU_CHUNK], *v[CPU_CHUNK];
    int ai = 0;
    for (int64_t c0 = 0, L; c0 < pc->n; c0 += L) {
        /* the chunk ends after CPU_CHUNK rows, at the piece's end or at the next anchor */
        int64_t end = pc->n - c0 < CPU_CHUNK ? pc->n : c0 + CPU_CHUNK;
        while (ai < pc->n_anchors && pc->anchors[ai] <= c0) ai++;
        if (ai < pc->n_anchors && pc->anchors[ai] < end && !MUTANT("anchor_skip")) end = pc->anchors[ai];
        L = end - c0;
        const int64_t rb = pc->r0 + c0; /* pass row of the chunk */
        for (int64_t i = 0; i < L; i++) {
            const float *row = c->cv + (rb + i) * cd;
            q[i] = row + hk * S;
            k[i] = row + Gk * S + hk * S;
            v[i] = row + 2 * Gk * S + h * S;
        }
        float g = 0;
        for (int64_t i = 0; i < L; i++) {
            g += c->a[(rb + i) * Gv + h];
            Gc[i] = g;
        }
        for (int64_t i = 0; i < L; i++) {
            const float beta = c->b[(rb + i) * Gv + h];
            float *nA = A + i * CPU_CHUNK;
            for (int64_t j = 0; j < i; j++) nA[j] = -(beta * ops->dot(k[i], k[j], S) * expf(Gc[i] - Gc[j]));
            float *ui = u + i * S, *wi = w + i * S;
            const float eg = expf(Gc[i]);
            ops->rows_acc(ui, v[i], beta, u, S, nA, i, S);
            ops->rows_acc(wi, k[i], beta * eg, w, S, nA, i, S);
            /* d_i = u_i - w_i^T S0 */
            float *di = d + i * S;
            for (int64_t a = 0; a < S; a++) cv[a] = -wi[a];
            ops->rows_acc(di, ui, 1.0f, St, S, cv, S, S);
            /* o_i = exp(Gc_i) S0^T q_i + sum_{j<=i} (q_i . k_j) exp(Gc_i - Gc_j) d_j */
            float *oi = c->o + (rb + i) * hp_value_dim(hp) + h * S;
            for (int64_t a = 0; a < S; a++) cv[a] = eg * q[i][a];
            ops->rows_acc(oi, NULL, 0.0f, St, S, cv, S, S);
            for (int64_t j = 0; j <= i; j++) cv[j] = ops->dot(q[i], k[j], S) * expf(Gc[i] - Gc[j]);
            ops->rows_acc(oi, oi, 1.0f, d, S, cv, i + 1, S);
        }
        /* points whose end row falls in this chunk, from the state before it */
        const double tp0 = pc->n_marks ? time_now() : 0;
        for (int mi = 0; mi < pc->n_marks; mi++) {
            int64_t m = pc->marks[mi].m;
            if (MUTANT("copy_late")) m += 1;
            if (m <= c0 || m > c0 + L) continue;
            float *dst = pc->marks[mi].p->lanes + (size_t)c->gdn_index * pc->marks[mi].p->lane_floats + (size_t)(h * S * S);
            if (MUTANT("copy_early_decay")) { /* a lane copied before the decay of its last chunk */
                memcpy(dst, St, sizeof(float) * (size_t)(S * S));
                continue;
            }
            if (MUTANT("point_inplace")) { /* mutant: the point computed on the live state, then copied */
                chunk_end_state(ops, St, St, S, k, d, Gc, m - 1 - c0, true);
                memcpy(dst, St, sizeof(float) * (size_t)(S * S));
                continue;
            }
            chunk_end_state(ops, St, dst, S, k, d, Gc, m - 1 - c0, true);
        }
        if (pc->n_marks) atomic_fetch_add(&c->ce->point_ns, (int64_t)((time_now() - tp0) * 1e9));
        chunk_end_state(ops, St, St, S, k, d, Gc, L - 1, false);
    }
}

/* task: a (piece, value head) pair, all rows of the piece */
static void delta_task(void *arg, int64_t t, int thread) {
    gdn_ctx *c = arg;
    const int64_t Gv = c->hp->ssm_dt_rank;
    float *scratch = c->thread_scratch + (size_t)thread * c->thread_scratch_floats;
    delta_chunked_head(c, &c->bt->pieces[t / Gv], t % Gv, scratch);
}

/* per head: RMSNorm over S with ssm_norm, times SiLU(z) */
static void gated_norm_task(void *arg, int64_t t, int thread) {
    gdn_ctx *c = arg;
    const int64_t S = c->hp->ssm_d_state, Gv = c->hp->ssm_dt_rank, Vd = hp_value_dim(c->hp);
    const float *nw = c->L->ssm_norm.data;
    {
        int64_t r = t / Gv, h = t % Gv;
        float *o = c->o + r * Vd + h * S;
        const float *z = c->z + r * Vd + h * S;
        cpu_rmsnorm(o, nw, o, S, c->hp->rms_eps);
        for (int64_t i = 0; i < S; i++) o[i] *= cpu_silu(z[i]);
    }
}

/* Ring points and the ring update: the ring keeps the last d_conv-1 pre-conv rows. In the
 * concatenation X = [ring; piece rows], the state after row m-1 keeps X(m..m+dc-2). */
static void ring_points_and_update(gdn_ctx *c, float *nr) {
    const int64_t dc = c->hp->ssm_d_conv, cd = hp_conv_dim(c->hp);
    const size_t row_bytes = sizeof(float) * (size_t)cd;
    for (int pi = 0; pi < c->bt->n_pieces; pi++) {
        const cpu_piece *pc = &c->bt->pieces[pi];
        const double tp0 = pc->n_marks ? time_now() : 0;
        for (int mi = 0; mi < pc->n_marks; mi++) {
            if (MUTANT("ring_skip")) continue;
            const int64_t m = pc->marks[mi].m;
            float *dst = pc->marks[mi].p->rings + (size_t)c->gdn_index * pc->marks[mi].p->ring_floats;
            for (int64_t j = 0; j < dc - 1; j++) memcpy(dst + j * cd, conv_input_row(c, pc->r0 + m - 1, j + 1), row_bytes);
        }
        if (pc->n_marks) atomic_fetch_add(&c->ce->point_ns, (int64_t)((time_now() - tp0) * 1e9));
        /* new ring = X(n..n+dc-2); rows may come from the old ring when n < dc-1 */
        float *ring = pc->s->ring[c->il];
        for (int64_t j = 0; j < dc - 1; j++) memcpy(nr + j * cd, conv_input_row(c, pc->r0 + pc->n - 1, j + 1), row_bytes);
        if (MUTANT("ring_reverse") && pc->n >= CPU_UBATCH) /* mutant: the ring handed to the next pass in reverse order */
            for (int64_t j = 0; j < dc - 1; j++) memcpy(ring + j * cd, nr + (dc - 2 - j) * cd, row_bytes);
        else
            memcpy(ring, nr, row_bytes * (size_t)(dc - 1));
        if (MUTANT("live_ring")) /* points taken from the live ring after the pass */
            for (int mi = 0; mi < pc->n_marks; mi++)
                memcpy(pc->marks[mi].p->rings + (size_t)c->gdn_index * pc->marks[mi].p->ring_floats, ring,
                       row_bytes * (size_t)(dc - 1));
    }
}

/* the thread scratch of the chunked delta rule: Gc, u, w, d, A, one row's coefficients */
static size_t delta_thread_floats(int64_t S) {
    return (size_t)(CPU_CHUNK + 3 * CPU_CHUNK * S + CPU_CHUNK * CPU_CHUNK + (S > CPU_CHUNK ? S : CPU_CHUNK));
}

size_t cpu_gdn_scratch(const model_hparams *hp, int64_t n, int nth) {
    const int64_t cd = hp_conv_dim(hp), Vd = hp_value_dim(hp), Gv = hp->ssm_dt_rank, E = hp->n_embd;
    size_t b = 2 * arena_round(sizeof(float) * (size_t)(n * cd)) + 2 * arena_round(sizeof(float) * (size_t)(n * Vd)) +
               2 * arena_round(sizeof(float) * (size_t)(n * Gv)) +
               arena_round(sizeof(float) * delta_thread_floats(hp->ssm_d_state) * (size_t)nth) +
               arena_round(sizeof(float) * (size_t)((hp->ssm_d_conv - 1) * cd));
    size_t proj = cpu_act_scratch(n, E, 4) + cpu_jobs_scratch(4), out = cpu_act_scratch(n, Vd, 1) + cpu_jobs_scratch(1);
    return b + (proj > out ? proj : out);
}

void cpu_gdn_layer(cpu_engine *ce, int il, const cpu_batch *b, const float *h, float *out, int64_t gdn_index) {
    const model *m = ce->base.m;
    const model_hparams *hp = &m->hp;
    const model_layer *L = &m->layers[il];
    const int64_t cd = hp_conv_dim(hp), Vd = hp_value_dim(hp), Gv = hp->ssm_dt_rank, n = b->n;
    gdn_ctx c = {.ce = ce, .hp = hp, .L = L, .il = il, .bt = b, .n = n, .gdn_index = gdn_index};
    c.qkv = cpu_scratch(ce, sizeof(float) * (size_t)(n * cd));
    c.cv = cpu_scratch(ce, sizeof(float) * (size_t)(n * cd));
    c.z = cpu_scratch(ce, sizeof(float) * (size_t)(n * Vd));
    c.b = cpu_scratch(ce, sizeof(float) * (size_t)(n * Gv));
    c.a = cpu_scratch(ce, sizeof(float) * (size_t)(n * Gv));
    c.o = cpu_scratch(ce, sizeof(float) * (size_t)(n * Vd));
    c.thread_scratch_floats = delta_thread_floats(hp->ssm_d_state);
    c.ops = gdn_ops_pick();
    c.thread_scratch = cpu_scratch(ce, sizeof(float) * c.thread_scratch_floats * (size_t)ce->nth);
    float *nr = cpu_scratch(ce, sizeof(float) * (size_t)((hp->ssm_d_conv - 1) * cd));

    /* projections: one pass over all four weights, activations quantized per vec-dot type */
    const qtensor *ws[4] = {&L->attn_qkv, &L->attn_gate, &L->ssm_beta, &L->ssm_alpha};
    float *ys[4] = {c.qkv, c.z, c.b, c.a};
    cpu_project(ce, h, n, ws, ys, 4);

    pool_for(ce->pool, n, conv_task, &c);
    ring_points_and_update(&c, nr);
    pool_for(ce->pool, n, norm_gate_task, &c);
    pool_for(ce->pool, (int64_t)b->n_pieces * Gv, delta_task, &c);
    pool_for(ce->pool, n * Gv, gated_norm_task, &c);
    cpu_matmul(ce, &L->ssm_out, c.o, n, out);
}
