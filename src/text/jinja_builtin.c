/* jinja_builtin.c: what templates call: python jinja2's filters and tests that chat templates
 * use, the str/dict/list methods the sandbox lets through, loop.cycle, and the globals
 * (range, namespace, dict, raise_exception, strftime_now). Each follows its Python original
 * (jinja2/filters.py, tests.py, CPython's str methods) closely enough to print the same
 * bytes. Case mapping is exact for ASCII and for scripts without case; other letters stop
 * the render with an error instead of guessing Unicode's tables. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja_int.h"

jv jarg(const jargs *a, int pos, const char *kw, jv dflt) {
    if (pos >= 0 && pos < a->n) return a->v[pos];
    for (int i = 0; kw && i < a->nkw; i++)
        if (!strcmp(a->kwn[i], kw)) return a->kwv[i];
    return dflt;
}
static bool has_arg(const jargs *a, int pos, const char *kw) {
    if (pos >= 0 && pos < a->n) return true;
    for (int i = 0; kw && i < a->nkw; i++)
        if (!strcmp(a->kwn[i], kw)) return true;
    return false;
}
static jv emptystr(void) { return jv_strref("", 0); }
static jv need_str(jctx *c, jv v, const char *what) {
    if (v.t != JV_STR) jfail(c, 0, "%s: expected a string, got %s", what, jv_typename(v));
    return v;
}
static int64_t need_int(jctx *c, jv v, const char *what) {
    if (v.t == JV_INT) return v.i;
    if (v.t == JV_BOOL) return v.b;
    jfail(c, 0, "%s: expected an integer, got %s", what, jv_typename(v));
}

/* ---- case ----
 * Python's str.lower/upper/title for ASCII, Latin-1, Latin Extended-A, Latin Extended
 * Additional (Vietnamese), Greek and Cyrillic (simple mappings; the few full ones these
 * blocks have, like ß -> SS, are spelled out). Code points of other blocks that have case
 * are refused; everything else is caseless. */
static bool in_cased_block(uint32_t cp) { /* blocks with case this file does not map */
    static const uint32_t r[][2] = {
        {0x180, 0x2ff}, {0x345, 0x345}, {0x370, 0x385}, {0x3cf, 0x3ff}, {0x530, 0x58f}, {0x10a0, 0x10ff},
        {0x13a0, 0x13ff}, {0x1c80, 0x1cbf}, {0x1d00, 0x1dbf}, {0x1e96, 0x1e9f}, {0x1f00, 0x1fff},
        {0x2100, 0x218f}, {0x24b6, 0x24e9}, {0x2c00, 0x2d2f}, {0xa640, 0xa69f}, {0xa720, 0xa7ff},
        {0xab30, 0xabbf}, {0xfb00, 0xfb17}, {0xff21, 0xff5a}, {0x10400, 0x104ff}, {0x10570, 0x105bf},
        {0x10780, 0x107bf}, {0x10c80, 0x10cff}, {0x118a0, 0x118df}, {0x16e40, 0x16e9f}, {0x1d400, 0x1d7ff},
        {0x1df00, 0x1dfff}, {0x1e030, 0x1e08f}, {0x1e900, 0x1e95f}, {0x1f130, 0x1f189},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (cp >= r[i][0] && cp <= r[i][1]) return true;
    return false;
}

/* Pairs where the upper case letter is the even (or odd) one of two neighbours. */
static int pair_kind(uint32_t cp) { /* 1: even is upper, 2: odd is upper, 0: none */
    if ((cp >= 0x100 && cp <= 0x137) || (cp >= 0x14a && cp <= 0x177) || (cp >= 0x460 && cp <= 0x481) ||
        (cp >= 0x48a && cp <= 0x4bf) || (cp >= 0x4d0 && cp <= 0x52f) || (cp >= 0x1e00 && cp <= 0x1e95) ||
        (cp >= 0x1ea0 && cp <= 0x1eff) || (cp >= 0x3d8 && cp <= 0x3ef))
        return 1;
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17e) || (cp >= 0x4c1 && cp <= 0x4ce)) return 2;
    return 0;
}

/* 1 upper, 2 lower, 0 caseless; -1 cased but unknown here */
static int case_of(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? 1 : (cp >= 'a' && cp <= 'z') ? 2 : 0;
    if (cp == 0xb5 || cp == 0xdf || cp == 0xff || cp == 0x138 || cp == 0x149 || cp == 0x17f || cp == 0x131 || cp == 0x3c2 || cp == 0x390 || cp == 0x3b0) return 2;
    if (cp == 0x130 || cp == 0x178) return 1;
    if (cp >= 0xc0 && cp <= 0xfe && cp != 0xd7 && cp != 0xf7) return cp < 0xdf ? 1 : 2;
    int pk = pair_kind(cp);
    if (pk) return ((cp & 1) == 0) == (pk == 1) ? 1 : 2;
    if (cp == 0xaa || cp == 0xba) return -1; /* Other_Lowercase: cased without a mapping */
    if ((cp >= 0x391 && cp <= 0x3ab && cp != 0x3a2) || cp == 0x386 || (cp >= 0x388 && cp <= 0x38a) || cp == 0x38c || cp == 0x38e || cp == 0x38f) return 1;
    if ((cp >= 0x3ac && cp <= 0x3ce)) return 2;
    if (cp >= 0x400 && cp <= 0x42f) return 1;
    if (cp >= 0x430 && cp <= 0x45f) return 2;
    if (cp == 0x4c0) return 1;
    if (cp == 0x4cf) return 2;
    return in_cased_block(cp) ? -1 : 0;
}

/* cp in upper (or lower) case into out (1-3 code points); -1 where this file cannot say */
static int case_map(uint32_t cp, bool upper, uint32_t out[3]) {
    int k = case_of(cp);
    out[0] = cp;
    if (k < 0) return -1;
    if (k == 0 || (k == 1) == upper) return 1;
    if (cp < 0x80) { out[0] = cp ^ 32; return 1; }
    if (upper) {
        switch (cp) {
        case 0xb5: out[0] = 0x39c; return 1;
        case 0xdf: out[0] = 'S'; out[1] = 'S'; return 2;
        case 0xff: out[0] = 0x178; return 1;
        case 0x138: return 1;
        case 0x149: out[0] = 0x2bc; out[1] = 'N'; return 2;
        case 0x17f: out[0] = 'S'; return 1;
        case 0x131: out[0] = 'I'; return 1;
        case 0x3c2: out[0] = 0x3a3; return 1;
        case 0x390: out[0] = 0x399; out[1] = 0x308; out[2] = 0x301; return 3;
        case 0x3b0: out[0] = 0x3a5; out[1] = 0x308; out[2] = 0x301; return 3;
        case 0x3ac: out[0] = 0x386; return 1;
        case 0x3cc: out[0] = 0x38c; return 1;
        case 0x4cf: out[0] = 0x4c0; return 1;
        }
        if (cp >= 0xe0 && cp <= 0xfe) { out[0] = cp - 0x20; return 1; }
        if (cp >= 0x3ad && cp <= 0x3af) { out[0] = cp - 0x25; return 1; }
        if (cp >= 0x3cd && cp <= 0x3ce) { out[0] = cp - 0x3f; return 1; }
        if (cp >= 0x3b1 && cp <= 0x3cb) { out[0] = cp - 0x20; return 1; }
        if (cp >= 0x430 && cp <= 0x44f) { out[0] = cp - 0x20; return 1; }
        if (cp >= 0x450 && cp <= 0x45f) { out[0] = cp - 0x50; return 1; }
        out[0] = cp - 1; /* the lower case one of a pair */
        return 1;
    }
    switch (cp) {
    case 0x130: out[0] = 'i'; out[1] = 0x307; return 2;
    case 0x178: out[0] = 0xff; return 1;
    case 0x3a3: return -1; /* σ or final ς: Python looks at the neighbours */
    case 0x386: out[0] = 0x3ac; return 1;
    case 0x38c: out[0] = 0x3cc; return 1;
    case 0x4c0: out[0] = 0x4cf; return 1;
    }
    if (cp >= 0xc0 && cp <= 0xde) { out[0] = cp + 0x20; return 1; }
    if (cp >= 0x388 && cp <= 0x38a) { out[0] = cp + 0x25; return 1; }
    if (cp >= 0x38e && cp <= 0x38f) { out[0] = cp + 0x3f; return 1; }
    if (cp >= 0x391 && cp <= 0x3ab) { out[0] = cp + 0x20; return 1; }
    if (cp >= 0x410 && cp <= 0x42f) { out[0] = cp + 0x20; return 1; }
    if (cp >= 0x400 && cp <= 0x40f) { out[0] = cp + 0x50; return 1; }
    out[0] = cp + 1;
    return 1;
}

static void put_cp(jctx *c, jbuf *b, uint32_t cp) {
    char u[4];
    int n;
    if (cp < 0x80) { u[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xc0 | cp >> 6); u[1] = (char)(0x80 | (cp & 0x3f)); n = 2; }
    else if (cp < 0x10000) { u[0] = (char)(0xe0 | cp >> 12); u[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); u[2] = (char)(0x80 | (cp & 0x3f)); n = 3; }
    else { u[0] = (char)(0xf0 | cp >> 18); u[1] = (char)(0x80 | ((cp >> 12) & 0x3f)); u[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); u[3] = (char)(0x80 | (cp & 0x3f)); n = 4; }
    jbuf_put(c, b, u, (size_t)n);
}

static bool is_alpha(uint32_t cp) { return (cp | 32) >= 'a' && (cp | 32) <= 'z'; }
static int checked_case(jctx *c, uint32_t cp, const char *what) {
    int k = case_of(cp);
    if (k < 0) jfail(c, 0, "%s of text holding U+%04X is not supported", what, cp);
    return k;
}

enum { CASE_LOWER, CASE_UPPER, CASE_TITLE, CASE_CAP, CASE_JTITLE };
static jv str_case(jctx *c, jv s, int mode, const char *what) {
    jbuf b = {0};
    bool prev_cased = false, first = true, word_start = true;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp = u8_next(s.s.p, s.s.n, &i);
        int k = checked_case(c, cp, what);
        bool up;
        if (mode == CASE_LOWER) up = false;
        else if (mode == CASE_UPPER) up = true;
        else if (mode == CASE_TITLE) up = !prev_cased;
        else if (mode == CASE_CAP) up = first;
        else { /* jinja2's title filter: words begin after -, white space, (, {, [, < */
            bool delim = py_isspace(cp) || (cp < 0x80 && cp && strchr("-({[<", (int)cp));
            up = word_start;
            word_start = delim;
        }
        first = false;
        prev_cased = k > 0;
        uint32_t out[3];
        int n = case_map(cp, up, out);
        if (n < 0) jfail(c, 0, "%s of text holding U+%04X is not supported", what, cp);
        if (up && (cp == 0xdf || cp == 0x149 || cp == 0x390 || cp == 0x3b0) && mode != CASE_UPPER)
            jfail(c, 0, "%s of text holding U+%04X is not supported (title case)", what, cp);
        for (int j = 0; j < n; j++) put_cp(c, &b, out[j]);
    }
    return b.p ? jbuf_str(&b) : emptystr();
}

/* ---- string helpers ---- */
static bool in_chars(uint32_t cp, jv chars) {
    if (chars.t != JV_STR) return py_isspace(cp);
    for (size_t i = 0; i < chars.s.n;)
        if (u8_next(chars.s.p, chars.s.n, &i) == cp) return true;
    return false;
}
static size_t cp_start(const char *p, size_t at) { /* start of the code point ending at p[at-1] */
    size_t s = at - 1;
    while (s > 0 && ((unsigned char)p[s] & 0xc0) == 0x80) s--;
    return s;
}
static jv str_strip(jctx *c, jv s, jv chars, bool left, bool right) {
    if (chars.t != JV_STR && chars.t != JV_NONE) jfail(c, 0, "strip arg must be None or str");
    size_t a = 0, b = s.s.n;
    while (left && a < b) {
        size_t j = a;
        if (!in_chars(u8_next(s.s.p, b, &j), chars)) break;
        a = j;
    }
    while (right && b > a) {
        size_t st = cp_start(s.s.p, b), j = st;
        if (!in_chars(u8_next(s.s.p, b, &j), chars)) break;
        b = st;
    }
    jv out = jv_strref(s.s.p + a, b - a);
    out.sub = s.sub;
    return out;
}

static jv str_split(jctx *c, jv s, jv sep, int64_t maxsplit, bool from_right) {
    jv out = jv_list(c, 0, JL_LIST);
    const char *p = s.s.p;
    size_t n = s.s.n;
    if (sep.t == JV_NONE) {
        /* runs of white space; none at either end */
        jv parts = jv_list(c, 0, JL_LIST);
        if (!from_right) {
            size_t i = 0;
            int64_t k = 0;
            for (;;) {
                while (i < n) { size_t j = i; if (!py_isspace(u8_next(p, n, &j))) break; i = j; }
                if (i >= n) break;
                if (maxsplit >= 0 && k == maxsplit) {
                    jv_push(c, parts, jv_strref(p + i, n - i));
                    break;
                }
                size_t st = i;
                while (i < n) { size_t j = i; if (py_isspace(u8_next(p, n, &j))) break; i = j; }
                jv_push(c, parts, jv_strref(p + st, i - st));
                k++;
            }
            return parts;
        }
        size_t e = n;
        int64_t k = 0;
        for (;;) {
            while (e > 0) { size_t st = cp_start(p, e), j = st; if (!py_isspace(u8_next(p, n, &j))) break; e = st; }
            if (e == 0) break;
            if (maxsplit >= 0 && k == maxsplit) {
                jv_push(c, parts, jv_strref(p, e));
                break;
            }
            size_t b = e;
            while (b > 0) { size_t st = cp_start(p, b), j = st; if (py_isspace(u8_next(p, n, &j))) break; b = st; }
            jv_push(c, parts, jv_strref(p + b, e - b));
            e = b;
            k++;
        }
        for (size_t i = parts.l->n; i > 0; i--) jv_push(c, out, parts.l->v[i - 1]);
        return out;
    }
    need_str(c, sep, "split");
    if (!sep.s.n) jfail(c, 0, "empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            const char *f = maxsplit >= 0 && k >= maxsplit ? NULL : memmem(p + i, n - i, sep.s.p, sep.s.n);
            if (!f) { jv_push(c, out, jv_strref(p + i, n - i)); break; }
            jv_push(c, out, jv_strref(p + i, (size_t)(f - (p + i))));
            i = (size_t)(f - p) + sep.s.n;
            k++;
        }
        return out;
    }
    jv parts = jv_list(c, 0, JL_LIST);
    size_t e = n;
    int64_t k = 0;
    for (;;) {
        size_t found = SIZE_MAX;
        if (!(maxsplit >= 0 && k >= maxsplit) && e >= sep.s.n)
            for (size_t i = e - sep.s.n + 1; i-- > 0;)
                if (!memcmp(p + i, sep.s.p, sep.s.n)) { found = i; break; }
        if (found == SIZE_MAX) { jv_push(c, parts, jv_strref(p, e)); break; }
        jv_push(c, parts, jv_strref(p + found + sep.s.n, e - found - sep.s.n));
        e = found;
        k++;
    }
    for (size_t i = parts.l->n; i > 0; i--) jv_push(c, out, parts.l->v[i - 1]);
    return out;
}

static jv str_replace(jctx *c, jv s, jv old, jv new_, int64_t count) {
    need_str(c, old, "replace");
    need_str(c, new_, "replace");
    jbuf b = {0};
    int64_t k = 0;
    if (!old.s.n) { /* inserts at every code point boundary */
        size_t i = 0;
        for (;;) {
            if (count < 0 || k < count) { jbuf_put(c, &b, new_.s.p, new_.s.n); k++; }
            if (i >= s.s.n) break;
            size_t at = i;
            u8_next(s.s.p, s.s.n, &i);
            jbuf_put(c, &b, s.s.p + at, i - at);
        }
        return b.p ? jbuf_str(&b) : emptystr();
    }
    size_t i = 0;
    while (i < s.s.n) {
        const char *f = count >= 0 && k >= count ? NULL : memmem(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
        if (!f) break;
        jbuf_put(c, &b, s.s.p + i, (size_t)(f - (s.s.p + i)));
        jbuf_put(c, &b, new_.s.p, new_.s.n);
        i = (size_t)(f - s.s.p) + old.s.n;
        k++;
    }
    jbuf_put(c, &b, s.s.p + i, s.s.n - i);
    return b.p ? jbuf_str(&b) : emptystr();
}

static bool fix_match(jctx *c, jv s, jv fix, bool end, const char *what) {
    if (fix.t == JV_LIST && fix.sub == JL_TUPLE) {
        for (size_t i = 0; i < fix.l->n; i++)
            if (fix_match(c, s, fix.l->v[i], end, what)) return true;
        return false;
    }
    if (fix.t != JV_STR) jfail(c, 0, "%s first arg must be str or a tuple of str, not %s", what, jv_typename(fix));
    if (fix.s.n > s.s.n) return false;
    return !memcmp(s.s.p + (end ? s.s.n - fix.s.n : 0), fix.s.p, fix.s.n);
}

/* str.splitlines's line boundaries */
static size_t line_break(const char *p, size_t n, size_t i, size_t *len) {
    size_t j = i;
    uint32_t cp = u8_next(p, n, &j);
    if (cp == '\r' && j < n && p[j] == '\n') { *len = 2; return 1; }
    if (cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
        *len = j - i;
        return 1;
    }
    return 0;
}
static jv splitlines(jctx *c, jv s, bool keepends) {
    jv out = jv_list(c, 0, JL_LIST);
    size_t st = 0, i = 0, bl;
    while (i < s.s.n) {
        if (line_break(s.s.p, s.s.n, i, &bl)) {
            jv_push(c, out, jv_strref(s.s.p + st, i - st + (keepends ? bl : 0)));
            i += bl;
            st = i;
        } else {
            u8_next(s.s.p, s.s.n, &i);
        }
    }
    if (st < s.s.n) jv_push(c, out, jv_strref(s.s.p + st, s.s.n - st));
    return out;
}

static jv str_format(jctx *c, jv fmt, const jargs *a) {
    jbuf b = {0};
    const char *p = fmt.s.p;
    size_t n = fmt.s.n;
    int autoidx = 0, mode = 0; /* 1 automatic numbering, 2 manual */
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '}') {
            if (i + 1 < n && p[i + 1] == '}') { jbuf_putc(c, &b, '}'); i++; continue; }
            jfail(c, 0, "format: single '}' encountered in format string");
        }
        if (p[i] != '{') { jbuf_putc(c, &b, p[i]); continue; }
        if (i + 1 < n && p[i + 1] == '{') { jbuf_putc(c, &b, '{'); i++; continue; }
        size_t e = i + 1;
        while (e < n && p[e] != '}') e++;
        if (e >= n) jfail(c, 0, "format: single '{' encountered in format string");
        const char *f = p + i + 1;
        size_t fl = e - i - 1, nl = 0;
        while (nl < fl && f[nl] != '!' && f[nl] != ':') nl++;
        char conv = 0;
        if (nl < fl && f[nl] == '!') {
            if (nl + 2 > fl) jfail(c, 0, "format: bad conversion");
            conv = f[nl + 1];
            if ((conv != 's' && conv != 'r') || (nl + 2 < fl && f[nl + 2] != ':')) jfail(c, 0, "format: conversion '!%c' is not supported", conv);
            if (nl + 3 < fl) jfail(c, 0, "format: format specs are not supported");
        } else if (nl + 1 < fl) jfail(c, 0, "format: format specs are not supported");
        jv v;
        if (nl == 0) {
            if (mode == 2) jfail(c, 0, "cannot switch from manual field specification to automatic field numbering");
            mode = 1;
            if (autoidx >= a->n) jfail(c, 0, "format: replacement index %d out of range", autoidx);
            v = a->v[autoidx++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            if (mode == 1) jfail(c, 0, "cannot switch from automatic field numbering to manual field specification");
            mode = 2;
            int idx = 0;
            for (size_t k = 0; k < nl; k++) {
                if (f[k] < '0' || f[k] > '9') jfail(c, 0, "format: field '%.*s' is not supported", (int)nl, f);
                idx = idx * 10 + (f[k] - '0');
                if (idx > 1000) jfail(c, 0, "format: index too large");
            }
            if (idx >= a->n) jfail(c, 0, "format: replacement index %d out of range", idx);
            v = a->v[idx];
        } else {
            for (size_t k = 0; k < nl; k++)
                if (f[k] == '.' || f[k] == '[') jfail(c, 0, "format: field '%.*s' is not supported", (int)nl, f);
            bool found = false;
            for (int k = 0; k < a->nkw && !found; k++)
                if (strlen(a->kwn[k]) == nl && !memcmp(a->kwn[k], f, nl)) { v = a->kwv[k]; found = true; }
            if (!found) jfail(c, 0, "format: KeyError: '%.*s'", (int)nl, f);
        }
        if (conv == 'r') jv_put_repr(c, &b, v, 0);
        else jv_put_str(c, &b, v, 0);
        i = e;
    }
    return b.p ? jbuf_str(&b) : emptystr();
}

static int64_t str_find(jv s, jv sub, bool last) {
    if (sub.s.n > s.s.n) return -1;
    int64_t found = -1;
    for (size_t i = 0; i + sub.s.n <= s.s.n; i++)
        if (!memcmp(s.s.p + i, sub.s.p, sub.s.n)) {
            found = (int64_t)i;
            if (!last) break;
        }
    if (found < 0) return -1;
    return (int64_t)u8_len(s.s.p, (size_t)found); /* code point index */
}

/* ---- methods ---- */
static jv m_startswith(jctx *c, jv self, const jargs *a) {
    if (a->n != 1) jfail(c, 0, "startswith with start/end arguments is not supported");
    return jv_bool(fix_match(c, self, a->v[0], false, "startswith"));
}
static jv m_endswith(jctx *c, jv self, const jargs *a) {
    if (a->n != 1) jfail(c, 0, "endswith with start/end arguments is not supported");
    return jv_bool(fix_match(c, self, a->v[0], true, "endswith"));
}
static jv m_strip(jctx *c, jv self, const jargs *a) { return str_strip(c, self, jarg(a, 0, "chars", jv_none()), true, true); }
static jv m_lstrip(jctx *c, jv self, const jargs *a) { return str_strip(c, self, jarg(a, 0, "chars", jv_none()), true, false); }
static jv m_rstrip(jctx *c, jv self, const jargs *a) { return str_strip(c, self, jarg(a, 0, "chars", jv_none()), false, true); }
static jv m_split(jctx *c, jv self, const jargs *a) {
    jv ms = jarg(a, 1, "maxsplit", jv_int(-1));
    return str_split(c, self, jarg(a, 0, "sep", jv_none()), need_int(c, ms, "split"), false);
}
static jv m_rsplit(jctx *c, jv self, const jargs *a) {
    jv ms = jarg(a, 1, "maxsplit", jv_int(-1));
    return str_split(c, self, jarg(a, 0, "sep", jv_none()), need_int(c, ms, "rsplit"), true);
}
static jv m_lower(jctx *c, jv self, const jargs *a) { return str_case(c, self, CASE_LOWER, "lower()"); }
static jv m_upper(jctx *c, jv self, const jargs *a) { return str_case(c, self, CASE_UPPER, "upper()"); }
static jv m_title(jctx *c, jv self, const jargs *a) { return str_case(c, self, CASE_TITLE, "title()"); }
static jv m_capitalize(jctx *c, jv self, const jargs *a) { return str_case(c, self, CASE_CAP, "capitalize()"); }
static jv m_replace(jctx *c, jv self, const jargs *a) {
    if (a->n < 2) jfail(c, 0, "replace expected at least 2 arguments");
    return str_replace(c, self, a->v[0], a->v[1], a->n > 2 ? need_int(c, a->v[2], "replace") : -1);
}
static jv m_find(jctx *c, jv self, const jargs *a) {
    if (a->n != 1) jfail(c, 0, "find with start/end arguments is not supported");
    return jv_int(str_find(self, need_str(c, a->v[0], "find"), false));
}
static jv m_rfind(jctx *c, jv self, const jargs *a) {
    if (a->n != 1) jfail(c, 0, "rfind with start/end arguments is not supported");
    return jv_int(str_find(self, need_str(c, a->v[0], "rfind"), true));
}
static jv m_count(jctx *c, jv self, const jargs *a) {
    if (a->n != 1) jfail(c, 0, "count takes one argument here");
    if (self.t == JV_LIST) {
        int64_t k = 0;
        for (size_t i = 0; i < self.l->n; i++) k += jv_eq(self.l->v[i], a->v[0]);
        return jv_int(k);
    }
    jv sub = need_str(c, a->v[0], "count");
    if (!sub.s.n) return jv_int((int64_t)u8_len(self.s.p, self.s.n) + 1);
    int64_t k = 0;
    for (size_t i = 0; i + sub.s.n <= self.s.n;) {
        if (!memcmp(self.s.p + i, sub.s.p, sub.s.n)) { k++; i += sub.s.n; }
        else i++;
    }
    return jv_int(k);
}
static jv m_index(jctx *c, jv self, const jargs *a) {
    if (a->n != 1) jfail(c, 0, "index takes one argument here");
    for (size_t i = 0; i < self.l->n; i++)
        if (jv_eq(self.l->v[i], a->v[0])) return jv_int((int64_t)i);
    jfail(c, 0, "ValueError: value is not in list");
}
static jv m_format(jctx *c, jv self, const jargs *a) { return str_format(c, self, a); }
static jv m_join(jctx *c, jv self, const jargs *a) {
    if (a->n != 1) jfail(c, 0, "join takes one argument");
    jlist items;
    jiter(c, a->v[0], 0, &items);
    jbuf b = {0};
    for (size_t i = 0; i < items.n; i++) {
        if (i) jbuf_put(c, &b, self.s.p, self.s.n);
        if (items.v[i].t != JV_STR) jfail(c, 0, "sequence item %zu: expected str instance, %s found", i, jv_typename(items.v[i]));
        jbuf_put(c, &b, items.v[i].s.p, items.v[i].s.n);
    }
    return b.p ? jbuf_str(&b) : emptystr();
}
static jv m_splitlines(jctx *c, jv self, const jargs *a) { return splitlines(c, self, jv_truthy(jarg(a, 0, "keepends", jv_bool(false)))); }
static jv m_removeprefix(jctx *c, jv self, const jargs *a) {
    jv f = need_str(c, jarg(a, 0, NULL, jv_none()), "removeprefix");
    return fix_match(c, self, f, false, "removeprefix") ? jv_strref(self.s.p + f.s.n, self.s.n - f.s.n) : self;
}
static jv m_removesuffix(jctx *c, jv self, const jargs *a) {
    jv f = need_str(c, jarg(a, 0, NULL, jv_none()), "removesuffix");
    return fix_match(c, self, f, true, "removesuffix") && f.s.n ? jv_strref(self.s.p, self.s.n - f.s.n) : self;
}
static jv str_class(jctx *c, jv s, int kind) { /* isdigit, isalpha, isspace, isalnum */
    if (!s.s.n) return jv_bool(false);
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp = u8_next(s.s.p, s.s.n, &i);
        if (kind == 2) { if (!py_isspace(cp)) return jv_bool(false); continue; }
        if (cp >= 0x80) jfail(c, 0, "character classes of non-ASCII text are not supported");
        bool d = cp >= '0' && cp <= '9', l = is_alpha(cp);
        if (!(kind == 0 ? d : kind == 1 ? l : d || l)) return jv_bool(false);
    }
    return jv_bool(true);
}
static jv m_isdigit(jctx *c, jv self, const jargs *a) { return str_class(c, self, 0); }
static jv m_isalpha(jctx *c, jv self, const jargs *a) { return str_class(c, self, 1); }
static jv m_isspace(jctx *c, jv self, const jargs *a) { return str_class(c, self, 2); }
static jv m_isalnum(jctx *c, jv self, const jargs *a) { return str_class(c, self, 3); }

static jv m_get(jctx *c, jv self, const jargs *a) {
    if (a->n < 1 || a->n > 2) jfail(c, 0, "get expected 1 or 2 arguments");
    jv out;
    if (jdict_get(self.d, a->v[0], &out)) return out;
    return a->n > 1 ? a->v[1] : jv_none();
}
static jv dict_view(jctx *c, jv self, int which) {
    jv out = jv_list(c, self.d->n, JL_SIZED);
    for (size_t i = 0; i < self.d->n; i++) {
        if (which == 0) jv_push(c, out, self.d->k[i]);
        else if (which == 1) jv_push(c, out, self.d->v[i]);
        else {
            jv t = jv_list(c, 2, JL_TUPLE);
            jv_push(c, t, self.d->k[i]);
            jv_push(c, t, self.d->v[i]);
            jv_push(c, out, t);
        }
    }
    return out;
}
static jv m_keys(jctx *c, jv self, const jargs *a) { return dict_view(c, self, 0); }
static jv m_values(jctx *c, jv self, const jargs *a) { return dict_view(c, self, 1); }
static jv m_items(jctx *c, jv self, const jargs *a) { return dict_view(c, self, 2); }
static jv m_cycle(jctx *c, jv self, const jargs *a) {
    if (!a->n) jfail(c, 0, "no items for cycling given");
    return a->v[self.lp->i % (size_t)a->n];
}
static jv m_unsupported(jctx *c, jv self, const jargs *a) { jfail(c, 0, "this method is not supported"); }

typedef struct mdef { const char *name; jfn fn; } mdef;
static const mdef str_methods[] = {
    {"startswith", m_startswith}, {"endswith", m_endswith}, {"strip", m_strip}, {"lstrip", m_lstrip},
    {"rstrip", m_rstrip}, {"split", m_split}, {"rsplit", m_rsplit}, {"lower", m_lower}, {"upper", m_upper},
    {"title", m_title}, {"capitalize", m_capitalize}, {"replace", m_replace}, {"find", m_find},
    {"rfind", m_rfind}, {"count", m_count}, {"format", m_format}, {"join", m_join}, {"splitlines", m_splitlines},
    {"removeprefix", m_removeprefix}, {"removesuffix", m_removesuffix}, {"isdigit", m_isdigit},
    {"isalpha", m_isalpha}, {"isspace", m_isspace}, {"isalnum", m_isalnum}, {NULL, NULL}};
static const char *const str_other[] = {"casefold", "center", "encode", "expandtabs", "format_map", "index",
    "isascii", "isdecimal", "isidentifier", "islower", "isnumeric", "isprintable", "istitle", "isupper", "ljust",
    "maketrans", "partition", "rindex", "rjust", "rpartition", "swapcase", "translate", "zfill", NULL};
static const mdef dict_methods[] = {{"get", m_get}, {"keys", m_keys}, {"values", m_values}, {"items", m_items}, {NULL, NULL}};
static const char *const dict_other[] = {"copy", "fromkeys", NULL};
static const char *const dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const mdef list_methods[] = {{"count", m_count}, {"index", m_index}, {NULL, NULL}};
static const char *const list_other[] = {"copy", NULL};
static const char *const list_unsafe[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL};

static bool name_in(const char *const *list, const char *name, size_t n) {
    for (int i = 0; list[i]; i++)
        if (strlen(list[i]) == n && !memcmp(list[i], name, n)) return true;
    return false;
}

jv jb_method(jctx *c, jv obj, const char *name, size_t n) {
    const mdef *m = NULL;
    const char *const *other = NULL;
    switch (obj.t) {
    case JV_STR: m = str_methods; other = str_other; break;
    case JV_DICT:
        if (name_in(dict_unsafe, name, n)) return jv_undef("unsafe method");
        m = dict_methods; other = dict_other; break;
    case JV_LIST:
        if (obj.sub == JL_GEN || obj.sub == JL_SIZED) return jv_undef("method");
        if (name_in(list_unsafe, name, n)) return jv_undef("unsafe method");
        m = list_methods; other = list_other; break;
    case JV_LOOP:
        if (n == 5 && !memcmp(name, "cycle", 5)) return jv_func(c, m_cycle, obj, "cycle");
        return jv_undef(NULL);
    default: return jv_undef(NULL);
    }
    for (int i = 0; m[i].name; i++)
        if (strlen(m[i].name) == n && !memcmp(m[i].name, name, n)) return jv_func(c, m[i].fn, obj, m[i].name);
    if (name_in(other, name, n)) {
        jv f = jv_func(c, m_unsupported, obj, "unsupported");
        return f;
    }
    return jv_undef(NULL);
}

/* ---- filters ---- */
typedef jv (*ffn)(jctx *c, jv v, const jargs *a);

static jv len_of(jctx *c, jv v) {
    switch (v.t) {
    case JV_UNDEF: return jv_int(0);
    case JV_STR: return jv_int((int64_t)u8_len(v.s.p, v.s.n));
    case JV_LIST:
        if (v.sub == JL_GEN) jfail(c, 0, "object of type 'generator' has no len()");
        return jv_int((int64_t)v.l->n);
    case JV_DICT: return jv_int((int64_t)v.d->n);
    default: jfail(c, 0, "object of type '%s' has no len()", jv_typename(v));
    }
}
static jv f_length(jctx *c, jv v, const jargs *a) { return len_of(c, v); }
static jv f_default(jctx *c, jv v, const jargs *a) {
    jv d = jarg(a, 0, "default_value", emptystr());
    bool boolean = jv_truthy(jarg(a, 1, "boolean", jv_bool(false)));
    if (v.t == JV_UNDEF || (boolean && !jv_truthy(v))) return d;
    return v;
}
static jv f_string(jctx *c, jv v, const jargs *a) { return jv_to_str(c, v, 0); }
static jv f_trim(jctx *c, jv v, const jargs *a) { return str_strip(c, jv_to_str(c, v, 0), jarg(a, 0, "chars", jv_none()), true, true); }
static jv f_lower(jctx *c, jv v, const jargs *a) { return str_case(c, jv_to_str(c, v, 0), CASE_LOWER, "lower"); }
static jv f_upper(jctx *c, jv v, const jargs *a) { return str_case(c, jv_to_str(c, v, 0), CASE_UPPER, "upper"); }
static jv f_capitalize(jctx *c, jv v, const jargs *a) { return str_case(c, jv_to_str(c, v, 0), CASE_CAP, "capitalize"); }
static jv f_title(jctx *c, jv v, const jargs *a) { return str_case(c, jv_to_str(c, v, 0), CASE_JTITLE, "title"); }
static jv f_safe(jctx *c, jv v, const jargs *a) {
    jv s = jv_to_str(c, v, 0);
    s.sub |= JS_MARKUP;
    return s;
}
static jv f_escape(jctx *c, jv v, const jargs *a) {
    if (v.t == JV_STR && (v.sub & JS_MARKUP)) return v;
    jv s = jv_to_str(c, v, 0);
    jbuf b = {0};
    for (size_t i = 0; i < s.s.n; i++) {
        char ch = s.s.p[i];
        const char *r = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : NULL;
        if (r) jbuf_puts(c, &b, r);
        else jbuf_putc(c, &b, ch);
    }
    jv out = b.p ? jbuf_str(&b) : emptystr();
    out.sub = JS_MARKUP;
    return out;
}
static jv f_replace(jctx *c, jv v, const jargs *a) {
    jv cnt = jarg(a, 2, "count", jv_none());
    return str_replace(c, jv_to_str(c, v, 0), jarg(a, 0, "old", jv_none()), jarg(a, 1, "new", jv_none()),
                       cnt.t == JV_NONE ? -1 : need_int(c, cnt, "replace"));
}
static jv f_tojson(jctx *c, jv v, const jargs *a) {
    jjson_opts o = {.ensure_ascii = jv_truthy(jarg(a, 0, "ensure_ascii", jv_bool(false))),
                    .sort_keys = jv_truthy(jarg(a, 3, "sort_keys", jv_bool(false))),
                    .indent = -1, .item_sep = ", ", .key_sep = ": "};
    jv ind = jarg(a, 1, "indent", jv_none()), sep = jarg(a, 2, "separators", jv_none());
    if (ind.t == JV_INT || ind.t == JV_BOOL) {
        int64_t k = ind.t == JV_BOOL ? ind.b : ind.i;
        if (k > 64) jfail(c, 0, "tojson: indent %lld is too large", (long long)k);
        if (k < 0) k = 0;
        char *sp = jalloc(c, (size_t)k + 1);
        memset(sp, ' ', (size_t)k);
        o.indent = (int)k;
        o.indent_str = sp;
    } else if (ind.t == JV_STR) {
        o.indent = 0;
        o.indent_str = ind.s.p;
    } else if (ind.t != JV_NONE) jfail(c, 0, "tojson: indent must be an integer or a string");
    if (o.indent >= 0) o.item_sep = ",";
    if (sep.t == JV_LIST && sep.sub <= JL_TUPLE && sep.l->n == 2 && sep.l->v[0].t == JV_STR && sep.l->v[1].t == JV_STR) {
        o.item_sep = sep.l->v[0].s.p;
        o.key_sep = sep.l->v[1].s.p;
    } else if (sep.t != JV_NONE) jfail(c, 0, "tojson: separators must be a pair of strings");
    jbuf b = {0};
    jv_put_json(c, &b, v, &o, 0, 0);
    return jbuf_str(&b);
}
static jv f_items(jctx *c, jv v, const jargs *a) {
    if (v.t == JV_UNDEF) return jv_list(c, 0, JL_GEN);
    if (v.t != JV_DICT) jfail(c, 0, "Can only get item pairs from a mapping.");
    jv out = dict_view(c, v, 2);
    out.sub = JL_GEN;
    return out;
}
static jv f_list(jctx *c, jv v, const jargs *a) {
    jlist items;
    jiter(c, v, 0, &items);
    jv out = jv_list(c, items.n, JL_LIST);
    for (size_t i = 0; i < items.n; i++) jv_push(c, out, items.v[i]);
    return out;
}
/* jinja2's make_attrgetter: "a.b.0" walks items (attributes where no item) */
static jv attr_path(jctx *c, jv item, jv path) {
    if (path.t == JV_INT) return jgetitem(c, item, path, 0);
    need_str(c, path, "attribute");
    const char *p = path.s.p;
    size_t n = path.s.n, st = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && p[i] != '.') continue;
        bool digits = i > st;
        int64_t k = 0;
        for (size_t j = st; j < i && digits; j++) {
            digits = p[j] >= '0' && p[j] <= '9';
            k = k * 10 + (p[j] - '0');
            if (k > 1000000000) digits = false;
        }
        item = jgetitem(c, item, digits ? jv_int(k) : jv_strref(p + st, i - st), 0);
        st = i + 1;
    }
    return item;
}
static jv f_join(jctx *c, jv v, const jargs *a) {
    jv d = jv_to_str(c, jarg(a, 0, "d", emptystr()), 0), attr = jarg(a, 1, "attribute", jv_none());
    jlist items;
    jiter(c, v, 0, &items);
    jbuf b = {0};
    for (size_t i = 0; i < items.n; i++) {
        if (i) jbuf_put(c, &b, d.s.p, d.s.n);
        jv x = attr.t == JV_NONE ? items.v[i] : attr_path(c, items.v[i], attr);
        jv_put_str(c, &b, x, 0);
    }
    return b.p ? jbuf_str(&b) : emptystr();
}
static jv f_first(jctx *c, jv v, const jargs *a) {
    jlist items;
    jiter(c, v, 0, &items);
    return items.n ? items.v[0] : jv_undef("first item");
}
static jv f_last(jctx *c, jv v, const jargs *a) {
    if (v.t == JV_LIST && v.sub == JL_GEN) jfail(c, 0, "'generator' object is not reversible");
    jlist items;
    jiter(c, v, 0, &items);
    return items.n ? items.v[items.n - 1] : jv_undef("last item");
}
static jv f_reverse(jctx *c, jv v, const jargs *a) {
    if (v.t == JV_STR) {
        jbuf b = {0};
        size_t e = v.s.n;
        while (e > 0) {
            size_t st = cp_start(v.s.p, e);
            jbuf_put(c, &b, v.s.p + st, e - st);
            e = st;
        }
        return b.p ? jbuf_str(&b) : emptystr();
    }
    jlist items;
    jiter(c, v, 0, &items);
    jv out = jv_list(c, items.n, v.t == JV_LIST && v.sub == JL_GEN ? JL_LIST : JL_GEN);
    for (size_t i = items.n; i > 0; i--) jv_push(c, out, items.v[i - 1]);
    return out;
}
static jv f_abs(jctx *c, jv v, const jargs *a) {
    if (v.t == JV_FLOAT) return jv_float(fabs(v.f));
    int64_t i = need_int(c, v, "abs");
    if (i == INT64_MIN) jfail(c, 0, "integer overflow");
    return jv_int(i < 0 ? -i : i);
}
static bool parse_float(jv s, double *out) {
    char tmp[64];
    jv t = s;
    size_t a = 0, b = t.s.n;
    while (a < b && py_isspace((unsigned char)t.s.p[a])) a++;
    while (b > a && py_isspace((unsigned char)t.s.p[b - 1])) b--;
    if (b - a == 0 || b - a >= sizeof tmp) return false;
    size_t k = 0;
    for (size_t i = a; i < b; i++) {
        char ch = t.s.p[i];
        if (ch == '_') continue;
        if (!strchr("0123456789+-.eEinfatyINFATY", ch) || !ch) return false;
        tmp[k++] = ch;
    }
    tmp[k] = 0;
    char *end;
    *out = strtod(tmp, &end);
    return *end == 0;
}
static jv f_float(jctx *c, jv v, const jargs *a) {
    jv d = jarg(a, 0, "default", jv_float(0));
    if (jv_is_num(v)) return jv_float(jv_num(v));
    double f;
    if (v.t == JV_STR && parse_float(v, &f)) return jv_float(f);
    return d;
}
static jv f_int(jctx *c, jv v, const jargs *a) {
    jv d = jarg(a, 0, "default", jv_int(0));
    jv base = jarg(a, 1, "base", jv_int(10));
    if (v.t == JV_INT) return v;
    if (v.t == JV_BOOL) return jv_int(v.b);
    if (v.t == JV_FLOAT) {
        if (!isfinite(v.f) || fabs(v.f) >= 9.2e18) return d;
        return jv_int((int64_t)v.f);
    }
    if (v.t == JV_STR) {
        if (need_int(c, base, "int") != 10) jfail(c, 0, "int: only base 10 is supported");
        size_t i = 0, n = v.s.n;
        const char *p = v.s.p;
        while (i < n && py_isspace((unsigned char)p[i])) i++;
        while (n > i && py_isspace((unsigned char)p[n - 1])) n--;
        bool neg = false;
        if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
        int64_t r = 0;
        bool ok = i < n;
        for (size_t j = i; j < n && ok; j++) {
            if (p[j] == '_' && j > i && j + 1 < n && p[j - 1] != '_') continue;
            ok = p[j] >= '0' && p[j] <= '9' && !__builtin_mul_overflow(r, 10, &r) && !__builtin_add_overflow(r, p[j] - '0', &r);
        }
        if (ok) return jv_int(neg ? -r : r);
        double f;
        if (parse_float(v, &f) && isfinite(f) && fabs(f) < 9.2e18) return jv_int((int64_t)f);
        return d;
    }
    return d;
}
static jv f_round(jctx *c, jv v, const jargs *a) {
    int64_t prec = need_int(c, jarg(a, 0, "precision", jv_int(0)), "round");
    jv method = jarg(a, 1, "method", jv_strref("common", 6));
    need_str(c, method, "round");
    if (!jv_is_num(v)) jfail(c, 0, "round: expected a number, got %s", jv_typename(v));
    bool common = method.s.n == 6 && !memcmp(method.s.p, "common", 6);
    bool ceil_ = method.s.n == 4 && !memcmp(method.s.p, "ceil", 4), floor_ = method.s.n == 5 && !memcmp(method.s.p, "floor", 5);
    if (!common && !ceil_ && !floor_) jfail(c, 0, "method must be common, ceil or floor");
    if (prec != 0) jfail(c, 0, "round with a precision is not supported");
    if (common && v.t != JV_FLOAT) return jv_int(v.t == JV_BOOL ? v.b : v.i);
    double x = jv_num(v);
    return jv_float(common ? nearbyint(x) : ceil_ ? ceil(x) : floor(x));
}
static jv f_indent(jctx *c, jv v, const jargs *a) {
    jv w = jarg(a, 0, "width", jv_int(4));
    bool first = jv_truthy(jarg(a, 1, "first", jv_bool(false))), blank = jv_truthy(jarg(a, 2, "blank", jv_bool(false)));
    jv ind;
    if (w.t == JV_STR) ind = w;
    else {
        int64_t k = need_int(c, w, "indent");
        if (k < 0) k = 0;
        if (k > 1024) jfail(c, 0, "indent width too large");
        char *sp = jalloc(c, (size_t)k + 1);
        memset(sp, ' ', (size_t)k);
        ind = jv_strref(sp, (size_t)k);
    }
    jv s = jv_to_str(c, v, 0);
    jbuf t = {0};
    jbuf_put(c, &t, s.s.p, s.s.n);
    jbuf_putc(c, &t, '\n'); /* jinja2 appends a newline before splitlines() */
    jv lines = splitlines(c, jbuf_str(&t), false);
    jbuf b = {0};
    if (first) jbuf_put(c, &b, ind.s.p, ind.s.n);
    for (size_t i = 0; i < lines.l->n; i++) {
        jv ln = lines.l->v[i];
        if (i) {
            jbuf_putc(c, &b, '\n');
            if (blank || ln.s.n) jbuf_put(c, &b, ind.s.p, ind.s.n);
        }
        jbuf_put(c, &b, ln.s.p, ln.s.n);
    }
    return b.p ? jbuf_str(&b) : emptystr();
}

/* sort keys: attribute, then lower-case strings unless case_sensitive */
typedef struct keyed { bool fold; jv attr; bool by_value; } keyed;
static jv sort_key(jctx *c, jv x, const keyed *k) {
    if (k->attr.t != JV_NONE) x = attr_path(c, x, k->attr);
    if (k->fold && x.t == JV_STR) x = str_case(c, x, CASE_LOWER, "sort");
    return x;
}
static int cmp_rec(jctx *c, const jv *x, const jv *y, void *arg) {
    bool rev = *(bool *)arg;
    int r = jv_cmp(c, x[0], y[0], 0);
    return rev ? -r : r;
}
static jv sorted(jctx *c, jlist *items, const keyed *k, bool rev) {
    size_t n = items->n;
    jv *rec = jalloc(c, (2 * n + 1) * sizeof(jv));
    for (size_t i = 0; i < n; i++) {
        rec[2 * i] = sort_key(c, items->v[i], k);
        rec[2 * i + 1] = items->v[i];
    }
    jsort(c, rec, n, 2, cmp_rec, &rev);
    jv out = jv_list(c, n, JL_LIST);
    for (size_t i = 0; i < n; i++) jv_push(c, out, rec[2 * i + 1]);
    return out;
}
static jv f_sort(jctx *c, jv v, const jargs *a) {
    bool rev = jv_truthy(jarg(a, 0, "reverse", jv_bool(false)));
    keyed k = {.fold = !jv_truthy(jarg(a, 1, "case_sensitive", jv_bool(false))), .attr = jarg(a, 2, "attribute", jv_none())};
    jlist items;
    jiter(c, v, 0, &items);
    return sorted(c, &items, &k, rev);
}
static jv f_dictsort(jctx *c, jv v, const jargs *a) {
    if (v.t != JV_DICT) jfail(c, 0, "dictsort: expected a mapping, got %s", jv_typename(v));
    bool fold = !jv_truthy(jarg(a, 0, "case_sensitive", jv_bool(false)));
    jv by = jarg(a, 1, "by", jv_strref("key", 3));
    bool rev = jv_truthy(jarg(a, 2, "reverse", jv_bool(false)));
    need_str(c, by, "dictsort");
    bool by_value = by.s.n == 5 && !memcmp(by.s.p, "value", 5);
    if (!by_value && !(by.s.n == 3 && !memcmp(by.s.p, "key", 3))) jfail(c, 0, "You can only sort by either \"key\" or \"value\"");
    jv pairs = dict_view(c, v, 2);
    keyed k = {.fold = fold, .attr = jv_int(by_value ? 1 : 0)};
    return sorted(c, pairs.l, &k, rev);
}
static jv f_unique(jctx *c, jv v, const jargs *a) {
    keyed k = {.fold = !jv_truthy(jarg(a, 0, "case_sensitive", jv_bool(false))), .attr = jarg(a, 1, "attribute", jv_none())};
    jlist items;
    jiter(c, v, 0, &items);
    jv seen = jv_list(c, items.n, JL_LIST), out = jv_list(c, items.n, JL_GEN);
    for (size_t i = 0; i < items.n; i++) {
        jv key = sort_key(c, items.v[i], &k);
        bool dup = false;
        for (size_t j = 0; j < seen.l->n && !dup; j++) dup = jv_eq(seen.l->v[j], key);
        if (dup) continue;
        jv_push(c, seen, key);
        jv_push(c, out, items.v[i]);
    }
    return out;
}
static jv minmax(jctx *c, jv v, const jargs *a, int sign) {
    keyed k = {.fold = !jv_truthy(jarg(a, 0, "case_sensitive", jv_bool(false))), .attr = jarg(a, 1, "attribute", jv_none())};
    jlist items;
    jiter(c, v, 0, &items);
    if (!items.n) return jv_undef("aggregated item");
    size_t best = 0;
    jv bk = sort_key(c, items.v[0], &k);
    for (size_t i = 1; i < items.n; i++) {
        jv key = sort_key(c, items.v[i], &k);
        if (jv_cmp(c, key, bk, 0) * sign > 0) { best = i; bk = key; }
    }
    return items.v[best];
}
static jv f_max(jctx *c, jv v, const jargs *a) { return minmax(c, v, a, 1); }
static jv f_min(jctx *c, jv v, const jargs *a) { return minmax(c, v, a, -1); }
static jv binop_add(jctx *c, jv x, jv y) {
    if (jv_is_num(x) && jv_is_num(y)) {
        if (x.t != JV_FLOAT && y.t != JV_FLOAT) {
            int64_t r;
            if (__builtin_add_overflow(x.t == JV_BOOL ? x.b : x.i, y.t == JV_BOOL ? y.b : y.i, &r)) jfail(c, 0, "integer overflow");
            return jv_int(r);
        }
        return jv_float(jv_num(x) + jv_num(y));
    }
    jfail(c, 0, "sum: unsupported operand types '%s' and '%s'", jv_typename(x), jv_typename(y));
}
static jv f_sum(jctx *c, jv v, const jargs *a) {
    jv attr = jarg(a, 0, "attribute", jv_none()), acc = jarg(a, 1, "start", jv_int(0));
    jlist items;
    jiter(c, v, 0, &items);
    for (size_t i = 0; i < items.n; i++) acc = binop_add(c, acc, attr.t == JV_NONE ? items.v[i] : attr_path(c, items.v[i], attr));
    return acc;
}

/* select/reject(test, args...) and selectattr/rejectattr(attr, test, args...) */
static jv select_common(jctx *c, jv v, const jargs *a, bool attr, bool want) {
    if (!jv_truthy(v)) return jv_list(c, 0, JL_GEN); /* jinja2 does not look at a false value */
    jlist items;
    jiter(c, v, 0, &items);
    int off = attr ? 1 : 0;
    if (attr && a->n < 1) jfail(c, 0, "selectattr/rejectattr need an attribute");
    jv out = jv_list(c, items.n, JL_GEN);
    const char *test = NULL;
    if (a->n > off) {
        jv t = need_str(c, a->v[off], "select");
        test = t.s.p;
        if (!jb_known_test(test)) jfail(c, 0, "no test named '%s'", test);
    }
    jargs ta = {.n = a->n > off + 1 ? a->n - off - 1 : 0, .v = a->n > off + 1 ? a->v + off + 1 : NULL,
                .nkw = a->nkw, .kwn = a->kwn, .kwv = a->kwv};
    for (size_t i = 0; i < items.n; i++) {
        jv x = attr ? attr_path(c, items.v[i], a->v[0]) : items.v[i];
        bool r = test ? jb_test(c, test, x, &ta) : jv_truthy(x);
        if (r == want) jv_push(c, out, items.v[i]);
    }
    return out;
}
static jv f_select(jctx *c, jv v, const jargs *a) { return select_common(c, v, a, false, true); }
static jv f_reject(jctx *c, jv v, const jargs *a) { return select_common(c, v, a, false, false); }
static jv f_selectattr(jctx *c, jv v, const jargs *a) { return select_common(c, v, a, true, true); }
static jv f_rejectattr(jctx *c, jv v, const jargs *a) { return select_common(c, v, a, true, false); }
static jv f_map(jctx *c, jv v, const jargs *a) {
    if (!jv_truthy(v)) return jv_list(c, 0, JL_GEN);
    jlist items;
    jiter(c, v, 0, &items);
    jv out = jv_list(c, items.n, JL_GEN);
    if (has_arg(a, -1, "attribute")) {
        jv attr = jarg(a, -1, "attribute", jv_none()), dflt = jarg(a, -1, "default", jv_undef(NULL));
        bool has_d = has_arg(a, -1, "default");
        for (size_t i = 0; i < items.n; i++) {
            jv x = attr_path(c, items.v[i], attr);
            jv_push(c, out, x.t == JV_UNDEF && has_d ? dflt : x);
        }
        return out;
    }
    if (a->n < 1) jfail(c, 0, "map needs a filter name or attribute=");
    jv f = need_str(c, a->v[0], "map");
    if (!jb_known_filter(f.s.p)) jfail(c, 0, "no filter named '%s'", f.s.p);
    jargs fa = {.n = a->n - 1, .v = a->v + 1, .nkw = a->nkw, .kwn = a->kwn, .kwv = a->kwv};
    for (size_t i = 0; i < items.n; i++) jv_push(c, out, jb_filter(c, f.s.p, items.v[i], &fa));
    return out;
}
static jv f_attr(jctx *c, jv v, const jargs *a) {
    jv n = need_str(c, jarg(a, 0, "name", jv_none()), "attr");
    return jgetattr(c, v, n.s.p, n.s.n, 0);
}

typedef struct fdef { const char *name; ffn fn; } fdef;
static const fdef filters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"capitalize", f_capitalize}, {"count", f_length}, {"d", f_default},
    {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape}, {"first", f_first},
    {"float", f_float}, {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
    {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
    {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
    {"round", f_round}, {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort},
    {"string", f_string}, {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
    {"unique", f_unique}, {"upper", f_upper}, {NULL, NULL}};
static const char *const filters_other[] = {"batch", "center", "filesizeformat", "forceescape", "format", "groupby",
    "pprint", "random", "slice", "striptags", "truncate", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", NULL};

bool jb_known_filter(const char *name) {
    for (int i = 0; filters[i].name; i++)
        if (!strcmp(filters[i].name, name)) return true;
    return name_in(filters_other, name, strlen(name));
}

jv jb_filter(jctx *c, const char *name, jv v, const jargs *a) {
    for (int i = 0; filters[i].name; i++)
        if (!strcmp(filters[i].name, name)) return filters[i].fn(c, v, a);
    if (!jb_known_filter(name)) jfail(c, 0, "no filter named '%s'", name); /* jinja2 fails where it runs, too */
    jfail(c, 0, "the '%s' filter is not supported", name);
}

/* ---- tests ---- */
static const char *const tests_known[] = {"boolean", "callable", "defined", "divisibleby", "eq", "equalto",
    "escaped", "even", "false", "filter", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le",
    "lower", "lessthan", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence", "string", "test",
    "true", "undefined", "upper", NULL};

bool jb_known_test(const char *name) { return name_in(tests_known, name, strlen(name)); }

bool jb_test(jctx *c, const char *t, jv v, const jargs *a) {
    if (!jb_known_test(t)) jfail(c, 0, "no test named '%s'", t);
    jv o = a->n ? a->v[0] : jv_undef(NULL);
    if (!strcmp(t, "defined")) return v.t != JV_UNDEF;
    if (!strcmp(t, "undefined")) return v.t == JV_UNDEF;
    if (!strcmp(t, "none")) return v.t == JV_NONE;
    if (!strcmp(t, "boolean")) return v.t == JV_BOOL;
    if (!strcmp(t, "false")) return v.t == JV_BOOL && !v.b;
    if (!strcmp(t, "true")) return v.t == JV_BOOL && v.b;
    if (!strcmp(t, "integer")) return v.t == JV_INT;
    if (!strcmp(t, "float")) return v.t == JV_FLOAT;
    if (!strcmp(t, "number")) return jv_is_num(v);
    if (!strcmp(t, "string")) return v.t == JV_STR;
    if (!strcmp(t, "mapping")) return v.t == JV_DICT;
    if (!strcmp(t, "iterable")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    if (!strcmp(t, "sequence")) return v.t == JV_STR || (v.t == JV_LIST && v.sub != JL_GEN) || v.t == JV_DICT;
    if (!strcmp(t, "callable")) return v.t == JV_FUNC || v.t == JV_MACRO || v.t == JV_LOOP;
    if (!strcmp(t, "escaped")) return v.t == JV_STR && (v.sub & JS_MARKUP);
    if (!strcmp(t, "eq") || !strcmp(t, "equalto")) return jv_eq(v, o);
    if (!strcmp(t, "ne")) return !jv_eq(v, o);
    if (!strcmp(t, "lt") || !strcmp(t, "lessthan")) return jv_cmp(c, v, o, 0) < 0;
    if (!strcmp(t, "le")) return jv_cmp(c, v, o, 0) <= 0;
    if (!strcmp(t, "gt") || !strcmp(t, "greaterthan")) return jv_cmp(c, v, o, 0) > 0;
    if (!strcmp(t, "ge")) return jv_cmp(c, v, o, 0) >= 0;
    if (!strcmp(t, "in")) {
        switch (o.t) {
        case JV_STR:
            if (v.t != JV_STR) jfail(c, 0, "'in <string>' requires string as left operand");
            return v.s.n == 0 || memmem(o.s.p, o.s.n, v.s.p, v.s.n) != NULL;
        case JV_LIST:
            for (size_t i = 0; i < o.l->n; i++)
                if (jv_eq(o.l->v[i], v)) return true;
            return false;
        case JV_DICT: {
            jv tmp;
            return jdict_get(o.d, v, &tmp);
        }
        case JV_UNDEF: return false;
        default: jfail(c, 0, "argument of type '%s' is not iterable", jv_typename(o));
        }
    }
    if (!strcmp(t, "odd") || !strcmp(t, "even")) {
        int64_t i = need_int(c, v, t);
        return (i % 2 != 0) == (t[0] == 'o');
    }
    if (!strcmp(t, "divisibleby")) {
        int64_t d = need_int(c, o, "divisibleby"), i = need_int(c, v, "divisibleby");
        if (!d) jfail(c, 0, "integer division or modulo by zero");
        return i % d == 0;
    }
    if (!strcmp(t, "sameas")) {
        if (v.t == JV_NONE || v.t == JV_BOOL || o.t == JV_NONE || o.t == JV_BOOL) return v.t == o.t && (v.t != JV_BOOL || v.b == o.b);
        if (v.t == JV_LIST || v.t == JV_DICT || v.t == JV_NS) return v.t == o.t && v.l == o.l;
        jfail(c, 0, "the 'sameas' test on a %s is not supported", jv_typename(v));
    }
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.t != JV_STR) jfail(c, 0, "the '%s' test needs a string", t);
        bool any = false;
        for (size_t i = 0; i < v.s.n;) {
            int k = checked_case(c, u8_next(v.s.p, v.s.n, &i), t);
            if (!k) continue;
            any = true;
            if ((t[0] == 'u') != (k == 1)) return false;
        }
        return any;
    }
    if (!strcmp(t, "filter")) return v.t == JV_STR && jb_known_filter(v.s.p);
    if (!strcmp(t, "test")) return v.t == JV_STR && jb_known_test(v.s.p);
    jfail(c, 0, "the '%s' test is not supported", t);
}

/* ---- globals ---- */
static jv g_range(jctx *c, jv self, const jargs *a) {
    if (a->n < 1 || a->n > 3 || a->nkw) jfail(c, 0, "range expected 1 to 3 integer arguments");
    int64_t start = 0, stop, st = 1;
    if (a->n == 1) stop = need_int(c, a->v[0], "range");
    else {
        start = need_int(c, a->v[0], "range");
        stop = need_int(c, a->v[1], "range");
        if (a->n == 3) st = need_int(c, a->v[2], "range");
    }
    if (st == 0) jfail(c, 0, "range() arg 3 must not be zero");
    jv out = jv_list(c, 0, JL_SIZED);
    for (int64_t i = start; st > 0 ? i < stop : i > stop; i += st) {
        if (out.l->n >= 100000) jfail(c, 0, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jv_push(c, out, jv_int(i));
        if ((st > 0 && i > INT64_MAX - st) || (st < 0 && i < INT64_MIN - st)) break;
    }
    return out;
}
static jv g_namespace(jctx *c, jv self, const jargs *a) {
    jv ns = jv_dict(c, 0);
    ns.t = JV_NS;
    if (a->n > 1) jfail(c, 0, "namespace takes at most one positional argument");
    if (a->n == 1) {
        if (a->v[0].t != JV_DICT) jfail(c, 0, "namespace: the positional argument must be a mapping");
        for (size_t i = 0; i < a->v[0].d->n; i++) jdict_set(c, ns.d, a->v[0].d->k[i], a->v[0].d->v[i]);
    }
    for (int i = 0; i < a->nkw; i++) jdict_set(c, ns.d, jv_strref(a->kwn[i], strlen(a->kwn[i])), a->kwv[i]);
    return ns;
}
static jv g_dict(jctx *c, jv self, const jargs *a) {
    jv d = g_namespace(c, self, a);
    d.t = JV_DICT;
    return d;
}
static jv g_raise(jctx *c, jv self, const jargs *a) {
    jv m = a->n ? jv_to_str(c, a->v[0], 0) : emptystr();
    jfail(c, 0, "raise_exception: %.*s", (int)(m.s.n > 300 ? 300 : m.s.n), m.s.p);
}
static jv g_strftime(jctx *c, jv self, const jargs *a) {
    jv f = need_str(c, jarg(a, 0, "format", jv_none()), "strftime_now");
    if (f.s.n > 200) jfail(c, 0, "strftime_now: format too long");
    time_t t = (time_t)c->now;
    struct tm tm;
    gmtime_r(&t, &tm);
    char fmt[256], out[1024];
    memcpy(fmt, f.s.p, f.s.n);
    fmt[f.s.n] = 0;
    size_t n = strftime(out, sizeof out, fmt, &tm);
    if (!n && f.s.n) jfail(c, 0, "strftime_now: the result does not fit");
    return jv_str(c, out, n);
}
static jv g_unsupported(jctx *c, jv self, const jargs *a) { jfail(c, 0, "this global function is not supported"); }

jv jb_global(jctx *c, const char *name) {
    static const struct { const char *name; jfn fn; } g[] = {
        {"range", g_range}, {"namespace", g_namespace}, {"dict", g_dict}, {"raise_exception", g_raise},
        {"strftime_now", g_strftime}, {"lipsum", g_unsupported}, {"cycler", g_unsupported}, {"joiner", g_unsupported}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (!strcmp(g[i].name, name)) return jv_func(c, g[i].fn, jv_none(), g[i].name);
    return jv_undef(name);
}
