/* chat.c: chat templates over the Jinja subset (variables as transformers passes them,
 * the ChatML fallback), chat requests from JSON, and message-start positions in tokens. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/chat.h"

struct chat_template {
    jinja_template *jt;
    char *src;
    size_t len;
};

const char chat_chatml_template[] =
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n";

chat_template *chat_template_parse(const char *src, size_t len, herr *e) {
    jinja_template *jt = jinja_parse(src, len, e);
    if (!jt) return NULL;
    chat_template *t = xcalloc(1, sizeof *t);
    t->jt = jt;
    t->src = xmalloc(len + 1);
    memcpy(t->src, src, len);
    t->src[len] = 0;
    t->len = len;
    return t;
}

chat_template *chat_template_from_gguf(const gguf_file *f, herr *e) {
    const gguf_value *v = gguf_find(f, "tokenizer.chat_template");
    if (!v) return chat_template_parse(chat_chatml_template, strlen(chat_chatml_template), e);
    if (v->type != GGUF_TYPE_STRING) {
        herr_set(e, "tokenizer.chat_template: expected a string, got %s", gguf_type_name(v->type));
        return NULL;
    }
    chat_template *t = chat_template_parse(v->v.str.ptr, (size_t)v->v.str.len, e);
    if (!t) herr_wrap(e, "tokenizer.chat_template");
    return t;
}

void chat_template_free(chat_template *t) {
    if (!t) return;
    jinja_free(t->jt);
    free(t->src);
    free(t);
}

const char *chat_template_source(const chat_template *t, size_t *len) {
    *len = t->len;
    return t->src;
}

/* The variables, in transformers' order: messages, tools, documents, add_generation_prompt,
 * then the special tokens and keyword arguments. Members refer to the caller's JSON. */
static cJSON *make_vars(const chat_input *in, const cJSON *messages) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(v, "messages", (cJSON *)messages);
    if (in->tools) cJSON_AddItemReferenceToObject(v, "tools", (cJSON *)in->tools);
    else cJSON_AddNullToObject(v, "tools");
    cJSON_AddNullToObject(v, "documents");
    cJSON_AddBoolToObject(v, "add_generation_prompt", in->add_generation_prompt);
    if (in->enable_thinking >= 0) cJSON_AddBoolToObject(v, "enable_thinking", in->enable_thinking != 0);
    if (in->bos_token) cJSON_AddStringToObject(v, "bos_token", in->bos_token);
    if (in->eos_token) cJSON_AddStringToObject(v, "eos_token", in->eos_token);
    for (const cJSON *x = in->extra ? in->extra->child : NULL; x; x = x->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(v, x->string);
        cJSON_AddItemReferenceToObject(v, x->string, (cJSON *)x);
    }
    return v;
}

static int render_with(const chat_template *t, const chat_input *in, const cJSON *messages, char **out, size_t *out_len, herr *e) {
    if (!cJSON_IsArray(messages)) return herr_set(e, "messages must be a JSON array");
    if (in->tools && !cJSON_IsNull(in->tools) && !cJSON_IsArray(in->tools)) return herr_set(e, "tools must be a JSON array");
    if (in->extra && !cJSON_IsObject(in->extra)) return herr_set(e, "extra template variables must be a JSON object");
    cJSON *vars = make_vars(in, messages);
    int64_t now = in->now ? in->now : (int64_t)time(NULL);
    int rc = jinja_render(t->jt, vars, now, &in->limits, out, out_len, e);
    cJSON_Delete(vars);
    return rc;
}

int chat_render(const chat_template *t, const chat_input *in, char **out, size_t *out_len, herr *e) {
    return render_with(t, in, in->messages, out, out_len, e);
}

int chat_input_from_json(const cJSON *r, chat_input *in, herr *e) {
    *in = (chat_input){.enable_thinking = -1};
    if (cJSON_IsArray(r)) {
        in->messages = r;
        return 0;
    }
    if (!cJSON_IsObject(r)) return herr_set(e, "expected a JSON object with \"messages\", or an array of messages");
    in->messages = cJSON_GetObjectItemCaseSensitive(r, "messages");
    if (!cJSON_IsArray(in->messages)) return herr_set(e, "\"messages\" must be an array");
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(r, "tools");
    if (x && !cJSON_IsNull(x)) {
        if (!cJSON_IsArray(x)) return herr_set(e, "\"tools\" must be an array");
        in->tools = x;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(r, "add_generation_prompt"))) {
        if (!cJSON_IsBool(x)) return herr_set(e, "\"add_generation_prompt\" must be true or false");
        in->add_generation_prompt = cJSON_IsTrue(x);
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(r, "enable_thinking"))) {
        if (!cJSON_IsBool(x)) return herr_set(e, "\"enable_thinking\" must be true or false");
        in->enable_thinking = cJSON_IsTrue(x);
    }
    static const char *const toks[] = {"bos_token", "eos_token"};
    for (int i = 0; i < 2; i++)
        if ((x = cJSON_GetObjectItemCaseSensitive(r, toks[i]))) {
            if (!cJSON_IsString(x)) return herr_set(e, "\"%s\" must be a string", toks[i]);
            *(i ? &in->eos_token : &in->bos_token) = x->valuestring;
        }
    if ((x = cJSON_GetObjectItemCaseSensitive(r, "extra"))) {
        if (!cJSON_IsObject(x)) return herr_set(e, "\"extra\" must be an object");
        in->extra = x;
    }
    return 0;
}

int chat_input_parse(const char *json, size_t len, chat_input *in, cJSON **root, herr *e) {
    *root = cJSON_ParseWithLength(json, len);
    if (!*root) return herr_set(e, "not valid JSON");
    if (chat_input_from_json(*root, in, e) != 0) {
        cJSON_Delete(*root);
        *root = NULL;
        return -1;
    }
    return 0;
}

/* ---- message starts ---- */

static bool ids_equal_prefix(const tokenizer *tok, const char *text, size_t nbytes, const int32_t *ids, int64_t n) {
    int64_t m;
    int32_t *p = tokenizer_encode_alloc(tok, text, nbytes, true, &m);
    bool same = m == n && (n == 0 || !memcmp(p, ids, (size_t)n * sizeof *ids));
    free(p);
    return same;
}

int64_t chat_message_starts(const chat_template *t, const chat_input *in, const tokenizer *tok,
                            const char *rendered, size_t len, const int32_t *ids, int64_t n_ids,
                            int64_t *starts, int64_t max, herr *e) {
    int64_t k = 0;
    int32_t im_start = tokenizer_find(tok, "<|im_start|>", 12);
    if (im_start >= 0 && memmem(rendered, len, "<|im_start|>", 12)) {
        for (int64_t i = 0; i < n_ids; i++)
            if (ids[i] == im_start) {
                if (k < max) starts[k] = i;
                k++;
            }
        return k < max ? k : max;
    }
    /* token i begins at byte off[i]; off[n_ids] = len */
    int64_t *off = xmalloc((size_t)(n_ids + 1) * sizeof *off);
    int64_t b = 0;
    for (int64_t i = 0; i < n_ids; i++) {
        off[i] = b;
        size_t pl;
        tokenizer_piece(tok, ids[i], true, &pl);
        b += (int64_t)pl;
    }
    off[n_ids] = b;
    if (b != (int64_t)len) {
        free(off);
        return herr_set(e, "message starts: the ids do not spell the rendered text (%lld of %zu bytes)", (long long)b, len);
    }
    const cJSON *msgs = in->messages;
    int n_msgs = cJSON_GetArraySize(msgs);
    chat_input pin = *in;
    pin.add_generation_prompt = false;
    int64_t last = -1;
    /* m == n_msgs: where the generation prompt begins */
    for (int m = 0; m <= n_msgs && k < max; m++) {
        if (m == n_msgs && !in->add_generation_prompt) break;
        size_t start_byte = 0;
        if (m > 0) {
            /* messages [0, m) alone */
            cJSON *prefix = cJSON_CreateArray();
            int j = 0;
            for (const cJSON *x = msgs->child; x && j < m; x = x->next, j++) cJSON_AddItemReferenceToArray(prefix, (cJSON *)x);
            char *pre;
            size_t pre_len;
            herr ignore;
            int rc = render_with(t, &pin, prefix, &pre, &pre_len, &ignore);
            cJSON_Delete(prefix);
            if (rc != 0) continue;
            while (start_byte < pre_len && start_byte < len && pre[start_byte] == rendered[start_byte]) start_byte++;
            free(pre);
        }
        /* the last token boundary at or before start_byte whose prefix encodes the same */
        int64_t lo = 0, hi = n_ids;
        while (lo < hi) { /* first i with off[i] > start_byte, minus one */
            int64_t mid = (lo + hi + 1) / 2;
            if (off[mid] <= (int64_t)start_byte) lo = mid;
            else hi = mid - 1;
        }
        int64_t pos = lo;
        for (int tries = 0; pos > last && tries < 8; tries++, pos--)
            if (ids_equal_prefix(tok, rendered, (size_t)off[pos], ids, pos)) break;
        if (pos <= last || !ids_equal_prefix(tok, rendered, (size_t)off[pos], ids, pos)) continue;
        starts[k++] = pos;
        last = pos;
    }
    free(off);
    return k;
}

/* ---- what follows an answer ---- */

#define PROBE_TEXT "hearth answer-end probe"

static bool ids_same(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, sizeof *a * (size_t)na));
}

/* The end ids after PROBE_TEXT when follow (a user's or a tool's message) comes after it, or 0;
 * a tool's result follows an answer with some thinking (reasoning_content). *has_start: a
 * rendering holds <|im_start|> */
static int64_t answer_end_with(const chat_template *t, const chat_input *base, const tokenizer *tok, const char *follow,
                               int32_t *ids, int64_t max, bool *has_start) {
    cJSON *msgs = cJSON_CreateArray();
    const bool tool = !strcmp(follow, "tool");
    static const char *const roles[] = {"user", "assistant", NULL};
    static const char *const texts[] = {"Hello.", PROBE_TEXT, "Hello again."};
    for (int k = 0; k < 3; k++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", roles[k] ? roles[k] : follow);
        if (k == 1 && tool) cJSON_AddStringToObject(m, "reasoning_content", "Thinking first.");
        if (k == 2 && tool) cJSON_AddStringToObject(m, "tool_call_id", "call_0");
        cJSON_AddStringToObject(m, "content", texts[k]);
        cJSON_AddItemToArray(msgs, m);
    }
    chat_input in = *base;
    in.add_generation_prompt = false;
    in.tools = NULL;
    char *whole = NULL, *upto = NULL;
    size_t whole_len = 0, upto_len = 0;
    herr e;
    int64_t n = 0;
    int rc = render_with(t, &in, msgs, &whole, &whole_len, &e);
    cJSON_DeleteItemFromArray(msgs, 2);
    if (rc == 0) rc = render_with(t, &in, msgs, &upto, &upto_len, &e);
    cJSON_Delete(msgs);
    if (rc == 0 && (memmem(whole, whole_len, "<|im_start|>", 12) || memmem(upto, upto_len, "<|im_start|>", 12)))
        *has_start = true;
    const char *probe = rc == 0 ? memmem(upto, upto_len, PROBE_TEXT, strlen(PROBE_TEXT)) : NULL;
    /* the end: after the probe in the rendering that stops with the assistant message, which
     * must be where the whole one's next message begins */
    if (probe && upto_len < whole_len && !memcmp(upto, whole, upto_len)) {
        const size_t at = (size_t)(probe - upto) + strlen(PROBE_TEXT), end_len = upto_len - at;
        int64_t na, ne, nw;
        int32_t *a = tokenizer_encode_alloc(tok, upto, at, true, &na);
        int32_t *en = tokenizer_encode_alloc(tok, upto + at, end_len, true, &ne);
        int32_t *w = tokenizer_encode_alloc(tok, upto, upto_len, true, &nw);
        if (ne > 0 && ne <= max && nw == na + ne && ids_same(w, na, a, na) && ids_same(w + na, ne, en, ne)) {
            memcpy(ids, en, sizeof *ids * (size_t)ne);
            n = ne;
        }
        free(a);
        free(en);
        free(w);
    }
    free(whole);
    free(upto);
    return n;
}

/* A user's message after the answer first; then a tool's result: Qwen3's and Qwen3.5's templates
 * write the assistant message after the last user message with its thinking block and again
 * without it once a user message follows (no prefix: the probe fails), while a tool's result
 * follows it as it was (Qwen3's: when it has some thinking), which is where an agent loop's
 * next request resumes. *start_id is <|im_start|> wherever a rendering holds it, whether or not
 * an end was found (else a template that rewrites answers would leave /completion prompts
 * without marks, never resumed). */
int64_t chat_answer_end(const chat_template *t, const chat_input *base, const tokenizer *tok, int32_t *ids, int64_t max,
                        int32_t *start_id) {
    *start_id = -1;
    bool has_start = false;
    int64_t n = answer_end_with(t, base, tok, "user", ids, max, &has_start);
    if (n == 0) n = answer_end_with(t, base, tok, "tool", ids, max, &has_start);
    const int32_t im_start = tokenizer_find(tok, "<|im_start|>", 12);
    if (im_start >= 0 && has_start) *start_id = im_start;
    return n;
}
