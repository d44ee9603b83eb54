/* ppl.h: perplexity over an engine, by llama-perplexity's method, so the two programs'
 * figures are comparable on the same file and text:
 *  - the whole text is tokenized once (BOS first where the vocabulary adds one);
 *  - it is cut into windows of c tokens, [k c, (k+1) c), as many as fit (or --chunks K);
 *    each runs from an empty sequence, its first token replaced by BOS where the
 *    vocabulary adds one;
 *  - in each window only the second half is scored: the logits of row j predict token
 *    j + 1 for j in [c/2, c-1), c - 1 - c/2 tokens a window, so every scored token has at
 *    least c/2 tokens of context;
 *  - per token v = -log softmax(logits)[next] (max in f32, sum of exp in double); the
 *    estimate is exp(mean v), its error bar ppl x sqrt((mean v² - mean² v) / (n - 1)), the
 *    standard error of the mean of v carried through exp to first order.
 * Windows run as separate sequences of one engine, n_seq of them in each engine_run call;
 * their rows are scored on n_threads threads, each row's v alone, and summed in row order,
 * so the figures are the same bits for any thread count. */
#ifndef HEARTH_PPL_H
#define HEARTH_PPL_H

#include <stdint.h>
#include "engine/engine.h"

/* Running sums over scored tokens. */
typedef struct ppl_acc {
    double nll;     /* sum of v */
    double nll2;    /* sum of v² */
    int64_t count;  /* tokens scored */
} ppl_acc;

/* Adds n tokens: row i of logits (V floats) predicts next[i]; rows scored on n_threads
 * threads (<= 1: the caller's alone). */
void ppl_add(ppl_acc *a, const float *logits, int64_t V, const int32_t *next, int64_t n, int n_threads);
double ppl_value(const ppl_acc *a);  /* exp(mean v); NAN when nothing was scored */
double ppl_error(const ppl_acc *a);  /* the error bar; NAN with fewer than 2 tokens or no spread */

typedef struct ppl_opts {
    int64_t n_ctx;      /* c, the window (>= 4) */
    int64_t n_chunks;   /* windows to score (0: every whole window of the text) */
    int n_seq;          /* windows per engine_run call (the engine holds at least this many) */
    int n_threads;      /* threads that score the rows (<= 1: the caller's alone) */
    int32_t bos;        /* replaces each window's first token; -1: none */
    /* called after each window with its index (0-based), the total and the sums so far */
    void (*progress)(void *ctx, int64_t k, int64_t n, const ppl_acc *a);
    void *progress_ctx;
} ppl_opts;

/* Windows needed for the options: 0 with e set when the text is shorter than 2 windows
 * (llama-perplexity's rule) or an option is out of range. */
int64_t ppl_windows(int64_t n_ids, const ppl_opts *o, herr *e);

/* Scores the text's windows on eng (opened with n_ctx >= c and n_seq_max >= n_seq); the
 * sums go to *out. Returns 0, or -1 with e set (nothing is partial in *out then). */
int ppl_run(engine *eng, const int32_t *ids, int64_t n_ids, const ppl_opts *o, ppl_acc *out, herr *e);

#endif
