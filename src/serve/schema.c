/* schema.c: JSON Schema and tool lists into GBNF (schema.h). Each schema node becomes a rule
 * (s1, s2, ...); $ref targets get one rule each, named before their body is made, so a
 * recursive schema refers to itself. The JSON basics (value, string, number, ...) are
 * written once at the end. Limits: 64 levels of nesting, maxItems and string lengths up to
 * 1000, the text GRAMMAR_MAX_TEXT bytes. */
#include "serve/schema.h"
#include "serve/grammar.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_COUNT 1000

typedef struct sbuf { char *p; size_t n, cap; } sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

#define sb_lit(b, s) sb_add((b), (s), sizeof(s) - 1)

static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[512];
    const int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < (int)sizeof small) { sb_add(b, small, (size_t)n); return; }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    free(big);
}

typedef struct ref_rule { char *ref; char name[24]; } ref_rule;

typedef struct sgen {
    sbuf out;               /* the rules made */
    int n_rules;
    const cJSON *root;      /* where $ref looks */
    ref_rule *refs;
    int n_refs;
    const char *what;
    herr *e;
    bool failed;
    int depth;
} sgen;

static int sfail(sgen *g, const char *path, const char *fmt, const char *arg) {
    if (g->failed) return -1;
    g->failed = true;
    char msg[300];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    herr_set(g->e, "%s: %s (at %s)", g->what, msg, path[0] ? path : "/");
    return -1;
}

static void rule_name(sgen *g, char *name) { snprintf(name, 24, "s%d", ++g->n_rules); }

/* "name ::= " then the body the caller writes, then "\n" (rule_end) */
static void rule_begin(sgen *g, const char *name) { sb_printf(&g->out, "%s ::= ", name); }
static void rule_end(sgen *g) { sb_lit(&g->out, "\n"); }

/* whether s is valid UTF-8 (a GBNF literal is text: a stray byte cannot be written in one) */
static bool utf8_ok(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const int n = *p < 0x80 ? 1 : (*p & 0xe0) == 0xc0 && *p >= 0xc2 ? 2 : (*p & 0xf0) == 0xe0 ? 3
                    : (*p & 0xf8) == 0xf0 && *p <= 0xf4 ? 4 : 0;
        if (!n) return false;
        uint32_t cp = n == 1 ? *p : n == 2 ? *p & 0x1f : n == 3 ? *p & 0x0f : *p & 0x07;
        for (int i = 1; i < n; i++) {
            if ((p[i] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        p += n;
    }
    return true;
}

/* s escaped for a GBNF literal, or NULL (failed) when it is not valid UTF-8 */
static char *esc(sgen *g, const char *s) {
    if (!utf8_ok(s)) { sfail(g, "", "a name or string is not valid UTF-8%s", NULL); return NULL; }
    return gbnf_escape(s, strlen(s));
}

/* a GBNF literal of raw bytes s */
static void lit(sgen *g, const char *s) {
    char *x = esc(g, s);
    if (!x) return;
    sb_printf(&g->out, "\"%s\"", x);
    free(x);
}

/* a JSON value's exact text as a literal, then ws */
static void json_lit(sgen *g, const cJSON *v) {
    char *t = cJSON_PrintUnformatted(v);
    lit(g, t);
    free(t);
    sb_lit(&g->out, " ws");
}

static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", NULL};
static const char *const SUPPORTED[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                        "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
                                        "definitions", "format", "minLength", "maxLength", NULL};

static bool in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return true;
    return false;
}

static int gen_schema(sgen *g, const cJSON *s, const char *path, char *name);

/* a count keyword (minItems, ...): -1 absent; -2 wrong (failed) */
static long count_kw(sgen *g, const cJSON *s, const char *kw, const char *path) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (!x) return -1;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble))
        return sfail(g, path, "\"%s\" must be a whole number >= 0", kw), -2;
    if (x->valuedouble > MAX_COUNT) return sfail(g, path, "\"%s\" over 1000 is not supported", kw), -2;
    return (long)x->valuedouble;
}

/* {lo,hi} with hi < 0 unbounded */
static void bounds(sgen *g, long lo, long hi) {
    if (hi < 0) sb_printf(&g->out, "{%ld,}", lo);
    else sb_printf(&g->out, "{%ld,%ld}", lo, hi);
}

static const char *format_rule(const char *f) {
    return !strcmp(f, "date") ? "date" : !strcmp(f, "time") ? "time" : !strcmp(f, "date-time") ? "date-time"
         : !strcmp(f, "uuid") ? "uuid" : NULL;
}

static int gen_string(sgen *g, const cJSON *s, const char *path, char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
    const long lo = count_kw(g, s, "minLength", path), hi = count_kw(g, s, "maxLength", path);
    if (lo == -2 || hi == -2) return -1;
    if (f) {
        if (!cJSON_IsString(f)) return sfail(g, path, "\"format\" must be a string%s", NULL);
        const char *r = format_rule(f->valuestring);
        if (!r) return sfail(g, path, "string format \"%s\" is not supported (date, time, date-time, uuid are)",
                             f->valuestring);
        if (lo >= 0 || hi >= 0) return sfail(g, path, "minLength or maxLength beside \"format\" is not supported%s", NULL);
        rule_name(g, name);
        rule_begin(g, name);
        sb_printf(&g->out, "\"\\\"\" %s \"\\\"\" ws", r);
        rule_end(g);
        return 0;
    }
    if (lo < 0 && hi < 0) { strcpy(name, "string"); return 0; }
    if (hi >= 0 && lo > hi) return sfail(g, path, "\"minLength\" is over \"maxLength\"%s", NULL);
    rule_name(g, name);
    rule_begin(g, name);
    sb_lit(&g->out, "\"\\\"\" char");
    bounds(g, lo < 0 ? 0 : lo, hi);
    sb_lit(&g->out, " \"\\\"\" ws");
    rule_end(g);
    return 0;
}

static int gen_array(sgen *g, const cJSON *s, const char *path, char *name) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    long lo = count_kw(g, s, "minItems", path), hi = count_kw(g, s, "maxItems", path);
    if (lo == -2 || hi == -2) return -1;
    if (lo < 0) lo = 0;
    if (hi >= 0 && lo > hi) return sfail(g, path, "\"minItems\" is over \"maxItems\"%s", NULL);
    char item[24] = "value";
    if (items) {
        if (cJSON_IsArray(items)) return sfail(g, path, "\"items\" as an array (tuples) is not supported%s", NULL);
        char p[256];
        snprintf(p, sizeof p, "%s/items", path);
        if (gen_schema(g, items, p, item) < 0) return -1;
    }
    rule_name(g, name);
    rule_begin(g, name);
    if (hi == 0) {
        sb_lit(&g->out, "\"[\" ws \"]\" ws");
    } else {
        sb_printf(&g->out, "\"[\" ws %s%s (\",\" ws %s)", lo == 0 ? "(" : "", item, item);
        bounds(g, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
        sb_printf(&g->out, "%s \"]\" ws", lo == 0 ? ")?" : "");
    }
    rule_end(g);
    return 0;
}

/* the key's literal: its JSON text (quotes and escapes), then ws ":" ws */
static void key_lit(sgen *g, const char *key) {
    cJSON *k = cJSON_CreateString(key);
    char *t = cJSON_PrintUnformatted(k);
    lit(g, t);
    free(t);
    cJSON_Delete(k);
    sb_lit(&g->out, " ws \":\" ws");
}

static int gen_object(sgen *g, const cJSON *s, const char *path, char *name) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return sfail(g, path, "\"properties\" must be an object%s", NULL);
    if (req && !cJSON_IsArray(req)) return sfail(g, path, "\"required\" must be an array of names%s", NULL);
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return sfail(g, path, "\"required\" must be an array of names%s", NULL);
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return sfail(g, path, "\"required\" names \"%s\", which is not among \"properties\"", r->valuestring);
    }
    const int n = props ? cJSON_GetArraySize(props) : 0;
    if (n == 0 && !ap) { strcpy(name, "object"); return 0; } /* {"type": "object"}: any object */
    char extra[24] = "";
    if (cJSON_IsTrue(ap) || (!ap && n == 0)) {
        strcpy(extra, "value");
    } else if (cJSON_IsObject(ap)) {
        char p[256];
        snprintf(p, sizeof p, "%s/additionalProperties", path);
        if (gen_schema(g, ap, p, extra) < 0) return -1;
    } else if (ap && !cJSON_IsFalse(ap)) {
        return sfail(g, path, "\"additionalProperties\" must be a boolean or a schema%s", NULL);
    }
    /* each property's key-value rule */
    char (*kv)[24] = xmalloc(sizeof *kv * (size_t)(n + 1));
    bool *opt = xmalloc((size_t)n + 1);
    int k = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        char sub[256], val[24];
        snprintf(sub, sizeof sub, "%s/properties/%.60s", path, p->string);
        if (gen_schema(g, p, sub, val) < 0) { free(kv); free(opt); return -1; }
        opt[k] = true;
        cJSON_ArrayForEach(r, req)
            if (!strcmp(r->valuestring, p->string)) opt[k] = false;
        rule_name(g, kv[k]);
        rule_begin(g, kv[k]);
        key_lit(g, p->string);
        sb_printf(&g->out, " %s", val);
        rule_end(g);
        k++;
    }
    char xkv[24] = "";
    if (extra[0]) {
        rule_name(g, xkv);
        rule_begin(g, xkv);
        sb_printf(&g->out, "string \":\" ws %s", extra);
        rule_end(g);
    }
    /* F_i: from property i on, nothing written yet; N_i: something written (a comma first) */
    char fn[24], nn[24], fprev[24], nprev[24];
    rule_name(g, fprev);
    rule_begin(g, fprev);
    if (xkv[0]) sb_printf(&g->out, "(%s (\",\" ws %s)*)?", xkv, xkv);
    else sb_lit(&g->out, "\"\"");
    rule_end(g);
    rule_name(g, nprev);
    rule_begin(g, nprev);
    if (xkv[0]) sb_printf(&g->out, "(\",\" ws %s)*", xkv);
    else sb_lit(&g->out, "\"\"");
    rule_end(g);
    for (int i = n - 1; i >= 0; i--) {
        rule_name(g, fn);
        rule_begin(g, fn);
        sb_printf(&g->out, "%s %s", kv[i], nprev);
        if (opt[i]) sb_printf(&g->out, " | %s", fprev);
        rule_end(g);
        rule_name(g, nn);
        rule_begin(g, nn);
        sb_printf(&g->out, "\",\" ws %s %s", kv[i], nprev);
        if (opt[i]) sb_printf(&g->out, " | %s", nprev);
        rule_end(g);
        strcpy(fprev, fn);
        strcpy(nprev, nn);
    }
    free(kv);
    free(opt);
    rule_name(g, name);
    rule_begin(g, name);
    sb_printf(&g->out, "\"{\" ws %s \"}\" ws", fprev);
    rule_end(g);
    return 0;
}

static int gen_typed(sgen *g, const cJSON *s, const char *type, const char *path, char *name) {
    if (!strcmp(type, "string")) return gen_string(g, s, path, name);
    if (!strcmp(type, "object")) return gen_object(g, s, path, name);
    if (!strcmp(type, "array")) return gen_array(g, s, path, name);
    if (!strcmp(type, "number") || !strcmp(type, "integer") || !strcmp(type, "boolean") || !strcmp(type, "null")) {
        strcpy(name, type);
        return 0;
    }
    return sfail(g, path, "type \"%s\" is not a JSON Schema type", type);
}

/* the target of a local $ref ("#", "#/$defs/X", "#/definitions/X", any JSON pointer) */
static const cJSON *resolve(sgen *g, const char *ref, const char *path) {
    if (ref[0] != '#') return sfail(g, path, "$ref \"%.80s\" is not local (only #... refs are supported)", ref), NULL;
    const cJSON *at = g->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '1') tok[k++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0') tok[k++] = '~', p += 2;
            else tok[k++] = *p++;
        }
        tok[k] = 0;
        at = cJSON_IsObject(at) ? cJSON_GetObjectItemCaseSensitive(at, tok) : NULL;
        if (!at) break;
    }
    if (!at || *p) return sfail(g, path, "$ref \"%.80s\" is not found in the schema", ref), NULL;
    return at;
}

static int gen_schema(sgen *g, const cJSON *s, const char *path, char *name) {
    if (g->failed) return -1;
    if (cJSON_IsTrue(s)) { strcpy(name, "value"); return 0; }
    if (cJSON_IsFalse(s)) return sfail(g, path, "the schema false matches nothing%s", NULL);
    if (!cJSON_IsObject(s)) return sfail(g, path, "a schema must be an object or a boolean%s", NULL);
    if (++g->depth > MAX_DEPTH) return sfail(g, path, "the schema is nested over 64 deep%s", NULL);
    const cJSON *kw;
    cJSON_ArrayForEach(kw, s) {
        if (!in_list(SUPPORTED, kw->string) && !in_list(ANNOTATIONS, kw->string))
            return sfail(g, path, "\"%.60s\" is not supported", kw->string);
    }
    int rc = 0;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    /* the combining keywords stand alone (beside annotations and $defs) */
    const int combine = !!ref + !!any + !!all + !!(en || cn);
    if (combine > 1 || (combine && (type || cJSON_GetObjectItemCaseSensitive(s, "properties") ||
                                    cJSON_GetObjectItemCaseSensitive(s, "items")))) {
        /* enum/const beside their own type is redundant: allowed */
        if (!((en || cn) && combine == 1))
            return sfail(g, path, "%s beside other constraints is not supported",
                         ref ? "\"$ref\"" : any ? "\"anyOf\"/\"oneOf\"" : all ? "\"allOf\"" : "\"enum\"/\"const\"");
    }
    if (ref) {
        if (!cJSON_IsString(ref)) return sfail(g, path, "\"$ref\" must be a string%s", NULL);
        for (int i = 0; i < g->n_refs; i++)
            if (!strcmp(g->refs[i].ref, ref->valuestring)) { strcpy(name, g->refs[i].name); g->depth--; return 0; }
        const cJSON *t = resolve(g, ref->valuestring, path);
        if (!t) return -1;
        g->refs = xrealloc(g->refs, sizeof *g->refs * (size_t)(g->n_refs + 1));
        ref_rule *rr = &g->refs[g->n_refs++];
        rr->ref = xstrdup(ref->valuestring);
        rule_name(g, rr->name);
        strcpy(name, rr->name);
        char inner[24], rname[24];
        strcpy(rname, rr->name);
        char p[256];
        snprintf(p, sizeof p, "%.200s", ref->valuestring + 1);
        if (gen_schema(g, t, p, inner) < 0) return -1;
        rule_begin(g, rname);
        sb_add(&g->out, inner, strlen(inner));
        rule_end(g);
    } else if (any || all) {
        const cJSON *list = any ? any : all;
        const char *kwn = any ? (cJSON_GetObjectItemCaseSensitive(s, "anyOf") ? "anyOf" : "oneOf") : "allOf";
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
            return sfail(g, path, "\"%s\" must be a non-empty array of schemas", kwn);
        if (all && cJSON_GetArraySize(all) != 1)
            return sfail(g, path, "\"allOf\" of more than one schema is not supported%s", NULL);
        char (*alt)[24] = xmalloc(sizeof *alt * (size_t)cJSON_GetArraySize(list));
        int k = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list) {
            char p[256];
            snprintf(p, sizeof p, "%.200s/%s/%d", path, kwn, k);
            if (gen_schema(g, x, p, alt[k]) < 0) { free(alt); return -1; }
            k++;
        }
        rule_name(g, name);
        rule_begin(g, name);
        for (int i = 0; i < k; i++) sb_printf(&g->out, "%s%s", i ? " | " : "", alt[i]);
        rule_end(g);
        free(alt);
    } else if (en || cn) {
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0))
            return sfail(g, path, "\"enum\" must be a non-empty array%s", NULL);
        rule_name(g, name);
        rule_begin(g, name);
        if (cn) {
            json_lit(g, cn);
        } else {
            const cJSON *x;
            int i = 0;
            cJSON_ArrayForEach(x, en) {
                if (i++) sb_lit(&g->out, " | ");
                json_lit(g, x);
            }
        }
        rule_end(g);
    } else if (cJSON_IsString(type)) {
        rc = gen_typed(g, s, type->valuestring, path, name);
    } else if (cJSON_IsArray(type)) {
        const int n = cJSON_GetArraySize(type);
        if (n == 0) return sfail(g, path, "\"type\" is an empty list%s", NULL);
        char (*alt)[24] = xmalloc(sizeof *alt * (size_t)n);
        int k = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            if (!cJSON_IsString(t)) { free(alt); return sfail(g, path, "\"type\" must be a string or strings%s", NULL); }
            if (gen_typed(g, s, t->valuestring, path, alt[k]) < 0) { free(alt); return -1; }
            k++;
        }
        rule_name(g, name);
        rule_begin(g, name);
        for (int i = 0; i < k; i++) sb_printf(&g->out, "%s%s", i ? " | " : "", alt[i]);
        rule_end(g);
        free(alt);
    } else if (type) {
        return sfail(g, path, "\"type\" must be a string or strings%s", NULL);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
               cJSON_GetObjectItemCaseSensitive(s, "additionalProperties")) {
        rc = gen_object(g, s, path, name);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
               cJSON_GetObjectItemCaseSensitive(s, "maxItems")) {
        rc = gen_array(g, s, path, name);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "format") || cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
               cJSON_GetObjectItemCaseSensitive(s, "maxLength")) {
        rc = gen_string(g, s, path, name);
    } else {
        strcpy(name, "value");
    }
    g->depth--;
    return rc < 0 || g->failed ? -1 : 0;
}

/* JSON's basics, and the formats (quoted by their users) */
static const char BASICS[] =
    "ws ::= \"\" | \" \" | \"\\n\" [ \\t]{0,20}\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws (string \":\" ws value (\",\" ws string \":\" ws value)*)? \"}\" ws\n"
    "array ::= \"[\" ws (value (\",\" ws value)*)? \"]\" ws\n"
    "string ::= \"\\\"\" char* \"\\\"\" ws\n"
    "char ::= [^\"\\\\\\x00-\\x1f\\x7f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? ws\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) ws\n"
    "boolean ::= (\"true\" | \"false\") ws\n"
    "null ::= \"null\" ws\n"
    "date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])\n"
    "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
    "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "date-time ::= date \"T\" time\n"
    "uuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}\n"
    "xtext ::= ([^<] | \"<\" [^/])*\n";

static char *finish(sgen *g, const char *root_body) {
    for (int i = 0; i < g->n_refs; i++) free(g->refs[i].ref);
    free(g->refs);
    if (g->failed) { free(g->out.p); return NULL; }
    sbuf t = {0};
    sb_printf(&t, "root ::= %s\n", root_body);
    sb_add(&t, g->out.p ? g->out.p : "", g->out.n);
    sb_add(&t, BASICS, sizeof BASICS - 1);
    free(g->out.p);
    if (t.n > GRAMMAR_MAX_TEXT) {
        herr_set(g->e, "%s: the schema makes a grammar over %d bytes", g->what, GRAMMAR_MAX_TEXT);
        free(t.p);
        return NULL;
    }
    return t.p;
}

char *schema_to_gbnf(const cJSON *schema, const char *what, herr *e) {
    sgen g = {.root = schema, .what = what, .e = e};
    char name[24];
    if (gen_schema(&g, schema, "", name) < 0) g.failed = true;
    return finish(&g, name);
}

/* a string parameter's raw text in the XML form (the answer takes it as text): an enum's
 * or const's strings, a format, or any text without "</" */
static int xml_string(sgen *g, const cJSON *s, const char *path, char *name) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
    cJSON_ArrayForEach(f, s) {
        if (!in_list(SUPPORTED, f->string) && !in_list(ANNOTATIONS, f->string))
            return sfail(g, path, "\"%.60s\" is not supported", f->string);
    }
    f = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
        return sfail(g, path, "minLength and maxLength of a tool's string parameter are not supported%s", NULL);
    rule_name(g, name);
    rule_begin(g, name);
    if (en || cn) {
        int i = 0;
        const cJSON *x;
        if (cn) {
            if (!cJSON_IsString(cn)) return sfail(g, path, "\"const\" of a string parameter must be a string%s", NULL);
            lit(g, cn->valuestring);
        }
        cJSON_ArrayForEach(x, en) {
            if (!cJSON_IsString(x)) return sfail(g, path, "\"enum\" of a string parameter must hold strings%s", NULL);
            if (i++) sb_lit(&g->out, " | ");
            lit(g, x->valuestring);
        }
    } else if (f) {
        const char *r = cJSON_IsString(f) ? format_rule(f->valuestring) : NULL;
        if (!r) return sfail(g, path, "string format \"%s\" is not supported (date, time, date-time, uuid are)",
                             cJSON_IsString(f) ? f->valuestring : "?");
        sb_add(&g->out, r, strlen(r));
    } else {
        sb_lit(&g->out, "xtext");
    }
    rule_end(g);
    return 0;
}

static const cJSON *tool_fn(const cJSON *t) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    return cJSON_IsObject(f) ? f : t;
}

/* one tool's call after "<function=" (xml) or after {"name": " (json) */
static int tool_call_rule(sgen *g, const cJSON *fn, const char *fname, bool xml, int idx, char *name) {
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    char path[128];
    snprintf(path, sizeof path, "/tools/%d/function/parameters", idx);
    if (params && !cJSON_IsObject(params)) return sfail(g, path, "a tool's \"parameters\" must be an object%s", NULL);
    char body[24];
    if (!xml) {
        cJSON *obj = NULL;
        if (!params || !cJSON_GetObjectItemCaseSensitive(params, "type")) { /* {} or no type: an object */
            obj = params ? cJSON_Duplicate(params, true) : cJSON_CreateObject();
            cJSON_AddStringToObject(obj, "type", "object");
        }
        const int rc = gen_schema(g, obj ? obj : params, path, body);
        cJSON_Delete(obj);
        if (rc < 0) return -1;
        rule_name(g, name);
        rule_begin(g, name);
        char *quoted = esc(g, fname);
        if (!quoted) return -1;
        sb_printf(&g->out, "\"%s\\\", \\\"arguments\\\": \" %s", quoted, body);
        free(quoted);
        rule_end(g);
        return 0;
    }
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(params, "type");
    if (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "object")))
        return sfail(g, path, "a tool's parameters must be of type \"object\"%s", NULL);
    const int n = cJSON_IsObject(props) ? cJSON_GetArraySize(props) : 0;
    char (*pr)[24] = xmalloc(sizeof *pr * (size_t)(n + 1));
    bool *opt = xmalloc((size_t)n + 1);
    int k = 0;
    const cJSON *p, *r;
    cJSON_ArrayForEach(r, req)
        if (!cJSON_IsString(r) || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) {
            free(pr), free(opt);
            return sfail(g, path, "\"required\" names \"%s\", which is not among \"properties\"",
                         cJSON_IsString(r) ? r->valuestring : "?");
        }
    for (p = n ? props->child : NULL; p; p = p->next) {
        char sub[256], val[24];
        snprintf(sub, sizeof sub, "%s/properties/%.60s", path, p->string);
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(p, "type");
        const bool text = cJSON_IsString(pt) && !strcmp(pt->valuestring, "string");
        if ((text ? xml_string(g, p, sub, val) : gen_schema(g, p, sub, val)) < 0) { free(pr), free(opt); return -1; }
        opt[k] = true;
        cJSON_ArrayForEach(r, req)
            if (!strcmp(r->valuestring, p->string)) opt[k] = false;
        rule_name(g, pr[k]);
        rule_begin(g, pr[k]);
        char *pn = esc(g, p->string);
        if (!pn) { free(pr), free(opt); return -1; }
        sb_printf(&g->out, "\"<parameter=%s>\\n\" %s \"\\n</parameter>\\n\"", pn, val);
        free(pn);
        rule_end(g);
        k++;
    }
    char next[24] = "", cur[24];
    for (int i = n - 1; i >= 0; i--) {
        rule_name(g, cur);
        rule_begin(g, cur);
        sb_printf(&g->out, "%s %s", pr[i], next);
        if (opt[i]) sb_printf(&g->out, " | %s", next[0] ? next : "\"\"");
        rule_end(g);
        strcpy(next, cur);
    }
    free(pr);
    free(opt);
    rule_name(g, name);
    rule_begin(g, name);
    char *quoted = esc(g, fname);
    if (!quoted) return -1;
    sb_printf(&g->out, "\"%s>\\n\" %s", quoted, next[0] ? next : "");
    free(quoted);
    rule_end(g);
    return 0;
}

char *schema_tool_gbnf(const cJSON *tools, const char *only, bool xml, bool many, herr *e) {
    sgen g = {.root = NULL, .what = "tools", .e = e};
    sbuf alts = {0};
    int n = 0, idx = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = tool_fn(t);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        char path[64];
        snprintf(path, sizeof path, "/tools/%d", idx);
        if (!cJSON_IsString(nm) || !nm->valuestring[0]) { sfail(&g, path, "a tool has no \"name\"%s", NULL); break; }
        if (only && strcmp(only, nm->valuestring)) { idx++; continue; }
        g.root = cJSON_GetObjectItemCaseSensitive(fn, "parameters"); /* its $refs look here */
        char name[24];
        if (tool_call_rule(&g, fn, nm->valuestring, xml, idx, name) < 0) break;
        sb_printf(&alts, "%s%s", n++ ? " | " : "", name);
        idx++;
    }
    if (!g.failed && n == 0) {
        if (only) herr_set(e, "tool_choice names the function \"%.80s\", which is not among \"tools\"", only);
        else herr_set(e, "tool_choice asks for a call but \"tools\" is empty");
        g.failed = true;
    }
    /* many: llama-server's (tool_call)+ for required calls when parallel calls are allowed
     * (its Qwen3-Coder/Qwen3.5 parser: a call, then zero or more, each followed by optional
     * whitespace). Here a newline at most between calls and after the last (the template
     * writes one between): the answer drops it, where a blank would stay in the content */
    if (!g.failed) {
        sb_printf(&g.out, "call ::= %s\n", alts.p);
        sb_printf(&g.out, xml ? "tool-call ::= \"<tool_call>\\n<function=\" call \"</function>\\n</tool_call>\"\n"
                              : "tool-call ::= \"<tool_call>\\n{\\\"name\\\": \\\"\" call \"}\\n</tool_call>\"\n");
    }
    free(alts.p);
    return finish(&g, many ? "tool-call (\"\\n\"? tool-call)* \"\\n\"?" : "tool-call");
}

/* The priming grammars (schema_prime): what the converters above write for any JSON value,
 * for each type and format, and for a call's parameters of each kind in both call forms */
static const char PRIME_SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\"}, \"i\": {\"type\": \"integer\"}, "
    "\"n\": {\"type\": \"number\"}, \"b\": {\"type\": \"boolean\"}, \"z\": {\"type\": \"null\"}, \"a\": "
    "{\"type\": \"array\", \"items\": {\"type\": \"string\"}}, \"d\": {\"type\": \"string\", \"format\": \"date\"}, "
    "\"t\": {\"type\": \"string\", \"format\": \"time\"}, \"dt\": {\"type\": \"string\", \"format\": "
    "\"date-time\"}, \"u\": {\"type\": \"string\", \"format\": \"uuid\"}, \"o\": {\"type\": \"object\"}}}";
static const char PRIME_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"s\": {\"type\": \"string\"}, \"i\": {\"type\": \"integer\"}, \"n\": {\"type\": "
    "\"number\"}, \"b\": {\"type\": \"boolean\"}, \"e\": {\"type\": \"string\", \"enum\": [\"x\", \"y\"]}, "
    "\"a\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}, \"o\": {\"type\": \"object\"}}}}}]";

void schema_prime(struct gvocab *v, int32_t max_states, const atomic_bool *stop, struct gvocab_prime_stats *ps) {
    herr e;
    cJSON *any = cJSON_Parse("{}"), *sch = cJSON_Parse(PRIME_SCHEMA), *tools = cJSON_Parse(PRIME_TOOLS);
    char *gbnf[4] = {schema_to_gbnf(any, "prime", &e), schema_to_gbnf(sch, "prime", &e),
                     schema_tool_gbnf(tools, NULL, true, true, &e), schema_tool_gbnf(tools, NULL, false, true, &e)};
    for (int k = 0; k < 4; k++) {
        grammar *g = gbnf[k] ? grammar_parse(gbnf[k], strlen(gbnf[k]), &e) : NULL;
        if (!g) HEARTH_DIE("schema_prime: %s", e.msg); /* (the converters' own output: it compiles) */
        gvocab_prime(v, g, max_states, stop, ps);
        grammar_free(g);
        free(gbnf[k]);
    }
    cJSON_Delete(any);
    cJSON_Delete(sch);
    cJSON_Delete(tools);
}
