/* matmul.c: weights times many activation rows, the CPU engine's inner loop. Activation
 * rows are quantized once to the weight's vec-dot partner (Q8_K for K-quants, Q8_0 for
 * Q8_0, f32 for float weights), like llama.cpp, then every (weight row, activation row)
 * pair is one quant_dot. Work is split into blocks of weight rows handed out through an
 * atomic counter; each output is computed by one thread in a fixed order, so the result
 * does not depend on the thread count. */
#include "engine/cpu/cpu.h"
#include "format/quant.h"

#include <stdlib.h>
#include <string.h>

#define ROWS_PER_TASK 16

size_t cpu_act_bytes(uint32_t wtype, int64_t K) { return quant_act_row_bytes(wtype, K); }

struct quant_ctx {
    uint32_t wtype;
    const float *x;
    int64_t x_stride, n, K;
    uint8_t *xq;
    size_t xq_stride;
};

static void quant_task(void *arg, int64_t r, int thread) {
    struct quant_ctx *c = arg;
    quant_quantize_act(c->wtype, c->x + r * c->x_stride, c->xq + (size_t)r * c->xq_stride, c->K);
}

void cpu_quantize_rows(cpu_engine *ce, uint32_t wtype, const float *x, int64_t x_stride, int64_t n, int64_t K,
                       uint8_t *xq, size_t xq_stride) {
    struct quant_ctx c = {wtype, x, x_stride, n, K, xq, xq_stride};
    pool_for(ce->pool, n, quant_task, &c);
}

struct mm_ctx {
    const mm_job *jobs;
    int n_jobs;
    int64_t *task_start; /* first task index of each job, n_jobs + 1 entries */
    int64_t *rows;       /* weight rows per task of each job */
};

/* Rows are handed to quant_dot_rows in groups (it reuses each weight block across up to 4
 * activation rows, 8 on AVX-512); each output is still one quant_dot's bits, whatever the
 * grouping. */
#define MM_GROUP 32
static void mm_block(const mm_job *j, int64_t o0, int64_t o1) {
    const qtensor *w = j->w;
    const int64_t K = w->ne[0];
    const uint8_t *wbase = (const uint8_t *)w->data + (size_t)j->slice * w->row_bytes * (size_t)w->ne[1];
    const void *a[MM_GROUP];
    float *y[MM_GROUP];
    for (int64_t r0 = 0; r0 < j->n; r0 += MM_GROUP) {
        const int m = j->n - r0 < MM_GROUP ? (int)(j->n - r0) : MM_GROUP;
        for (int i = 0; i < m; i++) {
            const int64_t r = r0 + i;
            a[i] = j->xq + (size_t)(j->in_rows ? j->in_rows[r] : r) * j->xq_stride;
            y[i] = (j->y_row ? j->y_row[r] : j->y + (j->out_rows ? j->out_rows[r] : r) * j->y_stride) + o0;
        }
        quant_dot_rows(w->type, K, wbase + (size_t)o0 * w->row_bytes, w->row_bytes, (int)(o1 - o0), a, m, y);
    }
}

static void mm_task(void *arg, int64_t t, int thread) {
    struct mm_ctx *c = arg;
    int lo = 0, hi = c->n_jobs - 1; /* the job whose task range holds t */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (c->task_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    const mm_job *j = &c->jobs[lo];
    int64_t o0 = (t - c->task_start[lo]) * c->rows[lo];
    int64_t o1 = o0 + c->rows[lo];
    if (o1 > j->w->ne[1]) o1 = j->w->ne[1];
    mm_block(j, o0, o1);
}

/* Weight rows per task: ROWS_PER_TASK keeps a task's weight rows in L1 while all of a
 * prompt's activation rows stream past. With a few rows (decode) the weights stream from
 * memory once, and a task of one long contiguous run (about 4 per thread, for balance)
 * suits the hardware prefetcher better than many short runs interleaved across threads.
 * Each output is one quant_dot's bits whatever the split. */
static int64_t task_rows(const mm_job *j, int nth) {
    if (j->n > 4) return ROWS_PER_TASK;
    int64_t r = (j->w->ne[1] + 4 * nth - 1) / (4 * nth);
    r = (r + ROWS_PER_TASK - 1) / ROWS_PER_TASK * ROWS_PER_TASK;
    return r > ROWS_PER_TASK ? r : ROWS_PER_TASK;
}

size_t cpu_jobs_scratch(int n_jobs) { return arena_round(sizeof(int64_t) * (size_t)(2 * n_jobs + 1)); }

/* an activation row is at most K f32 (float weights) plus block headers */
size_t cpu_act_scratch(int64_t n, int64_t K, int n_types) {
    return (size_t)n_types * arena_round((size_t)n * ((size_t)K * 4 + 64));
}

void cpu_matmul_jobs(cpu_engine *ce, const mm_job *jobs, int n_jobs) {
    const size_t mark = cpu_arena_mark(&ce->ar);
    int64_t *starts = cpu_scratch(ce, cpu_jobs_scratch(n_jobs));
    int64_t *rows = starts + n_jobs + 1;
    starts[0] = 0;
    for (int i = 0; i < n_jobs; i++) {
        rows[i] = task_rows(&jobs[i], ce->nth);
        int64_t blocks = jobs[i].n > 0 ? (jobs[i].w->ne[1] + rows[i] - 1) / rows[i] : 0;
        starts[i + 1] = starts[i] + blocks;
    }
    struct mm_ctx c = {jobs, n_jobs, starts, rows};
    pool_for(ce->pool, starts[n_jobs], mm_task, &c);
    cpu_arena_rewind(&ce->ar, mark);
}

void cpu_matmul(cpu_engine *ce, const qtensor *w, const float *x, int64_t n, float *y) {
    const int64_t K = w->ne[0];
    size_t xs = cpu_act_bytes(w->type, K);
    uint8_t *xq = cpu_scratch(ce, xs * (size_t)n);
    cpu_quantize_rows(ce, w->type, x, K, n, K, xq, xs);
    mm_job j = {.w = w, .xq = xq, .xq_stride = xs, .n = n, .y = y, .y_stride = w->ne[1]};
    cpu_matmul_jobs(ce, &j, 1);
}

const uint8_t *cpu_act(cpu_engine *ce, act_cache *ac, uint32_t wtype, size_t *stride) {
    const uint32_t vt = quant_vec_dot_type(wtype);
    HEARTH_CHECK(vt < QT_COUNT_MAX);
    *stride = cpu_act_bytes(wtype, ac->K);
    if (!ac->buf[vt]) {
        ac->buf[vt] = cpu_scratch(ce, *stride * (size_t)ac->n);
        cpu_quantize_rows(ce, wtype, ac->x, ac->K, ac->n, ac->K, ac->buf[vt], *stride);
    }
    return ac->buf[vt];
}

void cpu_project(cpu_engine *ce, const float *x, int64_t n, const qtensor *const *ws, float *const *ys, int count) {
    HEARTH_CHECK(count <= 8);
    act_cache ac = ACT_CACHE(x, n, ws[0]->ne[0]);
    mm_job jobs[8];
    for (int i = 0; i < count; i++) {
        HEARTH_CHECK(ws[i]->ne[0] == ac.K);
        size_t xs;
        const uint8_t *xq = cpu_act(ce, &ac, ws[i]->type, &xs);
        jobs[i] = (mm_job){.w = ws[i], .xq = xq, .xq_stride = xs, .n = n, .y = ys[i], .y_stride = ws[i]->ne[1]};
    }
    cpu_matmul_jobs(ce, jobs, count);
}
