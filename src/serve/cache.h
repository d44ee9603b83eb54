/* cache.h: the prompt cache all slots share. An entry is a prefix of ids [0, n), its KV rows
 * [0, n) and points at positions <= n: whatever a slot held when it went on to another
 * conversation. Any slot can resume from an entry: its KV rows are written into the slot's
 * sequence (those it does not hold already) and a point restored (the engine checks both by
 * hash).
 *
 * KV rows are shared, not copied per entry: entries along one conversation hold its prefix
 * once (reference-counted spans of rows), and rows a sequence still holds stay in it: putting
 * a slot's points copies no row. The cache must hear of a sequence about to lose rows
 * (pcache_seq_cut, before an engine_restore to an earlier row or an engine_seq_clear): it
 * copies out then, once, the rows past the cut that an entry or another sequence still uses.
 * So an append-only conversation copies per turn the rows its resume goes back over, not its
 * history; a slot moving to another conversation copies the old one's rows once, or none when
 * the scheduler parks its sequence (sched.h: the rows stay live there until it is evicted,
 * pcache_cut_rows and pcache_holds say what a cut or a restore would move).
 *
 * Entries live in host RAM under the engine's cache budget (--cache-ram), shared with the
 * slots' own points; the least recently used goes first. With a directory (--cache-dir)
 * every entry is also a file, and so are the points each request made (written through when
 * it ends, kept as a file only), found again after a restart or a crash. A write-through from
 * a sequence that holds an earlier file's rows as they are writes only the rows past them,
 * naming that file (its parent, read first, touched when a child is written); a file that is
 * corrupt (its checksum), truncated, of another model, or inconsistent (a point's or row's
 * hash against its ids), or whose parent is gone or not the file it followed, is refused and
 * removed, with a line on stderr. An entry evicted from
 * RAM keeps its file and its ids, and is read back when a request matches it.
 *
 * Several processes (replicas) may share the directory: a file is written under a temporary
 * name of its own and renamed into place; its name carries the key of the ids before its
 * first point, so a lookup finds the files others wrote since it last looked (listing the
 * folder again only when it changed) without reading the ones of other conversations; a file
 * that is gone or refused when read back leaves a miss, not a crash. Each process keeps only
 * the ids and point positions of a file it did not make until it reads it back.
 *
 * Files are written by a writer thread of the cache's own, never by the caller: the engine
 * thread hands it an entry's KV rows (a copy it makes anyway) and its points (by reference:
 * a point a pending write reads is freed once the write is done, pcache_point_free), at most
 * PCACHE_WRITES_MAX at a time; one more is skipped and counted, never waited for. Before each
 * write the writer keeps the folder's cache files under --cache-disk (pcache_set_disk_max),
 * removing the least recently used first (a file's mtime, touched when it is read back or a
 * file is written after it), a file only once no other file follows it, and only under a
 * non-blocking exclusive flock: every reader holds a shared flock on a file from its open to
 * its last byte (a child's parents included), so no replica removes a file another reads. */
#ifndef HEARTH_SERVE_CACHE_H
#define HEARTH_SERVE_CACHE_H

#include <stdbool.h>
#include <stdint.h>
#include "engine/engine.h"

typedef struct pcache pcache;

typedef struct pcache_stats {
    int64_t n_entries, n_in_ram, n_saved, n_loaded, n_refused, n_evicted;
    int64_t disk_bytes;
    int64_t n_spans, host_rows; /* spans of KV rows, and the rows of those held on the host */
    int64_t rows_copied;    /* rows copied out of sequences into spans (pcache_seq_cut), in all */
    int64_t rows_written;   /* rows written into sequences by restores, in all */
    int64_t gone_bytes;     /* ids and positions kept of entries evicted with no file (a miss's
                             * reason), outside the budget: at most PCACHE_GONE_MAX */
    int64_t n_write_skipped; /* files not written: the writer had PCACHE_WRITES_MAX pending */
    int64_t n_write_failed;  /* files whose write failed (a full disk, no room under the cap) */
    int64_t n_disk_evicted;  /* files this process removed to stay under --cache-disk */
    int64_t disk_max;        /* --cache-disk in bytes (-1: no limit) */
} pcache_stats;

#define PCACHE_GONE_MAX ((int64_t)1 << 20)
#define PCACHE_WRITES_MAX 4                 /* entries handed to the writer and not yet written */
#define PCACHE_DISK_DEFAULT_MIB 16384       /* --cache-disk's default (README says why) */

/* how many ids a and b share from the start */
int64_t ids_common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb);

/* With a directory the writer thread starts here; the folder's bound is PCACHE_DISK_DEFAULT_MIB
 * until pcache_set_disk_max. A test seam: HEARTH_TEST_WRITE_DELAY_MS, a sleep before each
 * write, shows that nothing waits for one. */
int pcache_open(pcache **out, engine *eng, const char *dir, herr *e);
/* Waits for the writes handed over, writes them all, joins the writer, frees. */
void pcache_free(pcache *c);
/* The bound on the folder's cache files, in bytes (-1: none); files past it are removed before
 * the next write (and now, by the writer, if the folder is over it). */
void pcache_set_disk_max(pcache *c, int64_t bytes);
/* keep false (--cache-ram 0): an entry put leaves RAM at once, kept as its file only (with a
 * directory) or as its ids (a miss's reason): the shared cache holds nothing in RAM but what
 * /slots restore reads and what a restore is using. */
void pcache_keep_ram(pcache *c, bool keep);
/* Waits until every write handed over is done and taken back (tests; the end). */
void pcache_flush(pcache *c);
/* Frees a point a slot owned: now, or once the pending write that reads it is done. Whoever
 * frees a point that was passed to pcache_write_through calls this instead of
 * engine_point_free. */
void pcache_point_free(pcache *c, engine_point *p);

/* The best resume for ids [0, n) (at most n - 1): the row (0: none), with *entry and *point
 * naming it. ok(cls, pos) says which positions may be resumed at (NULL: any). With a
 * directory, the files other processes wrote there that match ids are indexed first. */
int64_t pcache_best(pcache *c, const int32_t *ids, int64_t n, bool (*ok)(const void *, int64_t), const void *cls,
                    int *entry, int *point);
/* The resume an entry evicted for the budget would have given (0: none): a miss's reason. */
int64_t pcache_evicted_best(const pcache *c, const int32_t *ids, int64_t n, bool (*ok)(const void *, int64_t),
                            const void *cls);
/* Puts sequence seq's state into the cache: its ids [0, n_held) and the points (taken over:
 * freed here if they cannot be kept); the KV rows up to the last point stay in the sequence,
 * shared (with --cache-dir they are read once for the file). */
void pcache_put(pcache *c, int seq, const int32_t *ids, int64_t n_held, engine_point **pts, int n_pts);
/* With a directory: points pts (the slot's, which it keeps) with the KV rows up to the last
 * as a file, and an entry naming it once written, unless an entry holds them already. The
 * caller copies the rows out of the sequence and queues the write: the writer thread writes
 * the file after it returns (skipped, and counted, when PCACHE_WRITES_MAX are pending). */
void pcache_write_through(pcache *c, int seq, const int32_t *ids, int64_t n_held, engine_point *const *pts, int n_pts);
/* /slots save: copies of the points (the slot keeps its own) and the KV rows up to the last,
 * as an entry and as the file at path; *n_rows the rows it covers. */
int pcache_save(pcache *c, int seq, const int32_t *ids, int64_t n_held, engine_point *const *pts, int n_pts,
                const char *path, int64_t *n_rows, herr *e);
/* /slots restore: the file at path (checked as at start) as an entry any slot resumes from. */
int pcache_load(pcache *c, const char *path, int64_t *n_rows, herr *e);
/* Sequence seq is about to lose its rows from `from` on (a restore to an earlier row, a clear):
 * the rows at or past from that the cache shares with it and still uses are copied to the
 * host first (those rows alone). Every caller that changes a sequence's rows below its end
 * calls it first; appending rows needs nothing. */
void pcache_seq_cut(pcache *c, int seq, int64_t from);
/* The rows pcache_seq_cut(seq, from) would copy out now (0: the cache uses none of the rows
 * it would lose; at from 0, whether the cache uses any row live in seq). */
int64_t pcache_cut_rows(const pcache *c, int seq, int64_t from);
/* The rows below entry's point that sequence seq holds as they are (a restore there writes
 * none of them): for a caller choosing the sequence to restore into. */
int64_t pcache_holds(pcache *c, int entry, int point, int seq);
/* Resumes sequence seq from entry's point: afterwards it holds ids [0, pos) of the entry. An
 * entry whose file cannot be read back is forgotten (and the file removed if it is bad). */
int pcache_restore(pcache *c, int entry, int point, int seq, const int32_t **ids, int64_t *pos, herr *e);
/* Frees the least recently used entry's RAM if it was used before t (returns true), for a
 * caller that needs room; *t_oldest receives the oldest use (INFINITY: none in RAM). */
bool pcache_evict_older(pcache *c, double t);
double pcache_oldest(const pcache *c);
pcache_stats pcache_get_stats(const pcache *c);

#endif
