/* attn.c: the gated full-attention layer on the CPU: the joint query+gate projection
 * (interleaved per head), K and V, per-head RMS norms of q and k, partial NeoX RoPE,
 * causal softmax attention over the sequence's KV rows (GQA), the sigmoid output gate and
 * the out-projection. KV rows are stored f32 or f16. */
#include "engine/cpu/cpu.h"
#include "format/quant.h"

#include <math.h>
#include <string.h>

#define ATTN_HEADS 4 /* query heads per SIMD call (they share each key and value row) */
#define ATTN_ROWS 8  /* consecutive rows of a sequence per SIMD call (they share them too; 8, not 4: +8-11%
                        * in a harness at 8,192 keys, where the kernel waits on the rows it streams) */

typedef struct attn_ctx {
    const model_hparams *hp;
    const model_layer *L;
    int il;
    bool kv_f16;
    cpu_seq *const *seqs;
    const int64_t *pos;
    int64_t n;
    float *qf;   /* (n, 2*H*D): per head [query D | gate D] */
    float *k;    /* (n, Hkv*D) */
    float *v;    /* (n, Hkv*D) */
    float *ao;   /* (n, H*D) */
    float *thread_scores; /* (nth, thread_floats) */
    int64_t n_ctx, thread_floats;
    int64_t heads_per_task, chunks; /* query heads of a GQA group per task, tasks per (tile, KV head) */
    int64_t n_tiles, *tile0;        /* tiles of up to ATTN_ROWS rows of one sequence at consecutive
                                     * positions (the SIMD path; else a row each): rows [tile0[t], tile0[t + 1]) */
    bool simd;
} attn_ctx;

/* NeoX pairing on the first rope_dims dims: (x_i, x_{i+rope_dims/2}) rotates by
 * pos * theta^(-2i/rope_dims). For text, every MRoPE section carries the same position. */
static void rope_neox(float *x, int64_t rope_dims, int64_t pos, float theta) {
    const int64_t half = rope_dims / 2;
    for (int64_t i = 0; i < half; i++) {
        double ang = (double)pos * pow((double)theta, -2.0 * (double)i / (double)rope_dims);
        float c = (float)cos(ang), s = (float)sin(ang);
        float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x0 * s + x1 * c;
    }
}

static void kv_store(bool kv_f16, int64_t pos, const float *src, void *base, int64_t width) {
    if (kv_f16) {
        f16_t *dst = (f16_t *)base + pos * width;
        for (int64_t i = 0; i < width; i++) dst[i] = f32_to_f16(src[i]);
    } else {
        memcpy((float *)base + pos * width, src, sizeof(float) * (size_t)width);
    }
}

static void prep_task(void *arg, int64_t r, int thread) {
    attn_ctx *c = arg;
    const model_hparams *hp = c->hp;
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const float *qn = c->L->attn_q_norm.data, *kn = c->L->attn_k_norm.data;
    {
        for (int64_t h = 0; h < H; h++) {
            float *q = c->qf + r * 2 * H * D + h * 2 * D;
            cpu_rmsnorm(q, qn, q, D, hp->rms_eps);
            rope_neox(q, hp->rope_dims, c->pos[r], hp->rope_theta);
        }
        for (int64_t h = 0; h < Hkv; h++) {
            float *k = c->k + r * Hkv * D + h * D;
            cpu_rmsnorm(k, kn, k, D, hp->rms_eps);
            rope_neox(k, hp->rope_dims, c->pos[r], hp->rope_theta);
        }
        cpu_seq *s = c->seqs[r];
        kv_store(c->kv_f16, c->pos[r], c->k + r * Hkv * D, s->k[c->il], Hkv * D);
        kv_store(c->kv_f16, c->pos[r], c->v + r * Hkv * D, s->v[c->il], Hkv * D);
    }
}

/* the plain C path, one head at a time: scores, softmax, weighted sum of value rows */
static void attend_head_c(const attn_ctx *c, const cpu_seq *s, int64_t hk, const float *q, int64_t n_keys, float *sc,
                          float *o) {
    const int64_t Hkv = c->hp->n_head_kv, D = c->hp->head_dim;
    const float scale = 1.0f / sqrtf((float)D);
    float *kbuf = sc + c->n_ctx; /* one converted row when KV is f16 */
    float mx = -INFINITY;
    for (int64_t j = 0; j < n_keys; j++) {
        const float *kr;
        if (c->kv_f16) {
            const f16_t *k16 = (const f16_t *)s->k[c->il] + j * Hkv * D + hk * D;
            for (int64_t i = 0; i < D; i++) kbuf[i] = f16_to_f32(k16[i]);
            kr = kbuf;
        } else {
            kr = (const float *)s->k[c->il] + j * Hkv * D + hk * D;
        }
        float d = 0;
        for (int64_t i = 0; i < D; i++) d += q[i] * kr[i];
        sc[j] = d * scale;
        if (sc[j] > mx) mx = sc[j];
    }
    float sum = 0;
    for (int64_t j = 0; j < n_keys; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    const float inv = 1.0f / sum;
    memset(o, 0, sizeof(float) * (size_t)D);
    for (int64_t j = 0; j < n_keys; j++) {
        const float p = sc[j] * inv;
        if (c->kv_f16) {
            const f16_t *v16 = (const f16_t *)s->v[c->il] + j * Hkv * D + hk * D;
            for (int64_t i = 0; i < D; i++) o[i] += p * f16_to_f32(v16[i]);
        } else {
            const float *vr = (const float *)s->v[c->il] + j * Hkv * D + hk * D;
            for (int64_t i = 0; i < D; i++) o[i] += p * vr[i];
        }
    }
}

/* task: (tile, KV head, chunk of up to ATTN_HEADS query heads of its group). The SIMD
 * kernels give each head the same bits however many heads and rows share a call. */
static void attend_task(void *arg, int64_t t, int thread) {
    attn_ctx *c = arg;
    const model_hparams *hp = c->hp;
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, group = H / Hkv;
    const int64_t ti = t / (Hkv * c->chunks), hk = t / c->chunks % Hkv, h0 = hk * group + t % c->chunks * c->heads_per_task;
    const int64_t nh = group - (h0 - hk * group) < c->heads_per_task ? group - (h0 - hk * group) : c->heads_per_task;
    const int64_t r0 = c->tile0[ti], nr = c->tile0[ti + 1] - r0;
    const cpu_seq *s = c->seqs[r0];
    float *sc = c->thread_scores + (size_t)thread * (size_t)c->thread_floats;
    const float *q = c->qf + r0 * 2 * H * D + h0 * 2 * D;
    float *o = c->ao + r0 * H * D + h0 * D;
    if (c->simd) {
        const size_t esz = c->kv_f16 ? 2 : 4;
        const uint8_t *kb = (const uint8_t *)s->k[c->il] + (size_t)(hk * D) * esz;
        const uint8_t *vb = (const uint8_t *)s->v[c->il] + (size_t)(hk * D) * esz;
        const float scale = 1.0f / sqrtf((float)D);
        int64_t n_keys[ATTN_ROWS];
        for (int64_t r = 0; r < nr; r++) n_keys[r] = c->pos[r0 + r] + 1;
        const int64_t stride = c->pos[r0 + nr - 1] + 1;
        cpu_attend_rows_avx2((int)nr, (int)nh, q, 2 * H * D, 2 * D, kb, vb, c->kv_f16, Hkv * D, n_keys, D, scale, sc, stride,
                             sc + nr * nh * stride, o, H * D, D);
    } else {
        for (int64_t g = 0; g < nh; g++) attend_head_c(c, s, hk, q + g * 2 * D, c->pos[r0] + 1, sc, o + g * D);
    }
    for (int64_t r = 0; r < nr; r++)
        for (int64_t g = 0; g < nh; g++) {
            const float *gate = q + r * 2 * H * D + g * 2 * D + D;
            float *og = o + r * H * D + g * D;
            for (int64_t i = 0; i < D; i++) og[i] *= cpu_sigmoid(gate[i]);
        }
}

/* the rows in tiles: up to ATTN_ROWS consecutive rows of one sequence at consecutive
 * positions where the SIMD kernel serves, else one row each; returns the count, tile0[n]
 * closes the last */
static int64_t attn_tiles(const attn_ctx *c, int64_t *tile0) {
    int64_t nt = 0;
    for (int64_t r = 0; r < c->n; r++) {
        const int64_t t0 = nt ? tile0[nt - 1] : 0;
        const bool joins = nt && c->simd && r - t0 < ATTN_ROWS && c->seqs[r] == c->seqs[r - 1] && c->pos[r] == c->pos[r - 1] + 1;
        if (!joins) tile0[nt++] = r;
    }
    tile0[nt] = c->n;
    return nt;
}

/* heads of a group per task: up to ATTN_HEADS, fewer when rows are few (decode) so every
 * thread gets work (n: rows; tiles of ATTN_ROWS count as their rows here, so a short prompt
 * may split its heads where its tiles alone would not feed every thread) */
static int64_t heads_per_task(const model_hparams *hp, int64_t n, int nth) {
    const int64_t group = hp->n_head / hp->n_head_kv;
    int64_t hpt = group < ATTN_HEADS ? group : ATTN_HEADS;
    while (hpt > 1 && n * hp->n_head_kv * ((group + hpt - 1) / hpt) < 2 * nth) hpt /= 2;
    return hpt;
}

/* per thread: scores of a task's rows and heads and their partial sums (SIMD), or one head's
 * scores and one f16-converted key row */
static int64_t thread_floats(const model_hparams *hp, int64_t hpt, int64_t n_ctx, bool simd) {
    return simd ? ATTN_ROWS * hpt * (n_ctx + hp->head_dim) : n_ctx + hp->head_dim;
}

static bool attn_simd(const model_hparams *hp) { return quant_simd_active() && hp->head_dim % 16 == 0; }

size_t cpu_attn_scratch(const model_hparams *hp, int64_t n, int64_t n_ctx, int nth) {
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, E = hp->n_embd;
    size_t b = arena_round(sizeof(float) * (size_t)(n * 2 * H * D)) + 2 * arena_round(sizeof(float) * (size_t)(n * Hkv * D)) +
               arena_round(sizeof(float) * (size_t)(n * H * D));
    int64_t tf = thread_floats(hp, ATTN_HEADS, n_ctx, true), tf2 = thread_floats(hp, 1, n_ctx, false);
    b += arena_round(sizeof(float) * (size_t)(tf > tf2 ? tf : tf2) * (size_t)nth) + arena_round(sizeof(int64_t) * (size_t)(n + 1));
    size_t proj = cpu_act_scratch(n, E, 3) + cpu_jobs_scratch(3), out = cpu_act_scratch(n, H * D, 1) + cpu_jobs_scratch(1);
    return b + (proj > out ? proj : out);
}

/* K and V of rows h (normed, roped) stored at the rows' positions, nothing else: the MTP
 * block's rows of a pass, which later rows attend to but whose outputs nothing reads */
static void kv_only_task(void *arg, int64_t r, int thread) {
    attn_ctx *c = arg;
    const model_hparams *hp = c->hp;
    const int64_t Hkv = hp->n_head_kv, D = hp->head_dim;
    for (int64_t h = 0; h < Hkv; h++) {
        float *k = c->k + r * Hkv * D + h * D;
        cpu_rmsnorm(k, c->L->attn_k_norm.data, k, D, hp->rms_eps);
        rope_neox(k, hp->rope_dims, c->pos[r], hp->rope_theta);
    }
    cpu_seq *s = c->seqs[r];
    kv_store(c->kv_f16, c->pos[r], c->k + r * Hkv * D, s->k[c->il], Hkv * D);
    kv_store(c->kv_f16, c->pos[r], c->v + r * Hkv * D, s->v[c->il], Hkv * D);
}

void cpu_attn_kv(cpu_engine *ce, int il, const cpu_batch *b, const float *h) {
    const model_hparams *hp = &ce->base.m->hp;
    const model_layer *L = &ce->base.m->layers[il];
    const int64_t Hkv = hp->n_head_kv, D = hp->head_dim, n = b->n;
    attn_ctx c = {.hp = hp, .L = L, .il = il, .kv_f16 = ce->kv_f16, .seqs = b->row_seq, .pos = b->pos, .n = n};
    c.k = cpu_scratch(ce, sizeof(float) * (size_t)(n * Hkv * D));
    c.v = cpu_scratch(ce, sizeof(float) * (size_t)(n * Hkv * D));
    const qtensor *ws[2] = {&L->attn_k, &L->attn_v};
    float *ys[2] = {c.k, c.v};
    cpu_project(ce, h, n, ws, ys, 2);
    pool_for(ce->pool, n, kv_only_task, &c);
}

void cpu_attn_layer(cpu_engine *ce, int il, const cpu_batch *b, const float *h, float *out) {
    const model *m = ce->base.m;
    const model_hparams *hp = &m->hp;
    const model_layer *L = &m->layers[il];
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, n = b->n;
    attn_ctx c = {.hp = hp, .L = L, .il = il, .kv_f16 = ce->kv_f16, .seqs = b->row_seq, .pos = b->pos, .n = n};
    c.qf = cpu_scratch(ce, sizeof(float) * (size_t)(n * 2 * H * D));
    c.k = cpu_scratch(ce, sizeof(float) * (size_t)(n * Hkv * D));
    c.v = cpu_scratch(ce, sizeof(float) * (size_t)(n * Hkv * D));
    c.ao = cpu_scratch(ce, sizeof(float) * (size_t)(n * H * D));
    const int64_t group = H / Hkv;
    c.heads_per_task = heads_per_task(hp, n, ce->nth);
    c.chunks = (group + c.heads_per_task - 1) / c.heads_per_task;
    c.simd = attn_simd(hp);
    c.n_ctx = ce->base.opts.n_ctx;
    c.thread_floats = thread_floats(hp, c.heads_per_task, c.n_ctx, c.simd);
    c.thread_scores = cpu_scratch(ce, sizeof(float) * (size_t)c.thread_floats * (size_t)ce->nth);
    c.tile0 = cpu_scratch(ce, sizeof(int64_t) * (size_t)(n + 1));

    const qtensor *ws[3] = {&L->attn_q, &L->attn_k, &L->attn_v};
    float *ys[3] = {c.qf, c.k, c.v};
    cpu_project(ce, h, n, ws, ys, 3);
    pool_for(ce->pool, n, prep_task, &c);
    c.n_tiles = attn_tiles(&c, c.tile0);
    pool_for(ce->pool, c.n_tiles * Hkv * c.chunks, attend_task, &c);
    cpu_matmul(ce, &L->attn_out, c.ao, n, out);
}
