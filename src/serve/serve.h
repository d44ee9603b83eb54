/* serve.h: `hearth serve`: llama-server's HTTP API over the scheduler (sched.h).
 * The options are the flags, spelled as llama-server spells them (src/cli/serve.c). */
#ifndef HEARTH_SERVE_H
#define HEARTH_SERVE_H

#include <stdbool.h>
#include <stdint.h>
#include "engine/engine.h"

typedef struct serve_opts {
    const char *model_path;
    const char *host;          /* 127.0.0.1 unless told */
    int port;                  /* 0: any free port (printed) */
    int64_t n_ctx;             /* per slot; 0: the model's trained context */
    int n_slots;               /* -np */
    int64_t cache_ram_mib;     /* points' budget; -1: no limit; 0: no shared cache in RAM */
    const char *cache_dir;     /* the prompt cache's files, or NULL */
    int64_t cache_disk_mib;    /* their bound (--cache-disk), -1: none */
    int64_t cache_gpu_mib;     /* engine memory for parked sequences (--cache-gpu); -1: not given
                                * (SERVE_CACHE_GPU_DEFAULT_MIB, dropped if the engine cannot open with it) */
    int64_t answer_wait_ms;    /* idle time after an answer before its end point is made (--answer-point-wait) */
    const char *slot_dir;      /* /slots save and restore's folder (--slot-save-path, else cache_dir), or NULL */
    int n_threads;
    const char *api_key;
    const char *alias;
    engine_device device;
    const char *template_file;
    const char *template_text;  /* --chat-template: a built-in's text (or the text given), or NULL */
    bool reasoning_none;       /* --reasoning-format none: thinking stays in content */
    int64_t n_predict;         /* default max tokens, -1: until the context fills */
    float temp, top_p, min_p;  /* what a request that sets none samples with (--temp, ...) */
    int top_k;
    int64_t seed;              /* --seed: a request's that sets none; -1: random per request */
    unsigned timeout_s;        /* idle connections closed after it */
    bool metrics;
    int64_t queue_max;
    size_t body_max;
    bool kv_f16;
    const char *ready_file;    /* written with the port once listening (tests) */
    const char *template_kwargs; /* --chat-template-kwargs: a JSON object (checked by the flag's parser), or NULL */
    bool keep_billing;         /* --keep-billing-header: Claude Code's billing line stays in the prompt */
    bool no_webui;             /* --no-webui: no chat page at / (a 404, as any unknown path) */
    int spec_k;                /* --spec-mtp: drafts a step by the model's MTP block (0: off) */
} serve_opts;

/* --cache-gpu's default: on an 80 GB card beside a 21 GB model, room for a few sequences of
 * long contexts (0.8 GiB each at 40k tokens, f16 KV at q36) and 29 of the default 4096 */
#define SERVE_CACHE_GPU_DEFAULT_MIB 4096
/* --answer-point-wait's default: a client that sends the conversation's next turn at once (an
 * agent's quick tool, a benchmark) comes first and prefills the answer in its own pass, not
 * after the closing pass (14-37 ms at 4-42k rows on an H100, bench/RESULTS.md); a slower one
 * (a person typing, a tool taking longer) finds the answer's end point made */
#define SERVE_ANSWER_WAIT_DEFAULT_MS 25
#define SERVE_PARK_MAX 64          /* parked sequences at most, whatever --cache-gpu allows */

/* Runs until SIGTERM or SIGINT; returns the exit code. */
int serve_main(const serve_opts *o);

#endif
