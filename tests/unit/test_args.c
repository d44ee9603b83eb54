/* test_args.c: the subcommands' option tables (src/cli/args.h): every kind stores what it
 * should, only when given; errors name the flag as spelled and return 2; --help and
 * positionals. And `hearth serve`'s flags as llama-server's users type them (serve_args):
 * each accepted with llama-server's meaning or refused naming the hearth equivalent.
 * args.c and serve.c belong to the binary, not libhearth, so they are compiled in here. */
#include <stdarg.h>
#include <unistd.h>

#include "unit/harness.h"
#include "cli/args.c"
#include "cli/engine_args.c"
#include "cli/serve.c"

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

/* serve_args on "serve -m m.gguf ARGS..." (NULL-terminated), stderr caught into msg */
static int serve_parse(serve_opts *o, ...) {
    char *argv[40];
    int argc = 0;
    argv[argc++] = "serve";
    argv[argc++] = "-m";
    argv[argc++] = "m.gguf";
    va_list ap;
    va_start(ap, o);
    for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 39;) argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    char *ebuf = NULL, *obuf = NULL;
    size_t elen = 0, olen = 0;
    FILE *saved_err = stderr, *saved_out = stdout;
    stderr = open_memstream(&ebuf, &elen);
    stdout = open_memstream(&obuf, &olen);
    memset(o, 0, sizeof *o);
    const int rc = serve_args(argc, argv, o);
    fclose(stderr);
    fclose(stdout);
    stderr = saved_err;
    stdout = saved_out;
    snprintf(msg, sizeof msg, "%s", ebuf ? ebuf : "");
    free(ebuf);
    free(obuf);
    return rc;
}

/* a fixture file's text (NULL if it cannot be read) */
static char *fixture(const char *name) {
    char path[300];
    snprintf(path, sizeof path, "tests/fixtures/templates/%s", name);
    size_t n;
    return test_read(path, &n);
}

TEST(serve_llama_flags) {
    serve_opts o;
    /* -ngl: 0 the CPU engine, more (or all) CUDA, -1/auto as --device auto */
    struct { const char *v; engine_device want; } ngl[] = {
        {"0", ENGINE_CPU}, {"99", ENGINE_CUDA}, {"1", ENGINE_CUDA}, {"all", ENGINE_CUDA}, {"-1", ENGINE_AUTO}, {"auto", ENGINE_AUTO}};
    for (size_t i = 0; i < sizeof ngl / sizeof ngl[0]; i++) {
        int rc = serve_parse(&o, "-ngl", ngl[i].v, NULL);
        CHECK_MSG(rc == ARGS_RUN && o.device == ngl[i].want, "-ngl %s: rc %d device %d: %s", ngl[i].v, rc, (int)o.device, msg);
        rc = serve_parse(&o, "--n-gpu-layers", ngl[i].v, NULL);
        CHECK_MSG(rc == ARGS_RUN && o.device == ngl[i].want, "--n-gpu-layers %s", ngl[i].v);
    }
    CHECK(serve_parse(&o, NULL) == ARGS_RUN && o.device == ENGINE_AUTO);
    CHECK(serve_parse(&o, "-ngl", "0", "--device", "cpu", NULL) == ARGS_RUN && o.device == ENGINE_CPU);
    CHECK(serve_parse(&o, "--device", "cuda", NULL) == ARGS_RUN && o.device == ENGINE_CUDA);
    CHECK_MSG(serve_parse(&o, "-ngl", "0", "--device", "cuda", NULL) == 2 && strstr(msg, "-ngl") && strstr(msg, "--device"), "%s", msg);
    CHECK_MSG(serve_parse(&o, "-ngl", "x", NULL) == 2 && strstr(msg, "hearth serve: -ngl:"), "%s", msg);
    /* -fa on|off|auto, -b, -ub, --no-webui, --jinja: accepted */
    const char *fa[] = {"on", "off", "auto"};
    for (int i = 0; i < 3; i++) CHECK_MSG(serve_parse(&o, "-fa", fa[i], NULL) == ARGS_RUN, "-fa %s: %s", fa[i], msg);
    CHECK(serve_parse(&o, "--flash-attn", "on", "-b", "4096", "-ub", "1024", "--batch-size", "512", "--ubatch-size", "256",
                      "--no-webui", "--jinja", NULL) == ARGS_RUN);
    CHECK_MSG(serve_parse(&o, "-fa", "maybe", NULL) == 2 && strstr(msg, "-fa expects one of on, off, auto"), "%s", msg);
    CHECK_MSG(serve_parse(&o, "-b", "0", NULL) == 2 && strstr(msg, "-b expects"), "%s", msg);
    /* --slot-save-path: /slots' folder, else --cache-dir's */
    CHECK(serve_parse(&o, "--slot-save-path", "/s", "--cache-dir", "/c", NULL) == ARGS_RUN && !strcmp(o.slot_dir, "/s") &&
          !strcmp(o.cache_dir, "/c"));
    CHECK(serve_parse(&o, "--cache-dir", "/c", NULL) == ARGS_RUN && !strcmp(o.slot_dir, "/c"));
    CHECK(serve_parse(&o, "--slot-save-path", "/s", NULL) == ARGS_RUN && !strcmp(o.slot_dir, "/s") && !o.cache_dir);
    /* -cram / --cache-ram: 0 off, -1 no limit */
    CHECK(serve_parse(&o, "-cram", "0", NULL) == ARGS_RUN && o.cache_ram_mib == 0);
    CHECK(serve_parse(&o, "-cram", "-1", NULL) == ARGS_RUN && o.cache_ram_mib == -1);
    CHECK(serve_parse(&o, "--cache-ram", "512", NULL) == ARGS_RUN && o.cache_ram_mib == 512);
    CHECK(serve_parse(&o, NULL) == ARGS_RUN && o.cache_ram_mib == 8192);
    CHECK_MSG(serve_parse(&o, "-cram", "-2", NULL) == 2 && strstr(msg, "-cram expects"), "%s", msg);
    /* sampling defaults of requests that set none */
    CHECK(serve_parse(&o, NULL) == ARGS_RUN && o.temp == 0.8f && o.top_k == 40 && o.top_p == 0.95f && o.min_p == 0.05f &&
          o.seed == -1);
    CHECK(serve_parse(&o, "--temp", "0", "--top-k", "5", "--top-p", "0.5", "--min-p", "0.1", "--seed", "7", NULL) == ARGS_RUN &&
          o.temp == 0 && o.top_k == 5 && o.top_p == 0.5f && o.min_p == 0.1f && o.seed == 7);
    CHECK(serve_parse(&o, "-s", "9", NULL) == ARGS_RUN && o.seed == 9);
    CHECK_MSG(serve_parse(&o, "--top-p", "2", NULL) == 2 && strstr(msg, "--top-p expects"), "%s", msg);
    CHECK_MSG(serve_parse(&o, "--temp", "-1", NULL) == 2 && strstr(msg, "--temp expects"), "%s", msg);
    /* --chat-template NAME: the built-ins are the fixtures' texts */
    struct { const char *name, *file; } tm[] = {{"chatml", "chatml.jinja"}, {"qwen3", "Qwen-Qwen3-0.6B.jinja"},
                                                 {"qwen3.5", "Qwen3.5-4B.jinja"}};
    for (int i = 0; i < 3; i++) {
        char *want = fixture(tm[i].file);
        CHECK_MSG(serve_parse(&o, "--chat-template", tm[i].name, NULL) == ARGS_RUN && want && o.template_text &&
                      !strcmp(o.template_text, want), "--chat-template %s is not %s", tm[i].name, tm[i].file);
        free(want);
    }
    CHECK(serve_parse(&o, "--chat-template", "{{ messages[0]['content'] }}", NULL) == ARGS_RUN &&
          !strcmp(o.template_text, "{{ messages[0]['content'] }}"));
    CHECK_MSG(serve_parse(&o, "--chat-template", "llama9", NULL) == 2 && strstr(msg, "--chat-template: 'llama9'") &&
                  strstr(msg, "chatml, qwen3, qwen3.5") && strstr(msg, "--chat-template-file"), "%s", msg);
    CHECK_MSG(serve_parse(&o, "--chat-template", "chatml", "--chat-template-file", "x.jinja", NULL) == 2, "%s", msg);
    /* --api-key-file: its one key */
    char kf[] = "/tmp/hearth-keyfile-XXXXXX";
    const int fd = mkstemp(kf);
    CHECK(fd >= 0 && write(fd, "sekrit\n", 7) == 7);
    close(fd);
    CHECK_MSG(serve_parse(&o, "--api-key-file", kf, NULL) == ARGS_RUN && o.api_key && !strcmp(o.api_key, "sekrit"), "%s", msg);
    CHECK_MSG(serve_parse(&o, "--api-key-file", kf, "--api-key", "x", NULL) == 2 && strstr(msg, "--api-key-file"), "%s", msg);
    FILE *kfp = fopen(kf, "w");
    fputs("one\ntwo\n", kfp);
    fclose(kfp);
    CHECK_MSG(serve_parse(&o, "--api-key-file", kf, NULL) == 2 && strstr(msg, "more than one key"), "%s", msg);
    unlink(kf);
    CHECK_MSG(serve_parse(&o, "--api-key-file", kf, NULL) == 2 && strstr(msg, "--api-key-file"), "%s", msg);
    /* --reasoning-budget: -1 unrestricted, 0 thinking off (a template variable under the
     * server's and the request's own) */
    CHECK(serve_parse(&o, "--reasoning-budget", "-1", NULL) == ARGS_RUN && !o.template_kwargs);
    CHECK_MSG(serve_parse(&o, "--reasoning-budget", "0", NULL) == ARGS_RUN && o.template_kwargs &&
                  !strcmp(o.template_kwargs, "{\"enable_thinking\":false}"), "%s", o.template_kwargs ? o.template_kwargs : "(none)");
    CHECK(serve_parse(&o, "--reasoning-budget", "0", "--chat-template-kwargs", "{\"enable_thinking\": true, \"x\": 1}", NULL) ==
              ARGS_RUN && strstr(o.template_kwargs, "\"enable_thinking\":true") && strstr(o.template_kwargs, "\"x\":1"));
    CHECK_MSG(serve_parse(&o, "--reasoning-budget", "100", NULL) == 2 && strstr(msg, "--reasoning-budget expects"), "%s", msg);
    /* -c 0: the model's context (resolved at load) */
    CHECK(serve_parse(&o, "-c", "0", NULL) == ARGS_RUN && o.n_ctx == 0);
    CHECK(serve_parse(&o, NULL) == ARGS_RUN && o.n_ctx == 4096);
    /* --help lists them, from the one table */
    char *hb = NULL;
    size_t hl = 0;
    FILE *saved = stdout;
    stdout = open_memstream(&hb, &hl);
    char *hargv[] = {"serve", "--help", NULL};
    const int hrc = serve_args(2, hargv, &o);
    fclose(stdout);
    stdout = saved;
    CHECK(hrc == 0 && hb && strstr(hb, "-ngl, --n-gpu-layers N") && strstr(hb, "-cram, --cache-ram MiB") &&
          strstr(hb, "--slot-save-path DIR") && strstr(hb, "--reasoning-budget N") && strstr(hb, "-fa, --flash-attn on|off|auto"));
    free(hb);
}

int main(void) {
    RUN(every_kind_stores);
    RUN(defaults_stay_when_not_given);
    RUN(errors_name_the_flag);
    RUN(positionals);
    RUN(help_from_the_table);
    RUN(serve_llama_flags);
    free(made_key);
    free(made_kwargs);
    return harness_done();
}
