/* ppl.c: see ppl.h. */
#include "engine/ppl.h"
#include "engine/mutant.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* v of one row: -log softmax(x)[t], the max in f32, the sum of exp in double */
static double row_nll(const float *x, int64_t V, int32_t t) {
    float mx = x[0];
    for (int64_t j = 1; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    double sum = 0;
    for (int64_t j = 0; j < V; j++) sum += expf(x[j] - mx);
    return -((double)(x[t] - mx) - log(sum));
}

typedef struct score_job {
    const float *logits;
    int64_t V, n;
    const int32_t *next;
    double *v;
    int t, T; /* this thread's share: rows [n t / T, n (t + 1) / T) */
} score_job;

static void *score_part(void *arg) {
    const score_job *j = arg;
    for (int64_t i = j->n * j->t / j->T; i < j->n * (j->t + 1) / j->T; i++)
        j->v[i] = row_nll(j->logits + (size_t)i * (size_t)j->V, j->V, j->next[i]);
    return NULL;
}

void ppl_add(ppl_acc *a, const float *logits, int64_t V, const int32_t *next, int64_t n, int n_threads) {
    if (n <= 0) return;
    /* threads only where a share is worth one: ~1M logits (a few ms) a thread */
    int64_t T = n_threads > 1 ? n_threads : 1;
    if (T > n) T = n;
    if (T > 1 && n * V / T < (1 << 20)) T = n * V >> 20 > 1 ? n * V >> 20 : 1;
    double *v = xmalloc(sizeof(double) * (size_t)n);
    score_job *jobs = xmalloc(sizeof *jobs * (size_t)T);
    pthread_t *th = xmalloc(sizeof *th * (size_t)T);
    int64_t started = 1;
    for (int64_t t = 0; t < T; t++) jobs[t] = (score_job){.logits = logits, .V = V, .n = n, .next = next, .v = v,
                                                          .t = (int)t, .T = (int)T};
    for (; started < T; started++) /* a thread that cannot start is run by the caller below */
        if (pthread_create(&th[started], NULL, score_part, &jobs[started]) != 0) break;
    score_part(&jobs[0]);
    for (int64_t t = started; t < T; t++) score_part(&jobs[t]);
    for (int64_t t = 1; t < started; t++) pthread_join(th[t], NULL);
    for (int64_t i = 0; i < n; i++) { /* in row order: the same sums for any T */
        a->nll += v[i];
        a->nll2 += v[i] * v[i];
        a->count++;
    }
    free(th);
    free(jobs);
    free(v);
}

double ppl_value(const ppl_acc *a) { return a->count > 0 ? exp(a->nll / (double)a->count) : NAN; }

double ppl_error(const ppl_acc *a) {
    if (a->count < 2) return NAN;
    const double n = (double)a->count, mean = a->nll / n, var = a->nll2 / n - mean * mean;
    return var > 0 ? exp(mean) * sqrt(var / (n - 1)) : NAN;
}

int64_t ppl_windows(int64_t n_ids, const ppl_opts *o, herr *e) {
    if (o->n_ctx < 4) return herr_set(e, "a window (-c) of %" PRId64 " tokens is too short: at least 4", o->n_ctx), 0;
    if (o->n_seq < 1) return herr_set(e, "windows per call must be at least 1, not %d", o->n_seq), 0;
    if (o->n_chunks < 0) return herr_set(e, "--chunks must be 0 (all) or more, not %" PRId64, o->n_chunks), 0;
    if (n_ids < 2 * o->n_ctx)
        return herr_set(e, "the text is %" PRId64 " tokens; a window of %" PRId64 " (-c) needs at least %" PRId64
                           " (two windows)", n_ids, o->n_ctx, 2 * o->n_ctx), 0;
    const int64_t fit = n_ids / o->n_ctx;
    return o->n_chunks > 0 && o->n_chunks < fit ? o->n_chunks : fit;
}

int ppl_run(engine *eng, const int32_t *ids, int64_t n_ids, const ppl_opts *o, ppl_acc *out, herr *e) {
    const int64_t n_win = ppl_windows(n_ids, o, e);
    if (n_win == 0) return -1;
    const engine_info info = engine_get_info(eng);
    if (info.n_ctx < o->n_ctx || info.n_seq_max < o->n_seq)
        return herr_set(e, "the engine holds %d sequences of %" PRId64 " rows; %d windows of %" PRId64 " asked",
                        info.n_seq_max, info.n_ctx, o->n_seq, o->n_ctx);
    const int64_t c = o->n_ctx, first = MUTANT("ppl_half") ? 0 : c / 2;
    /* The rows before `cut` need no logits: they run as a span of their own, cut on the GDN
     * chunk grid (engine_piece_end's rule, no anchors), so the cut moves no bit. */
    const int64_t cut = first / info.chunk * info.chunk, tail = c - cut;
    const int64_t V = info.n_vocab;
    float *logits = xmalloc(sizeof(float) * (size_t)o->n_seq * (size_t)tail * (size_t)V);
    int32_t *win = xmalloc(sizeof(int32_t) * (size_t)o->n_seq * (size_t)c);
    engine_span *sp = xcalloc((size_t)o->n_seq, sizeof *sp);
    ppl_acc acc = {0};
    int rc = 0;
    for (int64_t k0 = 0; k0 < n_win && rc == 0; k0 += o->n_seq) {
        const int n = (int)(n_win - k0 < o->n_seq ? n_win - k0 : o->n_seq);
        for (int s = 0; s < n; s++) {
            int32_t *w = win + (size_t)s * (size_t)c;
            memcpy(w, ids + (k0 + s) * c, sizeof(int32_t) * (size_t)c);
            if (o->bos >= 0) w[0] = o->bos;
            engine_seq_clear(eng, s);
        }
        for (int part = cut > 0 ? 0 : 1; part < 2 && rc == 0; part++) {
            for (int s = 0; s < n; s++)
                sp[s] = (engine_span){.seq = s, .ids = win + (size_t)s * (size_t)c + (part ? cut : 0),
                                      .n = part ? tail : cut, .want = part ? ENGINE_LOGITS_ALL : ENGINE_LOGITS_NONE,
                                      .logits = part ? logits + (size_t)s * (size_t)tail * (size_t)V : NULL};
            rc = engine_run(eng, sp, n, e);
        }
        for (int s = 0; s < n && rc == 0; s++) {
            /* row j of the window (j >= cut) is row j - cut of its logits; it predicts token j + 1 */
            const int32_t *next = ids + (k0 + s) * c + first + (MUTANT("ppl_shift") ? 0 : 1);
            ppl_add(&acc, logits + ((size_t)s * (size_t)tail + (size_t)(first - cut)) * (size_t)V, V, next,
                    c - 1 - first, o->n_threads);
            if (o->progress) o->progress(o->progress_ctx, k0 + s, n_win, &acc);
        }
    }
    free(sp);
    free(win);
    free(logits);
    if (rc == 0) *out = acc;
    return rc;
}
