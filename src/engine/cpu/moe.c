/* moe.c: the MoE FFN on the CPU: softmax router over X experts in f32, top-K, weights
 * renormalised to sum 1, SwiGLU for the chosen experts only (rows grouped per expert so
 * each expert's weights are read once per pass), and the shared expert scaled by
 * sigmoid(h . gate_inp_shexp). Expert outputs are summed in slot order, so the result
 * does not depend on how the work was split. */
#include "engine/cpu/cpu.h"
#include "format/quant.h"

#include <math.h>
#include <string.h>

typedef struct moe_ctx {
    const model_hparams *hp;
    const model_layer *L;
    int64_t n;
    const float *h2;      /* (n, E) */
    float *logits;        /* (n, X) router logits */
    int32_t *sel;         /* (n, K) chosen experts */
    float *wsel;          /* (n, K) their weights */
    float *g, *u;         /* (n*K + n, F or Fs): routed rows then the shared rows */
    uint8_t *aq;          /* quantized SwiGLU rows for the down projections */
    size_t aq_stride;
    uint32_t down_type, down_type_sh;
    float *eo;            /* (n*K, E) routed outputs, row t*K + slot */
    float *so;            /* (n, E) shared expert output */
    float *out;
    int64_t n_routed_rows;
} moe_ctx;

static void route_task(void *arg, int64_t r, int thread) {
    moe_ctx *c = arg;
    const int64_t X = c->hp->n_expert, K = c->hp->n_expert_used;
    {
        float *l = c->logits + r * X;
        float mx = -INFINITY, sum = 0;
        for (int64_t e = 0; e < X; e++) mx = l[e] > mx ? l[e] : mx;
        for (int64_t e = 0; e < X; e++) {
            l[e] = expf(l[e] - mx);
            sum += l[e];
        }
        for (int64_t e = 0; e < X; e++) l[e] /= sum;
        /* top-K by probability; ties go to the lower expert id */
        int32_t *sel = c->sel + r * K;
        float *w = c->wsel + r * K, wsum = 0;
        for (int64_t k = 0; k < K; k++) {
            int32_t best = -1;
            for (int64_t e = 0; e < X; e++) {
                bool taken = false;
                for (int64_t j = 0; j < k; j++) taken |= sel[j] == e;
                if (!taken && (best < 0 || l[e] > l[best])) best = (int32_t)e;
            }
            sel[k] = best;
            w[k] = l[best];
            wsum += w[k];
        }
        for (int64_t k = 0; k < K; k++) w[k] /= wsum;
    }
}

static void swiglu_task(void *arg, int64_t r, int thread) {
    moe_ctx *c = arg;
    const int64_t F = c->hp->n_ff_exp, Fs = c->hp->n_ff_shexp;
    {
        bool shared = r >= c->n_routed_rows;
        int64_t w = shared ? Fs : F;
        float *g = c->g + (shared ? c->n_routed_rows * F + (r - c->n_routed_rows) * Fs : r * F);
        const float *u = c->u + (shared ? c->n_routed_rows * F + (r - c->n_routed_rows) * Fs : r * F);
        for (int64_t i = 0; i < w; i++) g[i] = cpu_silu(g[i]) * u[i];
        quant_quantize_act(shared ? c->down_type_sh : c->down_type, g, c->aq + (size_t)r * c->aq_stride, w);
    }
}

static void combine_task(void *arg, int64_t r, int thread) {
    moe_ctx *c = arg;
    const int64_t E = c->hp->n_embd, K = c->hp->n_expert_used;
    const float *gs = c->L->ffn_gate_inp_shexp.data;
    {
        float *o = c->out + r * E;
        const float *h = c->h2 + r * E;
        float d = 0;
        for (int64_t i = 0; i < E; i++) d += h[i] * gs[i];
        const float sg = cpu_sigmoid(d);
        for (int64_t i = 0; i < E; i++) o[i] = 0;
        for (int64_t k = 0; k < K; k++) {
            const float w = c->wsel[r * K + k];
            const float *eo = c->eo + (r * K + k) * E;
            for (int64_t i = 0; i < E; i++) o[i] += w * eo[i];
        }
        const float *so = c->so + r * E;
        for (int64_t i = 0; i < E; i++) o[i] += sg * so[i];
    }
}

size_t cpu_moe_scratch(const model_hparams *hp, int64_t n) {
    const int64_t E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp, Fs = hp->n_ff_shexp;
    const size_t f = sizeof(float), i32 = sizeof(int32_t), i64 = sizeof(int64_t);
    const size_t act = quant_act_row_bytes(QT_F32, F > Fs ? F : Fs) + 64; /* the widest down activation row */
    return arena_round(f * (size_t)(n * X)) + 2 * arena_round(i32 * (size_t)(n * K)) + arena_round(f * (size_t)(n * K)) +
           arena_round(i64 * (size_t)(X + 1)) + arena_round(i32 * (size_t)(n * K)) + arena_round(i64 * (size_t)X) +
           cpu_act_scratch(n, E, 4) + 2 * arena_round(f * (size_t)(n * K * F + n * Fs)) +
           arena_round(sizeof(mm_job) * (size_t)(2 * X + 2)) + arena_round(act * (size_t)(n * K + n)) +
           arena_round(f * (size_t)(n * K * E)) + arena_round(f * (size_t)(n * E)) + cpu_jobs_scratch((int)(2 * X + 2)) +
           cpu_act_scratch(n, E, 1) + cpu_jobs_scratch(1); /* the router's matmul */
}

void cpu_moe_layer(cpu_engine *ce, int il, const cpu_batch *b, const float *h2, float *out) {
    const int64_t n = b->n;
    const model *m = ce->base.m;
    const model_hparams *hp = &m->hp;
    const model_layer *L = &m->layers[il];
    const int64_t E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp, Fs = hp->n_ff_shexp;
    moe_ctx c = {.hp = hp, .L = L, .n = n, .h2 = h2, .out = out, .n_routed_rows = n * K};
    c.logits = cpu_scratch(ce, sizeof(float) * (size_t)(n * X));
    c.sel = cpu_scratch(ce, sizeof(int32_t) * (size_t)(n * K));
    c.wsel = cpu_scratch(ce, sizeof(float) * (size_t)(n * K));
    cpu_matmul(ce, &L->ffn_gate_inp, h2, n, c.logits);
    pool_for(ce->pool, n, route_task, &c);
    if (ce->base.route_trace && il < hp->n_layer) /* tests compare routed expert choices: (row of the call, layer, K) */
        for (int64_t r = 0; r < n; r++)
            memcpy(ce->base.route_trace + (size_t)(b->row_call[r] * hp->n_layer + il) * (size_t)K, c.sel + r * K,
                   sizeof(int32_t) * (size_t)K);

    /* group the (row, slot) pairs by expert, rows ascending */
    int64_t *count = cpu_scratch(ce, sizeof(int64_t) * (size_t)(X + 1));
    memset(count, 0, sizeof(int64_t) * (size_t)(X + 1));
    for (int64_t i = 0; i < n * K; i++) count[c.sel[i] + 1]++;
    for (int64_t e = 0; e < X; e++) count[e + 1] += count[e]; /* count[e] = first gathered row of e */
    int32_t *in_rows = cpu_scratch(ce, sizeof(int32_t) * (size_t)(n * K));
    int32_t *slot_of = cpu_scratch(ce, sizeof(int32_t) * (size_t)(n * K));
    int64_t *fill = cpu_scratch(ce, sizeof(int64_t) * (size_t)X);
    memcpy(fill, count, sizeof(int64_t) * (size_t)X);
    for (int64_t r = 0; r < n; r++)
        for (int64_t k = 0; k < K; k++) {
            int64_t at = fill[c.sel[r * K + k]]++;
            in_rows[at] = (int32_t)r;
            slot_of[at] = (int32_t)(r * K + k);
        }

    /* gate and up for every used expert and the shared expert, in one parallel pass */
    act_cache ac = ACT_CACHE(h2, n, E); /* one quantization per vec-dot type: files may mix types */
    size_t xs_g, xs_u, xs_sg, xs_su;
    const uint8_t *xq_g = cpu_act(ce, &ac, L->ffn_gate_exps.type, &xs_g), *xq_u = cpu_act(ce, &ac, L->ffn_up_exps.type, &xs_u);
    const uint8_t *xq_sg = cpu_act(ce, &ac, L->ffn_gate_shexp.type, &xs_sg);
    const uint8_t *xq_su = cpu_act(ce, &ac, L->ffn_up_shexp.type, &xs_su);
    c.g = cpu_scratch(ce, sizeof(float) * (size_t)(n * K * F + n * Fs));
    c.u = cpu_scratch(ce, sizeof(float) * (size_t)(n * K * F + n * Fs));
    mm_job *jobs = cpu_scratch(ce, sizeof(mm_job) * (size_t)(2 * X + 2));
    int nj = 0;
    for (int64_t e = 0; e < X; e++) {
        int64_t cnt = count[e + 1] - count[e];
        if (!cnt) continue;
        jobs[nj++] = (mm_job){.w = &L->ffn_gate_exps, .slice = e, .xq = xq_g, .xq_stride = xs_g, .in_rows = in_rows + count[e],
                              .n = cnt, .y = c.g + count[e] * F, .y_stride = F};
        jobs[nj++] = (mm_job){.w = &L->ffn_up_exps, .slice = e, .xq = xq_u, .xq_stride = xs_u, .in_rows = in_rows + count[e],
                              .n = cnt, .y = c.u + count[e] * F, .y_stride = F};
    }
    jobs[nj++] = (mm_job){.w = &L->ffn_gate_shexp, .xq = xq_sg, .xq_stride = xs_sg, .n = n,
                          .y = c.g + n * K * F, .y_stride = Fs};
    jobs[nj++] = (mm_job){.w = &L->ffn_up_shexp, .xq = xq_su, .xq_stride = xs_su, .n = n,
                          .y = c.u + n * K * F, .y_stride = Fs};
    cpu_matmul_jobs(ce, jobs, nj);

    /* SwiGLU, quantized for the down projections */
    c.down_type = L->ffn_down_exps.type;
    c.down_type_sh = L->ffn_down_shexp.type;
    size_t as = cpu_act_bytes(c.down_type, F), as_sh = cpu_act_bytes(c.down_type_sh, Fs);
    c.aq_stride = as > as_sh ? as : as_sh;
    c.aq = cpu_scratch(ce, c.aq_stride * (size_t)(n * K + n));
    pool_for(ce->pool, n * K + n, swiglu_task, &c);

    c.eo = cpu_scratch(ce, sizeof(float) * (size_t)(n * K * E));
    c.so = cpu_scratch(ce, sizeof(float) * (size_t)(n * E));
    nj = 0;
    for (int64_t e = 0; e < X; e++) {
        int64_t cnt = count[e + 1] - count[e];
        if (!cnt) continue;
        jobs[nj++] = (mm_job){.w = &L->ffn_down_exps, .slice = e, .xq = c.aq + (size_t)count[e] * c.aq_stride,
                              .xq_stride = c.aq_stride, .n = cnt, .y = c.eo, .y_stride = E,
                              .out_rows = slot_of + count[e]};
    }
    jobs[nj++] = (mm_job){.w = &L->ffn_down_shexp, .xq = c.aq + (size_t)(n * K) * c.aq_stride, .xq_stride = c.aq_stride,
                          .n = n, .y = c.so, .y_stride = E};
    cpu_matmul_jobs(ce, jobs, nj);
    pool_for(ce->pool, n, combine_task, &c);
}

/* ---- qwen35's dense MLP: down(silu(gate h2) * up h2), a row at a time as the shared expert ---- */

typedef struct mlp_ctx {
    int64_t F;
    float *g;             /* (n, F) gate, then silu(gate) * up */
    const float *u;       /* (n, F) up */
    uint8_t *aq;          /* the rows quantized for the down projection */
    size_t aq_stride;
    uint32_t down_type;
} mlp_ctx;

static void mlp_swiglu_task(void *arg, int64_t r, int thread) {
    mlp_ctx *c = arg;
    float *g = c->g + r * c->F;
    const float *u = c->u + r * c->F;
    for (int64_t i = 0; i < c->F; i++) g[i] = cpu_silu(g[i]) * u[i];
    quant_quantize_act(c->down_type, g, c->aq + (size_t)r * c->aq_stride, c->F);
}

static size_t mlp_scratch(const model_hparams *hp, int64_t n) {
    const int64_t E = hp->n_embd, F = hp->n_ff;
    return cpu_act_scratch(n, E, 2) + 2 * arena_round(sizeof(float) * (size_t)(n * F)) + cpu_jobs_scratch(2) +
           arena_round(sizeof(mm_job) * 2) + arena_round((quant_act_row_bytes(QT_F32, F) + 64) * (size_t)n) + cpu_jobs_scratch(1) +
           arena_round(sizeof(mm_job));
}

static void mlp_layer(cpu_engine *ce, int il, const cpu_batch *b, const float *h2, float *out) {
    const int64_t n = b->n, E = ce->base.m->hp.n_embd, F = ce->base.m->hp.n_ff;
    const model_layer *L = &ce->base.m->layers[il];
    mlp_ctx c = {.F = F};
    act_cache ac = ACT_CACHE(h2, n, E);
    size_t xs_g, xs_u;
    const uint8_t *xq_g = cpu_act(ce, &ac, L->ffn_gate.type, &xs_g), *xq_u = cpu_act(ce, &ac, L->ffn_up.type, &xs_u);
    c.g = cpu_scratch(ce, sizeof(float) * (size_t)(n * F));
    float *u = cpu_scratch(ce, sizeof(float) * (size_t)(n * F));
    c.u = u;
    mm_job *jobs = cpu_scratch(ce, sizeof(mm_job) * 2);
    jobs[0] = (mm_job){.w = &L->ffn_gate, .xq = xq_g, .xq_stride = xs_g, .n = n, .y = c.g, .y_stride = F};
    jobs[1] = (mm_job){.w = &L->ffn_up, .xq = xq_u, .xq_stride = xs_u, .n = n, .y = u, .y_stride = F};
    cpu_matmul_jobs(ce, jobs, 2);
    c.down_type = L->ffn_down.type;
    c.aq_stride = cpu_act_bytes(c.down_type, F);
    c.aq = cpu_scratch(ce, c.aq_stride * (size_t)n);
    pool_for(ce->pool, n, mlp_swiglu_task, &c);
    mm_job *down = cpu_scratch(ce, sizeof(mm_job));
    *down = (mm_job){.w = &L->ffn_down, .xq = c.aq, .xq_stride = c.aq_stride, .n = n, .y = out, .y_stride = E};
    cpu_matmul_jobs(ce, down, 1);
}

size_t cpu_ffn_scratch(const model_hparams *hp, int64_t n) { return hp->dense ? mlp_scratch(hp, n) : cpu_moe_scratch(hp, n); }

void cpu_ffn_layer(cpu_engine *ce, int il, const cpu_batch *b, const float *h2, float *out) {
    if (ce->base.m->hp.dense) mlp_layer(ce, il, b, h2, out);
    else cpu_moe_layer(ce, il, b, h2, out);
}
