/* jinja_parse.c: template text to syntax nodes. The lexer follows python jinja2's (lexer.py)
 * with trim_blocks and lstrip_blocks on, as transformers configures it: whitespace control
 * with - and +, newline normalization, the dropped final newline, {% raw %}, comments. The
 * parser follows jinja2's grammar (parser.py) for the tags, expressions, filters and tests
 * the subset has; anything else is an error naming it and its line. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

enum { T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct tok {
    int type, line;
    const char *p; /* T_DATA, T_NAME: text; T_STRING: decoded; T_OP: the operator */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    jarena *ar;
    tok *t;
    size_t nt, cap, pos;
    int depth, loops;
    jmp_buf jb;
    herr *e;
} parser;

HEARTH_NORETURN __attribute__((format(printf, 3, 4))) static void pfail(parser *p, int line, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    herr_set(p->e, "template line %d: %s", line, msg);
    longjmp(p->jb, 1);
}

static void *palloc(parser *p, size_t n) { return jarena_alloc(p->ar, n); }

static void emit(parser *p, int type, int line, const char *s, size_t n) {
    if (p->nt == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        tok *nt = palloc(p, p->cap * sizeof(tok));
        if (p->nt) memcpy(nt, p->t, p->nt * sizeof(tok));
        p->t = nt;
    }
    p->t[p->nt++] = (tok){.type = type, .line = line, .p = s, .n = n};
}

/* ---- lexer ---- */

/* Python's \s at s[i]: its byte length, or 0 */
static size_t ws_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    size_t j = i;
    uint32_t cp = u8_next(s, n, &j);
    return py_isspace(cp) ? j - i : 0;
}
static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t k;
    while ((k = ws_at(s, n, i))) i += k;
    return i;
}
static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* The text before a tag, after whitespace control: `sign` is the tag's -/+ (or 0), block
 * tells a block or comment (lstrip_blocks applies) from a variable. */
static size_t strip_text(const char *s, size_t n, char sign, bool block, bool line_starting) {
    if (sign == '-') {
        size_t end = n;
        while (end > 0) {
            size_t st = end - 1;
            while (st > 0 && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
            if (!ws_at(s, n, st)) break;
            end = st;
        }
        return end;
    }
    if (sign == '+' || !block) return n;
    size_t l = n;
    while (l > 0 && s[l - 1] != '\n') l--;
    if (l == 0 && !line_starting) return n;
    if (l == n) return n; /* \s+ needs one character */
    for (size_t i = l; i < n;) {
        size_t k = ws_at(s, n, i);
        if (!k) return n;
        i += k;
    }
    return l;
}

/* Python's unicode-escape decoding of a string literal's body */
static void decode_string(parser *p, int line, const char *s, size_t n, tok *out) {
    char *o = palloc(p, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 >= n) { o[k++] = s[i++]; continue; }
        char ch = s[i + 1];
        i += 2;
        uint32_t cp;
        switch (ch) {
        case '\n': continue;
        case '\\': o[k++] = '\\'; continue;
        case '\'': o[k++] = '\''; continue;
        case '"': o[k++] = '"'; continue;
        case 'a': o[k++] = '\a'; continue;
        case 'b': o[k++] = '\b'; continue;
        case 'f': o[k++] = '\f'; continue;
        case 'n': o[k++] = '\n'; continue;
        case 'r': o[k++] = '\r'; continue;
        case 't': o[k++] = '\t'; continue;
        case 'v': o[k++] = '\v'; continue;
        case 'x': case 'u': case 'U': {
            int nd = ch == 'x' ? 2 : ch == 'u' ? 4 : 8;
            cp = 0;
            for (int d = 0; d < nd; d++, i++) {
                char h = i < n ? s[i] : 0;
                int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (v < 0) pfail(p, line, "truncated \\%c escape in a string literal", ch);
                cp = cp * 16 + (uint32_t)v;
            }
            break;
        }
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7':
            cp = (uint32_t)(ch - '0');
            for (int d = 0; d < 2 && i < n && s[i] >= '0' && s[i] <= '7'; d++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
            break;
        default:
            if ((unsigned char)ch >= 0x80) pfail(p, line, "a backslash before a non-ASCII character is not supported");
            if (ch == 'N') pfail(p, line, "\\N{...} escapes are not supported");
            o[k++] = '\\';
            o[k++] = ch;
            continue;
        }
        if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            pfail(p, line, "string literal escape U+%X is not a valid character", cp);
        uint8_t u[4];
        int m;
        if (cp < 0x80) { u[0] = (uint8_t)cp; m = 1; }
        else if (cp < 0x800) { u[0] = (uint8_t)(0xc0 | cp >> 6); u[1] = (uint8_t)(0x80 | (cp & 0x3f)); m = 2; }
        else if (cp < 0x10000) { u[0] = (uint8_t)(0xe0 | cp >> 12); u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f)); u[2] = (uint8_t)(0x80 | (cp & 0x3f)); m = 3; }
        else { u[0] = (uint8_t)(0xf0 | cp >> 18); u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f)); u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f)); u[3] = (uint8_t)(0x80 | (cp & 0x3f)); m = 4; }
        memcpy(o + k, u, (size_t)m);
        k += (size_t)m;
    }
    o[k] = 0;
    out->p = o;
    out->n = k;
}

/* Lexes the inside of a {{ }} or {% %} from s[*pos]; returns with *pos after its end. */
static void lex_tag(parser *p, const char *s, size_t n, size_t *pos, int *line, bool block, bool *line_starting) {
    char stack[64];
    int depth = 0;
    size_t i = *pos;
    for (;;) {
        if (i >= n) pfail(p, *line, "unexpected end of template, expected '%s'", block ? "%}" : "}}");
        if (depth == 0) {
            size_t end = 0;
            if (block) {
                if (!strncmp(s + i, "+%}", 3)) end = i + 3;
                else if (!strncmp(s + i, "-%}", 3)) end = skip_ws(s, n, i + 3);
                else if (!strncmp(s + i, "%}", 2)) end = i + 2 + (i + 2 < n && s[i + 2] == '\n');
            } else {
                if (!strncmp(s + i, "-}}", 3)) end = skip_ws(s, n, i + 3);
                else if (!strncmp(s + i, "}}", 2)) end = i + 2;
            }
            if (end) {
                emit(p, block ? T_BEND : T_VEND, *line, NULL, 0);
                *line += count_nl(s + i, end - i);
                *line_starting = s[end - 1] == '\n';
                *pos = end;
                return;
            }
        }
        size_t k = ws_at(s, n, i);
        if (k) {
            *line += s[i] == '\n';
            i += k;
            continue;
        }
        char ch = s[i];
        if (ch >= '0' && ch <= '9') {
            size_t j = i;
            char num[64];
            size_t m = 0;
            bool is_float = false;
            if (ch == '0' && j + 1 < n && strchr("xXoObB", s[j + 1]) && s[j + 1]) {
                int base = strchr("xX", s[j + 1]) ? 16 : strchr("oO", s[j + 1]) ? 8 : 2;
                j += 2;
                int64_t v = 0;
                size_t st = j;
                for (; j < n; j++) {
                    if (s[j] == '_') continue;
                    int d = s[j] >= '0' && s[j] <= '9' ? s[j] - '0' : (s[j] | 32) >= 'a' && (s[j] | 32) <= 'f' ? (s[j] | 32) - 'a' + 10 : 99;
                    if (d >= base) break;
                    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v))
                        pfail(p, *line, "integer literal too large");
                }
                if (j == st) pfail(p, *line, "bad integer literal");
                emit(p, T_INT, *line, NULL, 0);
                p->t[p->nt - 1].i = v;
                i = j;
                continue;
            }
            while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) { if (s[j] != '_' && m < 60) num[m++] = s[j]; j++; }
            if (j + 1 < n && s[j] == '.' && s[j + 1] >= '0' && s[j + 1] <= '9') {
                is_float = true;
                if (m < 60) num[m++] = '.';
                j++;
                while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) { if (s[j] != '_' && m < 60) num[m++] = s[j]; j++; }
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t e = j + 1;
                if (e < n && (s[e] == '+' || s[e] == '-')) e++;
                if (e < n && s[e] >= '0' && s[e] <= '9') {
                    is_float = true;
                    for (size_t q = j; q < e && m < 60; q++) num[m++] = s[q];
                    j = e;
                    while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) { if (s[j] != '_' && m < 60) num[m++] = s[j]; j++; }
                }
            }
            if (m >= 60) pfail(p, *line, "number literal too long");
            num[m] = 0;
            if (is_float) {
                emit(p, T_FLOAT, *line, NULL, 0);
                p->t[p->nt - 1].f = strtod(num, NULL);
            } else {
                char *endp;
                errno = 0;
                long long v = strtoll(num, &endp, 10);
                if (errno) pfail(p, *line, "integer literal too large");
                emit(p, T_INT, *line, NULL, 0);
                p->t[p->nt - 1].i = v;
            }
            i = j;
            continue;
        }
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            size_t j = i;
            while (j < n && ((s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z') || (s[j] >= '0' && s[j] <= '9') || s[j] == '_')) j++;
            char *nm = palloc(p, j - i + 1);
            memcpy(nm, s + i, j - i);
            emit(p, T_NAME, *line, nm, j - i);
            i = j;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            int l0 = *line;
            while (j < n && s[j] != ch) {
                if (s[j] == '\\' && j + 1 < n) j++;
                if (s[j] == '\n') (*line)++;
                j++;
            }
            if (j >= n) pfail(p, l0, "unterminated string literal");
            emit(p, T_STRING, l0, NULL, 0);
            decode_string(p, l0, s + i + 1, j - i - 1, &p->t[p->nt - 1]);
            i = j + 1;
            continue;
        }
        static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<="};
        const char *op = NULL;
        for (size_t q = 0; q < sizeof ops2 / sizeof ops2[0]; q++)
            if (i + 1 < n && s[i] == ops2[q][0] && s[i + 1] == ops2[q][1]) op = ops2[q];
        if (!op) {
            static const char *ops1 = "+-/*%~[](){}><=.:|,;";
            const char *f = strchr(ops1, ch);
            if (!f || !ch) pfail(p, *line, "unexpected character '%c'", ch);
            static const char *one[] = {"+", "-", "/", "*", "%", "~", "[", "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
            op = one[f - ops1];
            if (ch == '(' || ch == '[' || ch == '{') {
                if (depth == (int)sizeof stack) pfail(p, *line, "brackets nested too deeply");
                stack[depth++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
            } else if (ch == ')' || ch == ']' || ch == '}') {
                if (!depth) pfail(p, *line, "unexpected '%c'", ch);
                if (stack[depth - 1] != ch) pfail(p, *line, "unexpected '%c', expected '%c'", ch, stack[depth - 1]);
                depth--;
            }
        }
        emit(p, T_OP, *line, op, strlen(op));
        i += strlen(op);
    }
}

static void lex(parser *p, const char *s, size_t n) {
    size_t pos = 0;
    int line = 1;
    bool line_starting = true;
    while (pos < n) {
        size_t q = pos;
        while (q + 1 < n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#'))) q++;
        if (q + 1 >= n) {
            emit(p, T_DATA, line, s + pos, n - pos);
            break;
        }
        char kind = s[q + 1];
        char sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t open_end = q + 2 + (sign != 0);
        /* {% raw %} */
        size_t raw_end = 0;
        if (kind == '%') {
            size_t j = skip_ws(s, n, open_end);
            if (j + 3 <= n && !strncmp(s + j, "raw", 3)) {
                j = skip_ws(s, n, j + 3);
                if (!strncmp(s + j, "-%}", 3)) raw_end = skip_ws(s, n, j + 3);
                else if (!strncmp(s + j, "%}", 2)) raw_end = j + 2;
            }
        }
        size_t keep = strip_text(s + pos, q - pos, sign, kind != '{', line_starting);
        if (keep) emit(p, T_DATA, line, s + pos, keep);
        line += count_nl(s + pos, q - pos);
        if (raw_end) {
            line += count_nl(s + q, raw_end - q);
            line_starting = s[raw_end - 1] == '\n';
            /* the raw text runs to the first {% endraw %} */
            size_t r = raw_end, body_end = 0, after = 0;
            char esign = 0;
            for (; r + 1 < n; r++) {
                if (s[r] != '{' || s[r + 1] != '%') continue;
                size_t j = r + 2;
                esign = j < n && (s[j] == '-' || s[j] == '+') ? s[j] : 0;
                j = skip_ws(s, n, j + (esign != 0));
                if (j + 6 > n || strncmp(s + j, "endraw", 6)) continue;
                j = skip_ws(s, n, j + 6);
                if (!strncmp(s + j, "+%}", 3)) after = j + 3;
                else if (!strncmp(s + j, "-%}", 3)) after = skip_ws(s, n, j + 3);
                else if (!strncmp(s + j, "%}", 2)) after = j + 2 + (j + 2 < n && s[j + 2] == '\n');
                else continue;
                body_end = r;
                break;
            }
            if (!after) pfail(p, line, "missing end of raw directive");
            size_t rk = strip_text(s + raw_end, body_end - raw_end, esign, true, line_starting);
            if (rk) emit(p, T_DATA, line, s + raw_end, rk);
            line += count_nl(s + raw_end, after - raw_end);
            line_starting = s[after - 1] == '\n';
            pos = after;
            continue;
        }
        line_starting = false;
        if (kind == '#') {
            size_t r = open_end, end = 0;
            while (r + 1 < n && !(s[r] == '#' && s[r + 1] == '}')) r++;
            if (r + 1 >= n) pfail(p, line, "missing end of comment tag");
            char csign = r > open_end && (s[r - 1] == '-' || s[r - 1] == '+') ? s[r - 1] : 0;
            if (csign == '-') end = skip_ws(s, n, r + 2);
            else if (csign == '+') end = r + 2;
            else end = r + 2 + (r + 2 < n && s[r + 2] == '\n');
            line += count_nl(s + q, end - q);
            line_starting = s[end - 1] == '\n';
            pos = end;
            continue;
        }
        bool block = kind == '%';
        emit(p, block ? T_BBEGIN : T_VBEGIN, line, NULL, 0);
        pos = open_end;
        lex_tag(p, s, n, &pos, &line, block, &line_starting);
    }
    emit(p, T_EOF, line, NULL, 0);
}

/* ---- parser ---- */
static tok *cur(parser *p) { return &p->t[p->pos]; }
static tok *peek(parser *p, size_t k) { return &p->t[p->pos + k < p->nt ? p->pos + k : p->nt - 1]; }
static tok *next_tok(parser *p) { tok *t = cur(p); if (p->pos + 1 < p->nt) p->pos++; return t; }
static bool is_op(const tok *t, const char *op) { return t->type == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n); }
static bool is_name(const tok *t, const char *nm) { return t->type == T_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n); }
static const char *tok_desc(const tok *t) {
    switch (t->type) {
    case T_DATA: return "template data";
    case T_VBEGIN: return "'{{'";
    case T_VEND: return "'}}'";
    case T_BBEGIN: return "'{%'";
    case T_BEND: return "'%}'";
    case T_EOF: return "end of template";
    case T_STRING: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: return t->p;
    }
}
static void expect_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) pfail(p, cur(p)->line, "expected '%s', got %s", op, tok_desc(cur(p)));
    next_tok(p);
}
static const char *expect_name(parser *p) {
    if (cur(p)->type != T_NAME) pfail(p, cur(p)->line, "expected a name, got %s", tok_desc(cur(p)));
    return next_tok(p)->p;
}
static void expect_type(parser *p, int type, const char *what) {
    if (cur(p)->type != type) pfail(p, cur(p)->line, "expected %s, got %s", what, tok_desc(cur(p)));
    next_tok(p);
}

static jnode *mk(parser *p, int kind, int line) {
    jnode *n = palloc(p, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

typedef struct nvec { jnode **v; int n, cap; } nvec;
static void nv_push(parser *p, nvec *v, jnode *x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 4;
        jnode **nw = palloc(p, (size_t)v->cap * sizeof *nw);
        if (v->n) memcpy(nw, v->v, (size_t)v->n * sizeof *nw);
        v->v = nw;
    }
    v->v[v->n++] = x;
}
typedef struct svec { const char **v; int n, cap; } svec;
static void sv_push(parser *p, svec *v, const char *x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 4;
        const char **nw = palloc(p, (size_t)v->cap * sizeof *nw);
        if (v->n) memcpy(nw, v->v, (size_t)v->n * sizeof *nw);
        v->v = nw;
    }
    v->v[v->n++] = x;
}

static void enter(parser *p) {
    if (++p->depth > 200) pfail(p, cur(p)->line, "template nested too deeply");
}

static jnode *parse_expr(parser *p, bool condexpr);
static jnode *parse_tuple(parser *p, bool condexpr, const char *extra_end, bool explicit_parens);
static jnode *parse_unary(parser *p, bool with_filter);
static jnode *parse_primary(parser *p);
static jnode *parse_postfix(parser *p, jnode *n);

/* (args) of a call, filter or test into n->kids / n->kwn / n->kwv */
static void parse_call_args(parser *p, jnode *n) {
    expect_op(p, "(");
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    while (!is_op(cur(p), ")")) {
        if (args.n || kwn.n) expect_op(p, ",");
        if (is_op(cur(p), ")")) break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**")) pfail(p, cur(p)->line, "*args and **kwargs in calls are not supported");
        if (cur(p)->type == T_NAME && is_op(peek(p, 1), "=")) {
            sv_push(p, &kwn, next_tok(p)->p);
            next_tok(p);
            nv_push(p, &kwv, parse_expr(p, true));
        } else {
            if (kwn.n) pfail(p, cur(p)->line, "positional argument after keyword arguments");
            nv_push(p, &args, parse_expr(p, true));
        }
    }
    expect_op(p, ")");
    n->kids = args.v;
    n->nkids = args.n;
    n->kwn = kwn.v;
    n->kwv = kwv.v;
    n->nkw = kwn.n;
}

static const char *dotted_name(parser *p) {
    const char *nm = expect_name(p);
    while (is_op(cur(p), ".")) {
        next_tok(p);
        const char *more = expect_name(p);
        size_t a = strlen(nm), b = strlen(more);
        char *j = palloc(p, a + b + 2);
        memcpy(j, nm, a);
        j[a] = '.';
        memcpy(j + a + 1, more, b);
        nm = j;
    }
    return nm;
}

/* `| name(args)` repeated; start_inline: the first filter has no leading pipe */
static jnode *parse_filter(parser *p, jnode *node, bool start_inline) {
    while (is_op(cur(p), "|") || start_inline) {
        if (!start_inline) next_tok(p);
        start_inline = false;
        int line = cur(p)->line;
        jnode *f = mk(p, N_FILTER, line);
        f->name = dotted_name(p);
        f->a = node;
        if (is_op(cur(p), "(")) parse_call_args(p, f);
        node = f;
    }
    return node;
}

static jnode *parse_test(parser *p, jnode *node) {
    int line = next_tok(p)->line; /* is */
    bool neg = false;
    if (is_name(cur(p), "not")) { next_tok(p); neg = true; }
    jnode *t = mk(p, N_TEST, line);
    t->name = dotted_name(p);
    t->a = node;
    t->negate = neg;
    tok *c = cur(p);
    if (is_op(c, "(")) {
        parse_call_args(p, t);
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) pfail(p, c->line, "you cannot chain multiple tests with is");
        jnode *arg = parse_postfix(p, parse_primary(p));
        t->kids = palloc(p, sizeof(jnode *));
        t->kids[0] = arg;
        t->nkids = 1;
    }
    return t;
}

static jnode *parse_filter_expr(parser *p, jnode *node) {
    for (;;) {
        if (is_op(cur(p), "|")) node = parse_filter(p, node, false);
        else if (is_name(cur(p), "is")) node = parse_test(p, node);
        else if (is_op(cur(p), "(")) {
            jnode *c = mk(p, N_CALL, cur(p)->line);
            c->a = node;
            parse_call_args(p, c);
            node = c;
        } else break;
    }
    return node;
}

static jnode *parse_subscribed(parser *p) {
    int line = cur(p)->line;
    jnode *parts[3] = {0};
    if (!is_op(cur(p), ":")) {
        parts[0] = parse_expr(p, true);
        if (!is_op(cur(p), ":")) return parts[0];
    }
    next_tok(p); /* : */
    if (!is_op(cur(p), "]") && !is_op(cur(p), ",") && !is_op(cur(p), ":")) parts[1] = parse_expr(p, true);
    if (is_op(cur(p), ":")) {
        next_tok(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",")) parts[2] = parse_expr(p, true);
    }
    jnode *s = mk(p, N_SLICE, line);
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    return s;
}

static jnode *parse_postfix(parser *p, jnode *node) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, ".")) {
            next_tok(p);
            tok *a = next_tok(p);
            if (a->type == T_NAME) {
                jnode *g = mk(p, N_ATTR, a->line);
                g->a = node;
                g->name = a->p;
                node = g;
            } else if (a->type == T_INT) {
                jnode *g = mk(p, N_ITEM, a->line), *k = mk(p, N_LIT, a->line);
                k->lit = jv_int(a->i);
                g->a = node;
                g->b = k;
                node = g;
            } else pfail(p, a->line, "expected a name or number after '.'");
        } else if (is_op(t, "[")) {
            next_tok(p);
            nvec args = {0};
            while (!is_op(cur(p), "]")) {
                if (args.n) expect_op(p, ",");
                nv_push(p, &args, parse_subscribed(p));
            }
            expect_op(p, "]");
            if (!args.n) pfail(p, t->line, "expected an index inside []");
            jnode *arg = args.v[0];
            if (args.n > 1) {
                arg = mk(p, N_TUPLE, t->line);
                arg->kids = args.v;
                arg->nkids = args.n;
            }
            jnode *g;
            if (arg->kind == N_SLICE) {
                g = arg;
                g->a = node;
            } else {
                g = mk(p, N_ITEM, t->line);
                g->a = node;
                g->b = arg;
            }
            node = g;
        } else if (is_op(t, "(")) {
            jnode *c = mk(p, N_CALL, t->line);
            c->a = node;
            parse_call_args(p, c);
            node = c;
        } else break;
    }
    return node;
}

static jnode *parse_primary(parser *p) {
    enter(p);
    tok *t = next_tok(p);
    jnode *n;
    if (t->type == T_NAME) {
        n = mk(p, N_LIT, t->line);
        if (is_name(t, "true") || is_name(t, "True")) n->lit = jv_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) n->lit = jv_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) n->lit = jv_none();
        else {
            /* jinja2 gives macros these implicitly; the subset does not */
            if (is_name(t, "varargs") || is_name(t, "kwargs") || is_name(t, "caller"))
                pfail(p, t->line, "'%s' (a macro's implicit %s) is not supported", t->p, is_name(t, "caller") ? "call block" : "arguments");
            n->kind = N_NAME;
            n->name = t->p;
        }
    } else if (t->type == T_STRING) {
        n = mk(p, N_LIT, t->line);
        const char *s = t->p;
        size_t len = t->n;
        while (cur(p)->type == T_STRING) { /* adjacent literals concatenate */
            tok *u = next_tok(p);
            char *j = palloc(p, len + u->n + 1);
            memcpy(j, s, len);
            memcpy(j + len, u->p, u->n);
            s = j;
            len += u->n;
        }
        n->lit = jv_strref(s, len);
    } else if (t->type == T_INT) {
        n = mk(p, N_LIT, t->line);
        n->lit = jv_int(t->i);
    } else if (t->type == T_FLOAT) {
        n = mk(p, N_LIT, t->line);
        n->lit = jv_float(t->f);
    } else if (is_op(t, "(")) {
        n = parse_tuple(p, true, NULL, true);
        expect_op(p, ")");
    } else if (is_op(t, "[")) {
        n = mk(p, N_LIST, t->line);
        nvec items = {0};
        while (!is_op(cur(p), "]")) {
            if (items.n) expect_op(p, ",");
            if (is_op(cur(p), "]")) break;
            nv_push(p, &items, parse_expr(p, true));
        }
        expect_op(p, "]");
        n->kids = items.v;
        n->nkids = items.n;
    } else if (is_op(t, "{")) {
        n = mk(p, N_DICT, t->line);
        nvec items = {0};
        while (!is_op(cur(p), "}")) {
            if (items.n) expect_op(p, ",");
            if (is_op(cur(p), "}")) break;
            nv_push(p, &items, parse_expr(p, true));
            expect_op(p, ":");
            nv_push(p, &items, parse_expr(p, true));
        }
        expect_op(p, "}");
        n->kids = items.v;
        n->nkids = items.n;
    } else {
        pfail(p, t->line, "unexpected %s", tok_desc(t));
    }
    p->depth--;
    return n;
}

static jnode *parse_unary(parser *p, bool with_filter) {
    enter(p);
    jnode *n;
    tok *t = cur(p);
    if (is_op(t, "-") || is_op(t, "+")) {
        next_tok(p);
        n = mk(p, is_op(t, "-") ? N_NEG : N_POS, t->line);
        n->a = parse_unary(p, false);
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static jnode *binop(parser *p, int op, jnode *a, jnode *b, int line) {
    jnode *n = mk(p, N_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *p) {
    jnode *l = parse_unary(p, true);
    while (is_op(cur(p), "**")) {
        int line = next_tok(p)->line;
        l = binop(p, OP_POW, l, parse_unary(p, true), line);
    }
    return l;
}
static jnode *parse_math2(parser *p) {
    jnode *l = parse_pow(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FLOORDIV : is_op(t, "%") ? OP_MOD : -1;
        if (op < 0) return l;
        next_tok(p);
        l = binop(p, op, l, parse_pow(p), t->line);
    }
}
static jnode *parse_concat(parser *p) {
    jnode *l = parse_math2(p);
    while (is_op(cur(p), "~")) {
        int line = next_tok(p)->line;
        l = binop(p, OP_CONCAT, l, parse_math2(p), line);
    }
    return l;
}
static jnode *parse_math1(parser *p) {
    jnode *l = parse_concat(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (op < 0) return l;
        next_tok(p);
        l = binop(p, op, l, parse_concat(p), t->line);
    }
}
static jnode *parse_compare(parser *p) {
    int line = cur(p)->line;
    jnode *l = parse_math1(p);
    nvec rhs = {0};
    int ops[64], nops = 0;
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "==") ? OP_EQ : is_op(t, "!=") ? OP_NE : is_op(t, "<") ? OP_LT : is_op(t, "<=") ? OP_LE
               : is_op(t, ">") ? OP_GT : is_op(t, ">=") ? OP_GE : is_name(t, "in") ? OP_IN : -1;
        if (op >= 0) next_tok(p);
        else if (is_name(t, "not") && is_name(peek(p, 1), "in")) { next_tok(p); next_tok(p); op = OP_NOTIN; }
        else break;
        if (nops == 64) pfail(p, t->line, "comparison chain too long");
        ops[nops++] = op;
        nv_push(p, &rhs, parse_math1(p));
    }
    if (!nops) return l;
    jnode *c = mk(p, N_CMP, line);
    c->a = l;
    c->kids = rhs.v;
    c->nkids = rhs.n;
    c->ops = palloc(p, (size_t)nops * sizeof(int));
    memcpy(c->ops, ops, (size_t)nops * sizeof(int));
    return c;
}
static jnode *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        enter(p);
        jnode *n = mk(p, N_NOT, next_tok(p)->line);
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}
static jnode *parse_and(parser *p) {
    jnode *l = parse_not(p);
    while (is_name(cur(p), "and")) {
        jnode *n = mk(p, N_AND, next_tok(p)->line);
        n->a = l;
        n->b = parse_not(p);
        l = n;
    }
    return l;
}
static jnode *parse_or(parser *p) {
    jnode *l = parse_and(p);
    while (is_name(cur(p), "or")) {
        jnode *n = mk(p, N_OR, next_tok(p)->line);
        n->a = l;
        n->b = parse_and(p);
        l = n;
    }
    return l;
}
static jnode *parse_condexpr(parser *p) {
    enter(p);
    jnode *e1 = parse_or(p);
    while (is_name(cur(p), "if")) {
        jnode *c = mk(p, N_COND, next_tok(p)->line);
        c->a = parse_or(p);
        c->b = e1;
        if (is_name(cur(p), "else")) {
            next_tok(p);
            c->c = parse_condexpr(p);
        }
        e1 = c;
    }
    p->depth--;
    return e1;
}
static jnode *parse_expr(parser *p, bool condexpr) { return condexpr ? parse_condexpr(p) : parse_or(p); }

static bool tuple_end(parser *p, const char *extra_end) {
    tok *t = cur(p);
    if (t->type == T_VEND || t->type == T_BEND || is_op(t, ")")) return true;
    return extra_end && is_name(t, extra_end);
}

static jnode *parse_tuple(parser *p, bool condexpr, const char *extra_end, bool explicit_parens) {
    int line = cur(p)->line;
    nvec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n) expect_op(p, ",");
        if (tuple_end(p, extra_end)) break;
        nv_push(p, &items, parse_expr(p, condexpr));
        if (is_op(cur(p), ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) pfail(p, line, "expected an expression, got %s", tok_desc(cur(p)));
    }
    jnode *t = mk(p, N_TUPLE, line);
    t->kids = items.v;
    t->nkids = items.n;
    return t;
}

/* assignment targets: name, or names separated by commas (optionally in parentheses) */
static void parse_targets(parser *p, jnode *n) {
    svec names = {0};
    bool paren = is_op(cur(p), "(");
    if (paren) next_tok(p);
    for (;;) {
        sv_push(p, &names, expect_name(p));
        if (!is_op(cur(p), ",")) break;
        next_tok(p);
        if (paren && is_op(cur(p), ")")) break;
        if (!paren && cur(p)->type != T_NAME) break;
    }
    if (paren) expect_op(p, ")");
    n->names = names.v;
    n->nnames = names.n;
}

static jnode *parse_body(parser *p, const char *const *stops, const char **which);

/* block_end, then statements up to one of stops */
static jnode *parse_block(parser *p, const char *const *stops, const char **which) {
    if (is_op(cur(p), ":")) next_tok(p);
    expect_type(p, T_BEND, "'%}'");
    return parse_body(p, stops, which);
}

static jnode *parse_statement(parser *p) {
    tok *t = cur(p);
    int line = t->line;
    if (t->type != T_NAME) pfail(p, line, "expected a tag name, got %s", tok_desc(t));
    next_tok(p);
    const char *which;
    enter(p);
    jnode *n;
    if (is_name(t, "if")) {
        n = mk(p, N_IF, line);
        jnode *node = n;
        for (;;) {
            node->a = parse_tuple(p, false, NULL, false);
            static const char *const stops[] = {"elif", "else", "endif", NULL};
            node->b = parse_block(p, stops, &which);
            if (!strcmp(which, "elif")) {
                jnode *e = mk(p, N_IF, cur(p)->line);
                node->c = e;
                node = e;
                continue;
            }
            if (!strcmp(which, "else")) {
                static const char *const stops2[] = {"endif", NULL};
                node->c = parse_block(p, stops2, &which);
            }
            break;
        }
    } else if (is_name(t, "for")) {
        n = mk(p, N_FOR, line);
        parse_targets(p, n);
        if (!is_name(cur(p), "in")) pfail(p, cur(p)->line, "expected 'in', got %s", tok_desc(cur(p)));
        next_tok(p);
        n->a = parse_tuple(p, false, "recursive", false);
        if (is_name(cur(p), "if")) {
            next_tok(p);
            n->d = parse_expr(p, true);
        }
        if (is_name(cur(p), "recursive")) pfail(p, cur(p)->line, "recursive loops are not supported");
        static const char *const stops[] = {"endfor", "else", NULL};
        p->loops++;
        n->b = parse_block(p, stops, &which);
        p->loops--;
        if (!strcmp(which, "else")) {
            static const char *const stops2[] = {"endfor", NULL};
            n->c = parse_block(p, stops2, &which);
        }
    } else if (is_name(t, "set")) {
        if (cur(p)->type == T_NAME && is_op(peek(p, 1), ".")) {
            n = mk(p, N_SETATTR, line);
            n->names = palloc(p, sizeof(char *));
            n->names[0] = next_tok(p)->p;
            n->nnames = 1;
            next_tok(p);
            n->name = expect_name(p);
            expect_op(p, "=");
            n->b = parse_tuple(p, true, NULL, false);
        } else {
            n = mk(p, N_SET, line);
            parse_targets(p, n);
            if (is_op(cur(p), "=")) {
                next_tok(p);
                n->b = parse_tuple(p, true, NULL, false);
            } else {
                n->kind = N_SETBLOCK;
                if (n->nnames != 1) pfail(p, line, "a block set assigns one name");
                if (is_op(cur(p), "|")) n->a = parse_filter(p, mk(p, N_HOLE, line), false);
                static const char *const stops[] = {"endset", NULL};
                n->b = parse_block(p, stops, &which);
            }
        }
    } else if (is_name(t, "macro")) {
        n = mk(p, N_MACRO, line);
        n->name = expect_name(p);
        expect_op(p, "(");
        svec names = {0};
        nvec defs = {0};
        bool any_default = false;
        while (!is_op(cur(p), ")")) {
            if (names.n) expect_op(p, ",");
            sv_push(p, &names, expect_name(p));
            jnode *d = NULL;
            if (is_op(cur(p), "=")) {
                next_tok(p);
                d = parse_expr(p, true);
                any_default = true;
            } else if (any_default) pfail(p, cur(p)->line, "non-default argument follows default argument");
            nv_push(p, &defs, d);
        }
        expect_op(p, ")");
        n->kwn = names.v;
        n->kwv = defs.v;
        n->nkw = names.n;
        static const char *const stops[] = {"endmacro", NULL};
        int loops = p->loops;
        p->loops = 0;
        n->b = parse_block(p, stops, &which);
        p->loops = loops;
    } else if (is_name(t, "filter")) {
        n = mk(p, N_FILTERBLOCK, line);
        n->a = parse_filter(p, mk(p, N_HOLE, line), true);
        static const char *const stops[] = {"endfilter", NULL};
        n->b = parse_block(p, stops, &which);
    } else if (is_name(t, "generation")) {
        static const char *const stops[] = {"endgeneration", NULL};
        n = parse_block(p, stops, &which);
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        if (!p->loops) pfail(p, line, "'%s' outside a loop", t->p);
        n = mk(p, is_name(t, "break") ? N_BREAK : N_CONTINUE, line);
    } else {
        static const char *const known[] = {"include", "import", "from", "extends", "block", "call", "with",
                                            "autoescape", "do", "trans", "pluralize", NULL};
        for (int i = 0; known[i]; i++)
            if (is_name(t, known[i])) pfail(p, line, "the '%s' tag is not supported", t->p);
        pfail(p, line, "unknown tag '%s'", t->p);
    }
    p->depth--;
    return n;
}

static jnode *parse_body(parser *p, const char *const *stops, const char **which) {
    jnode *body = mk(p, N_BODY, cur(p)->line);
    nvec st = {0};
    for (;;) {
        tok *t = cur(p);
        if (t->type == T_EOF) {
            if (stops) {
                char want[96] = "";
                for (int i = 0; stops[i]; i++)
                    snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", i ? " or " : "", stops[i]);
                pfail(p, t->line, "unexpected end of template, expected %s", want);
            }
            break;
        }
        if (t->type == T_DATA) {
            jnode *d = mk(p, N_DATA, t->line);
            d->lit = jv_strref(t->p, t->n);
            nv_push(p, &st, d);
            next_tok(p);
        } else if (t->type == T_VBEGIN) {
            next_tok(p);
            jnode *o = mk(p, N_OUT, t->line);
            o->a = parse_tuple(p, true, NULL, false);
            expect_type(p, T_VEND, "'}}'");
            nv_push(p, &st, o);
        } else if (t->type == T_BBEGIN) {
            next_tok(p);
            if (stops)
                for (int i = 0; stops[i]; i++)
                    if (is_name(cur(p), stops[i])) {
                        *which = stops[i];
                        next_tok(p);
                        goto done;
                    }
            tok *tag = cur(p);
            if (tag->type == T_NAME && (!strncmp(tag->p, "end", 3) || is_name(tag, "elif") || is_name(tag, "else")))
                pfail(p, tag->line, "unexpected '%s'%s%s%s", tag->p, stops ? ", expected '" : "", stops ? stops[0] : "", stops ? "'" : "");
            nv_push(p, &st, parse_statement(p));
            expect_type(p, T_BEND, "'%}'");
        } else {
            pfail(p, t->line, "unexpected %s", tok_desc(t));
        }
    }
done:
    body->kids = st.v;
    body->nkids = st.n;
    return body;
}

jinja_template *jinja_parse(const char *src, size_t len, herr *e) {
    if (!utf8_valid(src, len)) {
        herr_set(e, "the template is not valid UTF-8");
        return NULL;
    }
    jinja_template *t = xcalloc(1, sizeof *t);
    parser *p = xcalloc(1, sizeof *p);
    p->ar = &t->ar;
    p->e = e;
    t->ar.cap = (size_t)64 << 20;
    t->ar.fail = &p->jb;
    t->ar.msg = e;
    if (setjmp(p->jb)) {
        jarena_free(&t->ar);
        free(t);
        free(p);
        return NULL;
    }
    /* newlines normalized to \n; one final newline dropped (keep_trailing_newline=False) */
    char *s = jarena_alloc(&t->ar, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    lex(p, s, n);
    t->body = parse_body(p, NULL, NULL);
    t->ar.fail = NULL;
    free(p);
    return t;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    jarena_free(&t->ar);
    free(t);
}
