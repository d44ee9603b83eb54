/* harness.h: a minimal unit-test harness. Each tests/unit/test_*.c is one program:
 *   TEST(name) { CHECK(cond); CHECK_MSG(cond, "fmt", ...); }
 *   int main(void) { RUN(name); ...; return harness_done(); }
 * It prints one line per test and ends with "N passed, N failed" (tests/run adds them up).
 * A test may call SKIP("why") to be counted as skipped, visibly. */
#ifndef HEARTH_HARNESS_H
#define HEARTH_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static int harness_passed, harness_failed, harness_skipped;
static int harness_cur_failed;
static const char *harness_skip_why;

#define TEST(name) static void name(void)
#define CHECK(cond) CHECK_MSG(cond, "%s", #cond)
#define CHECK_MSG(cond, ...)                                                     \
    do {                                                                         \
        if (!(cond)) {                                                           \
            if (harness_cur_failed < 5) {                                        \
                fprintf(stderr, "    %s:%d: check failed: ", __FILE__, __LINE__); \
                fprintf(stderr, __VA_ARGS__);                                    \
                fputc('\n', stderr);                                             \
            }                                                                    \
            harness_cur_failed++;                                                \
        }                                                                        \
    } while (0)
#define SKIP(why) do { harness_skip_why = (why); return; } while (0)

#define RUN(name)                                                                         \
    do {                                                                                  \
        harness_cur_failed = 0;                                                           \
        harness_skip_why = NULL;                                                          \
        name();                                                                           \
        if (harness_cur_failed) {                                                         \
            harness_failed++;                                                             \
            printf("FAIL %s (%d checks)\n", #name, harness_cur_failed);                   \
        } else if (harness_skip_why) {                                                    \
            harness_skipped++;                                                            \
            printf("SKIP %s: %s\n", #name, harness_skip_why);                             \
        } else {                                                                          \
            harness_passed++;                                                             \
            printf("ok   %s\n", #name);                                                   \
        }                                                                                 \
        fflush(stdout);                                                                   \
    } while (0)

/* A whole file (read_file: NUL-terminated), or NULL with the reason on stderr. */
static inline void *test_read(const char *path, size_t *n) {
    char *b;
    herr e;
    if (read_file(path, &b, n, &e) < 0) {
        fprintf(stderr, "    %s\n", e.msg);
        return NULL;
    }
    return b;
}

static inline int harness_done(void) {
    printf("%d passed, %d failed, %d skipped\n", harness_passed, harness_failed, harness_skipped);
    return harness_failed ? 1 : 0;
}

#endif
