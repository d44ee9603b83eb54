/* pool.h: a persistent pool of worker threads (pthreads). pool_run hands one function to
 * every thread and returns when all are done; no thread is created per op. Workers spin
 * briefly for the next op (decode runs hundreds of small ops a token), then sleep. */
#ifndef HEARTH_POOL_H
#define HEARTH_POOL_H

typedef struct pool pool;
typedef void (*pool_fn)(void *ctx, int ith, int nth);

pool *pool_new(int n_threads); /* n_threads in total, the caller's thread included */
void pool_free(pool *p);
int pool_size(const pool *p);
/* Runs fn(ctx, ith, nth) for ith in [0, nth), the caller as ith 0. */
void pool_run(pool *p, pool_fn fn, void *ctx);

#endif
