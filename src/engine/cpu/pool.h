/* pool.h: a persistent pool of worker threads (pthreads); no thread is created per op.
 * pool_for runs fn on tasks 0..n_tasks-1: every thread, the caller's included, claims
 * tasks one at a time until none are left, so a worker the OS has not scheduled yet holds
 * nothing up (the caller does its share). Workers spin briefly for the next op (decode
 * runs hundreds of small ops a token), then sleep. `thread` (0..pool_size-1) names the
 * thread running a task, for per-thread scratch; results must not depend on it. */
#ifndef HEARTH_POOL_H
#define HEARTH_POOL_H

#include <stdint.h>

typedef struct pool pool;
typedef void (*pool_task)(void *ctx, int64_t task, int thread);

pool *pool_new(int n_threads); /* n_threads in total, the caller's thread included */
void pool_free(pool *p);
int pool_size(const pool *p);
void pool_for(pool *p, int64_t n_tasks, pool_task fn, void *ctx);

#endif
