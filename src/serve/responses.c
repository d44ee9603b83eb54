/* responses.c: OpenAI's Responses API on the chat path (responses.h). The request side reads
 * input items into chat messages (leading system and developer messages joined with the
 * instructions into one system message, as the Qwen templates want one at the start; a
 * reasoning item passed on as the next assistant message's reasoning_content; function_call
 * items as that message's tool_calls; function_call_output items as tool messages). The
 * answer side keeps the output items, the open one growing, and writes the stream's events
 * (each with its sequence_number) as they happen; the whole Response is made of the same
 * items. The thinking text goes in the reasoning item's content (reasoning_text, as
 * OpenAI's open-weight models give it); hearth writes no summaries, so summary is empty,
 * unless the request asks for one (reasoning.summary): then the thinking text stands in
 * the summary (summary_text) instead, for the clients that show only summaries. */
#include "serve/responses.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the request */

static bool is_str(const cJSON *x, const char *s) { return cJSON_IsString(x) && !strcmp(x->valuestring, s); }

static bool absent(const cJSON *x) { return !x || cJSON_IsNull(x); }

/* the text of a content list (a string, or parts): input_text and output_text parts (and an
 * assistant's refusal); what names the list in errors. NULL with e set. */
static char *parts_text(const cJSON *c, const char *what, bool assistant, herr *e) {
    if (cJSON_IsString(c)) return xstrdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        herr_set(e, "%s must be a string or an array of content parts", what);
        return NULL;
    }
    buf b = {0};
    buf_add(&b, "", 0);
    int k = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *ty = cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, "type") : NULL;
        const char *t = cJSON_IsString(ty) ? ty->valuestring : NULL;
        const char *key = t && (!strcmp(t, "input_text") || !strcmp(t, "output_text")) ? "text"
                          : t && assistant && !strcmp(t, "refusal")                     ? "refusal"
                                                                                        : NULL;
        const cJSON *tx = key ? cJSON_GetObjectItemCaseSensitive(p, key) : NULL;
        if (!t) herr_set(e, "%s[%d] needs a string \"type\"", what, k);
        else if (!strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio"))
            herr_set(e, "%s[%d] is of type \"%s\": only text parts are supported (this server reads no images, audio or "
                        "files)", what, k, t);
        else if (!key) herr_set(e, "%s[%d] is of type \"%.40s\", not input_text or output_text", what, k, t);
        else if (!cJSON_IsString(tx)) herr_set(e, "%s[%d] of type \"%s\" needs a string \"%s\"", what, k, t, key);
        if (!key || !cJSON_IsString(tx)) {
            free(b.p);
            return NULL;
        }
        buf_str(&b, tx->valuestring);
        k++;
    }
    return b.p;
}

/* the chat's last message when it is the assistant's, else NULL */
static cJSON *last_assistant(cJSON *msgs) {
    cJSON *m = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    return m && is_str(cJSON_GetObjectItemCaseSensitive(m, "role"), "assistant") ? m : NULL;
}

/* the assistant message the next output item of a past answer joins: the last one, unless a
 * reasoning item begins a new answer; *reasoning (taken) goes with it */
static cJSON *assistant_for(cJSON *msgs, buf *reasoning) {
    cJSON *m = last_assistant(msgs);
    if (m && reasoning->len && cJSON_GetObjectItemCaseSensitive(m, "reasoning_content")) m = NULL;
    if (!m) {
        m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", "");
        cJSON_AddItemToArray(msgs, m);
    }
    if (reasoning->len) {
        cJSON_AddStringToObject(m, "reasoning_content", reasoning->p);
        reasoning->len = 0;
    }
    return m;
}

static void append_content(cJSON *m, const char *text) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    buf b = {0};
    buf_str(&b, cJSON_IsString(c) ? c->valuestring : "");
    buf_str(&b, text);
    cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(b.p));
    free(b.p);
}

/* one input item into msgs; sys collects the leading system text while *leading */
static int input_item(const cJSON *it, int k, cJSON *msgs, buf *sys, bool *leading, buf *reasoning, herr *e) {
    char what[64];
    if (!cJSON_IsObject(it)) return herr_set(e, "\"input\"[%d] must be an object", k);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
    if (!absent(ty) && !cJSON_IsString(ty)) return herr_set(e, "\"input\"[%d].type must be a string", k);
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "message";
    if (!strcmp(t, "message")) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        static const char *const roles[] = {"user", "system", "developer", "assistant", NULL};
        int r = 0;
        while (cJSON_IsString(role) && roles[r] && strcmp(roles[r], role->valuestring)) r++;
        if (!cJSON_IsString(role) || !roles[r])
            return herr_set(e, "\"input\"[%d].role must be one of user, system, developer, assistant", k);
        snprintf(what, sizeof what, "\"input\"[%d].content", k);
        char *text = parts_text(cJSON_GetObjectItemCaseSensitive(it, "content"), what, r == 3, e);
        if (!text) return -1;
        if ((r == 1 || r == 2) && *leading) { /* one system message at the start */
            if (sys->len) buf_str(sys, "\n\n");
            buf_str(sys, text);
        } else if (r == 3) {
            append_content(assistant_for(msgs, reasoning), text);
        } else {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", r == 0 ? "user" : "system");
            cJSON_AddStringToObject(m, "content", text);
            cJSON_AddItemToArray(msgs, m);
        }
        if (r != 1 && r != 2) *leading = false;
        free(text);
        return 0;
    }
    *leading = false;
    if (!strcmp(t, "function_call")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id"), *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "arguments");
        if (!cJSON_IsString(id) || !id->valuestring[0]) return herr_set(e, "\"input\"[%d] (function_call) needs a \"call_id\"", k);
        if (!cJSON_IsString(nm) || !nm->valuestring[0]) return herr_set(e, "\"input\"[%d] (function_call) needs a \"name\"", k);
        if (!cJSON_IsString(args)) return herr_set(e, "\"input\"[%d] (function_call) needs \"arguments\", a string", k);
        cJSON *m = assistant_for(msgs, reasoning), *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
        cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(tc, "id", id->valuestring);
        cJSON_AddStringToObject(tc, "type", "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
        cJSON_AddStringToObject(fn, "arguments", args->valuestring);
        cJSON_AddItemToObject(tc, "function", fn);
        cJSON_AddItemToArray(calls, tc);
        return 0;
    }
    if (!strcmp(t, "function_call_output")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
        if (!cJSON_IsString(id) || !id->valuestring[0])
            return herr_set(e, "\"input\"[%d] (function_call_output) needs a \"call_id\"", k);
        snprintf(what, sizeof what, "\"input\"[%d].output", k);
        char *text = parts_text(cJSON_GetObjectItemCaseSensitive(it, "output"), what, false, e);
        if (!text) return -1;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(msgs, m);
        free(text);
        return 0;
    }
    if (!strcmp(t, "reasoning")) { /* a past answer's thinking: its content, else its summary */
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content"), *s = cJSON_GetObjectItemCaseSensitive(it, "summary");
        const cJSON *list = cJSON_GetArraySize(c) > 0 ? c : s, *p;
        if ((!absent(c) && !cJSON_IsArray(c)) || (!absent(s) && !cJSON_IsArray(s)))
            return herr_set(e, "\"input\"[%d] (reasoning): \"content\" and \"summary\" must be arrays", k);
        int pk = 0;
        cJSON_ArrayForEach(p, (cJSON_IsArray(list) ? list : NULL)) {
            const cJSON *tx = cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, "text") : NULL;
            if (!cJSON_IsString(tx))
                return herr_set(e, "\"input\"[%d] (reasoning): %s[%d] needs a string \"text\"", k, list == c ? "content" : "summary", pk);
            if (reasoning->len) buf_str(reasoning, "\n");
            buf_str(reasoning, tx->valuestring);
            pk++;
        }
        return 0;
    }
    if (!strcmp(t, "item_reference"))
        return herr_set(e, "\"input\"[%d] is an item_reference: hearth stores no items (send the items themselves)", k);
    return herr_set(e, "\"input\"[%d] is of type \"%.40s\", not message, function_call, function_call_output or reasoning", k, t);
}

/* tools: Responses' function tools {type, name, description, parameters, strict} as chat's */
static cJSON *chat_tools(const cJSON *tools, herr *e) {
    if (!cJSON_IsArray(tools)) {
        herr_set(e, "\"tools\" must be an array");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    int k = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *ty = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "type") : NULL;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(t, "name"), *pa = cJSON_GetObjectItemCaseSensitive(t, "parameters");
        const cJSON *de = cJSON_GetObjectItemCaseSensitive(t, "description");
        if (!cJSON_IsObject(t)) herr_set(e, "\"tools\"[%d] must be an object", k);
        else if (!cJSON_IsString(ty)) herr_set(e, "\"tools\"[%d] needs a string \"type\"", k);
        else if (strcmp(ty->valuestring, "function"))
            herr_set(e, "\"tools\"[%d] is of type \"%.40s\": only function tools are supported", k, ty->valuestring);
        else if (!cJSON_IsString(nm) || !nm->valuestring[0]) herr_set(e, "\"tools\"[%d].name must be a non-empty string", k);
        else if (!absent(pa) && !cJSON_IsObject(pa)) herr_set(e, "\"tools\"[%d].parameters must be an object", k);
        else if (!absent(de) && !cJSON_IsString(de)) herr_set(e, "\"tools\"[%d].description must be a string", k);
        else {
            cJSON *f = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddStringToObject(f, "type", "function");
            cJSON_AddStringToObject(fn, "name", nm->valuestring);
            if (cJSON_IsString(de)) cJSON_AddStringToObject(fn, "description", de->valuestring);
            cJSON_AddItemToObject(fn, "parameters", cJSON_IsObject(pa) ? cJSON_Duplicate(pa, true) : cJSON_CreateObject());
            cJSON_AddItemToObject(f, "function", fn);
            cJSON_AddItemToArray(out, f);
            k++;
            continue;
        }
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

/* fields that need stored state or would change the answer and are not done */
static int refused(const cJSON *j, herr *e) {
    static const char *const stored[] = {"previous_response_id", "conversation", "prompt"};
    for (size_t k = 0; k < sizeof stored / sizeof stored[0]; k++)
        if (!absent(cJSON_GetObjectItemCaseSensitive(j, stored[k])))
            return herr_set(e, "\"%s\" is not supported: hearth stores no responses (send the whole conversation in "
                               "\"input\")", stored[k]);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "background")))
        return herr_set(e, "\"background\": true is not supported: hearth stores no responses to poll");
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(j, "top_logprobs");
    if (!absent(tl) && !(cJSON_IsNumber(tl) && tl->valuedouble == 0))
        return herr_set(e, "\"top_logprobs\" is not supported on /v1/responses yet (only 0)");
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(j, "truncation");
    if (!absent(tr) && !is_str(tr, "disabled"))
        return herr_set(e, "\"truncation\" other than \"disabled\" is not supported (a prompt over the context is refused)");
    const cJSON *inc = cJSON_GetObjectItemCaseSensitive(j, "include"), *x;
    if (!absent(inc) && !cJSON_IsArray(inc)) return herr_set(e, "\"include\" must be an array of strings");
    cJSON_ArrayForEach(x, (cJSON_IsArray(inc) ? inc : NULL)) {
        if (!cJSON_IsString(x)) return herr_set(e, "\"include\" must be an array of strings");
        if (!strcmp(x->valuestring, "message.output_text.logprobs"))
            return herr_set(e, "\"include\": message.output_text.logprobs is not supported on /v1/responses yet");
    }
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(j, "metadata");
    if (!absent(md) && !cJSON_IsObject(md)) return herr_set(e, "\"metadata\" must be an object");
    static const char *const bools[] = {"store", "parallel_tool_calls", "stream"};
    for (size_t k = 0; k < sizeof bools / sizeof bools[0]; k++) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, bools[k]);
        if (!absent(b) && !cJSON_IsBool(b)) return herr_set(e, "\"%s\" must be true or false", bools[k]);
    }
    return 0;
}

/* reasoning.effort as enable_thinking (-1: not said); -1 with e set when wrong */
static int thinking(const cJSON *j, int *on, herr *e) {
    *on = -1;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "reasoning");
    if (absent(rs)) return 0;
    if (!cJSON_IsObject(rs)) return herr_set(e, "\"reasoning\" must be an object");
    const cJSON *ef = cJSON_GetObjectItemCaseSensitive(rs, "effort"), *su = cJSON_GetObjectItemCaseSensitive(rs, "summary");
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", NULL};
    int k = 0;
    while (cJSON_IsString(ef) && efforts[k] && strcmp(efforts[k], ef->valuestring)) k++;
    if (!absent(ef) && (!cJSON_IsString(ef) || !efforts[k]))
        return herr_set(e, "\"reasoning\".effort must be one of none, minimal, low, medium, high, xhigh");
    if (!absent(su) && !is_str(su, "auto") && !is_str(su, "concise") && !is_str(su, "detailed"))
        return herr_set(e, "\"reasoning\".summary must be auto, concise or detailed");
    if (cJSON_IsString(ef)) *on = k > 0; /* the Qwen models think or not: none is off, any effort on */
    return 0;
}

/* text.format as chat's response_format into *rf (NULL: plain text); -1 with e set */
static int response_format(const cJSON *j, cJSON **rf, herr *e) {
    *rf = NULL;
    const cJSON *tx = cJSON_GetObjectItemCaseSensitive(j, "text");
    if (absent(tx)) return 0;
    if (!cJSON_IsObject(tx)) return herr_set(e, "\"text\" must be an object");
    const cJSON *vb = cJSON_GetObjectItemCaseSensitive(tx, "verbosity");
    if (!absent(vb) && !is_str(vb, "medium")) return herr_set(e, "\"text\".verbosity other than \"medium\" is not supported");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tx, "format");
    if (absent(f)) return 0;
    const cJSON *ty = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "type") : NULL;
    if (!cJSON_IsString(ty)) return herr_set(e, "\"text\".format must be an object with a \"type\"");
    if (!strcmp(ty->valuestring, "text")) return 0;
    if (!strcmp(ty->valuestring, "json_object")) {
        *rf = cJSON_CreateObject();
        cJSON_AddStringToObject(*rf, "type", "json_object");
        return 0;
    }
    if (strcmp(ty->valuestring, "json_schema"))
        return herr_set(e, "\"text\".format of type \"%.40s\" is not one of text, json_object, json_schema", ty->valuestring);
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(f, "schema"), *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (!cJSON_IsObject(sc)) return herr_set(e, "\"text\".format json_schema needs a \"schema\" object");
    *rf = cJSON_CreateObject();
    cJSON_AddStringToObject(*rf, "type", "json_schema");
    cJSON *w = cJSON_AddObjectToObject(*rf, "json_schema");
    if (cJSON_IsString(nm)) cJSON_AddStringToObject(w, "name", nm->valuestring);
    cJSON_AddItemToObject(w, "schema", cJSON_Duplicate(sc, true));
    return 0;
}

/* tool_choice: strings as they are; {"type": "function", "name"} as chat's */
static int tool_choice(const cJSON *j, cJSON *out, herr *e) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    if (absent(tc)) return 0;
    if (is_str(tc, "auto") || is_str(tc, "none") || is_str(tc, "required")) {
        cJSON_AddStringToObject(out, "tool_choice", tc->valuestring);
        return 0;
    }
    const cJSON *ty = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "type") : NULL;
    const cJSON *nm = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "name") : NULL;
    if (!is_str(ty, "function"))
        return herr_set(e, "\"tool_choice\" must be auto, none, required or {\"type\": \"function\", \"name\"}");
    if (!cJSON_IsString(nm) || !nm->valuestring[0]) return herr_set(e, "\"tool_choice\" names no function");
    cJSON *c = cJSON_AddObjectToObject(out, "tool_choice");
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", nm->valuestring);
    return 0;
}

cJSON *resp_to_chat(const req_ctx *x, const cJSON *j, herr *e) {
    if (refused(j, e) < 0) return NULL;
    cJSON *out = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(out, "messages");
    buf sys = {0}, reasoning = {0};
    buf_add(&sys, "", 0);
    buf_add(&reasoning, "", 0);
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(j, "instructions");
    if (!absent(ins) && !cJSON_IsString(ins)) {
        herr_set(e, "\"instructions\" must be a string");
        goto bad;
    }
    if (cJSON_IsString(ins)) buf_str(&sys, ins->valuestring);
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(j, "input");
    bool leading = true;
    if (cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", in->valuestring);
        cJSON_AddItemToArray(msgs, m);
    } else if (cJSON_IsArray(in) && cJSON_GetArraySize(in) > 0) {
        int k = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, in) {
            if (input_item(it, k++, msgs, &sys, &leading, &reasoning, e) < 0) goto bad;
        }
    } else {
        herr_set(e, "\"input\" must be a string or a non-empty array of items");
        goto bad;
    }
    if (sys.len) { /* the system text first */
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", sys.p);
        cJSON_InsertItemInArray(msgs, 0, m);
    }
    if (cJSON_GetArraySize(msgs) == 0) {
        herr_set(e, "\"input\" holds no message");
        goto bad;
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
    if (!absent(tools)) {
        cJSON *ct = chat_tools(tools, e);
        if (!ct) goto bad;
        cJSON_AddItemToObject(out, "tools", ct);
    }
    if (tool_choice(j, out, e) < 0) goto bad;
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(j, "parallel_tool_calls"); /* (a boolean: refused) */
    if (cJSON_IsBool(ptc)) cJSON_AddItemToObject(out, "parallel_tool_calls", cJSON_Duplicate(ptc, true));
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(j, "max_output_tokens");
    if (!absent(mo)) {
        const double hi = x ? (double)x->n_ctx : 1e15;
        if (!cJSON_IsNumber(mo) || mo->valuedouble != floor(mo->valuedouble) || !(mo->valuedouble >= 1 && mo->valuedouble <= hi)) {
            herr_set(e, "\"max_output_tokens\" must be a whole number in [1, %.0f]", hi);
            goto bad;
        }
        cJSON_AddNumberToObject(out, "max_tokens", mo->valuedouble);
    }
    int on;
    if (thinking(j, &on, e) < 0) goto bad;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(j, "chat_template_kwargs"); /* hearth's, as on chat */
    if (!absent(kw)) cJSON_AddItemToObject(out, "chat_template_kwargs", cJSON_Duplicate(kw, true));
    if (on >= 0) {
        cJSON *k = cJSON_GetObjectItemCaseSensitive(out, "chat_template_kwargs");
        if (!cJSON_IsObject(k)) {
            cJSON_DeleteItemFromObjectCaseSensitive(out, "chat_template_kwargs");
            k = cJSON_AddObjectToObject(out, "chat_template_kwargs");
        }
        cJSON_DeleteItemFromObjectCaseSensitive(k, "enable_thinking");
        cJSON_AddBoolToObject(k, "enable_thinking", on);
    }
    cJSON *rf;
    if (response_format(j, &rf, e) < 0) goto bad;
    if (rf) cJSON_AddItemToObject(out, "response_format", rf);
    /* the sampling fields chat reads by the same names (top_k, min_p, seed, ignore_eos: llama-server's) */
    static const char *const same[] = {"temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos", "stream"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, same[k]);
        if (v) cJSON_AddItemToObject(out, same[k], cJSON_Duplicate(v, true));
    }
    free(sys.p);
    free(reasoning.p);
    return out;
bad:
    free(sys.p);
    free(reasoning.p);
    cJSON_Delete(out);
    return NULL;
}

/* ---------------------------------------------------------------- the answer */

typedef enum item_kind { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL } item_kind;

struct resp_out {
    char id[40];            /* resp_ and 16 hex digits */
    const char *hex;        /* those digits: the items' ids end with them */
    char *model;
    int64_t created;
    cJSON *echo;            /* the request's fields a Response repeats, in order */
    int64_t seq;            /* the next event's sequence_number */
    cJSON *items;           /* the output items closed */
    int n_items;            /* opened; the open one's output_index is n_items - 1 */
    int n_calls;
    item_kind open;
    char item_id[64], call_id[64];
    char *name;             /* the open call's */
    buf text;               /* the open item's text or arguments */
    bool had_reasoning;
    bool summary;           /* reasoning.summary was asked: the thinking goes in summary */
};

static cJSON *dup_or(const cJSON *j, const char *name, cJSON *dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (absent(v)) return dflt;
    cJSON_Delete(dflt);
    return cJSON_Duplicate(v, true);
}

resp_out *resp_out_new(const cJSON *j, uint64_t id, const char *model, int64_t created, float temperature, float top_p) {
    resp_out *r = xcalloc(1, sizeof *r);
    snprintf(r->id, sizeof r->id, "resp_%016" PRIx64, id);
    r->hex = r->id + 5;
    r->model = xstrdup(model);
    r->created = created;
    r->items = cJSON_CreateArray();
    buf_add(&r->text, "", 0);
    /* what the Response says of its request: as given, or the value that applied */
    cJSON *o = r->echo = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "instructions", dup_or(j, "instructions", cJSON_CreateNull()));
    cJSON_AddItemToObject(o, "max_output_tokens", dup_or(j, "max_output_tokens", cJSON_CreateNull()));
    cJSON_AddItemToObject(o, "parallel_tool_calls", dup_or(j, "parallel_tool_calls", cJSON_CreateTrue()));
    cJSON_AddNullToObject(o, "previous_response_id");
    cJSON *rs = cJSON_CreateObject();
    const cJSON *rq = cJSON_GetObjectItemCaseSensitive(j, "reasoning");
    cJSON_AddItemToObject(rs, "effort", dup_or(rq, "effort", cJSON_CreateNull()));
    cJSON_AddItemToObject(rs, "summary", dup_or(rq, "summary", cJSON_CreateNull()));
    r->summary = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(rq, "summary"));
    cJSON_AddItemToObject(o, "reasoning", rs);
    cJSON_AddFalseToObject(o, "store"); /* whatever was asked: nothing is kept */
    cJSON_AddNumberToObject(o, "temperature", round((double)temperature * 1e6) / 1e6);
    cJSON *tx = cJSON_CreateObject();
    const cJSON *tq = cJSON_GetObjectItemCaseSensitive(j, "text");
    cJSON *fmt = cJSON_CreateObject();
    cJSON_AddStringToObject(fmt, "type", "text");
    cJSON_AddItemToObject(tx, "format", dup_or(tq, "format", fmt));
    cJSON_AddItemToObject(o, "text", tx);
    cJSON_AddItemToObject(o, "tool_choice", dup_or(j, "tool_choice", cJSON_CreateString("auto")));
    cJSON_AddItemToObject(o, "tools", dup_or(j, "tools", cJSON_CreateArray()));
    cJSON_AddNumberToObject(o, "top_p", round((double)top_p * 1e6) / 1e6);
    cJSON_AddStringToObject(o, "truncation", "disabled");
    cJSON_AddItemToObject(o, "user", dup_or(j, "user", cJSON_CreateNull()));
    cJSON_AddItemToObject(o, "metadata", dup_or(j, "metadata", cJSON_CreateObject()));
    return r;
}

void resp_out_free(resp_out *r) {
    if (!r) return;
    free(r->model);
    cJSON_Delete(r->echo);
    cJSON_Delete(r->items);
    free(r->name);
    free(r->text.p);
    free(r);
}

const char *resp_id(const resp_out *r) { return r->id; }

bool resp_had_reasoning(const resp_out *r) { return r->had_reasoning; }

/* the Response: status, output (the items closed), usage (NULL: null) */
static cJSON *response(const resp_out *r, const char *status, cJSON *usage) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", r->id);
    cJSON_AddStringToObject(j, "object", "response");
    cJSON_AddNumberToObject(j, "created_at", (double)r->created);
    cJSON_AddStringToObject(j, "status", status);
    cJSON_AddNullToObject(j, "error");
    if (!strcmp(status, "incomplete"))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(j, "incomplete_details"), "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(j, "incomplete_details");
    const cJSON *f;
    bool model_done = false;
    cJSON_ArrayForEach(f, r->echo) {
        if (!model_done && !strcmp(f->string, "parallel_tool_calls")) { /* the published order */
            cJSON_AddStringToObject(j, "model", r->model);
            cJSON_AddItemToObject(j, "output", cJSON_Duplicate(r->items, true));
            model_done = true;
        }
        if (!strcmp(f->string, "user")) cJSON_AddItemToObject(j, "usage", usage ? usage : cJSON_CreateNull());
        cJSON_AddItemToObject(j, f->string, cJSON_Duplicate(f, true));
    }
    return j;
}

static cJSON *event_new(const char *type) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", type);
    return j;
}

/* an event of the open item: type, item_id, output_index (and its part's index: content_index,
 * or a summary's summary_index) */
static cJSON *item_event(const resp_out *r, const char *type, bool part) {
    cJSON *j = event_new(type);
    cJSON_AddStringToObject(j, "item_id", r->item_id);
    cJSON_AddNumberToObject(j, "output_index", r->n_items - 1);
    if (part) cJSON_AddNumberToObject(j, r->open == ITEM_REASONING && r->summary ? "summary_index" : "content_index", 0);
    return j;
}

/* the open item's event names: its part added / done, text delta / done */
typedef struct item_names {
    const char *part_added, *part_done, *delta, *done;
} item_names;

static item_names names_of(const resp_out *r) {
    if (r->open == ITEM_MESSAGE)
        return (item_names){"response.content_part.added", "response.content_part.done", "response.output_text.delta",
                            "response.output_text.done"};
    if (r->open == ITEM_CALL)
        return (item_names){NULL, NULL, "response.function_call_arguments.delta", "response.function_call_arguments.done"};
    if (r->summary)
        return (item_names){"response.reasoning_summary_part.added", "response.reasoning_summary_part.done",
                            "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done"};
    return (item_names){"response.content_part.added", "response.content_part.done", "response.reasoning_text.delta",
                        "response.reasoning_text.done"};
}

/* "event: TYPE" and its data with the next sequence_number; j taken */
static void ev_send(resp_out *r, buf *sse, cJSON *j) {
    cJSON_AddNumberToObject(j, "sequence_number", (double)r->seq++);
    char *s = cJSON_PrintUnformatted(j);
    buf_str(sse, "event: ");
    buf_str(sse, cJSON_GetObjectItemCaseSensitive(j, "type")->valuestring);
    buf_str(sse, "\ndata: ");
    buf_str(sse, s);
    buf_str(sse, "\n\n");
    free(s);
    cJSON_Delete(j);
}

/* the content part of the open item (reasoning_text or output_text) holding its text */
static cJSON *part_json(const resp_out *r) {
    cJSON *p = cJSON_CreateObject();
    if (r->open == ITEM_REASONING) {
        cJSON_AddStringToObject(p, "type", r->summary ? "summary_text" : "reasoning_text");
        cJSON_AddItemToObject(p, "text", json_text(r->text.p, r->text.len));
    } else {
        cJSON_AddStringToObject(p, "type", "output_text");
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddArrayToObject(p, "logprobs");
        cJSON_AddItemToObject(p, "text", json_text(r->text.p, r->text.len));
    }
    return p;
}

/* the open item as it stands: with its content (done) or without (just added) */
static cJSON *item_json(const resp_out *r, const char *status, bool done) {
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", r->item_id);
    if (r->open == ITEM_REASONING) {
        cJSON_AddStringToObject(it, "type", "reasoning");
        cJSON *su = cJSON_AddArrayToObject(it, "summary");
        if (done && r->summary) cJSON_AddItemToArray(su, part_json(r));
        if (!r->summary) {
            cJSON *c = cJSON_AddArrayToObject(it, "content");
            if (done) cJSON_AddItemToArray(c, part_json(r));
        }
    } else if (r->open == ITEM_MESSAGE) {
        cJSON_AddStringToObject(it, "type", "message");
        cJSON_AddStringToObject(it, "role", "assistant");
        cJSON *c = cJSON_AddArrayToObject(it, "content");
        if (done) cJSON_AddItemToArray(c, part_json(r));
    } else {
        cJSON_AddStringToObject(it, "type", "function_call");
        cJSON_AddStringToObject(it, "call_id", r->call_id);
        cJSON_AddStringToObject(it, "name", r->name);
        cJSON_AddItemToObject(it, "arguments", json_text(r->text.p, done ? r->text.len : 0));
    }
    cJSON_AddStringToObject(it, "status", status);
    return it;
}

static void item_open(resp_out *r, item_kind kind, const char *name, size_t name_len, buf *sse) {
    r->open = kind;
    r->text.len = 0;
    r->text.p[0] = 0;
    const int k = r->n_items++;
    snprintf(r->item_id, sizeof r->item_id, "%s_%s_%d", kind == ITEM_REASONING ? "rs" : kind == ITEM_MESSAGE ? "msg" : "fc",
             r->hex, k);
    if (kind == ITEM_REASONING) r->had_reasoning = true;
    if (kind == ITEM_CALL) {
        snprintf(r->call_id, sizeof r->call_id, "call_%s_%d", r->hex, r->n_calls++);
        free(r->name);
        cJSON *nm = json_text(name, name_len);
        r->name = xstrdup(nm->valuestring);
        cJSON_Delete(nm);
    }
    if (!sse) return;
    cJSON *j = event_new("response.output_item.added");
    cJSON_AddNumberToObject(j, "output_index", k);
    cJSON_AddItemToObject(j, "item", item_json(r, "in_progress", false));
    ev_send(r, sse, j);
    if (kind == ITEM_CALL) return;
    j = item_event(r, names_of(r).part_added, true);
    cJSON_AddItemToObject(j, "part", part_json(r));
    ev_send(r, sse, j);
}

static void item_close(resp_out *r, const char *status, buf *sse) {
    if (r->open == ITEM_NONE) return;
    if (sse) {
        const item_names nm = names_of(r);
        cJSON *j = item_event(r, nm.done, r->open != ITEM_CALL);
        cJSON_AddItemToObject(j, r->open == ITEM_CALL ? "arguments" : "text", json_text(r->text.p, r->text.len));
        if (r->open == ITEM_MESSAGE) cJSON_AddArrayToObject(j, "logprobs");
        if (r->open != ITEM_CALL) {
            ev_send(r, sse, j);
            j = item_event(r, nm.part_done, true);
            cJSON_AddItemToObject(j, "part", part_json(r));
        }
        ev_send(r, sse, j);
        j = event_new("response.output_item.done");
        cJSON_AddNumberToObject(j, "output_index", r->n_items - 1);
        cJSON_AddItemToObject(j, "item", item_json(r, status, true));
        ev_send(r, sse, j);
    }
    cJSON_AddItemToArray(r->items, item_json(r, status, true));
    r->open = ITEM_NONE;
}

void resp_begin(resp_out *r, buf *sse) {
    cJSON *j = event_new("response.created");
    cJSON_AddItemToObject(j, "response", response(r, "in_progress", NULL));
    ev_send(r, sse, j);
    j = event_new("response.in_progress");
    cJSON_AddItemToObject(j, "response", response(r, "in_progress", NULL));
    ev_send(r, sse, j);
}

void resp_part(resp_out *r, answer_part part, const char *s, size_t n, buf *sse) {
    if (part == ANSWER_CALL_START) {
        item_close(r, "completed", sse);
        item_open(r, ITEM_CALL, s, n, sse);
        return;
    }
    if (part == ANSWER_CALL_END) {
        item_close(r, "completed", sse);
        return;
    }
    if (part != ANSWER_CALL_ARGS) {
        const item_kind want = part == ANSWER_REASONING ? ITEM_REASONING : ITEM_MESSAGE;
        if (r->open != want) {
            item_close(r, "completed", sse);
            item_open(r, want, NULL, 0, sse);
        }
    }
    if (r->open == ITEM_NONE || n == 0) return; /* (arguments with no call open: none are handed out) */
    buf_add(&r->text, s, n);
    if (!sse) return;
    cJSON *j = item_event(r, names_of(r).delta, r->open != ITEM_CALL);
    cJSON_AddItemToObject(j, "delta", json_text(s, n));
    if (r->open == ITEM_MESSAGE) cJSON_AddArrayToObject(j, "logprobs");
    ev_send(r, sse, j);
}

cJSON *resp_end(resp_out *r, bool length, const resp_usage *u, cJSON *timings, buf *sse) {
    item_close(r, length ? "incomplete" : "completed", sse);
    cJSON *us = cJSON_CreateObject();
    cJSON_AddNumberToObject(us, "input_tokens", (double)u->input);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(us, "input_tokens_details"), "cached_tokens", (double)u->cached);
    cJSON_AddNumberToObject(us, "output_tokens", (double)u->output);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(us, "output_tokens_details"), "reasoning_tokens", (double)u->reasoning);
    cJSON_AddNumberToObject(us, "total_tokens", (double)(u->input + u->output));
    cJSON *j = response(r, length ? "incomplete" : "completed", us);
    cJSON_AddItemToObject(j, "timings", timings);
    if (!sse) return j;
    cJSON *ev = event_new(length ? "response.incomplete" : "response.completed");
    cJSON_AddItemToObject(ev, "response", j);
    ev_send(r, sse, ev);
    return NULL;
}

void resp_fail(resp_out *r, const char *msg, buf *sse) {
    item_close(r, "incomplete", sse);
    cJSON *j = response(r, "failed", NULL);
    cJSON *err = cJSON_CreateObject();
    cJSON_AddStringToObject(err, "code", "server_error");
    cJSON_AddStringToObject(err, "message", msg);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "error", err);
    cJSON *ev = event_new("response.failed");
    cJSON_AddItemToObject(ev, "response", j);
    ev_send(r, sse, ev);
}

int64_t resp_reasoning_tokens(const tokenizer *t, const int32_t *ids, int64_t n) {
    static const char CLOSE[] = "</think>";
    char tail[64]; /* the text's last bytes: "</think>" may come in several tokens */
    size_t tl = 0;
    for (int64_t k = 0; k < n; k++) {
        size_t len;
        const char *p = tokenizer_piece(t, ids[k], true, &len);
        for (size_t i = 0; p && i < len; i++) {
            if (tl == sizeof tail) {
                memmove(tail, tail + sizeof tail / 2, sizeof tail / 2);
                tl = sizeof tail / 2;
            }
            tail[tl++] = p[i];
            if (tl >= sizeof CLOSE - 1 && !memcmp(tail + tl - (sizeof CLOSE - 1), CLOSE, sizeof CLOSE - 1)) return k + 1;
        }
    }
    return n;
}
