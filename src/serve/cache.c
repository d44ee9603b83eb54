/* cache.c: the prompt cache shared by the slots (cache.h), and its files in --cache-dir,
 * which several processes may share: each file is written under a temporary name of its own
 * and renamed into place, found by its name's prefix key, and checked again when read back.
 *
 * KV rows are held in spans (a run of rows after a parent's), shared by every entry and
 * sequence along a common prefix and reference-counted: a prefix is held once, and the rows a
 * sequence still holds live stay there, copied out only when it is about to lose them. A
 * turn of a long conversation so copies the rows it goes back over, not the conversation. */
#include "serve/cache.h"
#include "base/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define MAX_ENTRIES 4096
#define MAX_SEEN 65536  /* files of the folder not yet indexed that a lookup checks by name */
#define TMP_STALE_S 3600 /* a temporary file this old was left by a writer that died */
static const char MAGIC[8] = {'H', 'R', 'T', 'H', 'P', 'C', '0', '1'};   /* rows [0, n) */
static const char MAGIC_2[8] = {'H', 'R', 'T', 'H', 'P', 'C', '0', '2'}; /* rows [a, n) after a parent file */

/* KV rows [a, b) that follow rows [0, a) of the parent's chain (NULL when a == 0): the rows
 * of a chain up to row e (a < e <= b) are its parent's chain up to a, then its own [a, e).
 * They are a host copy (kv), or live in engine sequence seq (kv NULL): that sequence holds
 * the chain's rows [0, b) as they were made, and every live span of a sequence lies on its
 * spine, so pcache_seq_cut finds them before the sequence loses them. A child begins inside
 * its parent (parent->a < a <= parent->b). refs: entries whose tail it is, child spans,
 * spines whose tip it is; at 0 it is freed, and its parent loses a reference. */
typedef struct span {
    struct span *parent;
    int64_t a, b;
    engine_kv *kv;          /* rows [a, b) on the host, or NULL while live */
    int seq;                /* live: the sequence holding them; else -1 */
    int refs;
    struct span *prev, *next; /* every span of the cache */
} span;

/* What a sequence holds that the cache knows: the chain of s up to row end (NULL, 0: none);
 * and a file of the folder whose rows [0, file_a) it holds as they are (NULL: none), the
 * parent of the next file written from it, which then holds the rows past file_a alone */
typedef struct spine {
    span *s;
    int64_t end;
    char *file;
    uint64_t file_sum;
    uint32_t file_depth;
    int64_t file_a;
    uint64_t file_job;      /* the write that makes the file, while it is pending (file_sum unknown
                             * until it is done); 0: written */
} spine;

typedef struct entry {
    int32_t *ids;           /* [0, n): kept in RAM even when the rest is not */
    int64_t n;
    span *tail;             /* rows [0, n): tail's chain up to n (one reference); NULL when not in RAM */
    engine_point **pts;     /* ascending pos */
    int n_pts;
    int64_t *pt_pos;        /* the points' positions, kept when they are not in RAM */
    double t_used;
    char *path;             /* its file, or NULL */
    uint64_t sum;           /* its file's checksum (path set) */
    uint32_t depth;         /* its file's parents (0: a whole file) */
    bool gone;              /* evicted with no file: only its ids and positions are left, to
                             * tell a request that misses why (a free slot for a new entry) */
    uint64_t wid;           /* the pending write of its file (pcache_put), or 0 */
} entry;

/* A file of the folder that no entry holds yet (another process wrote it, or it appeared
 * after the start), known only by its name: the key of the ids before its first point. */
typedef struct seen_file {
    uint64_t key;
    int64_t p0;             /* its first point's position */
    char *path;
} seen_file;

struct pcache {
    engine *eng;
    char *dir;
    entry *es;
    int n;
    span *spans;            /* every span (a list) */
    spine *spines;          /* per engine sequence */
    int n_seq;
    int pinned;             /* the entry a restore is reading (never evicted meanwhile), or -1 */
    pcache_stats st;
    seen_file *seen;        /* the folder's files no entry holds, as of the last listing */
    int n_seen;
    struct timespec dir_mtime; /* the folder's, at the last listing */
    time_t listed_at;       /* wall clock of the last listing */
    mode_t file_mode;       /* 0666 less the umask, as fopen would have made a file */
    struct wq *w;           /* the writer thread (a directory), or NULL */
    struct wjob *wp[PCACHE_WRITES_MAX]; /* writes handed over and not yet taken back, oldest first */
    int n_wp;
    uint64_t next_wid;
    int64_t n_skipped;
    bool no_ram;            /* --cache-ram 0: an entry put is kept as its file only (or its ids) */
};

/* a file's outcome when read (entry_read) */
enum { RD_OK = 0, RD_GONE = -1, RD_BAD = -2, RD_ROOM = -3 };
/* how much of a file entry_read reads: the header, ids and point positions only (the rest
 * is checked when it is read in full); all of it, checksum verified, keeping the ids; all
 * of it into RAM */
typedef enum rd_mode { RD_INDEX, RD_CHECK, RD_FULL } rd_mode;

/* A child file's parent (after the header, MAGIC_2): its rows [0, a) are the parent file's
 * chain's, the file holds rows [a, n). The parent is a file of the same folder, by name. */
typedef struct file_parent {
    int64_t a;
    uint64_t sum;           /* the parent's checksum: a parent rewritten since is not this one */
    uint32_t depth;         /* files back to a whole one: the parent's plus 1, at most CHAIN_MAX */
    uint32_t pad;
    char name[128];
} file_parent;

/* A chain of files is read parent first (a recursion this deep at most): a file written
 * after this many is written whole. */
#define CHAIN_MAX 1024

/* the file's fixed header */
typedef struct file_head {
    char magic[8];
    uint64_t model_id;
    int64_t n;
    int64_t n_pts;
    uint64_t kv_bytes;
    uint64_t n_gdn, lane_floats, ring_floats;
    uint64_t checksum;      /* FNV-1a of everything after the header */
} file_head;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* the key of ids [0, n) in file names: FNV-1a over the ids, seeded by the model, so that a
 * lookup computes it for every prefix of a request in one pass */
static uint64_t name_key(const pcache *c, const int32_t *ids, int64_t n) {
    return fnv(engine_get_info(c->eng).model_id, ids, sizeof(int32_t) * (size_t)n);
}

/* An entry's file name: the key of the ids before its first point and that point's
 * position (what a lookup matches a request by), then the key of all its ids and its
 * points, and its rows. Two processes writing the same entry write the same name. */
static void entry_name(const pcache *c, const entry *en, char *out, size_t cap) {
    const int64_t p0 = en->pt_pos[0];
    const uint64_t all = fnv(name_key(c, en->ids, en->n), en->pt_pos, sizeof(int64_t) * (size_t)en->n_pts);
    snprintf(out, cap, "%s/%016" PRIx64 "-%" PRId64 "-%016" PRIx64 "-%" PRId64 ".hcache", c->dir,
             name_key(c, en->ids, p0), p0, all, en->n);
}

/* a file name of entry_name's form (exactly: written back, it is the same name): its prefix
 * key and first point */
static bool name_parse(const char *name, uint64_t *key, int64_t *p0) {
    uint64_t all;
    int64_t n;
    char back[128];
    if (strlen(name) > 100 || sscanf(name, "%16" SCNx64 "-%" SCNd64 "-%16" SCNx64 "-%" SCNd64 ".hcache", key, p0, &all, &n) != 4)
        return false;
    snprintf(back, sizeof back, "%016" PRIx64 "-%" PRId64 "-%016" PRIx64 "-%" PRId64 ".hcache", *key, *p0, all, n);
    return !strcmp(back, name) && *p0 >= 1 && n >= *p0;
}

/* ---------------------------------------------------------------- spans */

/* a new span, unreferenced (the caller takes the first reference); it references its parent */
static span *span_new(pcache *c, span *parent, int64_t a, int64_t b, engine_kv *kv, int seq) {
    span *t = xcalloc(1, sizeof *t);
    *t = (span){.parent = parent, .a = a, .b = b, .kv = kv, .seq = kv ? -1 : seq, .next = c->spans};
    if (parent) parent->refs++;
    if (c->spans) c->spans->prev = t;
    c->spans = t;
    return t;
}

static void span_unref(pcache *c, span *t) {
    while (t && --t->refs == 0) {
        span *up = t->parent;
        if (t->prev) t->prev->next = t->next;
        else c->spans = t->next;
        if (t->next) t->next->prev = t->prev;
        engine_kv_free(c->eng, t->kv);
        free(t);
        t = up;
    }
}

/* sequence k's spine becomes the chain of t up to end (t referenced before the old tip is let
 * go: t is often its ancestor) */
static void spine_set(pcache *c, int k, span *t, int64_t end) {
    if (t) t->refs++;
    span_unref(c, c->spines[k].s);
    c->spines[k].s = t;
    c->spines[k].end = t ? end : 0;
}

/* sequence k holds rows [0, a) of the file at path (a file of the folder) as they are: the
 * next file written from it is written after it (NULL or a <= 0: none) */
static void spine_file(pcache *c, int k, const char *path, uint64_t sum, uint32_t depth, int64_t a) {
    spine *sp = &c->spines[k];
    free(sp->file);
    sp->file = NULL;
    sp->file_a = 0;
    sp->file_job = 0;
    if (!path || a <= 0 || !c->dir) return;
    const size_t dl = strlen(c->dir);
    if (strncmp(path, c->dir, dl) || path[dl] != '/' || strchr(path + dl + 1, '/') || strlen(path + dl + 1) >= 128) return;
    sp->file = xstrdup(path);
    sp->file_sum = sum;
    sp->file_depth = depth;
    sp->file_a = a;
}

/* the spans of t's chain up to row e, root first, with the row each is used up to; the
 * arrays are the caller's to free */
static int chain_list(span *t, int64_t e, span ***out, int64_t **ends) {
    int n = 0;
    for (const span *u = t; u; u = u->parent) n++;
    *out = xmalloc(sizeof **out * (size_t)(n ? n : 1));
    *ends = xmalloc(sizeof **ends * (size_t)(n ? n : 1));
    for (int i = n - 1; i >= 0; i--, e = t->a, t = t->parent) {
        (*out)[i] = t;
        (*ends)[i] = e;
    }
    return n;
}

static bool chain_has(const span *t, const span *x) {
    for (; t; t = t->parent)
        if (t == x) return true;
    return false;
}

/* Live span t (of sequence t->seq) becomes two at row x (t->a < x < t->b): a new live span
 * [t->a, x) and t, now [x, b) after it. Whatever used t only up to a row <= x (entries,
 * child spans, spines) now uses the new one. No row moves. */
static void span_split(pcache *c, span *t, int64_t x) {
    span *u = span_new(c, t->parent, t->a, x, NULL, t->seq);
    span_unref(c, t->parent); /* u holds it now (never the last reference) */
    t->parent = u;
    u->refs++;
    t->a = x;
    for (int i = 0; i < c->n; i++) {
        entry *en = &c->es[i];
        if (en->tail == t && en->n <= x) { en->tail = u; u->refs++; t->refs--; }
    }
    for (span *v = c->spans; v; v = v->next)
        if (v->parent == t && v->a <= x) { v->parent = u; u->refs++; t->refs--; }
    for (int k = 0; k < c->n_seq; k++)
        if (c->spines[k].s == t && c->spines[k].end <= x) { c->spines[k].s = u; u->refs++; t->refs--; }
}

static void entry_drop_ram(pcache *c, entry *en);

/* Host spans on sequence k's spine that nothing but the spine uses any more (their entries
 * went) give up their copy: the sequence holds those rows, so they become live again. */
static void spine_trim(pcache *c, int k) {
    int64_t e = c->spines[k].end;
    for (span *t = c->spines[k].s; t && t->refs == 1; e = t->a, t = t->parent) {
        if (!t->kv) continue;
        engine_kv_free(c->eng, t->kv);
        t->kv = NULL;
        t->seq = k;
        t->b = e;
    }
}

/* Span t's rows cannot be kept (no room to copy them out of the sequence about to lose them):
 * every entry whose rows pass through t leaves RAM, and every spine through t ends below it. */
static void span_lose(pcache *c, span *t) {
    t->refs++; /* alive until the end here */
    for (int i = 0; i < c->n; i++)
        if (c->es[i].tail && chain_has(c->es[i].tail, t)) {
            entry_drop_ram(c, &c->es[i]);
            c->st.n_evicted++;
            if (!c->es[i].path) c->es[i].gone = true;
        }
    for (int k = 0; k < c->n_seq; k++)
        if (chain_has(c->spines[k].s, t)) spine_set(c, k, t->parent, t->a);
    span_unref(c, t);
    for (int k = 0; k < c->n_seq; k++) spine_trim(c, k);
}

/* Live span t's rows from row `from` on (all of them when from <= t->a) copied to the host,
 * before its sequence loses them: t becomes a host span (split at from first). Dropping the
 * least recently used entries while the budget is short; false when nothing more can go. */
static bool span_copy_out(pcache *c, span *t, int64_t from) {
    const int64_t a = t->a > from ? t->a : from;
    engine_kv *kv = NULL;
    herr e;
    while (engine_kv_read(c->eng, t->seq, a, t->b, &kv, &e) < 0)
        if (!pcache_evict_older(c, INFINITY)) return false;
    if (a > t->a) span_split(c, t, a);
    t->kv = kv;
    t->seq = -1;
    c->st.rows_copied += t->b - t->a;
    return true;
}

/* Sequence k's rows [0, n) (n at most what it holds) as a span chain: the spine, extended by a
 * live span when n passes its end. Returns the chain's tail, referenced for the caller. */
static span *seq_tail(pcache *c, int k, int64_t n) {
    spine *sp = &c->spines[k];
    span *t = sp->s;
    if (n > sp->end) {
        t = span_new(c, sp->s, sp->end, n, NULL, k);
        spine_set(c, k, t, n);
    } else {
        while (t->a >= n) t = t->parent;
    }
    t->refs++;
    return t;
}

void pcache_seq_cut(pcache *c, int k, int64_t from) {
    spine *sp = &c->spines[k];
    if (sp->file_a > from) { /* the rows of its file it still holds */
        if (from > 0) sp->file_a = from;
        else spine_file(c, k, NULL, 0, 0, 0);
    }
    /* tip first: k's live spans used at or past from by anything besides this spine (a
     * reference other than the one each span of the chain has from the next, or the tip from
     * the spine; here or further up) are copied out; the one that straddles from is split
     * there, so the spine keeps the rows below from live */
again:
    if (!sp->s || sp->end <= from) return;
    bool needed = false;
    int64_t e = sp->end;
    for (span *t = sp->s; t && e > from;) {
        needed = needed || t->refs > 1;
        const int64_t a0 = t->a;
        span *up = t->parent;
        if (t->seq == k) {
            if (needed && !span_copy_out(c, t, from)) {
                span_lose(c, t); /* the spine ends below t now */
                goto again;
            }
            if (!needed && a0 < from) span_split(c, t, from);
        }
        if (a0 < from) break;
        e = a0;
        t = up;
    }
    span *t = sp->s; /* the spine ends at from */
    while (t && t->a >= from) t = t->parent;
    spine_set(c, k, t, from);
}

static void point_release(pcache *c, engine_point *p);

static void entry_drop_ram(pcache *c, entry *en) {
    span_unref(c, en->tail);
    en->tail = NULL;
    for (int i = 0; en->pts && i < en->n_pts; i++) point_release(c, en->pts[i]);
    free(en->pts);
    en->pts = NULL;
}

static void entry_free(pcache *c, entry *en) {
    entry_drop_ram(c, en);
    free(en->ids);
    free(en->pt_pos);
    free(en->path);
}

int64_t ids_common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* what an evicted entry with no file still holds */
static int64_t entry_gone_bytes(const entry *en) {
    return (int64_t)(sizeof(int32_t) * (size_t)en->n + sizeof(int64_t) * (size_t)en->n_pts);
}

double pcache_oldest(const pcache *c) {
    double t = INFINITY;
    for (int i = 0; i < c->n; i++)
        if (c->es[i].tail && c->es[i].t_used < t) t = c->es[i].t_used;
    return t;
}

/* Forgets the least recently used entries evicted with no file while what they keep passes
 * PCACHE_GONE_MAX: that memory is outside the budget, and MAX_ENTRIES of them, each a
 * prompt's ids, would be megabytes (a soak's RSS crept by it). */
static void trim_gone(pcache *c) {
    for (;;) {
        int64_t bytes = 0;
        int k = -1;
        for (int i = 0; i < c->n; i++) {
            if (!c->es[i].gone) continue;
            bytes += entry_gone_bytes(&c->es[i]);
            if (k < 0 || c->es[i].t_used < c->es[k].t_used) k = i;
        }
        if (bytes <= PCACHE_GONE_MAX || k < 0) return;
        entry_free(c, &c->es[k]);
        c->es[k] = (entry){0}; /* a free slot (ids NULL) */
    }
}

bool pcache_evict_older(pcache *c, double t) {
    int k = -1;
    for (int i = 0; i < c->n; i++)
        if (c->es[i].tail && i != c->pinned && c->es[i].t_used < t && (k < 0 || c->es[i].t_used < c->es[k].t_used))
            k = i;
    if (k < 0) return false;
    entry_drop_ram(c, &c->es[k]);
    for (int q = 0; q < c->n_seq; q++) spine_trim(c, q);
    c->st.n_evicted++;
    if (!c->es[k].path) { /* entries never move: the slot is free for another */
        c->es[k].gone = true;
        trim_gone(c);
    }
    return true;
}

/* ---------------------------------------------------------------- files */

static bool wr(FILE *f, const void *p, size_t n, uint64_t *h) {
    *h = fnv(*h, p, n);
    return fwrite(p, 1, n, f) == n;
}

/* A file's use, as --cache-disk's eviction reads it: its mtime set to now from the fine clock
 * (the kernel's own stamp moves by whole ticks, 4-10 ms, and would tie files used in one
 * tick); where that is refused (another user's file, writable), the kernel's stamp. */
static void touch(int fd, const char *path) {
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[1] = ts[0];
    if ((fd >= 0 ? futimens(fd, ts) : utimensat(AT_FDCWD, path, ts, 0)) < 0 && errno == EPERM) {
        if (fd >= 0) futimens(fd, NULL);
        else utimensat(AT_FDCWD, path, NULL, 0);
    }
}

/* The bytes of a file of ids [0, n), its rows [a, n) (a > 0: after a parent) and n_pts points
 * of p0's shape: what entry_read checks a file's size against. */
static uint64_t file_bytes(int64_t n, int64_t a, uint64_t kv_bytes, int n_pts, const engine_point *p0) {
    const uint64_t state = sizeof(float) * (uint64_t)p0->n_gdn * (p0->lane_floats + p0->ring_floats);
    return sizeof(file_head) + (a > 0 ? sizeof(file_parent) : 0) + 4 * (uint64_t)n + 8 + 8 * (uint64_t)(n - a) +
           kv_bytes + (uint64_t)n_pts * (16 + state);
}

/* Ids [0, n), the points and the KV rows [0, n) in kv (with par: rows [par->a, n), after the
 * parent file's) as the file at path, *sum its checksum. Written under a temporary name of its
 * own in the same folder (mkstemp: unique across processes and hosts sharing the folder) and
 * renamed into place, so a reader sees the whole file or none, and two writers of one entry
 * never write into one file. It touches no cache state: the writer thread calls it. */
static int file_write(const char *path, mode_t mode, const int32_t *ids, int64_t n, engine_point *const *pts, int n_pts,
                      const engine_kv *kv, const file_parent *par, uint64_t *sum_out, herr *e) {
    const engine_point *p0 = pts[0];
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    const int fd = mkstemp(tmp);
    if (fd < 0) return herr_set(e, "cannot write %s: %s (the entry stays in RAM only)", tmp, strerror(errno));
    fchmod(fd, mode); /* mkstemp's 0600 would hide it from replicas run as other users */
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        return herr_set(e, "cannot write %s: %s (the entry stays in RAM only)", tmp, strerror(errno));
    }
    file_head h = {.model_id = kv->model_id, .n = n, .n_pts = n_pts, .kv_bytes = kv->bytes,
                   .n_gdn = (uint64_t)p0->n_gdn, .lane_floats = p0->lane_floats, .ring_floats = p0->ring_floats};
    memcpy(h.magic, par ? MAGIC_2 : MAGIC, 8);
    bool ok = fwrite(&h, sizeof h, 1, f) == 1;
    uint64_t sum = 0xcbf29ce484222325ull;
    if (par) ok = ok && wr(f, par, sizeof *par, &sum);
    ok = ok && wr(f, ids, sizeof(int32_t) * (size_t)n, &sum) && wr(f, &kv->hash_a, 8, &sum) &&
         wr(f, kv->hash, sizeof(uint64_t) * (size_t)(kv->b - kv->a), &sum) && wr(f, kv->data, kv->bytes, &sum);
    for (int i = 0; ok && i < n_pts; i++) {
        const engine_point *p = pts[i];
        ok = wr(f, &p->pos, 8, &sum) && wr(f, &p->hash, 8, &sum) &&
             wr(f, p->lanes, sizeof(float) * (size_t)p->n_gdn * p->lane_floats, &sum) &&
             wr(f, p->rings, sizeof(float) * (size_t)p->n_gdn * p->ring_floats, &sum);
    }
    h.checksum = sum;
    ok = ok && fseek(f, 0, SEEK_SET) == 0 && fwrite(&h, sizeof h, 1, f) == 1 && fflush(f) == 0;
    int err = ok ? 0 : errno; /* the first failure's reason (a full disk, a size limit) */
    if (ok) touch(fd, NULL);   /* after the last write: its first use */
    if (fclose(f) != 0 && ok) ok = false, err = errno;
    if (ok && rename(tmp, path) != 0) ok = false, err = errno;
    if (!ok) {
        unlink(tmp); /* no partial file is left to be read back */
        return herr_set(e, "writing %s failed: %s (the entry stays in RAM only)", path, strerror(err));
    }
    *sum_out = sum;
    return 0;
}

/* en (its KV rows [0, n) in kv) as the file at path, now, by the caller (/slots save, whose
 * answer says the file is there): en names it afterwards */
static int entry_write(pcache *c, entry *en, const engine_kv *kv, const char *path, herr *e) {
    uint64_t sum;
    if (file_write(path, c->file_mode, en->ids, en->n, en->pts, en->n_pts, kv, NULL, &sum, e) < 0) return -1;
    free(en->path);
    en->path = xstrdup(path);
    en->sum = sum;
    c->st.n_saved++;
    return 0;
}

static bool rd(FILE *f, void *p, size_t n, uint64_t *h) {
    if (fread(p, 1, n, f) != n) return false;
    *h = fnv(*h, p, n);
    return true;
}

/* n bytes into the checksum, not kept (RD_INDEX: passed over, unread) */
static bool rd_skip(FILE *f, uint64_t n, uint64_t *h, rd_mode mode) {
    if (mode == RD_INDEX) return fseeko(f, (off_t)n, SEEK_CUR) == 0;
    char buf[65536];
    bool ok = true;
    for (uint64_t left = n; ok && left;) {
        size_t k = left < sizeof buf ? (size_t)left : sizeof buf;
        ok = rd(f, buf, k, h);
        left -= k;
    }
    return ok;
}

/* Reads en's file as far as mode says, refusing (RD_BAD, saying why) anything that is not
 * exactly what this engine would have written; RD_GONE: it cannot be opened (another process
 * removed it), RD_ROOM: the cache budget is short. On success en's ids and point positions
 * are the file's (and with RD_FULL its KV rows and points); *seen (may be NULL) receives the
 * file's identity, to remove only that file and not one renamed over it since.
 * A shared flock is held from the open to the end, a child's parents read meanwhile: the
 * writer of any process removes a file for --cache-disk only under an exclusive one, and only
 * a file no other follows, so a file is never removed under its reader. A file removed
 * between the open and the lock is gone (a miss). Read in full, it is touched (its mtime:
 * the use --cache-disk's eviction goes by), before its parents, which so stay newer. */
static int entry_read(pcache *c, entry *en, const char *path, rd_mode mode, struct stat *seen, herr *e) {
    if (seen) memset(seen, 0, sizeof *seen);
    FILE *f = fopen(path, "rb");
    if (!f) {
        herr_set(e, "cannot open: %s", strerror(errno));
        return RD_GONE;
    }
    while (flock(fileno(f), LOCK_SH) < 0 && errno == EINTR) {}
    file_head h;
    const engine_info info = engine_get_info(c->eng);
    engine_point *shape = NULL;
    int rc = RD_BAD;
    engine_kv *kv = NULL;
    engine_point **pts = NULL;
    int32_t *ids = NULL;
    int64_t *pos = NULL;
    int np = 0;
    uint64_t sum = 0xcbf29ce484222325ull;
    struct stat sb;
    const bool full = mode == RD_FULL;
    if (fstat(fileno(f), &sb)) { herr_set(e, "cannot stat: %s", strerror(errno)); goto out; }
    if (sb.st_nlink == 0) { /* removed before the lock was ours */
        herr_set(e, "removed meanwhile (--cache-disk)");
        rc = RD_GONE;
        goto out;
    }
    if (seen) *seen = sb;
    if (full) touch(fileno(f), NULL); /* may fail (another user's file): its use is then older */
    if (fread(&h, sizeof h, 1, f) != 1 || (memcmp(h.magic, MAGIC, 8) && memcmp(h.magic, MAGIC_2, 8))) {
        herr_set(e, "not a hearth cache file");
        goto out;
    }
    const bool child = !memcmp(h.magic, MAGIC_2, 8);
    file_parent par = {0};
    if (child && fread(&par, sizeof par, 1, f) != 1) { herr_set(e, "truncated (its parent)"); goto out; }
    sum = fnv(sum, &par, child ? sizeof par : 0);
    uint64_t pk;
    int64_t pp0;
    if (child && !c->dir) { /* its parent is a file of the folder */
        herr_set(e, "it follows another file of a --cache-dir");
        goto out;
    }
    if (child && (par.a < 1 || par.a >= h.n || par.depth < 1 || par.depth > CHAIN_MAX ||
                  strnlen(par.name, sizeof par.name) == sizeof par.name || !name_parse(par.name, &pk, &pp0))) {
        herr_set(e, "its parent is not a cache file's name");
        goto out;
    }
    const int64_t a = par.a; /* rows [a, n) in the file */
    if (h.model_id != info.model_id) { herr_set(e, "made by another model"); goto out; }
    if (engine_point_new(c->eng, &shape, e) < 0) { rc = RD_ROOM; goto out; }
    if (h.n < 1 || h.n > info.n_ctx || h.n_pts < 1 || h.n_pts > 4096 || h.kv_bytes != info.kv_bytes_per_token * (uint64_t)(h.n - a) ||
        h.n_gdn != (uint64_t)shape->n_gdn || h.lane_floats != shape->lane_floats || h.ring_floats != shape->ring_floats) {
        herr_set(e, "its shapes are not this engine's (%" PRId64 " rows, context %" PRId64 ")", h.n, info.n_ctx);
        goto out;
    }
    const uint64_t state = sizeof(float) * h.n_gdn * (h.lane_floats + h.ring_floats);
    const uint64_t want = sizeof h + (child ? sizeof par : 0) + 4 * (uint64_t)h.n + 8 + 8 * (uint64_t)(h.n - a) + h.kv_bytes +
                          (uint64_t)h.n_pts * (16 + state);
    if ((uint64_t)sb.st_size != want) {
        herr_set(e, "%lld bytes where its header says %llu (truncated?)", (long long)sb.st_size, (unsigned long long)want);
        goto out;
    }
    ids = xmalloc(sizeof(int32_t) * (size_t)h.n);
    pos = xmalloc(sizeof(int64_t) * (size_t)h.n_pts);
    if (!rd(f, ids, 4 * (size_t)h.n, &sum)) { herr_set(e, "read error"); goto out; }
    if (full) {
        if (engine_kv_new(c->eng, a, h.n, &kv, e) < 0) { rc = RD_ROOM; goto out; }
        pts = xcalloc((size_t)h.n_pts, sizeof *pts);
    }
    uint64_t hash_a;
    uint64_t *hash = kv ? kv->hash : xmalloc(8 * (size_t)(h.n - a));
    bool ok = rd(f, &hash_a, 8, &sum) && rd(f, hash, 8 * (size_t)(h.n - a), &sum);
    ok = ok && (kv ? rd(f, kv->data, h.kv_bytes, &sum) : rd_skip(f, h.kv_bytes, &sum, mode));
    for (int i = 0; ok && i < h.n_pts; i++) {
        int64_t p;
        uint64_t ph;
        ok = rd(f, &p, 8, &sum) && rd(f, &ph, 8, &sum);
        if (!ok) break;
        if (p < 1 || p > h.n || (i > 0 && p <= pos[i - 1]) || ph != engine_ids_hash(c->eng, ids, p)) {
            herr_set(e, "point %d (at %" PRId64 ") does not match its ids", i, p);
            if (!kv) free(hash);
            goto out;
        }
        pos[i] = p;
        engine_point *pt = NULL;
        if (full) {
            if (engine_point_new(c->eng, &pt, e) < 0) {
                rc = RD_ROOM;
                goto out; /* hash is kv's */
            }
            pts[np++] = pt;
            pt->pos = p;
            pt->hash = ph;
            pt->model_id = info.model_id;
            ok = rd(f, pt->lanes, sizeof(float) * h.n_gdn * h.lane_floats, &sum) &&
                 rd(f, pt->rings, sizeof(float) * h.n_gdn * h.ring_floats, &sum);
        } else {
            ok = rd_skip(f, state, &sum, mode);
        }
    }
    const bool rows_ok = ok && hash_a == engine_ids_hash(c->eng, ids, a) && hash[h.n - a - 1] == engine_ids_hash(c->eng, ids, h.n);
    if (!kv) free(hash);
    if (!ok) { herr_set(e, "read error"); goto out; }
    if (mode != RD_INDEX && sum != h.checksum) { herr_set(e, "its checksum does not match (corrupt)"); goto out; }
    if (!rows_ok) { herr_set(e, "its KV rows' hashes do not match its ids"); goto out; }
    if (kv) kv->hash_a = hash_a;
    span *up = NULL; /* a child's rows [0, a): its parent file's chain, read first */
    if (full && child) {
        char *ppath = xmalloc(strlen(c->dir) + sizeof par.name + 2);
        sprintf(ppath, "%s/%s", c->dir, par.name);
        entry pe = {0};
        herr pe_e;
        const int prc = entry_read(c, &pe, ppath, RD_FULL, NULL, &pe_e);
        free(ppath);
        const bool same = prc == RD_OK && pe.sum == par.sum && pe.depth + 1 == par.depth && pe.n >= a &&
                          ids_common_prefix(pe.ids, pe.n, ids, a) >= a;
        if (prc == RD_OK && !same) herr_set(&pe_e, "it is not the file this one was written after");
        if (same) {
            up = pe.tail;
            up->refs++;
        }
        entry_free(c, &pe);
        if (!up) {
            rc = prc == RD_ROOM ? RD_ROOM : RD_BAD;
            herr_set(e, "its parent file %s: %s", par.name, pe_e.msg);
            goto out;
        }
    }
    en->sum = h.checksum;
    en->depth = child ? par.depth : 0;
    free(en->ids);
    free(en->pt_pos);
    en->ids = ids;
    en->n = h.n;
    en->pt_pos = pos;
    en->n_pts = (int)h.n_pts;
    ids = NULL;
    pos = NULL;
    if (full) {
        span_unref(c, en->tail);
        en->tail = span_new(c, up, a, h.n, kv, -1);
        en->tail->refs++;
        span_unref(c, up); /* the span holds it now */
        en->pts = pts;
        kv = NULL;
        pts = NULL;
        np = 0;
    }
    rc = RD_OK;
out:
    fclose(f);
    engine_point_free(c->eng, shape);
    engine_kv_free(c->eng, kv);
    for (int i = 0; i < np; i++) engine_point_free(c->eng, pts[i]);
    free(pts);
    free(ids);
    free(pos);
    return rc;
}

/* Removes path if it is still the file seen (not one another process renamed over it since),
 * counting it refused, with a line on stderr. */
static void refuse(pcache *c, const char *path, const struct stat *seen, const char *why) {
    struct stat now;
    const bool same = seen->st_ino && !stat(path, &now) && now.st_ino == seen->st_ino && now.st_dev == seen->st_dev;
    if (same) unlink(path);
    fprintf(stderr, "hearth serve: --cache-dir: %s refused%s: %s\n", path, same ? " and removed" : " (a newer file has its name)",
            why);
    c->st.n_refused++;
}

/* en's file into RAM, dropping the least recently used entries while the budget is short */
static int entry_read_evicting(pcache *c, entry *en, const char *path, struct stat *seen, herr *e) {
    int rc;
    while ((rc = entry_read(c, en, path, RD_FULL, seen, e)) == RD_ROOM)
        if (!pcache_evict_older(c, INFINITY)) break;
    return rc;
}

/* the entry whose file is path, or -1 */
static int entry_of_path(const pcache *c, const char *path) {
    for (int i = 0; i < c->n; i++)
        if (c->es[i].path && !strcmp(c->es[i].path, path)) return i;
    return -1;
}

/* a temporary file of entry_write's that no writer will rename: one that died mid-write */
static bool stale_tmp(const char *name, const struct stat *sb) {
    return strstr(name, ".hcache.tmp.") && sb->st_mtime < time(NULL) - TMP_STALE_S;
}

/* at the start: every file of the folder checked in full (checksum included) and indexed */
static void scan_dir(pcache *c) {
    DIR *d = opendir(c->dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) && c->n < MAX_ENTRIES) {
        const size_t len = strlen(de->d_name);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", c->dir, de->d_name);
        struct stat sb;
        if (!stat(path, &sb) && stale_tmp(de->d_name, &sb)) { /* a write its writer never finished */
            fprintf(stderr, "hearth serve: --cache-dir: %s (an unfinished write) removed\n", path);
            unlink(path);
            continue;
        }
        if (len < 7 || strcmp(de->d_name + len - 7, ".hcache")) continue;
        entry en = {0};
        herr e;
        const int rc = entry_read(c, &en, path, RD_CHECK, &sb, &e);
        if (rc < 0) {
            if (rc == RD_BAD) refuse(c, path, &sb, e.msg);
            entry_free(c, &en);
            continue;
        }
        c->st.disk_bytes += sb.st_size;
        en.path = xstrdup(path);
        c->es[c->n++] = en;
    }
    closedir(d);
}

static bool write_pending(const pcache *c, const char *path);

static void seen_clear(pcache *c) {
    for (int i = 0; i < c->n_seen; i++) free(c->seen[i].path);
    c->n_seen = 0;
}

/* The folder's files that no entry holds, by name, listed again only when the folder changed
 * since the last listing (its mtime; a listing within a second of that mtime is not trusted
 * to have seen every file of that second). */
static void list_dir(pcache *c) {
    struct stat sb;
    if (stat(c->dir, &sb)) return;
    const bool same = sb.st_mtim.tv_sec == c->dir_mtime.tv_sec && sb.st_mtim.tv_nsec == c->dir_mtime.tv_nsec;
    if (same && c->listed_at > sb.st_mtim.tv_sec + 1) return;
    DIR *d = opendir(c->dir);
    if (!d) return;
    c->dir_mtime = sb.st_mtim;
    c->listed_at = time(NULL);
    seen_clear(c);
    struct dirent *de;
    while ((de = readdir(d)) && c->n_seen < MAX_SEEN) {
        seen_file sf;
        if (!name_parse(de->d_name, &sf.key, &sf.p0)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", c->dir, de->d_name);
        if (entry_of_path(c, path) >= 0 || write_pending(c, path)) continue; /* ours */
        sf.path = xstrdup(path);
        c->seen[c->n_seen++] = sf;
    }
    closedir(d);
}

static int free_slot(pcache *c);

/* Files other processes wrote into the folder since this one looked (or that it has not
 * indexed yet) that a request of ids [0, n) could resume from: those whose name's prefix key
 * is the key of the request's ids before the file's first point. Each is indexed (its
 * header, ids and point positions; the rest is checked when it is read back) as an entry. */
static void discover(pcache *c, const int32_t *ids, int64_t n) {
    list_dir(c);
    int64_t most = 0;
    for (int i = 0; i < c->n_seen; i++)
        if (c->seen[i].p0 < n && c->seen[i].p0 > most) most = c->seen[i].p0;
    if (most == 0) return;
    /* the prefix keys of the request, in one pass */
    uint64_t *key = xmalloc(sizeof(uint64_t) * (size_t)(most + 1));
    key[0] = engine_get_info(c->eng).model_id;
    for (int64_t p = 0; p < most; p++) key[p + 1] = fnv(key[p], &ids[p], sizeof ids[p]);
    for (int i = 0; i < c->n_seen;) {
        seen_file *sf = &c->seen[i];
        if (sf->p0 >= n || key[sf->p0] != sf->key) { i++; continue; }
        const int slot = free_slot(c);
        if (slot < 0) break;
        entry en = {0};
        herr e;
        struct stat sb;
        const int rc = entry_read(c, &en, sf->path, RD_INDEX, &sb, &e);
        if (rc == RD_OK) {
            en.path = sf->path;
            en.t_used = time_now();
            if (slot == c->n) c->n++;
            entry_free(c, &c->es[slot]);
            c->es[slot] = en;
            c->st.disk_bytes += sb.st_size;
        } else {
            if (rc == RD_BAD) refuse(c, sf->path, &sb, e.msg);
            entry_free(c, &en);
            free(sf->path);
        }
        *sf = c->seen[--c->n_seen]; /* indexed, refused or gone: not seen again */
    }
    free(key);
}

/* ---------------------------------------------------------------- the writer thread
 *
 * The engine thread hands a write over as a job (the entry's ids, its rows copied out of the
 * sequence, its points by reference) and goes on; the writer thread makes room under
 * --cache-disk, writes the file and hands the job back, done or failed; the engine thread
 * takes finished jobs back at its next call into the cache (writes_taken_back): the entry
 * names the file from then on, and the points a slot let go of meanwhile are freed. Only the
 * queue, the results and the counters are shared, under wq.mu. */

#define WQ_RING 64 /* results kept for a child whose parent's write was pending when it was queued */

typedef enum wkind { W_PUT, W_THROUGH } wkind;

typedef struct wjob {
    /* set by the engine thread, read-only once queued */
    uint64_t id;
    wkind kind;             /* W_PUT: entry wid's file; W_THROUGH: a file-only entry, spine seq's */
    int seq;
    char *path;
    int32_t *ids;           /* [0, n), the job's own */
    int64_t n;
    engine_point **pts;     /* read, not owned (but see own) */
    int n_pts;
    int64_t *pt_pos;
    engine_kv *kv;          /* the job's own */
    bool chained;           /* after parent file par (par.sum from job par_job's result when set) */
    file_parent par;
    uint64_t par_job;
    uint64_t bytes;         /* the file's size */
    bool *own;              /* engine thread only: pts[k] to free when taken back */
    /* the writer's, under wq.mu */
    int rc;
    uint64_t sum;
    char err[600];
    struct wjob *next;
} wjob;

typedef struct wq {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* a job, a new bound, or stop */
    pthread_cond_t idle;    /* a job done */
    pthread_t th;
    bool stop, busy, recheck, scanned;
    wjob *head, *tail;      /* to write */
    wjob *done, *done_tail; /* written or failed, for the engine thread */
    struct { uint64_t id; int rc; uint64_t sum; } ring[WQ_RING];
    int ring_n;
    char **gone;            /* files it removed, for the engine thread's index */
    int n_gone, cap_gone;
    int64_t disk_max;       /* bytes, -1: none */
    int64_t disk_bytes;     /* the folder's cache files at the last look */
    int64_t n_saved, n_failed, n_evicted;
    /* set before the thread starts */
    char *dir;
    mode_t mode;
    unsigned delay_ms;      /* HEARTH_TEST_WRITE_DELAY_MS */
} wq;

/* A cache file of the folder as the evictor lists it */
typedef struct dfile {
    char name[128];
    int64_t size;
    struct stat st;
    int kids;               /* files that follow it */
    int parent;             /* its index, or -1 */
    bool out;               /* removed, or not to be */
} dfile;

static int dfile_cmp(const void *a, const void *b) { return strcmp(((const dfile *)a)->name, ((const dfile *)b)->name); }

static bool same_time(struct timespec a, struct timespec b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }

/* Removes f if nobody reads it (an exclusive flock, not waited for) and it is still the file
 * listed, untouched since (a reader or a child's writer that came in between touched it);
 * 1 removed, 0 left alone */
static int evict_file(const wq *w, const dfile *f) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", w->dir, f->name);
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return 0;
    int rc = 0;
    struct stat a, b;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && !fstat(fd, &a) && !stat(path, &b) && a.st_ino == f->st.st_ino &&
        a.st_dev == f->st.st_dev && b.st_ino == a.st_ino && b.st_dev == a.st_dev && a.st_nlink > 0 &&
        same_time(a.st_mtim, f->st.st_mtim) && same_time(a.st_ctim, f->st.st_ctim))
        rc = unlink(path) == 0;
    close(fd); /* the lock goes with it */
    return rc;
}

/* The folder's cache files under the bound with room for `need` more bytes: the least recently
 * used removed first, a file only once none follows it, never `keep` (the parent of the file
 * about to be written). 0, or -1 with e set when there is no such room. */
static int make_room(wq *w, int64_t need, const char *keep, herr *e) {
    pthread_mutex_lock(&w->mu);
    const int64_t max = w->disk_max;
    pthread_mutex_unlock(&w->mu);
    DIR *d = opendir(w->dir);
    if (!d) return herr_set(e, "cannot list %s: %s", w->dir, strerror(errno));
    dfile *fs = NULL;
    int n = 0, cap = 0;
    int64_t total = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t key;
        int64_t p0;
        const size_t len = strlen(de->d_name);
        if (len >= sizeof fs->name || !name_parse(de->d_name, &key, &p0)) continue; /* (names are under 100) */
        dfile f = {.parent = -1};
        memcpy(f.name, de->d_name, len + 1);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", w->dir, de->d_name);
        if (lstat(path, &f.st) || !S_ISREG(f.st.st_mode)) continue;
        f.size = f.st.st_size;
        total += f.size;
        if (n == cap) fs = xrealloc(fs, sizeof *fs * (size_t)(cap = cap ? 2 * cap : 64));
        fs[n++] = f;
    }
    closedir(d);
    int rc = 0;
    if (max >= 0 && need > max) {
        rc = herr_set(e, "an entry of %.2f MiB is larger than --cache-disk %.2f MiB", need / 1048576.0, max / 1048576.0);
    } else if (max >= 0 && total + need > max) {
        /* who follows whom: each file's parent, from its header */
        qsort(fs, (size_t)n, sizeof *fs, dfile_cmp);
        for (int i = 0; i < n; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", w->dir, fs[i].name);
            FILE *f = fopen(path, "rb");
            file_head h;
            file_parent par;
            if (f && fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, MAGIC_2, 8) && fread(&par, sizeof par, 1, f) == 1 &&
                strnlen(par.name, sizeof par.name) < sizeof par.name) {
                dfile key;
                snprintf(key.name, sizeof key.name, "%s", par.name);
                const dfile *p = bsearch(&key, fs, (size_t)n, sizeof *fs, dfile_cmp);
                if (p) {
                    fs[i].parent = (int)(p - fs);
                    fs[p - fs].kids++;
                }
            }
            if (f) fclose(f);
            if (keep && !strcmp(fs[i].name, keep)) fs[i].out = true;
        }
        while (total + need > max) {
            int k = -1; /* the least recently used file that none follows */
            for (int i = 0; i < n; i++)
                if (!fs[i].out && fs[i].kids == 0 &&
                    (k < 0 || fs[i].st.st_mtim.tv_sec < fs[k].st.st_mtim.tv_sec ||
                     (fs[i].st.st_mtim.tv_sec == fs[k].st.st_mtim.tv_sec && fs[i].st.st_mtim.tv_nsec < fs[k].st.st_mtim.tv_nsec)))
                    k = i;
            if (k < 0) {
                rc = herr_set(e, "no room under --cache-disk %.2f MiB for %.2f MiB: the %.2f MiB of files left are "
                                 "being read or followed", max / 1048576.0, need / 1048576.0, total / 1048576.0);
                break;
            }
            fs[k].out = true;
            if (!evict_file(w, &fs[k])) continue;
            total -= fs[k].size;
            if (fs[k].parent >= 0) fs[fs[k].parent].kids--;
            char *path = xmalloc(strlen(w->dir) + strlen(fs[k].name) + 2);
            sprintf(path, "%s/%s", w->dir, fs[k].name);
            pthread_mutex_lock(&w->mu);
            if (w->n_gone == w->cap_gone) w->gone = xrealloc(w->gone, sizeof *w->gone * (size_t)(w->cap_gone = w->cap_gone ? 2 * w->cap_gone : 16));
            w->gone[w->n_gone++] = path;
            w->n_evicted++;
            pthread_mutex_unlock(&w->mu);
        }
    }
    free(fs);
    pthread_mutex_lock(&w->mu);
    w->disk_bytes = total;
    w->scanned = true;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* One job's file. A child is written under a shared flock on its parent, touched first: a
 * parent gone, or being removed, fails the write (its rows alone would be no entry). */
static int write_job(wq *w, const wjob *j, const file_parent *par, uint64_t *sum, herr *e) {
    int pfd = -1;
    if (j->chained) {
        char ppath[4096];
        snprintf(ppath, sizeof ppath, "%s/%s", w->dir, par->name);
        struct stat a, b;
        pfd = open(ppath, O_RDONLY | O_CLOEXEC);
        if (pfd < 0 || flock(pfd, LOCK_SH | LOCK_NB) < 0 || fstat(pfd, &a) || a.st_nlink == 0 || stat(ppath, &b) ||
            a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            if (pfd >= 0) close(pfd);
            return herr_set(e, "not written: the file it follows, %s, was removed (--cache-disk)", par->name);
        }
        touch(pfd, NULL); /* a file is never older than one written after it */
    }
    int rc = make_room(w, (int64_t)j->bytes, j->chained ? par->name : NULL, e);
    if (rc == 0) rc = file_write(j->path, w->mode, j->ids, j->n, j->pts, j->n_pts, j->kv, j->chained ? par : NULL, sum, e);
    if (pfd >= 0) close(pfd);
    return rc;
}

static void *writer_main(void *arg) {
    wq *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stop && !w->recheck) pthread_cond_wait(&w->cv, &w->mu);
        if (w->recheck && !w->head) { /* a new bound: the folder under it now */
            w->recheck = false;
            w->busy = true;
            pthread_mutex_unlock(&w->mu);
            herr e;
            make_room(w, 0, NULL, &e);
            pthread_mutex_lock(&w->mu);
            w->busy = false;
            pthread_cond_broadcast(&w->idle);
            continue;
        }
        if (!w->head) break; /* stop, with nothing left to write */
        wjob *j = w->head;
        w->head = j->next;
        if (!w->head) w->tail = NULL;
        j->next = NULL;
        w->busy = true;
        w->recheck = false;
        file_parent par = j->par;
        int prc = 0;
        if (j->chained && j->par_job) { /* the parent's write was pending when this one was queued */
            prc = -1;
            for (int i = 0; i < w->ring_n && i < WQ_RING; i++)
                if (w->ring[i].id == j->par_job) {
                    prc = w->ring[i].rc;
                    par.sum = w->ring[i].sum;
                }
        }
        const unsigned delay = w->delay_ms;
        pthread_mutex_unlock(&w->mu);
        if (delay) sleep_ms(delay);
        herr e = {{0}};
        uint64_t sum = 0;
        int rc = prc < 0 ? herr_set(&e, "not written: the file it follows, %s, was not written", par.name)
                         : write_job(w, j, &par, &sum, &e);
        pthread_mutex_lock(&w->mu);
        j->rc = rc;
        j->sum = sum;
        snprintf(j->err, sizeof j->err, "%s", rc < 0 ? e.msg : "");
        const int r = w->ring_n++ % WQ_RING; /* ring_n counts on; the oldest result is overwritten */
        w->ring[r].id = j->id;
        w->ring[r].rc = rc;
        w->ring[r].sum = sum;
        if (rc == 0) {
            w->n_saved++;
            w->disk_bytes += (int64_t)j->bytes;
        } else {
            w->n_failed++;
        }
        if (w->done_tail) w->done_tail->next = j;
        else w->done = j;
        w->done_tail = j;
        w->busy = false;
        pthread_cond_broadcast(&w->idle);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* engine thread: the point p a slot or an entry lets go of, freed now, or by the last pending
 * job that reads it when it is taken back */
static void point_release(pcache *c, engine_point *p) {
    for (int i = c->n_wp - 1; i >= 0; i--)
        for (int k = 0; k < c->wp[i]->n_pts; k++)
            if (c->wp[i]->pts[k] == p) {
                c->wp[i]->own[k] = true;
                return;
            }
    engine_point_free(c->eng, p);
}

void pcache_point_free(pcache *c, engine_point *p) {
    if (p) point_release(c, p);
}

static void job_free(pcache *c, wjob *j) {
    for (int k = 0; k < j->n_pts; k++)
        if (j->own[k]) engine_point_free(c->eng, j->pts[k]);
    engine_kv_free(c->eng, j->kv);
    free(j->own);
    free(j->pts);
    free(j->pt_pos);
    free(j->ids);
    free(j->path);
    free(j);
}

/* whether a pending write makes the file at path */
static bool write_pending(const pcache *c, const char *path) {
    for (int i = 0; i < c->n_wp; i++)
        if (!strcmp(c->wp[i]->path, path)) return true;
    return false;
}

/* The file at path was removed by this process's writer: no entry or spine names it now. */
static void file_forget(pcache *c, const char *path) {
    const int i = entry_of_path(c, path);
    if (i >= 0) {
        entry *en = &c->es[i];
        if (en->tail) { /* kept in RAM, as an entry with no file */
            free(en->path);
            en->path = NULL;
        } else {
            entry_free(c, en);
            *en = (entry){0};
        }
    }
    for (int k = 0; k < c->n_seq; k++)
        if (c->spines[k].file && !strcmp(c->spines[k].file, path)) spine_file(c, k, NULL, 0, 0, 0);
}

/* A job back from the writer: its entry names its file (or, failed, the failure is logged and
 * nothing names it) */
/* the entries waiting on write j (wid) take its file, done: whether there were any */
static bool entries_take_file(pcache *c, const wjob *j, uint32_t depth) {
    bool any = false;
    for (int i = 0; i < c->n; i++) {
        entry *en = &c->es[i];
        if (en->wid != j->id) continue;
        en->wid = 0;
        free(en->path);
        en->path = xstrdup(j->path);
        en->sum = j->sum;
        en->depth = depth;
        en->gone = false; /* evicted from RAM meanwhile: its file holds it now */
        any = true;
    }
    return any;
}

static void job_apply(pcache *c, wjob *j) {
    spine *sp = j->kind == W_THROUGH ? &c->spines[j->seq] : NULL;
    if (j->rc < 0) {
        fprintf(stderr, "hearth serve: --cache-dir: %s\n", j->err);
        if (sp && sp->file_job == j->id) spine_file(c, j->seq, NULL, 0, 0, 0);
        for (int i = 0; i < c->n; i++)
            if (c->es[i].wid == j->id) c->es[i].wid = 0;
        return;
    }
    const uint32_t depth = j->chained ? j->par.depth : 0;
    if (j->kind == W_PUT) {
        entries_take_file(c, j, depth);
        return;
    }
    if (sp->file_job == j->id) {
        sp->file_sum = j->sum;
        sp->file_job = 0;
    }
    if (entries_take_file(c, j, depth)) return; /* an entry put in RAM while this file was pending (put) */
    int i = entry_of_path(c, j->path);
    if (i >= 0) { /* indexed meanwhile (another process wrote the same) */
        c->es[i].sum = j->sum;
        return;
    }
    const int slot = free_slot(c);
    if (slot < 0) {
        fprintf(stderr, "hearth serve: --cache-dir: %s not indexed: the cache has %d entries already\n", j->path, MAX_ENTRIES);
        return;
    }
    if (slot == c->n) c->n++;
    entry_free(c, &c->es[slot]); /* an evicted entry's leftovers */
    c->es[slot] = (entry){.ids = j->ids, .n = j->n, .n_pts = j->n_pts, .pt_pos = j->pt_pos, .path = xstrdup(j->path),
                          .sum = j->sum, .depth = depth, .t_used = time_now()};
    j->ids = NULL;
    j->pt_pos = NULL;
}

/* engine thread: what the writer finished since the last call */
static void writes_taken_back(pcache *c) {
    wq *w = c->w;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    wjob *d = w->done;
    w->done = w->done_tail = NULL;
    char **gone = w->gone;
    const int n_gone = w->n_gone;
    w->gone = NULL;
    w->n_gone = w->cap_gone = 0;
    pthread_mutex_unlock(&w->mu);
    while (d) {
        wjob *j = d;
        d = d->next;
        job_apply(c, j);
        int i = 0;
        while (i < c->n_wp && c->wp[i] != j) i++;
        if (i == c->n_wp) HEARTH_DIE("a write taken back that was not pending");
        memmove(&c->wp[i], &c->wp[i + 1], sizeof c->wp[0] * (size_t)(c->n_wp - i - 1));
        c->n_wp--;
        job_free(c, j);
    }
    for (int i = 0; i < n_gone; i++) {
        file_forget(c, gone[i]);
        free(gone[i]);
    }
    free(gone);
}

/* engine thread: j to the writer (the caller checked there is room) */
static void write_queue(pcache *c, wjob *j) {
    wq *w = c->w;
    c->wp[c->n_wp++] = j;
    pthread_mutex_lock(&w->mu);
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* whether the writer can take one more; if not, the skip is counted (and said, now and then) */
static bool write_room(pcache *c) {
    if (c->n_wp < PCACHE_WRITES_MAX) return true;
    if (c->n_skipped++ % 100 == 0)
        fprintf(stderr, "hearth serve: --cache-dir: an entry not written: %d writes are pending (%lld skipped so far; "
                        "the disk is slower than the entries come)\n", PCACHE_WRITES_MAX, (long long)c->n_skipped);
    return false;
}

/* a job for the file at path of ids [0, n), pts, and rows kv (taken over) */
static wjob *job_new(pcache *c, wkind kind, const char *path, const int32_t *ids, int64_t n, engine_point *const *pts,
                     int n_pts, engine_kv *kv) {
    wjob *j = xcalloc(1, sizeof *j);
    j->id = ++c->next_wid;
    j->kind = kind;
    j->path = xstrdup(path);
    j->ids = xmalloc(sizeof(int32_t) * (size_t)n);
    memcpy(j->ids, ids, sizeof(int32_t) * (size_t)n);
    j->n = n;
    j->pts = xmalloc(sizeof *j->pts * (size_t)n_pts);
    j->pt_pos = xmalloc(sizeof *j->pt_pos * (size_t)n_pts);
    for (int k = 0; k < n_pts; k++) {
        j->pts[k] = pts[k];
        j->pt_pos[k] = pts[k]->pos;
    }
    j->n_pts = n_pts;
    j->own = xcalloc((size_t)n_pts, sizeof *j->own);
    j->kv = kv;
    j->bytes = file_bytes(n, kv->a, kv->bytes, n_pts, pts[0]);
    return j;
}

static int writer_start(pcache *c, herr *e) {
    wq *w = xcalloc(1, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_cond_init(&w->idle, NULL);
    w->dir = xstrdup(c->dir);
    w->mode = c->file_mode;
    w->disk_max = (int64_t)PCACHE_DISK_DEFAULT_MIB << 20;
    const char *delay = getenv("HEARTH_TEST_WRITE_DELAY_MS");
    if (delay && *delay) w->delay_ms = (unsigned)strtoul(delay, NULL, 10);
    if (pthread_create(&w->th, NULL, writer_main, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        pthread_cond_destroy(&w->idle);
        free(w->dir);
        free(w);
        return herr_set(e, "--cache-dir: cannot start the writer thread");
    }
    c->w = w;
    return 0;
}

void pcache_set_disk_max(pcache *c, int64_t bytes) {
    wq *w = c->w;
    if (!w) return;
    /* said once at start: a bound the file system cannot hold is met by failed writes first */
    struct statvfs vfs;
    const int64_t used = c->st.disk_bytes; /* the files found at start */
    if (!statvfs(w->dir, &vfs) && bytes > 0 && (int64_t)vfs.f_bavail * (int64_t)vfs.f_frsize + used < bytes)
        fprintf(stderr, "hearth serve: --cache-dir %s: its file system has %.0f MiB free, less than --cache-disk %.0f MiB "
                        "(less the %.0f MiB of files there): writes past that fail (logged, the entries kept in RAM)\n",
                w->dir, (double)vfs.f_bavail * (double)vfs.f_frsize / 1048576.0, bytes / 1048576.0, used / 1048576.0);
    pthread_mutex_lock(&w->mu);
    w->disk_max = bytes < 0 ? -1 : bytes;
    w->recheck = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void pcache_flush(pcache *c) {
    wq *w = c->w;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    while (w->head || w->busy || w->recheck) pthread_cond_wait(&w->idle, &w->mu);
    pthread_mutex_unlock(&w->mu);
    writes_taken_back(c);
}

static void writer_stop(pcache *c) {
    wq *w = c->w;
    if (!w) return;
    pcache_flush(c);
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    writes_taken_back(c);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_cond_destroy(&w->idle);
    free(w->gone);
    free(w->dir);
    free(w);
    c->w = NULL;
}

/* ---------------------------------------------------------------- public */

int pcache_open(pcache **out, engine *eng, const char *dir, herr *e) {
    pcache *c = xcalloc(1, sizeof *c);
    c->eng = eng;
    c->es = xcalloc(MAX_ENTRIES, sizeof *c->es);
    c->n_seq = engine_get_info(eng).n_seq_max;
    c->spines = xcalloc((size_t)c->n_seq, sizeof *c->spines);
    c->pinned = -1;
    if (dir) {
        /* a folder this process can write in, or a clear error at start (not one per entry
         * later): made if missing, then a file created in it and removed */
        struct stat sb;
        char probe[4200];
        snprintf(probe, sizeof probe, "%s/.hearth-probe-%d", dir, (int)getpid());
        FILE *pf = NULL;
        const char *why = NULL;
        int err = 0;
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) why = "cannot make it", err = errno;
        else if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) why = "it is not a directory";
        else if (!(pf = fopen(probe, "wb"))) why = "cannot write in it", err = errno;
        if (why) {
            free(c->spines);
            free(c->es);
            free(c);
            return herr_set(e, "--cache-dir %s: %s%s%s", dir, why, err ? ": " : "", err ? strerror(err) : "");
        }
        fclose(pf);
        unlink(probe);
        c->dir = xstrdup(dir);
        c->seen = xcalloc(MAX_SEEN, sizeof *c->seen);
        const mode_t um = umask(0); /* read back at once: no other thread makes files yet */
        umask(um);
        c->file_mode = 0666 & ~um;
        scan_dir(c);
        if (writer_start(c, e) < 0) {
            pcache_free(c);
            return -1;
        }
    }
    *out = c;
    return 0;
}

void pcache_free(pcache *c) {
    if (!c) return;
    writer_stop(c); /* every write handed over is written first */
    for (int i = 0; i < c->n; i++) entry_free(c, &c->es[i]);
    for (int k = 0; k < c->n_seq; k++) spine_set(c, k, NULL, 0), spine_file(c, k, NULL, 0, 0, 0);
    if (c->spans) { /* every span is an entry's or a spine's: none is left */
        fprintf(stderr, "%s:%d: pcache_free: a span [%lld, %lld) is still referenced\n", __FILE__, __LINE__,
                (long long)c->spans->a, (long long)c->spans->b);
        abort();
    }
    seen_clear(c);
    free(c->seen);
    free(c->spines);
    free(c->es);
    free(c->dir);
    free(c);
}

/* the latest allowed point inside the shared prefix, over the live entries or the evicted */
static int64_t best_of(const pcache *c, bool gone, const int32_t *ids, int64_t n, bool (*ok)(const void *, int64_t),
                       const void *cls, int *entry_out, int *point_out) {
    int64_t best = 0;
    *entry_out = *point_out = -1;
    for (int i = 0; i < c->n; i++) {
        const entry *en = &c->es[i];
        if (en->gone != gone) continue;
        int64_t common = ids_common_prefix(en->ids, en->n, ids, n);
        if (common > n - 1) common = n - 1;
        for (int k = en->n_pts - 1; k >= 0; k--) {
            const int64_t pos = en->pt_pos[k];
            if (pos <= common && pos > best && (!ok || ok(cls, pos))) {
                best = pos;
                *entry_out = i;
                *point_out = k;
                break;
            }
        }
    }
    return best;
}

int64_t pcache_best(pcache *c, const int32_t *ids, int64_t n, bool (*ok)(const void *, int64_t), const void *cls,
                    int *entry_out, int *point_out) {
    writes_taken_back(c);
    if (c->dir) discover(c, ids, n);
    return best_of(c, false, ids, n, ok, cls, entry_out, point_out);
}

int64_t pcache_evicted_best(const pcache *c, const int32_t *ids, int64_t n, bool (*ok)(const void *, int64_t),
                            const void *cls) {
    int ei, pi;
    return best_of(c, true, ids, n, ok, cls, &ei, &pi);
}

/* a free entry slot: an unused one, or the least recently used of the evicted; -1 if none */
static int free_slot(pcache *c) {
    int k = -1;
    for (int i = 0; i < c->n; i++) {
        if (!c->es[i].ids) return i;
        if (c->es[i].gone && (k < 0 || c->es[i].t_used < c->es[k].t_used)) k = i;
    }
    if (c->n < MAX_ENTRIES) return c->n;
    if (k >= 0) {
        entry_free(c, &c->es[k]);
        c->es[k] = (entry){0};
    }
    return k;
}

/* whether an entry already holds prefix [0, n) of ids and all these points */
static bool held_in_ram(const pcache *c, const int32_t *ids, int64_t n, engine_point *const *pts, int n_pts) {
    for (int i = 0; i < c->n; i++) {
        const entry *en = &c->es[i];
        if (!en->ids || en->gone || en->n < n || ids_common_prefix(en->ids, en->n, ids, n) < n) continue;
        bool all = true;
        for (int k = 0; k < n_pts && all; k++) {
            bool found = false;
            for (int j = 0; j < en->n_pts && !found; j++) found = en->pt_pos[j] == pts[k]->pos;
            all = found;
        }
        if (all) return true;
    }
    return false;
}
/* a file pending (written through) of those ids and points, or NULL: its entry comes when it
 * is written, none if the write fails */
static const wjob *held_pending(const pcache *c, const int32_t *ids, int64_t n, engine_point *const *pts, int n_pts) {
    for (int i = 0; i < c->n_wp; i++) {
        const wjob *j = c->wp[i];
        if (j->kind != W_THROUGH || j->n < n || ids_common_prefix(j->ids, j->n, ids, n) < n) continue;
        bool all = true;
        for (int k = 0; k < n_pts && all; k++) {
            bool found = false;
            for (int q = 0; q < j->n_pts && !found; q++) found = j->pt_pos[q] == pts[k]->pos;
            all = found;
        }
        if (all) return j;
    }
    return NULL;
}
/* held_in_ram or held_pending: what a write-through need not write again */
static bool held(const pcache *c, const int32_t *ids, int64_t n, engine_point *const *pts, int n_pts) {
    return held_in_ram(c, ids, n, pts, n_pts) || held_pending(c, ids, n, pts, n_pts);
}

/* --cache-ram 0: entry en (just put) leaves RAM at once, kept as its file (once written) */
static int put_done(pcache *c, entry *en) {
    if (!c->no_ram) return 0;
    entry_drop_ram(c, en);
    for (int q = 0; q < c->n_seq; q++) spine_trim(c, q);
    en->gone = !en->path; /* a pending write gives it its file (job_apply) */
    if (en->gone) trim_gone(c);
    return 0;
}

void pcache_keep_ram(pcache *c, bool keep) { c->no_ram = !keep; }

/* pcache_put, writing the file at path (NULL: the directory's name for it) and saying why not */
static int put(pcache *c, int seq, const int32_t *ids, int64_t n_held, engine_point **pts, int n_pts, const char *path,
               bool dedupe, herr *e) {
    if (n_pts == 0) return herr_set(e, "nothing to keep: the slot holds no point");
    writes_taken_back(c);
    const int64_t n = pts[n_pts - 1]->pos;
    if (dedupe && held_in_ram(c, ids, n, pts, n_pts)) { /* nothing to add */
        for (int k = 0; k < n_pts; k++) point_release(c, pts[k]);
        return 0;
    }
    /* a file of them pending (written through when their request ended): the entry is made in
     * RAM now and takes that file's name once it is written (job_apply); if the write fails it
     * stays in RAM only, as any entry whose write failed (the points are not let go on the
     * promise of a file that may never be) */
    const wjob *pend = path ? NULL : held_pending(c, ids, n, pts, n_pts);
    const int slot = n <= n_held ? free_slot(c) : -1;
    if (slot < 0) {
        if (n > n_held) herr_set(e, "a point at %lld past the %lld rows held", (long long)n, (long long)n_held);
        else herr_set(e, "the cache has %d entries already", MAX_ENTRIES);
        for (int k = 0; k < n_pts; k++) point_release(c, pts[k]);
        return -1;
    }
    if (slot == c->n) c->n++;
    entry *en = &c->es[slot];
    entry_free(c, en); /* an evicted entry's leftovers */
    /* the rows stay where they are (shared with the sequence's spine): no row is copied */
    *en = (entry){.n = n, .tail = seq_tail(c, seq, n), .n_pts = n_pts, .t_used = time_now()};
    en->ids = xmalloc(sizeof(int32_t) * (size_t)n);
    memcpy(en->ids, ids, sizeof(int32_t) * (size_t)n);
    en->pts = xmalloc(sizeof *en->pts * (size_t)n_pts);
    en->pt_pos = xmalloc(sizeof *en->pt_pos * (size_t)n_pts);
    for (int k = 0; k < n_pts; k++) {
        en->pts[k] = pts[k];
        en->pt_pos[k] = pts[k]->pos;
    }
    if (!path && !c->dir) return put_done(c, en);
    if (pend) {
        en->wid = pend->id;
        return put_done(c, en);
    }
    char name[4096];
    if (!path) { /* the writer's: none pending for this name, and room for it */
        entry_name(c, en, name, sizeof name);
        if (write_pending(c, name) || !write_room(c)) return put_done(c, en);
    }
    /* a file holds its rows [0, n) whole: read from the sequence for the write alone */
    engine_kv *kv = NULL;
    while (engine_kv_read(c->eng, seq, 0, n, &kv, e) < 0)
        if (!pcache_evict_older(c, en->t_used)) return -1;
    if (path) {
        const int rc = entry_write(c, en, kv, path, e);
        engine_kv_free(c->eng, kv);
        return rc;
    }
    wjob *j = job_new(c, W_PUT, name, en->ids, n, en->pts, n_pts, kv);
    en->wid = j->id;
    write_queue(c, j);
    return put_done(c, en);
}

void pcache_put(pcache *c, int seq, const int32_t *ids, int64_t n_held, engine_point **pts, int n_pts) {
    herr e;
    if (put(c, seq, ids, n_held, pts, n_pts, NULL, true, &e) < 0 && c->dir)
        fprintf(stderr, "hearth serve: --cache-dir: %s\n", e.msg);
}

void pcache_write_through(pcache *c, int seq, const int32_t *ids, int64_t n_held, engine_point *const *pts, int n_pts) {
    if (!c->dir || n_pts == 0) return;
    writes_taken_back(c);
    const int64_t n = pts[n_pts - 1]->pos;
    if (n > n_held || held(c, ids, n, pts, n_pts)) return;
    /* after the file whose rows the sequence holds, when there is one (the writer touches it
     * first, under its lock): the rows past it alone, so a conversation's turn writes its own
     * rows, not its history */
    spine *sp = &c->spines[seq];
    file_parent par = {0};
    const bool chained = sp->file && sp->file_a < n && sp->file_depth < CHAIN_MAX;
    if (chained) {
        par = (file_parent){.a = sp->file_a, .sum = sp->file_sum, .depth = sp->file_depth + 1};
        snprintf(par.name, sizeof par.name, "%s", strrchr(sp->file, '/') + 1);
    }
    int64_t *pos = xmalloc(sizeof *pos * (size_t)n_pts);
    for (int k = 0; k < n_pts; k++) pos[k] = pts[k]->pos;
    entry en = {.ids = (int32_t *)ids, .n = n, .n_pts = n_pts, .pt_pos = pos};
    char name[4096];
    entry_name(c, &en, name, sizeof name);
    free(pos);
    if (write_pending(c, name) || !write_room(c)) return;
    herr e;
    engine_kv *kv = NULL;
    while (engine_kv_read(c->eng, seq, par.a, n, &kv, &e) < 0)
        if (!pcache_evict_older(c, INFINITY)) {
            fprintf(stderr, "hearth serve: --cache-dir: not written: %s\n", e.msg);
            return;
        }
    wjob *j = job_new(c, W_THROUGH, name, ids, n, pts, n_pts, kv);
    j->seq = seq;
    j->chained = chained;
    j->par = par;
    j->par_job = chained ? sp->file_job : 0;
    write_queue(c, j);
    /* the next file written from this sequence follows this one (if its write fails, none) */
    spine_file(c, seq, name, 0, par.depth, n);
    sp->file_job = j->id;
}

int pcache_save(pcache *c, int seq, const int32_t *ids, int64_t n_held, engine_point *const *pts, int n_pts,
                const char *path, int64_t *n_rows, herr *e) {
    if (n_pts == 0) return herr_set(e, "nothing to save: the slot holds no point");
    engine_point **cp = xcalloc((size_t)n_pts, sizeof *cp);
    for (int k = 0; k < n_pts; k++) {
        while (engine_point_new(c->eng, &cp[k], e) < 0)
            if (!pcache_evict_older(c, INFINITY)) {
                for (int j = 0; j < k; j++) engine_point_free(c->eng, cp[j]);
                free(cp);
                return -1;
            }
        engine_point_copy(cp[k], pts[k]);
    }
    const int rc = put(c, seq, ids, n_held, cp, n_pts, path, false, e);
    free(cp);
    if (rc == 0) *n_rows = pts[n_pts - 1]->pos;
    return rc;
}

int pcache_load(pcache *c, const char *path, int64_t *n_rows, herr *e) {
    const int slot = free_slot(c);
    if (slot < 0) return herr_set(e, "the cache has %d entries already", MAX_ENTRIES);
    entry en = {0};
    if (entry_read(c, &en, path, RD_CHECK, NULL, e) < 0 || entry_read_evicting(c, &en, path, NULL, e) < 0) {
        entry_free(c, &en);
        return -1;
    }
    en.path = xstrdup(path);
    en.t_used = time_now();
    if (slot == c->n) c->n++;
    entry_free(c, &c->es[slot]);
    c->es[slot] = en;
    c->st.n_loaded++;
    *n_rows = en.n;
    return 0;
}

/* the rows [0, p) of entry en's chain that sequence seq holds as they are (the same spans:
 * the same bits): the chains' common start, at most p */
static int64_t held_rows(pcache *c, const entry *en, int seq, int64_t p) {
    if (!en->tail) return 0;
    span **ch, **sc;
    int64_t *ends, *sends;
    const int nc = chain_list(en->tail, en->n, &ch, &ends);
    const int ns = chain_list(c->spines[seq].s, c->spines[seq].end, &sc, &sends);
    int j = 0;
    while (j < nc && j < ns && ch[j] == sc[j]) j++;
    int64_t have = j ? (ends[j - 1] < sends[j - 1] ? ends[j - 1] : sends[j - 1]) : 0;
    if (have > p) have = p;
    free(ch);
    free(ends);
    free(sc);
    free(sends);
    return have;
}

int64_t pcache_holds(pcache *c, int i, int k, int seq) { return held_rows(c, &c->es[i], seq, c->es[i].pt_pos[k]); }

int64_t pcache_cut_rows(const pcache *c, int k, int64_t from) {
    const spine *sp = &c->spines[k];
    int64_t rows = 0, e = sp->end;
    bool needed = false;
    for (const span *t = sp->s; t && e > from; e = t->a, t = t->parent) { /* pcache_seq_cut's walk */
        needed = needed || t->refs > 1;
        if (t->seq == k && needed) rows += t->b - (t->a > from ? t->a : from);
        if (t->a < from) break;
    }
    return rows;
}

int pcache_restore(pcache *c, int i, int k, int seq, const int32_t **ids, int64_t *pos, herr *e) {
    entry *en = &c->es[i];
    const int64_t want = en->pt_pos[k];
    if (!en->tail) { /* back from its file, which another process may have removed or replaced */
        herr fe;
        struct stat sb;
        const int rc = entry_read_evicting(c, en, en->path, &sb, &fe);
        if (rc < 0) {
            herr_set(e, "the cache file %s could not be read back: %s", en->path, fe.msg);
            if (rc == RD_BAD) refuse(c, en->path, &sb, fe.msg);
            if (rc != RD_ROOM) { /* forgotten: its slot is free for another */
                entry_free(c, en);
                *en = (entry){0};
            }
            return -1;
        }
        c->st.n_loaded++;
        k = 0; /* the file's points, which are the name's: the one asked for is among them */
        while (k < en->n_pts && en->pt_pos[k] != want) k++;
        if (k == en->n_pts) {
            entry_drop_ram(c, en);
            return herr_set(e, "the cache file %s no longer holds a point at %" PRId64, en->path, want);
        }
    } else if (en->path) { /* its file's use too (--cache-disk removes the least recently used) */
        touch(-1, en->path);
    }
    en->t_used = time_now(); /* the most recent: what eviction below leaves to the last */
    const engine_point *pt = en->pts[k];
    const int64_t p = pt->pos;
    /* the rows the sequence holds already */
    const int64_t have = held_rows(c, en, seq, p);
    c->pinned = i;
    pcache_seq_cut(c, seq, have); /* what the sequence alone holds past have is copied out */
    if (have == 0) engine_seq_clear(c->eng, seq);
    span **ch;
    int64_t *ends;
    const int nc = chain_list(en->tail, en->n, &ch, &ends); /* (after the cut: it may have split a span) */
    int rc = 0, top = 0;
    for (int m = 0; m < nc && rc == 0 && ch[m]->a < p; m++) {
        const span *t = ch[m];
        top = m;
        if (ends[m] <= have) continue;
        if (t->kv) {
            rc = engine_kv_write(c->eng, seq, t->kv, e);
        } else { /* live in another sequence: through a copy */
            const int64_t a = t->a > have ? t->a : have;
            engine_kv *kv = NULL;
            while ((rc = engine_kv_read(c->eng, t->seq, a, ends[m], &kv, e)) < 0)
                if (!pcache_evict_older(c, INFINITY)) break;
            if (rc == 0) rc = engine_kv_write(c->eng, seq, kv, e);
            engine_kv_free(c->eng, kv);
        }
        c->st.rows_written += t->kv ? t->b - t->a : ends[m] - (t->a > have ? t->a : have);
    }
    if (rc == 0) rc = engine_restore(c->eng, seq, pt, e);
    if (rc == 0) { /* it holds the entry's rows [0, p) now, and its file's */
        spine_set(c, seq, ch[top], p);
        spine_file(c, seq, en->path, en->sum, en->depth, p);
    }
    c->pinned = -1;
    free(ch);
    free(ends);
    if (rc < 0) {
        pcache_seq_cut(c, seq, 0);
        engine_seq_clear(c->eng, seq);
        return -1;
    }
    *ids = en->ids;
    *pos = p;
    return 0;
}

pcache_stats pcache_get_stats(const pcache *c) {
    pcache_stats st = c->st;
    st.n_entries = c->n;
    st.n_in_ram = 0;
    st.n_entries = 0;
    for (int i = 0; i < c->n; i++) {
        st.n_in_ram += c->es[i].tail != NULL;
        st.n_entries += c->es[i].ids != NULL && !c->es[i].gone;
        if (c->es[i].gone) st.gone_bytes += entry_gone_bytes(&c->es[i]);
    }
    for (const span *t = c->spans; t; t = t->next) {
        st.n_spans++;
        if (t->kv) st.host_rows += t->b - t->a;
    }
    st.n_write_skipped = c->n_skipped;
    st.disk_max = -1;
    if (c->w) {
        pthread_mutex_lock(&c->w->mu);
        st.n_saved += c->w->n_saved;
        st.n_write_failed = c->w->n_failed;
        st.n_disk_evicted = c->w->n_evicted;
        st.disk_max = c->w->disk_max;
        if (c->w->scanned) st.disk_bytes = c->w->disk_bytes;
        pthread_mutex_unlock(&c->w->mu);
    }
    return st;
}
