/* serve.c: `hearth serve`: the flags (llama-server's spellings, serve_args), then serve_main.
 * llama-server's flags that would mean nothing here are accepted where the answer is the same
 * (-fa, -b, -ub, --jinja) and said so in --help. */
#include "cli/cli.h"
#include "cli/args.h"
#include "cli/engine_args.h"
#include "serve/serve.h"
#include "engine/spec.h"
#include "serve/cache.h"
#include "text/chat_builtin.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
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

/* -ngl N (llama-server's layers on the GPU): 0 the CPU engine, more the CUDA engine (hearth
 * puts every layer on one device), -1 / auto as --device auto; "all" as a large N */
static int parse_ngl(const char *v, void *dst, herr *e) {
    char *end;
    const long long n = strtoll(v, &end, 10);
    if (!strcmp(v, "auto") || (!*end && *v && n == -1)) *(int *)dst = ENGINE_AUTO;
    else if (!strcmp(v, "all") || (!*end && *v && n > 0)) *(int *)dst = ENGINE_CUDA;
    else if (!*end && *v && n == 0) *(int *)dst = ENGINE_CPU;
    else return herr_set(e, "expects a number of layers (0: the CPU engine; more, or all: the CUDA engine; -1 or auto), got '%s'", v);
    return 0;
}

/* --chat-template NAME: a built-in's name, or (as llama-server also takes) the template's text */
static int parse_template_name(const char *v, void *dst, herr *e) {
    if (chat_builtin_text(v)) {
        *(const char **)dst = chat_builtin_text(v);
        return 0;
    }
    if (strstr(v, "{%") || strstr(v, "{{")) {
        *(const char **)dst = v;
        return 0;
    }
    char names[200] = "";
    for (int i = 0; chat_builtin_name(i); i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", chat_builtin_name(i));
    return herr_set(e, "'%s' is no built-in template (%s); a template in a file is --chat-template-file FILE", v, names);
}

/* strings serve_args made (the key read from --api-key-file, the template variables with
 * --reasoning-budget 0), kept until the next call */
static char *made_key, *made_kwargs;

int serve_args(int argc, char **argv, serve_opts *out) {
    serve_opts o = {.host = "127.0.0.1", .port = 8080, .n_ctx = 4096, .n_slots = 1, .cache_ram_mib = 8192,
                    .cache_disk_mib = PCACHE_DISK_DEFAULT_MIB, .cache_gpu_mib = -1,
                    .answer_wait_ms = SERVE_ANSWER_WAIT_DEFAULT_MS,
                    .n_predict = -1, .timeout_s = 600, .queue_max = 64, .body_max = 16 << 20,
                    .temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = -1};
    int64_t n_threads = 0, port = 8080, n_slots = 1, timeout = 600, queue = 64, body_mib = 16, batch = 2048, ubatch = 512;
    int64_t reasoning_budget = -1;
    const char *reasoning = "deepseek", *key_file = NULL, *slot_dir = NULL;
    bool jinja = false, device_given = false;
    int kv = 1; /* f16, as llama-server */
    int ngl = -2, fa = 2; /* -2: not given */
    static const char *const kv_types[] = {"f32", "f16", NULL};
    static const char *const fa_modes[] = {"on", "off", "auto", NULL};
    o.device = ENGINE_AUTO;
    engine_device dev = ENGINE_AUTO;
    const arg_opt opts[] = {
        ARG_STR("--model", "-m", &o.model_path, "FILE", "the GGUF file"),
        ARG_STR("--host", NULL, &o.host, "ADDR", "address to listen on (default 127.0.0.1)"),
        ARG_I64("--port", NULL, &port, 0, 65535, "PORT", "port (default 8080; 0: any free one, printed)"),
        ARG_I64("--ctx-size", "-c", &o.n_ctx, 0, (int64_t)1 << 24, "N",
                "context of each slot, tokens (default 4096; 0: the model's trained context)"),
        ARG_I64("--parallel", "-np", &n_slots, 1, 256, "N", "slots: requests served at once (default 1)"),
        ARG_I64("--cache-ram", "-cram", &o.cache_ram_mib, -1, (int64_t)1 << 30, "MiB",
                "host RAM for the prompt cache's points (default 8192; -1: no limit;\n"
                "0: no shared cache in RAM, each slot resumes from its own points only)"),
        ARG_I64("--cache-gpu", NULL, &o.cache_gpu_mib, 0, (int64_t)1 << 30, "MiB",
                "engine memory (the GPU's; RAM with the CPU engine) for sequences beyond the slots':\n"
                "a slot moving to another conversation parks the old one's KV rows there instead of\n"
                "copying them to RAM, and a request resuming it takes them over (default 4096: one\n"
                "sequence is its context's KV rows plus its recurrent state; at most 64; 0: none)"),
        ARG_I64("--answer-point-wait", NULL, &o.answer_wait_ms, 0, 60000, "MS",
                "idle time after a chat answer ends before the slot prefills it again for a point\n"
                "at its end (default 25; 0: at once); the conversation's next turn arriving sooner\n"
                "prefills the answer in its own pass instead of waiting for that one"),
        ARG_STR("--cache-dir", NULL, &o.cache_dir, "DIR",
                "keep the prompt cache's entries as files here too, found again after a restart"),
        ARG_I64("--cache-disk", NULL, &o.cache_disk_mib, -1, (int64_t)1 << 30, "MiB",
                "bound on --cache-dir's files: the least recently used go first (default 16384;\n"
                "-1: no limit)"),
        ARG_STR("--slot-save-path", NULL, &slot_dir, "DIR",
                "the folder of /slots save and restore (default: --cache-dir)"),
        ARG_INT("--spec-mtp", NULL, &o.spec_k, 0, SPEC_MAX, "K",
                "speculative decoding: the model's MTP block drafts K tokens a step and one pass\n"
                "verifies them, the same tokens as without (default 0: off; the CPU engine; not\n"
                "for a request under a grammar); answers' timings give draft_n, draft_n_accepted"),
        ARG_I64("--threads", "-t", &n_threads, 1, 512, "N", "CPU threads (default: every core)"),
        ARG_STR("--api-key", NULL, &o.api_key, "KEY", "required as 'Authorization: Bearer KEY' or 'x-api-key: KEY'"),
        ARG_STR("--api-key-file", NULL, &key_file, "FILE", "--api-key read from a file (its one line)"),
        ARG_STR("--alias", "-a", &o.alias, "NAME", "the model's name in answers (default: the file's name)"),
        ARG_FN("--device", NULL, &dev, cli_parse_device, "cpu|cuda|auto", "the engine (default auto)"),
        ARG_FN("--n-gpu-layers", "-ngl", &ngl, parse_ngl, "N",
               "llama-server's layers on the GPU: 0 the CPU engine (--device cpu), more or all\n"
               "the CUDA engine with every layer (--device cuda), -1 or auto: --device auto"),
        ARG_ENUM("--flash-attn", "-fa", &fa, fa_modes,
                 "accepted: hearth's attention is always one fused pass (off changes nothing)"),
        ARG_I64("--batch-size", "-b", &batch, 1, (int64_t)1 << 24, "N",
                "accepted: the engine sizes its own prompt passes (the answer is the same)"),
        ARG_I64("--ubatch-size", "-ub", &ubatch, 1, (int64_t)1 << 24, "N", "accepted, as -b"),
        ARG_STR("--chat-template-file", NULL, &o.template_file, "FILE", "a Jinja chat template instead of the file's"),
        ARG_FN("--chat-template", NULL, &o.template_text, parse_template_name, "NAME",
               "a built-in chat template instead of the file's: chatml, qwen3, qwen3.5\n"
               "(or a template's text itself)"),
        ARG_FN("--chat-template-kwargs", NULL, &o.template_kwargs, parse_template_kwargs, "JSON",
               "template variables for every request, under each request's own chat_template_kwargs\n"
               "(e.g. '{\"enable_thinking\": false}' or Qwen3.6's '{\"preserve_thinking\": true}')"),
        ARG_FLAG("--keep-billing-header", NULL, &o.keep_billing,
                 "keep Claude Code's x-anthropic-billing-header line in /v1/messages system prompts\n"
                 "(dropped by default: it changes every request and defeats the prompt cache)"),
        ARG_FLAG("--jinja", NULL, &jinja, "accepted: templates are always Jinja here"),
        ARG_FLAG("--no-webui", NULL, &o.no_webui, "serve no chat page at / (a 404 there, as any unknown path)"),
        ARG_STR("--reasoning-format", NULL, &reasoning, "deepseek|none",
                "deepseek (default): a thinking block goes to reasoning_content;\nnone: it stays in content"),
        ARG_I64("--reasoning-budget", NULL, &reasoning_budget, -1, 0, "N",
                "-1 (default): thinking unrestricted; 0: thinking off (enable_thinking false\n"
                "unless a request or --chat-template-kwargs says otherwise)"),
        ARG_F32("--temp", NULL, &o.temp, 0, 100, "T", "temperature of requests that set none (default 0.8)"),
        ARG_INT("--top-k", NULL, &o.top_k, 0, 1 << 30, "N", "top_k of requests that set none (default 40; 0: off)"),
        ARG_F32("--top-p", NULL, &o.top_p, 0, 1, "P", "top_p of requests that set none (default 0.95; 1: off)"),
        ARG_F32("--min-p", NULL, &o.min_p, 0, 1, "P", "min_p of requests that set none (default 0.05; 0: off)"),
        ARG_I64("--seed", "-s", &o.seed, -1, INT64_MAX / 2, "N", "seed of requests that set none (default -1: random)"),
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
        .usage = "hearth serve -m FILE [--host 127.0.0.1] [--port 8080] [-c 4096] [-np 1] [--cache-ram MiB] [--cache-gpu MiB]\n"
                 "                    [-t N] [--api-key KEY] [--alias NAME] [--device cpu|cuda|auto] [--metrics] ...",
        .about = "Serves llama-server's HTTP API: /v1/chat/completions, /v1/completions, /completion,\n"
                 "/tokenize, /detokenize, /apply-template, /health, /v1/models, /props, /slots, /metrics,\n"
                 "and a chat page at / (unless --no-webui).\n"
                 "Runs until SIGTERM or SIGINT.",
        .opts = opts,
    };
    /* --device given and -ngl given must agree: noted before the table parses them */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--device") || !strncmp(argv[i], "--device=", 9)) device_given = true;
    int prc = args_parse(&cmd, argc, argv, NULL, NULL);
    if (prc != ARGS_RUN) return prc;
    (void)jinja, (void)batch, (void)ubatch, (void)fa;
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
    if (ngl != -2 && device_given && (engine_device)ngl != dev) {
        fprintf(stderr, "hearth serve: -ngl / --n-gpu-layers and --device name different engines: give one\n");
        return 2;
    }
    o.device = ngl != -2 ? (engine_device)ngl : dev;
    if (o.template_file && o.template_text) {
        fprintf(stderr, "hearth serve: --chat-template and --chat-template-file: give one\n");
        return 2;
    }
    if (key_file) {
        if (o.api_key) {
            fprintf(stderr, "hearth serve: --api-key and --api-key-file: give one\n");
            return 2;
        }
        char *text;
        size_t len;
        herr e;
        if (read_file(key_file, &text, &len, &e) < 0) {
            fprintf(stderr, "hearth serve: --api-key-file: %s\n", e.msg);
            return 2;
        }
        /* one key on its one line (hearth checks one key; llama-server takes one a line) */
        char *p = text + strspn(text, " \t\r\n"), *q = p + strcspn(p, " \t\r\n");
        const char *rest = q + strspn(q, " \t\r\n");
        if (!*p || *rest || strlen(text) != len) {
            fprintf(stderr, "hearth serve: --api-key-file %s: %s\n", key_file,
                    !*p ? "holds no key" : *rest ? "holds more than one key (hearth takes one)" : "holds a NUL byte");
            free(text);
            return 2;
        }
        *q = 0;
        free(made_key);
        made_key = xstrdup(p);
        free(text);
        o.api_key = made_key;
    }
    if (reasoning_budget == 0) { /* thinking off by default: enable_thinking false under the template's variables */
        cJSON *kw = o.template_kwargs ? cJSON_Parse(o.template_kwargs) : cJSON_CreateObject();
        if (!cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking")) cJSON_AddFalseToObject(kw, "enable_thinking");
        char *text = cJSON_PrintUnformatted(kw);
        cJSON_Delete(kw);
        free(made_kwargs);
        made_kwargs = xstrdup(text);
        cJSON_free(text);
        o.template_kwargs = made_kwargs;
    }
    o.slot_dir = slot_dir ? slot_dir : o.cache_dir;
    o.reasoning_none = !strcmp(reasoning, "none");
    o.port = (int)port;
    o.n_slots = (int)n_slots;
    o.n_threads = (int)n_threads;
    o.timeout_s = (unsigned)timeout;
    o.queue_max = queue;
    o.body_max = (size_t)body_mib << 20;
    o.kv_f16 = kv == 1;
    *out = o;
    return ARGS_RUN;
}

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    const int rc = serve_args(argc, argv, &o);
    if (rc != ARGS_RUN) return rc;
    const int src = serve_main(&o);
    free(made_key);
    free(made_kwargs);
    made_key = made_kwargs = NULL;
    return src;
}
