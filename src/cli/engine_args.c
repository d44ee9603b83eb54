/* engine_args.c: see engine_args.h. */
#include "cli/engine_args.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool cli_device_value(const char *v, engine_device *out) {
    if (v && !strcmp(v, "cpu")) *out = ENGINE_CPU;
    else if (v && !strcmp(v, "cuda")) *out = ENGINE_CUDA;
    else if (v && !strcmp(v, "auto")) *out = ENGINE_AUTO;
    else return false;
    return true;
}

int cli_parse_device(const char *v, void *dst, herr *e) {
    if (!cli_device_value(v, (engine_device *)dst)) return herr_set(e, "expects cpu, cuda or auto, got '%s'", v);
    return 0;
}

bool cli_marks(const char *v, int64_t n_prompt, int64_t **out, int64_t *n, const char *cmd) {
    int64_t cap = 8, k = 0;
    int64_t *m = xmalloc(sizeof(int64_t) * (size_t)cap);
    const char *p = v;
    while (p && *p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        const char *why = NULL;
        if (end == p || errno || (*end && *end != ',')) why = "is not a whole number";
        else if (x < 1 || x > n_prompt) why = "is outside the prompt's positions";
        else if (k && x <= m[k - 1]) why = "does not come after the mark before it";
        if (why) {
            fprintf(stderr, "hearth %s: --marks: position %.*s %s (marks are positions 1..%" PRId64 " of the prompt, ascending)\n",
                    cmd, (int)(end > p ? end - p : (int)strcspn(p, ",")), p, why, n_prompt);
            free(m);
            return false;
        }
        if (k == cap) m = xrealloc(m, sizeof(int64_t) * (size_t)(cap *= 2));
        m[k++] = x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        fprintf(stderr, "hearth %s: --marks: no positions given\n", cmd);
        free(m);
        return false;
    }
    *out = m;
    *n = k;
    return true;
}
