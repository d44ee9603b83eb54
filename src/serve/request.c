/* request.c: the endpoints' bodies into checked requests (request.h), moved out of api.c
 * so that they run, and are fuzzed (tests/fuzz/fuzz_request.c), without an engine or a
 * connection. Nothing here blocks or touches the scheduler. */
#include "serve/request.h"
#include "serve/sched.h"
#include "serve/grammar.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

void buf_add(buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void buf_str(buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* One level of the path nul_path is at: an object's key or an array's index. */
typedef struct path_frame {
    bool obj;
    int64_t index;
    const char *key;
    size_t klen;
} path_frame;

/* The JSON path ("messages"[0].content) of the first string of a valid JSON text that holds
 * the escape \u0000, into out; false when none does. cJSON keeps C strings, so such a
 * string would end at the NUL and lose the rest unseen (llama-server keeps it): refused. */
static bool nul_path(const char *s, size_t n, char *out, size_t cap) {
    path_frame *st = NULL;
    int depth = 0, room = 0;
    bool want_key = false, found = false;
    for (size_t i = 0; i < n && !found; i++) {
        const char c = s[i];
        if (c == '{' || c == '[') {
            if (depth == room) st = xrealloc(st, sizeof *st * (size_t)(room = room * 2 + 16));
            st[depth++] = (path_frame){.obj = c == '{'};
            want_key = c == '{';
        } else if (c == '}' || c == ']') {
            if (depth > 0) depth--;
            want_key = false;
        } else if (c == ',') {
            if (depth > 0 && st[depth - 1].obj) want_key = true;
            else if (depth > 0) st[depth - 1].index++;
        } else if (c == ':') {
            want_key = false;
        } else if (c == '"') {
            const size_t b = ++i;
            bool nul = false;
            for (; i < n && s[i] != '"'; i++) {
                if (s[i] != '\\' || i + 1 >= n) continue;
                if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) nul = true;
                i++; /* the escaped character (a quote or a backslash is not the end) */
            }
            if (want_key && depth > 0) {
                st[depth - 1].key = s + b;
                st[depth - 1].klen = i - b;
            }
            if (!nul) continue;
            found = true;
            size_t o = 0;
            out[0] = 0;
            for (int d = 0; d < depth && o < cap; d++) {
                const int kl = st[d].klen > 40 ? 40 : (int)st[d].klen;
                if (!st[d].obj) o += (size_t)snprintf(out + o, cap - o, "[%lld]", (long long)st[d].index);
                else if (want_key && d == depth - 1) o += (size_t)snprintf(out + o, cap - o, "%sa key", d ? "." : "");
                else if (d == 0) o += (size_t)snprintf(out + o, cap - o, "\"%.*s\"", kl, st[d].key);
                else o += (size_t)snprintf(out + o, cap - o, ".%.*s", kl, st[d].key);
            }
            if (depth == 0) snprintf(out, cap, "the body");
        }
    }
    free(st);
    return found;
}

cJSON *req_body(const char *body, size_t len, herr *e) {
    /* A NUL byte is no JSON (RFC 8259: control characters are escaped in strings); cJSON
     * would read a C string up to it */
    const char *z = memchr(body, 0, len);
    if (z) {
        herr_set(e, "the body is not valid JSON (a NUL byte at byte %zu)", (size_t)(z - body));
        return NULL;
    }
    /* the end pointer of this parse, not cJSON_GetErrorPtr(): that one is a global other
     * connections' threads write too */
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!j) {
        const size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        herr_set(e, "the body is not valid JSON (near byte %zu)", at);
        return NULL;
    }
    while (end && end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end && end < body + len) {
        cJSON_Delete(j);
        herr_set(e, "the body is not valid JSON (more after the value, at byte %zu)", (size_t)(end - body));
        return NULL;
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        herr_set(e, "the body must be a JSON object");
        return NULL;
    }
    char path[256];
    if (memmem(body, len, "\\u0000", 6) && nul_path(body, len, path, sizeof path)) {
        cJSON_Delete(j);
        herr_set(e, "%s holds \\u0000 (a NUL character), which is not supported", path);
        return NULL;
    }
    return j;
}

/* Optional fields: 0 absent (or null), 1 read, -1 wrong (e set, naming the field). */
static int get_num(const cJSON *j, const char *name, double lo, double hi, double *out, herr *e) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsNumber(x)) return herr_set(e, "\"%s\" must be a number", name);
    if (!(x->valuedouble >= lo && x->valuedouble <= hi))
        return herr_set(e, "\"%s\" is %g, outside [%g, %g]", name, x->valuedouble, lo, hi);
    *out = x->valuedouble;
    return 1;
}

static int get_int(const cJSON *j, const char *name, int64_t lo, int64_t hi, int64_t *out, herr *e) {
    double v;
    int rc = get_num(j, name, (double)lo, (double)hi, &v, e);
    if (rc <= 0) return rc;
    if (v != floor(v)) return herr_set(e, "\"%s\" must be a whole number, got %g", name, v);
    *out = (int64_t)v;
    return 1;
}

static int get_bool(const cJSON *j, const char *name, bool *out, herr *e) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsBool(x)) return herr_set(e, "\"%s\" must be true or false", name);
    *out = cJSON_IsTrue(x);
    return 1;
}

/* llama-server's "samplers": the order of the sampling stages, an array of names or a string
 * of their letters. hearth's stages are penalties (e), top_k (k), top_p (p), min_p (m) and
 * temperature (t), in any order (a stage left out is not applied; without temperature the
 * draw is at temperature 1, as llama.cpp does); dry, typ_p, xtc, top_n_sigma and infill
 * are no-ops at the only values hearth takes and are skipped. The penalties run on the whole
 * vocabulary, so they must come before the other stages. */
static int req_samplers(const cJSON *j, sampler_opts *so, herr *e) {
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(j, "samplers");
    if (!sm || cJSON_IsNull(sm)) return 0;
    static const struct { const char *name; char c; } names[] = {
        {"penalties", 'e'}, {"top_k", 'k'}, {"top-k", 'k'}, {"top_p", 'p'}, {"top-p", 'p'}, {"nucleus", 'p'},
        {"min_p", 'm'}, {"min-p", 'm'}, {"temperature", 't'}, {"temp", 't'}, {"dry", 'd'}, {"typ_p", 'y'},
        {"typ-p", 'y'}, {"typical_p", 'y'}, {"typical-p", 'y'}, {"typical", 'y'}, {"typ", 'y'}, {"xtc", 'x'},
        {"top_n_sigma", 's'}, {"top-n-sigma", 's'}, {"infill", 'i'},
    };
    char seq[64];
    int n = 0;
    if (cJSON_IsString(sm)) {
        for (const char *q = sm->valuestring; *q; q++) {
            if (!strchr("ekpmtdyxsi", *q))
                return herr_set(e, "\"samplers\": '%c' is no sampler letter (e k p m t, and d y x s i as no-ops)", *q);
            if (n == (int)sizeof seq) return herr_set(e, "\"samplers\" is longer than %d", (int)sizeof seq);
            seq[n++] = *q;
        }
    } else if (cJSON_IsArray(sm)) {
        const cJSON *x;
        int k = 0;
        cJSON_ArrayForEach(x, sm) {
            size_t t = 0;
            while (cJSON_IsString(x) && t < sizeof names / sizeof names[0] && strcmp(names[t].name, x->valuestring)) t++;
            if (!cJSON_IsString(x) || t == sizeof names / sizeof names[0])
                return herr_set(e, "\"samplers\"[%d] is no sampler name (penalties, top_k, top_p, min_p, temperature)", k);
            if (n == (int)sizeof seq) return herr_set(e, "\"samplers\" is longer than %d", (int)sizeof seq);
            seq[n++] = names[t].c;
            k++;
        }
    } else {
        return herr_set(e, "\"samplers\" must be an array of names or a string of letters");
    }
    bool pen = false;
    int m = 0;
    for (int k = 0; k < n; k++) {
        const char c = seq[k];
        if (c == 'e') {
            if (m > 0) return herr_set(e, "\"samplers\": penalties after another stage is not supported (only first)");
            pen = true;
        } else if (strchr("kpmt", c)) {
            if (memchr(so->order, c, (size_t)m))
                return herr_set(e, "\"samplers\" names a stage twice");
            so->order[m++] = c;
        }
    }
    so->order[m] = 0;
    so->ordered = true;
    if (!pen) {
        so->repeat_penalty = 1;
        so->presence_penalty = so->frequency_penalty = 0;
    }
    return 0;
}

/* The sampling and length fields all generating endpoints share, llama-server's names and
 * OpenAI's. Fields that would change the answer and are not done are refused by name. */
int req_params(const req_ctx *x, const cJSON *j, api_kind kind, uint64_t seed, gen_params *g, herr *e) {
    *g = (gen_params){.so = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f}, .n_predict = x->n_predict,
                      .slot = -1, .cache_prompt = true};
    if (x->has_defaults) { /* the server's (--temp, --top-k, --top-p, --min-p) */
        g->so.temp = x->so_default.temp;
        g->so.top_k = x->so_default.top_k;
        g->so.top_p = x->so_default.top_p;
        g->so.min_p = x->so_default.min_p;
    }
    g->so.seed = x->seed_set ? x->seed : seed;
    double v;
    int64_t i;
    int rc;
    if ((rc = get_num(j, "temperature", 0, 100, &v, e)) < 0) return -1;
    if (rc) g->so.temp = (float)v;
    if ((rc = get_int(j, "top_k", 0, 1 << 30, &i, e)) < 0) return -1;
    if (rc) g->so.top_k = (int32_t)i;
    if ((rc = get_num(j, "top_p", 0, 1, &v, e)) < 0) return -1;
    if (rc) g->so.top_p = (float)v;
    if ((rc = get_num(j, "min_p", 0, 1, &v, e)) < 0) return -1;
    if (rc) g->so.min_p = (float)v;
    if ((rc = get_int(j, "seed", -1, INT64_MAX / 2, &i, e)) < 0) return -1;
    if (rc && i >= 0) g->so.seed = (uint64_t)i;
    static const char *const lens[] = {"n_predict", "max_tokens", "max_completion_tokens"};
    for (int k = 0; k < 3; k++) {
        if ((rc = get_int(j, lens[k], -1, x->n_ctx, &i, e)) < 0) return -1;
        if (rc) g->n_predict = i;
    }
    if (get_bool(j, "ignore_eos", &g->ignore_eos, e) < 0 || get_bool(j, "stream", &g->stream, e) < 0) return -1;
    if (get_bool(j, "return_tokens", &g->return_tokens, e) < 0 || get_bool(j, "cache_prompt", &g->cache_prompt, e) < 0)
        return -1;
    if ((rc = get_int(j, "id_slot", -1, 1 << 20, &i, e)) < 0) return -1;
    if (rc) g->slot = (int)i;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return herr_set(e, "\"stream_options\" must be an object");
        if (get_bool(so, "include_usage", &g->include_usage, e) < 0) return -1;
    }
    /* llama.cpp's penalties over the last repeat_last_n ids (-1: the whole context) */
    g->so.repeat_penalty = 1;
    g->so.repeat_last_n = 64;
    if ((rc = get_num(j, "repeat_penalty", 0, 100, &v, e)) < 0) return -1;
    if (rc) g->so.repeat_penalty = (float)v;
    if ((rc = get_num(j, "presence_penalty", -2, 2, &v, e)) < 0) return -1;
    if (rc) g->so.presence_penalty = (float)v;
    if ((rc = get_num(j, "frequency_penalty", -2, 2, &v, e)) < 0) return -1;
    if (rc) g->so.frequency_penalty = (float)v;
    if ((rc = get_int(j, "repeat_last_n", -1, x->n_ctx, &i, e)) < 0) return -1;
    if (rc) g->so.repeat_last_n = (int32_t)(i < 0 ? x->n_ctx : i);
    if ((rc = get_int(j, "n", 1, 1 << 20, &i, e)) < 0) return -1;
    if (rc && i != 1) return herr_set(e, "\"n\" other than 1 is not supported");
    /* log-probabilities: chat's logprobs + top_logprobs, or the legacy completions' integer */
    g->top_logprobs = -1;
    if (kind == API_OAI_COMPLETION) {
        if ((rc = get_int(j, "logprobs", 0, 5, &i, e)) < 0) return -1;
        if (rc) g->top_logprobs = (int)i;
    } else {
        bool lp = false;
        if (get_bool(j, "logprobs", &lp, e) < 0) return -1;
        if ((rc = get_int(j, "top_logprobs", 0, SCHED_MAX_TOP, &i, e)) < 0) return -1;
        if (rc && !lp) return herr_set(e, "\"top_logprobs\" needs \"logprobs\": true");
        if (lp) g->top_logprobs = rc ? (int)i : 0;
        if (lp && kind != API_CHAT && kind != API_COMPLETION)
            return herr_set(e, "\"logprobs\" is not supported on this endpoint");
    }
    /* sampling and output controls of OpenAI's and llama-server's that would change the
     * answer and are not done: refused by name when set to anything but their neutral value */
    static const struct { const char *name; double neutral; } knobs[] = {
        {"typical_p", 1}, {"mirostat", 0}, {"dry_multiplier", 0}, {"xtc_probability", 0}, {"top_n_sigma", -1},
        {"best_of", 1}, {"dynatemp_range", 0},
    };
    for (size_t k = 0; k < sizeof knobs / sizeof knobs[0]; k++) {
        const cJSON *kv = cJSON_GetObjectItemCaseSensitive(j, knobs[k].name);
        if (kv && !cJSON_IsNull(kv) && !(cJSON_IsNumber(kv) && kv->valuedouble == knobs[k].neutral))
            return herr_set(e, "\"%s\" is not supported yet (only %g)", knobs[k].name, knobs[k].neutral);
    }
    static const char *const unset[] = {"suffix"};
    for (size_t k = 0; k < sizeof unset / sizeof unset[0]; k++) {
        const cJSON *uv = cJSON_GetObjectItemCaseSensitive(j, unset[k]);
        if (uv && !cJSON_IsNull(uv) && !(cJSON_IsString(uv) && !uv->valuestring[0]))
            return herr_set(e, "\"%s\" is not supported yet", unset[k]);
    }
    bool echo = false;
    if (get_bool(j, "echo", &echo, e) < 0) return -1;
    if (echo) return herr_set(e, "\"echo\" is not supported yet");
    /* grammar, json_schema, response_format, tool_choice, logit_bias, n_probs (constrain.c);
     * tool_choice "none" also leaves the tools out of the prompt (req_chat_prompt) */
    if (req_constraints(x, j, kind, g, e) < 0) return -1;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (st && !cJSON_IsNull(st)) {
        if (cJSON_IsString(st)) {
            if (st->valuestring[0]) g->stop[g->n_stop++] = xstrdup(st->valuestring);
        } else if (cJSON_IsArray(st)) {
            const cJSON *s;
            cJSON_ArrayForEach(s, st) {
                if (!cJSON_IsString(s)) return herr_set(e, "\"stop\" must be a string or an array of strings");
                if (g->n_stop == MAX_STOP) return herr_set(e, "\"stop\" has more than %d strings", MAX_STOP);
                if (s->valuestring[0]) g->stop[g->n_stop++] = xstrdup(s->valuestring);
            }
        } else {
            return herr_set(e, "\"stop\" must be a string or an array of strings");
        }
        for (int k = 0; k < g->n_stop; k++)
            if (strlen(g->stop[k]) > STOP_MAX_LEN) return herr_set(e, "a \"stop\" string is over %d bytes", STOP_MAX_LEN);
    }
    /* llama-server's n_cmpl: several completions of one prompt, like "n" */
    if ((rc = get_int(j, "n_cmpl", 1, 1 << 20, &i, e)) < 0) return -1;
    if (rc && i != 1) return herr_set(e, "\"n_cmpl\" other than 1 is not supported");
    /* n_keep and n_discard say what a context shift keeps and drops. hearth never shifts the
     * context (llama-server's default since --context-shift went off by default): a request
     * that fills it ends with "length", so these change no answer; they are checked only */
    if (get_int(j, "n_keep", -1, x->n_ctx, &i, e) < 0 || get_int(j, "n_discard", 0, x->n_ctx, &i, e) < 0) return -1;
    /* t_max_predict_ms: generation stops (stop type "limit") once this long has passed since
     * the first token and a newline was generated (llama-server's meaning); api.c enforces it */
    if ((rc = get_num(j, "t_max_predict_ms", 0, 1e12, &v, e)) < 0) return -1;
    if (rc) g->t_max_predict_ms = v;
    /* parallel_tool_calls false: one tool call at most; the answer ends at its </tool_call>
     * (llama-server's grammar of one call ends it there too). true or absent: any number */
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(j, "parallel_tool_calls");
    if (ptc && !cJSON_IsNull(ptc) && !cJSON_IsBool(ptc)) return herr_set(e, "\"parallel_tool_calls\" must be true or false");
    g->one_call = cJSON_IsFalse(ptc);
    if (req_samplers(j, &g->so, e) < 0) return -1;
    (void)kind;
    return 0;
}

void req_params_free(gen_params *g) {
    free(g->prefill);
    g->prefill = NULL;
    for (int k = 0; k < g->n_stop; k++) free(g->stop[k]);
    g->n_stop = 0;
    grammar_free(g->grammar);
    g->grammar = NULL;
    free(g->bias_id);
    free(g->bias);
    g->bias_id = NULL, g->bias = NULL, g->n_bias = 0;
}

int32_t *req_token_ids(const req_ctx *x, const cJSON *arr, const char *what, int64_t *n, herr *e) {
    const int32_t V = tokenizer_n_vocab(x->tok);
    if (!cJSON_IsArray(arr)) {
        herr_set(e, "%s must be an array of token ids", what);
        return NULL;
    }
    int64_t k = 0, len = cJSON_GetArraySize(arr);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(len + 1));
    const cJSON *t;
    cJSON_ArrayForEach(t, arr) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= V) {
            free(ids);
            herr_set(e, "%s[%lld] is no token id in [0, %d)", what, (long long)k, V);
            return NULL;
        }
        ids[k++] = (int32_t)t->valuedouble;
    }
    *n = k;
    return ids;
}

int32_t *req_prompt_ids(const req_ctx *x, const cJSON *pr, int64_t *n, herr *e) {
    if (cJSON_IsString(pr)) {
        return tokenizer_encode_prompt(x->tok, pr->valuestring, strlen(pr->valuestring), true, true, n);
    }
    if (cJSON_IsArray(pr)) return req_token_ids(x, pr, "\"prompt\"", n, e);
    herr_set(e, "\"prompt\" must be a string or an array of token ids");
    return NULL;
}

bool req_tool_choice_none(const cJSON *j) {
    const cJSON *tch = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    const cJSON *ty = cJSON_IsObject(tch) ? cJSON_GetObjectItemCaseSensitive(tch, "type") : tch;
    return cJSON_IsString(ty) && !strcmp(ty->valuestring, "none");
}

/* ---------------------------------------------------------------- the chat prompts' ids */

#define MEMO_N 16                       /* prompts kept */
#define MEMO_BYTES ((size_t)64 << 20)   /* their text and ids, at most */

typedef struct memo_item {
    char *text;
    size_t len;
    int32_t *ids;
    int64_t n;
    uint64_t used;          /* the memo's clock at its last use */
    int refs;               /* 1 while in the memo, +1 per encode reading it */
} memo_item;

struct req_memo {
    pthread_mutex_t mu;
    memo_item *it[MEMO_N];
    int n;
    size_t bytes;
    uint64_t clock;
};

req_memo *req_memo_new(void) {
    req_memo *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

static size_t item_bytes(const memo_item *it) { return it->len + sizeof(int32_t) * (size_t)it->n; }

static void item_unref(memo_item *it) {
    if (--it->refs > 0) return;
    free(it->text);
    free(it->ids);
    free(it);
}

void req_memo_free(req_memo *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) item_unref(m->it[i]);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* bytes a and b share from the start (memcmp a block at a time, then bytes) */
static size_t common_bytes(const char *a, size_t na, const char *b, size_t nb) {
    const size_t most = na < nb ? na : nb;
    size_t i = 0;
    while (i + 4096 <= most && !memcmp(a + i, b + i, 4096)) i += 4096;
    while (i < most && a[i] == b[i]) i++;
    return i;
}

/* A chat prompt's ids: from the memo's prompt that shares the most with it, when there is
 * one, the rest encoded; then it is kept (the least recently used going past MEMO_N or
 * MEMO_BYTES). */
static int32_t *chat_encode(const req_ctx *x, const char *text, size_t len, int64_t *n) {
    req_memo *m = x->memo;
    if (!m) return tokenizer_encode_alloc(x->tok, text, len, true, n);
    pthread_mutex_lock(&m->mu);
    memo_item *best = NULL;
    size_t best_c = 0;
    for (int i = 0; i < m->n; i++) {
        const size_t c = common_bytes(m->it[i]->text, m->it[i]->len, text, len);
        if (c > best_c) { best = m->it[i]; best_c = c; }
    }
    if (best) best->refs++, best->used = ++m->clock;
    pthread_mutex_unlock(&m->mu);
    int64_t reused;
    int32_t *ids = best ? tokenizer_encode_after(x->tok, text, len, true, best->text, best->len, best->ids, best->n, n, &reused)
                        : tokenizer_encode_alloc(x->tok, text, len, true, n);
    memo_item *it = xcalloc(1, sizeof *it);
    *it = (memo_item){.text = xmalloc(len + 1), .len = len, .ids = xmalloc(sizeof(int32_t) * (size_t)(*n + 1)), .n = *n,
                      .refs = 1};
    memcpy(it->text, text, len);
    memcpy(it->ids, ids, sizeof(int32_t) * (size_t)*n);
    pthread_mutex_lock(&m->mu);
    if (best) item_unref(best);
    it->used = ++m->clock;
    m->it[m->n++] = it;
    m->bytes += item_bytes(it);
    while (m->n > 1 && (m->n > MEMO_N - 1 || m->bytes > MEMO_BYTES)) { /* room for the next */
        int k = 0;
        for (int i = 1; i < m->n; i++)
            if (m->it[i]->used < m->it[k]->used) k = i;
        m->bytes -= item_bytes(m->it[k]);
        item_unref(m->it[k]);
        m->it[k] = m->it[--m->n];
    }
    pthread_mutex_unlock(&m->mu);
    return ids;
}

char *req_chat_prefill(const cJSON *j) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const cJSON *last = cJSON_IsArray(msgs) ? cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1) : NULL;
    const cJSON *role = cJSON_IsObject(last) ? cJSON_GetObjectItemCaseSensitive(last, "role") : NULL;
    const cJSON *tcs = cJSON_IsObject(last) ? cJSON_GetObjectItemCaseSensitive(last, "tool_calls") : NULL;
    if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant") || (cJSON_IsArray(tcs) && cJSON_GetArraySize(tcs) > 0))
        return NULL;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(last, "content"), *part;
    buf b = {0};
    buf_add(&b, "", 0);
    if (cJSON_IsString(c)) buf_str(&b, c->valuestring);
    cJSON_ArrayForEach(part, (cJSON_IsArray(c) ? c : NULL)) {
        const cJSON *tx = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
        if (cJSON_IsString(tx)) buf_str(&b, tx->valuestring);
    }
    return b.p;
}

int req_chat_prompt(const req_ctx *x, const cJSON *j, bool gen_prompt, char **text, int32_t **ids, int64_t *n_ids,
                    int64_t **starts, int *n_starts, herr *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) return herr_set(e, "\"messages\" must be a non-empty array");
    if (get_bool(j, "add_generation_prompt", &gen_prompt, e) < 0) return -1;
    /* a copy the template reads: roles checked, "reasoning" passed on as reasoning_content */
    cJSON *copy = cJSON_CreateArray();
    int k = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
        if (!cJSON_IsString(role)) { cJSON_Delete(copy); return herr_set(e, "\"messages\"[%d] needs a string \"role\"", k); }
        static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", NULL};
        int r = 0;
        while (roles[r] && strcmp(roles[r], role->valuestring)) r++;
        if (!roles[r]) {
            cJSON_Delete(copy);
            return herr_set(e, "\"messages\"[%d] has the unknown role \"%.40s\" (system, developer, user, assistant, tool)", k,
                            role->valuestring);
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (content && !cJSON_IsString(content) && !cJSON_IsArray(content) && !cJSON_IsNull(content)) {
            cJSON_Delete(copy);
            return herr_set(e, "\"messages\"[%d].content must be a string or an array of parts", k);
        }
        /* text parts only: an image or audio part would get the template's vision
         * placeholders with no image behind them (a text-only engine) */
        int pk = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, (cJSON_IsArray(content) ? content : NULL)) {
            const cJSON *pt = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
            const cJSON *tx = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
            if (!cJSON_IsString(pt)) {
                cJSON_Delete(copy);
                return herr_set(e, "\"messages\"[%d].content[%d] needs a string \"type\"", k, pk);
            }
            if (strcmp(pt->valuestring, "text")) {
                cJSON_Delete(copy);
                return herr_set(e, "\"messages\"[%d].content[%d] is of type \"%.40s\": only text parts are supported "
                                "(this server reads no images, audio or files)", k, pk, pt->valuestring);
            }
            if (!cJSON_IsString(tx)) {
                cJSON_Delete(copy);
                return herr_set(e, "\"messages\"[%d].content[%d] of type \"text\" needs a string \"text\"", k, pk);
            }
            pk++;
        }
        cJSON *mc = cJSON_Duplicate(m, true);
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(m, "reasoning");
        if (cJSON_IsString(rs) && !cJSON_GetObjectItemCaseSensitive(m, "reasoning_content"))
            cJSON_AddStringToObject(mc, "reasoning_content", rs->valuestring);
        if (r == 1) cJSON_ReplaceItemInObjectCaseSensitive(mc, "role", cJSON_CreateString("system"));
        /* tool calls' arguments arrive as JSON text; templates iterate them as a mapping */
        cJSON *tcs = cJSON_GetObjectItemCaseSensitive(mc, "tool_calls"), *tc;
        cJSON_ArrayForEach(tc, (cJSON_IsArray(tcs) ? tcs : NULL)) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            cJSON *args = fn ? cJSON_GetObjectItemCaseSensitive(fn, "arguments") : NULL;
            cJSON *obj = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
            if (cJSON_IsObject(obj)) cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj);
            else cJSON_Delete(obj);
        }
        cJSON_AddItemToArray(copy, mc);
        k++;
    }
    /* assistant prefill (llama-server's): a last assistant message is continued, not closed.
     * The messages before it are rendered with the generation prompt and its text follows,
     * whatever add_generation_prompt says; one assistant message only, as llama-server */
    char *prefill = req_chat_prefill(j);
    if (prefill) {
        const cJSON *before = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 2);
        const cJSON *brole = before ? cJSON_GetObjectItemCaseSensitive(before, "role") : NULL;
        if (cJSON_IsString(brole) && !strcmp(brole->valuestring, "assistant")) {
            free(prefill);
            cJSON_Delete(copy);
            return herr_set(e, "\"messages\" ends in two assistant messages: only the last one is continued "
                               "(assistant prefill)");
        }
        cJSON_DeleteItemFromArray(copy, cJSON_GetArraySize(copy) - 1);
        gen_prompt = true;
    }
    chat_input in = {.messages = copy, .add_generation_prompt = gen_prompt, .enable_thinking = -1,
                     .bos_token = x->bos_text, .eos_token = x->eos_text};
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) {
            cJSON_Delete(copy);
            free(prefill);
            return herr_set(e, "\"tools\" must be an array");
        }
        /* OpenAI's {"type": "function", "function": {"name", "description"?, "parameters"?}}:
         * a malformed tool would be rendered into the prompt as it is */
        int tk = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *ty = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "type") : NULL;
            const cJSON *fn = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "function") : NULL;
            const cJSON *nm = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
            const cJSON *pa = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "parameters") : NULL;
            const cJSON *de = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "description") : NULL;
            const char *bad = !cJSON_IsObject(t) ? "must be an object"
                              : !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") ? ".type must be \"function\""
                              : !cJSON_IsObject(fn) ? ".function must be an object"
                              : !cJSON_IsString(nm) || !nm->valuestring[0] ? ".function.name must be a non-empty string"
                              : pa && !cJSON_IsNull(pa) && !cJSON_IsObject(pa) ? ".function.parameters must be an object"
                              : de && !cJSON_IsNull(de) && !cJSON_IsString(de) ? ".function.description must be a string"
                              : NULL;
            if (bad) {
                cJSON_Delete(copy);
                free(prefill);
                return herr_set(e, "\"tools\"[%d]%s%s", tk, *bad == '.' ? "" : " ", bad);
            }
            tk++;
        }
        if (cJSON_GetArraySize(tools) > 0 && !req_tool_choice_none(j)) in.tools = tools;
    }
    /* the server's --chat-template-kwargs, the request's own over them, key by key */
    cJSON *extra = x->template_kwargs ? cJSON_Duplicate(x->template_kwargs, true) : NULL;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(j, "chat_template_kwargs"), *kv;
    if (kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw)) {
            cJSON_Delete(copy);
            cJSON_Delete(extra);
            free(prefill);
            return herr_set(e, "\"chat_template_kwargs\" must be an object");
        }
        if (!extra) extra = cJSON_CreateObject();
        cJSON_ArrayForEach(kv, kw) {
            cJSON_DeleteItemFromObjectCaseSensitive(extra, kv->string);
            cJSON_AddItemToObject(extra, kv->string, cJSON_Duplicate(kv, true));
        }
    }
    const cJSON *et = extra ? cJSON_GetObjectItemCaseSensitive(extra, "enable_thinking") : NULL;
    if (et) {
        if (!cJSON_IsBool(et)) {
            cJSON_Delete(copy);
            cJSON_Delete(extra);
            free(prefill);
            return herr_set(e, "\"chat_template_kwargs\".enable_thinking must be true or false");
        }
        in.enable_thinking = cJSON_IsTrue(et);
    }
    /* a prefill is the answer's content: thinking off, whatever the kwargs say (as
     * llama-server renders a prefill on Qwen's templates: the think block closed before it) */
    if (prefill) {
        in.enable_thinking = 0;
        if (extra) cJSON_DeleteItemFromObjectCaseSensitive(extra, "enable_thinking");
    }
    in.extra = extra;
    size_t len;
    int rc = chat_render(x->tmpl, &in, text, &len, e);
    if (rc == 0 && prefill) {
        /* a template that opens a thinking block even so: the prefill would be thinking, which
         * the answer's split of reasoning from content would misread; refused */
        size_t t = len;
        while (t > 0 && ((*text)[t - 1] == '\n' || (*text)[t - 1] == ' ')) t--;
        if (t >= 7 && !memcmp(*text + t - 7, "<think>", 7)) {
            rc = herr_set(e, "\"messages\" ends in an assistant message to continue (assistant prefill), but the "
                             "chat template opens a thinking block before it even with enable_thinking false");
            free(*text);
            *text = NULL;
        } else {
            const size_t np = strlen(prefill);
            *text = xrealloc(*text, len + np + 1);
            memcpy(*text + len, prefill, np + 1);
            len += np;
        }
    }
    free(prefill);
    if (rc == 0 && ids) {
        *ids = chat_encode(x, *text, len, n_ids);
        *starts = xmalloc(sizeof(int64_t) * (size_t)(*n_ids + 1));
        int64_t ns = chat_message_starts(x->tmpl, &in, x->tok, *text, len, *ids, *n_ids, *starts, *n_ids + 1, e);
        if (ns < 0) { /* no starts is no error for generation: the last row is still marked */
            ns = 0;
        }
        *n_starts = (int)ns;
    }
    cJSON_Delete(copy);
    cJSON_Delete(extra);
    return rc;
}

/* text of a string or of an array of {"type": "text"} blocks; NULL (e set) otherwise */
static char *blocks_text(const cJSON *c, const char *what, herr *e) {
    if (cJSON_IsString(c)) return xstrdup(c->valuestring);
    if (!cJSON_IsArray(c)) { herr_set(e, "%s must be a string or an array of content blocks", what); return NULL; }
    buf b = {0};
    buf_add(&b, "", 0);
    const cJSON *x;
    cJSON_ArrayForEach(x, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(x, "type"), *tx = cJSON_GetObjectItemCaseSensitive(x, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(tx)) {
            herr_set(e, "%s: only text blocks are supported here", what);
            free(b.p);
            return NULL;
        }
        buf_str(&b, tx->valuestring);
    }
    return b.p;
}

cJSON *req_messages_to_chat(const cJSON *j, herr *e) {
    cJSON *out = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(out, "messages");
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(j, "system");
    if (sys && !cJSON_IsNull(sys)) {
        char *t = blocks_text(sys, "\"system\"", e);
        if (!t) goto bad;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", t);
        free(t);
        cJSON_AddItemToArray(msgs, m);
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(j, "messages"), *m;
    if (!cJSON_IsArray(in) || cJSON_GetArraySize(in) == 0) { herr_set(e, "\"messages\" must be a non-empty array"); goto bad; }
    int k = 0;
    cJSON_ArrayForEach(m, in) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const bool user = cJSON_IsString(role) && !strcmp(role->valuestring, "user");
        if (!cJSON_IsString(role) || (!user && strcmp(role->valuestring, "assistant"))) {
            herr_set(e, "\"messages\"[%d].role must be \"user\" or \"assistant\"", k);
            goto bad;
        }
        buf text = {0}, think = {0};
        buf_add(&text, "", 0);
        cJSON *calls = NULL;
        if (cJSON_IsString(content)) buf_str(&text, content->valuestring);
        else if (!cJSON_IsArray(content)) {
            herr_set(e, "\"messages\"[%d].content must be a string or an array of content blocks", k);
            free(text.p);
            goto bad;
        }
        const cJSON *b;
        cJSON_ArrayForEach(b, (cJSON_IsArray(content) ? content : NULL)) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
            const char *type = cJSON_IsString(t) ? t->valuestring : "";
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(b, "text");
            if (!strcmp(type, "text") && cJSON_IsString(tx)) {
                buf_str(&text, tx->valuestring);
            } else if (!strcmp(type, "thinking") && !user) {
                const cJSON *th = cJSON_GetObjectItemCaseSensitive(b, "thinking");
                if (cJSON_IsString(th)) buf_str(&think, th->valuestring);
            } else if (!strcmp(type, "redacted_thinking") && !user) {
            } else if (!strcmp(type, "tool_use") && !user) {
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id"), *name = cJSON_GetObjectItemCaseSensitive(b, "name");
                const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
                if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input)) {
                    herr_set(e, "\"messages\"[%d]: a tool_use block needs \"id\", \"name\" and an object \"input\"", k);
                    free(text.p), free(think.p), cJSON_Delete(calls);
                    goto bad;
                }
                if (!calls) calls = cJSON_CreateArray();
                cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
                cJSON_AddStringToObject(c, "id", id->valuestring);
                cJSON_AddStringToObject(c, "type", "function");
                cJSON_AddStringToObject(fn, "name", name->valuestring);
                cJSON_AddItemToObject(fn, "arguments", cJSON_Duplicate(input, true));
                cJSON_AddItemToObject(c, "function", fn);
                cJSON_AddItemToArray(calls, c);
            } else if (!strcmp(type, "tool_result") && user) {
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
                const cJSON *rc = cJSON_GetObjectItemCaseSensitive(b, "content");
                char *r = rc ? blocks_text(rc, "a tool_result's content", e) : xstrdup("");
                if (!r || !cJSON_IsString(id)) {
                    if (r) herr_set(e, "\"messages\"[%d]: a tool_result block needs \"tool_use_id\"", k);
                    free(r), free(text.p), free(think.p);
                    goto bad;
                }
                cJSON *tm = cJSON_CreateObject();
                cJSON_AddStringToObject(tm, "role", "tool");
                cJSON_AddStringToObject(tm, "tool_call_id", id->valuestring);
                cJSON_AddStringToObject(tm, "content", r);
                free(r);
                cJSON_AddItemToArray(msgs, tm);
            } else {
                herr_set(e, "\"messages\"[%d]: content blocks of type \"%.40s\" are not supported in a %s message", k, type,
                         role->valuestring);
                free(text.p), free(think.p), cJSON_Delete(calls);
                goto bad;
            }
        }
        if (text.len || calls || think.len || !cJSON_IsArray(content)) {
            cJSON *om = cJSON_CreateObject();
            cJSON_AddStringToObject(om, "role", role->valuestring);
            cJSON_AddStringToObject(om, "content", text.p);
            if (think.len) cJSON_AddStringToObject(om, "reasoning_content", think.p);
            if (calls) cJSON_AddItemToObject(om, "tool_calls", calls);
            cJSON_AddItemToArray(msgs, om);
        }
        free(text.p);
        free(think.p);
        k++;
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools"), *t;
    if (tools && !cJSON_IsArray(tools)) { herr_set(e, "\"tools\" must be an array"); goto bad; }
    const cJSON *tch = cJSON_GetObjectItemCaseSensitive(j, "tool_choice"); /* {"type": ...}: req_params judges it */
    if (tch) cJSON_AddItemToObject(out, "tool_choice", cJSON_Duplicate(tch, true));
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(tch, "disable_parallel_tool_use"); /* chat's parallel_tool_calls */
    if (dp && !cJSON_IsBool(dp)) { herr_set(e, "\"tool_choice\".disable_parallel_tool_use must be true or false"); goto bad; }
    if (cJSON_IsTrue(dp)) cJSON_AddFalseToObject(out, "parallel_tool_calls");
    if (cJSON_GetArraySize(tools) > 0) {
        cJSON *ot = cJSON_AddArrayToObject(out, "tools");
        cJSON_ArrayForEach(t, tools) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            if (!cJSON_IsString(name)) { herr_set(e, "a tool needs a \"name\""); goto bad; }
            cJSON *f = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddStringToObject(f, "type", "function");
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(t, "description");
            if (cJSON_IsString(d)) cJSON_AddStringToObject(fn, "description", d->valuestring);
            const cJSON *sch = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
            cJSON_AddItemToObject(fn, "parameters", sch ? cJSON_Duplicate(sch, true) : cJSON_CreateObject());
            cJSON_AddItemToObject(f, "function", fn);
            cJSON_AddItemToArray(ot, f);
        }
    }
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(j, "thinking");
    if (th && !cJSON_IsNull(th)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(th, "type");
        if (!cJSON_IsString(ty) || (strcmp(ty->valuestring, "enabled") && strcmp(ty->valuestring, "disabled"))) {
            herr_set(e, "\"thinking\".type must be \"enabled\" or \"disabled\"");
            goto bad;
        }
        cJSON *kw = cJSON_AddObjectToObject(out, "chat_template_kwargs");
        cJSON_AddBoolToObject(kw, "enable_thinking", !strcmp(ty->valuestring, "enabled"));
    }
    static const char *const same[] = {"max_tokens", "temperature", "top_p", "top_k", "stream"};
    for (int i = 0; i < 5; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, same[i]);
        if (x) cJSON_AddItemToObject(out, same[i], cJSON_Duplicate(x, true));
    }
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(j, "stop_sequences");
    if (ss) cJSON_AddItemToObject(out, "stop", cJSON_Duplicate(ss, true));
    return out;
bad:
    cJSON_Delete(out);
    return NULL;
}

#define BILLING_LINE "x-anthropic-billing-header:"

/* text without the lines that begin with BILLING_LINE (a new string; *n_dropped counted) */
static char *drop_billing_lines(const char *text, int *n_dropped) {
    buf b = {0};
    buf_add(&b, "", 0);
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        const char *end = nl ? nl + 1 : p + strlen(p);
        if (!strncmp(p, BILLING_LINE, strlen(BILLING_LINE))) (*n_dropped)++;
        else buf_add(&b, p, (size_t)(end - p));
        p = end;
    }
    return b.p;
}

int req_drop_billing_header(cJSON *j) {
    cJSON *sys = cJSON_GetObjectItemCaseSensitive(j, "system");
    int n = 0;
    if (cJSON_IsString(sys)) {
        if (!strstr(sys->valuestring, BILLING_LINE)) return 0;
        char *t = drop_billing_lines(sys->valuestring, &n);
        cJSON_ReplaceItemInObjectCaseSensitive(j, "system", cJSON_CreateString(t));
        free(t);
        return n;
    }
    cJSON *blk = cJSON_IsArray(sys) ? sys->child : NULL;
    while (blk) {
        cJSON *next = blk->next;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(blk, "type");
        cJSON *tx = cJSON_GetObjectItemCaseSensitive(blk, "text");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "text") && cJSON_IsString(tx) &&
            strstr(tx->valuestring, BILLING_LINE)) {
            const int before = n;
            char *s = drop_billing_lines(tx->valuestring, &n);
            if (n > before && !s[0]) cJSON_Delete(cJSON_DetachItemViaPointer(sys, blk));
            else cJSON_ReplaceItemInObjectCaseSensitive(blk, "text", cJSON_CreateString(s));
            free(s);
        }
        blk = next;
    }
    return n;
}

int32_t *req_tokenize(const req_ctx *x, const cJSON *j, int64_t *n, bool *with_pieces, herr *e) {
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "content");
    bool add_special = false, parse_special = true;
    *with_pieces = false;
    if (!cJSON_IsString(ct)) {
        herr_set(e, "\"content\" must be a string");
        return NULL;
    }
    if (get_bool(j, "add_special", &add_special, e) < 0 || get_bool(j, "with_pieces", with_pieces, e) < 0 ||
        get_bool(j, "parse_special", &parse_special, e) < 0)
        return NULL;
    return tokenizer_encode_prompt(x->tok, ct->valuestring, strlen(ct->valuestring), parse_special, add_special, n);
}

const char *req_slot_file(const cJSON *j) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(j, "filename");
    if (!cJSON_IsString(fn) || !fn->valuestring[0] || fn->valuestring[0] == '.' || strlen(fn->valuestring) >= 200)
        return NULL;
    for (const char *q = fn->valuestring; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '.' || *q == '_' ||
              *q == '-'))
            return NULL;
    return fn->valuestring;
}
