/* util.h: the small things every layer uses: the error record for bad input,
 * abort-with-location for broken invariants, checked allocation, a counter-based RNG,
 * reading a whole file.
 * Two classes of error (STYLE.md 5): bytes from outside get a herr and a return code;
 * impossible states call HEARTH_DIE and never return. */
#ifndef HEARTH_UTIL_H
#define HEARTH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* An error about input: what was wrong, in words a user can act on. */
typedef struct herr {
    char msg[512];
} herr;

/* Formats the message into e (if not NULL) and returns -1, so `return herr_set(e, ...)`. */
int herr_set(herr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "prefix: " to an existing message (context on the way up). */
int herr_wrap(herr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
#define HEARTH_NORETURN [[noreturn]]
#else
#define HEARTH_NORETURN _Noreturn
#endif
HEARTH_NORETURN void hearth_die(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define HEARTH_DIE(...) hearth_die(__FILE__, __LINE__, __VA_ARGS__)
#define HEARTH_CHECK(cond) \
    do { if (!(cond)) hearth_die(__FILE__, __LINE__, "invariant failed: %s", #cond); } while (0)

void *xmalloc(size_t n);            /* aborts on out-of-memory: not a user error */
void *xcalloc(size_t n, size_t sz);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
void *xmalloc_aligned(size_t align, size_t n);

/* Overflow-checked arithmetic on sizes from files: false when the result does not fit. */
static inline bool add_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool mul_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }

/* Counter-based RNG (splitmix64 over a key and an index): the value for (key, i) does
 * not depend on the order or the thread that asks, so generation is parallel and
 * deterministic per seed. */
static inline uint64_t rng_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static inline uint64_t rng_at(uint64_t key, uint64_t i) { return rng_mix(key ^ rng_mix(i)); }
/* uniform in [0, 1) with 24 bits */
static inline float rng_unit(uint64_t key, uint64_t i) { return (float)(rng_at(key, i) >> 40) * (1.0f / 16777216.0f); }
uint64_t rng_key(uint64_t seed, const char *name); /* a key per (seed, tensor name) */
/* approximately normal(0,1): the sum of four uniforms, rescaled (variance 1). */
float rng_normal(uint64_t key, uint64_t i);

double time_now(void); /* seconds, monotonic */
void sleep_ms(int64_t ms); /* sleeps that long, signals or not */

/* The whole file into *data (malloc'd, NUL-terminated; *len excludes the NUL; len may be
 * NULL). Reads pipes and /dev/stdin too. Returns 0, or -1 with e = "PATH: why" (the errno
 * text) and errno left saying why (ENOENT: no such file; EFBIG: over READ_FILE_MAX). */
#define READ_FILE_MAX ((size_t)1 << 31)
int read_file(const char *path, char **data, size_t *len, herr *e);

#endif
