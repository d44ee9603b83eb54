/* serve.c: `hearth serve`: the flags (llama-server's spellings), then serve_main. */
#include "cli/cli.h"
#include "cli/args.h"
#include "cli/engine_args.h"
#include "serve/serve.h"
#include "serve/cache.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

/* --chat-template-kwargs: a JSON object (llama-server's flag), kept as its text; enable_thinking,
 * which the template reads as a boolean, must be one */
static int parse_template_kwargs(const char *v, void *dst, herr *e) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(v, &end, true);
    int rc = 0;
    if (!j) rc = herr_set(e, "not valid JSON (near byte %zu of '%.80s')", end ? (size_t)(end - v) : (size_t)0, v);
    else if (!cJSON_IsObject(j)) rc = herr_set(e, "expects a JSON object of template variables, e.g. '{\"enable_thinking\": false}'");
    else if (cJSON_GetObjectItemCaseSensitive(j, "enable_thinking") &&
             !cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(j, "enable_thinking")))
        rc = herr_set(e, "enable_thinking must be true or false");
    cJSON_Delete(j);
    if (rc == 0) *(const char **)dst = v;
    return rc;
}

int cmd_serve(int argc, char **argv) {
    serve_opts o = {.host = "127.0.0.1", .port = 8080, .n_ctx = 4096, .n_slots = 1, .cache_ram_mib = 8192,
                    .cache_disk_mib = PCACHE_DISK_DEFAULT_MIB,
                    .n_predict = -1, .timeout_s = 600, .queue_max = 64, .body_max = 16 << 20};
    int64_t n_threads = 0, port = 8080, n_slots = 1, timeout = 600, queue = 64, body_mib = 16;
    const char *reasoning = "deepseek";
    bool jinja = false;
    int kv = 1; /* f16, as llama-server */
    static const char *const kv_types[] = {"f32", "f16", NULL};
    const arg_opt opts[] = {
        ARG_STR("--model", "-m", &o.model_path, "FILE", "the GGUF file"),
        ARG_STR("--host", NULL, &o.host, "ADDR", "address to listen on (default 127.0.0.1)"),
        ARG_I64("--port", NULL, &port, 0, 65535, "PORT", "port (default 8080; 0: any free one, printed)"),
        ARG_I64("--ctx-size", "-c", &o.n_ctx, 16, (int64_t)1 << 24, "N", "context of each slot, tokens (default 4096)"),
        ARG_I64("--parallel", "-np", &n_slots, 1, 256, "N", "slots: requests served at once (default 1)"),
        ARG_I64("--cache-ram", NULL, &o.cache_ram_mib, 1, (int64_t)1 << 30, "MiB",
                "host RAM for the prompt cache's points (default 8192)"),
        ARG_STR("--cache-dir", NULL, &o.cache_dir, "DIR",
                "keep the prompt cache's entries as files here too, found again after a restart"),
        ARG_I64("--cache-disk", NULL, &o.cache_disk_mib, -1, (int64_t)1 << 30, "MiB",
                "bound on --cache-dir's files: the least recently used go first (default 16384;\n"
                "-1: no limit)"),
        ARG_I64("--threads", "-t", &n_threads, 1, 512, "N", "CPU threads (default: every core)"),
        ARG_STR("--api-key", NULL, &o.api_key, "KEY", "required as 'Authorization: Bearer KEY' or 'x-api-key: KEY'"),
        ARG_STR("--alias", "-a", &o.alias, "NAME", "the model's name in answers (default: the file's name)"),
        ARG_FN("--device", NULL, &o.device, cli_parse_device, "cpu|cuda|auto", "the engine (default auto)"),
        ARG_STR("--chat-template-file", NULL, &o.template_file, "FILE", "a Jinja chat template instead of the file's"),
        ARG_FN("--chat-template-kwargs", NULL, &o.template_kwargs, parse_template_kwargs, "JSON",
               "template variables for every request, under each request's own chat_template_kwargs\n"
               "(e.g. '{\"enable_thinking\": false}' or Qwen3.6's '{\"preserve_thinking\": true}')"),
        ARG_FLAG("--keep-billing-header", NULL, &o.keep_billing,
                 "keep Claude Code's x-anthropic-billing-header line in /v1/messages system prompts\n"
                 "(dropped by default: it changes every request and defeats the prompt cache)"),
        ARG_FLAG("--jinja", NULL, &jinja, "accepted: templates are always Jinja here"),
        ARG_STR("--reasoning-format", NULL, &reasoning, "deepseek|none",
                "deepseek (default): a thinking block goes to reasoning_content;\nnone: it stays in content"),
        ARG_I64("--n-predict", "-n", &o.n_predict, -1, (int64_t)1 << 24, "N",
                "default tokens per answer (-1: until the context fills)"),
        ARG_I64("--timeout", "-to", &timeout, 1, 86400, "S", "idle connections are closed after S seconds (default 600)"),
        ARG_FLAG("--metrics", NULL, &o.metrics, "serve /metrics (Prometheus text)"),
        ARG_I64("--queue", NULL, &queue, 1, 1 << 20, "N", "requests that may wait for a slot; more get 503 (default 64)"),
        ARG_I64("--body-max", NULL, &body_mib, 1, 4096, "MiB", "largest request body (default 16)"),
        ARG_ENUM("--cache-type-k", "-ctk", &kv, kv_types, "KV rows as f16 (default) or f32"),
        ARG_STR("--ready-file", NULL, &o.ready_file, "FILE", "write the port here once listening (for scripts)"),
        ARG_END,
    };
    const arg_cmd cmd = {
        .name = "serve",
        .usage = "hearth serve -m FILE [--host 127.0.0.1] [--port 8080] [-c 4096] [-np 1] [--cache-ram MiB]\n"
                 "                    [-t N] [--api-key KEY] [--alias NAME] [--device cpu|cuda|auto] [--metrics] ...",
        .about = "Serves llama-server's HTTP API: /v1/chat/completions, /v1/completions, /completion,\n"
                 "/tokenize, /detokenize, /apply-template, /health, /v1/models, /props, /slots, /metrics.\n"
                 "Runs until SIGTERM or SIGINT.",
        .opts = opts,
    };
    int prc = args_parse(&cmd, argc, argv, NULL, NULL);
    if (prc != ARGS_RUN) return prc;
    if (o.cache_disk_mib == 0) {
        fprintf(stderr, "hearth serve: --cache-disk 0 would keep no file: leave out --cache-dir instead\n");
        return 2;
    }
    if (!o.model_path) {
        fprintf(stderr, "hearth serve: need -m FILE\n");
        args_usage(&cmd, stderr);
        return 2;
    }
    if (strcmp(reasoning, "deepseek") && strcmp(reasoning, "none") && strcmp(reasoning, "auto")) {
        fprintf(stderr, "hearth serve: --reasoning-format: '%s' is none of deepseek, none, auto\n", reasoning);
        return 2;
    }
    o.reasoning_none = !strcmp(reasoning, "none");
    o.port = (int)port;
    o.n_slots = (int)n_slots;
    o.n_threads = (int)n_threads;
    o.timeout_s = (unsigned)timeout;
    o.queue_max = queue;
    o.body_max = (size_t)body_mib << 20;
    o.kv_f16 = kv == 1;
    return serve_main(&o);
}
