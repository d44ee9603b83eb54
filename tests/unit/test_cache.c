/* test_cache.c: src/serve/cache.c on a micro model (1 GDN + 1 attention layer). Its bounds:
 * the entries a small budget pushes out of RAM with no file keep only their ids (to say why a
 * request missed), and those stay under PCACHE_GONE_MAX however many conversations pass
 * (the soak's RSS crept by them: 4096 such entries, each a prompt's ids, outside --cache-ram);
 * the latest evicted one still answers pcache_evicted_best. Its shared rows: the turns of an
 * append-only conversation put their points with no row copied, a cut copies the rows past it
 * alone, entries along a conversation hold its prefix once, eviction frees shared rows with
 * their last user, and every entry, restored on its own sequence or another, from rows live in
 * a sequence or copied out, continues with the bits it had when it was made; what a cut would
 * copy and what a sequence holds of an entry are said before (parked sequences). Its files: the
 * folder stays under --cache-disk through many entries, least recently used out first; a file
 * a reader holds (and the files it follows) is never removed under it, and a reader waits
 * for a removal under way and then misses; a write never makes the caller wait, and one more
 * than the writer holds is skipped and counted. */
#include "harness.h"
#include "make/gen.h"
#include "engine/engine.h"
#include "serve/cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static engine *micro_engine(model **m, int64_t n_ctx, int64_t budget) {
    herr e;
    model_hparams hp;
    gen_preset("tiny", &hp, &e);
    hp.n_embd = 64; hp.n_layer = 2; hp.full_attn_interval = 2; hp.n_head = 2; hp.n_head_kv = 1; hp.head_dim = 32;
    hp.rope_dims = 16; hp.n_expert = 4; hp.n_expert_used = 2; hp.n_ff_exp = 64; hp.n_ff_shexp = 64;
    hp.ssm_d_state = 16; hp.ssm_n_group = 1; hp.ssm_dt_rank = 2; hp.ssm_d_inner = 32;
    char path[512];
    snprintf(path, sizeof path, "%s/test-cache-micro-%d.gguf", getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp",
             (int)getpid());
    gen_opts go = {.preset = "tiny", .quant = GEN_F32, .seed = 1, .n_threads = 1, .out_path = path, .hparams = &hp};
    engine_opts eo = {.device = ENGINE_CPU, .n_threads = 1, .n_ctx = n_ctx, .n_seq_max = 2, .cache_budget = budget};
    engine *eng = NULL;
    if (gen_write(&go, NULL, &e) < 0 || model_load(m, path, &e) < 0 || engine_open(&eng, *m, &eo, &e) < 0) {
        fprintf(stderr, "    %s\n", e.msg);
        eng = NULL;
    }
    unlink(path);
    return eng;
}

/* F11: spare point buffers made ahead are what engine_point_new hands out (no allocation on
 * the path, n_point_allocs stays 0), a freed point's buffers become a spare, and spares count
 * in the cache budget: reserve stops at it, and a take that needs their room frees them. */
TEST(spare_points) {
    model *m = NULL;
    engine *probe = micro_engine(&m, 64, 0);
    CHECK(probe);
    if (!probe) return;
    const int64_t pb = (int64_t)engine_get_info(probe).point_bytes;
    engine_free(probe);
    model_free(m);
    const int64_t budget = 3 * pb + pb / 2;
    engine *eng = micro_engine(&m, 64, budget);
    CHECK(eng);
    if (!eng) return;
    CHECK_MSG(engine_point_reserve(eng, 10) == 3, "reserve stops at the budget: 3 points fit");
    engine_info in = engine_get_info(eng);
    CHECK(in.n_spare == 3 && in.spare_bytes == 3 * pb && in.cache_used == 0);
    CHECK(engine_get_stats(eng).n_point_reserved == 3);
    engine_point *p[4];
    herr e;
    for (int k = 0; k < 3; k++) CHECK(engine_point_new(eng, &p[k], &e) == 0 && p[k]->pos == -1);
    in = engine_get_info(eng);
    CHECK_MSG(engine_get_stats(eng).n_point_allocs == 0, "spares taken, none allocated");
    CHECK(in.n_spare == 0 && in.spare_bytes == 0 && in.cache_used == 3 * pb);
    CHECK_MSG(engine_point_new(eng, &p[3], &e) < 0, "a fourth point passes the budget");
    engine_point_free(eng, p[2]);
    in = engine_get_info(eng);
    CHECK_MSG(in.n_spare == 1 && in.cache_used == 2 * pb && in.cache_used + in.spare_bytes <= budget, "a freed point: a spare");
    /* a KV range that fits only in the spare's room: the spare gives way */
    const int64_t rows = (pb * 3 / 4) / (int64_t)(in.kv_bytes_per_token + sizeof(uint64_t));
    engine_kv *kv = NULL;
    CHECK(rows > 0 && rows <= 64);
    CHECK_MSG(engine_kv_new(eng, 0, rows, &kv, &e) == 0, "%s", e.msg);
    in = engine_get_info(eng);
    CHECK(in.n_spare == 0 && engine_get_stats(eng).n_spare_releases == 1 && in.cache_used + in.spare_bytes <= budget);
    engine_kv_free(eng, kv);
    CHECK_MSG(engine_point_new(eng, &p[2], &e) == 0 && engine_get_stats(eng).n_point_allocs == 1,
              "no spare left: a point is allocated, and counted");
    for (int k = 0; k < 3; k++) engine_point_free(eng, p[k]);
    in = engine_get_info(eng);
    CHECK(in.cache_used == 0 && in.n_spare == 3 && in.spare_bytes == 3 * pb);
    engine_free(eng);
    model_free(m);
}

TEST(evicted_ids_bounded) {
    model *m = NULL;
    const int64_t N = 1000; /* ids a conversation: 4 KB kept per evicted entry */
    engine *eng = micro_engine(&m, N + 8, 4 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    pcache *c;
    CHECK(pcache_open(&c, eng, NULL, &e) == 0);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(N + 1));
    int64_t most = 0;
    for (int conv = 0; conv < 320; conv++) { /* 320 x 4 KB of ids: past the bound */
        for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((i * 7 + conv * 13 + 1) % 1000);
        ids[0] = conv; /* each conversation its own from the first id */
        engine_point *pt = NULL;
        if (engine_point_new(eng, &pt, &e) < 0) {
            CHECK(pcache_evict_older(c, 1e300));
            CHECK_MSG(engine_point_new(eng, &pt, &e) == 0, "%s", e.msg);
        }
        const int64_t mark = N;
        pcache_seq_cut(c, 0, 0);
        engine_seq_clear(eng, 0);
        engine_span sp = {.seq = 0, .ids = ids, .n = N, .marks = &mark, .n_marks = 1, .points = &pt};
        CHECK_MSG(engine_run(eng, &sp, 1, &e) == 0, "%s", e.msg);
        pcache_put(c, 0, ids, N, &pt, 1);
        const pcache_stats st = pcache_get_stats(c);
        if (st.gone_bytes > most) most = st.gone_bytes;
    }
    const pcache_stats st = pcache_get_stats(c);
    CHECK_MSG(st.n_evicted > 250, "%lld evictions", (long long)st.n_evicted);
    CHECK_MSG(most <= PCACHE_GONE_MAX && most > PCACHE_GONE_MAX / 2, "evicted entries kept %lld bytes of ids (bound %lld)",
              (long long)most, (long long)PCACHE_GONE_MAX);
    /* an entry evicted lately still says why a request that extends it missed; one evicted
     * long ago is forgotten */
    for (int k = 0; k < 2; k++) {
        const int conv = k ? 10 : 300;
        for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((i * 7 + conv * 13 + 1) % 1000);
        ids[0] = conv;
        ids[N] = 5;
        const int64_t got = pcache_evicted_best(c, ids, N + 1, NULL, NULL);
        CHECK_MSG(got == (k ? 0 : N), "conversation %d: evicted best %lld", conv, (long long)got);
    }
    free(ids);
    pcache_free(c);
    engine_free(eng);
    model_free(m);
}

/* Turns of an append-only conversation on sequence 0, as the scheduler runs them: turn k
 * prefills rows [a(k-1), n(k)) from the point at a(k-1), taking points at a(k) = n(k) - 3 (the
 * next turn resumes there, as a chat resumes at its reply's message start) and at n(k) (put
 * into the cache, as slot_spill does), and runs one more row, whose logits the entry must
 * give back bit for bit once restored. */
#define TURNS 6
#define BACK 3
typedef struct convo {
    int32_t ids[1200];
    int64_t n[TURNS], a[TURNS];
    float want[TURNS][1024];    /* logits of row n(k) after the entry's rows [0, n(k)) */
    float want_a[TURNS][1024];  /* of row a(k) after [0, a(k)): an entry put inside a span */
    int V;
} convo;

static int64_t copied(const pcache *c) { return pcache_get_stats(c).rows_copied; }

/* turn k on sequence 0 from row at: rows [at, n(k)) with points at a(k) (*pa) and n(k) (*pn),
 * then row n(k), its logits into want[k] */
static void turn_prefill(engine *eng, convo *cv, int k, int64_t at, engine_point **pa, engine_point **pn) {
    herr e;
    cv->n[k] = 150 * (k + 1) + 7 * k;
    cv->a[k] = cv->n[k] - BACK;
    *pa = *pn = NULL;
    CHECK(engine_point_new(eng, pa, &e) == 0 && engine_point_new(eng, pn, &e) == 0);
    const int64_t marks[2] = {cv->a[k] - at, cv->n[k] - at};
    engine_point *pts[2] = {*pa, *pn};
    engine_span sp = {.seq = 0, .ids = cv->ids + at, .n = cv->n[k] - at, .marks = marks, .n_marks = 2, .points = pts};
    CHECK_MSG(engine_run(eng, &sp, 1, &e) == 0, "%s", e.msg);
    engine_span one = {.seq = 0, .ids = cv->ids + cv->n[k], .n = 1, .want = ENGINE_LOGITS_LAST, .logits = cv->want[k]};
    CHECK_MSG(engine_run(eng, &one, 1, &e) == 0, "%s", e.msg);
}

static void run_turns(engine *eng, pcache *c, convo *cv) {
    herr e;
    int64_t at = 0;
    for (int k = 0; k < TURNS; k++) {
        engine_point *pa, *pn;
        turn_prefill(eng, cv, k, at, &pa, &pn);
        const int64_t before = copied(c);
        pcache_put(c, 0, cv->ids, cv->n[k] + 1, &pn, 1);
        CHECK_MSG(copied(c) == before, "turn %d: putting a point copied %lld rows", k, (long long)(copied(c) - before));
        /* and a copy of the point at a(k), as an entry of its own inside the rows just put */
        engine_point *pc = NULL;
        CHECK(engine_point_new(eng, &pc, &e) == 0);
        engine_point_copy(pc, pa);
        pcache_put(c, 0, cv->ids, cv->n[k] + 1, &pc, 1);
        pcache_seq_cut(c, 0, cv->a[k]);
        CHECK_MSG(copied(c) - before == BACK, "turn %d: the cut at %lld copied %lld rows, not the %d past it", k,
                  (long long)cv->a[k], (long long)(copied(c) - before), BACK);
        CHECK_MSG(engine_restore(eng, 0, pa, &e) == 0, "%s", e.msg);
        engine_span row = {.seq = 0, .ids = cv->ids + cv->a[k], .n = 1, .want = ENGINE_LOGITS_LAST, .logits = cv->want_a[k]};
        CHECK_MSG(engine_run(eng, &row, 1, &e) == 0, "%s", e.msg);
        CHECK_MSG(engine_restore(eng, 0, pa, &e) == 0, "%s", e.msg);
        engine_point_free(eng, pa);
        at = cv->a[k];
    }
}

/* the entry at row r restored on sequence seq gives the logits it had, bit for bit; then
 * the sequence is cut (the next restore may be on it) unless keep */
static void check_row(engine *eng, pcache *c, convo *cv, int64_t r, const float *want, int seq, bool keep) {
    herr e;
    int ei, pi;
    const int64_t best = pcache_best(c, cv->ids, r + 1, NULL, NULL, &ei, &pi);
    CHECK_MSG(best == r, "row %lld: best resume %lld", (long long)r, (long long)best);
    if (best != r) return;
    const int32_t *ids;
    int64_t pos;
    CHECK_MSG(pcache_restore(c, ei, pi, seq, &ids, &pos, &e) == 0, "row %lld: %s", (long long)r, e.msg);
    CHECK(pos == r);
    float got[1024];
    engine_span one = {.seq = seq, .ids = cv->ids + r, .n = 1, .want = ENGINE_LOGITS_LAST, .logits = got};
    CHECK_MSG(engine_run(eng, &one, 1, &e) == 0, "%s", e.msg);
    CHECK_MSG(!memcmp(got, want, sizeof(float) * (size_t)cv->V), "row %lld on sequence %d: other logits", (long long)r, seq);
    if (!keep) pcache_seq_cut(c, seq, 0);
}

/* turn k's two entries (at n(k) and a(k)) */
static void check_restore(engine *eng, pcache *c, convo *cv, int k, int seq) {
    check_row(eng, c, cv, cv->a[k], cv->want_a[k], seq, false);
    check_row(eng, c, cv, cv->n[k], cv->want[k], seq, false);
}

TEST(turns_share_rows) {
    model *m = NULL;
    engine *eng = micro_engine(&m, 1200, 64 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    pcache *c;
    CHECK(pcache_open(&c, eng, NULL, &e) == 0);
    static convo cv;
    cv.V = (int)m->hp.n_vocab;
    for (int i = 0; i < 1200; i++) cv.ids[i] = (int32_t)((i * 37 + 11) % 997);
    run_turns(eng, c, &cv);
    pcache_stats st = pcache_get_stats(c);
    /* each entry's rows: the conversation's rows live in sequence 0 up to the last resume,
     * and three rows of its own, copied when the next turn went back over them */
    CHECK_MSG(st.host_rows == TURNS * BACK, "%lld rows on the host, not %d", (long long)st.host_rows, TURNS * BACK);
    /* every entry from sequence 1, through copies of sequence 0's live rows */
    for (int k = 0; k < TURNS; k++) check_restore(eng, c, &cv, k, 1);
    CHECK(copied(c) == TURNS * BACK);
    /* sequence 0 goes on to another conversation: the rows it alone held are copied once */
    pcache_seq_cut(c, 0, 0);
    engine_seq_clear(eng, 0);
    st = pcache_get_stats(c);
    const int64_t once = cv.a[TURNS - 1] + TURNS * BACK; /* the prefix once, each turn's own rows */
    CHECK_MSG(st.host_rows == once, "%lld rows on the host, not %lld (each held once)", (long long)st.host_rows,
              (long long)once);
    CHECK_MSG(copied(c) == once, "%lld rows copied in all, not %lld", (long long)copied(c), (long long)once);
    /* every entry again, now from the host, on either sequence (the last, turn 0's at n(0),
     * stays on sequence 0) */
    for (int k = TURNS - 1; k >= 0; k--) check_restore(eng, c, &cv, k, k % 2);
    check_row(eng, c, &cv, cv.n[0], cv.want[0], 0, true);
    CHECK(copied(c) == once);
    /* eviction, least recently used first (turn 5's entries first: restored first above): a
     * shared row goes with its last entry; rows only a sequence's spine uses (turn 0's, held
     * by sequence 0) leave the host, the sequence holding them */
    for (int k = TURNS - 1; k >= 0; k--) {
        CHECK(pcache_evict_older(c, 1e300) && pcache_evict_older(c, 1e300));
        st = pcache_get_stats(c);
        const int64_t left = k ? cv.a[k - 1] + k * BACK : 0;
        CHECK_MSG(st.host_rows == left, "%d turns left: %lld rows on the host, not %lld", k, (long long)st.host_rows,
                  (long long)left);
    }
    CHECK(!pcache_evict_older(c, 1e300));
    pcache_seq_cut(c, 0, 0);
    st = pcache_get_stats(c);
    CHECK_MSG(st.n_spans == 0, "%lld spans left with no entry", (long long)st.n_spans);
    pcache_free(c);
    engine_free(eng);
    model_free(m);
}

/* The same turns, restored while the rows are still live in sequence 0 (the shared prefix
 * is not written again: the restore writes only the rows the sequence lacks), and a
 * conversation moved to another sequence and back. */
TEST(restore_in_place) {
    model *m = NULL;
    engine *eng = micro_engine(&m, 1200, 64 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    pcache *c;
    CHECK(pcache_open(&c, eng, NULL, &e) == 0);
    static convo cv;
    cv.V = (int)m->hp.n_vocab;
    for (int i = 0; i < 1200; i++) cv.ids[i] = (int32_t)((i * 53 + 5) % 991);
    run_turns(eng, c, &cv);
    /* the last entry on sequence 0 itself: its prefix is the sequence's own; the restore
     * writes its own three rows alone */
    const int64_t w0 = pcache_get_stats(c).rows_written;
    int ei, pi;
    const int32_t *ids;
    int64_t pos;
    const int K = TURNS - 1;
    CHECK(pcache_best(c, cv.ids, cv.n[K] + 1, NULL, NULL, &ei, &pi) == cv.n[K]);
    CHECK_MSG(pcache_restore(c, ei, pi, 0, &ids, &pos, &e) == 0, "%s", e.msg);
    CHECK_MSG(pcache_get_stats(c).rows_written - w0 == BACK, "%lld rows written, not %d",
              (long long)(pcache_get_stats(c).rows_written - w0), BACK);
    float got[1024];
    engine_span one = {.seq = 0, .ids = cv.ids + cv.n[K], .n = 1, .want = ENGINE_LOGITS_LAST, .logits = got};
    CHECK_MSG(engine_run(eng, &one, 1, &e) == 0, "%s", e.msg);
    CHECK(!memcmp(got, cv.want[K], sizeof(float) * (size_t)cv.V));
    /* sequence 1 takes entry 2 (from sequence 0's live rows), then sequence 0 moves on: the
     * rows both use are copied out once, and sequence 1 gives entry 2's bits */
    check_restore(eng, c, &cv, 2, 1);
    pcache_seq_cut(c, 0, 0);
    engine_seq_clear(eng, 0);
    for (int k = 0; k < TURNS; k++) check_restore(eng, c, &cv, k, (k + 1) % 2);
    /* the conversation goes on on sequence 1, restored from the host: its next point shares
     * the restored rows, so moving on copies out the new rows alone */
    check_row(eng, c, &cv, cv.n[K], cv.want[K], 1, true);
    engine_point *q = NULL;
    CHECK(engine_point_new(eng, &q, &e) == 0);
    const int64_t more = 20, mark = more;
    engine_span sp = {.seq = 1, .ids = cv.ids + cv.n[K] + 1, .n = more, .marks = &mark, .n_marks = 1, .points = &q};
    CHECK_MSG(engine_run(eng, &sp, 1, &e) == 0, "%s", e.msg);
    pcache_put(c, 1, cv.ids, cv.n[K] + 1 + more, &q, 1);
    const int64_t before = copied(c);
    pcache_seq_cut(c, 1, 0);
    CHECK_MSG(copied(c) - before == more + 1, "%lld rows copied, not the %lld past the restored entry",
              (long long)(copied(c) - before), (long long)more + 1);
    pcache_free(c);
    engine_free(eng);
    model_free(m);
}

/* What the scheduler asks before parking a sequence and before choosing where to restore
 * (sched.h: parked sequences): pcache_cut_rows says the rows a cut would copy (and a cut
 * copies exactly those), pcache_holds the rows a sequence holds of an entry (and a restore
 * there writes only the rest). A conversation left in sequence 0 while sequence 1 runs another
 * copies nothing, and its entry taken back on sequence 0 writes no row and gives its bits. */
TEST(park_in_place) {
    model *m = NULL;
    engine *eng = micro_engine(&m, 1200, 64 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    pcache *c;
    CHECK(pcache_open(&c, eng, NULL, &e) == 0);
    static convo cv;
    cv.V = (int)m->hp.n_vocab;
    for (int i = 0; i < 1200; i++) cv.ids[i] = (int32_t)((i * 41 + 7) % 977);
    run_turns(eng, c, &cv);
    const int K = TURNS - 1;
    CHECK_MSG(pcache_cut_rows(c, 0, 0) > 0 && pcache_cut_rows(c, 1, 0) == 0, "cut rows %lld and %lld",
              (long long)pcache_cut_rows(c, 0, 0), (long long)pcache_cut_rows(c, 1, 0));
    /* sequence 0 parked: another conversation on sequence 1 copies and writes nothing */
    const int64_t c0 = copied(c), w0 = pcache_get_stats(c).rows_written;
    int32_t other[100];
    for (int i = 0; i < 100; i++) other[i] = (int32_t)((i * 13 + 1) % 900);
    engine_span sp = {.seq = 1, .ids = other, .n = 100};
    CHECK_MSG(engine_run(eng, &sp, 1, &e) == 0, "%s", e.msg);
    int ei, pi;
    CHECK(pcache_best(c, cv.ids, cv.a[K] + 1, NULL, NULL, &ei, &pi) == cv.a[K]);
    CHECK_MSG(pcache_holds(c, ei, pi, 0) == cv.a[K] && pcache_holds(c, ei, pi, 1) == 0, "holds %lld and %lld of %lld",
              (long long)pcache_holds(c, ei, pi, 0), (long long)pcache_holds(c, ei, pi, 1), (long long)cv.a[K]);
    CHECK(pcache_cut_rows(c, 0, cv.a[K]) == 0);
    /* taken back on sequence 0: no row moves, and the bits are the entry's */
    check_row(eng, c, &cv, cv.a[K], cv.want_a[K], 0, true);
    CHECK_MSG(copied(c) == c0 && pcache_get_stats(c).rows_written == w0, "%lld rows copied, %lld written",
              (long long)(copied(c) - c0), (long long)(pcache_get_stats(c).rows_written - w0));
    /* evicted at last: the cut copies exactly the rows pcache_cut_rows said */
    const int64_t want = pcache_cut_rows(c, 0, 0);
    pcache_seq_cut(c, 0, 0);
    CHECK_MSG(copied(c) - c0 == want && want > 0, "%lld rows copied, %lld said", (long long)(copied(c) - c0), (long long)want);
    pcache_free(c);
    engine_free(eng);
    model_free(m);
}

/* With a folder: each turn's points written through (as a request's end does) after the
 * file of the turn before, so a turn's file holds its own rows, not the conversation's; after
 * a restart every turn's entry is read back through its chain of files with the bits it had;
 * a chain whose first file is gone is refused, not half read. */
TEST(files_chain) {
    model *m = NULL;
    engine *eng = micro_engine(&m, 1200, 64 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    char dir[] = "/tmp/hearth-cache-chain-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    pcache *c;
    CHECK(pcache_open(&c, eng, dir, &e) == 0);
    static convo cv;
    cv.V = (int)m->hp.n_vocab;
    for (int i = 0; i < 1200; i++) cv.ids[i] = (int32_t)((i * 29 + 3) % 983);
    const size_t row = engine_get_info(eng).kv_bytes_per_token;
    int64_t at = 0, disk = 0;
    for (int k = 0; k < TURNS; k++) {
        engine_point *pa, *pn;
        turn_prefill(eng, &cv, k, at, &pa, &pn);
        pcache_write_through(c, 0, cv.ids, cv.n[k] + 1, &pn, 1);
        pcache_flush(c); /* written by the writer thread: wait for it */
        const int64_t d = pcache_get_stats(c).disk_bytes - disk;
        disk += d;
        /* the first file holds rows [0, n(0)); each after it the rows since the last resume */
        const int64_t rows = cv.n[k] - at;
        CHECK_MSG(d > (int64_t)row * rows && d < (int64_t)row * (rows + 40) + 4 * cv.n[k] + 4096 + (int64_t)engine_point_size(pn),
                  "turn %d: a file of %lld bytes for %lld new rows of %zu bytes", k, (long long)d, (long long)rows, row);
        pcache_point_free(c, pn);
        pcache_seq_cut(c, 0, cv.a[k]);
        CHECK_MSG(engine_restore(eng, 0, pa, &e) == 0, "%s", e.msg);
        engine_point_free(eng, pa);
        at = cv.a[k];
    }
    pcache_free(c);
    /* a restart: every turn's entry from its files, on either sequence */
    engine_seq_clear(eng, 0);
    CHECK(pcache_open(&c, eng, dir, &e) == 0);
    CHECK_MSG(pcache_get_stats(c).n_entries == TURNS, "%lld entries found", (long long)pcache_get_stats(c).n_entries);
    for (int k = TURNS - 1; k >= 0; k--) check_row(eng, c, &cv, cv.n[k], cv.want[k], k % 2, false);
    CHECK(pcache_get_stats(c).n_refused == 0);
    pcache_free(c);
    /* the first file gone: the later ones are refused (and removed), the entries missed */
    char cmd[200];
    snprintf(cmd, sizeof cmd, "ls %s | grep -- '-%lld.hcache$'", dir, (long long)cv.n[0]);
    FILE *ls = popen(cmd, "r");
    char first[200] = "";
    if (ls && fgets(first, sizeof first, ls)) first[strcspn(first, "\n")] = 0;
    if (ls) pclose(ls);
    char path[400];
    snprintf(path, sizeof path, "%s/%s", dir, first);
    CHECK_MSG(first[0] && unlink(path) == 0, "remove %s", path);
    engine_seq_clear(eng, 0);
    engine_seq_clear(eng, 1);
    CHECK(pcache_open(&c, eng, dir, &e) == 0);
    int ei, pi;
    const int K = TURNS - 1;
    CHECK(pcache_best(c, cv.ids, cv.n[K] + 1, NULL, NULL, &ei, &pi) == cv.n[K]);
    const int32_t *ids;
    int64_t pos;
    CHECK_MSG(pcache_restore(c, ei, pi, 0, &ids, &pos, &e) < 0, "a file read back without its parent");
    CHECK(pcache_get_stats(c).n_refused >= 1);
    pcache_free(c);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    engine_free(eng);
    model_free(m);
}

/* ---------------------------------------------------------------- --cache-disk */

/* the bytes of the folder's cache files, and how many */
static int64_t dir_bytes(const char *dir, int *n_files) {
    DIR *d = opendir(dir);
    int64_t total = 0;
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        const size_t len = strlen(de->d_name);
        if (len < 7 || strcmp(de->d_name + len - 7, ".hcache")) continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (!stat(path, &sb)) total += sb.st_size, n++;
    }
    if (d) closedir(d);
    if (n_files) *n_files = n;
    return total;
}

/* the folder's file whose name ends in "-<rows>.hcache" */
static bool file_of_rows(const char *dir, int64_t rows, char *out, size_t cap) {
    DIR *d = opendir(dir);
    char tail[64];
    snprintf(tail, sizeof tail, "-%lld.hcache", (long long)rows);
    bool found = false;
    struct dirent *de;
    while (d && (de = readdir(d)) && !found) {
        const size_t len = strlen(de->d_name), tl = strlen(tail);
        if (len > tl && !strcmp(de->d_name + len - tl, tail)) {
            snprintf(out, cap, "%s/%s", dir, de->d_name);
            found = true;
        }
    }
    if (d) closedir(d);
    return found;
}

/* conversation k's ids [0, CONV_ROWS + 1) */
#define CONV_ROWS 120
static void conv_ids(int k, int32_t *ids) {
    for (int64_t i = 0; i <= CONV_ROWS; i++) ids[i] = (int32_t)((i * 31 + k * 17 + 7) % 900);
}

/* the folder's file of conversation k (below): its name begins with the key of its ids before
 * its point (cache.c's name_key: FNV-1a over the ids, seeded with the model's identity) */
static bool file_of_conv(const char *dir, const engine *eng, int k, char *out, size_t cap) {
    int32_t ids[CONV_ROWS + 1];
    conv_ids(k, ids);
    uint64_t h = engine_get_info(eng).model_id;
    const unsigned char *b = (const unsigned char *)ids;
    for (size_t i = 0; i < sizeof(int32_t) * CONV_ROWS; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    char head[64];
    snprintf(head, sizeof head, "%016llx-%d-", (unsigned long long)h, CONV_ROWS);
    DIR *d = opendir(dir);
    bool found = false;
    struct dirent *de;
    while (d && (de = readdir(d)) && !found)
        if (!strncmp(de->d_name, head, strlen(head)) && strstr(de->d_name, ".hcache") && !strstr(de->d_name, ".tmp")) {
            snprintf(out, cap, "%s/%s", dir, de->d_name);
            found = true;
        }
    if (d) closedir(d);
    return found;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Conversation k on sequence 0 from an empty state: ids[0, CONV_ROWS), one point at the end,
 * written through; returns how long pcache_write_through took. want (may be NULL) receives
 * the logits of one more row. */
static double write_conv(engine *eng, pcache *c, int k, int32_t *ids, float *want) {
    herr e;
    const int64_t n = CONV_ROWS;
    conv_ids(k, ids);
    pcache_seq_cut(c, 0, 0);
    engine_seq_clear(eng, 0);
    engine_point *pt = NULL;
    if (engine_point_new(eng, &pt, &e) < 0) {
        CHECK_MSG(0, "%s", e.msg);
        return 0;
    }
    const int64_t mark = n;
    engine_span sp = {.seq = 0, .ids = ids, .n = n, .marks = &mark, .n_marks = 1, .points = &pt};
    CHECK_MSG(engine_run(eng, &sp, 1, &e) == 0, "%s", e.msg);
    const double t0 = now_s();
    pcache_write_through(c, 0, ids, n, &pt, 1);
    const double dt = now_s() - t0;
    if (want) {
        engine_span one = {.seq = 0, .ids = ids + n, .n = 1, .want = ENGINE_LOGITS_LAST, .logits = want};
        CHECK_MSG(engine_run(eng, &one, 1, &e) == 0, "%s", e.msg);
    }
    pcache_point_free(c, pt); /* the slot lets go of it (freed once its write is done) */
    return dt;
}

/* conversation k's entry restored on sequence 1 gives the logits it had (true), or is missed */
static bool restore_conv(engine *eng, pcache *c, int k, int32_t *ids, const float *want, int V, herr *e) {
    const int64_t n = CONV_ROWS;
    conv_ids(k, ids);
    int ei, pi;
    if (pcache_best(c, ids, n + 1, NULL, NULL, &ei, &pi) != n) return herr_set(e, "no entry"), false;
    const int32_t *got_ids;
    int64_t pos;
    pcache_seq_cut(c, 1, 0);
    engine_seq_clear(eng, 1);
    if (pcache_restore(c, ei, pi, 1, &got_ids, &pos, e) < 0) return false;
    float got[1024];
    engine_span one = {.seq = 1, .ids = ids + n, .n = 1, .want = ENGINE_LOGITS_LAST, .logits = got};
    CHECK_MSG(engine_run(eng, &one, 1, e) == 0, "%s", e->msg);
    CHECK_MSG(!memcmp(got, want, sizeof(float) * (size_t)V), "conversation %d: other logits", k);
    return true;
}

TEST(disk_bounded) {
    model *m = NULL;
    engine *eng = micro_engine(&m, 400, 64 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    char dir[] = "/tmp/hearth-cache-disk-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    pcache *c;
    CHECK(pcache_open(&c, eng, dir, &e) == 0);
    static int32_t ids[400];
    static float want[64][1024];
    const int V = (int)m->hp.n_vocab;
    write_conv(eng, c, 0, ids, want[0]);
    pcache_flush(c);
    const int64_t one = dir_bytes(dir, NULL); /* a file: all are about this size */
    const int64_t cap = one * 7 / 2;          /* room for 3 */
    CHECK_MSG(one > 0 && pcache_get_stats(c).disk_bytes == one, "%lld bytes on disk, stats %lld", (long long)one,
              (long long)pcache_get_stats(c).disk_bytes);
    pcache_set_disk_max(c, cap);
    int64_t most = 0;
    const int N = 40;
    for (int k = 1; k < N; k++) {
        write_conv(eng, c, k, ids, want[k]);
        pcache_flush(c);
        /* conversation 0 is read back every other turn: the least recently used go, not it */
        if (k % 2 == 0) CHECK_MSG(restore_conv(eng, c, 0, ids, want[0], V, &e), "turn %d: conversation 0: %s", k, e.msg);
        int nf;
        const int64_t b = dir_bytes(dir, &nf);
        if (b > most) most = b;
        CHECK_MSG(b <= cap, "after conversation %d: %lld bytes in %d files, over the bound %lld", k, (long long)b, nf,
                  (long long)cap);
    }
    pcache_stats st = pcache_get_stats(c);
    CHECK_MSG(st.n_disk_evicted >= N - 4 && st.n_write_failed == 0 && st.n_refused == 0,
              "%lld files removed, %lld writes failed, %lld refused", (long long)st.n_disk_evicted,
              (long long)st.n_write_failed, (long long)st.n_refused);
    CHECK_MSG(st.disk_bytes == dir_bytes(dir, NULL) && st.disk_max == cap, "stats: %lld bytes of %lld",
              (long long)st.disk_bytes, (long long)st.disk_max);
    CHECK(most > 2 * one); /* it was used */
    /* the last ones and conversation 0 are there; the others went */
    char path[600];
    CHECK_MSG(file_of_conv(dir, eng, 0, path, sizeof path), "conversation 0, read back lately, was removed");
    CHECK_MSG(file_of_conv(dir, eng, N - 1, path, sizeof path), "the newest file was removed");
    CHECK_MSG(!file_of_conv(dir, eng, 1, path, sizeof path), "an old file stayed");
    /* an entry whose file went is a miss (it was in RAM only as a file), not an error */
    CHECK(!restore_conv(eng, c, 1, ids, want[1], V, &e));
    /* a lower bound now: the folder is brought under it without a write */
    pcache_set_disk_max(c, one * 3 / 2);
    pcache_flush(c);
    CHECK_MSG(dir_bytes(dir, NULL) <= one * 3 / 2, "%lld bytes after the bound went down to %lld",
              (long long)dir_bytes(dir, NULL), (long long)(one * 3 / 2));
    /* an entry larger than the bound is not written, and nothing is removed for it */
    pcache_set_disk_max(c, one / 2);
    pcache_flush(c);
    const int64_t failed = pcache_get_stats(c).n_write_failed;
    write_conv(eng, c, 50, ids, NULL);
    pcache_flush(c);
    CHECK(pcache_get_stats(c).n_write_failed == failed + 1 && !file_of_conv(dir, eng, 50, path, sizeof path));
    pcache_free(c);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    engine_free(eng);
    model_free(m);
}

typedef struct restore_job {
    engine *eng;
    pcache *c;
    int k;
    int32_t *ids;
    const float *want;
    int V;
    bool ok;
    volatile int done; /* written by the thread; read after the main thread slept (a probe, not a sync) */
    herr e;
} restore_job;

static void *restore_thread(void *arg) {
    restore_job *j = arg;
    j->ok = restore_conv(j->eng, j->c, j->k, j->ids, j->want, j->V, &j->e);
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* A reader's shared flock keeps its file (and a file a held one follows) from the evictor,
 * which moves on to others; the reader reads it whole. A reader that opens a file while an
 * evictor holds it waits for the removal and then misses (never half reads, never refuses). */
TEST(disk_readers_safe) {
    model *m = NULL;
    engine *eng = micro_engine(&m, 400, 64 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    char dir[] = "/tmp/hearth-cache-read-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    pcache *c;
    CHECK(pcache_open(&c, eng, dir, &e) == 0);
    static int32_t ids[400];
    static float want[64][1024];
    const int V = (int)m->hp.n_vocab;
    for (int k = 0; k < 3; k++) write_conv(eng, c, k, ids, want[k]);
    pcache_flush(c);
    const int64_t one = dir_bytes(dir, NULL) / 3;
    /* conversation 0's file, the least recently used, held by a reader (as entry_read holds it) */
    char path0[600];
    CHECK(file_of_conv(dir, eng, 0, path0, sizeof path0));
    const int fd = open(path0, O_RDONLY);
    CHECK(fd >= 0 && flock(fd, LOCK_SH) == 0);
    pcache_set_disk_max(c, one * 7 / 2);
    for (int k = 3; k < 12; k++) write_conv(eng, c, k, ids, want[k]);
    pcache_flush(c);
    char path[600];
    CHECK_MSG(access(path0, F_OK) == 0, "a file a reader holds was removed");
    CHECK_MSG(!file_of_conv(dir, eng, 1, path, sizeof path) && pcache_get_stats(c).n_disk_evicted >= 6,
              "the evictor did not move on to the next files (%lld removed)", (long long)pcache_get_stats(c).n_disk_evicted);
    CHECK_MSG(dir_bytes(dir, NULL) <= one * 7 / 2 + one, "%lld bytes", (long long)dir_bytes(dir, NULL));
    /* and it reads it whole meanwhile (its own shared lock beside the reader's) */
    CHECK_MSG(restore_conv(eng, c, 0, ids, want[0], V, &e), "the held file: %s", e.msg);
    flock(fd, LOCK_UN);
    close(fd);

    /* an evictor mid-removal (an exclusive lock on conversation 11's file): a reader that
     * opened it waits, then finds it removed: a miss, no refusal */
    char path11[600];
    CHECK(file_of_conv(dir, eng, 11, path11, sizeof path11));
    /* a fresh index of the folder (this process's entry holds conversation 11 in RAM no more) */
    pcache_free(c);
    CHECK(pcache_open(&c, eng, dir, &e) == 0);
    pcache_set_disk_max(c, -1);
    const int fx = open(path11, O_RDONLY);
    CHECK(fx >= 0 && flock(fx, LOCK_EX) == 0);
    restore_job j = {.eng = eng, .c = c, .k = 11, .ids = ids, .want = want[11], .V = V};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, restore_thread, &j) == 0);
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    CHECK_MSG(!__atomic_load_n(&j.done, __ATOMIC_ACQUIRE), "the reader did not wait for the removal under way");
    unlink(path11);
    close(fx);
    pthread_join(th, NULL);
    CHECK_MSG(!j.ok && strstr(j.e.msg, "removed") && pcache_get_stats(c).n_refused == 0,
              "read after its removal: ok %d, '%s', %lld refused", j.ok, j.e.msg, (long long)pcache_get_stats(c).n_refused);
    pcache_free(c);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    engine_free(eng);
    model_free(m);
}

/* A chain of files (each turn after the one before): a reader holding the tip keeps the whole
 * chain; with nobody reading, the chain goes from its tip (a file is removed only once none
 * follows it), so no file is left whose parent is gone. */
TEST(disk_chains) {
    model *m = NULL;
    engine *eng = micro_engine(&m, 1200, 64 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    char dir[] = "/tmp/hearth-cache-dchain-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    pcache *c;
    CHECK(pcache_open(&c, eng, dir, &e) == 0);
    static convo cv;
    cv.V = (int)m->hp.n_vocab;
    for (int i = 0; i < 1200; i++) cv.ids[i] = (int32_t)((i * 29 + 3) % 983);
    int64_t at = 0;
    for (int k = 0; k < TURNS; k++) { /* files_chain's turns */
        engine_point *pa, *pn;
        turn_prefill(eng, &cv, k, at, &pa, &pn);
        pcache_write_through(c, 0, cv.ids, cv.n[k] + 1, &pn, 1);
        pcache_point_free(c, pn);
        pcache_seq_cut(c, 0, cv.a[k]);
        CHECK_MSG(engine_restore(eng, 0, pa, &e) == 0, "%s", e.msg);
        engine_point_free(eng, pa);
        at = cv.a[k];
    }
    pcache_flush(c);
    int nf;
    const int64_t all = dir_bytes(dir, &nf);
    CHECK_MSG(nf == TURNS && pcache_get_stats(c).n_write_failed == 0, "%d files", nf);
    /* the tip held by a reader: however low the bound, no file of its chain goes */
    char tip[600];
    CHECK(file_of_rows(dir, cv.n[TURNS - 1], tip, sizeof tip));
    const int fd = open(tip, O_RDONLY);
    CHECK(fd >= 0 && flock(fd, LOCK_SH) == 0);
    /* the oldest file is the chain's first: touch it the least recently used of all */
    pcache_set_disk_max(c, all / 2);
    pcache_flush(c);
    dir_bytes(dir, &nf);
    CHECK_MSG(nf == TURNS, "%d of %d files of a chain whose tip is read were removed", TURNS - nf, TURNS);
    flock(fd, LOCK_UN);
    close(fd);
    /* nobody reads: the bound is met from the tip down; what is left reads back whole */
    pcache_set_disk_max(c, all / 2);
    pcache_flush(c);
    const int64_t left = dir_bytes(dir, &nf);
    CHECK_MSG(left <= all / 2 && nf >= 1 && nf < TURNS, "%lld of %lld bytes left in %d files", (long long)left,
              (long long)all, nf);
    pcache_free(c);
    engine_seq_clear(eng, 0);
    CHECK(pcache_open(&c, eng, dir, &e) == 0);
    pcache_set_disk_max(c, -1);
    CHECK_MSG(pcache_get_stats(c).n_entries == nf && pcache_get_stats(c).n_refused == 0, "%lld entries, %lld refused",
              (long long)pcache_get_stats(c).n_entries, (long long)pcache_get_stats(c).n_refused);
    for (int k = nf - 1; k >= 0; k--) check_row(eng, c, &cv, cv.n[k], cv.want[k], k % 2, false);
    CHECK(pcache_get_stats(c).n_refused == 0);
    pcache_free(c);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    engine_free(eng);
    model_free(m);
}

/* A write never makes the caller wait: with the writer slowed down (the test seam's sleep
 * before each write), write-through returns at once; past PCACHE_WRITES_MAX pending, an entry
 * is skipped and counted, not waited for; the pending ones are all written by the end. */
TEST(disk_writes_off_the_path) {
    model *m = NULL;
    engine *eng = micro_engine(&m, 400, 64 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    char dir[] = "/tmp/hearth-cache-async-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    setenv("HEARTH_TEST_WRITE_DELAY_MS", "400", 1);
    pcache *c;
    CHECK(pcache_open(&c, eng, dir, &e) == 0);
    unsetenv("HEARTH_TEST_WRITE_DELAY_MS");
    static int32_t ids[400];
    double most = 0;
    const double t0 = now_s();
    for (int k = 0; k < PCACHE_WRITES_MAX + 2; k++) {
        const double dt = write_conv(eng, c, k, ids, NULL);
        if (dt > most) most = dt;
    }
    const double t_all = now_s() - t0;
    CHECK_MSG(most < 0.1 && t_all < 0.4, "a write-through took %.3f s, all of them %.3f s (the writer sleeps 0.4 s a file)",
              most, t_all);
    pcache_stats st = pcache_get_stats(c);
    CHECK_MSG(st.n_write_skipped == 2 && st.n_saved == 0, "%lld skipped, %lld saved", (long long)st.n_write_skipped,
              (long long)st.n_saved);
    pcache_flush(c);
    int nf;
    dir_bytes(dir, &nf);
    st = pcache_get_stats(c);
    CHECK_MSG(nf == PCACHE_WRITES_MAX && st.n_saved == PCACHE_WRITES_MAX && st.n_entries == PCACHE_WRITES_MAX,
              "%d files, %lld saved, %lld entries", nf, (long long)st.n_saved, (long long)st.n_entries);
    /* the pending ones are written before pcache_free returns */
    write_conv(eng, c, 20, ids, NULL);
    pcache_free(c);
    dir_bytes(dir, &nf);
    CHECK_MSG(nf == PCACHE_WRITES_MAX + 1, "%d files after the end", nf);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    engine_free(eng);
    model_free(m);
}

int main(void) {
    RUN(spare_points);
    RUN(evicted_ids_bounded);
    RUN(turns_share_rows);
    RUN(restore_in_place);
    RUN(park_in_place);
    RUN(files_chain);
    RUN(disk_bounded);
    RUN(disk_readers_safe);
    RUN(disk_chains);
    RUN(disk_writes_off_the_path);
    return harness_done();
}
