/* answer.c: generated text into reasoning, content and tool calls (answer.h). */
#include "serve/answer.h"
#include "base/util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR_LEN(s) (sizeof(s) - 1)
static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char CALL_OPEN[] = "<tool_call>", CALL_CLOSE[] = "</tool_call>";

void answer_init(answer *a, const answer_opts *o, answer_sink sink, void *cls) {
    *a = (answer){.o = *o, .sink = sink, .cls = cls};
    a->think = !o->split_think ? 0 : o->think_open ? 1 : -1;
    for (int k = 0; k < o->n_stop; k++) {
        size_t n = strlen(o->stop[k]);
        if (n > a->stop_max) a->stop_max = n;
    }
}

void answer_free(answer *a) {
    free(a->text);
    free(a->call_name);
    free(a->param);
    a->text = a->call_name = a->param = NULL;
}

/* ---------------------------------------------------------------- tool calls */

static bool is_space(char c) { return c == '\n' || c == ' ' || c == '\t' || c == '\r'; }

static char *trimmed(const char *s, size_t n) {
    while (n && is_space(*s)) s++, n--;
    while (n && is_space(s[n - 1])) n--;
    char *r = xmalloc(n + 1);
    memcpy(r, s, n);
    r[n] = 0;
    return r;
}

/* the JSON-schema type of parameter param of tool name, or NULL */
static const char *param_type(const cJSON *tools, const char *name, const char *param) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *fn = f ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
        if (!cJSON_IsString(fn) || strcmp(fn->valuestring, name)) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "parameters"), "properties");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, param), "type");
        return cJSON_IsString(ty) ? ty->valuestring : NULL;
    }
    return NULL;
}

/* Qwen3's {"name": ..., "arguments": {...}} body: the name and the arguments' JSON text
 * (both the caller's to free), or false when it is not one */
static bool call_json(const char *s, size_t n, char **name_out, char **args_out) {
    char *body = trimmed(s, n);
    cJSON *j = body[0] == '{' ? cJSON_Parse(body) : NULL;
    free(body);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    /* arguments written as a string (OpenAI's form) count when the string is a JSON object:
     * the calls this hands on carry an object, which Anthropic's tool_use input must be */
    cJSON *inner = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    const bool ok = cJSON_IsString(name) && name->valuestring[0] && (!args || cJSON_IsObject(args) || cJSON_IsObject(inner));
    if (ok) {
        *name_out = xstrdup(name->valuestring);
        *args_out = !args ? xstrdup("{}") : cJSON_PrintUnformatted(inner ? inner : args);
    }
    cJSON_Delete(inner);
    cJSON_Delete(j);
    return ok;
}

/* ---------------------------------------------------------------- the split */

static void emit(answer *a, answer_part part, const char *s, size_t n) {
    if (n) a->sink(a->cls, part, s, n);
}

/* the bytes at the end of p[0..n) that could begin tag: how many to hold back */
static size_t partial_tag(const char *p, size_t n, const char *tag, size_t tag_len) {
    for (size_t k = tag_len - 1; k > 0; k--)
        if (k <= n && !memcmp(p + n - k, tag, k)) return k;
    return 0;
}

/* s[0..n) as the inside of a JSON string, escaped as cJSON prints one */
static void emit_escaped(answer *a, const char *s, size_t n) {
    char out[256];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        /* a piece ends between characters (before a byte that is no continuation byte; a run
         * of them longer than a character's is cut anyway) */
        if ((k + 12 > sizeof out && (c & 0xc0) != 0x80) || k + 8 > sizeof out) { emit(a, ANSWER_CALL_ARGS, out, k); k = 0; }
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b" : c == '\f' ? "\\f"
                          : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
        if (esc) { memcpy(out + k, esc, 2); k += 2; }
        else if (c < 32) k += (size_t)snprintf(out + k, sizeof out - k, "\\u%04x", c);
        else out[k++] = (char)c;
    }
    emit(a, ANSWER_CALL_ARGS, out, k);
}

/* the next member's start: `{"name":` or `,"name":` */
static void emit_key(answer *a, const char *name) {
    emit(a, ANSWER_CALL_ARGS, a->args_open ? "," : "{", 1);
    a->args_open = true;
    emit(a, ANSWER_CALL_ARGS, "\"", 1);
    emit_escaped(a, name, strlen(name));
    emit(a, ANSWER_CALL_ARGS, "\":", 2);
}

/* the arguments closed: "}" (or "{}") */
static void close_args(answer *a) {
    emit(a, ANSWER_CALL_ARGS, a->args_open ? "}" : "{}", a->args_open ? 1 : 2);
    free(a->param);
    a->param = NULL;
    a->call = CALL_TAIL;
}

static void end_call(answer *a) {
    a->sink(a->cls, ANSWER_CALL_END, "", 0);
    free(a->call_name);
    a->call_name = NULL;
    a->call = CALL_NONE;
    a->args_open = false;
    a->skip_nl = true;
}

/* one_call: the answer ends at the call just closed (the text cut there, as at a stop
 * string, which cannot lie inside the call: the call would not have closed) */
static bool one_call_end(answer *a) {
    if (!a->o.one_call) return false;
    a->len = a->emitted;
    a->text[a->len] = 0;
    a->finished = true;
    a->call_ended = true;
    a->stop_word = NULL;
    return true;
}

/* how many bytes p[0..n) starts with of tag: n when all of p could begin it, the tag's length
 * when p begins with it, 0 when it cannot be it */
static size_t tag_at(const char *p, size_t n, const char *tag) {
    const size_t tl = strlen(tag), m = n < tl ? n : tl;
    return memcmp(p, tag, m) ? 0 : m;
}

/* `<prefix NAME>` at p (prefix matched): NAME's end ('>') or NULL: none yet (*bad: it cannot
 * be a name, a '<' or a newline came first) */
static const char *name_end(const char *p, size_t n, size_t prefix, bool *bad) {
    *bad = false;
    for (size_t i = prefix; i < n; i++) {
        if (p[i] == '>') return p + i;
        if (p[i] == '<' || p[i] == '\n') { *bad = true; return NULL; }
    }
    return NULL;
}

/* One step of a Qwen3.5 call at p[0..n) (a->emitted): the rest of its block, whole, up to its
 * </tool_call> (the caller steps past that), so nothing waits for more text. */
static void call_step(answer *a, const char *p, size_t n) {
    static const char FN_CLOSE[] = "</function>", PARAM_OPEN[] = "<parameter=", PARAM_CLOSE[] = "</parameter>";
    if (a->call == CALL_PARAMS) { /* between parameters */
        size_t ws = 0;
        while (ws < n && is_space(p[ws])) ws++;
        a->emitted += ws;
        p += ws, n -= ws;
        if (!n) {
            close_args(a);
            end_call(a);
            return;
        }
        size_t m = tag_at(p, n, FN_CLOSE);
        if (m == STR_LEN(FN_CLOSE)) {
            a->emitted += m;
            close_args(a);
            return;
        }
        m = tag_at(p, n, PARAM_OPEN);
        if (m == STR_LEN(PARAM_OPEN)) {
            bool bad;
            const char *gt = name_end(p, n, m, &bad);
            if (gt) {
                a->param = trimmed(p + m, (size_t)(gt - p) - m);
                const char *ty = param_type(a->o.tools, a->call_name, a->param);
                a->param_text = ty && !strcmp(ty, "string");
                a->emitted += (size_t)(gt - p) + 1;
                a->call = CALL_VALUE;
                return;
            }
        }
        close_args(a); /* anything else ends the arguments */
        return;
    }
    if (a->call == CALL_VALUE) { /* a parameter's value, up to </parameter> */
        const char *end = memmem(p, n, PARAM_CLOSE, STR_LEN(PARAM_CLOSE));
        const char *fn = end ? NULL : memmem(p, n, FN_CLOSE, STR_LEN(FN_CLOSE)); /* no </parameter> */
        const size_t len = end ? (size_t)(end - p) : fn ? (size_t)(fn - p) : n;
        emit_key(a, a->param);
        if (a->param_text) { /* text, less its leading and trailing blanks (a NUL byte kept) */
            size_t v0 = 0, v1 = len;
            while (v0 < v1 && is_space(p[v0])) v0++;
            while (v1 > v0 && is_space(p[v1 - 1])) v1--;
            emit(a, ANSWER_CALL_ARGS, "\"", 1);
            emit_escaped(a, p + v0, v1 - v0);
            emit(a, ANSWER_CALL_ARGS, "\"", 1);
        } else { /* JSON where it parses */
            char *val = trimmed(p, len);
            cJSON *v = cJSON_Parse(val);
            if (!v) v = cJSON_CreateString(val);
            char *js = cJSON_PrintUnformatted(v);
            emit(a, ANSWER_CALL_ARGS, js, strlen(js));
            free(js);
            cJSON_Delete(v);
            free(val);
        }
        a->emitted += len + (end ? STR_LEN(PARAM_CLOSE) : 0);
        free(a->param);
        a->param = NULL;
        a->call = CALL_PARAMS;
        return;
    }
    /* CALL_TAIL: what follows </function> up to </tool_call> is dropped */
    a->emitted += n;
    end_call(a);
}

/* Hands out text [emitted, safe). */
static void split(answer *a, size_t safe) {
    while (a->emitted < safe) {
        if (a->skip_nl && a->emitted < safe) { /* the newlines after a closing tag, however they arrive */
            if (a->text[a->emitted] == '\n') { a->emitted++; continue; }
            a->skip_nl = false;
        }
        const char *p = a->text + a->emitted;
        const size_t n = safe - a->emitted;
        if (a->think < 0) { /* does the text begin with <think>? */
            if (n < STR_LEN(THINK_OPEN) && !memcmp(p, THINK_OPEN, n) && !a->finished) return;
            if (n >= STR_LEN(THINK_OPEN) && !memcmp(p, THINK_OPEN, STR_LEN(THINK_OPEN))) {
                a->emitted += STR_LEN(THINK_OPEN);
                a->think = 1;
            } else {
                a->think = 0;
            }
            continue;
        }
        if (a->think == 1) {
            const char *end = memmem(p, n, THINK_CLOSE, STR_LEN(THINK_CLOSE));
            if (end) {
                emit(a, ANSWER_REASONING, p, (size_t)(end - p));
                a->emitted += (size_t)(end - p) + STR_LEN(THINK_CLOSE);
                a->skip_nl = true;
                a->think = 0;
                continue;
            }
            const size_t keep = a->finished ? 0 : partial_tag(p, n, THINK_CLOSE, STR_LEN(THINK_CLOSE));
            emit(a, ANSWER_REASONING, p, n - keep);
            a->emitted += n - keep;
            return;
        }
        if (!a->o.tools) {
            emit(a, ANSWER_CONTENT, p, n);
            a->emitted = safe;
            return;
        }
        const char *at = memmem(p, n, CALL_OPEN, STR_LEN(CALL_OPEN));
        if (!at) {
            const size_t keep = a->finished ? 0 : partial_tag(p, n, CALL_OPEN, STR_LEN(CALL_OPEN));
            emit(a, ANSWER_CONTENT, p, n - keep);
            a->emitted += n - keep;
            return;
        }
        emit(a, ANSWER_CONTENT, p, (size_t)(at - p));
        a->emitted += (size_t)(at - p);
        /* a call is handed out only once its block is closed: one cut off (by the length
         * limit, a stop string or the model's end) is no call, its text stays content */
        const char *body = at + STR_LEN(CALL_OPEN);
        const size_t avail = safe - (size_t)(body - a->text);
        /* searched from where the last push's search left off (a long call comes token by token) */
        const size_t from = a->call_scan > (size_t)(body - a->text) ? a->call_scan - (size_t)(body - a->text) : 0;
        const char *end = from < avail ? memmem(body + from, avail - from, CALL_CLOSE, STR_LEN(CALL_CLOSE)) : NULL;
        if (!end && !a->finished) { /* the call is still coming */
            a->call_scan = safe > STR_LEN(CALL_CLOSE) ? safe - (STR_LEN(CALL_CLOSE) - 1) : 0;
            return;
        }
        if (!end) {
            emit(a, ANSWER_CONTENT, at, safe - (size_t)(at - a->text));
            a->emitted = safe;
            return;
        }
        const size_t body_len = (size_t)(end - body), whole = STR_LEN(CALL_OPEN) + body_len + STR_LEN(CALL_CLOSE);
        size_t ws = 0;
        while (ws < body_len && is_space(body[ws])) ws++;
        /* Qwen3.5's <function=NAME>, then its parameters */
        static const char FN_OPEN[] = "<function=";
        if (tag_at(body + ws, body_len - ws, FN_OPEN) == STR_LEN(FN_OPEN)) {
            bool bad;
            const char *gt = name_end(body + ws, body_len - ws, STR_LEN(FN_OPEN), &bad);
            char *name = gt ? trimmed(body + ws + STR_LEN(FN_OPEN), (size_t)(gt - body - ws) - STR_LEN(FN_OPEN)) : NULL;
            if (name && name[0]) {
                a->n_calls++;
                a->sink(a->cls, ANSWER_CALL_START, name, strlen(name));
                a->call_name = name;
                a->call = CALL_PARAMS;
                a->emitted = (size_t)(gt + 1 - a->text);
                const size_t body_end = (size_t)(end - a->text);
                while (a->call) call_step(a, a->text + a->emitted, body_end - a->emitted);
                a->emitted = body_end + STR_LEN(CALL_CLOSE);
                if (one_call_end(a)) return;
                continue;
            }
            free(name);
        }
        /* else Qwen3's JSON, or content */
        char *name, *args;
        if (call_json(body, body_len, &name, &args)) {
            a->n_calls++;
            a->sink(a->cls, ANSWER_CALL_START, name, strlen(name));
            emit(a, ANSWER_CALL_ARGS, args, strlen(args));
            a->sink(a->cls, ANSWER_CALL_END, "", 0);
            free(name);
            free(args);
            a->skip_nl = true;
            a->emitted += whole;
            if (one_call_end(a)) return;
            continue;
        }
        emit(a, ANSWER_CONTENT, at, whole);
        a->emitted += whole;
    }
}

bool answer_push(answer *a, const char *s, size_t n, bool finished) {
    if (a->finished) return false;
    if (a->len + n + 1 > a->cap) {
        a->cap = (a->len + n + 1) * 2;
        a->text = xrealloc(a->text, a->cap);
    }
    memcpy(a->text + a->len, s, n);
    a->len += n;
    a->text[a->len] = 0;
    a->finished = finished;
    /* the stop string that ends first in the new text (of two ending together, the longer):
     * the one a stream meets first, whatever its pieces, so that a whole text stops where
     * its stream would (the earliest start would not: "ab" ends after "b" of "ab" and "b") */
    const size_t from = a->scanned > a->stop_max ? a->scanned - a->stop_max : 0;
    size_t cut = SIZE_MAX, cut_end = SIZE_MAX;
    for (int k = 0; k < a->o.n_stop; k++) {
        const size_t sl = strlen(a->o.stop[k]);
        const char *hit = sl ? memmem(a->text + from, a->len - from, a->o.stop[k], sl) : NULL;
        if (!hit) continue;
        const size_t at = (size_t)(hit - a->text);
        if (at + sl < cut_end || (at + sl == cut_end && at < cut)) {
            cut = at;
            cut_end = at + sl;
            a->stop_word = a->o.stop[k];
        }
    }
    bool stopped = false;
    if (cut != SIZE_MAX) {
        a->len = cut;
        a->text[cut] = 0;
        a->finished = stopped = true;
    }
    a->scanned = a->len;
    size_t safe = a->len;
    if (!a->finished) { /* hold back what could begin a stop string */
        size_t hold = 0;
        for (int k = 0; k < a->o.n_stop; k++) {
            const size_t h = partial_tag(a->text, a->len, a->o.stop[k], strlen(a->o.stop[k]));
            if (h > hold) hold = h;
        }
        safe = a->len - hold;
    }
    if (safe > a->emitted || a->finished) split(a, safe > a->emitted ? safe : a->emitted);
    return stopped || a->call_ended;
}
