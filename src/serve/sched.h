/* sched.h: the server's scheduler. One engine thread owns the engine; N slots, each holding
 * one engine sequence, run requests. Every step puts each generating slot's decode row and each
 * prefilling slot's next prompt piece into one engine_run call (continuous batching).
 *
 * Bits: a prompt is cut into pieces of at most rows_per_pass rows where the engine would cut
 * them (engine_piece_end, on the chunk grid laid from the row it resumes at), the cut a solo
 * engine_run of the same rows makes, and the engine is batch invariant, so a request's
 * tokens are the same bits whatever runs beside it.
 *
 * Prompt reuse: each slot keeps the ids its sequence holds and the points its last prompts
 * took at their message starts (marks) and last row. A new request goes to the free slot
 * that shares the longest prefix with it, and resumes from the latest point inside the
 * shared prefix (engine_restore, which checks the prefix by hash), or from the slot's live
 * state when the prompt extends everything the slot holds. What a slot held and is about to
 * lose (its points past the new request's resume row, with their KV rows) goes into the
 * shared cache (cache.h), where any slot finds it again. The rows are not copied for that:
 * the cache shares them with the slot's sequence and copies out only the rows past the
 * resume row (pcache_seq_cut), so a turn's work outside the engine pass does not grow with
 * the conversation.
 *
 * Parked sequences: the engine may have more sequences than slots (serve's --cache-gpu). A slot
 * moving to another conversation (from row 0, or resuming from the shared cache) whose sequence
 * holds rows the cache still uses does not copy them out: it parks the sequence (no slot holds
 * it, the cache's spans stay live in it) and takes a free one. A request resuming from an entry
 * whose rows a parked sequence holds takes that sequence over (the slot's own parked in its
 * place): no row is written, and the answer is the bits it would be anywhere (the rows are
 * the same spans). When none is free, the least recently used parked sequence is evicted (the
 * rows the cache uses copied to the host: what a switch cost before, once per eviction): while
 * the server is idle, so that a free one waits for the next switch, else on the switching
 * request's path.
 *
 * Exact requests (chat): bits depend on where the GDN chunk grid restarts (each span's start
 * and anchor), so a chat prompt's grid restarts at every message start (the span's anchors:
 * one pass holds several messages), and it resumes only from a point at one of them: a turn
 * then runs the same chunks from that point on as a cold prefill of the whole prompt would,
 * and its answer is a cold server's, bit for bit. The reply the slot decoded token by token
 * is prefilled again (a cold server would prefill it), off the next request's path: when an
 * answer ends, the slot restores the point at its assistant message's start and prefills
 * the message (its prompt rows, the answer, the ids the template closes it with) in a
 * step of its own once the slot has waited --answer-point-wait (answer_wait_ms) idle, beside
 * the other slots' rows; a request of the conversation, or one needing the slot, arriving
 * sooner (or still being rendered then: sched_hold_begin) takes the slot and prefills the
 * answer in its own pass (no point made: it would only have waited for that step), and one
 * arriving while that step runs waits for it. The point at its end is what a cold pass leaves at the next message's
 * start, so the next turn resumes there when its rendering of the answer is those ids, and
 * at the message's start when the template rewrote it (thinking dropped). Points are
 * counted in the engine's cache budget (--cache-ram); when it is full the least recently
 * used point of a free slot is dropped.
 *
 * A prefix shared by requests in flight is prefilled once (vLLM's and SGLang's in-flight
 * prefix sharing): a request resumes from a point another slot's request took in the prefix
 * they share (a copy put in the shared cache; its KV rows copied from that slot's sequence,
 * not prefilled), and when that slot is still prefilling toward such a point, at a message
 * start both may resume from, the request waits queued (no slot taken, none given away)
 * until that step's piece ends there, then resumes from it as from any point: a cold pass's
 * bits. It waits only when the leader reaches the point no later than it would alone and the
 * prefix saved is a few chunks at least, and for one leader only: one cancelled or failed
 * before the point leaves it to prefill the prefix itself.
 *
 * A request is shared by the HTTP thread that made it and the engine thread: the HTTP side
 * waits on it (sched_wait) and may cancel it (a disconnect, a stop string found); the last
 * of the two to let go frees it. */
#ifndef HEARTH_SERVE_SCHED_H
#define HEARTH_SERVE_SCHED_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"
#include "serve/cache.h"

typedef struct sched sched;

typedef enum sched_finish {
    SCHED_RUNNING = 0,
    SCHED_STOP,      /* an end-of-generation token (or the HTTP side found a stop string) */
    SCHED_LENGTH,    /* n_predict tokens, or the context filled */
    SCHED_CANCELLED, /* the client went away or the server is stopping */
    SCHED_ERROR,     /* err says why */
} sched_finish;

typedef struct sched_req {
    /* input, set before sched_submit and not changed after */
    int32_t *ids;           /* the prompt (owned, freed with the request) */
    int64_t n_ids;
    int64_t *marks;         /* message starts, positions in (0, n_ids), ascending (owned; may be NULL;
                             * a prompt's are sched_submit's) */
    int n_marks;
    sampler_opts so;
    int64_t n_predict;      /* -1: until the context fills */
    bool ignore_eos;        /* an end-of-generation token is never sampled (llama-server's meaning) */
    int slot_wanted;        /* -1: any */
    bool exact;             /* chat: the marks are its message starts, and it resumes only
                             * from a point at one of them; else a prompt (/completion), given
                             * the marks a chat would have at its ids by sched_submit, resumes
                             * on their chunk grid. Either way the prompt is cut on that grid,
                             * so the answer is the bits a cold server gives */
    bool no_reuse;          /* start at row 0 (cache_prompt: false) */
    int top_logprobs;       /* -1: none; else each token's log-probability (of the model's
                             * softmax, before penalties and temperature) and this many
                             * alternatives, at most SCHED_MAX_TOP */
    struct grammar *grammar; /* sampling constrained to it (owned), or NULL (grammar.h) */
    bool grammar_after_think; /* the grammar applies from after the first </think> on */
    int32_t *bias_id;       /* logit_bias (owned): bias[i] added to logit bias_id[i] */
    float *bias;
    int n_bias;

    /* output, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *out;           /* generated ids */
    float *lp;              /* their log-probabilities (top_logprobs >= 0) */
    int32_t *top_id;        /* n_out x top_logprobs alternatives, best first */
    float *top_lp;
    int64_t n_out, cap_out;
    sched_finish finish;
    char err[256];
    bool cancel;            /* set by the HTTP side: the engine thread drops the request */
    int slot;               /* where it ran, -1 before */
    int64_t n_cached;       /* prompt rows resumed from (not prefilled) */
    int64_t n_drafted, n_accepted; /* --spec-mtp: drafts verified, and kept */
    char cache_why[640];    /* how the resume was chosen, in words (room for a whole herr message and more) */
    double t_queued, t_start, t_first, t_end; /* seconds (time_now) */
    int refs;               /* 2 while both sides hold it */

    /* the engine thread's alone: the request in flight it was passed over for, waiting for
     * that one's point in a prefix they share (NULL: none; compared, never followed) */
    const struct sched_req *wait_for;
} sched_req;

#define SCHED_MAX_TOP 20
/* DFA states of each priming grammar (schema_prime) whose stack tops the vocabulary's
 * thread primes at start (bench/RESULTS.md: its cost and memory at 248,320 tokens) */
#define SCHED_PRIME_STATES 512

typedef struct sched_opts {
    int n_slots;
    int64_t queue_max;      /* requests waiting for a slot; one more is refused */
    const char *cache_dir;  /* the shared prompt cache's files (cache.h), or NULL */
    int64_t cache_disk;     /* their bound in bytes (--cache-disk); 0: PCACHE_DISK_DEFAULT_MIB, -1: none */
    bool cache_ram_off;     /* --cache-ram 0: the shared cache keeps no entry in RAM (files only) */
    const char *model_path; /* the model's file, watched: written in place, it fails every request; or NULL */
    /* A test seam (HEARTH_TEST_REPLY): every answer's k-th token is script[k] instead of a
     * sampled one (the last repeated past the end), so the tests can make the model "write"
     * a tool call through the whole server, engine included. NULL in use. */
    const int32_t *script;
    int64_t n_script;
    /* A test seam (HEARTH_TEST_GRAMMAR_DELAY_MS): the grammar vocabulary's thread waits this
     * long before building, so a grammar request comes before it is ready. 0 in use. */
    int64_t gv_delay_ms;
    /* Points at the end of answers (chat_answer_end): the ids the template renders after an
     * answer (Qwen: <|im_end|>\n; none: no such points), and the id every message start is
     * (<|im_start|>, or -1: the anchors of a message's ids, as chat_message_starts lays them) */
    const int32_t *end_ids;
    int64_t n_end;
    int32_t start_id;
    /* how long a slot whose answer ended waits idle before that prefill (--answer-point-wait):
     * a request that needs the slot, or continues its conversation, sooner takes it and the
     * point is not made (the request prefills the answer in its own pass); 0: at once */
    int64_t answer_wait_ms;
    /* --spec-mtp: a decoding slot's step drafts this many tokens with the model's MTP block
     * (engine_mtp_draft) and verifies them in one span (engine/spec.h's way); 0: off. The
     * engine was opened with mtp. Not for a request under a grammar or the test script. */
    int spec_k;
    /* A test seam (HEARTH_TEST_SPEC_REPLAY): an answer's drafts for its tokens i.. are
     * spec_replay[i..] (forced acceptance: the expected answer) instead of the block's. NULL in use. */
    const int32_t *spec_replay;
    int64_t n_spec_replay;
} sched_opts;

/* a latency histogram: counts at or under each bound of SCHED_HIST_LE (seconds), then +Inf */
#define SCHED_HIST_N 11
extern const double SCHED_HIST_LE[SCHED_HIST_N];
typedef struct sched_hist {
    int64_t le[SCHED_HIST_N + 1]; /* not cumulative; the last is over every bound */
    int64_t count;
    double sum;
} sched_hist;

typedef struct sched_stats {
    int64_t n_requests, n_refused, n_prompt_tokens, n_cached_tokens, n_gen_tokens;
    int64_t n_hits, n_misses, n_points, n_point_evictions;
    double t_prompt, t_gen;   /* seconds of engine calls that had prompt rows / only decode rows */
    int64_t n_steps, n_step_spans; /* engine calls, and the slots' spans they ran (all calls together) */
    int64_t queue_depth, slots_busy;
    int64_t cache_bytes;
    /* spare point buffers (engine_point_reserve; in the cache budget beside cache_bytes), and
     * point buffers made on a pass's or a save's path (none spare), ahead, or freed for room */
    int64_t n_spare, spare_bytes, n_point_allocs, n_point_reserved, n_spare_releases;
    int64_t n_cache_hits;     /* resumed from the shared cache (another conversation's state) */
    int64_t n_flight_shares;  /* points of requests in flight put in the shared cache for another */
    int64_t n_flight_waits;   /* requests that waited in the queue for a point of one in flight */
    int64_t n_closes, n_closes_skipped; /* answers' end points begun; skipped (a request came first) */
    /* parked sequences (the engine's beyond the slots'): how many there are, how many hold
     * rows the cache uses now; slots that parked their sequence instead of copying its rows
     * out; resumes that took a parked sequence over (no row written); parked sequences
     * evicted (their rows copied to the host), in all and of those while the server idled */
    int64_t seqs_spare, seqs_parked, n_parks, n_takeovers, n_park_evictions, n_park_evictions_idle;
    pcache_stats pc;
    sched_hist ttft;          /* queued to first token, requests that got one */
    sched_hist duration;      /* queued to finished, every request that ran */
    /* grammars: the vocabulary made at start (sched.c, vocab_build) and the requests' masks */
    int64_t gv_builds;        /* vocabularies built: 1 once ready, never more */
    int64_t gv_primed;        /* position entries primed at start */
    int64_t gv_bytes;         /* the trie's and the primed entries' bytes */
    double gv_ready_s;        /* seconds it took */
    int64_t gv_waits;         /* grammar requests that came before it was ready and waited */
    int64_t gm_masks, gm_entries_made, gm_entries_found, gm_entry_visits; /* gmatch_stats, finished requests */
} sched_stats;

/* Starts the engine thread. The engine (n_seq_max >= n_slots: those beyond the slots are
 * parked sequences) and tokenizer stay the caller's and must outlive the scheduler. */
int sched_start(sched **out, engine *eng, const tokenizer *tok, const sched_opts *o, herr *e);
/* Stops: requests in flight finish as SCHED_CANCELLED; joins the thread. The scheduler
 * stays valid (every call after refuses or answers "stopping") until sched_free, so the
 * HTTP threads still running may call it: stop the scheduler, then the HTTP side (which
 * joins its threads), then free. */
void sched_stop(sched *s);
void sched_free(sched *s);   /* stops first if needed */

/* A new request, refs = 2 (ids and marks are taken over; free them with the request). */
sched_req *sched_req_new(int32_t *ids, int64_t n_ids, int64_t *marks, int n_marks);
/* Queues r. Fails (r still the caller's: sched_release it): -1 when the prompt is empty or
 * longer than the context or the slot wanted does not exist (the request's fault),
 * SCHED_UNAVAILABLE when the queue is full, the server is stopping or its model file was
 * written in place (the server's state). */
#define SCHED_UNAVAILABLE (-2)
/* A prompt on its way to sched_submit (an HTTP thread reading, rendering and tokenizing it:
 * tens of milliseconds at 40k tokens): while one is, a closing pass that comes due waits
 * (at most SCHED_HOLD_MAX_S past its due), so a conversation's next turn, sent at once but
 * still being rendered when --answer-point-wait runs out, takes the slot and prefills the
 * answer itself instead of waiting behind that pass. sched_hold_begin counts one; sched_submit
 * given it (queued or refused) or sched_hold_end, whichever comes first, lets it go. */
#define SCHED_HOLD_MAX_S 1.0
typedef struct sched_hold {
    sched *s;
    bool on;
} sched_hold;
sched_hold sched_hold_begin(sched *s);
void sched_hold_end(sched_hold *h);
/* h: the request's hold, or NULL */
int sched_submit(sched *s, sched_req *r, sched_hold *h, herr *e);
/* false (why: the reason) once the model file was written in place while serving */
bool sched_model_ok(sched *s, char *why, size_t cap);
/* Waits until r has more than n_seen tokens or has finished, or timeout_s passes (<= 0:
 * no limit). Returns r's token count; the caller reads r->out / r->finish under r->mu. */
int64_t sched_wait(sched_req *r, int64_t n_seen, double timeout_s);
void sched_cancel(sched_req *r);
void sched_release(sched_req *r);  /* the HTTP side lets go */

sched_stats sched_get_stats(sched *s);
/* Per slot: busy, the rows its sequence holds, points kept, the request's token counts. */
typedef struct sched_slot_info {
    int id;
    bool busy;
    int64_t n_held, n_points, n_prompt, n_out;
} sched_slot_info;
int sched_slots(sched *s, sched_slot_info *out, int max);
/* Empties a slot (its ids and points) before the next request is admitted; refused while
 * it runs one. */
int sched_slot_erase(sched *s, int slot, herr *e);
/* /slots save: a copy of the idle slot's points and KV rows into the shared cache and the
 * file at path (the slot keeps its own); restore: the file at path, checked, into the
 * shared cache, where the next request on any slot finds it. *n: the rows covered. */
int sched_slot_save(sched *s, int slot, const char *path, int64_t *n, herr *e);
int sched_slot_restore(sched *s, int slot, const char *path, int64_t *n, herr *e);

#endif
