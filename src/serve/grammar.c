/* grammar.c: GBNF into byte-level rules, and the pushdown matcher over them with its lazy DFA
 * and the vocabulary trie walk (grammar.h). Written from the GBNF notation as llama.cpp
 * documents it (grammars/README.md); the compiler and matcher are hearth's own.
 *
 * Compiled form: every rule is a list of alternatives, each a sequence of elements ended by
 * END: TERM (one byte out of a 256-bit set) or REF (another rule). Repetitions become helper
 * rules (X* is R ::= X R | ""), and a character class becomes a rule whose alternatives are
 * the UTF-8 byte sequences of its code points (ASCII in one TERM). A stack is a node (a
 * position, the node it returns to), hash-consed; a state is a sorted set of stacks whose
 * top is a TERM, plus whether the grammar may end there. Masks: the position cache (its
 * section below says how a stack top's tokens are sorted once into accepted, refused and
 * context-dependent, and shared per vocabulary), then walks of the context-dependent ones. */
#include "serve/grammar.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ compiled grammar */

enum { GE_END = 0, GE_TERM, GE_REF };

typedef struct gelem {
    int32_t kind;
    int32_t arg;            /* TERM: its byte set; REF: the rule; END: the rule it ends */
} gelem;

typedef struct bset { uint64_t w[4]; } bset;

static inline bool bset_has(const bset *s, unsigned b) { return (s->w[b >> 6] >> (b & 63)) & 1; }
static inline void bset_add(bset *s, unsigned b) { s->w[b >> 6] |= 1ull << (b & 63); }

struct grammar {
    gelem *el;              /* every alternative's elements, END after each */
    int32_t n_el;
    bset *sets;
    int32_t n_sets;
    int32_t *alt;           /* the first element of each alternative, rule by rule */
    int32_t *rule_alt, *rule_n_alt; /* a rule's alternatives: alt[rule_alt[r] ..] */
    int32_t n_rules, root;
};

int32_t grammar_n_rules(const grammar *g) { return g->n_rules; }

void grammar_free(grammar *g) {
    if (!g) return;
    free(g->el);
    free(g->sets);
    free(g->alt);
    free(g->rule_alt);
    free(g->rule_n_alt);
    free(g);
}

/* ---------------------------------------------------------------- building */

typedef struct seq { gelem *e; int32_t n, cap; } seq;

typedef struct brule {
    char *name;             /* NULL: made by the compiler */
    bool defined;
    int64_t at;             /* byte offset of its first use, for "not defined" */
    seq *alts;
    int32_t n_alts, cap_alts;
} brule;

typedef struct builder {
    const char *s, *end, *p;
    brule *r;
    int32_t n_r, cap_r;
    bset *sets;
    int32_t n_sets, cap_sets;
    int64_t n_elems;        /* elements made so far, against GRAMMAR_MAX_ELEMS */
    int32_t *names;         /* open addressing over the named rules' ids */
    int32_t names_cap, n_named;
    int depth;
    herr *e;
    bool failed;
} builder;

static void where(const builder *b, const char *at, int *line, int *col) {
    *line = 1, *col = 1;
    for (const char *q = b->s; q < at && q < b->end; q++) {
        if (*q == '\n') (*line)++, *col = 1;
        else (*col)++;
    }
}

/* an error at the parser's position (the first one wins) */
static int fail(builder *b, const char *fmt, const char *arg) {
    if (b->failed) return -1;
    b->failed = true;
    int line, col;
    where(b, b->p, &line, &col);
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    herr_set(b->e, "grammar: %s (line %d, column %d)", msg, line, col);
    return -1;
}

static int32_t new_rule(builder *b, const char *name, size_t n) {
    if (b->n_r == b->cap_r) {
        b->cap_r = b->cap_r ? 2 * b->cap_r : 64;
        b->r = xrealloc(b->r, sizeof *b->r * (size_t)b->cap_r);
    }
    brule *r = &b->r[b->n_r];
    *r = (brule){0};
    if (name) {
        r->name = xmalloc(n + 1);
        memcpy(r->name, name, n);
        r->name[n] = 0;
    }
    r->at = b->p - b->s;
    return b->n_r++;
}

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static void names_insert(builder *b, int32_t id) {
    uint32_t h = name_hash(b->r[id].name, strlen(b->r[id].name)) & (uint32_t)(b->names_cap - 1);
    while (b->names[h] >= 0) h = (h + 1) & (uint32_t)(b->names_cap - 1);
    b->names[h] = id;
}

static int32_t rule_by_name(builder *b, const char *name, size_t n) {
    if (2 * (b->n_named + 1) > b->names_cap) {
        free(b->names);
        b->names_cap = b->names_cap ? 2 * b->names_cap : 64;
        b->names = xmalloc(sizeof *b->names * (size_t)b->names_cap);
        for (int32_t i = 0; i < b->names_cap; i++) b->names[i] = -1;
        for (int32_t i = 0; i < b->n_r; i++)
            if (b->r[i].name) names_insert(b, i);
    }
    uint32_t h = name_hash(name, n) & (uint32_t)(b->names_cap - 1);
    for (int32_t id; (id = b->names[h]) >= 0; h = (h + 1) & (uint32_t)(b->names_cap - 1))
        if (strlen(b->r[id].name) == n && !memcmp(b->r[id].name, name, n)) return id;
    const int32_t id = new_rule(b, name, n);
    b->n_named++;
    names_insert(b, id);
    return id;
}

static int32_t new_set(builder *b, const bset *s) {
    if (b->n_sets == b->cap_sets) {
        b->cap_sets = b->cap_sets ? 2 * b->cap_sets : 64;
        b->sets = xrealloc(b->sets, sizeof *b->sets * (size_t)b->cap_sets);
    }
    b->sets[b->n_sets] = *s;
    return b->n_sets++;
}

static int seq_add(builder *b, seq *q, int32_t kind, int32_t arg) {
    if (++b->n_elems > GRAMMAR_MAX_ELEMS) return fail(b, "over %s elements once compiled", "1048576");
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 8;
        q->e = xrealloc(q->e, sizeof *q->e * (size_t)q->cap);
    }
    q->e[q->n++] = (gelem){kind, arg};
    return 0;
}

static int seq_add_byte(builder *b, seq *q, unsigned c) {
    bset s = {{0}};
    bset_add(&s, c);
    return seq_add(b, q, GE_TERM, new_set(b, &s));
}

/* a new alternative of rule r (a copy of q; q stays the caller's) */
static void rule_add_alt(builder *b, int32_t r, const seq *q) {
    brule *R = &b->r[r];
    if (R->n_alts == R->cap_alts) {
        R->cap_alts = R->cap_alts ? 2 * R->cap_alts : 4;
        R->alts = xrealloc(R->alts, sizeof *R->alts * (size_t)R->cap_alts);
    }
    seq c = {0};
    if (q->n) {
        c.e = xmalloc(sizeof *c.e * (size_t)q->n);
        memcpy(c.e, q->e, sizeof *c.e * (size_t)q->n);
        c.n = c.cap = q->n;
    }
    R->alts[R->n_alts++] = c;
}

/* ---------------------------------------------------------------- lexing */

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

static void skip_space(builder *b) {
    while (b->p < b->end) {
        if (*b->p == '#') {
            while (b->p < b->end && *b->p != '\n') b->p++;
        } else if (*b->p == ' ' || *b->p == '\t' || *b->p == '\n' || *b->p == '\r') {
            b->p++;
        } else {
            break;
        }
    }
}

static size_t name_len(const char *p, const char *end) {
    size_t n = 0;
    while (p + n < end && is_name_char(p[n])) n++;
    return n;
}

/* the next thing is `name ::=`: a new rule starts */
static bool at_rule_start(const builder *b) {
    const size_t n = name_len(b->p, b->end);
    if (!n) return false;
    const char *q = b->p + n;
    while (q < b->end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
    return b->end - q >= 3 && !memcmp(q, "::=", 3);
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* one character of a literal or class (escapes and UTF-8): its code point, or -1 */
static int32_t read_char(builder *b) {
    if (b->p >= b->end) return fail(b, "unexpected end of the grammar%s", NULL);
    unsigned char c = (unsigned char)*b->p;
    if (c == '\\') {
        if (++b->p >= b->end) return fail(b, "unexpected end after \\%s", NULL);
        const char x = *b->p++;
        switch (x) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '/': case '\'': case '^': case '.': return x;
        case 'x': case 'u': case 'U': {
            const int nd = x == 'x' ? 2 : x == 'u' ? 4 : 8;
            int32_t v = 0;
            for (int i = 0; i < nd; i++) {
                const int h = b->p < b->end ? hexval(*b->p) : -1;
                if (h < 0) return fail(b, "\\%s needs hex digits", x == 'x' ? "x" : x == 'u' ? "u" : "U");
                v = v * 16 + h;
                b->p++;
                if (v > 0x10FFFF) return fail(b, "code point over U+10FFFF%s", NULL);
            }
            return v;
        }
        default: {
            char esc[2] = {x, 0};
            b->p--;
            return fail(b, "unknown escape \\%s", esc);
        }
        }
    }
    /* UTF-8: a well-formed sequence is one code point; a stray byte stands for itself */
    const int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 0 || b->end - b->p < len) return fail(b, "invalid UTF-8 in the grammar%s", NULL);
    int32_t v = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (int i = 1; i < len; i++) {
        const unsigned char k = (unsigned char)b->p[i];
        if ((k & 0xc0) != 0x80) return fail(b, "invalid UTF-8 in the grammar%s", NULL);
        v = (v << 6) | (k & 0x3f);
    }
    b->p += len;
    return v;
}

static int utf8_put(int32_t cp, unsigned char *out) {
    if (cp < 0x80) { out[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { out[0] = (unsigned char)(0xc0 | cp >> 6); out[1] = (unsigned char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---------------------------------------------------------------- classes to UTF-8 */

typedef struct cprange { int32_t lo, hi; } cprange;

static int cpr_cmp(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* sorted, merged, surrogates taken out; with negate, the complement over U+0000..U+10FFFF */
static int32_t ranges_norm(cprange *r, int32_t n, bool negate, cprange *out) {
    qsort(r, (size_t)n, sizeof *r, cpr_cmp);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m && r[i].lo <= out[m - 1].hi + 1) {
            if (r[i].hi > out[m - 1].hi) out[m - 1].hi = r[i].hi;
        } else {
            out[m++] = r[i];
        }
    }
    if (negate) {
        cprange *c = xmalloc(sizeof *c * (size_t)(m + 1));
        int32_t k = 0, at = 0;
        for (int32_t i = 0; i < m; i++) {
            if (out[i].lo > at) c[k++] = (cprange){at, out[i].lo - 1};
            at = out[i].hi + 1;
        }
        if (at <= 0x10FFFF) c[k++] = (cprange){at, 0x10FFFF};
        memcpy(out, c, sizeof *c * (size_t)k);
        free(c);
        m = k;
    }
    /* no surrogates: they are no UTF-8 (out has room: one range may split in two) */
    int32_t k = 0;
    cprange *c = xmalloc(sizeof *c * (size_t)(2 * m + 1));
    for (int32_t i = 0; i < m; i++) {
        if (out[i].hi < 0xD800 || out[i].lo > 0xDFFF) { c[k++] = out[i]; continue; }
        if (out[i].lo < 0xD800) c[k++] = (cprange){out[i].lo, 0xD7FF};
        if (out[i].hi > 0xDFFF) c[k++] = (cprange){0xE000, out[i].hi};
    }
    memcpy(out, c, sizeof *c * (size_t)k);
    free(c);
    return k;
}

/* a UTF-8 byte-range sequence: len ranges [lo[i], hi[i]] */
typedef struct u8seq { int len; unsigned char lo[4], hi[4]; } u8seq;

typedef struct u8list { u8seq *s; int32_t n, cap; } u8list;

static void u8_push(u8list *l, const u8seq *s) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->s = xrealloc(l->s, sizeof *l->s * (size_t)l->cap);
    }
    l->s[l->n++] = *s;
}

/* [lo, hi] (no surrogates) as UTF-8 byte-range sequences: split at the encoded lengths' bounds,
 * then until every byte position is a plain range */
static void u8_split(u8list *l, int32_t lo, int32_t hi) {
    static const int32_t bound[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bound[i] && hi > bound[i]) {
            u8_split(l, lo, bound[i]);
            u8_split(l, bound[i] + 1, hi);
            return;
        }
    unsigned char a[4], z[4];
    const int n = utf8_put(lo, a);
    utf8_put(hi, z);
    for (int i = 1; i < n; i++) {
        const int32_t m = (1 << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                u8_split(l, lo, lo | m);
                u8_split(l, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                u8_split(l, lo, (hi & ~m) - 1);
                u8_split(l, hi & ~m, hi);
                return;
            }
        }
    }
    u8seq s = {.len = n};
    for (int i = 0; i < n; i++) s.lo[i] = a[i], s.hi[i] = z[i];
    u8_push(l, &s);
}

/* the class's code point ranges as elements of q: one TERM when all are ASCII, else a REF
 * to a new rule of the UTF-8 sequences (those sharing their continuation ranges merged) */
static int class_elems(builder *b, seq *q, cprange *r, int32_t n, bool negate) {
    cprange *norm = xmalloc(sizeof *norm * (size_t)(n + 2));
    const int32_t m = ranges_norm(r, n, negate, norm);
    u8list l = {0};
    for (int32_t i = 0; i < m; i++) u8_split(&l, norm[i].lo, norm[i].hi);
    free(norm);
    bset ascii = {{0}};
    bool any_ascii = false;
    /* merged sequences: the first byte a set, the rest ranges */
    typedef struct { int len; bset first; unsigned char lo[4], hi[4]; } mseq;
    mseq *ms = xmalloc(sizeof *ms * (size_t)(l.n + 1));
    int32_t nm = 0;
    for (int32_t i = 0; i < l.n; i++) {
        const u8seq *s = &l.s[i];
        if (s->len == 1) {
            for (unsigned c = s->lo[0]; c <= s->hi[0]; c++) bset_add(&ascii, c);
            any_ascii = true;
            continue;
        }
        int32_t j = 0;
        while (j < nm && !(ms[j].len == s->len && !memcmp(ms[j].lo + 1, s->lo + 1, (size_t)s->len - 1) &&
                           !memcmp(ms[j].hi + 1, s->hi + 1, (size_t)s->len - 1)))
            j++;
        if (j == nm) {
            ms[nm] = (mseq){.len = s->len};
            memcpy(ms[nm].lo, s->lo, 4);
            memcpy(ms[nm].hi, s->hi, 4);
            nm++;
        }
        for (unsigned c = s->lo[0]; c <= s->hi[0]; c++) bset_add(&ms[j].first, c);
    }
    free(l.s);
    int rc = 0;
    if (nm == 0) { /* ASCII only (or nothing: a set that matches no byte) */
        rc = seq_add(b, q, GE_TERM, new_set(b, &ascii));
    } else {
        const int32_t rr = new_rule(b, NULL, 0);
        seq a = {0};
        if (any_ascii) {
            rc |= seq_add(b, &a, GE_TERM, new_set(b, &ascii));
            rule_add_alt(b, rr, &a);
        }
        for (int32_t j = 0; j < nm && !rc; j++) {
            a.n = 0;
            rc |= seq_add(b, &a, GE_TERM, new_set(b, &ms[j].first));
            for (int i = 1; i < ms[j].len; i++) {
                bset s = {{0}};
                for (unsigned c = ms[j].lo[i]; c <= ms[j].hi[i]; c++) bset_add(&s, c);
                rc |= seq_add(b, &a, GE_TERM, new_set(b, &s));
            }
            rule_add_alt(b, rr, &a);
        }
        free(a.e);
        if (!rc) rc = seq_add(b, q, GE_REF, rr);
    }
    free(ms);
    return rc;
}

/* ---------------------------------------------------------------- the parser */

static int parse_alts(builder *b, int32_t rule);

/* `[...]` at b->p (past the '[') into q */
static int parse_class(builder *b, seq *q) {
    bool negate = false;
    if (b->p < b->end && *b->p == '^') negate = true, b->p++;
    int32_t n = 0, cap = 16;
    cprange *r = xmalloc(sizeof *r * (size_t)cap);
    for (;;) {
        if (b->p >= b->end) { free(r); return fail(b, "a character class is not closed with ]%s", NULL); }
        if (*b->p == ']') { b->p++; break; }
        const int32_t lo = read_char(b);
        if (lo < 0) { free(r); return -1; }
        int32_t hi = lo;
        if (b->end - b->p >= 2 && b->p[0] == '-' && b->p[1] != ']') {
            b->p++;
            hi = read_char(b);
            if (hi < 0) { free(r); return -1; }
            if (hi < lo) { free(r); return fail(b, "a class range ends before it starts%s", NULL); }
        }
        if (n == cap) r = xrealloc(r, sizeof *r * (size_t)(cap *= 2));
        r[n++] = (cprange){lo, hi};
    }
    const int rc = class_elems(b, q, r, n, negate);
    free(r);
    return rc;
}

/* a rule whose one alternative is q[from..) (q is cut back to from) */
static int32_t wrap(builder *b, seq *q, int32_t from) {
    if (q->n - from == 1 && q->e[from].kind == GE_REF) { /* already one rule */
        const int32_t r = q->e[from].arg;
        q->n = from;
        return r;
    }
    const int32_t r = new_rule(b, NULL, 0);
    seq a = {.e = q->e + from, .n = q->n - from};
    rule_add_alt(b, r, &a);
    q->n = from;
    return r;
}

/* R ::= P R | "" : P repeated any number of times */
static int32_t star_rule(builder *b, int32_t p) {
    const int32_t r = new_rule(b, NULL, 0);
    seq a = {0};
    int rc = seq_add(b, &a, GE_REF, p);
    rc |= seq_add(b, &a, GE_REF, r);
    if (!rc) rule_add_alt(b, r, &a);
    a.n = 0;
    rule_add_alt(b, r, &a);
    free(a.e);
    return rc ? -1 : r;
}

static int parse_count(builder *b, long *v) {
    skip_space(b);
    if (b->p >= b->end || *b->p < '0' || *b->p > '9') return fail(b, "a repetition count is expected in {}%s", NULL);
    long x = 0;
    while (b->p < b->end && *b->p >= '0' && *b->p <= '9') {
        x = x * 10 + (*b->p++ - '0');
        if (x > GRAMMAR_MAX_REPEAT) return fail(b, "a repetition count over %s", "10000");
    }
    *v = x;
    skip_space(b);
    return 0;
}

/* the postfix operator at b->p applied to q[from..) */
static int repeat(builder *b, seq *q, int32_t from) {
    const char op = *b->p++;
    long lo, hi;
    if (op == '*') lo = 0, hi = -1;
    else if (op == '+') lo = 1, hi = -1;
    else if (op == '?') lo = 0, hi = 1;
    else {
        if (parse_count(b, &lo) < 0) return -1;
        hi = lo;
        if (b->p < b->end && *b->p == ',') {
            b->p++;
            skip_space(b);
            hi = -1;
            if (b->p < b->end && *b->p != '}' && parse_count(b, &hi) < 0) return -1;
        }
        if (b->p >= b->end || *b->p != '}') return fail(b, "a repetition is not closed with }%s", NULL);
        b->p++;
        if (hi >= 0 && hi < lo) return fail(b, "a repetition's maximum is under its minimum%s", NULL);
    }
    if (from == q->n) return fail(b, "a repetition follows nothing%s", NULL);
    const int32_t p = wrap(b, q, from);
    for (long i = 0; i < lo; i++)
        if (seq_add(b, q, GE_REF, p) < 0) return -1;
    if (hi < 0) {
        const int32_t r = star_rule(b, p);
        return r < 0 ? -1 : seq_add(b, q, GE_REF, r);
    }
    /* up to hi - lo more: O_k ::= P O_{k-1} | "", O_1 ::= P | "" */
    int32_t prev = -1;
    for (long k = 0; k < hi - lo; k++) {
        const int32_t o = new_rule(b, NULL, 0);
        seq a = {0};
        int rc = seq_add(b, &a, GE_REF, p);
        if (prev >= 0) rc |= seq_add(b, &a, GE_REF, prev);
        if (!rc) rule_add_alt(b, o, &a);
        a.n = 0;
        rule_add_alt(b, o, &a);
        free(a.e);
        if (rc) return -1;
        prev = o;
    }
    return prev >= 0 ? seq_add(b, q, GE_REF, prev) : 0;
}

/* a sequence into q, up to '|', ')', the next rule or the end */
static int parse_seq(builder *b, seq *q) {
    for (;;) {
        skip_space(b);
        if (b->p >= b->end || *b->p == '|' || *b->p == ')' || at_rule_start(b)) return 0;
        const int32_t from = q->n;
        const char c = *b->p;
        if (c == '"') {
            b->p++;
            for (;;) {
                if (b->p >= b->end) return fail(b, "a string literal is not closed with \"%s", NULL);
                if (*b->p == '"') { b->p++; break; }
                const int32_t cp = read_char(b);
                if (cp < 0) return -1;
                unsigned char u[4];
                const int n = utf8_put(cp, u);
                for (int i = 0; i < n; i++)
                    if (seq_add_byte(b, q, u[i]) < 0) return -1;
            }
        } else if (c == '[') {
            b->p++;
            if (parse_class(b, q) < 0) return -1;
        } else if (c == '.') {
            b->p++;
            cprange all = {0, 0x10FFFF};
            if (class_elems(b, q, &all, 1, false) < 0) return -1;
        } else if (c == '(') {
            b->p++;
            if (++b->depth > 100) return fail(b, "parentheses nested over 100 deep%s", NULL);
            const int32_t r = new_rule(b, NULL, 0);
            if (parse_alts(b, r) < 0) return -1;
            if (b->p >= b->end || *b->p != ')') return fail(b, "a ( is not closed with )%s", NULL);
            b->p++;
            b->depth--;
            if (seq_add(b, q, GE_REF, r) < 0) return -1;
        } else if (is_name_char(c)) {
            const size_t n = name_len(b->p, b->end);
            const int32_t r = rule_by_name(b, b->p, n);
            b->p += n;
            if (seq_add(b, q, GE_REF, r) < 0) return -1;
        } else {
            char s[2] = {c, 0};
            return fail(b, "unexpected '%s'", s);
        }
        /* postfix operators, any number ("a"+? is ("a"+)?) */
        for (;;) {
            const char *save = b->p;
            skip_space(b);
            if (b->p < b->end && (*b->p == '*' || *b->p == '+' || *b->p == '?' || *b->p == '{')) {
                if (repeat(b, q, from) < 0) return -1;
            } else {
                b->p = save;
                break;
            }
        }
    }
}

static int parse_alts(builder *b, int32_t rule) {
    seq q = {0};
    for (;;) {
        q.n = 0;
        if (parse_seq(b, &q) < 0) { free(q.e); return -1; }
        rule_add_alt(b, rule, &q);
        skip_space(b);
        if (b->p < b->end && *b->p == '|') { b->p++; continue; }
        free(q.e);
        return 0;
    }
}

/* ---------------------------------------------------------------- checks and layout */

static void builder_free(builder *b) {
    for (int32_t i = 0; i < b->n_r; i++) {
        for (int32_t k = 0; k < b->r[i].n_alts; k++) free(b->r[i].alts[k].e);
        free(b->r[i].alts);
        free(b->r[i].name);
    }
    free(b->r);
    free(b->sets);
    free(b->names);
}

/* a rule's display name: its own, or "a group in <the named rule defined before it>" */
static void rule_label(const builder *b, int32_t r, char *out, size_t cap) {
    if (b->r[r].name) { snprintf(out, cap, "\"%s\"", b->r[r].name); return; }
    int32_t k = r;
    while (k >= 0 && !b->r[k].name) k--;
    if (k >= 0) snprintf(out, cap, "a group or repetition in \"%s\"", b->r[k].name);
    else snprintf(out, cap, "a group");
}

/* Left recursion (a rule that can reach itself before any byte) would make the matcher's
 * expansion endless: refused, naming the rule. Found by a depth-first walk over the edges
 * "r can start with s" (s after only nullable rules). */
static int check_left_recursion(builder *b) {
    const int32_t n = b->n_r;
    bool *nullable = xcalloc((size_t)n, 1);
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (int32_t k = 0; k < b->r[r].n_alts && !nullable[r]; k++) {
                const seq *a = &b->r[r].alts[k];
                int32_t i = 0;
                while (i < a->n && a->e[i].kind == GE_REF && nullable[a->e[i].arg]) i++;
                if (i == a->n) nullable[r] = changed = true;
            }
        }
    }
    /* the edges, rule by rule */
    int32_t *eoff = xmalloc(sizeof *eoff * (size_t)(n + 1)), *edge = NULL;
    int64_t ne = 0, cap = 0;
    for (int32_t r = 0; r < n; r++) {
        eoff[r] = (int32_t)ne;
        for (int32_t k = 0; k < b->r[r].n_alts; k++) {
            const seq *a = &b->r[r].alts[k];
            for (int32_t i = 0; i < a->n && a->e[i].kind == GE_REF; i++) {
                if (ne == cap) edge = xrealloc(edge, sizeof *edge * (size_t)(cap = cap ? 2 * cap : 256));
                edge[ne++] = a->e[i].arg;
                if (!nullable[a->e[i].arg]) break;
            }
        }
    }
    eoff[n] = (int32_t)ne;
    /* iterative DFS with colours: 0 new, 1 on the path, 2 done; it[r] the next edge */
    char *colour = xcalloc((size_t)n, 1);
    int32_t *it = xmalloc(sizeof *it * (size_t)n), *stack = xmalloc(sizeof *stack * (size_t)n);
    int rc = 0;
    for (int32_t s0 = 0; s0 < n && !rc; s0++) {
        if (colour[s0]) continue;
        int32_t sp = 0;
        stack[sp++] = s0;
        colour[s0] = 1;
        it[s0] = eoff[s0];
        while (sp && !rc) {
            const int32_t r = stack[sp - 1];
            if (it[r] == eoff[r + 1]) { colour[r] = 2; sp--; continue; }
            const int32_t x = edge[it[r]++];
            if (colour[x] == 1) {
                char lab[160];
                rule_label(b, x, lab, sizeof lab);
                herr_set(b->e, "grammar: rule %s is left-recursive (it can reach itself before reading a byte, "
                               "or repeats something that may be empty); write the repetition with * or +, or make "
                               "the repeated part non-empty", lab);
                rc = -1;
            } else if (colour[x] == 0) {
                colour[x] = 1;
                it[x] = eoff[x];
                stack[sp++] = x;
            }
        }
    }
    free(stack);
    free(it);
    free(colour);
    free(edge);
    free(eoff);
    free(nullable);
    return rc;
}

grammar *grammar_parse(const char *text, size_t len, herr *e) {
    if (len > GRAMMAR_MAX_TEXT) {
        herr_set(e, "grammar: over %d bytes", GRAMMAR_MAX_TEXT);
        return NULL;
    }
    builder b = {.s = text, .end = text + len, .p = text, .e = e};
    skip_space(&b);
    if (b.p == b.end) fail(&b, "the grammar is empty%s", NULL);
    while (!b.failed) {
        skip_space(&b);
        if (b.p >= b.end) break;
        const size_t n = name_len(b.p, b.end);
        if (!n) { fail(&b, "a rule name is expected%s", NULL); break; }
        const int32_t r = rule_by_name(&b, b.p, n);
        if (b.r[r].defined) {
            fail(&b, "rule \"%s\" is defined twice", b.r[r].name);
            break;
        }
        b.r[r].defined = true;
        b.p += n;
        skip_space(&b);
        if (b.end - b.p < 3 || memcmp(b.p, "::=", 3)) { fail(&b, "::= is expected after a rule name%s", NULL); break; }
        b.p += 3;
        if (parse_alts(&b, r) < 0) break;
        if (b.p < b.end && *b.p == ')') fail(&b, "a ) closes nothing%s", NULL);
    }
    int32_t root = -1;
    for (int32_t i = 0; !b.failed && i < b.n_r; i++) {
        if (b.r[i].name && !b.r[i].defined) {
            int line, col;
            where(&b, b.s + b.r[i].at, &line, &col);
            herr_set(e, "grammar: rule \"%s\" is used (line %d, column %d) but not defined", b.r[i].name, line, col);
            b.failed = true;
        }
        if (b.r[i].name && !strcmp(b.r[i].name, "root")) root = i;
    }
    if (!b.failed && root < 0) {
        herr_set(e, "grammar: no rule \"root\" (the start)");
        b.failed = true;
    }
    if (!b.failed && check_left_recursion(&b) < 0) b.failed = true;
    if (b.failed) {
        builder_free(&b);
        return NULL;
    }
    grammar *g = xcalloc(1, sizeof *g);
    int64_t n_el = 0, n_alt = 0;
    for (int32_t i = 0; i < b.n_r; i++) {
        n_alt += b.r[i].n_alts;
        for (int32_t k = 0; k < b.r[i].n_alts; k++) n_el += b.r[i].alts[k].n + 1;
    }
    g->el = xmalloc(sizeof *g->el * (size_t)n_el);
    g->alt = xmalloc(sizeof *g->alt * (size_t)(n_alt + 1));
    g->rule_alt = xmalloc(sizeof *g->rule_alt * (size_t)b.n_r);
    g->rule_n_alt = xmalloc(sizeof *g->rule_n_alt * (size_t)b.n_r);
    int32_t na = 0;
    for (int32_t i = 0; i < b.n_r; i++) {
        g->rule_alt[i] = na;
        g->rule_n_alt[i] = b.r[i].n_alts;
        for (int32_t k = 0; k < b.r[i].n_alts; k++) {
            g->alt[na++] = g->n_el;
            if (b.r[i].alts[k].n) memcpy(g->el + g->n_el, b.r[i].alts[k].e, sizeof *g->el * (size_t)b.r[i].alts[k].n);
            g->n_el += b.r[i].alts[k].n;
            g->el[g->n_el++] = (gelem){GE_END, i};
        }
    }
    g->sets = b.sets;
    g->n_sets = b.n_sets;
    b.sets = NULL;
    g->n_rules = b.n_r;
    g->root = root;
    builder_free(&b);
    return g;
}

char *gbnf_escape(const char *s, size_t n) {
    char *out = xmalloc(4 * n + 1), *o = out;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') *o++ = '\\', *o++ = (char)c;
        else if (c == '\n') *o++ = '\\', *o++ = 'n';
        else if (c == '\r') *o++ = '\\', *o++ = 'r';
        else if (c == '\t') *o++ = '\\', *o++ = 't';
        else if (c < 0x20 || c == 0x7f) o += sprintf(o, "\\x%02x", c);
        else *o++ = (char)c; /* UTF-8 passes as it is (read back as code points) */
    }
    *o = 0;
    return out;
}

/* ================================================================ the vocabulary trie */

/* Preorder layout: node i's subtree is [i, end[i]); node 0 is the root (no byte). The tokens
 * whose bytes end at node i are tok[tok_off[i] .. tok_off[i + 1]). */
/* Bytes in 8 classes, for skipping whole subtrees: a walk at a state that every byte of the
 * classes below a trie node leaves unchanged (inside a JSON string, letters, digits, spaces
 * and most punctuation) takes the node's whole subtree without visiting it. */
enum { BC_ALNUM, BC_SPACE, BC_QUOTE, BC_BSLASH, BC_LT, BC_PUNCT, BC_CTRL, BC_HIGH };

static uint8_t byte_class(unsigned c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return BC_ALNUM;
    if (c == ' ') return BC_SPACE;
    if (c == '"') return BC_QUOTE;
    if (c == '\\') return BC_BSLASH;
    if (c == '<') return BC_LT;
    if (c >= 0x80) return BC_HIGH;
    if (c < 0x20 || c == 0x7f) return BC_CTRL;
    return BC_PUNCT;
}

struct gvocab {
    int32_t n_vocab;
    int64_t n_nodes;
    uint8_t *byte, *depth;
    int32_t *end;
    int32_t *tok_off, *tok;
    int32_t max_depth;
    uint8_t *below;         /* the byte classes (byte_class) met below node i in its subtree */
    /* per token: its bytes (for the one-token check) */
    char **piece;
    uint32_t *piece_len;
    bool *eog;
    struct pshare *share;   /* position entries shared by its matchers (the one mutable part) */
};

int32_t gvocab_n(const gvocab *v) { return v->n_vocab; }
const char *gvocab_piece(const gvocab *v, int32_t id, size_t *len) {
    *len = v->piece_len[id];
    return v->piece[id];
}
int64_t gvocab_trie_nodes(const gvocab *v) { return v->n_nodes; }

typedef struct tpiece { const char *p; uint32_t len; int32_t id; } tpiece;

static int piece_cmp(const void *a, const void *b) {
    const tpiece *x = a, *y = b;
    const uint32_t m = x->len < y->len ? x->len : y->len;
    const int c = memcmp(x->p, y->p, m);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static struct pshare *pshare_new(void);
static void pshare_free(struct pshare *sh);

gvocab *gvocab_from(int32_t n, const char *const *pieces, const size_t *lens, const bool *eog) {
    gvocab *v = xcalloc(1, sizeof *v);
    v->n_vocab = n;
    v->piece = xmalloc(sizeof *v->piece * (size_t)n);
    v->piece_len = xmalloc(sizeof *v->piece_len * (size_t)n);
    v->eog = xmalloc((size_t)n);
    tpiece *order = xmalloc(sizeof *order * (size_t)(n + 1));
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        v->eog[i] = eog ? eog[i] : false;
        const size_t len = lens[i] > 255 ? 0 : lens[i]; /* a token over 255 bytes is never allowed */
        v->piece_len[i] = (uint32_t)len;
        v->piece[i] = xmalloc(len + 1);
        memcpy(v->piece[i], pieces[i], len);
        v->piece[i][len] = 0;
        if (len && !v->eog[i]) order[m++] = (tpiece){v->piece[i], (uint32_t)len, i};
    }
    qsort(order, (size_t)m, sizeof *order, piece_cmp);
    /* nodes: one per distinct prefix; sorted pieces make the trie in preorder directly */
    int64_t cap = 1024;
    v->byte = xmalloc((size_t)cap), v->depth = xmalloc((size_t)cap);
    v->end = xmalloc(sizeof *v->end * (size_t)cap);
    v->tok_off = xmalloc(sizeof *v->tok_off * (size_t)(cap + 1));
    v->tok = xmalloc(sizeof *v->tok * (size_t)(m + 1));
    int64_t nn = 1;
    v->byte[0] = 0, v->depth[0] = 0;
    int32_t path[256];      /* the node at each depth of the current path */
    path[0] = 0;
    int32_t plen = 0, nt = 0;
    const char *prev = NULL;
    size_t prev_len = 0;
    for (int32_t k = 0; k < m; k++) {
        const int32_t id = order[k].id;
        const char *p = order[k].p;
        const size_t len = order[k].len;
        size_t common = 0;
        while (prev && common < prev_len && common < len && prev[common] == p[common]) common++;
        /* close the nodes past the common prefix */
        for (int32_t d = plen; d > (int32_t)common; d--) v->end[path[d]] = (int32_t)nn;
        plen = (int32_t)common;
        for (size_t d = common; d < len; d++) {
            if (nn + 1 >= cap) {
                cap *= 2;
                v->byte = xrealloc(v->byte, (size_t)cap), v->depth = xrealloc(v->depth, (size_t)cap);
                v->end = xrealloc(v->end, sizeof *v->end * (size_t)cap);
                v->tok_off = xrealloc(v->tok_off, sizeof *v->tok_off * (size_t)(cap + 1));
            }
            v->byte[nn] = (uint8_t)p[d];
            v->depth[nn] = (uint8_t)(d + 1);
            v->tok_off[nn] = nt;
            path[d + 1] = (int32_t)nn++;
            plen = (int32_t)d + 1;
        }
        if ((int32_t)len > v->max_depth) v->max_depth = (int32_t)len;
        /* the token ends at path[len]; tokens are appended in preorder, so the node's list
         * is the run of tok written while it is the last node */
        v->tok[nt++] = id;
        prev = p, prev_len = len;
    }
    for (int32_t d = plen; d > 0; d--) v->end[path[d]] = (int32_t)nn;
    v->end[0] = (int32_t)nn;
    v->tok_off[0] = 0;
    v->tok_off[nn] = nt;
    /* tok_off[i] was set when node i was made, to the tokens written before it; a node with
     * no token of its own has tok_off[i] == tok_off[i + 1] */
    v->n_nodes = nn;
    free(order);
    /* below[i]: the classes of i's children and below theirs (children: i + 1, then end[c]) */
    v->below = xcalloc((size_t)nn, 1);
    for (int64_t i = nn - 1; i >= 0; i--)
        for (int64_t c = i + 1; c < v->end[i]; c = v->end[c]) v->below[i] |= (uint8_t)(1u << byte_class(v->byte[c])) | v->below[c];
    v->share = pshare_new();
    return v;
}

gvocab *gvocab_new(const tokenizer *t) {
    const int32_t n = tokenizer_n_vocab(t);
    const char **p = xmalloc(sizeof *p * (size_t)n);
    size_t *l = xmalloc(sizeof *l * (size_t)n);
    bool *eog = xmalloc((size_t)n);
    for (int32_t i = 0; i < n; i++) {
        p[i] = tokenizer_piece(t, i, false, &l[i]);
        if (!p[i]) p[i] = "", l[i] = 0;
        eog[i] = tokenizer_is_eog(t, i);
    }
    gvocab *v = gvocab_from(n, p, l, eog);
    free(p);
    free(l);
    free(eog);
    return v;
}

void gvocab_free(gvocab *v) {
    if (!v) return;
    for (int32_t i = 0; i < v->n_vocab; i++) free(v->piece[i]);
    free(v->piece);
    free(v->piece_len);
    free(v->eog);
    free(v->byte);
    free(v->depth);
    free(v->below);
    free(v->end);
    free(v->tok_off);
    free(v->tok);
    pshare_free(v->share);
    free(v);
}

/* ================================================================ the matcher */

#define MAX_NODES (1 << 21)   /* stack nodes before the tables are rebuilt */
#define MAX_STATES (1 << 14)  /* DFA states before the tables are rebuilt */
#define MASK_SLOTS 64         /* masks cached (each n_vocab bits) */
#define DEAD (-1)
#define UNKNOWN (-2)

typedef struct gstate {
    int32_t off, n;         /* its stacks: set[off .. off + n) */
    bool accept;            /* the grammar may end here */
    int32_t mask;           /* its mask's slot, or -1 */
    int16_t loop;           /* the byte classes all of whose bytes lead back to it, -1 unknown */
} gstate;

struct gmatch {
    const grammar *g;
    const gvocab *v;
    /* stack nodes: (pos, parent), node 0 the bottom; hash-consed */
    int32_t *pos, *parent;
    int32_t n_nodes, cap_nodes;
    int32_t *nh;            /* open addressing over node ids, size nh_cap (power of 2) */
    int32_t nh_cap;
    /* closures: a node's TERM-topped stacks (lazily, -1 unknown) */
    int32_t *clo_off, *clo_n;
    bool *clo_acc;
    int32_t *clo;
    int64_t n_clo, cap_clo;
    uint32_t *mark;         /* visit stamps per node */
    uint32_t stamp;
    /* states */
    gstate *st;
    int32_t n_st, cap_st;
    int32_t *set;
    int64_t n_set, cap_set;
    int32_t *sh;            /* open addressing over state ids */
    int32_t sh_cap;
    int32_t *tt;            /* transitions: state s's 256 next states at tt[256 s ..], UNKNOWN until
                             * computed (one table, so a walk's step is one read of it) */
    int32_t cap_tt;         /* states it has room for */
    int32_t cur;            /* the current state */
    bool ended;
    /* masks */
    uint64_t *masks;        /* MASK_SLOTS x words */
    int32_t mask_owner[MASK_SLOTS];
    int32_t mask_next;
    int64_t words;
    int64_t mask_count[MASK_SLOTS];
    int32_t *walk;          /* state per trie depth */
    /* scratch */
    int32_t *tmp, *work;
    int64_t cap_tmp, cap_work;
    gmatch_stats stats;
    bool overflow;          /* a cap was hit inside a step: the step fails */
    /* the position cache (pentry, below) */
    bool whole_walks;       /* every mask a whole trie walk (tests, benchmarks) */
    bool no_share;          /* entries neither taken from nor given to the vocabulary's table */
    bool primed_only;       /* entries taken from the primed ones only, none given (benchmarks) */
    bool pin;               /* gvocab_prime's matcher: entries made are pinned in the table */
    bool pin_full;          /* the primed entries reached their caps */
    int plant;              /* a planted defect (gmatch_plant_defect), 0 none */
    struct gmatch *am;      /* the abstract matcher: one stack's top over a context (its node 0) */
    struct pslot *pe;       /* this matcher's entries by key */
    int32_t n_pe, cap_pe;
    int64_t pe_bytes;
    int32_t *peh;           /* open addressing over entries by key, peh_cap (power of 2) */
    int32_t peh_cap;
    int32_t *node_pe;       /* per node: its stack's entry, -1 not looked up (cap_nodes) */
    int32_t *path_node;     /* per trie depth, while an entry is made: the node on the path */
    bool *path_in, *path_pop;
    int32_t *acc_tmp, *unc_tmp, *ent_tmp, *sig, *canon, *queue;
    int64_t cap_unc_tmp, cap_ent_tmp, cap_sig, cap_queue; /* acc_tmp: n_vocab */
};

static inline uint32_t hash2(int32_t a, int32_t b) {
    uint64_t x = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static void node_table_reset(gmatch *m) {
    m->n_nodes = 1;
    m->pos[0] = -1, m->parent[0] = -1;
    for (int32_t i = 0; i < m->nh_cap; i++) m->nh[i] = -1;
    m->n_clo = 0;
    m->clo_off[0] = -1;
    m->node_pe[0] = -1;
}

static void node_grow_hash(gmatch *m) {
    free(m->nh);
    m->nh_cap *= 2;
    m->nh = xmalloc(sizeof *m->nh * (size_t)m->nh_cap);
    for (int32_t i = 0; i < m->nh_cap; i++) m->nh[i] = -1;
    for (int32_t id = 1; id < m->n_nodes; id++) {
        uint32_t h = hash2(m->pos[id], m->parent[id]) & (uint32_t)(m->nh_cap - 1);
        while (m->nh[h] >= 0) h = (h + 1) & (uint32_t)(m->nh_cap - 1);
        m->nh[h] = id;
    }
}

/* the node (pos, parent), made if new; -1 past MAX_NODES */
static int32_t node(gmatch *m, int32_t pos, int32_t parent) {
    uint32_t h = hash2(pos, parent) & (uint32_t)(m->nh_cap - 1);
    for (int32_t id; (id = m->nh[h]) >= 0; h = (h + 1) & (uint32_t)(m->nh_cap - 1))
        if (m->pos[id] == pos && m->parent[id] == parent) return id;
    if (m->n_nodes >= MAX_NODES) { m->overflow = true; return -1; }
    if (m->n_nodes == m->cap_nodes) {
        m->cap_nodes *= 2;
        m->pos = xrealloc(m->pos, sizeof *m->pos * (size_t)m->cap_nodes);
        m->parent = xrealloc(m->parent, sizeof *m->parent * (size_t)m->cap_nodes);
        m->clo_off = xrealloc(m->clo_off, sizeof *m->clo_off * (size_t)m->cap_nodes);
        m->clo_n = xrealloc(m->clo_n, sizeof *m->clo_n * (size_t)m->cap_nodes);
        m->clo_acc = xrealloc(m->clo_acc, (size_t)m->cap_nodes);
        m->mark = xrealloc(m->mark, sizeof *m->mark * (size_t)m->cap_nodes);
        m->node_pe = xrealloc(m->node_pe, sizeof *m->node_pe * (size_t)m->cap_nodes);
    }
    const int32_t id = m->n_nodes++;
    m->pos[id] = pos, m->parent[id] = parent;
    m->clo_off[id] = -1;
    m->mark[id] = 0;
    m->node_pe[id] = -1;
    m->nh[h] = id;
    m->stats.nodes++;
    if (2 * m->n_nodes > m->nh_cap) node_grow_hash(m);
    return id;
}

static void push_tmp(int32_t **a, int64_t *n, int64_t *cap, int32_t v) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        *a = xrealloc(*a, sizeof **a * (size_t)*cap);
    }
    (*a)[(*n)++] = v;
}

/* The stacks x expands to whose top is a TERM (x's closure), memoized per node: a REF
 * pushes each alternative of its rule, an END returns to the position after the parent's
 * REF, the bottom's END means the grammar may end. No left recursion (checked at compile
 * time), so the walk ends; stamps keep it from visiting a node twice. */
static int closure(gmatch *m, int32_t x) {
    if (m->clo_off[x] >= 0) return 0;
    const grammar *g = m->g;
    if (++m->stamp == 0) { /* the stamps wrapped: clear them */
        memset(m->mark, 0, sizeof *m->mark * (size_t)m->n_nodes);
        m->stamp = 1;
    }
    int64_t nw = 0, start = m->n_clo;
    bool acc = false;
    push_tmp(&m->work, &nw, &m->cap_work, x);
    m->mark[x] = m->stamp;
    while (nw > 0) {
        const int32_t y = m->work[--nw];
        const gelem *el = &g->el[m->pos[y]];
        int32_t next[1] = {-1};
        if (el->kind == GE_TERM) {
            push_tmp(&m->clo, &m->n_clo, &m->cap_clo, y);
            if (m->n_clo - start > GMATCH_MAX_STACKS) { m->overflow = true; return -1; }
            continue;
        }
        if (el->kind == GE_END) {
            const int32_t p = m->parent[y];
            if (p == 0) { acc = true; continue; }
            next[0] = node(m, m->pos[p] + 1, m->parent[p]);
            if (next[0] < 0) return -1;
            if (m->mark[next[0]] != m->stamp) {
                m->mark[next[0]] = m->stamp;
                push_tmp(&m->work, &nw, &m->cap_work, next[0]);
            }
            continue;
        }
        /* a REF last in its alternative returns straight to y's parent (a tail call): a
         * repetition (R ::= P R) then keeps its depth, so its states repeat and are cached */
        const int32_t r = el->arg, ret = g->el[m->pos[y] + 1].kind == GE_END ? m->parent[y] : y;
        for (int32_t k = g->rule_n_alt[r] - 1; k >= 0; k--) {
            const int32_t c = node(m, g->alt[g->rule_alt[r] + k], ret);
            if (c < 0) return -1;
            if (m->mark[c] != m->stamp) {
                m->mark[c] = m->stamp;
                push_tmp(&m->work, &nw, &m->cap_work, c);
            }
        }
    }
    m->clo_off[x] = (int32_t)start;
    m->clo_n[x] = (int32_t)(m->n_clo - start);
    m->clo_acc[x] = acc;
    return 0;
}

static int i32_cmp(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t set_hash(const int32_t *s, int32_t n, bool acc) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)acc;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 1099511628211ull;
    h ^= h >> 29;
    return (uint32_t)h;
}

static void state_grow_hash(gmatch *m) {
    free(m->sh);
    m->sh_cap *= 2;
    m->sh = xmalloc(sizeof *m->sh * (size_t)m->sh_cap);
    for (int32_t i = 0; i < m->sh_cap; i++) m->sh[i] = -1;
    for (int32_t id = 0; id < m->n_st; id++) {
        uint32_t h = set_hash(m->set + m->st[id].off, m->st[id].n, m->st[id].accept) & (uint32_t)(m->sh_cap - 1);
        while (m->sh[h] >= 0) h = (h + 1) & (uint32_t)(m->sh_cap - 1);
        m->sh[h] = id;
    }
}

/* the state of stacks s[0..n) (sorted, distinct) and acc; DEAD when empty and not acc */
static int32_t state_of(gmatch *m, const int32_t *s, int32_t n, bool acc) {
    if (n == 0 && !acc) return DEAD;
    uint32_t h = set_hash(s, n, acc) & (uint32_t)(m->sh_cap - 1);
    for (int32_t id; (id = m->sh[h]) >= 0; h = (h + 1) & (uint32_t)(m->sh_cap - 1)) {
        const gstate *t = &m->st[id];
        if (t->n == n && t->accept == acc && (!n || !memcmp(m->set + t->off, s, sizeof *s * (size_t)n))) return id;
    }
    if (m->n_st == m->cap_st) {
        m->cap_st *= 2;
        m->st = xrealloc(m->st, sizeof *m->st * (size_t)m->cap_st);
    }
    if (m->n_set + n > m->cap_set) {
        while (m->n_set + n > m->cap_set) m->cap_set *= 2;
        m->set = xrealloc(m->set, sizeof *m->set * (size_t)m->cap_set);
    }
    const int32_t id = m->n_st++;
    if (id >= m->cap_tt) {
        m->cap_tt = m->cap_tt ? 2 * m->cap_tt : 64;
        m->tt = xrealloc(m->tt, sizeof *m->tt * 256 * (size_t)m->cap_tt);
    }
    for (int i = 0; i < 256; i++) m->tt[256 * (int64_t)id + i] = UNKNOWN;
    if (n) memcpy(m->set + m->n_set, s, sizeof *s * (size_t)n);
    m->st[id] = (gstate){.off = (int32_t)m->n_set, .n = n, .accept = acc, .mask = -1, .loop = -1};
    m->n_set += n;
    m->sh[h] = id;
    m->stats.states++;
    if (2 * m->n_st > m->sh_cap) state_grow_hash(m);
    return id;
}

/* the union of the closures of nodes tmp[0..nt), as a state */
static int32_t state_from_nodes(gmatch *m, int64_t nt) {
    bool acc = false;
    int64_t n_out = 0;
    /* the closures are appended to work (the stamps dedupe: a fresh stamp) */
    for (int64_t i = 0; i < nt; i++)
        if (closure(m, m->tmp[i]) < 0) return DEAD;
    if (++m->stamp == 0) {
        memset(m->mark, 0, sizeof *m->mark * (size_t)m->n_nodes);
        m->stamp = 1;
    }
    for (int64_t i = 0; i < nt; i++) {
        const int32_t x = m->tmp[i];
        acc |= m->clo_acc[x];
        for (int32_t k = 0; k < m->clo_n[x]; k++) {
            const int32_t y = m->clo[m->clo_off[x] + k];
            if (m->mark[y] == m->stamp) continue;
            m->mark[y] = m->stamp;
            push_tmp(&m->work, &n_out, &m->cap_work, y);
        }
    }
    if (n_out > GMATCH_MAX_STACKS) { m->overflow = true; return DEAD; }
    if (n_out > 1) qsort(m->work, (size_t)n_out, sizeof *m->work, i32_cmp);
    return state_of(m, m->work, (int32_t)n_out, acc);
}

/* the state after byte c from state s (computed once, then read from its table) */
static int32_t step_compute(gmatch *m, int32_t s, unsigned c) {
    const grammar *g = m->g;
    int64_t nt = 0;
    const int32_t off = m->st[s].off, n = m->st[s].n;
    for (int32_t i = 0; i < n; i++) {
        const int32_t x = m->set[off + i];
        const gelem *el = &g->el[m->pos[x]];
        if (!bset_has(&g->sets[el->arg], c)) continue;
        const int32_t y = node(m, m->pos[x] + 1, m->parent[x]);
        if (y < 0) return DEAD;
        push_tmp(&m->tmp, &nt, &m->cap_tmp, y);
    }
    const int32_t t = nt ? state_from_nodes(m, nt) : DEAD;
    if (m->overflow) return DEAD;
    m->tt[256 * (int64_t)s + c] = t;
    m->stats.transitions++;
    return t;
}

static inline int32_t step(gmatch *m, int32_t s, unsigned c) {
    const int32_t t = m->tt[256 * (int64_t)s + c];
    return t != UNKNOWN ? t : step_compute(m, s, c);
}

#define SKIP_MIN 4 /* trie nodes below a node before a walk tests its subtree whole */

/* The byte classes that leave state s as it is (each byte of them stepped once; a class
 * is out at its first byte that leads elsewhere) */
static unsigned loop_classes(gmatch *m, int32_t s) {
    if (m->st[s].loop >= 0) return (unsigned)m->st[s].loop;
    unsigned out = 0;
    for (unsigned c = 0; c < 256; c++) {
        const unsigned k = 1u << byte_class(c);
        if (out & k) continue;
        if (step(m, s, c) != s) out |= k;
        if (m->overflow) return 0;
    }
    m->st[s].loop = (int16_t)(~out & 0xff);
    return ~out & 0xff;
}

/* node i's subtree may be taken whole from state t (t alive after i's byte) */
static inline bool subtree_loops(gmatch *m, int64_t i, int32_t t) {
    const gvocab *v = m->v;
    return v->end[i] - i > SKIP_MIN && !(v->below[i] & ~loop_classes(m, t));
}

/* ---------------------------------------------------------------- tables: make, rebuild */

static void tables_alloc(gmatch *m) {
    m->cap_nodes = 1 << 12;
    m->pos = xmalloc(sizeof *m->pos * (size_t)m->cap_nodes);
    m->parent = xmalloc(sizeof *m->parent * (size_t)m->cap_nodes);
    m->clo_off = xmalloc(sizeof *m->clo_off * (size_t)m->cap_nodes);
    m->clo_n = xmalloc(sizeof *m->clo_n * (size_t)m->cap_nodes);
    m->clo_acc = xmalloc((size_t)m->cap_nodes);
    m->mark = xcalloc((size_t)m->cap_nodes, sizeof *m->mark);
    m->node_pe = xmalloc(sizeof *m->node_pe * (size_t)m->cap_nodes);
    m->nh_cap = 1 << 13;
    m->nh = xmalloc(sizeof *m->nh * (size_t)m->nh_cap);
    m->cap_st = 256;
    m->st = xmalloc(sizeof *m->st * (size_t)m->cap_st);
    m->cap_set = 1 << 12;
    m->set = xmalloc(sizeof *m->set * (size_t)m->cap_set);
    m->sh_cap = 512;
    m->sh = xmalloc(sizeof *m->sh * (size_t)m->sh_cap);
}

static void states_clear(gmatch *m) {
    m->n_st = 0;
    m->n_set = 0;
    for (int32_t i = 0; i < m->sh_cap; i++) m->sh[i] = -1;
    for (int i = 0; i < MASK_SLOTS; i++) m->mask_owner[i] = -1;
}

/* The tables grew past their caps: start them again from the current state's stacks (each
 * copied node by node, bottom first), so memory stays bounded over a long generation. */
static int rebuild(gmatch *m) {
    const gstate *c = &m->st[m->cur];
    const int32_t n = c->n;
    const bool acc = c->accept;
    /* each stack as its positions, bottom first, in one buffer */
    int64_t total = 0;
    int32_t *len = xmalloc(sizeof *len * (size_t)(n + 1));
    for (int32_t i = 0; i < n; i++) {
        int32_t d = 0;
        for (int32_t x = m->set[c->off + i]; x; x = m->parent[x]) d++;
        len[i] = d;
        total += d;
    }
    int32_t *posv = xmalloc(sizeof *posv * (size_t)(total + 1));
    int64_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t k = len[i];
        for (int32_t x = m->set[c->off + i]; x; x = m->parent[x]) posv[at + --k] = m->pos[x];
        at += len[i];
    }
    states_clear(m);
    node_table_reset(m);
    m->overflow = false;
    int64_t nt = 0;
    at = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t x = 0;
        for (int32_t k = 0; k < len[i]; k++) x = node(m, posv[at + k], x);
        at += len[i];
        push_tmp(&m->tmp, &nt, &m->cap_tmp, x);
    }
    free(len);
    free(posv);
    /* the nodes are TERM-topped already: their closures are themselves */
    if (nt > 1) qsort(m->tmp, (size_t)nt, sizeof *m->tmp, i32_cmp);
    m->cur = state_of(m, m->tmp, (int32_t)nt, acc);
    m->stats.rebuilds++;
    return m->cur == DEAD && !acc ? -1 : 0;
}

static void maybe_rebuild(gmatch *m) {
    if (m->n_nodes > MAX_NODES / 2 || m->n_st > MAX_STATES) rebuild(m);
}

/* a matcher's tables at the grammar's start; masks: with the mask cache (not the abstract one) */
static gmatch *matcher_make(const grammar *g, const gvocab *v, bool masks) {
    gmatch *m = xcalloc(1, sizeof *m);
    m->g = g, m->v = v;
    tables_alloc(m);
    node_table_reset(m);
    states_clear(m);
    m->words = ((int64_t)v->n_vocab + 63) / 64;
    if (masks) m->masks = xmalloc(sizeof *m->masks * (size_t)(m->words * MASK_SLOTS));
    m->walk = xmalloc(sizeof *m->walk * (size_t)(v->max_depth + 2));
    return m;
}

gmatch *gmatch_new(const grammar *g, const gvocab *v, herr *e) {
    gmatch *m = matcher_make(g, v, true);
    int64_t nt = 0;
    for (int32_t k = 0; k < g->rule_n_alt[g->root]; k++) {
        const int32_t x = node(m, g->alt[g->rule_alt[g->root] + k], 0);
        push_tmp(&m->tmp, &nt, &m->cap_tmp, x);
    }
    m->cur = state_from_nodes(m, nt);
    if (m->cur == DEAD) {
        herr_set(e, m->overflow ? "grammar: the start is too ambiguous (over %d stacks)" : "grammar: \"root\" matches nothing",
                 GMATCH_MAX_STACKS);
        gmatch_free(m);
        return NULL;
    }
    return m;
}

static void pcache_clear(gmatch *m);

void gmatch_free(gmatch *m) {
    if (!m) return;
    states_clear(m);
    pcache_clear(m);
    gmatch_free(m->am);
    free(m->pe);
    free(m->peh);
    free(m->node_pe);
    free(m->path_node);
    free(m->path_in);
    free(m->path_pop);
    free(m->acc_tmp);
    free(m->unc_tmp);
    free(m->ent_tmp);
    free(m->sig);
    free(m->canon);
    free(m->queue);
    free(m->pos);
    free(m->parent);
    free(m->clo_off);
    free(m->clo_n);
    free(m->clo_acc);
    free(m->clo);
    free(m->mark);
    free(m->nh);
    free(m->st);
    free(m->tt);
    free(m->set);
    free(m->sh);
    free(m->masks);
    free(m->walk);
    free(m->tmp);
    free(m->work);
    free(m);
}

/* the state after bytes s[0..n) from state from (DEAD if refused) */
static int32_t run_bytes(gmatch *m, int32_t from, const char *s, size_t n) {
    int32_t t = from;
    for (size_t i = 0; i < n && t != DEAD; i++) t = step(m, t, (unsigned char)s[i]);
    return t;
}

int gmatch_bytes(gmatch *m, const char *s, size_t n) {
    if (m->ended) return -1;
    maybe_rebuild(m);
    const int32_t t = run_bytes(m, m->cur, s, n);
    if (t == DEAD) { m->overflow = false; return -1; }
    m->cur = t;
    return 0;
}

bool gmatch_complete(const gmatch *m) { return !m->ended && m->st[m->cur].accept; }
bool gmatch_ended(const gmatch *m) { return m->ended; }

bool gmatch_token_ok(gmatch *m, int32_t id) {
    if (m->ended || id < 0 || id >= m->v->n_vocab) return false;
    if (m->v->eog[id]) return m->st[m->cur].accept;
    if (!m->v->piece_len[id]) return false;
    maybe_rebuild(m);
    const bool ok = run_bytes(m, m->cur, m->v->piece[id], m->v->piece_len[id]) != DEAD;
    m->overflow = false;
    return ok;
}

int gmatch_token(gmatch *m, int32_t id) {
    if (m->ended || id < 0 || id >= m->v->n_vocab) return -1;
    if (m->v->eog[id]) {
        if (!m->st[m->cur].accept) return -1;
        m->ended = true;
        return 0;
    }
    if (!m->v->piece_len[id]) return -1;
    return gmatch_bytes(m, m->v->piece[id], m->v->piece_len[id]);
}

/* ---------------------------------------------------------------- the position cache
 *
 * Most of a mask is decided by the top of each stack alone. For a stack x, take its top
 * PKEY_DEPTH positions (x's own and those it returns to) as a key, the rest of the stack as
 * an unknown context, and walk the whole trie once from that top in the abstract matcher
 * (m->am: a matcher whose bottom node 0 stands for the context, so its "may end here" flag
 * means "a path returned into the context here"). A token is then
 *   accepted  when some path takes all its bytes (inside the top, or returning into the
 *             context exactly at its last byte: every context takes that, see closure);
 *   refused   when every path dies at some byte before any returned into the context;
 *   context-dependent otherwise: a path returned into the context before its last byte.
 * The entry keeps the accepted ids (a list, or bits when longer than the bitset) and the
 * context-dependent tokens as trie nodes to walk against the whole state: subtrees whose
 * abstract walk died after a return (walked whole), and their ancestors (whose real state
 * they start from), in preorder with skip links. A state's mask is the union over its
 * stacks: accepted bits ORed, context-dependent nodes walked from the current state with the
 * real DFA (exact: a token is in the state's language iff some stack takes it, and the
 * walk is the one-token check itself, sharing prefixes).
 *
 * For JSON's string rule (string ::= "\"" char* "\"" ws) a key of 3 positions holds the
 * whole string: the tokens that stay in it or end at its closing quote (and spaces) are
 * decided once per grammar, and only tokens running past the quote (`",`, `"}`) are walked
 * against the state. Keys repeat across contexts (every string of a schema shares one), so
 * one abstract walk (the first mask in a free string, a few ms at 248k tokens) serves the
 * request. Memory: at most PE_MAX entries and about PE_MAX_BYTES (one entry past it at
 * most: bits or ids, and 8 bytes a context-dependent trie node) before the cache is
 * cleared; the abstract matcher's tables are bounded as the matcher's. */

#define PKEY_DEPTH 3                       /* stack positions in a key */
#define PE_MAX 256                         /* entries before the cache is cleared */
#define PE_MAX_BYTES ((int64_t)32 << 20)   /* their bytes before it is cleared */
#define PEH_CAP 1024                       /* hash slots (> 2 PE_MAX) */

typedef struct pentry {
    atomic_int refs;        /* the matchers' slots and the shared table holding it */
    int32_t *sig;           /* the local grammar it was made for (local_sig) */
    int64_t n_sig;
    uint64_t hash;
    int64_t bytes;
    int64_t n_acc;
    uint64_t *acc_bits;     /* the accepted tokens as bits when over 2 x words of them */
    int32_t *acc_ids;       /* else their ids */
    int32_t n_unc;
    int32_t *unc;           /* trie nodes, preorder: i an ancestor, ~i a subtree walked whole */
    int32_t *unc_skip;      /* the item after unc[k]'s subtree */
    int64_t cost;           /* trie nodes the walk of unc may visit at most */
    bool whole;             /* the abstract walk overflowed: the state's mask walks the trie */
} pentry;

typedef struct pslot {
    int32_t key[PKEY_DEPTH], klen;
    pentry *e;
} pslot;

static void pentry_release(pentry *e) {
    if (!e || atomic_fetch_sub(&e->refs, 1) != 1) return;
    free(e->sig);
    free(e->acc_bits);
    free(e->acc_ids);
    free(e->unc);
    free(e->unc_skip);
    free(e);
}

/* Entries shared by every matcher of a vocabulary, found by their local grammar (so every
 * request whose grammar holds the same string rule finds its entry made): at most
 * SHARE_MAX entries and SHARE_MAX_BYTES, then the table is emptied (entries in use live on
 * in their matchers). Beside them, the primed entries (gvocab_prime, at start-up): pinned,
 * never emptied, at most PIN_MAX entries and PIN_MAX_BYTES, looked up first. */
#define SHARE_MAX 4096
#define SHARE_MAX_BYTES ((int64_t)128 << 20)
#define SHARE_HCAP 16384 /* > 2 SHARE_MAX */
#define PIN_MAX 2048
#define PIN_MAX_BYTES ((int64_t)64 << 20)
#define PIN_HCAP 8192    /* > 2 PIN_MAX */

typedef struct pshare {
    pthread_mutex_t mu;
    pentry **e;
    int32_t n;
    int32_t *h;             /* open addressing over e, SHARE_HCAP */
    int64_t bytes;
    pentry **pin;           /* the primed entries */
    int32_t n_pin;
    int32_t *pin_h;         /* open addressing over pin, PIN_HCAP */
    int64_t pin_bytes;
} pshare;

static pshare *pshare_new(void) {
    pshare *sh = xcalloc(1, sizeof *sh);
    pthread_mutex_init(&sh->mu, NULL);
    sh->e = xmalloc(sizeof *sh->e * SHARE_MAX);
    sh->h = xmalloc(sizeof *sh->h * SHARE_HCAP);
    for (int32_t i = 0; i < SHARE_HCAP; i++) sh->h[i] = -1;
    sh->pin = xmalloc(sizeof *sh->pin * PIN_MAX);
    sh->pin_h = xmalloc(sizeof *sh->pin_h * PIN_HCAP);
    for (int32_t i = 0; i < PIN_HCAP; i++) sh->pin_h[i] = -1;
    return sh;
}

static void pshare_empty(pshare *sh) {
    for (int32_t i = 0; i < sh->n; i++) pentry_release(sh->e[i]);
    sh->n = 0;
    sh->bytes = 0;
    for (int32_t i = 0; i < SHARE_HCAP; i++) sh->h[i] = -1;
}

static void pshare_free(pshare *sh) {
    if (!sh) return;
    pshare_empty(sh);
    for (int32_t i = 0; i < sh->n_pin; i++) pentry_release(sh->pin[i]);
    pthread_mutex_destroy(&sh->mu);
    free(sh->e);
    free(sh->h);
    free(sh->pin);
    free(sh->pin_h);
    free(sh);
}

/* the entry of table (e, h, hcap) made for sig, or NULL (under mu) */
static pentry *pshare_lookup(pentry *const *es, const int32_t *hs, uint32_t hcap, const int32_t *sig, int64_t n,
                             uint64_t hash) {
    for (uint32_t h = (uint32_t)hash & (hcap - 1); hs[h] >= 0; h = (h + 1) & (hcap - 1)) {
        pentry *e = es[hs[h]];
        if (e->hash == hash && e->n_sig == n && !memcmp(e->sig, sig, sizeof *sig * (size_t)n)) return e;
    }
    return NULL;
}

/* the entry made for sig (a reference taken), or NULL: a primed one, else (unless
 * primed_only) one a matcher made */
static pentry *pshare_find(pshare *sh, const int32_t *sig, int64_t n, uint64_t hash, bool primed_only) {
    pthread_mutex_lock(&sh->mu);
    pentry *found = pshare_lookup(sh->pin, sh->pin_h, PIN_HCAP, sig, n, hash);
    if (!found && !primed_only) found = pshare_lookup(sh->e, sh->h, SHARE_HCAP, sig, n, hash);
    if (found) atomic_fetch_add(&found->refs, 1);
    pthread_mutex_unlock(&sh->mu);
    return found;
}

/* e pinned among the primed entries: false when they are full */
static bool pshare_pin(pshare *sh, pentry *e) {
    pthread_mutex_lock(&sh->mu);
    const bool ok = sh->n_pin < PIN_MAX && sh->pin_bytes + e->bytes <= PIN_MAX_BYTES;
    if (ok) {
        uint32_t h = (uint32_t)e->hash & (PIN_HCAP - 1);
        while (sh->pin_h[h] >= 0) h = (h + 1) & (PIN_HCAP - 1);
        sh->pin_h[h] = sh->n_pin;
        sh->pin[sh->n_pin++] = e;
        sh->pin_bytes += e->bytes;
        atomic_fetch_add(&e->refs, 1);
    }
    pthread_mutex_unlock(&sh->mu);
    return ok;
}

static void pshare_add(pshare *sh, pentry *e) {
    pthread_mutex_lock(&sh->mu);
    if (sh->n == SHARE_MAX || sh->bytes + e->bytes > SHARE_MAX_BYTES) pshare_empty(sh);
    uint32_t h = (uint32_t)e->hash & (SHARE_HCAP - 1);
    while (sh->h[h] >= 0) h = (h + 1) & (SHARE_HCAP - 1);
    sh->h[h] = sh->n;
    sh->e[sh->n++] = e;
    sh->bytes += e->bytes;
    atomic_fetch_add(&e->refs, 1);
    pthread_mutex_unlock(&sh->mu);
}

static void pcache_clear(gmatch *m) {
    for (int32_t i = 0; i < m->n_pe; i++) pentry_release(m->pe[i].e);
    m->n_pe = 0;
    m->pe_bytes = 0;
    if (m->peh)
        for (int32_t i = 0; i < m->peh_cap; i++) m->peh[i] = -1;
    if (m->node_pe)
        for (int32_t x = 0; x < m->n_nodes; x++) m->node_pe[x] = -1;
}

static uint32_t key_hash(const int32_t *k, int32_t n) {
    uint32_t h = 2166136261u ^ (uint32_t)n;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)k[i]) * 16777619u;
    return h ^ (h >> 15);
}

static inline void set_tokens(const gvocab *v, uint64_t *b, int64_t i) {
    for (int32_t k = v->tok_off[i]; k < v->tok_off[i + 1]; k++) {
        const int32_t id = v->tok[k];
        b[id >> 6] |= 1ull << (id & 63);
    }
}

/* An alternative's elements from position p to its END into m->sig: TERM its byte set,
 * REF the rule's number in the order first met (rules met are queued). */
static void sig_elems(gmatch *m, int64_t *n, int64_t *nq, int32_t p) {
    const grammar *g = m->g;
    for (;; p++) {
        const gelem *el = &g->el[p];
        if (el->kind == GE_END) { push_tmp(&m->sig, n, &m->cap_sig, 0); return; }
        if (el->kind == GE_TERM) {
            push_tmp(&m->sig, n, &m->cap_sig, 1);
            for (int w = 0; w < 4; w++) {
                push_tmp(&m->sig, n, &m->cap_sig, (int32_t)(uint32_t)g->sets[el->arg].w[w]);
                push_tmp(&m->sig, n, &m->cap_sig, (int32_t)(uint32_t)(g->sets[el->arg].w[w] >> 32));
            }
            continue;
        }
        const int32_t r = el->arg;
        if (m->canon[r] < 0) {
            m->canon[r] = (int32_t)*nq;
            push_tmp(&m->queue, nq, &m->cap_queue, r);
        }
        push_tmp(&m->sig, n, &m->cap_sig, 2);
        push_tmp(&m->sig, n, &m->cap_sig, m->canon[r]);
    }
}

/* The local grammar of key[0..kl) in m->sig: all an abstract walk from it reads (the rest
 * of the top's alternative, of each alternative it returns to, and every rule they reach),
 * rules numbered as met. Equal signatures walk alike over any vocabulary, whatever grammar
 * they come from, so entries are shared by signature. Its length. */
static int64_t local_sig(gmatch *m, const int32_t *key, int32_t kl) {
    const grammar *g = m->g;
    if (!m->canon) {
        m->canon = xmalloc(sizeof *m->canon * (size_t)g->n_rules);
        for (int32_t r = 0; r < g->n_rules; r++) m->canon[r] = -1;
    }
    int64_t n = 0, nq = 0;
    push_tmp(&m->sig, &n, &m->cap_sig, kl);
    for (int32_t j = 0; j < kl; j++) sig_elems(m, &n, &nq, j ? key[j] + 1 : key[0]);
    for (int64_t q = 0; q < nq; q++) {
        const int32_t r = m->queue[q];
        push_tmp(&m->sig, &n, &m->cap_sig, -1 - g->rule_n_alt[r]);
        for (int32_t k = 0; k < g->rule_n_alt[r]; k++) sig_elems(m, &n, &nq, g->alt[g->rule_alt[r] + k]);
    }
    for (int64_t q = 0; q < nq; q++) m->canon[m->queue[q]] = -1;
    return n;
}

static uint64_t sig_hash(const int32_t *s, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

/* the entry of key[0..kl) (top first): the abstract walk of the trie described above */
static void pentry_make(gmatch *m, pentry *pe, const int32_t *key, int32_t kl) {
    const gvocab *v = m->v;
    if (!m->am) {
        m->am = matcher_make(m->g, v, false);
        m->path_node = xmalloc(sizeof *m->path_node * (size_t)(v->max_depth + 2));
        m->path_in = xmalloc((size_t)v->max_depth + 2);
        m->path_pop = xmalloc((size_t)v->max_depth + 2);
    }
    gmatch *a = m->am;
    if (a->n_nodes > MAX_NODES / 8 || a->n_st > MAX_STATES / 2) { /* bounded: start its tables again */
        states_clear(a);
        node_table_reset(a);
    }
    a->overflow = false;
    int32_t y = 0;
    for (int32_t j = kl - 1; j >= 0 && y >= 0; j--) y = node(a, key[j], y);
    const int32_t s0 = y < 0 ? DEAD : state_of(a, &y, 1, false);
    if (s0 == DEAD) { pe->whole = true; return; }
    int64_t na = 0, nu = 0, visits = 0;
    if (!m->acc_tmp) m->acc_tmp = xmalloc(sizeof *m->acc_tmp * (size_t)v->n_vocab); /* each token once */
    /* the hot loop as walk_range's: tables in locals, read again after a computation */
    const uint8_t *const byte = v->byte, *const depth = v->depth, *const below = v->below;
    const int32_t *const end = v->end, *const tok_off = v->tok_off, *const tok = v->tok;
    int32_t *const walk = a->walk, *const path_node = m->path_node, *const acc = m->acc_tmp;
    bool *const path_in = m->path_in, *const path_pop = m->path_pop;
    const int32_t *tt = a->tt;
    const gstate *st = a->st;
    walk[0] = s0;
    path_pop[0] = false;
    for (int64_t i = 1; i < v->n_nodes;) {
        visits++;
        const unsigned d = depth[i], c = byte[i];
        int32_t t = tt[256 * (int64_t)walk[d - 1] + c];
        if (t == UNKNOWN) {
            t = step_compute(a, walk[d - 1], c);
            tt = a->tt, st = a->st;
            if (a->overflow) { pe->whole = true; break; }
        }
        path_node[d] = (int32_t)i, path_in[d] = false;
        if (t == DEAD) {
            if (path_pop[d - 1]) { /* a path went into the context above: the context decides */
                for (unsigned k = 1; k < d; k++)
                    if (!path_in[k]) {
                        push_tmp(&m->unc_tmp, &nu, &m->cap_unc_tmp, path_node[k]);
                        path_in[k] = true;
                    }
                push_tmp(&m->unc_tmp, &nu, &m->cap_unc_tmp, ~(int32_t)i);
            }
            i = end[i];
            continue;
        }
        if (end[i] - i > SKIP_MIN) {
            int lp = st[t].loop;
            if (lp < 0) {
                lp = (int)loop_classes(a, t);
                tt = a->tt, st = a->st;
                if (a->overflow) { pe->whole = true; break; }
            }
            if (!(below[i] & ~lp)) { /* every token below stays in t: accepted */
                for (int32_t q = tok_off[i]; q < tok_off[end[i]]; q++) acc[na++] = tok[q];
                i = end[i];
                continue;
            }
        }
        walk[d] = t;
        path_pop[d] = path_pop[d - 1] || st[t].accept;
        for (int32_t q = tok_off[i]; q < tok_off[i + 1]; q++) acc[na++] = tok[q];
        i++;
    }
    m->stats.entries++;
    m->stats.entry_visits += visits;
    if (pe->whole) return;
    pe->n_acc = na;
    if (na > 2 * m->words) {
        pe->acc_bits = xcalloc((size_t)m->words, sizeof *pe->acc_bits);
        for (int64_t k = 0; k < na; k++) pe->acc_bits[m->acc_tmp[k] >> 6] |= 1ull << (m->acc_tmp[k] & 63);
        pe->bytes += 8 * m->words;
    } else if (na) {
        pe->acc_ids = xmalloc(sizeof *pe->acc_ids * (size_t)na);
        memcpy(pe->acc_ids, m->acc_tmp, sizeof *pe->acc_ids * (size_t)na);
        pe->bytes += 4 * na;
    }
    pe->n_unc = (int32_t)nu;
    if (nu) {
        pe->unc = xmalloc(sizeof *pe->unc * (size_t)nu);
        pe->unc_skip = xmalloc(sizeof *pe->unc_skip * (size_t)nu);
        memcpy(pe->unc, m->unc_tmp, sizeof *pe->unc * (size_t)nu);
        pe->bytes += 8 * nu;
        for (int64_t k = 0; k < nu; k++) pe->cost += pe->unc[k] < 0 ? v->end[~pe->unc[k]] - ~pe->unc[k] : 1;
        /* skip links: the open ancestors on a stack (path_node reused), closed by the first
         * item past their subtree */
        int32_t *open = m->path_node, n_open = 0;
        for (int32_t k = 0; k < (int32_t)nu; k++) {
            const int32_t it = pe->unc[k], i = it < 0 ? ~it : it;
            while (n_open && v->end[pe->unc[open[n_open - 1]]] <= i) pe->unc_skip[open[--n_open]] = k;
            if (it < 0) pe->unc_skip[k] = k + 1;
            else open[n_open++] = k;
        }
        while (n_open) pe->unc_skip[open[--n_open]] = (int32_t)nu;
    }
}

/* stack x's entry: this matcher's by x's key, else the vocabulary's by the key's local
 * grammar, else made (and shared) when may_make; -1 when this matcher holds PE_MAX
 * already or it would have to be made */
static int32_t pentry_get(gmatch *m, int32_t x, bool may_make) {
    if (m->node_pe[x] >= 0) return m->node_pe[x];
    if (!m->peh) {
        m->peh_cap = PEH_CAP;
        m->peh = xmalloc(sizeof *m->peh * (size_t)m->peh_cap);
        for (int32_t i = 0; i < m->peh_cap; i++) m->peh[i] = -1;
    }
    int32_t key[PKEY_DEPTH], kl = 0;
    for (int32_t y = x; y && kl < PKEY_DEPTH; y = m->parent[y]) key[kl++] = m->pos[y];
    uint32_t h = key_hash(key, kl) & (uint32_t)(m->peh_cap - 1);
    for (int32_t id; (id = m->peh[h]) >= 0; h = (h + 1) & (uint32_t)(m->peh_cap - 1))
        if (m->pe[id].klen == kl && !memcmp(m->pe[id].key, key, sizeof *key * (size_t)kl)) return m->node_pe[x] = id;
    if (m->n_pe == PE_MAX) return -1;
    const int64_t n_sig = local_sig(m, key, kl);
    const uint64_t hash = sig_hash(m->sig, n_sig);
    pshare *sh = m->v->share;
    pentry *e = m->no_share ? NULL : pshare_find(sh, m->sig, n_sig, hash, m->primed_only || m->pin);
    if (e) {
        m->stats.entries_shared++;
    } else if (!may_make) {
        return -1;
    } else {
        e = xcalloc(1, sizeof *e);
        atomic_init(&e->refs, 1);
        e->hash = hash;
        e->n_sig = n_sig;
        e->sig = xmalloc(sizeof *e->sig * (size_t)n_sig);
        memcpy(e->sig, m->sig, sizeof *e->sig * (size_t)n_sig);
        pentry_make(m, e, key, kl);
        e->bytes += 4 * n_sig + (int64_t)sizeof *e;
        if (m->pin) m->pin_full |= !pshare_pin(sh, e);
        else if (!m->no_share && !m->primed_only) pshare_add(sh, e);
    }
    if (m->n_pe == m->cap_pe) {
        m->cap_pe = m->cap_pe ? 2 * m->cap_pe : 16;
        m->pe = xrealloc(m->pe, sizeof *m->pe * (size_t)m->cap_pe);
    }
    const int32_t id = m->n_pe++;
    m->pe[id] = (pslot){.klen = kl, .e = e};
    memcpy(m->pe[id].key, key, sizeof *key * (size_t)kl);
    m->pe_bytes += e->bytes;
    m->peh[h] = id;
    return m->node_pe[x] = id;
}

/* the tokens of trie nodes [lo, hi) the current walk takes (walk[depth[lo] - 1] set). The
 * hot loop of every walk: the tables in locals, read again only after a transition or a
 * state's loop classes are computed (which may move them) */
static int64_t walk_range(gmatch *m, uint64_t *b, int64_t lo, int64_t hi) {
    const gvocab *v = m->v;
    const uint8_t *const byte = v->byte, *const depth = v->depth, *const below = v->below;
    const int32_t *const end = v->end, *const tok_off = v->tok_off, *const tok = v->tok;
    int32_t *const walk = m->walk;
    const int32_t *tt = m->tt;
    const gstate *st = m->st;
    int64_t visits = 0;
    for (int64_t i = lo; i < hi;) {
        visits++;
        const unsigned d = depth[i], c = byte[i];
        int32_t t = tt[256 * (int64_t)walk[d - 1] + c];
        if (t == UNKNOWN) {
            t = step_compute(m, walk[d - 1], c);
            tt = m->tt, st = m->st;
        }
        if (t == DEAD) {
            if (m->overflow) break;
            i = end[i];
            continue;
        }
        if (end[i] - i > SKIP_MIN) {
            int lp = st[t].loop;
            if (lp < 0) {
                lp = (int)loop_classes(m, t);
                tt = m->tt, st = m->st;
            }
            if (!(below[i] & ~lp)) { /* every token below stays in t */
                for (int32_t q = tok_off[i]; q < tok_off[end[i]]; q++) b[tok[q] >> 6] |= 1ull << (tok[q] & 63);
                i = end[i];
                continue;
            }
        }
        walk[d] = t;
        for (int32_t q = tok_off[i]; q < tok_off[i + 1]; q++) b[tok[q] >> 6] |= 1ull << (tok[q] & 63);
        i++;
    }
    return visits;
}

/* an entry's context-dependent tokens, walked from the current state */
static void walk_unc(gmatch *m, uint64_t *b, const pentry *pe) {
    const gvocab *v = m->v;
    m->walk[0] = m->cur;
    for (int32_t k = 0; k < pe->n_unc;) {
        const int32_t it = pe->unc[k], i = it < 0 ? ~it : it;
        if (m->plant == 2 && it < 0) { /* planted: taken unchecked */
            for (int32_t q = v->tok_off[i]; q < v->tok_off[v->end[i]]; q++) b[v->tok[q] >> 6] |= 1ull << (v->tok[q] & 63);
            k++;
            continue;
        }
        m->stats.trie_visits++;
        const int32_t t = step(m, m->walk[v->depth[i] - 1], v->byte[i]);
        if (t == DEAD) {
            if (m->overflow) return;
            k = pe->unc_skip[k];
            continue;
        }
        m->walk[v->depth[i]] = t;
        set_tokens(v, b, i);
        if (it < 0) m->stats.trie_visits += walk_range(m, b, i + 1, v->end[i]);
        if (m->overflow) return;
        k++;
    }
}

/* The current state's tokens from its stacks' entries into b (zeroed): 0, 1 when the
 * state needs a whole walk instead (too many stacks, an entry that overflowed) */
static int mask_by_positions(gmatch *m, uint64_t *b) {
    const int32_t n = m->st[m->cur].n, off = m->st[m->cur].off;
    if (n > PE_MAX / 2) return 1;
    if (m->n_pe + n > PE_MAX || m->pe_bytes > PE_MAX_BYTES) pcache_clear(m);
    int64_t ne = 0, cost = 0;
    const int64_t visits0 = m->stats.entry_visits;
    for (int32_t k = 0; k < n; k++) {
        /* the worst case bounded: entries are made while this mask's abstract walks have
         * visited fewer nodes than the trie holds, then the whole walk instead (the entries
         * made stay for the next masks): at most about three walks of the trie a mask */
        const int32_t id = pentry_get(m, m->set[off + k], m->stats.entry_visits - visits0 < m->v->n_nodes);
        if (id < 0 || m->pe[id].e->whole) return 1;
        bool seen = false;
        for (int64_t q = 0; q < ne && !seen; q++) seen = m->ent_tmp[q] == id;
        if (!seen) push_tmp(&m->ent_tmp, &ne, &m->cap_ent_tmp, id), cost += m->pe[id].e->cost;
    }
    if (cost > m->v->n_nodes) return 1; /* the context-dependent walks would cost more than the whole one */
    for (int64_t q = 0; q < ne; q++) { /* the tokens the tops accept alone */
        const pentry *pe = m->pe[m->ent_tmp[q]].e;
        if (pe->acc_bits)
            for (int64_t w = 0; w < m->words; w++) b[w] |= pe->acc_bits[w];
        else
            for (int64_t k = 0; k < pe->n_acc; k++) b[pe->acc_ids[k] >> 6] |= 1ull << (pe->acc_ids[k] & 63);
    }
    if (m->plant == 1) return 0; /* planted: the context-dependent tokens refused unchecked */
    for (int64_t q = 0; q < ne && !m->overflow; q++) walk_unc(m, b, m->pe[m->ent_tmp[q]].e);
    return 0;
}

__attribute__((target("popcnt"))) static int64_t popcount_hw(const uint64_t *b, int64_t n) {
    int64_t c = 0;
    for (int64_t w = 0; w < n; w++) c += __builtin_popcountll(b[w]);
    return c;
}

static int64_t popcount_sw(const uint64_t *b, int64_t n) {
    int64_t c = 0;
    for (int64_t w = 0; w < n; w++) c += __builtin_popcountll(b[w]);
    return c;
}

static int64_t popcount_words(const uint64_t *b, int64_t n) {
    return __builtin_cpu_supports("popcnt") ? popcount_hw(b, n) : popcount_sw(b, n);
}

int64_t gmatch_mask(gmatch *m, const uint64_t **bits, herr *e) {
    maybe_rebuild(m);
    gstate *c = &m->st[m->cur];
    if (c->mask >= 0 && m->mask_owner[c->mask] == m->cur) {
        m->stats.masks_cached++;
        *bits = m->masks + (int64_t)c->mask * m->words;
        return m->mask_count[c->mask];
    }
    const int32_t slot = m->mask_next;
    m->mask_next = (m->mask_next + 1) % MASK_SLOTS;
    if (m->mask_owner[slot] >= 0 && m->mask_owner[slot] < m->n_st) m->st[m->mask_owner[slot]].mask = -1;
    uint64_t *b = m->masks + (int64_t)slot * m->words;
    memset(b, 0, sizeof *b * (size_t)m->words);
    const gvocab *v = m->v;
    if (m->whole_walks || mask_by_positions(m, b) == 1) {
        memset(b, 0, sizeof *b * (size_t)m->words);
        m->walk[0] = m->cur;
        m->stats.trie_visits += walk_range(m, b, 1, v->n_nodes);
        m->stats.masks_whole++;
    }
    if (m->overflow) {
        m->overflow = false;
        m->mask_owner[slot] = -1;
        herr_set(e, "grammar: the output is too ambiguous for the grammar (over %d stacks or %d nodes)",
                 GMATCH_MAX_STACKS, MAX_NODES);
        return -1;
    }
    c = &m->st[m->cur]; /* the walk may have moved the state table */
    if (c->accept)
        for (int32_t id = 0; id < v->n_vocab; id++)
            if (v->eog[id]) b[id >> 6] |= 1ull << (id & 63);
    const int64_t count = popcount_words(b, m->words);
    c->mask = slot;
    m->mask_owner[slot] = m->cur;
    m->mask_count[slot] = count;
    m->stats.masks_walked++;
    *bits = b;
    return count;
}

/* -inf over the refused: 8 logits a step, each lane's bit tested against its own */
__attribute__((target("avx2"))) static void apply_avx2(const uint64_t *b, float *lg, int32_t V) {
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const int32_t full = V / 64;
    for (int32_t w = 0; w < full; w++) {
        const uint64_t x = b[w];
        if (x == ~0ull) continue;
        float *l = lg + (int64_t)w * 64;
        if (x == 0) {
            for (int j = 0; j < 64; j += 8) _mm256_storeu_ps(l + j, ninf);
            continue;
        }
        for (int j = 0; j < 8; j++) {
            const __m256i by = _mm256_set1_epi32((int)((x >> (8 * j)) & 0xff));
            const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(by, sel), sel);
            _mm256_storeu_ps(l + 8 * j, _mm256_blendv_ps(ninf, _mm256_loadu_ps(l + 8 * j), _mm256_castsi256_ps(on)));
        }
    }
    for (int32_t i = full * 64; i < V; i++)
        if (!((b[i >> 6] >> (i & 63)) & 1)) lg[i] = -INFINITY;
}

static void apply_plain(const uint64_t *b, float *lg, int32_t V) {
    for (int32_t w = 0; w < (V + 63) / 64; w++) {
        const uint64_t x = b[w];
        if (x == ~0ull) continue;
        const int32_t lo = w * 64, hi = lo + 64 < V ? lo + 64 : V;
        for (int32_t i = lo; i < hi; i++)
            if (!((x >> (i - lo)) & 1)) lg[i] = -INFINITY;
    }
}

void gmatch_apply_bits(const uint64_t *bits, float *logits, int32_t n_vocab) {
    if (__builtin_cpu_supports("avx2")) apply_avx2(bits, logits, n_vocab);
    else apply_plain(bits, logits, n_vocab);
}

int64_t gmatch_apply(gmatch *m, float *logits, herr *e) {
    const uint64_t *b;
    const int64_t n = gmatch_mask(m, &b, e);
    if (n < 0) return -1;
    gmatch_apply_bits(b, logits, m->v->n_vocab);
    return n;
}

void gmatch_set_whole_walks(gmatch *m, bool on) { m->whole_walks = on; }
void gmatch_plant_defect(gmatch *m, int defect) {
    m->plant = defect;
    m->no_share = defect != 0; /* a defect's entries stay its own */
}
void gmatch_set_share(gmatch *m, bool on) { m->no_share = !on, m->primed_only = false; }
void gmatch_set_share_primed(gmatch *m) { m->no_share = false, m->primed_only = true; }

gmatch_stats gmatch_get_stats(const gmatch *m) { return m->stats; }

/* ---------------------------------------------------------------- priming
 *
 * A grammar's first request would make the entries of its free-text tops while it samples
 * (inside a JSON string, a tool call's parameter text: a walk of most of the trie each, ~5
 * ms at 248k tokens, one or two a grammar). gvocab_prime makes them before any request:
 * breadth first over the DFA states of g from its start (all 256 bytes from each, so every
 * state a document reaches early), each stack's entry made and pinned. A request finds an
 * entry by its local grammar, so it finds those of every top whose local grammar is one
 * primed: JSON's string, number and formats, a tool call's parameter text (the rules
 * schema.c writes the same in every grammar). Tops whose 3 positions reach into a schema's
 * own rules are that schema's, made by its request (cheap: they refuse most bytes). */
int gvocab_prime(gvocab *v, const grammar *g, int32_t max_states, const atomic_bool *stop, gvocab_prime_stats *ps) {
    herr e;
    gmatch *m = gmatch_new(g, v, &e);
    if (!m) return -1;
    m->pin = true;
    int32_t s = m->cur;
    for (; s < m->n_st && s < max_states && !m->pin_full && !(stop && atomic_load(stop)); s++) {
        if (m->st[s].n <= PE_MAX / 2) /* (a state of more stacks is walked whole) */
            for (int32_t k = 0; k < m->st[s].n && !m->pin_full; k++) {
                if (m->n_pe == PE_MAX || m->pe_bytes > PE_MAX_BYTES) pcache_clear(m);
                pentry_get(m, m->set[m->st[s].off + k], true);
            }
        for (unsigned c = 0; c < 256 && !m->overflow; c++) step(m, s, c);
        if (m->overflow || m->n_nodes > MAX_NODES / 2) break; /* (its states stay as they are: no rebuild) */
    }
    if (ps) {
        ps->states += s;
        ps->entries += m->stats.entries;
        ps->found += m->stats.entries_shared;
        ps->visits += m->stats.entry_visits;
        ps->full |= m->pin_full;
    }
    gmatch_free(m);
    return 0;
}

int64_t gvocab_primed(const gvocab *v, int64_t *bytes) {
    pshare *sh = v->share;
    pthread_mutex_lock(&sh->mu);
    const int64_t n = sh->n_pin;
    if (bytes) *bytes = sh->pin_bytes;
    pthread_mutex_unlock(&sh->mu);
    return n;
}

int64_t gvocab_bytes(const gvocab *v) {
    int64_t b = (int64_t)sizeof *v + 11 * v->n_nodes + 4 + 4 * (int64_t)v->tok_off[v->n_nodes];
    for (int32_t i = 0; i < v->n_vocab; i++) b += v->piece_len[i] + 1 + 8 + 4 + 1;
    return b;
}
