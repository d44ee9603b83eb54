/* jinja_value.c: the Jinja subset's values: the arena they live in, conversion from cJSON,
 * and Python's semantics for them: truth, ==, ordering, str(), repr() and json.dumps, so
 * that printed values come out as python jinja2 prints them. Where Python's answer depends
 * on Unicode tables this file does not carry (repr of an unusual code point), it fails
 * rather than guess. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

/* ---- arena ---- */
struct jchunk {
    jchunk *next;
    size_t size;
    _Alignas(16) char data[];
};

void *jarena_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n > a->left) {
        size_t want = n > (1u << 16) ? n : (1u << 16);
        if (a->cap && a->total + want > a->cap) {
            herr_set(a->msg, "the template needs more than %zu MiB of memory (limit)", a->cap >> 20);
            longjmp(*a->fail, 1);
        }
        jchunk *ch = xmalloc(sizeof *ch + want);
        ch->next = a->chunks;
        ch->size = want;
        a->chunks = ch;
        a->cur = ch->data;
        a->left = want;
        a->total += want;
    }
    void *p = a->cur;
    a->cur += n;
    a->left -= n;
    memset(p, 0, n);
    return p;
}

void jarena_free(jarena *a) {
    for (jchunk *ch = a->chunks, *nx; ch; ch = nx) {
        nx = ch->next;
        free(ch);
    }
    a->chunks = NULL;
    a->cur = NULL;
    a->left = a->total = 0;
}

/* ---- constructors ---- */
jv jv_str(jctx *c, const char *p, size_t n) {
    char *q = jalloc(c, n + 1);
    if (n) memcpy(q, p, n);
    return jv_strref(q, n);
}

jv jv_list(jctx *c, size_t cap, int sub) {
    jv v = {.t = JV_LIST, .sub = (uint8_t)sub};
    v.l = jalloc(c, sizeof *v.l);
    v.l->cap = cap ? cap : 4;
    v.l->v = jalloc(c, v.l->cap * sizeof(jv));
    return v;
}

void jv_push(jctx *c, jv list, jv item) {
    jlist *l = list.l;
    if (l->n == l->cap) {
        jv *nv = jalloc(c, 2 * l->cap * sizeof(jv));
        memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = item;
}

jv jv_dict(jctx *c, size_t cap) {
    jv v = {.t = JV_DICT};
    v.d = jalloc(c, sizeof *v.d);
    v.d->cap = cap ? cap : 4;
    v.d->k = jalloc(c, v.d->cap * sizeof(jv));
    v.d->v = jalloc(c, v.d->cap * sizeof(jv));
    return v;
}

void jdict_set(jctx *c, jdict *d, jv k, jv v) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k)) { d->v[i] = v; return; }
    if (d->n == d->cap) {
        jv *nk = jalloc(c, 2 * d->cap * sizeof(jv)), *nv = jalloc(c, 2 * d->cap * sizeof(jv));
        memcpy(nk, d->k, d->n * sizeof(jv));
        memcpy(nv, d->v, d->n * sizeof(jv));
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

bool jdict_get(const jdict *d, jv k, jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k)) { *out = d->v[i]; return true; }
    return false;
}

bool jdict_gets(const jdict *d, const char *k, size_t n, jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].s.n == n && !memcmp(d->k[i].s.p, k, n)) { *out = d->v[i]; return true; }
    return false;
}

jv jv_func(jctx *c, jfn fn, jv self, const char *name) {
    jv v = {.t = JV_FUNC};
    v.fn = jalloc(c, sizeof *v.fn);
    v.fn->fn = fn;
    v.fn->self = self;
    v.fn->name = name;
    return v;
}

/* JSON numbers: cJSON keeps only a double, so an integral value becomes an int (Python
 * would keep a float for a literal written 1.0; see src/chat.h). */
jv jv_from_cjson(jctx *c, const cJSON *j, int depth) {
    if (depth > 200) jfail(c, 0, "input JSON nested deeper than 200 levels");
    if (cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j)) {
        size_t n = strlen(j->valuestring);
        if (!utf8_valid(j->valuestring, n)) jfail(c, 0, "input JSON string is not valid UTF-8");
        return jv_strref(j->valuestring, n);
    }
    if (cJSON_IsArray(j)) {
        jv l = jv_list(c, (size_t)cJSON_GetArraySize(j), JL_LIST);
        for (const cJSON *x = j->child; x; x = x->next) jv_push(c, l, jv_from_cjson(c, x, depth + 1));
        return l;
    }
    if (cJSON_IsObject(j)) {
        jv d = jv_dict(c, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *x = j->child; x; x = x->next) {
            size_t n = strlen(x->string);
            if (!utf8_valid(x->string, n)) jfail(c, 0, "input JSON key is not valid UTF-8");
            jdict_set(c, d.d, jv_strref(x->string, n), jv_from_cjson(c, x, depth + 1));
        }
        return d;
    }
    jfail(c, 0, "input JSON holds a value of an unknown kind");
}

/* ---- buffers ---- */
void jbuf_put(jctx *c, jbuf *b, const char *p, size_t n) {
    if (!n) return;
    if (b->n + n > c->max_output) jfail(c, 0, "the rendering exceeds %zu bytes (limit)", c->max_output);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = jalloc(c, cap);
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jbuf_putc(jctx *c, jbuf *b, char ch) { jbuf_put(c, b, &ch, 1); }

void jbuf_printf(jctx *c, jbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    HEARTH_CHECK(n >= 0 && (size_t)n < sizeof tmp);
    jbuf_put(c, b, tmp, (size_t)n);
}

/* ---- UTF-8 ---- */
bool utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned ch = p[i];
        if (ch < 0x80) { i++; continue; }
        size_t len;
        uint32_t cp, min;
        if ((ch & 0xe0) == 0xc0) { len = 2; cp = ch & 0x1f; min = 0x80; }
        else if ((ch & 0xf0) == 0xe0) { len = 3; cp = ch & 0x0f; min = 0x800; }
        else if ((ch & 0xf8) == 0xf0) { len = 4; cp = ch & 0x07; min = 0x10000; }
        else return false;
        if (i + len > n) return false;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += len;
    }
    return true;
}

uint32_t u8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *p = (const unsigned char *)s;
    unsigned ch = p[*i];
    if (ch < 0x80) { (*i)++; return ch; }
    size_t len = (ch & 0xe0) == 0xc0 ? 2 : (ch & 0xf0) == 0xe0 ? 3 : 4;
    uint32_t cp = ch & (len == 2 ? 0x1f : len == 3 ? 0x0f : 0x07);
    for (size_t k = 1; k < len && *i + k < n; k++) cp = (cp << 6) | (p[*i + k] & 0x3f);
    *i += len;
    return cp;
}

size_t u8_len(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)p[i] & 0xc0) != 0x80;
    return k;
}

size_t u8_offset(const char *p, size_t n, size_t k) {
    size_t i = 0;
    while (i < n && k > 0) {
        u8_next(p, n, &i);
        k--;
    }
    return i;
}

bool py_isspace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* ---- Python semantics ---- */
const char *jv_typename(jv v) {
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.sub == JL_TUPLE ? "tuple" : v.sub == JL_LIST ? "list" : "generator";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    default: return "LoopContext";
    }
}

bool jv_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0;
    case JV_STR: return v.s.n != 0;
    case JV_LIST: return v.sub == JL_GEN || v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return true;
    }
}

bool jv_is_num(jv v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
double jv_num(jv v) { return v.t == JV_BOOL ? v.b : v.t == JV_INT ? (double)v.i : v.f; }
static int64_t jv_inum(jv v) { return v.t == JV_BOOL ? v.b : v.i; }

bool jv_eq(jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return jv_inum(a) == jv_inum(b);
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
    case JV_LIST:
        if (a.sub != b.sub) return false;
        if (a.sub == JL_GEN || a.sub == JL_SIZED) return a.l == b.l;
        if (a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv x;
            if (!jdict_get(b.d, a.d->k[i], &x) || !jv_eq(a.d->v[i], x)) return false;
        }
        return true;
    case JV_NS: return a.d == b.d;
    case JV_MACRO: return a.m == b.m;
    case JV_FUNC: return a.fn == b.fn;
    default: return a.lp == b.lp;
    }
}

int jv_cmp(jctx *c, jv a, jv b, int line) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (jv_inum(a) > jv_inum(b)) - (jv_inum(a) < jv_inum(b));
        double x = jv_num(a), y = jv_num(b);
        return (x > y) - (x < y);
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int r = memcmp(a.s.p, b.s.p, n);
        if (r) return r;
        return (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.sub == b.sub && (a.sub == JL_LIST || a.sub == JL_TUPLE)) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_eq(a.l->v[i], b.l->v[i])) continue;
            return jv_cmp(c, a.l->v[i], b.l->v[i], line);
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    jfail(c, line, "'<' not supported between instances of '%s' and '%s'", jv_typename(a), jv_typename(b));
}

void jv_put_float(jbuf *b, jctx *c, double f) {
    if (isnan(f)) { jbuf_puts(c, b, "nan"); return; }
    if (isinf(f)) { jbuf_puts(c, b, f < 0 ? "-inf" : "inf"); return; }
    /* the shortest digits that read back as f, laid out as Python's float.__repr__ */
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg) p++;
    char dig[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') dig[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (neg) jbuf_putc(c, b, '-');
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++) jbuf_putc(c, b, i < nd ? dig[i] : '0');
            jbuf_putc(c, b, '.');
            if (nd > exp + 1) jbuf_put(c, b, dig + exp + 1, (size_t)(nd - exp - 1));
            else jbuf_putc(c, b, '0');
        } else {
            jbuf_puts(c, b, "0.");
            for (int i = 0; i < -exp - 1; i++) jbuf_putc(c, b, '0');
            jbuf_put(c, b, dig, (size_t)nd);
        }
    } else {
        jbuf_putc(c, b, dig[0]);
        if (nd > 1) {
            jbuf_putc(c, b, '.');
            jbuf_put(c, b, dig + 1, (size_t)(nd - 1));
        }
        jbuf_printf(c, b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

/* Code points that str.isprintable() is known to call printable in every Python 3 since
 * 3.8 (assigned, not Cc/Cf/Z*): enough for text in the common scripts and emoji. */
static bool repr_printable(uint32_t cp) {
    static const uint32_t r[][2] = {
        {0xa1, 0xac}, {0xae, 0x377}, {0x37a, 0x37f}, {0x384, 0x38a}, {0x38c, 0x38c}, {0x38e, 0x3a1},
        {0x3a3, 0x52f}, {0x1e00, 0x1eff}, {0x2010, 0x2027}, {0x2030, 0x205e}, {0x20a0, 0x20bf},
        {0x2100, 0x218b}, {0x2190, 0x2426}, {0x2500, 0x2b73}, {0x3001, 0x303f}, {0x3041, 0x3096},
        {0x3099, 0x30ff}, {0x4e00, 0x9fef}, {0xac00, 0xd7a3}, {0xff01, 0xffbe}, {0x1f300, 0x1f64f},
        {0x1f680, 0x1f6c5}, {0x1f910, 0x1f96b},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (cp >= r[i][0] && cp <= r[i][1]) return true;
    return false;
}

/* Code points str.isprintable() calls not printable (Z* other than the space, common Cf,
 * private use): repr() escapes them. */
static bool repr_escaped(uint32_t cp) {
    static const uint32_t r[][2] = {
        {0x600, 0x605}, {0x61c, 0x61c}, {0x6dd, 0x6dd}, {0x70f, 0x70f}, {0x1680, 0x1680}, {0x180e, 0x180e},
        {0x2000, 0x200f}, {0x2028, 0x202f}, {0x205f, 0x2064}, {0x2066, 0x206f}, {0x3000, 0x3000},
        {0xe000, 0xf8ff}, {0xfeff, 0xfeff}, {0xfff9, 0xfffb}, {0xe0001, 0xe0001}, {0xe0020, 0xe007f},
        {0xf0000, 0xffffd}, {0x100000, 0x10fffd},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (cp >= r[i][0] && cp <= r[i][1]) return true;
    return false;
}

static void put_str_repr(jctx *c, jbuf *b, const char *p, size_t n, int line) {
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jbuf_putc(c, b, q);
    for (size_t i = 0; i < n;) {
        size_t at = i;
        uint32_t cp = u8_next(p, n, &i);
        if (cp == (uint32_t)q || cp == '\\') { jbuf_putc(c, b, '\\'); jbuf_putc(c, b, (char)cp); }
        else if (cp == '\n') jbuf_puts(c, b, "\\n");
        else if (cp == '\r') jbuf_puts(c, b, "\\r");
        else if (cp == '\t') jbuf_puts(c, b, "\\t");
        else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) jbuf_printf(c, b, "\\x%02x", cp);
        else if (cp < 0x80 || repr_printable(cp)) jbuf_put(c, b, p + at, i - at);
        else if (repr_escaped(cp)) jbuf_printf(c, b, cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
        else jfail(c, line, "repr() of a string holding U+%04X is not supported", cp);
    }
    jbuf_putc(c, b, q);
}

void jv_put_repr(jctx *c, jbuf *b, jv v, int line) {
    switch (v.t) {
    case JV_STR:
        if (v.sub & JS_MARKUP) {
            jbuf_puts(c, b, "Markup(");
            put_str_repr(c, b, v.s.p, v.s.n, line);
            jbuf_putc(c, b, ')');
        } else {
            put_str_repr(c, b, v.s.p, v.s.n, line);
        }
        return;
    case JV_LIST:
        if (v.sub == JL_GEN || v.sub == JL_SIZED)
            jfail(c, line, "printing a generator, range or dict view is not supported");
        jbuf_putc(c, b, v.sub == JL_TUPLE ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jbuf_puts(c, b, ", ");
            jv_put_repr(c, b, v.l->v[i], line);
        }
        if (v.sub == JL_TUPLE && v.l->n == 1) jbuf_putc(c, b, ',');
        jbuf_putc(c, b, v.sub == JL_TUPLE ? ')' : ']');
        return;
    case JV_DICT:
        jbuf_putc(c, b, '{');
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) jbuf_puts(c, b, ", ");
            jv_put_repr(c, b, v.d->k[i], line);
            jbuf_puts(c, b, ": ");
            jv_put_repr(c, b, v.d->v[i], line);
        }
        jbuf_putc(c, b, '}');
        return;
    case JV_UNDEF: jbuf_puts(c, b, "Undefined"); return;
    default: jv_put_str(c, b, v, line); return;
    }
}

void jv_put_str(jctx *c, jbuf *b, jv v, int line) {
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jbuf_puts(c, b, "None"); return;
    case JV_BOOL: jbuf_puts(c, b, v.b ? "True" : "False"); return;
    case JV_INT: jbuf_printf(c, b, "%lld", (long long)v.i); return;
    case JV_FLOAT: jv_put_float(b, c, v.f); return;
    case JV_STR: jbuf_put(c, b, v.s.p, v.s.n); return;
    case JV_LIST: case JV_DICT: jv_put_repr(c, b, v, line); return;
    default: jfail(c, line, "printing a %s is not supported", jv_typename(v));
    }
}

jv jv_to_str(jctx *c, jv v, int line) {
    if (v.t == JV_STR) return v;
    jbuf b = {0};
    jv_put_str(c, &b, v, line);
    return jbuf_str(&b);
}

/* json.dumps's string encoder (ensure_ascii or not) */
static void put_json_str(jctx *c, jbuf *b, const char *p, size_t n, bool ascii) {
    jbuf_putc(c, b, '"');
    for (size_t i = 0; i < n;) {
        size_t at = i;
        uint32_t cp = u8_next(p, n, &i);
        switch (cp) {
        case '"': jbuf_puts(c, b, "\\\""); break;
        case '\\': jbuf_puts(c, b, "\\\\"); break;
        case '\n': jbuf_puts(c, b, "\\n"); break;
        case '\r': jbuf_puts(c, b, "\\r"); break;
        case '\t': jbuf_puts(c, b, "\\t"); break;
        case '\b': jbuf_puts(c, b, "\\b"); break;
        case '\f': jbuf_puts(c, b, "\\f"); break;
        default:
            if (cp < 0x20 || (ascii && cp >= 0x7f && cp < 0x10000)) jbuf_printf(c, b, "\\u%04x", cp);
            else if (ascii && cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                jbuf_printf(c, b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            } else jbuf_put(c, b, p + at, i - at);
        }
    }
    jbuf_putc(c, b, '"');
}

static void put_json_indent(jctx *c, jbuf *b, const jjson_opts *o, int level) {
    jbuf_putc(c, b, '\n');
    for (int i = 0; i < level; i++) jbuf_puts(c, b, o->indent_str);
}

void jsort(jctx *c, jv *rec, size_t n, size_t width, jcmp_fn cmp, void *arg) {
    if (n < 2) return;
    jv *tmp = jalloc(c, n * width * sizeof(jv));
    for (size_t run = 1; run < n; run *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * run) {
            size_t mid = lo + run < n ? lo + run : n, hi = lo + 2 * run < n ? lo + 2 * run : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid || j < hi) {
                bool take_left = j >= hi || (i < mid && cmp(c, rec + j * width, rec + i * width, arg) >= 0);
                size_t src = take_left ? i++ : j++;
                memcpy(tmp + k++ * width, rec + src * width, width * sizeof(jv));
            }
        }
        memcpy(rec, tmp, n * width * sizeof(jv));
    }
}

static int cmp_keys(jctx *c, const jv *x, const jv *y, void *arg) {
    return jv_cmp(c, x[0], y[0], *(int *)arg);
}

void jv_put_json(jctx *c, jbuf *b, jv v, const jjson_opts *o, int level, int line) {
    if (level > 200) jfail(c, line, "tojson: value nested deeper than 200 levels");
    switch (v.t) {
    case JV_NONE: jbuf_puts(c, b, "null"); return;
    case JV_BOOL: jbuf_puts(c, b, v.b ? "true" : "false"); return;
    case JV_INT: jbuf_printf(c, b, "%lld", (long long)v.i); return;
    case JV_FLOAT:
        if (isnan(v.f)) jbuf_puts(c, b, "NaN");
        else if (isinf(v.f)) jbuf_puts(c, b, v.f < 0 ? "-Infinity" : "Infinity");
        else jv_put_float(b, c, v.f);
        return;
    case JV_STR: put_json_str(c, b, v.s.p, v.s.n, o->ensure_ascii); return;
    case JV_LIST:
        if (v.sub != JL_LIST && v.sub != JL_TUPLE)
            jfail(c, line, "tojson: Object of type generator is not JSON serializable");
        if (!v.l->n) { jbuf_puts(c, b, "[]"); return; }
        jbuf_putc(c, b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jbuf_puts(c, b, o->item_sep);
            if (o->indent >= 0) put_json_indent(c, b, o, level + 1);
            jv_put_json(c, b, v.l->v[i], o, level + 1, line);
        }
        if (o->indent >= 0) put_json_indent(c, b, o, level);
        jbuf_putc(c, b, ']');
        return;
    case JV_DICT: {
        if (!v.d->n) { jbuf_puts(c, b, "{}"); return; }
        size_t n = v.d->n;
        jv *kv = jalloc(c, 2 * n * sizeof(jv)); /* (key, value) pairs */
        for (size_t i = 0; i < n; i++) { kv[2 * i] = v.d->k[i]; kv[2 * i + 1] = v.d->v[i]; }
        if (o->sort_keys) jsort(c, kv, n, 2, cmp_keys, &line);
        jbuf_putc(c, b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) jbuf_puts(c, b, o->item_sep);
            if (o->indent >= 0) put_json_indent(c, b, o, level + 1);
            jv k = kv[2 * i];
            if (k.t == JV_STR) put_json_str(c, b, k.s.p, k.s.n, o->ensure_ascii);
            else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
                jbuf_putc(c, b, '"');
                jv_put_json(c, b, k, o, level + 1, line);
                jbuf_putc(c, b, '"');
            } else jfail(c, line, "tojson: keys must be str, int, float, bool or None, not %s", jv_typename(k));
            jbuf_puts(c, b, o->key_sep);
            jv_put_json(c, b, kv[2 * i + 1], o, level + 1, line);
        }
        if (o->indent >= 0) put_json_indent(c, b, o, level);
        jbuf_putc(c, b, '}');
        return;
    }
    default: jfail(c, line, "tojson: Object of type %s is not JSON serializable", jv_typename(v));
    }
}
