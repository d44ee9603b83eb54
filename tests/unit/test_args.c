/* test_args.c: the subcommands' option tables (src/cli/args.h): every kind stores what it
 * should, only when given; errors name the flag as spelled and return 2; --help and
 * positionals. args.c belongs to the binary, not libhearth, so it is compiled in here. */
#include <stdarg.h>

#include "unit/harness.h"
#include "cli/args.c"

static char msg[2048], out[4096];

/* args_parse on a NULL-terminated argument list, its stderr caught into msg, stdout into out */
static int parse(const arg_cmd *c, const char **pos, int *n_pos, ...) {
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)c->name;
    va_list ap;
    va_start(ap, n_pos);
    for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 31;) argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    char *ebuf = NULL, *obuf = NULL;
    size_t elen = 0, olen = 0;
    FILE *saved_err = stderr, *saved_out = stdout;
    stderr = open_memstream(&ebuf, &elen);
    stdout = open_memstream(&obuf, &olen);
    int rc = args_parse(c, argc, argv, pos, n_pos);
    fclose(stderr);
    fclose(stdout);
    stderr = saved_err;
    stdout = saved_out;
    snprintf(msg, sizeof msg, "%s", ebuf ? ebuf : "");
    snprintf(out, sizeof out, "%s", obuf ? obuf : "");
    free(ebuf);
    free(obuf);
    return rc;
}

typedef struct vals {
    bool flag;
    int threads, kv;
    int64_t n;
    float temp;
    const char *model;
    arg_ids ids;
    int quant;
} vals;

static const char *const kv_names[] = {"f32", "f16", NULL};

static int parse_quant(const char *v, void *dst, herr *e) {
    if (strcmp(v, "q8_0")) return herr_set(e, "unknown quantization '%s'", v);
    *(int *)dst = 8;
    return 0;
}

#define TABLE(o)                                                                                  \
    const arg_opt opts[] = {                                                                      \
        ARG_FLAG("--json", NULL, &(o)->flag, "a flag"),                                            \
        ARG_INT("--threads", "-t", &(o)->threads, 1, 512, "N", "threads"),                         \
        ARG_I64("-n", NULL, &(o)->n, 0, 1 << 24, "N", "count"),                                    \
        ARG_F32("--temp", NULL, &(o)->temp, 0, 2, "T", "temperature"),                             \
        ARG_STR("--model", "-m", &(o)->model, "FILE", "model\nsecond line"),                       \
        ARG_ENUM("--kv", NULL, &(o)->kv, kv_names, "kv type"),                                     \
        ARG_IDS("--ids", NULL, &(o)->ids, NULL, "ids"),                                            \
        ARG_FN("--quant", NULL, &(o)->quant, parse_quant, "q8_0", "quant"),                        \
        ARG_END,                                                                                  \
    };                                                                                            \
    const arg_cmd cmd = {.name = "demo", .usage = "hearth demo [options] [FILE]", .about = "About.", \
                         .opts = opts, .pos_name = "FILE", .max_pos = 1}

TEST(every_kind_stores) {
    vals v = {.threads = -1, .n = 32, .kv = -1};
    TABLE(&v);
    const char *pos = NULL;
    int np = -1;
    int rc = parse(&cmd, &pos, &np, "--json", "-t", "4", "-n", "7", "--temp=0.5", "-m", "a.gguf", "--kv", "f16",
                   "--ids", "1,2,3", "--quant", "q8_0", "file", NULL);
    CHECK_MSG(rc == ARGS_RUN, "rc %d: %s", rc, msg);
    CHECK(v.flag && v.threads == 4 && v.n == 7 && v.temp == 0.5f && !strcmp(v.model, "a.gguf") && v.kv == 1);
    CHECK(v.ids.n == 3 && v.ids.v && v.ids.v[2] == 3 && v.quant == 8);
    CHECK(np == 1 && pos && !strcmp(pos, "file"));
    /* the last of a repeated option wins; the first id list is freed (ASan would tell) */
    rc = parse(&cmd, &pos, &np, "--ids", "5", "--threads", "2", "--threads", "3", NULL);
    CHECK(rc == ARGS_RUN && v.ids.n == 1 && v.ids.v[0] == 5 && v.threads == 3);
    free(v.ids.v);
}

TEST(defaults_stay_when_not_given) {
    vals v = {.threads = -1, .n = 32, .kv = -1, .temp = 0.25f};
    TABLE(&v);
    const char *pos = NULL;
    int np = -1;
    CHECK(parse(&cmd, &pos, &np, NULL) == ARGS_RUN);
    CHECK(!v.flag && v.threads == -1 && v.n == 32 && v.kv == -1 && v.temp == 0.25f && !v.model && !v.ids.v);
    CHECK(np == 0 && !pos);
}

TEST(errors_name_the_flag) {
    vals v = {0};
    TABLE(&v);
    const char *pos = NULL;
    struct {
        const char *a, *b, *want;
    } cases[] = {
        {"--frobnicate", NULL, "hearth demo: unknown option '--frobnicate'"},
        {"-t", "0", "hearth demo: -t expects a whole number in [1, 512], got '0'"},
        {"--threads", "x", "hearth demo: --threads expects a whole number in [1, 512], got 'x'"},
        {"-n", "-1", "hearth demo: -n expects a whole number"},
        {"--temp", "3", "hearth demo: --temp expects a number in [0, 2], got '3'"},
        {"--temp", "nan", "--temp expects a number"},
        {"--kv", "q4", "hearth demo: --kv expects one of f32, f16, got 'q4'"},
        {"--ids", "1,x", "hearth demo: --ids: element 1 of '1,x' is not a token id"},
        {"--quant", "f32", "hearth demo: --quant: unknown quantization 'f32'"},
        {"--json=1", NULL, "hearth demo: --json takes no value"},
        {"--unknown=3", NULL, "unknown option '--unknown'"},
        {"--model", NULL, "hearth demo: --model needs a value"},
        {"a", "b", "hearth demo: one FILE only (got 'a' and 'b'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = parse(&cmd, &pos, NULL, cases[i].a, cases[i].b, NULL);
        CHECK_MSG(rc == 2, "%s %s: rc %d", cases[i].a, cases[i].b ? cases[i].b : "", rc);
        CHECK_MSG(strstr(msg, cases[i].want), "%s: got \"%s\", want \"%s\"", cases[i].a, msg, cases[i].want);
    }
    /* usage errors end with the synopsis; a bad value does not repeat it */
    parse(&cmd, &pos, NULL, "--frobnicate", NULL);
    CHECK(strstr(msg, "usage: hearth demo [options] [FILE]") && strstr(msg, "hearth demo --help"));
    parse(&cmd, &pos, NULL, "-t", "0", NULL);
    CHECK(!strstr(msg, "usage:"));
}

TEST(positionals) {
    vals v = {0};
    TABLE(&v);
    const char *pos = NULL;
    int np;
    CHECK(parse(&cmd, &pos, &np, "-", NULL) == ARGS_RUN && np == 1 && !strcmp(pos, "-"));
    pos = NULL;
    CHECK(parse(&cmd, &pos, &np, "--", "--json", NULL) == ARGS_RUN && np == 1 && !strcmp(pos, "--json") && !v.flag);
    /* a value is taken whatever it looks like */
    CHECK(parse(&cmd, &pos, &np, "-m", "--json", NULL) == ARGS_RUN && !strcmp(v.model, "--json") && !v.flag);
    const arg_cmd none = {.name = "none", .usage = "hearth none", .opts = (const arg_opt[]){ARG_END}};
    CHECK(parse(&none, NULL, NULL, "x", NULL) == 2 && strstr(msg, "hearth none: unexpected argument 'x'"));
}

TEST(help_from_the_table) {
    vals v = {0};
    TABLE(&v);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    args_help(&cmd, f);
    fclose(f);
    CHECK_MSG(strstr(buf, "usage: hearth demo [options] [FILE]\n\nAbout.\n\noptions:\n"), "%s", buf);
    CHECK_MSG(strstr(buf, "\n  -t, --threads N"), "%s", buf);
    CHECK_MSG(strstr(buf, "\n  -m, --model FILE"), "%s", buf);
    CHECK_MSG(strstr(buf, "\n  --kv f32|f16 "), "%s", buf);
    CHECK_MSG(strstr(buf, "\n  --ids ID,... "), "%s", buf);
    CHECK_MSG(strstr(buf, "\n  -h, --help "), "%s", buf);
    /* continuation lines start at the help column */
    const char *a = strstr(buf, "  -m, --model FILE"), *b = strstr(buf, "model\n");
    const char *c = b ? strstr(b, "second line") : NULL;
    CHECK(a && b && c && (b - a) == (c - (b + 6)));
    /* --help and -h: the same text on stdout, exit 0 */
    CHECK(parse(&cmd, NULL, NULL, "--json", "--help", "--frobnicate", NULL) == 0 && !strcmp(out, buf) && !msg[0]);
    CHECK(parse(&cmd, NULL, NULL, "-h", NULL) == 0 && !strcmp(out, buf));
    free(buf);
}

int main(void) {
    RUN(every_kind_stores);
    RUN(defaults_stay_when_not_given);
    RUN(errors_name_the_flag);
    RUN(positionals);
    RUN(help_from_the_table);
    return harness_done();
}
