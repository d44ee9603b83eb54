/* bench.c: `hearth bench`: prompt and decode throughput like llama-bench (pp N: one
 * prompt pass of N tokens; tg N: N decode steps; both into an empty sequence, or after a
 * prefill of -d rows that is not timed, as llama-bench's -d), medians of repetitions after
 * one warm-up, with the weight bytes a decoded
 * token reads and the bandwidth that implies (STYLE 8). A benchmark, never a test. */
#include "cli/cli.h"
#include "cli/args.h"
#include "engine/engine.h"
#include "cli/engine_args.h"
#include "format/quant.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* weight bytes one decoded token reads: every matrix, the routed experts at K/X, one embedding row */
static double active_bytes(const model *m) {
    const model_hparams *hp = &m->hp;
    double total = (double)m->token_embd.row_bytes;
    const gguf_file *f = m->file;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (!strcmp(t->name, "token_embd.weight")) continue;
        double b = (double)t->nbytes;
        if (strstr(t->name, "_exps.")) b *= (double)hp->n_expert_used / (double)hp->n_expert;
        total += b;
    }
    return total;
}

/* the untimed prefill of -d rows (sequence 0 is empty) */
static int prefill_depth(engine *eng, const int32_t *dids, int64_t depth, herr *e) {
    if (depth == 0) return 0;
    engine_span sp = {.seq = 0, .ids = dids, .n = depth, .want = ENGINE_LOGITS_NONE};
    return engine_run(eng, &sp, 1, e);
}

int cmd_bench(int argc, char **argv) {
    const char *path = NULL, *marks_arg = NULL;
    int64_t n_prompt = 512, n_gen = 128, threads = 0, reps = 5, n_marks = 0, depth = 0;
    int kv = 0;
    engine_device device = ENGINE_AUTO;
    static const char *const kv_types[] = {"f32", "f16", NULL};
    const arg_opt opts[] = {
        ARG_STR("--model", "-m", &path, "FILE", "the GGUF file"),
        ARG_I64("--n-prompt", "-p", &n_prompt, 0, 1 << 20, "N", "prompt tokens of the pp row (default 512; 0: none)"),
        ARG_I64("--n-gen", "-n", &n_gen, 0, 1 << 20, "N", "decode steps of the tg row (default 128; 0: none)"),
        ARG_I64("--n-depth", "-d", &depth, 0, 1 << 20, "N", "rows prefilled (not timed) before each pp and tg row (default 0)"),
        ARG_I64("--threads", "-t", &threads, 1, 512, "N", "CPU threads (default: every core)"),
        ARG_I64("--repetitions", "-r", &reps, 1, 1000, "N", "measured reps after one warm-up (default 5)"),
        ARG_ENUM("--kv", NULL, &kv, kv_types, "KV rows stored as f32 (default) or f16"),
        ARG_STR("--marks", NULL, &marks_arg, "m1,m2,...",
                "also run the prompt pass with these marks (alternating reps) and print the\n"
                "time the points added"),
        ARG_FN("--device", NULL, &device, cli_parse_device, "cpu|cuda|auto", "the engine (default auto)"),
        ARG_END,
    };
    const arg_cmd cmd = {
        .name = "bench",
        .usage = "hearth bench -m FILE [-p 512] [-n 128] [-d depth] [-t threads] [-r reps] [--kv f16] [--marks m1,...]",
        .about = "Prints pp (prompt) and tg (decode) tok/s like llama-bench, medians of reps after one warm-up.",
        .opts = opts,
    };
    int prc = args_parse(&cmd, argc, argv, NULL, NULL);
    if (prc != ARGS_RUN) return prc;
    const bool kv_f16 = kv == 1;
    if (!path) {
        fprintf(stderr, "hearth bench: -m FILE is required\n");
        args_usage(&cmd, stderr);
        return 2;
    }
    int64_t *marks = NULL;
    if (marks_arg && !cli_marks(marks_arg, n_prompt, &marks, &n_marks, "bench")) return 2;
    herr e;
    model *m;
    if (model_load(&m, path, &e) < 0) { fprintf(stderr, "hearth bench: %s\n", e.msg); return 1; }
    engine_opts eo = {.device = device, .n_threads = (int)threads, .n_ctx = depth + n_prompt + n_gen + 1, .kv_f16 = kv_f16};
    if (eo.n_ctx > m->hp.n_ctx_train) {
        fprintf(stderr, "hearth bench: -d %" PRId64 " -p %" PRId64 " -n %" PRId64 " need %" PRId64 " rows; the model takes %" PRId64 "\n",
                depth, n_prompt, n_gen, eo.n_ctx, m->hp.n_ctx_train);
        model_free(m);
        return 2;
    }
    engine *eng;
    if (engine_open(&eng, m, &eo, &e) < 0) { fprintf(stderr, "hearth bench: %s\n", e.msg); model_free(m); return 1; }
    const engine_info info = engine_get_info(eng);
    const int64_t V = m->hp.n_vocab;
    float *logits = xmalloc(sizeof(float) * (size_t)V);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(n_prompt + 1)), *dids = xmalloc(sizeof(int32_t) * (size_t)(depth + 1));
    for (int64_t i = 0; i < n_prompt + 1; i++) ids[i] = (int32_t)(rng_at(42, (uint64_t)i) % (uint64_t)V);
    for (int64_t i = 0; i < depth; i++) dids[i] = (int32_t)(rng_at(43, (uint64_t)i) % (uint64_t)V);
    double *t_pp = xcalloc((size_t)reps + 1, sizeof(double)), *t_tg = xcalloc((size_t)reps + 1, sizeof(double));
    double *t_pm = xcalloc((size_t)reps + 1, sizeof(double));
    engine_point **pts = xcalloc((size_t)n_marks + 1, sizeof(engine_point *));
    for (int64_t i = 0; i < n_marks; i++)
        if (engine_point_new(eng, &pts[i], &e) < 0) { fprintf(stderr, "hearth bench: --marks: %s\n", e.msg); return 1; }
    for (int64_t r = 0; r <= reps; r++) { /* rep 0 is the warm-up */
        for (int marked = 0; marked < 2; marked++) {
            if (n_prompt == 0 || (marked && n_marks == 0)) continue;
            engine_seq_clear(eng, 0);
            if (prefill_depth(eng, dids, depth, &e) < 0) { fprintf(stderr, "hearth bench: -d: %s\n", e.msg); return 1; }
            engine_span sp = {.seq = 0, .ids = ids, .n = n_prompt, .want = ENGINE_LOGITS_LAST, .logits = logits};
            if (marked) {
                sp.marks = marks;
                sp.n_marks = (int)n_marks;
                sp.points = pts;
            }
            double t0 = time_now();
            if (engine_run(eng, &sp, 1, &e) < 0) {
                fprintf(stderr, "hearth bench: %s\n", e.msg);
                return 1;
            }
            (marked ? t_pm : t_pp)[r] = time_now() - t0;
        }
        if (n_gen > 0) {
            engine_seq_clear(eng, 0);
            if (prefill_depth(eng, dids, depth, &e) < 0) { fprintf(stderr, "hearth bench: -d: %s\n", e.msg); return 1; }
            double t0 = time_now();
            for (int64_t k = 0; k < n_gen; k++) {
                engine_span st = {.seq = 0, .ids = &ids[k % (n_prompt + 1)], .n = 1, .want = ENGINE_LOGITS_LAST,
                                  .logits = logits};
                if (engine_run(eng, &st, 1, &e) < 0) {
                    fprintf(stderr, "hearth bench: %s\n", e.msg);
                    return 1;
                }
            }
            t_tg[r] = time_now() - t0;
        }
    }
    qsort(t_pp + 1, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_tg + 1, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_pm + 1, (size_t)reps, sizeof(double), cmp_double);
    double med_pp = t_pp[1 + reps / 2], med_tg = t_tg[1 + reps / 2];
    double bytes = active_bytes(m);
    printf("| model | size | backend | threads | test | t/s | reps | note |\n| --- | ---: | --- | ---: | --- | ---: | ---: | --- |\n");
    double gib = (double)gguf_file_size(m->file) / (1024.0 * 1024 * 1024);
    char at[40] = "";
    if (depth) snprintf(at, sizeof at, " @ d%" PRId64, depth);
    if (n_prompt > 0)
        printf("| %s | %.2f GiB | %s | %d | pp%" PRId64 "%s | %.2f | %" PRId64 " | min %.2f max %.2f |\n", path, gib, info.backend,
               info.n_threads, n_prompt, at, (double)n_prompt / med_pp, reps, (double)n_prompt / t_pp[reps],
               (double)n_prompt / t_pp[1]);
    if (n_prompt > 0 && n_marks > 0) {
        double med_pm = t_pm[1 + reps / 2];
        printf("| %s | %.2f GiB | %s | %d | pp%" PRId64 " + %" PRId64 " marks | %.2f | %" PRId64
               " | points add %+.1f%% to the pass (%.1f ms), %zu bytes each |\n",
               path, gib, info.backend, info.n_threads, n_prompt, n_marks, (double)n_prompt / med_pm, reps,
               100.0 * (med_pm - med_pp) / med_pp, 1e3 * (med_pm - med_pp), engine_point_size(pts[0]));
    }
    if (n_gen > 0)
        printf("| %s | %.2f GiB | %s | %d | tg%" PRId64 "%s | %.2f | %" PRId64 " | %.1f MB/token read, %.2f GB/s; min %.2f max %.2f |\n",
               path, gib, info.backend, info.n_threads, n_gen, at, (double)n_gen / med_tg, reps, bytes / 1e6,
               bytes * (double)n_gen / med_tg / 1e9, (double)n_gen / t_tg[reps], (double)n_gen / t_tg[1]);
    for (int64_t i = 0; i < n_marks; i++) engine_point_free(eng, pts[i]);
    free(pts);
    free(marks);
    free(t_pm);
    free(t_pp);
    free(t_tg);
    free(ids);
    free(dids);
    free(logits);
    engine_free(eng);
    model_free(m);
    return 0;
}
