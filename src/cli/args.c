/* args.c: the subcommands' option tables (args.h) and the one-value helpers. */
#include "cli/args.h"
#include "base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- tables ---- */

static bool takes_value(const arg_opt *o) { return o->kind != ARG_KIND_FLAG; }

/* A table a programmer got wrong is a broken invariant, not a user error. */
static void check_table(const arg_cmd *c) {
    for (const arg_opt *o = c->opts; o->kind != ARG_KIND_END; o++) {
        if (!o->name || o->name[0] != '-' || !o->dst) HEARTH_DIE("%s: an option without a name or dst", c->name);
        if (o->kind == ARG_KIND_ENUM && (!o->choices || !o->choices[0]))
            HEARTH_DIE("%s %s: no choices", c->name, o->name);
        if (o->kind == ARG_KIND_FN && !o->parse) HEARTH_DIE("%s %s: no parse function", c->name, o->name);
        const char *a[2] = {o->name, o->alias};
        for (int i = 0; i < 2; i++)
            if (a[i] && (!strcmp(a[i], "-h") || !strcmp(a[i], "--help") || !strcmp(a[i], "--")))
                HEARTH_DIE("%s: %s is built in", c->name, a[i]);
        for (const arg_opt *p = c->opts; p < o; p++) {
            const char *b[2] = {p->name, p->alias};
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++)
                    if (a[i] && b[j] && !strcmp(a[i], b[j])) HEARTH_DIE("%s: option %s listed twice", c->name, a[i]);
        }
    }
}

/* The option named exactly `a` (up to n bytes), or NULL. */
static const arg_opt *find(const arg_cmd *c, const char *a, size_t n) {
    for (const arg_opt *o = c->opts; o->kind != ARG_KIND_END; o++) {
        if (strlen(o->name) == n && !strncmp(o->name, a, n)) return o;
        if (o->alias && strlen(o->alias) == n && !strncmp(o->alias, a, n)) return o;
    }
    return NULL;
}

static int usage_error(const arg_cmd *c) {
    args_usage(c, stderr);
    return 2;
}

/* Stores one value; false with the message printed. `flag` is the spelling used. */
static bool store(const arg_cmd *c, const arg_opt *o, const char *flag, const char *v) {
    switch (o->kind) {
    case ARG_KIND_INT: {
        int64_t x;
        int64_t lo = o->lo < INT_MIN ? INT_MIN : o->lo, hi = o->hi > INT_MAX ? INT_MAX : o->hi;
        if (!arg_i64(flag, v, lo, hi, &x, c->name)) return false;
        *(int *)o->dst = (int)x;
        return true;
    }
    case ARG_KIND_I64: return arg_i64(flag, v, o->lo, o->hi, (int64_t *)o->dst, c->name);
    case ARG_KIND_F32: return arg_f32(flag, v, o->flo, o->fhi, (float *)o->dst, c->name);
    case ARG_KIND_STR: *(const char **)o->dst = v; return true;
    case ARG_KIND_ENUM:
        for (int i = 0; o->choices[i]; i++)
            if (!strcmp(v, o->choices[i])) {
                *(int *)o->dst = i;
                return true;
            }
        fprintf(stderr, "hearth %s: %s expects one of ", c->name, flag);
        for (int i = 0; o->choices[i]; i++) fprintf(stderr, "%s%s", i ? ", " : "", o->choices[i]);
        fprintf(stderr, ", got '%s'\n", v);
        return false;
    case ARG_KIND_IDS: {
        arg_ids *d = o->dst;
        int32_t *ids;
        int64_t n;
        if (!arg_id_list(flag, v, &ids, &n, c->name)) return false;
        free(d->v);
        d->v = ids;
        d->n = n;
        return true;
    }
    case ARG_KIND_FN: {
        herr e = {{0}};
        if (o->parse(v, o->dst, &e) == 0) return true;
        fprintf(stderr, "hearth %s: %s: %s\n", c->name, flag, e.msg[0] ? e.msg : "bad value");
        return false;
    }
    case ARG_KIND_FLAG:
    case ARG_KIND_END: break;
    }
    HEARTH_DIE("option %s: kind %d takes no value", o->name, (int)o->kind);
}

int args_parse(const arg_cmd *c, int argc, char **argv, const char **pos, int *n_pos) {
    check_table(c);
    const char *what = c->pos_name ? c->pos_name : "argument";
    int np = 0;
    bool only_pos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == 0) {
            if (np >= c->max_pos) {
                if (c->max_pos == 0)
                    fprintf(stderr, "hearth %s: unexpected %s '%s'\n", c->name, what, a);
                else if (c->max_pos == 1)
                    fprintf(stderr, "hearth %s: one %s only (got '%s' and '%s': quote an argument with spaces)\n",
                            c->name, what, pos[0], a);
                else
                    fprintf(stderr, "hearth %s: %d %ss at most (quote an argument with spaces)\n", c->name,
                            c->max_pos, what);
                return usage_error(c);
            }
            pos[np++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_pos = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            args_help(c, stdout);
            return 0;
        }
        /* --name=value */
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t n = eq ? (size_t)(eq - a) : strlen(a);
        const arg_opt *o = find(c, a, n);
        if (!o) {
            fprintf(stderr, "hearth %s: unknown option '%.*s'\n", c->name, (int)n, a);
            return usage_error(c);
        }
        char flag[64];
        snprintf(flag, sizeof flag, "%.*s", (int)n, a);
        if (!takes_value(o)) {
            if (eq) {
                fprintf(stderr, "hearth %s: %s takes no value\n", c->name, flag);
                return usage_error(c);
            }
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "hearth %s: %s needs a value\n", c->name, flag);
            return usage_error(c);
        }
        if (!store(c, o, flag, v)) return 2;
    }
    if (n_pos) *n_pos = np;
    return ARGS_RUN;
}

/* ---- help ---- */

/* "  -m, --model FILE" into buf; its length. */
static int left_column(const arg_opt *o, char *buf, size_t cap) {
    char choices[256] = "";
    const char *mv = o->metavar;
    if (!mv && o->kind == ARG_KIND_ENUM) {
        size_t k = 0;
        for (int i = 0; o->choices[i] && k < sizeof choices; i++)
            k += (size_t)snprintf(choices + k, sizeof choices - k, "%s%s", i ? "|" : "", o->choices[i]);
        mv = choices;
    }
    if (!mv) {
        switch (o->kind) {
        case ARG_KIND_INT:
        case ARG_KIND_I64: mv = "N"; break;
        case ARG_KIND_F32: mv = "X"; break;
        case ARG_KIND_IDS: mv = "ID,..."; break;
        default: mv = "VALUE"; break;
        }
    }
    /* the short spelling first, as in "-m, --model" */
    const char *first = o->name, *second = o->alias;
    if (second && strlen(second) < strlen(first)) {
        first = o->alias;
        second = o->name;
    }
    const bool v = takes_value(o);
    int n = snprintf(buf, cap, "  %s%s%s%s%s", first, second ? ", " : "", second ? second : "", v ? " " : "",
                     v ? mv : "");
    return n < 0 ? 0 : n >= (int)cap ? (int)cap - 1 : n;
}

enum { HELP_COL_MAX = 30 }; /* a longer left column puts its help on the next line */

static void put_help(FILE *out, const char *left, int width, const char *help) {
    int n = fprintf(out, "%s", left);
    if (!help || !*help) {
        fputc('\n', out);
        return;
    }
    if (n + 1 > width) {
        fputc('\n', out);
        n = 0;
    }
    for (const char *p = help;;) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        fprintf(out, "%*s%.*s\n", width - n, "", len, p);
        n = 0;
        if (!nl) break;
        p = nl + 1;
    }
}

void args_help(const arg_cmd *c, FILE *out) {
    fprintf(out, "usage: %s\n", c->usage);
    if (c->about) fprintf(out, "\n%s%s", c->about, c->about[strlen(c->about) - 1] == '\n' ? "" : "\n");
    char buf[400];
    int width = 0;
    for (const arg_opt *o = c->opts; o->kind != ARG_KIND_END; o++) {
        int n = left_column(o, buf, sizeof buf) + 2;
        if (n > width && n <= HELP_COL_MAX) width = n;
    }
    if (width < 14) width = 14;
    fprintf(out, "\noptions:\n");
    for (const arg_opt *o = c->opts; o->kind != ARG_KIND_END; o++) {
        left_column(o, buf, sizeof buf);
        put_help(out, buf, width, o->help);
    }
    put_help(out, "  -h, --help", width, "this help");
}

void args_usage(const arg_cmd *c, FILE *out) {
    fprintf(out, "usage: %s\n`hearth %s --help` lists the options.\n", c->usage, c->name);
}
