/* chat.h: chat templates (a Jinja2 subset, src/jinja.h) rendered byte for byte as Hugging
 * Face transformers renders them, and the token positions where messages begin (the
 * prompt cache's marks). The reference is tools/ref/jinja_render.py (python jinja2).
 *
 * The subset: {{ }}, {% %}, {# #}, whitespace control (- and +), trim_blocks and
 * lstrip_blocks, {% raw %}; tags if/elif/else, for (with else, a loop filter `if`, loop.index,
 * index0, revindex, revindex0, first, last, length, previtem, nextitem, depth, cycle; over
 * lists, dicts' keys, items(), strings), break/continue, set (names, tuples, ns.attr, block
 * set with filters), macro (defaults, keyword arguments), filter blocks, generation; literals
 * (strings with Python escapes, ints, floats, lists, tuples, dicts, true/false/none);
 * operators and/or/not, in/not in, == != < <= > >= (chained), + - * / // % ** ~, unary -,
 * conditional expressions, attribute and item access, slices with steps; filters abs, attr,
 * capitalize, count, default/d, dictsort, escape/e, first, float, indent, int, items, join,
 * last, length, list, lower, map, max, min, reject, rejectattr, replace, reverse, round,
 * safe, select, selectattr, sort, string, sum, title, tojson (transformers': ensure_ascii
 * off, indent, separators, sort_keys), trim, unique, upper; every jinja2 test but `sameas`
 * on numbers and strings; str methods startswith, endswith, strip, lstrip, rstrip, split,
 * rsplit, lower, upper, title, capitalize, replace, find, rfind, count, format, join,
 * splitlines, removeprefix, removesuffix, isdigit, isalpha, isspace, isalnum; dict get,
 * keys, values, items; list count, index; globals range, namespace, dict, raise_exception,
 * strftime_now. Anything else (include/import/extends/call tags, recursive loops, other
 * filters or methods, %-formatting, format specs, case mapping of non-ASCII letters, repr of
 * rare code points) is an error naming it and its template line, never a guess.
 *
 * Input quirk: cJSON keeps numbers as doubles, so an integral JSON number is an int here
 * (a literal 1.0 in the messages renders "1" where Python renders "1.0"). */
#ifndef HEARTH_CHAT_H
#define HEARTH_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "format/gguf.h"
#include "text/jinja.h"
#include "text/tokenizer.h"
#include "base/util.h"

typedef struct chat_template chat_template;

/* What a template is rendered with, named as transformers passes it. */
typedef struct chat_input {
    const cJSON *messages;       /* array of {role, content (string or parts), tool_calls, ...} */
    const cJSON *tools;          /* array, or NULL: tools is none */
    bool add_generation_prompt;
    int enable_thinking;         /* -1: undefined; 0 or 1: false or true */
    const char *bos_token;       /* NULL: undefined */
    const char *eos_token;       /* NULL: undefined */
    const cJSON *extra;          /* an object of more variables (or NULL); they win over the above */
    int64_t now;                 /* seconds since the epoch (UTC) for strftime_now; 0: now */
    jinja_limits limits;         /* zeros: jinja.h's defaults */
} chat_input;

/* The ChatML template used when a file has none (llama.cpp's "chatml"). */
extern const char chat_chatml_template[];

chat_template *chat_template_parse(const char *src, size_t len, herr *e);
/* tokenizer.chat_template of f, or ChatML when the file has none. */
chat_template *chat_template_from_gguf(const gguf_file *f, herr *e);
void chat_template_free(chat_template *t);
const char *chat_template_source(const chat_template *t, size_t *len);

/* Renders; *out is malloc'd and NUL-terminated (free() it). */
int chat_render(const chat_template *t, const chat_input *in, char **out, size_t *out_len, herr *e);

/* Reads a chat request object {"messages": [...], "tools": [...], "add_generation_prompt":
 * bool, "enable_thinking": bool, "bos_token": str, "eos_token": str, "extra": {...}} (or a
 * bare messages array) into *in; *root holds the parsed JSON (cJSON_Delete it after use). */
int chat_input_parse(const char *json, size_t len, chat_input *in, cJSON **root, herr *e);
/* The same from parsed JSON (in refers into r). */
int chat_input_from_json(const cJSON *r, chat_input *in, herr *e);

/* Message starts. ids[0..n_ids) must be tokenizer_encode(tok, rendered, len, parse_special
 * = true) (no BOS added; a caller that prepends one adds 1 to every position). Writes to
 * starts[] (up to max) the token positions where the rendered messages begin, ascending,
 * and returns how many there are, or -1 with e set.
 *  - ChatML templates (the vocabulary has <|im_start|> and the rendering holds it): every
 *    <|im_start|> position, the generation prompt's included. It is a special token, so
 *    the ids before it are exactly the encoding of the text before it.
 *  - Other templates: the conversation is rendered again prefix by prefix (messages [0, k),
 *    without the generation prompt); message k begins where that rendering stops agreeing
 *    with the full one. Each such byte offset is mapped to the token that begins there (or
 *    the last boundary before it), and a position is kept only if the ids before it are
 *    exactly the encoding of the text before it, so that a cached point there is reusable
 *    by a request that shares that text. Prefixes the template refuses are skipped. */
int64_t chat_message_starts(const chat_template *t, const chat_input *in, const tokenizer *tok,
                            const char *rendered, size_t len, const int32_t *ids, int64_t n_ids,
                            int64_t *starts, int64_t max, herr *e);

/* What a template renders after an assistant message's content when another message follows
 * (ChatML: "<|im_end|>\n"), as ids: found by rendering a probe conversation (a user message,
 * an assistant message, a user message; else, for templates that write an answer otherwise
 * once a user message follows, as Qwen3's and Qwen3.5's drop its thinking, the assistant
 * message with some thinking and a tool's result after it; base gives the other variables).
 * A server appends them to an answer to make the state a later request's prompt has where its
 * next message begins. Writes up to max ids and returns how many; 0 when the template renders nothing
 * there that tokenizes apart from the answer's own text (the ids of text + end are not those
 * of text then those of end), when the assistant message is not where the next one begins
 * (the rendering without the last message is no prefix of the whole), or when it refuses
 * the probe. *start_id: the id every message start is (<|im_start|> where a rendering
 * holds it, as chat_message_starts finds them, whether or not an end was found), else -1. */
int64_t chat_answer_end(const chat_template *t, const chat_input *base, const tokenizer *tok, int32_t *ids, int64_t max,
                        int32_t *start_id);

#endif
