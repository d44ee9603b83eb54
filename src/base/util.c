/* util.c: error records, checked allocation, RNG helpers, clock, whole-file reads. */
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int herr_set(herr *e, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int herr_wrap(herr *e, const char *fmt, ...) {
    if (e) {
        char prefix[256], old[sizeof e->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, e->msg, sizeof old);
        /* the message may lose its tail when the prefix is long: it stays NUL-terminated */
        size_t pl = strlen(prefix);
        if (pl > sizeof e->msg - 3) pl = sizeof e->msg - 3;
        memcpy(e->msg, prefix, pl);
        memcpy(e->msg + pl, ": ", 2);
        size_t room = sizeof e->msg - pl - 3, ol = strlen(old);
        if (ol > room) ol = room;
        memcpy(e->msg + pl + 2, old, ol);
        e->msg[pl + 2 + ol] = 0;
    }
    return -1;
}

void hearth_die(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "hearth: fatal at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) HEARTH_DIE("out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) HEARTH_DIE("out of memory allocating %zu x %zu bytes", n, sz);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) HEARTH_DIE("out of memory reallocating %zu bytes", n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

void *xmalloc_aligned(size_t align, size_t n) {
    void *p = NULL;
    /* round up: aligned_alloc wants a multiple of the alignment */
    size_t m = (n + align - 1) / align * align;
    if (posix_memalign(&p, align, m ? m : align) != 0) HEARTH_DIE("out of memory allocating %zu bytes", n);
    return p;
}

uint64_t rng_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the name, then mixed with the seed */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return rng_mix(h ^ rng_mix(seed));
}

float rng_normal(uint64_t key, uint64_t i) {
    /* Irwin-Hall with 4 terms: mean 2, variance 4/12; centred and scaled to variance 1.
     * Tails stop at +-sqrt(12) = 3.46 sigma, which keeps random 40-layer models finite. */
    uint64_t r = rng_at(key, i);
    float s = 0;
    for (int k = 0; k < 4; k++) s += (float)((r >> (16 * k)) & 0xffff) * (1.0f / 65536.0f);
    return (s - 2.0f) * 1.7320508f;
}

double time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void sleep_ms(int64_t ms) {
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

int read_file(const char *path, char **data, size_t *len, herr *e) {
    *data = NULL;
    if (len) *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        herr_set(e, "%s: %s", path, strerror(err));
        errno = err;
        return -1;
    }
    struct stat st;
    int err = 0;
    size_t cap = 1 << 16, n = 0;
    if (fstat(fd, &st) == 0) {
        if (S_ISDIR(st.st_mode)) err = EISDIR;
        else if (S_ISREG(st.st_mode) && (uint64_t)st.st_size >= READ_FILE_MAX) err = EFBIG;
        else if (S_ISREG(st.st_mode)) cap = (size_t)st.st_size + 2; /* the NUL, and a read that sees the end */
    }
    char *buf = err ? NULL : xmalloc(cap);
    while (!err) {
        if (n + 1 >= cap) { /* room for one more byte and the NUL */
            if (cap >= READ_FILE_MAX) {
                err = EFBIG;
                break;
            }
            cap = cap * 2 < READ_FILE_MAX ? cap * 2 : READ_FILE_MAX;
            buf = xrealloc(buf, cap);
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) err = errno;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (err) {
        free(buf);
        if (err == EFBIG) herr_set(e, "%s: larger than %zu GiB", path, READ_FILE_MAX >> 30);
        else herr_set(e, "%s: %s", path, strerror(err));
        errno = err;
        return -1;
    }
    buf[n] = 0;
    *data = buf;
    if (len) *len = n;
    return 0;
}
