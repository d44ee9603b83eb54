/* run.c: `hearth run`: load a model on the CPU engine, run a prompt in one pass (with
 * optional marks, reporting the points taken), then decode N tokens greedily or with a
 * seeded sampler. Generated text goes to stdout (ids as JSON with --ids-out), timings to
 * stderr. */
#include "cli/cli.h"
#include "cli/args.h"
#include "engine/engine.h"
#include "cli/engine_args.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "text/tokenizer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

int cmd_run(int argc, char **argv) {
    const char *path = NULL, *prompt = NULL, *ids_arg = NULL, *marks_arg = NULL, *replay_arg = NULL;
    int64_t n_gen = 32, threads = 0, n_ctx = 0, seed = 0, top_k = 0, spec_k = 0;
    float temp = 0, top_p = 1, min_p = 0;
    bool ids_out = false, ignore_eos = false, no_parse_special = false;
    int kv = 0; /* index in kv_types */
    engine_device device = ENGINE_AUTO;
    static const char *const kv_types[] = {"f32", "f16", NULL};
    const arg_opt opts[] = {
        ARG_STR("--model", "-m", &path, "FILE", "the GGUF file"),
        ARG_STR("--prompt", "-p", &prompt, "TEXT", "the prompt as text (special tokens parsed)"),
        ARG_STR("--ids", NULL, &ids_arg, "1,2,3", "the prompt as token ids"),
        ARG_I64("--n-predict", "-n", &n_gen, 0, 1 << 24, "N", "tokens to generate (default 32)"),
        ARG_I64("--threads", "-t", &threads, 1, 512, "N", "CPU threads (default: every core)"),
        ARG_I64("--ctx-size", "-c", &n_ctx, 1, (int64_t)1 << 24, "N", "context (default: prompt + -n)"),
        ARG_F32("--temp", NULL, &temp, 0, 100, "T", "temperature (default 0: greedy)"),
        ARG_I64("--top-k", NULL, &top_k, 0, 1 << 30, "K", "top-k (0: off)"),
        ARG_F32("--top-p", NULL, &top_p, 0, 1, "P", "top-p (1: off)"),
        ARG_F32("--min-p", NULL, &min_p, 0, 1, "P", "min-p (0: off)"),
        ARG_I64("--seed", NULL, &seed, 0, INT64_MAX, "S", "sampler seed (default 0)"),
        ARG_STR("--marks", NULL, &marks_arg, "m1,m2,...",
                "prompt positions (1..prompt length, ascending): each takes a recurrent-state\n"
                "point inside the prompt pass, reported with its size"),
        ARG_ENUM("--kv", NULL, &kv, kv_types, "KV rows stored as f32 (default) or f16"),
        ARG_FN("--device", NULL, &device, cli_parse_device, "cpu|cuda|auto", "the engine (default auto)"),
        ARG_I64("--spec-mtp", NULL, &spec_k, 0, SPEC_MAX, "K",
                "speculative decoding: the model's MTP block drafts K tokens a step, one\n"
                "pass verifies them (0: off, the default); the same tokens as without"),
        ARG_STR("--spec-replay", NULL, &replay_arg, "1,2,3",
                "with --spec-mtp: drafts taken from these ids (the expected output, from\n"
                "its first token) instead of the block's: forced acceptance, for benchmarks"),
        ARG_FLAG("--ids-out", NULL, &ids_out, "print the generated ids as a JSON list instead of text"),
        ARG_FLAG("--ignore-eos", NULL, &ignore_eos, "never sample an end-of-generation token (llama.cpp's meaning)"),
        ARG_FLAG("--no-parse-special", NULL, &no_parse_special, "special tokens in -p are plain text"),
        ARG_END,
    };
    const arg_cmd cmd = {
        .name = "run",
        .usage = "hearth run -m FILE (-p TEXT | --ids 1,2,3) [-n 32] [-t threads] [-c ctx] [options]",
        .about = "Runs the prompt in one pass, then decodes -n tokens (greedy unless --temp > 0).\n"
                 "Exits 1 when the context (-c) fills before -n tokens are generated.",
        .opts = opts,
    };
    int prc = args_parse(&cmd, argc, argv, NULL, NULL);
    if (prc != ARGS_RUN) return prc;
    const bool kv_f16 = kv == 1, parse_special = !no_parse_special;
    if (!path || (!prompt == !ids_arg)) {
        fprintf(stderr, "hearth run: need -m FILE and exactly one of -p TEXT or --ids LIST\n");
        args_usage(&cmd, stderr);
        return 2;
    }
    herr e;
    model *m;
    if (model_load(&m, path, &e) < 0) { fprintf(stderr, "hearth run: %s\n", e.msg); return 1; }
    tokenizer *tok = NULL;
    if (tokenizer_load(&tok, m->file, &e) < 0) {
        if (prompt) { fprintf(stderr, "hearth run: %s: %s\n", path, e.msg); model_free(m); return 1; }
        tok = NULL; /* ids in, ids out still work without a vocabulary */
    }
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    if (ids_arg) {
        if (!arg_id_list("--ids", ids_arg, &ids, &n_ids, "run")) { model_free(m); return 2; }
    } else {
        ids = tokenizer_encode_prompt(tok, prompt, strlen(prompt), parse_special, true, &n_ids);
        if (n_ids <= 0) { fprintf(stderr, "hearth run: the prompt tokenizes to no tokens\n"); model_free(m); return 1; }
    }
    int64_t *marks = NULL, n_marks = 0;
    if (marks_arg && !cli_marks(marks_arg, n_ids, &marks, &n_marks, "run")) return 2;
    int32_t *replay = NULL;
    int64_t n_replay = 0;
    if (replay_arg && !spec_k) {
        fprintf(stderr, "hearth run: --spec-replay needs --spec-mtp K\n");
        return 2;
    }
    if (replay_arg && !arg_id_list("--spec-replay", replay_arg, &replay, &n_replay, "run")) return 2;
    engine_opts eo = {.device = device, .n_threads = (int)threads, .n_ctx = n_ctx, .kv_f16 = kv_f16, .mtp = spec_k > 0};
    if (eo.n_ctx == 0) {
        eo.n_ctx = n_ids + n_gen;
        if (eo.n_ctx > m->hp.n_ctx_train) eo.n_ctx = m->hp.n_ctx_train;
    }
    engine *eng;
    if (engine_open(&eng, m, &eo, &e) < 0) { fprintf(stderr, "hearth run: %s\n", e.msg); return 1; }
    const engine_info info = engine_get_info(eng);
    fprintf(stderr, "engine: %s (%s), %d threads, context %" PRId64 "\n", info.backend, info.why, info.n_threads, info.n_ctx);
    const int64_t V = m->hp.n_vocab;
    float *logits = xmalloc(sizeof(float) * (size_t)V);
    engine_point **points = xcalloc((size_t)n_marks + 1, sizeof(engine_point *));
    for (int64_t i = 0; i < n_marks; i++)
        if (engine_point_new(eng, &points[i], &e) < 0) { fprintf(stderr, "hearth run: --marks: %s\n", e.msg); return 1; }

    /* greedy: the engine picks the token (on the GPU only its id leaves the device) */
    /* --ignore-eos masks the end tokens' logits, so then the logits leave the engine too */
    int32_t *eog = xmalloc(sizeof(int32_t) * (size_t)(V + 1));
    int n_eog = 0;
    for (int64_t i = 0; tok && ignore_eos && i < V; i++)
        if (tokenizer_is_eog(tok, (int32_t)i)) eog[n_eog++] = (int32_t)i;
    const engine_logits want = temp > 0 || n_eog > 0 || spec_k ? ENGINE_LOGITS_LAST : ENGINE_LOGITS_ARGMAX;
    int32_t greedy = 0;
    double t0 = time_now();
    engine_span sp = {.seq = 0, .ids = ids, .n = n_ids, .marks = marks, .n_marks = (int)n_marks, .points = points,
                      .want = want, .logits = logits, .token = &greedy};
    if (engine_run(eng, &sp, 1, &e) < 0) {
        fprintf(stderr, "hearth run: %s\n", e.msg);
        return 1;
    }
    double t_prompt = time_now() - t0;
    for (int64_t i = 0; i < n_marks; i++)
        fprintf(stderr, "point %" PRId64 ": position %" PRId64 ", %zu bytes\n", i, points[i]->pos, engine_point_size(points[i]));
    if (n_marks)
        fprintf(stderr, "points: %" PRId64 " taken in the one prompt pass; the copies took %.2f ms of CPU time over %d "
                        "threads (the pass: %.2f ms wall)\n",
                n_marks, engine_get_stats(eng).t_points * 1e3, info.n_threads, t_prompt * 1e3);

    sampler sm;
    sampler_init(&sm, &(sampler_opts){.temp = temp, .top_k = (int32_t)top_k, .top_p = top_p, .min_p = min_p,
                                      .seed = (uint64_t)seed}, V);
    tokdec dec;
    if (tok) tokdec_init(&dec, tok);
    int32_t *out = xmalloc(sizeof(int32_t) * (size_t)(n_gen + SPEC_MAX + 2));
    int64_t n_out = 0;
    int rc = 0;
    spec_ctx sc = {0};
    if (spec_k && spec_init(&sc, eng, 0, (int)spec_k, &e) < 0) {
        fprintf(stderr, "hearth run: %s\n", e.msg);
        return 1;
    }
    sc.mask = eog, sc.n_mask = n_eog, sc.replay = replay, sc.n_replay = n_replay;
    double t1 = time_now();
    /* speculative: each step makes 1 .. K + 1 tokens; out[n_out - 1] is the next step's last */
    if (spec_k && n_gen > 0) {
        for (int i = 0; i < n_eog; i++) logits[eog[i]] = -INFINITY;
        out[n_out++] = sampler_sample(&sm, logits);
    }
    for (int64_t done = 0; spec_k && n_out <= n_gen;) {
        for (; done < n_out; done++) { /* the tokens made, as the plain loop prints them */
            const int32_t id = out[done];
            if (tok && !ids_out) {
                char buf[4096];
                size_t nb = tokdec_push(&dec, id, buf, sizeof buf);
                fwrite(buf, 1, nb, stdout);
                fflush(stdout);
            }
            if ((tok && !ignore_eos && tokenizer_is_eog(tok, id)) || done + 1 == n_gen) {
                n_out = done + 1;
                break;
            }
        }
        if (done < n_out || n_out >= n_gen) break;
        if (engine_seq_pos(eng, 0) >= info.n_ctx) {
            fprintf(stderr, "\nhearth run: the context of %" PRId64 " tokens (-c) filled after %" PRId64 " of -n %" PRId64
                            " tokens\n", info.n_ctx, n_out, n_gen);
            rc = 1;
            break;
        }
        const int got = spec_step(&sc, &sm, out[n_out - 1], n_out, (int)(n_gen - n_out), out + n_out, &e);
        if (got < 0) {
            fprintf(stderr, "\nhearth run: %s\n", e.msg);
            rc = 1;
            break;
        }
        n_out += got;
    }
    for (int64_t k = 0; !spec_k && k < n_gen; k++) {
        for (int i = 0; i < n_eog; i++) logits[eog[i]] = -INFINITY;
        int32_t id = want == ENGINE_LOGITS_ARGMAX ? greedy : sampler_sample(&sm, logits);
        out[n_out++] = id;
        if (tok && !ids_out) {
            char buf[4096]; /* a piece longer than this comes out with the next token */
            size_t nb = tokdec_push(&dec, id, buf, sizeof buf);
            fwrite(buf, 1, nb, stdout);
            fflush(stdout);
        }
        if (tok && !ignore_eos && tokenizer_is_eog(tok, id)) break;
        if (k + 1 == n_gen) break; /* the last token needs no forward */
        if (engine_seq_pos(eng, 0) >= info.n_ctx) {
            fprintf(stderr, "\nhearth run: the context of %" PRId64 " tokens (-c) filled after %" PRId64 " of -n %" PRId64
                            " tokens\n", info.n_ctx, k + 1, n_gen);
            rc = 1;
            break;
        }
        engine_span st = {.seq = 0, .ids = &id, .n = 1, .want = want, .logits = logits, .token = &greedy};
        if (engine_run(eng, &st, 1, &e) < 0) {
            fprintf(stderr, "\nhearth run: %s\n", e.msg);
            rc = 1;
            break;
        }
    }
    double t_gen = time_now() - t1;
    if (ids_out) {
        printf("[");
        for (int64_t i = 0; i < n_out; i++) printf("%s%" PRId32, i ? "," : "", out[i]);
        printf("]\n");
    } else if (tok) {
        char buf[64];
        size_t nb;
        while ((nb = tokdec_flush(&dec, buf, sizeof buf)) > 0) fwrite(buf, 1, nb, stdout);
        printf("\n");
    }
    if (tok) tokdec_free(&dec);
    fflush(stdout);
    fprintf(stderr, "prompt: %" PRId64 " tokens in %.3f s, %.2f tok/s\n", n_ids, t_prompt, (double)n_ids / t_prompt);
    fprintf(stderr, "decode: %" PRId64 " tokens in %.3f s, %.2f tok/s\n", n_out > 0 ? n_out - 1 : 0, t_gen,
            n_out > 1 ? (double)(n_out - 1) / t_gen : 0.0);
    if (spec_k)
        fprintf(stderr, "spec: %" PRId64 " steps, %" PRId64 " drafted, %" PRId64 " accepted (%.1f%%), %.2f tokens a step\n",
                sc.n_steps, sc.n_drafted, sc.n_accepted, sc.n_drafted ? 100.0 * (double)sc.n_accepted / (double)sc.n_drafted : 0.0,
                sc.n_steps ? (double)(sc.n_accepted + sc.n_steps) / (double)sc.n_steps : 0.0);
    spec_free(&sc);
    free(replay);
    for (int64_t i = 0; i < n_marks; i++) engine_point_free(eng, points[i]);
    free(points);
    free(out);
    free(logits);
    free(eog);
    free(ids);
    free(marks);
    sampler_free(&sm);
    engine_free(eng);
    if (tok) tokenizer_free(tok);
    model_free(m);
    return rc;
}
