/* jinja.h: a Jinja2 subset, enough for the chat templates of Hugging Face models, rendered
 * byte for byte as transformers renders them (python jinja2's ImmutableSandboxedEnvironment
 * with trim_blocks and lstrip_blocks, the loopcontrols extension, raise_exception,
 * strftime_now and transformers' tojson; tools/ref/jinja_render.py is the reference).
 * Templates are untrusted: a syntax error, a construct outside the subset (named, with its
 * line) and every limit below are errors, never a crash and never a guessed rendering.
 * What the subset holds is listed in src/chat.h. */
#ifndef HEARTH_JINJA_H
#define HEARTH_JINJA_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "base/util.h"

typedef struct jinja_template jinja_template;

/* Bounds on one render (0 in a field takes the default in brackets). */
typedef struct jinja_limits {
    size_t max_output;   /* bytes of rendered text [64 MiB] */
    size_t max_memory;   /* bytes of values and buffers held during the render [512 MiB] */
    int max_depth;       /* nested macro calls [64] */
    uint64_t max_steps;  /* expressions and statements evaluated [20 M] */
} jinja_limits;

/* Parses src[0..len) (UTF-8). NULL with e set on a syntax error, on an unknown tag, filter or
 * test, or on a construct the subset lacks. */
jinja_template *jinja_parse(const char *src, size_t len, herr *e);
void jinja_free(jinja_template *t);

/* Renders t with the members of vars (a cJSON object) as its variables; a name vars lacks is
 * undefined. now (seconds since the epoch, UTC) is what strftime_now formats. On success
 * *out is a malloc'd, NUL-terminated string (free() it) of *out_len bytes. */
int jinja_render(const jinja_template *t, const cJSON *vars, int64_t now, const jinja_limits *lim,
                 char **out, size_t *out_len, herr *e);

#endif
