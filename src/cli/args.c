/* args.c: numeric flag parsing for the subcommands. */
#include "cli/args.h"
#include "base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

bool arg_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out, const char *cmd) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "hearth %s: %s expects a whole number in [%" PRId64 ", %" PRId64 "], got '%s'\n", cmd, flag, lo,
                hi, s ? s : "(nothing)");
        return false;
    }
    *out = v;
    return true;
}

bool arg_f32(const char *flag, const char *s, float lo, float hi, float *out, const char *cmd) {
    char *end;
    errno = 0;
    float v = s ? strtof(s, &end) : 0;
    if (!s || !*s || *end || errno || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "hearth %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, s ? s : "(nothing)");
        return false;
    }
    *out = v;
    return true;
}

bool arg_id_list(const char *flag, const char *s, int32_t **out, int64_t *n, const char *cmd) {
    int64_t cap = 16, k = 0;
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)cap);
    const char *p = s;
    while (p && *p) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "hearth %s: %s: element %" PRId64 " of '%s' is not a token id\n", cmd, flag, k, s);
            free(ids);
            return false;
        }
        if (k == cap) ids = xrealloc(ids, sizeof(int32_t) * (size_t)(cap *= 2));
        ids[k++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        fprintf(stderr, "hearth %s: %s: empty id list\n", cmd, flag);
        free(ids);
        return false;
    }
    *out = ids;
    *n = k;
    return true;
}
