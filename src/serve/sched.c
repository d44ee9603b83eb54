/* sched.c: the engine thread, its slots and queue (sched.h). */
#include "serve/sched.h"
#include "engine/spec.h"
#include "serve/grammar.h"
#include "serve/schema.h"
#include "engine/mutant.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define SLOT_POINTS 256 /* points one slot keeps; past it the oldest goes */
/* spare points kept ready a slot (engine_point_reserve): a turn of an agent's chat takes a
 * point at each new message's start (the answer, a tool result, the next prompt), at its
 * last row and at its answer's end, 2-4, and an agent sends turns back to back for a while.
 * Made at start, then only while the server is idle (SPARE_IDLE_S): a point buffer made
 * beside a pass or a request's preparation stalls them (on CUDA, pinning ~63 MB at q36 held
 * 30-90 ms of each turn of the agent trace, bench/RESULTS.md). At most half the cache
 * budget at start, then as far as its room allows (spares_sync). */
#define SLOT_SPARES 64
/* how long the server stays idle (no request queued, in flight or being rendered, no closing
 * pending) before the spare thread makes points: longer than the gap between an agent's
 * back-to-back turns (< 1 ms on the agent trace), short beside a user's reading */
#define SPARE_IDLE_S 0.05

/* SLOT_CLOSE: no request; the answer that ended is prefilled again from its message's start
 * (sched.h), a piece a step */
typedef enum slot_state { SLOT_IDLE = 0, SLOT_PREFILL, SLOT_GEN, SLOT_CLOSE } slot_state;

typedef struct slot_point {
    engine_point *p;
    double t_used;          /* made or restored from (time_now): the least recent goes first */
    int64_t msg_at;         /* a point at an answer's end: where its assistant message starts; else -1 */
} slot_point;

typedef struct slot {
    int id;                 /* its index (-np) */
    int seq;                /* the engine sequence it holds now (sched.h: parked sequences) */
    slot_state state;
    sched_req *req;
    int32_t *ids;           /* what the sequence holds: ids[0, n) */
    int64_t n;
    slot_point pts[SLOT_POINTS]; /* ascending pos */
    int n_pts;
    double t_used;
    /* the request in flight */
    int64_t pf_base, pf_pos;    /* resumed at, next prompt row */
    int64_t *marks;             /* points to take: positions in (pf_base, n_ids], ascending */
    int n_marks, mark_i;
    int32_t next_id;            /* sampled, not yet run */
    sampler sm;
    float *logits;
    float *raw;                 /* the logits before penalties, when log-probabilities are asked for */
    int32_t greedy;             /* the engine's argmax, when the request samples greedily (slot_greedy) */
    gmatch *gm;                 /* the request's grammar state, or NULL */
    bool gm_on;                 /* the grammar applies (past the reasoning, grammar_after_think) */
    bool gm_lead;               /* just past </think>: newline-only tokens pass (the answer drops them) */
    char think_tail[16];        /* the last bytes generated while waiting for </think> */
    int think_n;
    char gm_err[600];           /* why sampling under the grammar failed */
    /* this step's span */
    int64_t span_b;
    int span_marks;
    engine_point *span_pts[SLOT_POINTS];
    int64_t span_mark_pos[SLOT_POINTS];
    int64_t span_anchor[SLOT_POINTS];   /* the span's message starts (exact requests: as many as its marks) */
    int span_anchors;
    /* SLOT_CLOSE: the assistant message that ended, from its start at row close_at: its prompt
     * rows, the answer, the template's end ids; close_done of its close_n rows run. n_ctx room. */
    int32_t *close_ids;
    int64_t close_at, close_n, close_done;
    double close_due;           /* when its first piece may run (--answer-point-wait; close_waiting) */
    int64_t *close_anchor;      /* message starts inside it (an <|im_start|> the answer wrote) */
    int n_close_anchor;
    /* SLOT_PREFILL: queued requests wait for the point at this mark of its prefill (admit), so
     * this step's piece ends there; 0: none */
    int64_t hold_at;
    int64_t step_most; /* SLOT_PREFILL: this step's most prompt rows (prompt_turns); 0: none this step */
    /* --spec-mtp (engine/spec.h's way, inside the step): this step's drafts (spec_k of them; 0:
     * a plain step), the span [next_id, drafts], its marks 1..spec_k (also its anchors) and the
     * points they fill (made on the slot's first speculative step, kept), its rows' logits */
    int spec_k, n_spec_pts;
    int32_t spec_ids[SPEC_MAX + 1];
    int64_t spec_marks[SPEC_MAX];
    engine_point *spec_pts[SPEC_MAX];
    float *spec_logits;         /* (SPEC_MAX + 1) x V, where --spec-mtp */
} slot;

struct sched {
    engine *eng;
    atomic_int holds;       /* prompts on their way to sched_submit (sched_hold_begin): closings wait */
    const tokenizer *tok;
    engine_info info;
    int64_t V;
    int32_t *eog;           /* the vocabulary's end-of-generation ids: masked under ignore_eos */
    /* the vocabulary's trie for grammars and its primed position entries (schema_prime):
     * made once at start by a thread of their own (gv_th, vocab_build: 0.1-0.5 s at 248k
     * tokens), so the server answers at once and neither the engine thread (where it
     * stalled every slot's decoding) nor a request's thread builds them; a grammar request
     * that comes before gv_ready waits for it (sched_submit). Written once, read after. */
    gvocab *gv;
    bool gv_ready, gv_started;
    atomic_bool gv_stop;    /* sched_stop: the thread makes no more of it (it ends soon) */
    pthread_t gv_th;
    pthread_mutex_t gv_mu;
    pthread_cond_t gv_cv;
    int n_eog;
    sched_opts o;
    slot *slots;
    /* the engine's sequences (sched.h: parked sequences): n_slots of them held by the slots,
     * the rest free or parked (no slot holds it, the shared cache uses rows live in it) */
    int n_seq;
    struct seq_use {
        int slot;           /* the slot holding it, or -1 */
        double t_used;      /* when a slot last let it go: the least recent parked one goes first */
    } *seqs;
    pthread_t th;
    pthread_mutex_t mu;     /* queue, stats, stopping, slot state that others read */
    pthread_cond_t cv;
    sched_req **q;
    int64_t q_head, q_n;
    bool stopping;
    bool running;           /* the engine thread was started and not joined yet */
    /* the model file as it was at start (sched_opts.model_path): model_bad (under mu, sticky)
     * once it was written in place, its message in model_err; model_moved once another file
     * was renamed over it (logged once, served on: the mapping keeps the old file) */
    struct stat model_st;
    bool model_bad, model_moved;
    char model_err[600];
    sched_stats st;
    engine_span *spans;
    slot **span_slot;
    sched_slot_info *snap;  /* what sched_slots reports, published under mu */
    pcache *pc;             /* the shared prompt cache (engine thread only) */
    pcache_stats pc_stats;  /* its counters, published under mu */
    struct {                /* a /slots save or restore, run by the engine thread (under mu) */
        bool busy, done;
        int kind;           /* JOB_* */
        int slot;
        const char *path;
        int rc;
        int64_t n;
        herr e;
    } job;
    pthread_cond_t job_cv;
    /* spare points (F11): SLOT_SPARES a slot, made at start (sched_start), then by sp_th, a
     * thread that only allocates (engine_point_make: pages touched, pinned on CUDA), so that
     * the engine thread never waits on an allocation. It allocates only while the server is
     * idle (spares_idle): the engine thread asks once idle SPARE_IDLE_S and stops asking as
     * work comes; a prompt's hold (holds) or a submit (sp_go) stops it at once, so a turn waits
     * at most for the one point in the making. The engine thread adopts what it made
     * (engine_point_adopt: into the budget) before every step. sp_mu is taken under mu,
     * never the reverse. */
    int spare_want;
    double sp_idle_since;   /* under mu: since when the engine thread has found the server idle (0: not idle) */
    atomic_bool sp_go;      /* sp_th may start a point: the engine thread asked, no work has come since */
    pthread_t sp_th;
    bool sp_started, sp_stop;
    pthread_mutex_t sp_mu;
    pthread_cond_t sp_cv;   /* sp_ask grew, or stop */
    engine_point **sp_ready; /* made, not adopted yet: sp_n of spare_want */
    int sp_n;
    int sp_ask;             /* how many the engine thread wants made (spares short, within the budget's room) */
    bool sp_wake;           /* under mu: sp_th has made points for the engine thread to adopt */
};

/* ---------------------------------------------------------------- requests */

sched_req *sched_req_new(int32_t *ids, int64_t n_ids, int64_t *marks, int n_marks) {
    sched_req *r = xcalloc(1, sizeof *r);
    r->ids = ids;
    r->n_ids = n_ids;
    r->marks = marks;
    r->n_marks = n_marks;
    r->n_predict = -1;
    r->slot_wanted = -1;
    r->slot = -1;
    r->refs = 2;
    r->top_logprobs = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
}

static void req_unref(sched_req *r) {
    pthread_mutex_lock(&r->mu);
    const int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->ids);
    free(r->marks);
    free(r->out);
    free(r->lp);
    free(r->top_id);
    free(r->top_lp);
    grammar_free(r->grammar);
    free(r->bias_id);
    free(r->bias);
    free(r);
}

void sched_release(sched_req *r) { req_unref(r); }

void sched_cancel(sched_req *r) {
    pthread_mutex_lock(&r->mu);
    r->cancel = true;
    pthread_mutex_unlock(&r->mu);
}

int64_t sched_wait(sched_req *r, int64_t n_seen, double timeout_s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_s > 0) {
        until.tv_sec += (time_t)timeout_s;
        until.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    }
    pthread_mutex_lock(&r->mu);
    while (r->n_out <= n_seen && r->finish == SCHED_RUNNING) {
        if (timeout_s <= 0) pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT) break;
    }
    const int64_t n = r->n_out;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* a token's log-probabilities, when asked for */
typedef struct token_lp {
    float lp;
    int32_t top_id[SCHED_MAX_TOP];
    float top_lp[SCHED_MAX_TOP];
} token_lp;

/* engine thread: r's state changes, under r->mu, and the HTTP side is woken */
static void req_push(sched_req *r, int32_t id, const token_lp *t) {
    pthread_mutex_lock(&r->mu);
    const int K = r->top_logprobs;
    if (r->n_out == r->cap_out) {
        r->cap_out = r->cap_out ? 2 * r->cap_out : 64;
        r->out = xrealloc(r->out, sizeof(int32_t) * (size_t)r->cap_out);
        if (K >= 0) {
            r->lp = xrealloc(r->lp, sizeof(float) * (size_t)r->cap_out);
            r->top_id = xrealloc(r->top_id, sizeof(int32_t) * (size_t)(r->cap_out * (K ? K : 1)));
            r->top_lp = xrealloc(r->top_lp, sizeof(float) * (size_t)(r->cap_out * (K ? K : 1)));
        }
    }
    if (K >= 0 && t) {
        r->lp[r->n_out] = t->lp;
        memcpy(r->top_id + r->n_out * K, t->top_id, sizeof(int32_t) * (size_t)K);
        memcpy(r->top_lp + r->n_out * K, t->top_lp, sizeof(float) * (size_t)K);
    }
    r->out[r->n_out++] = id;
    if (r->n_out == 1) r->t_first = time_now();
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void req_finish(sched_req *r, sched_finish f, const char *err, double t_end) {
    pthread_mutex_lock(&r->mu);
    r->finish = f;
    r->t_end = t_end;
    if (err) snprintf(r->err, sizeof r->err, "%s", err);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static bool req_cancelled(sched_req *r) {
    pthread_mutex_lock(&r->mu);
    const bool c = r->cancel;
    pthread_mutex_unlock(&r->mu);
    return c;
}

/* ---------------------------------------------------------------- slots and points */

static void slot_drop_point(sched *s, slot *sl, int i) {
    /* through the cache: a pending write of its file may still read it */
    if (s->pc) pcache_point_free(s->pc, sl->pts[i].p);
    else engine_point_free(s->eng, sl->pts[i].p);
    memmove(&sl->pts[i], &sl->pts[i + 1], sizeof sl->pts[0] * (size_t)(sl->n_pts - i - 1));
    sl->n_pts--;
}

static void slot_drop_points_past(sched *s, slot *sl, int64_t pos) {
    while (sl->n_pts > 0 && sl->pts[sl->n_pts - 1].p->pos > pos) slot_drop_point(s, sl, sl->n_pts - 1);
}

/* A point for a mark of slot self: when the budget is full, the least recently used point
 * of an idle slot (or one of self's own older points) goes. NULL: none could be freed. */
static engine_point *point_alloc(sched *s, slot *self) {
    engine_point *p;
    herr e;
    for (;;) {
        if (engine_point_new(s->eng, &p, &e) == 0) return p;
        slot *victim = NULL;
        int vi = -1;
        for (int k = 0; k < s->o.n_slots; k++) {
            slot *sl = &s->slots[k];
            if (sl != self && sl->state != SLOT_IDLE) continue;
            for (int i = 0; i < sl->n_pts; i++) {
                if (sl == self && sl->pts[i].p->pos > self->pf_base) break; /* this request's own */
                if (!victim || sl->pts[i].t_used < victim->pts[vi].t_used) { victim = sl; vi = i; }
            }
        }
        const double t_cache = pcache_oldest(s->pc);
        if (t_cache < (victim ? victim->pts[vi].t_used : INFINITY)) {
            pcache_evict_older(s->pc, INFINITY);
            continue;
        }
        if (!victim) return NULL;
        slot_drop_point(s, victim, vi);
        pthread_mutex_lock(&s->mu);
        s->st.n_point_evictions++;
        pthread_mutex_unlock(&s->mu);
    }
}

/* msg_at: slot_point's */
static void slot_add_point(sched *s, slot *sl, engine_point *p, int64_t msg_at) {
    if (sl->n_pts == SLOT_POINTS) slot_drop_point(s, sl, 0);
    int i = sl->n_pts;
    while (i > 0 && sl->pts[i - 1].p->pos > p->pos) i--;
    memmove(&sl->pts[i + 1], &sl->pts[i], sizeof sl->pts[0] * (size_t)(sl->n_pts - i));
    sl->pts[i] = (slot_point){.p = p, .t_used = time_now(), .msg_at = msg_at};
    sl->n_pts++;
}

static bool is_mark(const sched_req *r, int64_t pos) {
    int lo = 0, hi = r->n_marks;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (r->marks[mid] < pos) lo = mid + 1;
        else hi = mid;
    }
    return lo < r->n_marks && r->marks[lo] == pos;
}

/* Whether a point at pos resumes r with a cold pass's bits: where a cold pass of r has a chunk
 * boundary (the chunks laid from row 0 and restarted at each mark: engine_piece_end's grid).
 * A chat resumes only at its marks (its message starts); a prompt of /completion at a mark
 * (an <|im_start|>) or a whole number of chunks past the last one before pos. Every point
 * was made on this grid (sched_submit gives a prompt the marks a chat would have at the same
 * ids), so its state is a cold pass's at pos. */
static bool resume_ok(const sched *s, const sched_req *r, int64_t pos) {
    if (is_mark(r, pos)) return true;
    if (r->exact) return false;
    int lo = 0, hi = r->n_marks; /* the last mark before pos */
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (r->marks[mid] < pos) lo = mid + 1;
        else hi = mid;
    }
    const int64_t from = lo > 0 ? r->marks[lo - 1] : 0;
    return (pos - from) % s->info.chunk == 0;
}

typedef struct resume_cls {
    const sched *s;
    const sched_req *r;
} resume_cls;

static bool resume_ok_cb(const void *cls, int64_t pos) {
    const resume_cls *c = cls;
    return resume_ok(c->s, c->r, pos);
}

/* Where r would resume on sl: the row, and the point to restore (-1: row 0). Never the live
 * state: its rows past the last point were decoded one by one (or cut off the grid), which
 * a cold pass's chunks do not reproduce. */
static int64_t slot_resume(const sched *s, const slot *sl, const sched_req *r, int *pt) {
    *pt = -1;
    if (r->no_reuse) return 0;
    const int64_t common = ids_common_prefix(sl->ids, sl->n, r->ids, r->n_ids);
    const int64_t lim = common < r->n_ids - 1 ? common : r->n_ids - 1;
    for (int i = sl->n_pts - 1; i >= 0; i--) {
        const int64_t pos = sl->pts[i].p->pos;
        if (pos <= lim && resume_ok(s, r, pos)) { *pt = i; return pos; }
    }
    return 0;
}

/* A point at an answer's end whose message the next request enters and leaves before it (it
 * shares the message's start and more, then differs: the template rendered the answer
 * otherwise, as one that drops the thinking of earlier turns does) is one no later turn of
 * this conversation reaches, the template being the same: dropped, not moved to the shared
 * cache (there and on disk it would cost a point and a file every turn, and crowd out the
 * entries that serve). common: the ids the slot and the request share. */
static void slot_drop_rewritten(sched *s, slot *sl, int64_t common) {
    for (int i = sl->n_pts - 1; i >= 0; i--)
        if (sl->pts[i].msg_at >= 0 && sl->pts[i].msg_at < common && common < sl->pts[i].p->pos) slot_drop_point(s, sl, i);
}

/* The slot's points past row keep, with their KV rows, into the shared cache (before its
 * sequence changes; the rows stay shared with it until pcache_seq_cut); the slot keeps the
 * rest. */
static void slot_spill(sched *s, slot *sl, int64_t keep) {
    int first = sl->n_pts;
    while (first > 0 && sl->pts[first - 1].p->pos > keep) first--;
    const int n = sl->n_pts - first;
    if (n == 0) return;
    engine_point *moved[SLOT_POINTS];
    for (int i = 0; i < n; i++) moved[i] = sl->pts[first + i].p;
    sl->n_pts = first;
    pcache_put(s->pc, sl->seq, sl->ids, sl->n, moved, n);
}

/* The shared cache's best resume for r (0: none). */
static int64_t cache_resume(sched *s, const sched_req *r, int *ei, int *pi) {
    *ei = *pi = -1;
    if (r->no_reuse) return 0;
    const resume_cls c = {s, r};
    return pcache_best(s->pc, r->ids, r->n_ids, resume_ok_cb, &c, ei, pi);
}

/* ---------------------------------------------------------------- parked sequences */

static void publish(sched *s);

/* whether the shared cache uses rows live in sequence q (an entry's, another sequence's) */
static bool seq_used(const sched *s, int q) { return pcache_cut_rows(s->pc, q, 0) > 0; }

/* Sequence q, held by no slot and used by nothing in the cache, emptied. */
static void seq_empty(sched *s, int q) {
    pcache_seq_cut(s->pc, q, 0); /* (copies nothing: nothing uses its rows) */
    engine_seq_clear(s->eng, q);
}

/* Parked sequence q evicted: the rows of it that the cache uses copied to the host, and
 * emptied. */
static void seq_evict(sched *s, int q) {
    if (MUTANT("park_reuse")) { /* mutant: emptied with its rows not copied, the cache's spans left on it */
        engine_seq_clear(s->eng, q);
        return;
    }
    seq_empty(s, q); /* (pcache_seq_cut copies them) */
}

/* A sequence no slot holds, empty, for a slot to take: a free one, or else the least recently
 * parked one (let go before `before`), whose rows the cache uses are copied to the host first
 * (pcache_seq_cut: what a slot moving to another conversation paid before sequences were
 * parked, now paid once per eviction). -1: none (no sequence beyond the slots', or every
 * parked one more recent than before). Engine thread; *evicted: whether a copy was made. */
static int seq_take_free(sched *s, double before, bool *evicted) {
    int lru = -1;
    *evicted = false;
    for (int q = 0; q < s->n_seq; q++) {
        if (s->seqs[q].slot >= 0) continue;
        if (!seq_used(s, q)) {
            seq_empty(s, q);
            return q;
        }
        if (lru < 0 || s->seqs[q].t_used < s->seqs[lru].t_used) lru = q;
    }
    if (lru < 0 || s->seqs[lru].t_used >= before) return -1;
    seq_evict(s, lru);
    *evicted = true;
    return lru;
}

/* sl lets its sequence go for q (no slot holds q): its own stays as it is, parked when the
 * cache uses its rows (the points slot_spill put there), free otherwise. Under s->mu. */
static void slot_seq_move(sched *s, slot *sl, int q) {
    const int old = sl->seq;
    s->seqs[old] = (struct seq_use){.slot = -1, .t_used = sl->t_used}; /* its conversation's last use */
    if (seq_used(s, old)) s->st.n_parks++;
    s->seqs[q].slot = sl->id;
    sl->seq = q;
}

/* sl starts over at row 0 (another conversation, an erase): when the cache uses rows of its
 * sequence, they stay there (parked) and the slot takes a free sequence (a parked one evicted
 * for it when none is free: the least recently used conversation's rows are copied, not
 * this one's); with no sequence beyond the slots', the caller's cut copies them. Under s->mu. */
static void slot_fresh(sched *s, slot *sl) {
    if (s->n_seq == s->o.n_slots || !seq_used(s, sl->seq) || MUTANT("park_off")) return; /* mutant: never parks */
    bool evicted;
    const int q = seq_take_free(s, sl->t_used, &evicted); /* (a parked one more recent than this conversation stays) */
    if (q < 0) return;
    if (evicted) s->st.n_park_evictions++;
    slot_seq_move(s, sl, q);
}

/* sl resumes from the shared cache's entry ei, point pi at row p: into the sequence that costs
 * the fewest rows moved, its own or one no slot holds. Rows moved: those the restore writes
 * (below p, not held there as they are) and those its cut copies out (past what it holds,
 * still used by the cache). A parked sequence that holds the entry's rows is taken over: no
 * row moves at all, and the slot's own is parked in its place. Ties keep the slot's own. Under
 * s->mu. */
static void slot_seq_for_entry(sched *s, slot *sl, int ei, int pi, int64_t p) {
    if (s->n_seq == s->o.n_slots || MUTANT("park_off")) return;
    const int64_t h0 = pcache_holds(s->pc, ei, pi, sl->seq);
    int64_t best_cost = pcache_cut_rows(s->pc, sl->seq, h0) + (p - h0), best_h = h0;
    int best = -1;
    for (int q = 0; q < s->n_seq; q++) {
        if (s->seqs[q].slot >= 0) continue;
        const int64_t h = pcache_holds(s->pc, ei, pi, q);
        const int64_t cost = pcache_cut_rows(s->pc, q, h) + (p - h);
        if (cost < best_cost) { best = q; best_cost = cost; best_h = h; }
    }
    if (best < 0) return;
    if (best_h > 0) s->st.n_takeovers++;
    slot_seq_move(s, sl, best);
}

/* When the server is idle and every sequence beyond the slots' is parked, the least recently
 * parked one is evicted now (its rows the cache uses copied to the host), so that the next slot
 * moving to another conversation finds a free one instead of paying for the copy on its
 * request's path. Engine thread, without s->mu (the copy takes time; nothing else touches the
 * cache or the sequences). true: one was evicted and is free. */
static bool seq_reserve(sched *s) {
    if (s->n_seq == s->o.n_slots) return false;
    int lru = -1;
    for (int q = 0; q < s->n_seq; q++) {
        if (s->seqs[q].slot >= 0) continue;
        if (!seq_used(s, q)) return false; /* one is free */
        if (lru < 0 || s->seqs[q].t_used < s->seqs[lru].t_used) lru = q;
    }
    if (lru < 0) return false;
    seq_evict(s, lru);
    pthread_mutex_lock(&s->mu);
    s->st.n_park_evictions++;
    s->st.n_park_evictions_idle++;
    publish(s);
    pthread_mutex_unlock(&s->mu);
    return !seq_used(s, lru); /* (free now: the caller looks again; else it waits, never spins) */
}

/* engine thread, under s->mu (from admit): r starts on sl at the best resume row: the slot's
 * own (a point, or its live state), or the shared cache's entry ei when from_cache */
static void slot_start(sched *s, slot *sl, sched_req *r, bool from_cache, int ei, int pi, int64_t cache_at) {
    int pt;
    const int64_t common = ids_common_prefix(sl->ids, sl->n, r->ids, r->n_ids);
    int64_t at = from_cache ? 0 : slot_resume(s, sl, r, &pt);
    char w[sizeof r->cache_why];
    herr e;
    int64_t gone;
    slot_drop_rewritten(s, sl, common);
    slot_spill(s, sl, from_cache ? 0 : at);
    /* another conversation (or this one's rows parked elsewhere): the sequence that moves the
     * fewest rows, the rows the cache uses left where they are (parked) */
    if (from_cache) slot_seq_for_entry(s, sl, ei, pi, cache_at);
    else if (at == 0) slot_fresh(s, sl);
    /* the rows past the resume row that the cache still uses are copied out before they go
     * (a shared entry's restore does this itself) */
    if (!from_cache) pcache_seq_cut(s->pc, sl->seq, at);
    if (from_cache) {
        const int32_t *ids;
        if (pcache_restore(s->pc, ei, pi, sl->seq, &ids, &at, &e) < 0) {
            snprintf(w, sizeof w, "the shared cache's entry could not be used (%s)", e.msg);
            at = 0;
        } else {
            memcpy(sl->ids, ids, sizeof(int32_t) * (size_t)at);
            snprintf(w, sizeof w, "point at %lld of the shared cache", (long long)at);
            s->st.n_cache_hits++; /* admit holds s->mu */
        }
        while (sl->n_pts) slot_drop_point(s, sl, sl->n_pts - 1);
    } else if (pt >= 0) {
        if (engine_restore(s->eng, sl->seq, sl->pts[pt].p, &e) < 0) { /* cannot happen: the prefix was compared */
            snprintf(w, sizeof w, "restore refused (%s)", e.msg);
            at = 0;
        } else {
            sl->pts[pt].t_used = time_now();
            snprintf(w, sizeof w, "point at %lld of slot %d (diverged at token %lld)", (long long)at, sl->id,
                     (long long)common);
        }
    } else if (!r->exact && s->o.start_id < 0) {
        snprintf(w, sizeof w, "a prompt is never resumed under a chat template without <|im_start|> (a chat's "
                              "message starts cannot be found in its ids, so a chat's points are no cold pass's)");
    } else if (r->no_reuse) {
        snprintf(w, sizeof w, "cache_prompt is false");
    } else if ((gone = pcache_evicted_best(s->pc, r->ids, r->n_ids, resume_ok_cb, &(resume_cls){s, r})) > 0) {
        snprintf(w, sizeof w, "evicted: the cache's entry up to row %lld was dropped for --cache-ram", (long long)gone);
    } else if (sl->n == 0) {
        snprintf(w, sizeof w, "no point (empty slot %d, nothing shared in the cache)", sl->id);
    } else {
        snprintf(w, sizeof w, "no point before token %lld, where slot %d diverged, nor in the cache", (long long)common,
                 sl->id);
    }
    if (at == 0) {
        pcache_seq_cut(s->pc, sl->seq, 0);
        engine_seq_clear(s->eng, sl->seq);
        while (sl->n_pts) slot_drop_point(s, sl, sl->n_pts - 1);
    } else {
        slot_drop_points_past(s, sl, at);
    }
    sl->n = at;
    sl->req = r;
    sl->state = SLOT_PREFILL;
    sl->pf_base = sl->pf_pos = at;
    sl->t_used = time_now();
    /* marks past the resume row, and the last prompt row */
    free(sl->marks);
    sl->marks = xmalloc(sizeof(int64_t) * (size_t)(r->n_marks + 1));
    sl->n_marks = 0;
    sl->mark_i = 0;
    for (int i = 0; i < r->n_marks; i++)
        if (r->marks[i] > at && r->marks[i] < r->n_ids) sl->marks[sl->n_marks++] = r->marks[i];
    if (r->exact || s->o.start_id >= 0) sl->marks[sl->n_marks++] = r->n_ids; /* (else no point: see sched_submit) */
    sampler_init(&sl->sm, &r->so, s->V);
    sl->gm_on = !r->grammar_after_think;
    sl->gm_lead = false;
    sl->think_n = 0;
    sl->gm_err[0] = 0;
    if (r->grammar) { /* (s->gv: ready before sched_submit queued r) */
        herr ge;
        if (!(sl->gm = gmatch_new(r->grammar, s->gv, &ge))) snprintf(sl->gm_err, sizeof sl->gm_err, "%s", ge.msg);
    }
    pthread_mutex_lock(&r->mu);
    r->slot = sl->id;
    r->n_cached = at;
    snprintf(r->cache_why, sizeof r->cache_why, "%s", w);
    r->t_start = time_now();
    pthread_mutex_unlock(&r->mu);
}

const double SCHED_HIST_LE[SCHED_HIST_N] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

static void hist_add(sched_hist *h, double v) {
    int k = 0;
    while (k < SCHED_HIST_N && v > SCHED_HIST_LE[k]) k++;
    h->le[k]++;
    h->count++;
    h->sum += v;
}


/* false once the model file was written in place since the start (its size or time changed
 * on the same inode). The weights are mapped from it, so from then on nothing is run or
 * written to the cache: every request fails naming the file, /health says so, and the server
 * must be restarted. A file renamed over it (or its removal) leaves the mapping on the file
 * loaded, which is served on. Checked before each engine pass, before each cache write and by
 * /health (a stat, a microsecond, beside a pass of milliseconds); any thread, under mu. */
static bool model_file_ok_locked(sched *s) {
    if (!s->o.model_path || s->model_bad) return !s->model_bad;
    struct stat now;
    const bool same_file = stat(s->o.model_path, &now) == 0 && now.st_dev == s->model_st.st_dev &&
                           now.st_ino == s->model_st.st_ino;
    if (!same_file) {
        if (!s->model_moved)
            fprintf(stderr, "hearth serve: the model file %s was replaced or removed on disk; serving on from the "
                            "file loaded at start (restart to load the new one)\n", s->o.model_path);
        s->model_moved = true;
        return true;
    }
    if (now.st_size == s->model_st.st_size && now.st_mtim.tv_sec == s->model_st.st_mtim.tv_sec &&
        now.st_mtim.tv_nsec == s->model_st.st_mtim.tv_nsec)
        return true;
    snprintf(s->model_err, sizeof s->model_err,
             "the model file %s was written in place while serving (%lld -> %lld bytes): its weights can no longer "
             "be trusted; restart the server (replace a model file by renaming a new one over it)",
             s->o.model_path, (long long)s->model_st.st_size, (long long)now.st_size);
    s->model_bad = true;
    fprintf(stderr, "hearth serve: %s\n", s->model_err);
    return false;
}

static bool model_file_ok(sched *s) {
    pthread_mutex_lock(&s->mu);
    const bool ok = model_file_ok_locked(s);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* With --cache-dir, the points this request made (past its resume row) go to a file before it
 * is reported done: a replica sharing the folder, or this one after a crash, resumes from
 * them. The slot keeps them too. */
static void slot_write_through(sched *s, slot *sl) {
    int first = 0;
    while (first < sl->n_pts && sl->pts[first].p->pos <= sl->pf_base) first++;
    if (!s->o.cache_dir || first == sl->n_pts || !model_file_ok(s)) return;
    engine_point *pts[SLOT_POINTS];
    for (int i = first; i < sl->n_pts; i++) pts[i - first] = sl->pts[i].p;
    pcache_write_through(s->pc, sl->seq, sl->ids, sl->n, pts, sl->n_pts - first);
}

/* The answer r gave on sl (a chat's, ended by an end token or its length) is prefilled again
 * from its assistant message's start (the prompt's last mark: where the generation prompt
 * begins) in the next steps: the message's prompt rows, the answer's ids and the template's
 * end ids, then a point at their end (SLOT_CLOSE; close_span). A cold prefill of the next
 * turn restarts its chunk grid at that message's start as this span does, so that point is
 * its state where its next message begins, bit for bit; the rows the slot decoded one by one
 * are other bits. Needs the point at the message's start. */
static void slot_close_begin(sched *s, slot *sl, const sched_req *r) {
    if (!r->exact || r->no_reuse || s->o.n_end == 0 || r->n_marks == 0) return;
    const int64_t at = r->marks[r->n_marks - 1], n_prompt = r->n_ids - at;
    const int64_t n = n_prompt + r->n_out + s->o.n_end;
    if (at <= 0 || at >= r->n_ids || at + n >= s->info.n_ctx) return;
    int i = sl->n_pts - 1;
    while (i >= 0 && sl->pts[i].p->pos > at) i--;
    if (i < 0 || sl->pts[i].p->pos != at) return;
    memcpy(sl->close_ids, r->ids + at, sizeof(int32_t) * (size_t)n_prompt);
    memcpy(sl->close_ids + n_prompt, r->out, sizeof(int32_t) * (size_t)r->n_out);
    memcpy(sl->close_ids + n_prompt + r->n_out, s->o.end_ids, sizeof(int32_t) * (size_t)s->o.n_end);
    sl->n_close_anchor = 0;
    for (int64_t k = 1; k < n && s->o.start_id >= 0; k++)
        if (sl->close_ids[k] == s->o.start_id) {
            sl->close_anchor = xrealloc(sl->close_anchor, sizeof(int64_t) * (size_t)(sl->n_close_anchor + 1));
            sl->close_anchor[sl->n_close_anchor++] = k;
        }
    sl->close_at = at;
    sl->close_n = n;
    sl->close_done = 0;
    sl->close_due = time_now() + 1e-3 * (double)s->o.answer_wait_ms;
    sl->state = SLOT_CLOSE;
}

/* a slot whose answer's prefill has not begun (due or not) */
static bool close_pending(const slot *sl) { return sl->state == SLOT_CLOSE && sl->close_done == 0; }

/* A slot whose answer's prefill has not begun and is not due yet (or held past its due):
 * free for a request (which then prefills the answer itself, closes_yield), and no work for
 * the engine thread. */
static bool close_waiting(const sched *s, const slot *sl, double now) {
    if (!close_pending(sl)) return false;
    /* a prompt being rendered holds it past its due (sched_hold_begin; not under the mutant) */
    const bool held = atomic_load(&s->holds) > 0 && !MUTANT("close_no_hold");
    return now < sl->close_due || (held && now < sl->close_due + SCHED_HOLD_MAX_S);
}

/* under s->mu: the closings not begun that r comes before: the slot of r's own
 * conversation (r holds the rows before the answer's message), and, when no slot is free
 * for r, the one waiting longest; each left as it was before the answer ended (its point at
 * the message's start serves r, which prefills the answer in its own pass) */
static void closes_yield(sched *s, const sched_req *r) {
    if (MUTANT("close_no_yield")) return; /* mutant: the request waits for the closing instead */
    slot *oldest = NULL;
    bool free_slot = false;
    for (int k = 0; k < s->o.n_slots; k++) {
        slot *sl = &s->slots[k];
        if (r->slot_wanted >= 0 && r->slot_wanted != k) continue;
        if (sl->state == SLOT_IDLE) free_slot = true;
        /* a closing not begun, due or not: r would only wait for it (a prompt that held it
         * past its due comes here as its hold ends, sched_hold_begin) */
        if (!close_pending(sl)) continue;
        if (!r->no_reuse && ids_common_prefix(sl->ids, sl->close_at, r->ids, r->n_ids) == sl->close_at) {
            sl->state = SLOT_IDLE;
            s->st.n_closes_skipped++;
            free_slot = true;
        } else if (!oldest || sl->close_due < oldest->close_due) {
            oldest = sl;
        }
    }
    if (!free_slot && oldest) {
        oldest->state = SLOT_IDLE;
        s->st.n_closes_skipped++;
    }
}

static void slot_end(sched *s, slot *sl, sched_finish f, const char *err) {
    sched_req *r = sl->req;
    slot_write_through(s, sl);
    sampler_free(&sl->sm);
    const gmatch_stats gst = sl->gm ? gmatch_get_stats(sl->gm) : (gmatch_stats){0};
    gmatch_free(sl->gm);
    sl->gm = NULL;
    sl->req = NULL;
    sl->state = SLOT_IDLE;
    sl->t_used = time_now();
    if (f == SCHED_STOP || f == SCHED_LENGTH) slot_close_begin(s, sl, r);
    /* counted before the client hears the end, so /metrics read after it counts it */
    const double t_end = time_now();
    pthread_mutex_lock(&s->mu);
    s->st.slots_busy--;
    s->st.n_gen_tokens += r->n_out;
    s->st.gm_masks += gst.masks_walked;
    s->st.gm_entries_made += gst.entries;
    s->st.gm_entries_found += gst.entries_shared;
    s->st.gm_entry_visits += gst.entry_visits;
    if (r->n_out > 0) hist_add(&s->st.ttft, r->t_first - r->t_queued);
    hist_add(&s->st.duration, t_end - r->t_queued);
    pthread_mutex_unlock(&s->mu);
    req_finish(r, f, err, t_end);
    req_unref(r);
}

/* the sampled token: delivered, and the request goes on or ends */
static void slot_took(sched *s, slot *sl, int32_t id, const token_lp *t) {
    sched_req *r = sl->req;
    const bool eog = tokenizer_is_eog(s->tok, id) && !r->ignore_eos;
    if (eog) { slot_end(s, sl, SCHED_STOP, NULL); return; }
    req_push(r, id, t);
    if ((r->n_predict >= 0 && r->n_out >= r->n_predict) || sl->n >= s->info.n_ctx) {
        slot_end(s, sl, SCHED_LENGTH, NULL);
        return;
    }
    sl->next_id = id;
    sl->state = SLOT_GEN;
}

/* Whether the slot's next token is the logits' argmax and nothing else is read from them:
 * greedy, no penalties, no log-probabilities, no test script. Then the engine is asked for
 * the argmax alone (ENGINE_LOGITS_ARGMAX: on the GPU only the id leaves the device). */
static bool slot_greedy(const sched *s, const slot *sl) {
    const sched_req *r = sl->req;
    return sampler_greedy(&r->so) && !sampler_penalizes(&r->so) && r->top_logprobs < 0 && !s->o.script &&
           !(r->ignore_eos && s->n_eog > 0) && !r->grammar && !r->n_bias;
}

static bool newlines_only(const tokenizer *t, int32_t id) {
    size_t n;
    const char *p = tokenizer_piece(t, id, false, &n);
    for (size_t i = 0; p && i < n; i++)
        if (p[i] != '\n') return false;
    return p && n > 0;
}

/* The next token from the slot's logits: log-probabilities first where asked (of the
 * model's own softmax), then the penalties over the context, then the sampler. */
static int32_t slot_sample_draft(sched *s, slot *sl, token_lp *t, int32_t draft, bool *kept);
static int32_t slot_sample(sched *s, slot *sl, token_lp *t) { return slot_sample_draft(s, sl, t, -1, NULL); }

/* The same with a draft (>= 0: the request has no grammar nor script, spec_on): the token is
 * sampler_sample_draft's, *kept whether it is the draft */
static int32_t slot_sample_draft(sched *s, slot *sl, token_lp *t, int32_t draft, bool *kept) {
    const sched_req *r = sl->req;
    float *lg = sl->logits;
    const int K = r->top_logprobs;
    double lse = 0;
    float raw_max = 0;
    if (K >= 0) {
        raw_max = lg[sampler_argmax(lg, s->V)];
        for (int64_t i = 0; i < s->V; i++) lse += exp((double)(lg[i] - raw_max));
        lse = log(lse) + raw_max;
        int k = 0; /* the K best, by insertion (ties: the lower id first) */
        for (int64_t i = 0; i < s->V && K > 0; i++) {
            if (k == K && lg[i] <= lg[t->top_id[K - 1]]) continue;
            int j = k < K ? k++ : K - 1;
            while (j > 0 && lg[t->top_id[j - 1]] < lg[i]) { t->top_id[j] = t->top_id[j - 1]; j--; }
            t->top_id[j] = (int32_t)i;
        }
        for (int j = 0; j < K; j++) t->top_lp[j] = (float)(lg[t->top_id[j]] - lse);
        memcpy(sl->raw, lg, sizeof(float) * (size_t)s->V);
    }
    sampler_penalize(&r->so, lg, sl->ids, sl->n);
    /* ignore_eos as llama-server means it: an end token is never sampled */
    if (r->ignore_eos)
        for (int i = 0; i < s->n_eog; i++) lg[s->eog[i]] = -INFINITY;
    for (int i = 0; i < r->n_bias; i++) lg[r->bias_id[i]] += r->bias[i];
    if (draft >= 0) {
        const int32_t id = sampler_sample_draft(&sl->sm, lg, draft, kept);
        if (K >= 0) t->lp = (float)(sl->raw[id] - lse);
        return id;
    }
    int32_t id = sampler_sample(&sl->sm, lg);
    /* under a grammar: the token sampled when the grammar takes it (one walk of its bytes),
     * else the mask over the whole vocabulary and a new draw (the same distribution as
     * masking first: a refused draw is redrawn from the allowed tokens alone) */
    if (sl->gm && sl->gm_on && !(sl->gm_lead && newlines_only(s->tok, id)) && !gmatch_token_ok(sl->gm, id)) {
        herr ge;
        const int64_t allowed = gmatch_apply(sl->gm, lg, &ge);
        if (allowed <= 0) {
            snprintf(sl->gm_err, sizeof sl->gm_err, "%s", allowed < 0 ? ge.msg : "the grammar allows no token here");
            return -1;
        }
        id = sampler_sample(&sl->sm, lg);
    }
    if (s->o.script) id = s->o.script[r->n_out < s->o.n_script ? r->n_out : s->o.n_script - 1];
    if (K >= 0) t->lp = (float)(sl->raw[id] - lse);
    return id;
}

/* The grammar's state after token id (-1, gm_err set: it failed or refused the token).
 * Before the grammar applies it watches for </think> in the text generated. */
static int slot_grammar_took(sched *s, slot *sl, int32_t id) {
    if (id < 0) return -1;
    if (!sl->req->grammar) return 0;
    if (!sl->gm) return -1; /* gmatch_new failed: gm_err says why */
    if (sl->gm_on) {
        if (sl->gm_lead && newlines_only(s->tok, id)) return 0;
        sl->gm_lead = false;
        if (gmatch_token(sl->gm, id) == 0 || tokenizer_is_eog(s->tok, id)) return 0;
        snprintf(sl->gm_err, sizeof sl->gm_err, "the grammar refused token %d", id);
        return -1;
    }
    size_t n;
    const char *p = tokenizer_piece(s->tok, id, true, &n);
    static const char END[] = "</think>";
    for (size_t i = 0; p && i < n; i++) {
        if (sl->think_n == (int)sizeof END - 1) {
            memmove(sl->think_tail, sl->think_tail + 1, sizeof END - 2);
            sl->think_n--;
        }
        sl->think_tail[sl->think_n++] = p[i];
        if (sl->think_n == (int)sizeof END - 1 && !memcmp(sl->think_tail, END, sizeof END - 1)) {
            sl->gm_on = sl->gm_lead = true; /* the reasoning ended: what follows in this token is the answer's */
            if (i + 1 < n && gmatch_bytes(sl->gm, p + i + 1, n - i - 1) < 0) {
                snprintf(sl->gm_err, sizeof sl->gm_err, "the grammar refused the text after </think>");
                return -1;
            }
            break;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- the engine thread */

/* under s->mu: the slots' state as others may read it */
static void publish(sched *s) {
    s->pc_stats = pcache_get_stats(s->pc);
    s->st.seqs_spare = s->n_seq - s->o.n_slots;
    s->st.seqs_parked = 0;
    for (int q = 0; q < s->n_seq; q++) s->st.seqs_parked += s->seqs[q].slot < 0 && seq_used(s, q);
    const engine_info in = engine_get_info(s->eng); /* the engine thread alone writes these */
    const engine_stats es = engine_get_stats(s->eng);
    s->st.cache_bytes = in.cache_used;
    s->st.n_spare = in.n_spare;
    s->st.spare_bytes = in.spare_bytes;
    s->st.n_point_allocs = es.n_point_allocs;
    s->st.n_point_reserved = es.n_point_reserved;
    s->st.n_spare_releases = es.n_spare_releases;
    for (int k = 0; k < s->o.n_slots; k++) {
        const slot *sl = &s->slots[k];
        int64_t n_out = 0;
        if (sl->req) {
            pthread_mutex_lock(&sl->req->mu);
            n_out = sl->req->n_out;
            pthread_mutex_unlock(&sl->req->mu);
        }
        s->snap[k] = (sched_slot_info){.id = k, .busy = sl->state == SLOT_PREFILL || sl->state == SLOT_GEN,
                                       .n_held = sl->n, .n_points = sl->n_pts,
                                       .n_prompt = sl->req ? sl->req->n_ids : 0, .n_out = n_out};
    }
}

/* sl's next piece of its answer's prefill into sp (SLOT_CLOSE); the first piece restores the
 * point at the message's start. Pieces end where a cold pass's would (on the message's chunk
 * grid, restarted at the message starts inside it), the last with a mark at the end. false:
 * given up, the slot left as it is (the point at the start is gone, or refused). */
static bool close_span(sched *s, slot *sl, engine_span *sp) {
    const int64_t at = sl->close_at;
    if (sl->close_done == 0) {
        slot_drop_points_past(s, sl, at);
        if (sl->n_pts == 0 || sl->pts[sl->n_pts - 1].p->pos != at) return false;
        if (MUTANT("close_decode")) { /* mutant: the decoded rows kept, the rest appended to them */
            sl->close_done = sl->n - at;
        } else {
            herr e;
            pcache_seq_cut(s->pc, sl->seq, at);
            if (engine_restore(s->eng, sl->seq, sl->pts[sl->n_pts - 1].p, &e) < 0) return false;
            sl->n = at;
        }
        sl->pts[sl->n_pts - 1].t_used = time_now();
        sl->pf_base = at; /* the points past it are this prefill's own (point_alloc) */
    }
    const int64_t a = sl->close_done;
    int64_t b = engine_piece_end(sl->close_anchor, sl->n_close_anchor, sl->close_n, a, s->info.rows_per_pass,
                                 s->info.chunk);
    sl->span_anchors = 0;
    for (int i = 0; i < sl->n_close_anchor && sl->close_anchor[i] < b; i++) {
        if (sl->close_anchor[i] <= a) continue;
        if (sl->span_anchors == SLOT_POINTS) { b = sl->close_anchor[i]; break; } /* an anchor is on the grid */
        sl->span_anchor[sl->span_anchors++] = sl->close_anchor[i] - a;
    }
    sl->span_b = b;
    sl->span_marks = 0;
    engine_point *p = b == sl->close_n ? point_alloc(s, sl) : NULL;
    if (p) {
        sl->span_pts[0] = p;
        sl->span_mark_pos[0] = b - a;
        sl->span_marks = 1;
    }
    *sp = (engine_span){.seq = sl->seq, .ids = sl->close_ids + a, .n = b - a, .marks = sl->span_mark_pos,
                        .n_marks = sl->span_marks, .points = sl->span_pts, .anchors = sl->span_anchor,
                        .n_anchors = sl->span_anchors, .want = ENGINE_LOGITS_NONE};
    return true;
}

/* after the step's engine_run (rc): sl's piece of its answer's prefill ran, or nothing did */
static void close_ran(sched *s, slot *sl, const engine_span *sp, int rc) {
    if (rc < 0) { /* the sequence is where the piece would have begun */
        for (int j = 0; j < sl->span_marks; j++) engine_point_free(s->eng, sl->span_pts[j]);
        sl->state = SLOT_IDLE;
        return;
    }
    memcpy(sl->ids + sl->n, sp->ids, sizeof(int32_t) * (size_t)sp->n);
    sl->n += sp->n;
    for (int j = 0; j < sl->span_marks; j++) slot_add_point(s, sl, sl->span_pts[j], sl->close_at);
    pthread_mutex_lock(&s->mu);
    s->st.n_points += sl->span_marks;
    pthread_mutex_unlock(&s->mu);
    sl->close_done = sl->span_b;
    if (sl->close_done == sl->close_n) sl->state = SLOT_IDLE;
}

/* Whether r continues the conversation a slot is closing (it holds the rows before that
 * slot's assistant message): it waits for the step that ends the closing, then resumes past
 * the answer. */
static bool close_holds(const sched *s, const sched_req *r) {
    for (int k = 0; k < s->o.n_slots && !r->no_reuse; k++) {
        const slot *sl = &s->slots[k];
        if (sl->state == SLOT_CLOSE && (r->slot_wanted < 0 || r->slot_wanted == k) &&
            ids_common_prefix(sl->ids, sl->close_at, r->ids, r->n_ids) == sl->close_at)
            return true;
    }
    return false;
}

/* ---------------------------------------------------------------- prefixes shared in flight */

/* Below this many chunks past where a request resumes anyway, it prefills a shared prefix
 * itself: a copy of another slot's point, or a step's wait, would save less than it costs. */
#define SHARE_MIN_CHUNKS 4

static bool share_on(const sched *s, const sched_req *r) {
    /* (--cache-ram 0 keeps no entry in RAM: a point put in the cache would not serve) */
    return !r->no_reuse && !s->o.cache_ram_off && r->slot_wanted < 0;
}

/* The rows of a slot in flight whose points another request may resume from: what it holds,
 * and while it closes an answer only what lies before the message it prefills again. */
static int64_t flight_rows(const slot *sl) {
    if (sl->state == SLOT_PREFILL || sl->state == SLOT_GEN) return sl->n;
    if (sl->state == SLOT_CLOSE) return sl->close_at < sl->n ? sl->close_at : sl->n;
    return 0;
}

/* The latest point of a slot in flight (another request's prefill took it) that r may resume
 * from, past row after: its row (0: none), *from and *pi naming it. */
static int64_t flight_point(const sched *s, const sched_req *r, int64_t after, slot **from, int *pi) {
    int64_t best = after;
    *from = NULL;
    *pi = -1;
    for (int k = 0; k < s->o.n_slots; k++) {
        slot *sl = &s->slots[k];
        const int64_t held = flight_rows(sl);
        if (held <= best) continue;
        const int64_t common = ids_common_prefix(sl->ids, held, r->ids, r->n_ids);
        const int64_t lim = common < r->n_ids - 1 ? common : r->n_ids - 1;
        for (int i = sl->n_pts - 1; i >= 0 && sl->pts[i].p->pos > best; i--) {
            const int64_t pos = sl->pts[i].p->pos;
            if (pos <= lim && resume_ok(s, r, pos)) { best = pos; *from = sl; *pi = i; break; }
        }
    }
    return *from ? best : 0;
}

/* The mark r waits for instead of prefilling the rows before it itself: the latest row m, at
 * least SHARE_MIN_CHUNKS chunks past row after (where r resumes anyway), that a slot still
 * prefilling takes a point at (one of its marks ahead) and r may resume from, when that slot
 * is at or past row after: it reaches m no later than r would alone, and every step meanwhile
 * runs the prefix's rows once instead of twice. 0: none; *leader: the slot. */
static int64_t flight_wait(const sched *s, const sched_req *r, int64_t after, slot **leader) {
    int64_t best = after + SHARE_MIN_CHUNKS * s->info.chunk - 1;
    *leader = NULL;
    for (int k = 0; k < s->o.n_slots; k++) {
        slot *sl = &s->slots[k];
        if (sl->state != SLOT_PREFILL || sl->pf_pos < after) continue;
        if (r->wait_for && r->wait_for != sl->req) continue; /* one leader a request: see admit */
        const sched_req *l = sl->req;
        const int64_t common = ids_common_prefix(l->ids, l->n_ids, r->ids, r->n_ids);
        const int64_t lim = common < r->n_ids - 1 ? common : r->n_ids - 1;
        for (int i = sl->n_marks - 1; i >= sl->mark_i && sl->marks[i] > best; i--) {
            const int64_t m = sl->marks[i];
            if (m > sl->pf_pos && m <= lim && resume_ok(s, r, m)) { best = m; *leader = sl; break; }
        }
    }
    return *leader ? best : 0;
}

/* A copy of point pi of slot sl (in flight) into the shared cache, its KV rows shared with
 * sl's sequence, not copied (pcache_put): a request on any free slot resumes from it. */
static void flight_publish(sched *s, slot *sl, int pi) {
    engine_point *p = point_alloc(s, NULL);
    if (!p) return;
    engine_point_copy(p, sl->pts[pi].p);
    sl->pts[pi].t_used = time_now();
    pcache_put(s->pc, sl->seq, sl->ids, sl->n, &p, 1);
}

/* under s->mu: the i-th queued request, taken out of the queue */
static sched_req *queue_take(sched *s, int64_t i) {
    const int64_t Q = s->o.queue_max;
    sched_req *r = s->q[(s->q_head + i) % Q];
    for (int64_t j = i; j > 0; j--) s->q[(s->q_head + j) % Q] = s->q[(s->q_head + j - 1) % Q];
    s->q_head = (s->q_head + 1) % Q;
    s->q_n--;
    s->st.queue_depth = s->q_n;
    return r;
}

/* under s->mu: queued requests into free slots, in order, the best-matching slot first.
 *
 * A prefix that requests in flight share is prefilled once (sched.h): a request resumes from
 * the point a slot in flight took in it (a copy put in the shared cache, its rows copied from
 * that slot's sequence), or, when such a slot is still prefilling toward a mark the request may
 * resume from, it stays queued (flight_wait) and that slot's piece ends at the mark (hold_at),
 * so the next round finds the point. A request passed over keeps a free slot for itself:
 * later ones take only the slots beyond those kept, so none overtakes it for good. It waits
 * for one leader only (r->wait_for): if that one is cancelled or fails before the mark, or
 * its point could not be kept, the request prefills the prefix itself. */
static void admit(sched *s) {
    for (int k = 0; k < s->o.n_slots; k++) s->slots[k].hold_at = 0;
    int kept = 0; /* requests passed over, each keeping a free slot */
    for (int64_t i = 0; i < s->q_n;) {
        sched_req *r = s->q[(s->q_head + i) % s->o.queue_max];
        closes_yield(s, r);
        slot *best = NULL;
        int64_t best_at = -1;
        int n_free = 0;
        for (int k = 0; k < s->o.n_slots; k++) {
            slot *sl = &s->slots[k];
            if (sl->state != SLOT_IDLE) continue;
            n_free++;
            if (r->slot_wanted >= 0 && r->slot_wanted != k) continue;
            int pt;
            const int64_t at = slot_resume(s, sl, r, &pt);
            if (at > best_at || (at == best_at && sl->t_used < best->t_used)) { best = sl; best_at = at; }
        }
        if (!best || n_free <= kept) return;
        if (close_holds(s, r)) { kept++; i++; continue; }
        /* the shared cache, when it resumes later than any free slot: on the least recently
         * used free slot; a point of a request in flight first put there, when it is later still */
        int ei, pi;
        int64_t cache_at = cache_resume(s, r, &ei, &pi);
        slot *from = NULL, *leader = NULL;
        int fp;
        bool shared = false; /* resumes from a point of a request in flight, put in the cache now */
        if (share_on(s, r)) {
            const int64_t own = best_at > cache_at ? best_at : cache_at;
            if (flight_point(s, r, own + SHARE_MIN_CHUNKS * s->info.chunk - 1, &from, &fp) > 0) {
                flight_publish(s, from, fp);
                cache_at = cache_resume(s, r, &ei, &pi);
                shared = cache_at > own;
            } else {
                const int64_t m = flight_wait(s, r, own, &leader);
                if (m > 0) {
                    if (!leader->hold_at || m < leader->hold_at) leader->hold_at = m;
                    r->wait_for = leader->req;
                    kept++;
                    i++;
                    continue;
                }
            }
        }
        const bool from_cache = cache_at > best_at;
        for (int k = 0; from_cache && k < s->o.n_slots; k++) {
            slot *sl = &s->slots[k];
            if (sl->state == SLOT_IDLE && (r->slot_wanted < 0 || r->slot_wanted == k) && sl->t_used < best->t_used) best = sl;
        }
        queue_take(s, i);
        s->st.slots_busy++;
        slot_start(s, best, r, from_cache, ei, pi, cache_at);
        if ((shared || r->wait_for) && from_cache && r->n_cached == cache_at) {
            pthread_mutex_lock(&r->mu);
            const size_t w = strlen(r->cache_why);
            snprintf(r->cache_why + w, sizeof r->cache_why - w, ", %s",
                     shared ? "taken by a request in flight on another slot" : "waited for while a request in flight took it");
            pthread_mutex_unlock(&r->mu);
        }
        if (shared) s->st.n_flight_shares++;
        if (r->wait_for) s->st.n_flight_waits++;
        s->st.n_prompt_tokens += r->n_ids - r->n_cached;
        s->st.n_cached_tokens += r->n_cached;
        if (r->n_cached > 0) s->st.n_hits++;
        else s->st.n_misses++;
    }
}

/* A step's prompt rows: one pass's worth (rows_per_pass), to the prefilling slots in the order
 * their requests were queued, each slot's piece as long as what is left allows. Several
 * prompts arriving together end one after another instead of all at the end of a round
 * robin, so their times to first token add up to about half as much, and a step (the decode
 * rows of the other slots wait for it) stays one pass long. A slot left with less than a
 * chunk gets none this step (a piece ends on the chunk grid: engine_piece_end). The first
 * queued runs first, so no request waits on later ones. */
static void prompt_turns(sched *s) {
    int64_t left = s->info.rows_per_pass;
    for (int k = 0; k < s->o.n_slots; k++) s->slots[k].step_most = 0;
    for (;;) {
        slot *first = NULL;
        for (int k = 0; k < s->o.n_slots; k++) {
            slot *sl = &s->slots[k];
            if (sl->state == SLOT_PREFILL && sl->step_most == 0 && (!first || sl->req->t_queued < first->req->t_queued))
                first = sl;
        }
        if (!first) return;
        if (left < s->info.chunk) {
            first->step_most = -1; /* none this step (marked so the search moves on) */
            continue;
        }
        const int64_t a = first->pf_pos, r_left = first->req->n_ids - a;
        first->step_most = left;
        left -= r_left < left ? r_left : left;
    }
}

/* --spec-mtp: whether slot sl (SLOT_GEN) drafts this step; if so its span in sp: [next_id,
 * drafts] anchored at every row (a decode step's bits each) and marked at rows 1..k (the
 * points after each), all rows' logits. Not under a grammar (its draws mix a refused draw's
 * redraw into the distribution) nor the test script; no more drafts than the answer and the
 * context have room for; fewer where the budget holds fewer points (none: a plain step). */
static bool spec_span(sched *s, slot *sl, engine_span *sp) {
    const sched_req *r = sl->req;
    sl->spec_k = 0;
    if (s->o.spec_k <= 0 || r->grammar || s->o.script) return false;
    herr e;
    while (sl->n_spec_pts < s->o.spec_k && engine_point_new(s->eng, &sl->spec_pts[sl->n_spec_pts], &e) == 0) sl->n_spec_pts++;
    int64_t k = sl->n_spec_pts;
    if (r->n_predict >= 0 && k > r->n_predict - r->n_out - 1) k = r->n_predict - r->n_out - 1;
    if (k > s->info.n_ctx - sl->n - 1) k = s->info.n_ctx - sl->n - 1;
    if (k <= 0) return false;
    const int got = engine_mtp_draft(s->eng, sl->seq, sl->next_id, (int)k, sl->spec_ids + 1, NULL, &e);
    if (got <= 0) return false;
    for (int i = 0; i < got && s->o.spec_replay; i++) /* the test seam: the expected answer's ids */
        if (r->n_out + i < s->o.n_spec_replay) sl->spec_ids[1 + i] = s->o.spec_replay[r->n_out + i];
    sl->spec_k = got;
    sl->spec_ids[0] = sl->next_id;
    for (int i = 0; i < got; i++) sl->spec_marks[i] = i + 1;
    *sp = spec_verify_span(sl->seq, sl->spec_ids, got, sl->spec_marks, sl->spec_pts, sl->spec_logits);
    sl->req->n_drafted += got;
    return true;
}

/* whether slot_took ends the answer at id (before it is taken) */
static bool took_ends(const sched *s, const slot *sl, int32_t id) {
    const sched_req *r = sl->req;
    return (tokenizer_is_eog(s->tok, id) && !r->ignore_eos) || (r->n_predict >= 0 && r->n_out + 1 >= r->n_predict) ||
           sl->n >= s->info.n_ctx;
}

/* After a speculative span ran (sl->n counts its k + 1 rows): its rows' tokens in order, as a
 * plain step takes one; draft i + 1 is kept where row i's token is it. The sequence then
 * holds the rows up to the last token taken (the point after it restored where rows past it
 * ran), so sl->ids[0, n) is what it holds, as after plain steps. */
static void spec_took(sched *s, slot *sl) {
    const int k = sl->spec_k;
    const int64_t base = sl->n - (k + 1);
    token_lp tl;
    sl->spec_k = 0;
    for (int i = 0; i <= k; i++) {
        sched_req *r = sl->req;
        sl->n = base + i + 1; /* rows 0..i: what a plain decode would hold when row i's token is sampled */
        memcpy(sl->logits, sl->spec_logits + (size_t)i * (size_t)s->V, sizeof(float) * (size_t)s->V);
        bool kept = false;
        const int32_t id = slot_sample_draft(s, sl, &tl, i < k ? sl->spec_ids[i + 1] : -1, &kept);
        kept = kept && i < k;
        /* the last token this step: the sequence must hold rows 0..i before it is taken */
        const bool last = !kept || took_ends(s, sl, id);
        if (i < k && last) {
            herr e;
            if (engine_restore(s->eng, sl->seq, sl->spec_pts[i], &e) < 0) {
                sl->n = base; /* (not reached: the points are the span's own) */
                slot_end(s, sl, SCHED_ERROR, e.msg);
                return;
            }
        }
        r->n_accepted += kept;
        slot_took(s, sl, id, r->top_logprobs >= 0 ? &tl : NULL);
        if (last || sl->state != SLOT_GEN) return;
    }
}

/* one engine_run over every busy slot; stopping: s->stopping as loop read it under mu (the
 * engine thread reads it nowhere else unlocked) */
static void step(sched *s, bool stopping) {
    const bool model_ok = model_file_ok(s);
    int n = 0;
    bool prompt_rows = false;
    const int64_t rpp = s->info.rows_per_pass;
    prompt_turns(s);
    for (int k = 0; k < s->o.n_slots; k++) {
        slot *sl = &s->slots[k];
        if (sl->state == SLOT_IDLE) continue;
        if (sl->state == SLOT_CLOSE) {
            if (!stopping && close_waiting(s, sl, time_now())) continue;
            const bool begins = sl->close_done == 0;
            if (stopping || !model_ok || !close_span(s, sl, &s->spans[n])) {
                sl->state = SLOT_IDLE;
            } else {
                if (begins) {
                    pthread_mutex_lock(&s->mu);
                    s->st.n_closes++;
                    pthread_mutex_unlock(&s->mu);
                }
                s->span_slot[n++] = sl;
                prompt_rows = true;
            }
            continue;
        }
        sched_req *r = sl->req;
        if (req_cancelled(r) || stopping || !model_ok) {
            slot_end(s, sl, SCHED_CANCELLED, stopping ? "the server is stopping" : !model_ok ? s->model_err : NULL);
            continue;
        }
        engine_span *sp = &s->spans[n];
        *sp = (engine_span){.seq = sl->seq, .logits = sl->logits, .token = &sl->greedy};
        const engine_logits last = slot_greedy(s, sl) ? ENGINE_LOGITS_ARGMAX : ENGINE_LOGITS_LAST;
        if (sl->state == SLOT_PREFILL && sl->step_most <= 0) continue; /* its turn comes (prompt_turns) */
        if (sl->state == SLOT_PREFILL) {
            /* the next piece ends where the engine would end a pass's piece: on the chunk
             * grid laid from row 0 and restarted at every mark, which the span carries as
             * anchors (the resume row is on it: resume_ok) */
            const int64_t a = sl->pf_pos;
            sl->span_anchors = 0;
            int64_t b = engine_piece_end(r->marks, r->n_marks, r->n_ids, a, sl->step_most < rpp ? sl->step_most : rpp,
                                         s->info.chunk);
            /* a span takes at most SLOT_POINTS points: past them it ends at a mark (on the grid) */
            if (sl->n_marks - sl->mark_i > SLOT_POINTS && sl->marks[sl->mark_i + SLOT_POINTS - 1] < b)
                b = sl->marks[sl->mark_i + SLOT_POINTS - 1];
            /* queued requests wait for the point at hold_at (admit): the piece ends at that mark */
            if (sl->hold_at > a && sl->hold_at < b) b = sl->hold_at;
            for (int i = 0; i < r->n_marks; i++)
                if (r->marks[i] > a && r->marks[i] < b) sl->span_anchor[sl->span_anchors++] = r->marks[i] - a;
            sl->span_b = b;
            sl->span_marks = 0;
            while (sl->mark_i < sl->n_marks && sl->marks[sl->mark_i] <= b) {
                engine_point *p = point_alloc(s, sl);
                if (p) {
                    sl->span_pts[sl->span_marks] = p;
                    sl->span_mark_pos[sl->span_marks] = sl->marks[sl->mark_i] - a;
                    sl->span_marks++;
                }
                sl->mark_i++;
            }
            sp->ids = r->ids + a;
            sp->n = b - a;
            sp->marks = sl->span_mark_pos;
            sp->n_marks = sl->span_marks;
            sp->points = sl->span_pts;
            sp->anchors = sl->span_anchor;
            sp->n_anchors = sl->span_anchors;
            sp->want = b == r->n_ids ? last : ENGINE_LOGITS_NONE;
            prompt_rows = true;
        } else if (!spec_span(s, sl, sp)) {
            sp->ids = &sl->next_id;
            sp->n = 1;
            sp->want = last;
        }
        s->span_slot[n++] = sl;
    }
    if (n == 0) return;
    herr e;
    const double t0 = time_now();
    const int rc = engine_run(s->eng, s->spans, n, &e);
    const double dt = time_now() - t0;
    pthread_mutex_lock(&s->mu);
    if (prompt_rows) s->st.t_prompt += dt;
    else s->st.t_gen += dt;
    s->st.n_steps++;
    s->st.n_step_spans += n;
    pthread_mutex_unlock(&s->mu);
    token_lp tl;
    for (int i = 0; i < n; i++) {
        slot *sl = s->span_slot[i];
        sched_req *r = sl->req;
        const engine_span *sp = &s->spans[i];
        if (sl->state == SLOT_CLOSE) {
            close_ran(s, sl, sp, rc);
            continue;
        }
        if (rc < 0) { /* nothing ran: the engine named why (a budget, the context) */
            for (int j = 0; sl->state == SLOT_PREFILL && j < sl->span_marks; j++) engine_point_free(s->eng, sl->span_pts[j]);
            slot_end(s, sl, SCHED_ERROR, e.msg);
            continue;
        }
        memcpy(sl->ids + sl->n, sp->ids, sizeof(int32_t) * (size_t)sp->n);
        sl->n += sp->n;
        if (sl->state == SLOT_PREFILL) {
            for (int j = 0; j < sl->span_marks; j++) slot_add_point(s, sl, sl->span_pts[j], -1);
            pthread_mutex_lock(&s->mu);
            s->st.n_points += sl->span_marks;
            pthread_mutex_unlock(&s->mu);
            sl->pf_pos = sl->span_b;
            if (sl->pf_pos < r->n_ids) continue;
        }
        if (sl->spec_k > 0) {
            spec_took(s, sl);
            continue;
        }
        const int32_t id = sp->want == ENGINE_LOGITS_ARGMAX ? sl->greedy : slot_sample(s, sl, &tl);
        if (slot_grammar_took(s, sl, id) < 0) {
            slot_end(s, sl, SCHED_ERROR, sl->gm_err);
            continue;
        }
        slot_took(s, sl, id, r->top_logprobs >= 0 ? &tl : NULL);
    }
}

static bool busy(const sched *s) {
    const double now = time_now();
    for (int k = 0; k < s->o.n_slots; k++)
        if (s->slots[k].state != SLOT_IDLE && !close_waiting(s, &s->slots[k], now)) return true;
    return false;
}

/* the earliest time a waiting closing is due (close_waiting: held, its due's hold ends it;
 * a hold let go wakes the engine thread), or 0: none */
static double close_due_first(const sched *s) {
    double t = 0;
    const double hold = atomic_load(&s->holds) > 0 && !MUTANT("close_no_hold") ? SCHED_HOLD_MAX_S : 0;
    for (int k = 0; k < s->o.n_slots; k++) {
        const slot *sl = &s->slots[k];
        if (close_pending(sl) && (t == 0 || sl->close_due + hold < t)) t = sl->close_due + hold;
    }
    return t;
}

static bool work_asked(const sched *s) { return s->job.busy && !s->job.done; }

enum { JOB_SAVE, JOB_RESTORE, JOB_ERASE };

/* under s->mu: a /slots save, restore or erase, decided on the slot's state as it is now */
static void run_job(sched *s) {
    if (!s->job.busy || s->job.done) return;
    slot *sl = &s->slots[s->job.slot];
    if (close_waiting(s, sl, time_now())) { /* the job comes first (closes_yield) */
        sl->state = SLOT_IDLE;
        s->st.n_closes_skipped++;
    }
    if (sl->state == SLOT_CLOSE) return; /* after its answer's end point (the next step) */
    if (s->job.kind != JOB_RESTORE && sl->state != SLOT_IDLE) {
        s->job.rc = herr_set(&s->job.e, "slot %d is running a request", sl->id);
    } else if (s->job.kind == JOB_ERASE) {
        slot_fresh(s, sl);
        pcache_seq_cut(s->pc, sl->seq, 0);
        engine_seq_clear(s->eng, sl->seq);
        while (sl->n_pts) slot_drop_point(s, sl, sl->n_pts - 1);
        sl->n = 0;
        s->job.rc = 0;
    } else if (s->job.kind == JOB_SAVE) {
        engine_point *pts[SLOT_POINTS];
        for (int i = 0; i < sl->n_pts; i++) pts[i] = sl->pts[i].p;
        s->job.rc = pcache_save(s->pc, sl->seq, sl->ids, sl->n, pts, sl->n_pts, s->job.path, &s->job.n, &s->job.e);
    } else {
        s->job.rc = pcache_load(s->pc, s->job.path, &s->job.n, &s->job.e);
    }
    s->job.done = true;
    pthread_cond_broadcast(&s->job_cv);
}

/* engine thread, s->mu held: adopts the points sp_th made; with ask, asks it for what is
 * still short of spare_want (as far as the budget has room; none under the mutant), else
 * for none (it finishes the point it is making, if any) */
static void spares_sync(sched *s, bool ask_more) {
    pthread_mutex_lock(&s->sp_mu);
    for (int i = 0; i < s->sp_n; i++) engine_point_adopt(s->eng, s->sp_ready[i]);
    s->sp_n = 0;
    const engine_info in = engine_get_info(s->eng);
    const int64_t room = (in.cache_budget - in.cache_used - in.spare_bytes) / (int64_t)in.point_bytes;
    int64_t ask = s->spare_want - in.n_spare;
    if (ask > room) ask = room;
    if (!ask_more) ask = 0;
    s->sp_ask = ask > 0 && !MUTANT("spare_topup_skip") ? (int)ask : 0; /* mutant: spares only as points are freed */
    atomic_store(&s->sp_go, s->sp_ask > 0);
    if (s->sp_ask > 0) pthread_cond_signal(&s->sp_cv);
    pthread_mutex_unlock(&s->sp_mu);
    s->sp_wake = false;
}

/* under s->mu: no request queued, in flight or being rendered, no closing pending, no job
 * (the mutant spare_busy: idle always, so points are made beside the passes) */
static bool spare_idle(const sched *s) {
    if (MUTANT("spare_busy")) return true;
    if (s->q_n > 0 || atomic_load(&s->holds) > 0 || work_asked(s)) return false;
    for (int k = 0; k < s->o.n_slots; k++)
        if (s->slots[k].state != SLOT_IDLE) return false;
    return true;
}

/* under s->mu: when the server, idle since sp_idle_since, has been so SPARE_IDLE_S (0: not idle) */
static double spares_due(const sched *s) { return s->sp_idle_since > 0 ? s->sp_idle_since + SPARE_IDLE_S : 0; }

/* engine thread, s->mu held, about to wait: once the server has been idle SPARE_IDLE_S,
 * sp_th is asked for the spares short; returns when to look again (0: no need) */
static double spares_idle(sched *s, double now) {
    if (!spare_idle(s)) {
        s->sp_idle_since = 0;
        return 0;
    }
    if (s->sp_idle_since == 0) s->sp_idle_since = now;
    if (now < spares_due(s)) return spares_due(s);
    spares_sync(s, true);
    return 0;
}

/* engine thread, s->mu held, at the top of its loop: adopts what sp_th made, and lets it go
 * on only while the server has stayed idle (spares_idle asked) */
static void spares_step(sched *s) {
    if (!spare_idle(s)) s->sp_idle_since = 0;
    spares_sync(s, spares_due(s) > 0 && time_now() >= spares_due(s));
}

/* sp_th: makes the points the engine thread asks for, one at a time, and wakes it (an idle
 * engine thread adopts them at once, so /metrics shows them) */
static void *spare_maker(void *arg) {
    sched *s = arg;
    pthread_mutex_lock(&s->sp_mu);
    while (!s->sp_stop) {
        /* asked for none, or work came (sp_go let go), or a prompt is being made */
        const bool go = atomic_load(&s->sp_go) && (atomic_load(&s->holds) == 0 || MUTANT("spare_busy"));
        if (s->sp_n >= s->sp_ask || !go) {
            pthread_cond_wait(&s->sp_cv, &s->sp_mu);
            continue;
        }
        pthread_mutex_unlock(&s->sp_mu);
        engine_point *p = engine_point_make(s->eng);
        pthread_mutex_lock(&s->sp_mu);
        if (!p) { /* out of memory: none until the engine thread asks again */
            s->sp_ask = 0;
            continue;
        }
        s->sp_ready[s->sp_n++] = p;
        if (s->sp_n >= s->sp_ask) {
            pthread_mutex_unlock(&s->sp_mu);
            pthread_mutex_lock(&s->mu);
            s->sp_wake = true;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            pthread_mutex_lock(&s->sp_mu);
        }
    }
    pthread_mutex_unlock(&s->sp_mu);
    return NULL;
}

static void *loop(void *arg) {
    sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stopping && s->q_n == 0 && !busy(s) && !work_asked(s) && !s->sp_wake) {
            pthread_mutex_unlock(&s->mu);
            const bool evicted = seq_reserve(s); /* idle: a parked sequence's copy made now, off any request's path */
            pthread_mutex_lock(&s->mu);
            if (!evicted && !s->stopping && s->q_n == 0 && !busy(s) && !work_asked(s) && !s->sp_wake) {
                double due = close_due_first(s); /* a closing waiting (--answer-point-wait) */
                const double sp = spares_idle(s, time_now()); /* spares asked for once idle a while */
                if (sp > 0 && (due == 0 || sp < due)) due = sp;
                if (due > 0) {
                    struct timespec ts = {.tv_sec = (time_t)due, .tv_nsec = (long)((due - (double)(time_t)due) * 1e9)};
                    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
                    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
                } else {
                    pthread_cond_wait(&s->cv, &s->mu);
                }
            }
        }
        if (s->stopping && !busy(s)) break;
        spares_step(s);
        run_job(s);
        if (!s->stopping) admit(s);
        publish(s);
        const bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        step(s, stopping);
        pthread_mutex_lock(&s->mu);
        publish(s);
    }
    while (s->q_n > 0) { /* never started */
        sched_req *r = s->q[s->q_head];
        s->q_head = (s->q_head + 1) % s->o.queue_max;
        s->q_n--;
        req_finish(r, SCHED_CANCELLED, "the server is stopping", time_now());
        req_unref(r);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* The grammar vocabulary's thread: the trie, then the entries every JSON and tool-call
 * grammar reaches, made before any request (a request's first masks otherwise make them:
 * ~5 ms a free-text top at 248k tokens). Logs when they are ready. */
static void *vocab_build(void *arg) {
    sched *s = arg;
    if (s->o.gv_delay_ms > 0) { /* the test seam: a grammar request comes before the trie is ready */
        const double until = time_now() + 1e-3 * (double)s->o.gv_delay_ms;
        while (time_now() < until && !atomic_load(&s->gv_stop)) {
            const struct timespec d = {0, 10 * 1000000};
            nanosleep(&d, NULL);
        }
    }
    const double t0 = time_now();
    gvocab *v = atomic_load(&s->gv_stop) ? NULL : gvocab_new(s->tok);
    const double t1 = time_now();
    gvocab_prime_stats ps = {0};
    if (v) schema_prime(v, SCHED_PRIME_STATES, &s->gv_stop, &ps);
    const double t2 = time_now();
    /* published even when stopping (NULL, or partly primed): a request waiting is let go */
    pthread_mutex_lock(&s->gv_mu);
    s->gv = v;
    s->gv_ready = true;
    pthread_cond_broadcast(&s->gv_cv);
    pthread_mutex_unlock(&s->gv_mu);
    if (!v || atomic_load(&s->gv_stop)) return NULL;
    int64_t pin_bytes = 0;
    const int64_t n_pin = gvocab_primed(v, &pin_bytes);
    pthread_mutex_lock(&s->mu);
    s->st.gv_builds++;
    s->st.gv_primed = n_pin;
    s->st.gv_bytes = gvocab_bytes(v) + pin_bytes;
    s->st.gv_ready_s = t2 - t0;
    pthread_mutex_unlock(&s->mu);
    /* (last: once it is logged, /metrics counts it) */
    fprintf(stderr, "hearth serve: grammar vocabulary ready: trie of %d tokens (%" PRId64 " nodes, %.1f MiB) in %.0f ms, "
            "%" PRId64 " primed entries (%.1f MiB) in %.0f ms\n", gvocab_n(v), gvocab_trie_nodes(v),
            (double)gvocab_bytes(v) / 1048576.0, (t1 - t0) * 1e3, n_pin, (double)pin_bytes / 1048576.0, (t2 - t1) * 1e3);
    return NULL;
}

/* ---------------------------------------------------------------- public */

int sched_start(sched **out, engine *eng, const tokenizer *tok, const sched_opts *o, herr *e) {
    const engine_info info = engine_get_info(eng);
    if (o->n_slots < 1 || o->n_slots > info.n_seq_max)
        return herr_set(e, "%d slots (-np) need as many engine sequences; the engine has %d", o->n_slots, info.n_seq_max);
    if (o->queue_max < 1) return herr_set(e, "the queue must hold at least one request");
    sched *s = xcalloc(1, sizeof *s);
    s->eng = eng;
    s->tok = tok;
    s->info = info;
    s->V = tokenizer_n_vocab(tok);
    s->eog = xmalloc(sizeof(int32_t) * (size_t)(s->V + 1));
    for (int64_t i = 0; i < s->V; i++)
        if (tokenizer_is_eog(tok, (int32_t)i)) s->eog[s->n_eog++] = (int32_t)i;
    s->o = *o;
    s->slots = xcalloc((size_t)o->n_slots, sizeof *s->slots);
    s->n_seq = info.n_seq_max;
    s->seqs = xcalloc((size_t)s->n_seq, sizeof *s->seqs);
    for (int q = 0; q < s->n_seq; q++) s->seqs[q] = (struct seq_use){.slot = q < o->n_slots ? q : -1};
    s->st.seqs_spare = s->n_seq - o->n_slots;
    for (int k = 0; k < o->n_slots; k++) {
        s->slots[k].id = k;
        s->slots[k].seq = k;
        s->slots[k].ids = xmalloc(sizeof(int32_t) * (size_t)info.n_ctx);
        s->slots[k].close_ids = xmalloc(sizeof(int32_t) * (size_t)info.n_ctx);
        s->slots[k].logits = xmalloc(sizeof(float) * (size_t)s->V);
        if (s->o.spec_k > 0) s->slots[k].spec_logits = xmalloc(sizeof(float) * (size_t)(SPEC_MAX + 1) * (size_t)s->V);
        s->slots[k].raw = xmalloc(sizeof(float) * (size_t)s->V);
    }
    s->q = xcalloc((size_t)o->queue_max, sizeof *s->q);
    s->spans = xcalloc((size_t)o->n_slots, sizeof *s->spans);
    s->span_slot = xcalloc((size_t)o->n_slots, sizeof *s->span_slot);
    s->snap = xcalloc((size_t)o->n_slots, sizeof *s->snap);
    for (int k = 0; k < o->n_slots; k++) s->snap[k].id = k;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->gv_mu, NULL);
    pthread_cond_init(&s->gv_cv, NULL);
    atomic_init(&s->gv_stop, false);
    pthread_condattr_t ca; /* the loop's timed waits (close_due) are on time_now's clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&s->job_cv, NULL);
    pthread_mutex_init(&s->sp_mu, NULL);
    pthread_cond_init(&s->sp_cv, NULL);
    if (o->model_path && stat(o->model_path, &s->model_st) < 0) {
        herr_set(e, "%s: %s", o->model_path, strerror(errno));
        sched_free(s);
        return -1;
    }
    if (pcache_open(&s->pc, eng, o->cache_dir, e) < 0) {
        sched_free(s);
        return -1;
    }
    if (o->cache_dir) pcache_set_disk_max(s->pc, o->cache_disk ? o->cache_disk : (int64_t)PCACHE_DISK_DEFAULT_MIB << 20);
    pcache_keep_ram(s->pc, !o->cache_ram_off);
    s->pc_stats = pcache_get_stats(s->pc); /* what the files found at start came to */
    /* the first turns find spares too: made here, before the engine thread serves, at most
     * half the cache budget */
    /* HEARTH_SPARES: a bench's and a test's seam, the spares kept ready a slot (default
     * SLOT_SPARES; 1..1024) */
    const char *sv = getenv("HEARTH_SPARES");
    const long asked = sv ? atol(sv) : 0, per = asked > 0 && asked <= 1024 ? asked : SLOT_SPARES;
    const int64_t half = info.cache_budget / 2 / (info.point_bytes > 0 ? (int64_t)info.point_bytes : 1);
    s->spare_want = (int)(per * o->n_slots < half ? per * o->n_slots : half > 0 ? half : 1);
    const double t_sp = time_now();
    if (!MUTANT("spare_topup_skip")) engine_point_reserve(eng, s->spare_want);
    const engine_info ej = engine_get_info(eng);
    if (ej.spare_bytes >= (int64_t)1 << 30) /* what start-up paid for them, where it is felt */
        fprintf(stderr, "hearth serve: %d spare point buffers (%.0f MiB) made in %.2f s\n", ej.n_spare,
                (double)ej.spare_bytes / 1048576.0, time_now() - t_sp);
    publish(s);
    s->sp_ready = xcalloc((size_t)s->spare_want, sizeof *s->sp_ready);
    if (pthread_create(&s->sp_th, NULL, spare_maker, s) != 0) {
        herr_set(e, "cannot start the spare points' thread");
        sched_free(s);
        return -1;
    }
    s->sp_started = true;
    if (pthread_create(&s->th, NULL, loop, s) != 0) {
        herr_set(e, "cannot start the engine thread");
        sched_free(s);
        return -1;
    }
    s->running = true;
    if (pthread_create(&s->gv_th, NULL, vocab_build, s) != 0) {
        herr_set(e, "cannot start the grammar vocabulary's thread");
        sched_free(s);
        return -1;
    }
    s->gv_started = true;
    *out = s;
    return 0;
}

void sched_stop(sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    const bool join = s->running;
    s->running = false;
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->job_cv);
    pthread_mutex_unlock(&s->mu);
    atomic_store(&s->gv_stop, true); /* after stopping: a request it lets go finds the server stopping */
    if (join) pthread_join(s->th, NULL);
    if (s->sp_started) { /* after the engine thread: nothing asks it for more */
        pthread_mutex_lock(&s->sp_mu);
        s->sp_stop = true;
        pthread_cond_signal(&s->sp_cv);
        pthread_mutex_unlock(&s->sp_mu);
        pthread_join(s->sp_th, NULL);
        s->sp_started = false;
    }
}

/* the grammar vocabulary, waited for (vocab_build); NULL when the server stopped before it was made */
static gvocab *vocab_wait(sched *s) {
    pthread_mutex_lock(&s->gv_mu);
    const bool waited = !s->gv_ready;
    while (!s->gv_ready) pthread_cond_wait(&s->gv_cv, &s->gv_mu);
    gvocab *v = s->gv;
    pthread_mutex_unlock(&s->gv_mu);
    if (waited) {
        pthread_mutex_lock(&s->mu);
        s->st.gv_waits++;
        pthread_mutex_unlock(&s->mu);
    }
    return v;
}

void sched_free(sched *s) {
    if (!s) return;
    sched_stop(s);
    for (int k = 0; k < s->o.n_slots; k++) /* before the cache: a pending write may read them */
        while (s->slots[k].n_pts) slot_drop_point(s, &s->slots[k], s->slots[k].n_pts - 1);
    pcache_free(s->pc); /* (writes what was handed to it first) */
    for (int i = 0; i < s->sp_n; i++) engine_point_adopt(s->eng, s->sp_ready[i]); /* kept or freed */
    free(s->sp_ready);
    for (int k = 0; k < s->o.n_slots; k++) {
        slot *sl = &s->slots[k];
        free(sl->ids);
        free(sl->logits);
        free(sl->spec_logits);
        for (int i = 0; i < sl->n_spec_pts; i++) engine_point_free(s->eng, sl->spec_pts[i]);
        free(sl->raw);
        free(sl->marks);
        free(sl->close_ids);
        free(sl->close_anchor);
    }
    free(s->slots);
    free(s->seqs);
    free(s->eog);
    if (s->gv_started) pthread_join(s->gv_th, NULL); /* (bounded: a trie and schema_prime) */
    gvocab_free(s->gv);
    pthread_mutex_destroy(&s->gv_mu);
    pthread_cond_destroy(&s->gv_cv);
    free(s->q);
    free(s->spans);
    free(s->span_slot);
    free(s->snap);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->job_cv);
    pthread_mutex_destroy(&s->sp_mu);
    pthread_cond_destroy(&s->sp_cv);
    free(s);
}

/* A prompt (not a chat's) gets the marks a chat would have at the same ids: every <|im_start|>
 * row (its cold pass then lays its chunks as a chat's does, so the points of either serve
 * the other with a cold pass's bits), and the last row a whole number of chunks past the last
 * of them (where a later prompt extending this one resumes). Under a template without
 * <|im_start|> a chat's message starts are no function of its ids: such a prompt runs cold
 * and leaves no point (slot_start). */
static void prompt_marks(const sched *s, sched_req *r) {
    free(r->marks);
    r->marks = NULL;
    r->n_marks = 0;
    if (s->o.start_id < 0) {
        r->no_reuse = true;
        return;
    }
    int64_t n = 0;
    for (int64_t i = 1; i < r->n_ids; i++) n += r->ids[i] == s->o.start_id;
    if (n >= INT32_MAX - 1) return; /* (cannot be: the context is smaller) */
    r->marks = xmalloc(sizeof(int64_t) * (size_t)(n + 1));
    for (int64_t i = 1; i < r->n_ids; i++)
        if (r->ids[i] == s->o.start_id) r->marks[r->n_marks++] = i;
    const int64_t from = r->n_marks ? r->marks[r->n_marks - 1] : 0;
    const int64_t g = from + (r->n_ids - from) / s->info.chunk * s->info.chunk;
    if (g > from && g < r->n_ids) r->marks[r->n_marks++] = g;
}

static int submit(sched *s, sched_req *r, sched_hold *h, herr *e);

sched_hold sched_hold_begin(sched *s) {
    atomic_fetch_add(&s->holds, 1); /* (the spare thread begins no point while one is counted) */
    return (sched_hold){.s = s, .on = true};
}

/* under s->mu or not: the count falls once a hold */
static void hold_drop(sched_hold *h) {
    if (!h || !h->on) return;
    h->on = false;
    atomic_fetch_sub(&h->s->holds, 1);
}

void sched_hold_end(sched_hold *h) {
    if (!h || !h->on) return;
    pthread_mutex_lock(&h->s->mu);
    hold_drop(h);
    pthread_cond_broadcast(&h->s->cv); /* a closing held past its due may run now */
    pthread_mutex_unlock(&h->s->mu);
}

int sched_submit(sched *s, sched_req *r, sched_hold *h, herr *e) {
    const int rc = submit(s, r, h, e);
    sched_hold_end(h); /* refused: let go here */
    return rc;
}

static int submit(sched *s, sched_req *r, sched_hold *h, herr *e) {
    atomic_store(&s->sp_go, MUTANT("spare_busy")); /* work comes: the spare thread stops (spares_idle) */
    if (r->n_ids < 1) return herr_set(e, "the prompt is empty");
    if (!r->exact) prompt_marks(s, r);
    if (r->n_ids >= s->info.n_ctx)
        return herr_set(e, "the prompt has %lld tokens, the context of a slot %lld (-c)", (long long)r->n_ids,
                        (long long)s->info.n_ctx);
    if (r->slot_wanted >= s->o.n_slots) return herr_set(e, "there is no slot %d (-np %d)", r->slot_wanted, s->o.n_slots);
    if (r->grammar && !vocab_wait(s)) { /* made at start (vocab_build), never here */
        herr_set(e, "the server is stopping");
        return SCHED_UNAVAILABLE;
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping || !model_file_ok_locked(s) || s->q_n == s->o.queue_max) {
        /* read under mu: sched_stop and model_file_ok write them */
        if (s->stopping) herr_set(e, "the server is stopping");
        else if (s->model_bad) herr_set(e, "%s", s->model_err);
        else herr_set(e, "the queue is full (%lld requests wait)", (long long)s->o.queue_max);
        s->st.n_refused++;
        pthread_mutex_unlock(&s->mu);
        return SCHED_UNAVAILABLE;
    }
    r->t_queued = time_now();
    s->q[(s->q_head + s->q_n) % s->o.queue_max] = r;
    s->q_n++;
    s->st.queue_depth = s->q_n;
    s->st.n_requests++;
    hold_drop(h); /* with r queued: the engine thread sees the one or the other */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

sched_stats sched_get_stats(sched *s) {
    pthread_mutex_lock(&s->mu);
    sched_stats st = s->st;
    st.pc = s->pc_stats;
    pthread_mutex_unlock(&s->mu);
    return st;
}

int sched_slots(sched *s, sched_slot_info *out, int max) {
    pthread_mutex_lock(&s->mu);
    int n = s->o.n_slots < max ? s->o.n_slots : max;
    memcpy(out, s->snap, sizeof *out * (size_t)n);
    pthread_mutex_unlock(&s->mu);
    return n;
}


/* one job at a time; waits for the engine thread to run it */
static int slot_job(sched *s, int kind, int k, const char *path, int64_t *n, herr *e) {
    if (k < 0 || k >= s->o.n_slots) return herr_set(e, "there is no slot %d (-np %d)", k, s->o.n_slots);
    pthread_mutex_lock(&s->mu);
    while (s->job.busy && !s->stopping) pthread_cond_wait(&s->job_cv, &s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return herr_set(e, "the server is stopping");
    }
    s->job.busy = true;
    s->job.done = false;
    s->job.kind = kind;
    s->job.slot = k;
    s->job.path = path;
    pthread_cond_broadcast(&s->cv);
    while (!s->job.done && !s->stopping) pthread_cond_wait(&s->job_cv, &s->mu);
    int rc = s->job.done ? s->job.rc : herr_set(e, "the server is stopping");
    if (s->job.done && rc < 0) *e = s->job.e;
    *n = s->job.n;
    s->job.busy = false;
    pthread_cond_broadcast(&s->job_cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sched_slot_save(sched *s, int k, const char *path, int64_t *n, herr *e) { return slot_job(s, JOB_SAVE, k, path, n, e); }
int sched_slot_restore(sched *s, int k, const char *path, int64_t *n, herr *e) {
    return slot_job(s, JOB_RESTORE, k, path, n, e);
}
int sched_slot_erase(sched *s, int k, herr *e) {
    int64_t n;
    return slot_job(s, JOB_ERASE, k, NULL, &n, e);
}

bool sched_model_ok(sched *s, char *why, size_t cap) {
    pthread_mutex_lock(&s->mu);
    const bool ok = model_file_ok_locked(s);
    if (!ok) snprintf(why, cap, "%s", s->model_err);
    pthread_mutex_unlock(&s->mu);
    return ok;
}
