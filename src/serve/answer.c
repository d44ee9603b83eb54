/* answer.c: generated text into reasoning, content and tool calls (answer.h). */
#include "serve/answer.h"
#include "base/util.h"

#include <stdint.h>
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
    a->text = NULL;
}

/* ---------------------------------------------------------------- tool calls */

static char *trimmed(const char *s, size_t n) {
    while (n && (*s == '\n' || *s == ' ' || *s == '\t' || *s == '\r')) s++, n--;
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
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

static cJSON *call_of(const char *name, const cJSON *args) {
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "name", name);
    char *s = !args ? xstrdup("{}") : cJSON_IsString(args) ? xstrdup(args->valuestring) : cJSON_PrintUnformatted(args);
    cJSON_AddStringToObject(out, "arguments", s);
    free(s);
    return out;
}

/* Qwen3.5's <function=NAME><parameter=P>value</parameter>...</function>, or NULL */
static cJSON *call_xml(const cJSON *tools, const char *body) {
    const char *name0 = body + STR_LEN("<function="), *gt = strchr(name0, '>');
    if (!gt) return NULL;
    char *name = trimmed(name0, (size_t)(gt - name0));
    cJSON *args = cJSON_CreateObject(), *out = NULL;
    const char *q = gt + 1;
    bool ok = name[0] != 0;
    for (const char *ps; ok && (ps = strstr(q, "<parameter="));) {
        const char *pgt = strchr(ps, '>'), *pe = pgt ? strstr(pgt, "</parameter>") : NULL;
        const char *fe = strstr(q, "</function>");
        if (fe && fe < ps) break; /* parameters end with the function */
        if (!pgt || !pe) { ok = false; break; }
        char *pname = trimmed(ps + STR_LEN("<parameter="), (size_t)(pgt - ps) - STR_LEN("<parameter="));
        char *val = trimmed(pgt + 1, (size_t)(pe - pgt - 1));
        const char *ty = param_type(tools, name, pname);
        cJSON *v = ty && !strcmp(ty, "string") ? NULL : cJSON_Parse(val);
        cJSON_AddItemToObject(args, pname, v ? v : cJSON_CreateString(val));
        free(pname);
        free(val);
        q = pe + STR_LEN("</parameter>");
    }
    if (ok && strstr(q, "</function>")) out = call_of(name, args);
    cJSON_Delete(args);
    free(name);
    return out;
}

/* One <tool_call> body in either format; NULL when it is neither. */
static cJSON *call_parse(const cJSON *tools, const char *s, size_t n) {
    char *body = trimmed(s, n);
    cJSON *out = NULL;
    if (body[0] == '{') { /* Qwen3's JSON */
        cJSON *j = cJSON_Parse(body);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
        if (cJSON_IsString(name) && name->valuestring[0] && (!args || cJSON_IsObject(args) || cJSON_IsString(args)))
            out = call_of(name->valuestring, args);
        cJSON_Delete(j);
    } else if (!strncmp(body, "<function=", STR_LEN("<function="))) {
        out = call_xml(tools, body);
    }
    free(body);
    return out;
}

/* ---------------------------------------------------------------- the split */

static void emit(answer *a, answer_part part, const char *s, size_t n) {
    if (n) a->sink(a->cls, part, s, n, NULL);
}

/* the bytes at the end of p[0..n) that could begin tag: how many to hold back */
static size_t partial_tag(const char *p, size_t n, const char *tag, size_t tag_len) {
    for (size_t k = tag_len - 1; k > 0; k--)
        if (k <= n && !memcmp(p + n - k, tag, k)) return k;
    return 0;
}

/* Hands out text [emitted, safe). */
static void split(answer *a, size_t safe) {
    while (a->emitted < safe) {
        if (a->skip_nl) { /* the newlines after a closing tag, however they arrive */
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
        const char *body = at + STR_LEN(CALL_OPEN);
        const size_t avail = safe - (size_t)(body - a->text);
        const char *end = memmem(body, avail, CALL_CLOSE, STR_LEN(CALL_CLOSE));
        if (!end && !a->finished) return; /* the call is still coming */
        const size_t body_len = end ? (size_t)(end - body) : avail;
        const size_t whole = STR_LEN(CALL_OPEN) + body_len + (end ? STR_LEN(CALL_CLOSE) : 0);
        cJSON *call = call_parse(a->o.tools, body, body_len);
        if (call) {
            a->n_calls++;
            a->sink(a->cls, ANSWER_CALL, NULL, 0, call);
        } else {
            emit(a, ANSWER_CONTENT, at, whole);
        }
        a->emitted += whole;
        a->skip_nl = call != NULL;
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
    /* the earliest stop string that ends in the new text */
    const size_t from = a->scanned > a->stop_max ? a->scanned - a->stop_max : 0;
    size_t cut = SIZE_MAX;
    for (int k = 0; k < a->o.n_stop; k++) {
        const size_t sl = strlen(a->o.stop[k]);
        const char *hit = sl ? memmem(a->text + from, a->len - from, a->o.stop[k], sl) : NULL;
        if (hit && (size_t)(hit - a->text) < cut) { cut = (size_t)(hit - a->text); a->stop_word = a->o.stop[k]; }
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
    return stopped;
}
