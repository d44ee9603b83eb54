/* pool.c: the persistent thread pool. A task is claimed by a compare-and-swap on one
 * 64-bit word holding (generation << 32 | next task): a worker that wakes late sees a newer
 * generation and claims nothing of the old op, and fn/ctx cannot change under a claimed
 * task because the caller waits for every task to be done before it posts the next op. */
#include "engine/cpu/pool.h"
#include "base/util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define SPIN_ROUNDS 20000

struct pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t claim;   /* generation << 32 | next task */
    _Atomic int64_t done;     /* tasks finished in this generation */
    _Atomic int sleepers;
    atomic_bool stop;
    /* atomic (relaxed) because a worker late from the previous op reads it before its
     * compare-and-swap fails (see pool_for): the value is then never used, but a plain
     * read beside the caller's write is still a data race (TSan reports it) */
    _Atomic int64_t n_tasks;
    pool_task fn;
    void *ctx;
};

struct worker_arg {
    pool *p;
    int ith;
};

/* claims and runs tasks of generation gen until none are left */
static void work(pool *p, uint64_t gen, int ith) {
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        if ((c >> 32) != gen) return;
        uint64_t t = c & 0xffffffffu;
        /* a closed generation, or every task claimed */
        if (t == 0xffffffffu || (int64_t)t >= atomic_load_explicit(&p->n_tasks, memory_order_relaxed)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        p->fn(p->ctx, (int64_t)t, ith);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        c = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

static void *worker(void *arg) {
    struct worker_arg *wa = arg;
    pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->claim, memory_order_acquire) >> 32) == seen) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
            if (++spins < SPIN_ROUNDS) {
                __builtin_ia32_pause();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((atomic_load(&p->claim) >> 32) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        work(p, g, ith);
    }
}

pool *pool_new(int n_threads) {
    pool *p = xcalloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = xcalloc((size_t)p->n, sizeof *p->threads);
    for (int i = 1; i < p->n; i++) {
        struct worker_arg *wa = xmalloc(sizeof *wa);
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker, wa) != 0) HEARTH_DIE("pthread_create failed");
    }
    return p;
}

int pool_size(const pool *p) { return p->n; }

void pool_for(pool *p, int64_t n_tasks, pool_task fn, void *ctx) {
    HEARTH_CHECK(n_tasks >= 0 && n_tasks < ((int64_t)1 << 32) - 1);
    if (n_tasks == 0) return;
    if (p->n == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    /* First close the old op: a worker still inside work() of the previous generation may
     * have read "task t" and be about to compare t with n_tasks; were fn, ctx and n_tasks
     * changed under it while the old claim word stood, its compare-and-swap would succeed
     * and it would run a task of the new op that is also handed out again (a task run twice:
     * an in-place update applied twice, and `done` miscounted). A generation whose next
     * task is past every count makes that CAS fail; the new op then opens one generation
     * later. */
    uint64_t gen = (atomic_load(&p->claim) >> 32) + 1;
    atomic_store(&p->claim, gen << 32 | 0xffffffffu);
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    gen++;
    atomic_store(&p->claim, gen << 32); /* seq_cst: pairs with the sleepers count (no lost wake-up) */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, gen, 0);
    /* every task is claimed; wait for the ones still running (spin, then yield the core) */
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; spins++) {
        if (spins < SPIN_ROUNDS) __builtin_ia32_pause();
        else sched_yield();
    }
}

void pool_free(pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}
