/* jinja_eval.c: runs the syntax nodes of jinja_parse.c: scopes as python jinja2 keeps them
 * (a for loop's body starts each iteration afresh from the enclosing scope, so a `set`
 * inside it is gone at the next iteration and after the loop; if blocks share their
 * scope; a macro sees the scope it was defined in, at call time), Python's operators, the
 * sandbox's attribute and item lookup, and the render entry point. Every evaluation counts a
 * step, so that a hostile template stops at the step limit. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

HEARTH_NORETURN void jfail(jctx *c, int line, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!line) line = c->line;
    if (line) herr_set(c->e, "template line %d: %s", line, msg);
    else herr_set(c->e, "%s", msg);
    longjmp(c->jb, 1);
}

static void step(jctx *c, int line) {
    c->line = line;
    if (++c->steps > c->max_steps) jfail(c, line, "the template ran for more than %llu steps (limit)", (unsigned long long)c->max_steps);
}

/* ---- scopes ---- */
static jscope *scope_new(jctx *c, jscope *parent) {
    jscope *s = jalloc(c, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(jctx *c, jscope *s, const char *name, jv v) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) { s->vals[i] = v; return; }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        const char **nn = jalloc(c, (size_t)cap * sizeof *nn);
        jv *nv = jalloc(c, (size_t)cap * sizeof *nv);
        if (s->n) {
            memcpy(nn, s->names, (size_t)s->n * sizeof *nn);
            memcpy(nv, s->vals, (size_t)s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static bool scope_get(const jscope *s, const char *name, jv *out) {
    for (; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (!strcmp(s->names[i], name)) { *out = s->vals[i]; return true; }
    return false;
}

/* ---- lookups ---- */
static jv loop_attr(jctx *c, const jloop *lp, const char *name) {
    size_t n = lp->items->n, i = lp->i;
    if (!strcmp(name, "index")) return jv_int((int64_t)i + 1);
    if (!strcmp(name, "index0")) return jv_int((int64_t)i);
    if (!strcmp(name, "revindex")) return jv_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return jv_int((int64_t)(n - i - 1));
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i + 1 == n);
    if (!strcmp(name, "length")) return jv_int((int64_t)n);
    if (!strcmp(name, "depth")) return jv_int(lp->depth);
    if (!strcmp(name, "depth0")) return jv_int(lp->depth - 1);
    if (!strcmp(name, "previtem")) return i > 0 ? lp->items->v[i - 1] : jv_undef("previtem");
    if (!strcmp(name, "nextitem")) return i + 1 < n ? lp->items->v[i + 1] : jv_undef("nextitem");
    if (!strcmp(name, "changed")) jfail(c, 0, "loop.changed is not supported");
    return jv_undef(name);
}

static const char *undef_name(jv v) { return v.s.p ? v.s.p : "value"; }

jv jgetattr(jctx *c, jv obj, const char *name, size_t n, int line) {
    jv out;
    switch (obj.t) {
    case JV_UNDEF: jfail(c, line, "'%s' is undefined (reading its attribute '%.*s')", undef_name(obj), (int)n, name);
    case JV_DICT:
        out = jb_method(c, obj, name, n);
        if (out.t != JV_UNDEF) return out;
        if (jdict_gets(obj.d, name, n, &out)) return out;
        break;
    case JV_NS:
        if (jdict_gets(obj.d, name, n, &out)) return out;
        break;
    case JV_LOOP: {
        char tmp[32];
        if (n >= sizeof tmp) break;
        memcpy(tmp, name, n);
        tmp[n] = 0;
        if (!strcmp(tmp, "cycle")) return jb_method(c, obj, name, n);
        out = loop_attr(c, obj.lp, tmp);
        if (out.t != JV_UNDEF) return out;
        break;
    }
    default:
        out = jb_method(c, obj, name, n);
        if (out.t != JV_UNDEF) return out;
    }
    return jv_undef(jv_str(c, name, n).s.p);
}

jv jgetitem(jctx *c, jv obj, jv key, int line) {
    jv out;
    if (obj.t == JV_UNDEF) jfail(c, line, "'%s' is undefined (reading an item of it)", undef_name(obj));
    if (obj.t == JV_DICT && jdict_get(obj.d, key, &out)) return out;
    if ((obj.t == JV_LIST && obj.sub != JL_GEN) || obj.t == JV_STR) {
        if (key.t == JV_INT || key.t == JV_BOOL) {
            int64_t i = key.t == JV_BOOL ? key.b : key.i;
            size_t len = obj.t == JV_STR ? u8_len(obj.s.p, obj.s.n) : obj.l->n;
            if (i < 0) i += (int64_t)len;
            if (i >= 0 && (uint64_t)i < len) {
                if (obj.t != JV_STR) return obj.l->v[i];
                size_t a = u8_offset(obj.s.p, obj.s.n, (size_t)i), b = a;
                u8_next(obj.s.p, obj.s.n, &b);
                return jv_strref(obj.s.p + a, b - a);
            }
            return jv_undef("item");
        }
    }
    if (key.t == JV_STR) return jgetattr(c, obj, key.s.p, key.s.n, line);
    return jv_undef("item");
}

/* Python's slice index adjustment */
static void slice_range(jctx *c, size_t len, jv start, jv stop, jv stepv, int line, int64_t *s0, int64_t *s1, int64_t *st) {
    int64_t n = (int64_t)len, step_ = 1;
    jv *parts[3] = {&start, &stop, &stepv};
    for (int k = 0; k < 3; k++)
        if (parts[k]->t != JV_NONE && parts[k]->t != JV_INT && parts[k]->t != JV_BOOL)
            jfail(c, line, "slice indices must be integers or None, not %s", jv_typename(*parts[k]));
    if (stepv.t != JV_NONE) step_ = stepv.t == JV_BOOL ? stepv.b : stepv.i;
    if (step_ == 0) jfail(c, line, "slice step cannot be zero");
    int64_t a, b;
    if (step_ > 0) {
        a = start.t == JV_NONE ? 0 : start.t == JV_BOOL ? start.b : start.i;
        b = stop.t == JV_NONE ? n : stop.t == JV_BOOL ? stop.b : stop.i;
        if (a < 0) { a += n; if (a < 0) a = 0; } else if (a > n) a = n;
        if (b < 0) { b += n; if (b < 0) b = 0; } else if (b > n) b = n;
    } else {
        a = start.t == JV_NONE ? n - 1 : start.t == JV_BOOL ? start.b : start.i;
        b = stop.t == JV_NONE ? -1 : stop.t == JV_BOOL ? stop.b : stop.i;
        if (start.t != JV_NONE) { if (a < 0) { a += n; if (a < 0) a = -1; } else if (a >= n) a = n - 1; }
        if (stop.t != JV_NONE) { if (b < 0) { b += n; if (b < 0) b = -1; } else if (b >= n) b = n - 1; }
    }
    *s0 = a;
    *s1 = b;
    *st = step_;
}

static jv jslice(jctx *c, jv obj, jv start, jv stop, jv stepv, int line) {
    if (obj.t == JV_UNDEF) jfail(c, line, "'%s' is undefined (slicing it)", undef_name(obj));
    int64_t a, b, s;
    if (obj.t == JV_STR) {
        bool ascii = true;
        for (size_t i = 0; i < obj.s.n && ascii; i++) ascii = (unsigned char)obj.s.p[i] < 0x80;
        size_t len = ascii ? obj.s.n : u8_len(obj.s.p, obj.s.n);
        slice_range(c, len, start, stop, stepv, line, &a, &b, &s);
        jbuf out = {0};
        if (ascii && s == 1) return a < b ? jv_strref(obj.s.p + a, (size_t)(b - a)) : jv_strref("", 0);
        size_t *off = NULL;
        if (!ascii) { /* byte offsets of each code point, and the end */
            off = jalloc(c, (len + 1) * sizeof *off);
            size_t i = 0, k = 0;
            while (i < obj.s.n) { off[k++] = i; u8_next(obj.s.p, obj.s.n, &i); }
            off[k] = obj.s.n;
        }
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s) {
            size_t x = ascii ? (size_t)i : off[i], y = ascii ? (size_t)i + 1 : off[i + 1];
            jbuf_put(c, &out, obj.s.p + x, y - x);
        }
        return out.p ? jbuf_str(&out) : jv_strref("", 0);
    }
    if (obj.t == JV_LIST && obj.sub != JL_GEN) {
        slice_range(c, obj.l->n, start, stop, stepv, line, &a, &b, &s);
        jv out = jv_list(c, 0, obj.sub);
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s) jv_push(c, out, obj.l->v[i]);
        return out;
    }
    if (obj.t == JV_DICT || obj.t == JV_NONE || jv_is_num(obj)) return jv_undef("slice");
    jfail(c, line, "'%s' object is not subscriptable", jv_typename(obj));
}

void jiter(jctx *c, jv v, int line, jlist *out) {
    switch (v.t) {
    case JV_UNDEF: *out = (jlist){0}; return;
    case JV_LIST:
        *out = *v.l;
        if (v.sub == JL_GEN) { /* Python's generators run once */
            if (v.l->used) out->n = 0;
            v.l->used = true;
        }
        return;
    case JV_DICT: *out = (jlist){.n = v.d->n, .cap = v.d->n, .v = v.d->k}; return;
    case JV_STR: {
        jv l = jv_list(c, v.s.n, JL_LIST);
        for (size_t i = 0; i < v.s.n;) {
            size_t a = i;
            u8_next(v.s.p, v.s.n, &i);
            jv_push(c, l, jv_strref(v.s.p + a, i - a));
        }
        *out = *l.l;
        return;
    }
    default: jfail(c, line, "'%s' object is not iterable", jv_typename(v));
    }
}

/* ---- calls ---- */
static jv call_macro(jctx *c, const jmacro *m, const jargs *a, int line) {
    const jnode *def = m->def;
    if (c->depth >= c->max_depth) jfail(c, line, "macros nested deeper than %d calls (limit)", c->max_depth);
    if (a->n > def->nkw)
        jfail(c, line, "macro '%s' takes not more than %d argument(s)", def->name, def->nkw);
    for (int k = 0; k < a->nkw; k++) {
        bool found = false;
        for (int i = 0; i < def->nkw && !found; i++) found = !strcmp(def->kwn[i], a->kwn[k]);
        if (!found) jfail(c, line, "macro '%s' takes no keyword argument '%s'", def->name, a->kwn[k]);
    }
    jscope *saved_scope = c->scope;
    jbuf *saved_out = c->out;
    jscope *s = scope_new(c, m->closure);
    c->scope = s;
    for (int i = 0; i < def->nkw; i++) {
        jv v = jv_undef(def->kwn[i]);
        bool have = false;
        if (i < a->n) { v = a->v[i]; have = true; }
        for (int k = 0; k < a->nkw; k++)
            if (!strcmp(def->kwn[i], a->kwn[k])) {
                if (have) jfail(c, line, "macro '%s' got multiple values for argument '%s'", def->name, def->kwn[i]);
                v = a->kwv[k];
                have = true;
            }
        if (!have && def->kwv[i]) v = jeval(c, def->kwv[i]);
        scope_set(c, s, def->kwn[i], v);
    }
    jbuf out = {0};
    c->out = &out;
    c->depth++;
    jexec(c, def->b);
    c->depth--;
    c->out = saved_out;
    c->scope = saved_scope;
    return jbuf_str(&out);
}

jv jcall(jctx *c, jv callee, const jargs *a, int line) {
    switch (callee.t) {
    case JV_FUNC: return callee.fn->fn(c, callee.fn->self, a);
    case JV_MACRO: return call_macro(c, callee.m, a, line);
    case JV_UNDEF: jfail(c, line, "'%s' is undefined (calling it)", undef_name(callee));
    default: jfail(c, line, "'%s' object is not callable", jv_typename(callee));
    }
}

static void eval_args(jctx *c, const jnode *n, jargs *a) {
    a->line = n->line;
    a->n = n->nkids;
    a->nkw = n->nkw;
    a->v = n->nkids ? jalloc(c, (size_t)n->nkids * sizeof(jv)) : NULL;
    for (int i = 0; i < n->nkids; i++) a->v[i] = jeval(c, n->kids[i]);
    a->kwn = n->kwn;
    a->kwv = n->nkw ? jalloc(c, (size_t)n->nkw * sizeof(jv)) : NULL;
    for (int i = 0; i < n->nkw; i++) a->kwv[i] = jeval(c, n->kwv[i]);
}

/* ---- operators ---- */
static bool str_contains(jv hay, jv needle) {
    if (!needle.s.n) return true;
    return memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
}

static bool jin(jctx *c, jv item, jv cont, int line) {
    switch (cont.t) {
    case JV_STR:
        if (item.t != JV_STR) jfail(c, line, "'in <string>' requires string as left operand, not %s", jv_typename(item));
        return str_contains(cont, item);
    case JV_LIST:
        for (size_t i = 0; i < cont.l->n; i++)
            if (jv_eq(cont.l->v[i], item)) return true;
        return false;
    case JV_DICT: {
        jv tmp;
        return jdict_get(cont.d, item, &tmp);
    }
    case JV_UNDEF: return false;
    default: jfail(c, line, "argument of type '%s' is not iterable", jv_typename(cont));
    }
}

/* markupsafe's escape(), for str + Markup */
static jv html_escape(jctx *c, jv s) {
    jbuf b = {0};
    for (size_t i = 0; i < s.s.n; i++) {
        char ch = s.s.p[i];
        switch (ch) {
        case '&': jbuf_puts(c, &b, "&amp;"); break;
        case '<': jbuf_puts(c, &b, "&lt;"); break;
        case '>': jbuf_puts(c, &b, "&gt;"); break;
        case '"': jbuf_puts(c, &b, "&#34;"); break;
        case '\'': jbuf_puts(c, &b, "&#39;"); break;
        default: jbuf_putc(c, &b, ch);
        }
    }
    return jbuf_str(&b);
}

HEARTH_NORETURN static void bad_operands(jctx *c, const char *op, jv a, jv b, int line) {
    if (a.t == JV_UNDEF || b.t == JV_UNDEF)
        jfail(c, line, "'%s' is undefined (operand of %s)", undef_name(a.t == JV_UNDEF ? a : b), op);
    jfail(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_typename(a), jv_typename(b));
}

static int64_t inum(jv v) { return v.t == JV_BOOL ? v.b : v.i; }

static jv repeat(jctx *c, jv seq, int64_t k, int line) {
    if (k < 0) k = 0;
    size_t unit = seq.t == JV_STR ? seq.s.n : seq.l->n * sizeof(jv);
    if (unit && (uint64_t)k > c->max_output / unit) jfail(c, line, "repetition too large");
    if (seq.t == JV_STR) {
        jbuf b = {0};
        for (int64_t i = 0; i < k; i++) jbuf_put(c, &b, seq.s.p, seq.s.n);
        return b.p ? jbuf_str(&b) : jv_strref("", 0);
    }
    jv out = jv_list(c, 0, seq.sub);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.l->n; j++) jv_push(c, out, seq.l->v[j]);
    return out;
}

static jv binop(jctx *c, int op, jv a, jv b, int line) {
    static const char *names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    bool nums = jv_is_num(a) && jv_is_num(b), ints = nums && a.t != JV_FLOAT && b.t != JV_FLOAT;
    int64_t r;
    switch (op) {
    case OP_CONCAT: {
        jbuf out = {0};
        jv_put_str(c, &out, a, line);
        jv_put_str(c, &out, b, line);
        return out.p ? jbuf_str(&out) : jv_strref("", 0);
    }
    case OP_ADD:
        if (ints) {
            if (__builtin_add_overflow(inum(a), inum(b), &r)) jfail(c, line, "integer overflow");
            return jv_int(r);
        }
        if (nums) return jv_float(jv_num(a) + jv_num(b));
        if (a.t == JV_STR && b.t == JV_STR) {
            bool markup = (a.sub | b.sub) & JS_MARKUP;
            if (markup && !(a.sub & JS_MARKUP)) a = html_escape(c, a);
            if (markup && !(b.sub & JS_MARKUP)) b = html_escape(c, b);
            char *p = jalloc(c, a.s.n + b.s.n + 1);
            memcpy(p, a.s.p, a.s.n);
            memcpy(p + a.s.n, b.s.p, b.s.n);
            jv out = jv_strref(p, a.s.n + b.s.n);
            out.sub = markup ? JS_MARKUP : 0;
            return out;
        }
        if (a.t == JV_LIST && b.t == JV_LIST && a.sub == b.sub && (a.sub == JL_LIST || a.sub == JL_TUPLE)) {
            jv out = jv_list(c, a.l->n + b.l->n, a.sub);
            for (size_t i = 0; i < a.l->n; i++) jv_push(c, out, a.l->v[i]);
            for (size_t i = 0; i < b.l->n; i++) jv_push(c, out, b.l->v[i]);
            return out;
        }
        break;
    case OP_SUB:
        if (ints) {
            if (__builtin_sub_overflow(inum(a), inum(b), &r)) jfail(c, line, "integer overflow");
            return jv_int(r);
        }
        if (nums) return jv_float(jv_num(a) - jv_num(b));
        break;
    case OP_MUL:
        if (ints) {
            if (__builtin_mul_overflow(inum(a), inum(b), &r)) jfail(c, line, "integer overflow");
            return jv_int(r);
        }
        if (nums) return jv_float(jv_num(a) * jv_num(b));
        if ((a.t == JV_STR || (a.t == JV_LIST && a.sub <= JL_TUPLE)) && (b.t == JV_INT || b.t == JV_BOOL)) return repeat(c, a, inum(b), line);
        if ((b.t == JV_STR || (b.t == JV_LIST && b.sub <= JL_TUPLE)) && (a.t == JV_INT || a.t == JV_BOOL)) return repeat(c, b, inum(a), line);
        break;
    case OP_DIV:
        if (nums) {
            if (jv_num(b) == 0) jfail(c, line, "division by zero");
            return jv_float(jv_num(a) / jv_num(b));
        }
        break;
    case OP_FLOORDIV:
    case OP_MOD:
        if (nums) {
            if (jv_num(b) == 0) jfail(c, line, "%s by zero", op == OP_MOD ? "modulo" : "integer division");
            if (ints) {
                int64_t x = inum(a), y = inum(b);
                if (x == INT64_MIN && y == -1) jfail(c, line, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
                return jv_int(op == OP_MOD ? m : q);
            }
            /* CPython's float_divmod */
            double x = jv_num(a), y = jv_num(b), m = fmod(x, y), div = (x - m) / y;
            if (m != 0) {
                if ((y < 0) != (m < 0)) { m += y; div -= 1.0; }
            } else m = copysign(0.0, y);
            if (op == OP_MOD) return jv_float(m);
            double fd;
            if (div != 0) { fd = floor(div); if (div - fd > 0.5) fd += 1.0; }
            else fd = copysign(0.0, x / y);
            return jv_float(fd);
        }
        if (op == OP_MOD && a.t == JV_STR) jfail(c, line, "string formatting with %% is not supported");
        break;
    case OP_POW:
        if (ints && inum(b) >= 0) {
            int64_t base = inum(a), e = inum(b), acc = 1;
            for (int64_t i = 0; i < e; i++) {
                if (__builtin_mul_overflow(acc, base, &acc)) jfail(c, line, "integer overflow");
                if (acc == 0 || acc == 1) break;
            }
            return jv_int(acc);
        }
        if (nums) {
            if (jv_num(a) == 0 && jv_num(b) < 0) jfail(c, line, "0.0 cannot be raised to a negative power");
            return jv_float(pow(jv_num(a), jv_num(b)));
        }
        break;
    }
    bad_operands(c, names[op], a, b, line);
}

static bool compare(jctx *c, int op, jv a, jv b, int line) {
    switch (op) {
    case OP_EQ: return jv_eq(a, b);
    case OP_NE: return !jv_eq(a, b);
    case OP_LT: return jv_cmp(c, a, b, line) < 0;
    case OP_LE: return jv_cmp(c, a, b, line) <= 0;
    case OP_GT: return jv_cmp(c, a, b, line) > 0;
    case OP_GE: return jv_cmp(c, a, b, line) >= 0;
    case OP_IN: return jin(c, a, b, line);
    default: return !jin(c, a, b, line);
    }
}

static jv num_unary(jctx *c, const jnode *n, jv v) {
    if (v.t == JV_FLOAT) return jv_float(n->kind == N_NEG ? -v.f : v.f);
    if (v.t == JV_INT || v.t == JV_BOOL) {
        int64_t i = inum(v);
        if (n->kind == N_NEG && i == INT64_MIN) jfail(c, n->line, "integer overflow");
        return jv_int(n->kind == N_NEG ? -i : i);
    }
    if (v.t == JV_UNDEF) jfail(c, n->line, "'%s' is undefined (operand of unary %c)", undef_name(v), n->kind == N_NEG ? '-' : '+');
    jfail(c, n->line, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+', jv_typename(v));
}

jv jeval(jctx *c, const jnode *n) {
    step(c, n->line);
    jv v;
    switch (n->kind) {
    case N_LIT: return n->lit;
    case N_NAME:
        if (scope_get(c->scope, n->name, &v)) return v;
        return jb_global(c, n->name);
    case N_LIST:
    case N_TUPLE:
        v = jv_list(c, (size_t)n->nkids, n->kind == N_TUPLE ? JL_TUPLE : JL_LIST);
        for (int i = 0; i < n->nkids; i++) jv_push(c, v, jeval(c, n->kids[i]));
        return v;
    case N_DICT:
        v = jv_dict(c, (size_t)n->nkids / 2);
        for (int i = 0; i + 1 < n->nkids; i += 2) {
            jv k = jeval(c, n->kids[i]);
            if (k.t == JV_LIST && k.sub != JL_TUPLE) jfail(c, n->line, "unhashable type: 'list'");
            if (k.t == JV_DICT || k.t == JV_UNDEF) jfail(c, n->line, "unhashable type: '%s'", jv_typename(k));
            jdict_set(c, v.d, k, jeval(c, n->kids[i + 1]));
        }
        return v;
    case N_ATTR: {
        jv obj = jeval(c, n->a);
        return jgetattr(c, obj, n->name, strlen(n->name), n->line);
    }
    case N_ITEM: {
        jv obj = jeval(c, n->a);
        return jgetitem(c, obj, jeval(c, n->b), n->line);
    }
    case N_SLICE: {
        jv obj = jeval(c, n->a);
        jv a = n->b ? jeval(c, n->b) : jv_none(), b = n->c ? jeval(c, n->c) : jv_none(), s = n->d ? jeval(c, n->d) : jv_none();
        return jslice(c, obj, a, b, s, n->line);
    }
    case N_CALL: {
        jv callee = jeval(c, n->a);
        jargs a;
        eval_args(c, n, &a);
        return jcall(c, callee, &a, n->line);
    }
    case N_FILTER: {
        jv x = n->a->kind == N_HOLE ? c->hole : jeval(c, n->a);
        jargs a;
        eval_args(c, n, &a);
        c->line = n->line;
        return jb_filter(c, n->name, x, &a);
    }
    case N_TEST: {
        jv x = jeval(c, n->a);
        jargs a;
        eval_args(c, n, &a);
        c->line = n->line;
        return jv_bool(jb_test(c, n->name, x, &a) != n->negate);
    }
    case N_NEG:
    case N_POS: return num_unary(c, n, jeval(c, n->a));
    case N_NOT: return jv_bool(!jv_truthy(jeval(c, n->a)));
    case N_AND:
        v = jeval(c, n->a);
        return jv_truthy(v) ? jeval(c, n->b) : v;
    case N_OR:
        v = jeval(c, n->a);
        return jv_truthy(v) ? v : jeval(c, n->b);
    case N_BIN: {
        jv a = jeval(c, n->a);
        jv b = jeval(c, n->b);
        return binop(c, n->op, a, b, n->line);
    }
    case N_CMP: {
        jv l = jeval(c, n->a);
        for (int i = 0; i < n->nkids; i++) {
            jv r = jeval(c, n->kids[i]);
            if (!compare(c, n->ops[i], l, r, n->line)) return jv_bool(false);
            l = r;
        }
        return jv_bool(true);
    }
    case N_COND:
        if (jv_truthy(jeval(c, n->a))) return jeval(c, n->b);
        return n->c ? jeval(c, n->c) : jv_undef("conditional expression");
    case N_HOLE: return c->hole;
    default: HEARTH_DIE("jeval: node kind %d is not an expression", n->kind);
    }
}

/* ---- statements ---- */
static void assign(jctx *c, jscope *s, const jnode *n, jv v) {
    if (n->nnames == 1) {
        scope_set(c, s, n->names[0], v);
        return;
    }
    jlist items;
    if (v.t == JV_UNDEF) jfail(c, n->line, "cannot unpack an undefined value");
    jiter(c, v, n->line, &items);
    if ((int)items.n != n->nnames)
        jfail(c, n->line, "cannot unpack %zu values into %d names", items.n, n->nnames);
    for (int i = 0; i < n->nnames; i++) scope_set(c, s, n->names[i], items.v[i]);
}

static jv capture(jctx *c, const jnode *body) {
    jbuf *saved = c->out;
    jbuf out = {0};
    c->out = &out;
    jexec(c, body);
    c->out = saved;
    return jbuf_str(&out);
}

static void exec_for(jctx *c, const jnode *n) {
    jv it = jeval(c, n->a);
    jlist all;
    jiter(c, it, n->line, &all);
    jscope *outer = c->scope;
    jlist items = all;
    if (n->d) { /* the loop filter: items it rejects are not counted by loop.* */
        jv kept = jv_list(c, all.n, JL_LIST);
        for (size_t i = 0; i < all.n; i++) {
            c->scope = scope_new(c, outer);
            assign(c, c->scope, n, all.v[i]);
            if (jv_truthy(jeval(c, n->d))) jv_push(c, kept, all.v[i]);
        }
        c->scope = outer;
        items = *kept.l;
    }
    jloop *lp = jalloc(c, sizeof *lp);
    jlist *held = jalloc(c, sizeof *held); /* loop may outlive this frame (ns.x = loop) */
    *held = items;
    lp->items = held;
    lp->depth = 1;
    jv loopv = {.t = JV_LOOP};
    loopv.lp = lp;
    for (size_t i = 0; i < items.n; i++) {
        lp->i = i;
        c->scope = scope_new(c, outer);
        assign(c, c->scope, n, items.v[i]);
        scope_set(c, c->scope, "loop", loopv);
        jexec(c, n->b);
        c->scope = outer;
        if (c->brk == 1) { c->brk = 0; break; }
        c->brk = 0;
    }
    if (!items.n && n->c) {
        c->scope = scope_new(c, outer);
        jexec(c, n->c);
        c->scope = outer;
    }
}

void jexec(jctx *c, const jnode *n) {
    step(c, n->line);
    switch (n->kind) {
    case N_BODY:
        for (int i = 0; i < n->nkids && !c->brk; i++) jexec(c, n->kids[i]);
        return;
    case N_DATA: jbuf_put(c, c->out, n->lit.s.p, n->lit.s.n); return;
    case N_OUT: {
        jv v = jeval(c, n->a);
        jv_put_str(c, c->out, v, n->line);
        return;
    }
    case N_IF:
        for (const jnode *x = n; x;) {
            if (x->kind != N_IF) { jexec(c, x); return; }
            if (jv_truthy(jeval(c, x->a))) { jexec(c, x->b); return; }
            x = x->c;
        }
        return;
    case N_FOR: exec_for(c, n); return;
    case N_SET: assign(c, c->scope, n, jeval(c, n->b)); return;
    case N_SETATTR: {
        jv ns;
        if (!scope_get(c->scope, n->names[0], &ns) || ns.t != JV_NS)
            jfail(c, n->line, "cannot assign attribute on non-namespace object '%s'", n->names[0]);
        jv v = jeval(c, n->b);
        jdict_set(c, ns.d, jv_strref(n->name, strlen(n->name)), v);
        return;
    }
    case N_SETBLOCK: {
        jv v = capture(c, n->b);
        if (n->a) {
            c->hole = v;
            v = jeval(c, n->a);
        }
        scope_set(c, c->scope, n->names[0], v);
        return;
    }
    case N_MACRO: {
        jv m = {.t = JV_MACRO};
        m.m = jalloc(c, sizeof *m.m);
        m.m->def = n;
        m.m->closure = c->scope;
        scope_set(c, c->scope, n->name, m);
        return;
    }
    case N_FILTERBLOCK: {
        c->hole = capture(c, n->b);
        jv_put_str(c, c->out, jeval(c, n->a), n->line);
        return;
    }
    case N_BREAK: c->brk = 1; return;
    case N_CONTINUE: c->brk = 2; return;
    default: HEARTH_DIE("jexec: node kind %d is not a statement", n->kind);
    }
}

int jinja_render(const jinja_template *t, const cJSON *vars, int64_t now, const jinja_limits *lim,
                 char **out, size_t *out_len, herr *e) {
    jinja_limits L = lim ? *lim : (jinja_limits){0};
    jarena ar = {0};
    jctx *c = xcalloc(1, sizeof *c);
    ar.cap = L.max_memory ? L.max_memory : (size_t)512 << 20;
    ar.fail = &c->jb;
    ar.msg = e;
    c->ar = &ar;
    c->e = e;
    c->now = now;
    c->max_output = L.max_output ? L.max_output : (size_t)64 << 20;
    c->max_depth = L.max_depth ? L.max_depth : 64;
    c->max_steps = L.max_steps ? L.max_steps : 20000000;
    if (setjmp(c->jb)) {
        jarena_free(&ar);
        free(c);
        return -1;
    }
    c->root = c->scope = scope_new(c, NULL);
    if (vars && !cJSON_IsObject(vars)) jfail(c, 0, "template variables must be a JSON object");
    for (const cJSON *x = vars ? vars->child : NULL; x; x = x->next) scope_set(c, c->root, x->string, jv_from_cjson(c, x, 0));
    jbuf ob = {0};
    c->out = &ob;
    jexec(c, t->body);
    *out = xmalloc(ob.n + 1);
    if (ob.n) memcpy(*out, ob.p, ob.n);
    (*out)[ob.n] = 0;
    *out_len = ob.n;
    jarena_free(&ar);
    free(c);
    return 0;
}
