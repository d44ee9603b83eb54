/* args.h: the subcommands' flags, parsed against one table per command (in the manner of
 * redis's config.c: a descriptor per option, one parser, one --help printer).
 *
 * A command declares its options once:
 *
 *     const char *model = NULL;
 *     int64_t n = 32;
 *     float temp = 0;
 *     bool ids_out = false;
 *     int kv = 0;                                   // index into kv_names
 *     static const char *const kv_names[] = {"f32", "f16", NULL};
 *     const arg_opt opts[] = {
 *         ARG_STR("--model", "-m", &model, "FILE", "the GGUF file"),
 *         ARG_I64("--n-predict", "-n", &n, 0, 1 << 24, "N", "tokens to generate (default 32)"),
 *         ARG_F32("--temp", NULL, &temp, 0, 100, "T", "sampling temperature; 0: greedy"),
 *         ARG_ENUM("--kv", NULL, &kv, kv_names, "KV cache type (default f32)"),
 *         ARG_FLAG("--ids-out", NULL, &ids_out, "print the ids as JSON, not the text"),
 *         ARG_END,
 *     };
 *     const arg_cmd cmd = {.name = "run", .usage = "hearth run -m FILE [options]",
 *                          .about = "Generates from a prompt.", .opts = opts};
 *     int rc = args_parse(&cmd, argc, argv, NULL, NULL);
 *     if (rc != ARGS_RUN) return rc;                // 0 after --help, 2 after an error
 *
 * Then checks across options (one of -p or --ids, a required -m) stay in the command.
 *
 * Rules of the parser:
 *  - argv[0] is the command name and is skipped; -h and --help print the help (stdout) and
 *    make args_parse return 0. The table need not list them.
 *  - Names are written out with their dashes ("--model", "-m"); the alias may be NULL, and a
 *    name may itself be short ("-n") when the command has no long spelling.
 *  - An option that takes a value takes the next argument whatever it looks like ("--seed -3"
 *    gives -3 to the range check); a name beginning with "--" also takes "--name=VALUE".
 *  - Repeating an option: the last value wins (an id list frees the earlier one).
 *  - "-" alone is a positional (stdin, by convention); everything after "--" is positional.
 *    With arg_cmd.max_pos 0 a positional is an error; pos receives at most max_pos of them,
 *    pointers into argv.
 *  - A destination is written only when its option is given, so its initial value is the
 *    default (and a sentinel such as -1 tells "not given").
 *  - Errors go to stderr as "hearth CMD: ..." naming the flag as the user spelled it
 *    (unknown option, missing value, out of range, not a choice, a FN's message), followed
 *    by the usage line; args_parse then returns 2.
 *  - The ARG_* macros check the destination's type at compile time (an int64_t for ARG_I64,
 *    an int for ARG_INT, ...); a table with a repeated name aborts at its first parse.
 *
 * The older one-value helpers (arg_i64, arg_f32, arg_id_list) stay for hand-written parsing
 * and for values that arrive from elsewhere; the table parser prints the same messages. */
#ifndef HEARTH_ARGS_H
#define HEARTH_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/util.h"

typedef enum arg_kind {
    ARG_KIND_END = 0, /* ends a table (ARG_END) */
    ARG_KIND_FLAG,    /* no value; bool *dst = true */
    ARG_KIND_INT,     /* int *dst: a whole number in [lo, hi] */
    ARG_KIND_I64,     /* int64_t *dst: a whole number in [lo, hi] */
    ARG_KIND_F32,     /* float *dst: a finite number in [flo, fhi] */
    ARG_KIND_STR,     /* const char **dst: the argument itself (not copied) */
    ARG_KIND_ENUM,    /* int *dst: the index of the value in choices (NULL-terminated) */
    ARG_KIND_IDS,     /* arg_ids *dst: "1,2,3", token ids; dst->v is malloc'd (the caller frees) */
    ARG_KIND_FN,      /* anything else: parse(value, dst, e) < 0 is an error with e's message */
} arg_kind;

typedef struct arg_ids {
    int32_t *v;
    int64_t n;
} arg_ids;

typedef struct arg_opt {
    const char *name;    /* "--model" */
    const char *alias;   /* "-m", or NULL */
    arg_kind kind;
    void *dst;
    const char *metavar; /* the value's name in --help ("FILE"); NULL: N, X, a|b|c, ID,... or VALUE */
    const char *help;    /* its line(s) in --help; '\n' starts another, aligned */
    int64_t lo, hi;      /* ARG_KIND_INT, ARG_KIND_I64 */
    float flo, fhi;      /* ARG_KIND_F32 */
    const char *const *choices;                         /* ARG_KIND_ENUM */
    int (*parse)(const char *value, void *dst, herr *e); /* ARG_KIND_FN: 0 ok, -1 with e set */
} arg_opt;

/* the destination as void *, if it has type T * (else a compile-time pointer-type warning) */
#define ARG_DST_(T, p) ((void *)(1 ? (p) : (T *)0))

#define ARG_FLAG(name, alias, dst, help) \
    {(name), (alias), ARG_KIND_FLAG, ARG_DST_(bool, dst), NULL, (help), 0, 0, 0, 0, NULL, NULL}
#define ARG_INT(name, alias, dst, lo, hi, metavar, help) \
    {(name), (alias), ARG_KIND_INT, ARG_DST_(int, dst), (metavar), (help), (lo), (hi), 0, 0, NULL, NULL}
#define ARG_I64(name, alias, dst, lo, hi, metavar, help) \
    {(name), (alias), ARG_KIND_I64, ARG_DST_(int64_t, dst), (metavar), (help), (lo), (hi), 0, 0, NULL, NULL}
#define ARG_F32(name, alias, dst, lo, hi, metavar, help) \
    {(name), (alias), ARG_KIND_F32, ARG_DST_(float, dst), (metavar), (help), 0, 0, (lo), (hi), NULL, NULL}
#define ARG_STR(name, alias, dst, metavar, help) \
    {(name), (alias), ARG_KIND_STR, ARG_DST_(const char *, dst), (metavar), (help), 0, 0, 0, 0, NULL, NULL}
#define ARG_ENUM(name, alias, dst, choices, help) \
    {(name), (alias), ARG_KIND_ENUM, ARG_DST_(int, dst), NULL, (help), 0, 0, 0, 0, (choices), NULL}
#define ARG_IDS(name, alias, dst, metavar, help) \
    {(name), (alias), ARG_KIND_IDS, ARG_DST_(arg_ids, dst), (metavar), (help), 0, 0, 0, 0, NULL, NULL}
/* dst is passed to parse as it is: parse's own signature documents its type */
#define ARG_FN(name, alias, dst, parse, metavar, help) \
    {(name), (alias), ARG_KIND_FN, (void *)(dst), (metavar), (help), 0, 0, 0, 0, NULL, (parse)}
#define ARG_END {NULL, NULL, ARG_KIND_END, NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL}

typedef struct arg_cmd {
    const char *name;     /* "gen": messages say "hearth gen: ..." */
    const char *usage;    /* the synopsis after "usage: ", lines after the first indented by hand */
    const char *about;    /* paragraph(s) --help prints between the synopsis and the options, or NULL */
    const arg_opt *opts;  /* ends with ARG_END */
    const char *pos_name; /* what a positional is called in messages ("FILE"); NULL: "argument" */
    int max_pos;          /* positionals allowed (0: none) */
} arg_cmd;

#define ARGS_RUN (-1) /* args_parse: go on with the command */

/* Parses argv[1..argc) against c->opts, writing destinations, and positionals into
 * pos[0..*n_pos) (pos and n_pos may be NULL when max_pos is 0). Returns ARGS_RUN, or the
 * exit code the command should return: 0 after --help, 2 after a usage error (printed). */
int args_parse(const arg_cmd *c, int argc, char **argv, const char **pos, int *n_pos);

/* --help: synopsis, about, then every option with its names, value and help, aligned. */
void args_help(const arg_cmd *c, FILE *out);
/* The synopsis and a pointer to --help: what follows a usage error. */
void args_usage(const arg_cmd *c, FILE *out);

/* One value, checked: false with the message printed ("hearth CMD: FLAG expects ..."). */
bool arg_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out, const char *cmd);
bool arg_f32(const char *flag, const char *s, float lo, float hi, float *out, const char *cmd);
/* "1,2,3" -> ids; false with a message on a bad element. *out is malloc'd. */
bool arg_id_list(const char *flag, const char *s, int32_t **out, int64_t *n, const char *cmd);

#endif
