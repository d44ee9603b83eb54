/* perplexity.c: `hearth perplexity`: a model's perplexity on a text file by
 * llama-perplexity's method (engine/ppl.h): windows of -c tokens, the second half of each
 * scored. A progress line on stderr ("[k]ppl," after each window, as llama-perplexity
 * prints it), then the estimate on stdout:
 *     Final estimate: PPL = 12.3456 +/- 0.12345
 * and with --json one object instead (ppl, error, tokens scored, windows, window size). */
#include "cli/cli.h"
#include "cli/args.h"
#include "cli/engine_args.h"
#include "engine/engine.h"
#include "engine/ppl.h"
#include "text/tokenizer.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* the progress line, and each window's mean negative log-likelihood for --json */
typedef struct window_log {
    double *nll;
    double prev_sum;
    int64_t prev_count;
} window_log;

static void progress(void *ctx, int64_t k, int64_t n, const ppl_acc *a) {
    window_log *w = ctx;
    w->nll[k] = (a->nll - w->prev_sum) / (double)(a->count - w->prev_count);
    w->prev_sum = a->nll;
    w->prev_count = a->count;
    fprintf(stderr, "[%" PRId64 "]%.4f,%s", k + 1, ppl_value(a), k + 1 == n ? "\n" : "");
    fflush(stderr);
}

int cmd_perplexity(int argc, char **argv) {
    const char *path = NULL, *text_path = NULL;
    int64_t n_ctx = 512, n_chunks = 0, threads = 0, batch = 2048;
    bool json = false;
    int kv = 0;
    engine_device device = ENGINE_AUTO;
    static const char *const kv_types[] = {"f32", "f16", NULL};
    const arg_opt opts[] = {
        ARG_STR("--model", "-m", &path, "FILE", "the GGUF file"),
        ARG_STR("--file", "-f", &text_path, "TEXT", "the text to score (UTF-8; special tokens are plain text)"),
        ARG_I64("--ctx-size", "-c", &n_ctx, 4, (int64_t)1 << 24, "N", "the window in tokens (default 512)"),
        ARG_I64("--chunks", NULL, &n_chunks, 0, INT64_MAX, "K", "score the first K windows (default 0: all)"),
        ARG_I64("--batch-size", "-b", &batch, 1, (int64_t)1 << 24, "N",
                "rows per engine call (default 2048): max(1, N / c) windows run side by side"),
        ARG_I64("--threads", "-t", &threads, 1, 512, "N", "CPU threads (default: every core)"),
        ARG_ENUM("--kv", NULL, &kv, kv_types, "KV rows stored as f32 (default) or f16"),
        ARG_FN("--device", NULL, &device, cli_parse_device, "cpu|cuda|auto", "the engine (default auto)"),
        ARG_FLAG("--json", NULL, &json, "print the result as one JSON object"),
        ARG_END,
    };
    const arg_cmd cmd = {
        .name = "perplexity",
        .usage = "hearth perplexity -m FILE -f TEXT [-c 512] [--chunks K] [options]",
        .about = "The model's perplexity on TEXT, computed as llama-perplexity computes it: the text is cut\n"
                 "into windows of -c tokens, each run from an empty context, and the second half of each\n"
                 "window is scored. Needs at least two windows of text.",
        .opts = opts,
    };
    int prc = args_parse(&cmd, argc, argv, NULL, NULL);
    if (prc != ARGS_RUN) return prc;
    if (!path || !text_path) {
        fprintf(stderr, "hearth perplexity: need -m FILE and -f TEXT\n");
        args_usage(&cmd, stderr);
        return 2;
    }
    herr e;
    char *text = NULL;
    size_t len = 0;
    if (read_file(text_path, &text, &len, &e) < 0) { fprintf(stderr, "hearth perplexity: -f %s\n", e.msg); return 1; }
    model *m;
    if (model_load(&m, path, &e) < 0) { fprintf(stderr, "hearth perplexity: %s\n", e.msg); free(text); return 1; }
    tokenizer *tok = NULL;
    if (tokenizer_load(&tok, m->file, &e) < 0) {
        fprintf(stderr, "hearth perplexity: %s: %s\n", path, e.msg);
        free(text);
        model_free(m);
        return 1;
    }
    int rc = 1;
    engine *eng = NULL;
    window_log wl = {0};
    /* As llama-perplexity: BOS first where the vocabulary adds one, and each window's first
     * token replaced by it. */
    int64_t n_ids = 0;
    int32_t *ids = tokenizer_encode_prompt(tok, text, len, false, true, &n_ids);
    ppl_opts po = {.n_ctx = n_ctx, .n_chunks = n_chunks, .n_seq = (int)(batch / n_ctx > 1 ? batch / n_ctx : 1),
                   .bos = tokenizer_prompt_bos(tok), .progress = progress};
    if (n_ctx > m->hp.n_ctx_train) {
        fprintf(stderr, "hearth perplexity: -c %" PRId64 ": exceeds the model's context of %" PRId64 " tokens\n", n_ctx,
                m->hp.n_ctx_train);
        goto done;
    }
    const int64_t n_win = ppl_windows(n_ids, &po, &e);
    if (n_win == 0) { fprintf(stderr, "hearth perplexity: -f %s: %s\n", text_path, e.msg); goto done; }
    if (po.n_seq > n_win) po.n_seq = (int)n_win;
    wl.nll = xcalloc((size_t)n_win, sizeof(double));
    po.progress_ctx = &wl;
    engine_opts eo = {.device = device, .n_threads = (int)threads, .n_ctx = n_ctx, .n_seq_max = po.n_seq,
                      .kv_f16 = kv == 1};
    if (engine_open(&eng, m, &eo, &e) < 0) { fprintf(stderr, "hearth perplexity: %s\n", e.msg); goto done; }
    const engine_info info = engine_get_info(eng);
    po.n_threads = info.n_threads; /* -t: the engine's threads score the rows too */
    fprintf(stderr, "engine: %s (%s), %d threads\n", info.backend, info.why, info.n_threads);
    fprintf(stderr, "perplexity: %" PRId64 " tokens; %" PRId64 " windows of %" PRId64 ", the last %" PRId64
                    " tokens of each scored; %d windows per call\n",
            n_ids, n_win, n_ctx, n_ctx - 1 - n_ctx / 2, po.n_seq);
    ppl_acc acc;
    const double t0 = time_now();
    if (ppl_run(eng, ids, n_ids, &po, &acc, &e) < 0) { fprintf(stderr, "hearth perplexity: %s\n", e.msg); goto done; }
    const double dt = time_now() - t0;
    fprintf(stderr, "perplexity: %" PRId64 " rows in %.2f s, %.1f tok/s\n", n_win * n_ctx, dt, (double)(n_win * n_ctx) / dt);
    if (json) {
        char err[32] = "null"; /* no spread (every token scored alike): no error bar */
        if (!isnan(ppl_error(&acc))) snprintf(err, sizeof err, "%.6f", ppl_error(&acc));
        printf("{\"ppl\": %.6f, \"error\": %s, \"tokens_scored\": %" PRId64 ", \"windows\": %" PRId64
               ", \"ctx\": %" PRId64 ", \"mean_nll\": %.9f, \"window_nll\": [",
               ppl_value(&acc), err, acc.count, n_win, n_ctx, acc.nll / (double)acc.count);
        for (int64_t k = 0; k < n_win; k++) printf("%s%.9f", k ? ", " : "", wl.nll[k]);
        printf("]}\n");
    }
    else
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl_value(&acc), ppl_error(&acc));
    rc = 0;
done:
    if (eng) engine_free(eng);
    free(wl.nll);
    free(ids);
    free(text);
    tokenizer_free(tok);
    model_free(m);
    return rc;
}
