/* constrain.c: a request's fields that constrain sampling (request.h, req_constraints):
 * llama-server's grammar and json_schema, OpenAI's response_format (json_object,
 * json_schema with its schema) and tool_choice forcing a call ("required": one or more
 * unless parallel_tool_calls is false; a named function: one; Anthropic's {"type": "any"}
 * and {"type": "tool", "name"}), compiled to one grammar; logit_bias in OpenAI's map form
 * and llama-server's array form (ids or text, a number or false); n_probs on /completion.
 * At most one grammar source per request. */
#include "serve/request.h"
#include "serve/grammar.h"
#include "serve/schema.h"
#include "serve/sched.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BIAS 4096   /* biased ids per request */

static int add_bias(gen_params *g, int32_t id, float b, herr *e) {
    for (int i = 0; i < g->n_bias; i++)
        if (g->bias_id[i] == id) { g->bias[i] += b; return 0; }
    if (g->n_bias == MAX_BIAS) return herr_set(e, "\"logit_bias\" names over %d tokens", MAX_BIAS);
    g->bias_id = xrealloc(g->bias_id, sizeof *g->bias_id * (size_t)(g->n_bias + 1));
    g->bias = xrealloc(g->bias, sizeof *g->bias * (size_t)(g->n_bias + 1));
    g->bias_id[g->n_bias] = id;
    g->bias[g->n_bias++] = b;
    return 0;
}

/* one entry: key a token id (a number, or a string of digits in the map form) or a text
 * whose every token gets the bias; val a number or false (never) */
static int bias_entry(const req_ctx *x, gen_params *g, const cJSON *key, const char *key_str, const cJSON *val, herr *e) {
    float b;
    if (cJSON_IsFalse(val)) b = -INFINITY;
    else if (cJSON_IsNumber(val) && isfinite(val->valuedouble) && fabs(val->valuedouble) <= 1e6) b = (float)val->valuedouble;
    else return herr_set(e, "\"logit_bias\": a bias must be a number (|b| <= 1e6) or false");
    const int32_t V = tokenizer_n_vocab(x->tok);
    if (key && cJSON_IsNumber(key)) {
        if (key->valuedouble != floor(key->valuedouble) || key->valuedouble < 0 || key->valuedouble >= V)
            return herr_set(e, "\"logit_bias\": %g is no token id in [0, %d)", key->valuedouble, V);
        return add_bias(g, (int32_t)key->valuedouble, b, e);
    }
    const char *s = key ? (cJSON_IsString(key) ? key->valuestring : NULL) : key_str;
    if (!s) return herr_set(e, "\"logit_bias\": a token must be an id or a text");
    size_t n = strlen(s), digits = 0;
    while (digits < n && s[digits] >= '0' && s[digits] <= '9') digits++;
    if (!key && n > 0 && digits == n) { /* the map form's "123" */
        const long id = n > 9 ? -1 : strtol(s, NULL, 10);
        if (id < 0 || id >= V) return herr_set(e, "\"logit_bias\": \"%.20s\" is no token id in [0, %d)", s, V);
        return add_bias(g, (int32_t)id, b, e);
    }
    if (n == 0) return herr_set(e, "\"logit_bias\": an empty text has no tokens");
    int64_t k = 0;
    int32_t *ids = tokenizer_encode_alloc(x->tok, s, n, false, &k);
    int rc = 0;
    for (int64_t i = 0; i < k && !rc; i++) rc = add_bias(g, ids[i], b, e);
    free(ids);
    return rc;
}

static int logit_bias(const req_ctx *x, const cJSON *j, gen_params *g, herr *e) {
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(j, "logit_bias");
    if (!lb || cJSON_IsNull(lb)) return 0;
    const cJSON *it;
    if (cJSON_IsObject(lb)) {
        cJSON_ArrayForEach(it, lb)
            if (bias_entry(x, g, NULL, it->string, it, e) < 0) return -1;
        return 0;
    }
    if (!cJSON_IsArray(lb)) return herr_set(e, "\"logit_bias\" must be an object or an array of [token, bias] pairs");
    cJSON_ArrayForEach(it, lb) {
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2)
            return herr_set(e, "\"logit_bias\" must be an object or an array of [token, bias] pairs");
        if (bias_entry(x, g, cJSON_GetArrayItem(it, 0), NULL, cJSON_GetArrayItem(it, 1), e) < 0) return -1;
    }
    return 0;
}

/* tool_choice forcing a call: 1 with *name (NULL: any tool), 0 not forcing, -1 wrong */
static int forced_tool(const cJSON *j, const char **name, herr *e) {
    const cJSON *tch = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    *name = NULL;
    if (!tch || cJSON_IsNull(tch)) return 0;
    const cJSON *ty = cJSON_IsObject(tch) ? cJSON_GetObjectItemCaseSensitive(tch, "type") : tch;
    if (!cJSON_IsString(ty)) return herr_set(e, "\"tool_choice\" must be a string or an object with a \"type\"");
    const char *t = ty->valuestring;
    if (!strcmp(t, "auto") || !strcmp(t, "none")) return 0;
    if (!strcmp(t, "required") || !strcmp(t, "any")) return 1;
    const cJSON *nm = NULL;
    if (!strcmp(t, "function") && cJSON_IsObject(tch)) /* OpenAI: {"type": "function", "function": {"name"}} */
        nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tch, "function"), "name");
    else if (!strcmp(t, "tool") && cJSON_IsObject(tch)) /* Anthropic: {"type": "tool", "name"} */
        nm = cJSON_GetObjectItemCaseSensitive(tch, "name");
    else
        return herr_set(e, "\"tool_choice\" \"%.40s\" is not one of auto, none, required, a function (OpenAI), any or "
                           "tool (Anthropic)", t);
    if (!cJSON_IsString(nm) || !nm->valuestring[0]) return herr_set(e, "\"tool_choice\" names no function");
    *name = nm->valuestring;
    return 1;
}

int req_constraints(const req_ctx *x, const cJSON *j, api_kind kind, gen_params *g, herr *e) {
    if (logit_bias(x, j, g, e) < 0) return -1;
    /* n_probs: /completion's alternatives per token (llama-server's completion_probabilities) */
    int64_t np = 0;
    const cJSON *npj = cJSON_GetObjectItemCaseSensitive(j, "n_probs");
    if (npj && !cJSON_IsNull(npj)) {
        if (!cJSON_IsNumber(npj) || npj->valuedouble != floor(npj->valuedouble) || npj->valuedouble < 0)
            return herr_set(e, "\"n_probs\" must be a whole number >= 0");
        if (npj->valuedouble > SCHED_MAX_TOP) return herr_set(e, "\"n_probs\" over %d is not supported", SCHED_MAX_TOP);
        np = (int64_t)npj->valuedouble;
    }
    if (np > 0 && kind != API_COMPLETION)
        return herr_set(e, "\"n_probs\" is /completion's; use \"logprobs\" and \"top_logprobs\" here");
    if (np > 0) g->top_logprobs = (int)np;
    const cJSON *psp = cJSON_GetObjectItemCaseSensitive(j, "post_sampling_probs");
    if (cJSON_IsTrue(psp)) return herr_set(e, "\"post_sampling_probs\" is not supported (log-probabilities are of the model's softmax)");
    /* the grammar: from one source */
    char *gbnf = NULL;
    const char *src = NULL;
    const cJSON *gr = cJSON_GetObjectItemCaseSensitive(j, "grammar");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(j, "json_schema");
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(j, "response_format");
    const char *tool = NULL;
    const int forced = forced_tool(j, &tool, e);
    if (forced < 0) return -1;
    int n_src = 0;
    if (gr && !cJSON_IsNull(gr) && !(cJSON_IsString(gr) && !gr->valuestring[0])) {
        if (!cJSON_IsString(gr)) return herr_set(e, "\"grammar\" must be a string of GBNF");
        gbnf = xstrdup(gr->valuestring);
        src = "grammar", n_src++;
    }
    if (js && !cJSON_IsNull(js)) {
        free(gbnf);
        if (!(gbnf = schema_to_gbnf(js, "json_schema", e))) return -1;
        src = "json_schema", n_src++;
    }
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(t)) { free(gbnf); return herr_set(e, "\"response_format\" must be an object with a \"type\""); }
        if (!strcmp(t->valuestring, "json_object")) {
            /* llama-server's extension: a "schema" beside it constrains the object */
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(rf, "schema");
            cJSON *obj = sc ? NULL : cJSON_Parse("{\"type\": \"object\"}");
            free(gbnf);
            gbnf = schema_to_gbnf(sc ? sc : obj, "response_format.schema", e);
            cJSON_Delete(obj);
            if (!gbnf) return -1;
            src = "response_format", n_src++;
        } else if (!strcmp(t->valuestring, "json_schema")) {
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(w, "schema");
            if (!sc) sc = cJSON_GetObjectItemCaseSensitive(rf, "schema");
            if (!sc) { free(gbnf); return herr_set(e, "\"response_format\" json_schema needs \"json_schema\": {\"schema\": ...}"); }
            free(gbnf);
            if (!(gbnf = schema_to_gbnf(sc, "response_format.json_schema.schema", e))) return -1;
            src = "response_format", n_src++;
        } else if (strcmp(t->valuestring, "text")) {
            free(gbnf);
            return herr_set(e, "\"response_format\" of type \"%.40s\" is not one of text, json_object, json_schema",
                            t->valuestring);
        }
    }
    if (forced) {
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
        if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0) {
            free(gbnf);
            return herr_set(e, "\"tool_choice\" asks for a call but there are no \"tools\"");
        }
        size_t tl = 0;
        const char *ts = x->tmpl ? chat_template_source(x->tmpl, &tl) : NULL;
        const bool xml = ts && memmem(ts, tl, "<function=", 10); /* Qwen3.5/3.6's form, else Qwen3's JSON */
        free(gbnf);
        /* "required" / "any" with parallel calls allowed (parallel_tool_calls absent or true;
         * Anthropic's disable_parallel_tool_use comes here as false): one or more calls, as
         * llama-server's grammar; false: exactly one. A named function: one call of it
         * (OpenAI's "call exactly one specific function") */
        const bool many = !tool && !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "parallel_tool_calls"));
        if (!(gbnf = schema_tool_gbnf(tools, tool, xml, many, e))) return -1;
        src = "tool_choice", n_src++;
    }
    if (n_src > 1) {
        free(gbnf);
        return herr_set(e, "only one of \"grammar\", \"json_schema\", \"response_format\" (json) and a forcing "
                           "\"tool_choice\" may be given");
    }
    if (!gbnf) return 0;
    g->grammar = grammar_parse(gbnf, strlen(gbnf), e);
    free(gbnf);
    if (!g->grammar) {
        char msg[sizeof e->msg];
        snprintf(msg, sizeof msg, "%s", e->msg);
        return herr_set(e, "\"%s\": %s", src, msg);
    }
    return 0;
}
