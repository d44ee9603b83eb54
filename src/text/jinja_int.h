/* jinja_int.h: the insides shared by the Jinja subset's files: jinja_parse.c (lexer and
 * parser to syntax nodes), jinja_value.c (the arena, values, Python's str/repr/json.dumps),
 * jinja_eval.c (scopes, expressions, statements, macros) and jinja_builtin.c (filters,
 * tests, methods, globals). Errors unwind with longjmp: everything a render allocates lives
 * in one arena that is dropped whole, so there is nothing else to free on the way out. */
#ifndef HEARTH_JINJA_INT_H
#define HEARTH_JINJA_INT_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "text/jinja.h"

/* ---- arena: bump allocation in chunks, with a cap ---- */
typedef struct jchunk jchunk;
typedef struct jarena {
    jchunk *chunks;
    char *cur;
    size_t left, total, cap;
    jmp_buf *fail;  /* longjmp(*fail, 1) when cap would be exceeded, after setting *msg */
    herr *msg;
} jarena;
void *jarena_alloc(jarena *a, size_t n); /* 16-byte aligned, zeroed */
void jarena_free(jarena *a);

/* ---- values ---- */
enum jtype { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_MACRO, JV_FUNC, JV_LOOP };
/* sub of a JV_LIST: a tuple prints with (); a generator (what jinja2's map, select, items
 * filters give) iterates like a list, is always true and has no length; a sized view
 * (range(), dict.items()) has a length; neither can be printed. */
enum { JL_LIST, JL_TUPLE, JL_GEN, JL_SIZED };
#define JS_MARKUP 1 /* sub of a JV_STR: a markupsafe.Markup (from |safe); + escapes the other side */

typedef struct jv {
    uint8_t t, sub;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s; /* JV_STR; JV_UNDEF: the missing name (p may be NULL) */
        struct jlist *l;
        struct jdict *d;                       /* JV_DICT, JV_NS */
        struct jmacro *m;
        struct jfunc *fn;
        struct jloop *lp;
    };
} jv;

typedef struct jlist { size_t n, cap; jv *v; bool used; /* a generator, once iterated, is empty */ } jlist;
typedef struct jdict { size_t n, cap; jv *k, *v; } jdict; /* insertion order, linear lookup */

struct jctx;
typedef struct jargs {
    int n, nkw;
    jv *v;             /* positional */
    const char **kwn;  /* keyword names */
    jv *kwv;
    int line;
} jargs;
typedef jv (*jfn)(struct jctx *c, jv self, const jargs *a);
typedef struct jfunc { jfn fn; jv self; const char *name; } jfunc;
typedef struct jmacro { const struct jnode *def; struct jscope *closure; } jmacro;
typedef struct jloop { const jlist *items; size_t i; int depth; } jloop;

/* ---- syntax nodes ---- */
enum jnode_kind {
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_BIN, N_CMP, N_COND, N_HOLE,
    N_DATA, N_OUT, N_IF, N_FOR, N_SET, N_SETATTR, N_SETBLOCK, N_MACRO, N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_BODY,
};
/* binary and comparison operators */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct jnode {
    int kind, line, op;
    bool negate;             /* N_TEST: `is not` */
    jv lit;                  /* N_LIT; N_DATA: its text */
    const char *name;        /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_MACRO, N_SETBLOCK, N_SETATTR attr */
    struct jnode *a, *b, *c, *d;
    struct jnode **kids;     /* items, positional args, statements, comparison operands */
    int nkids;
    int *ops;                /* N_CMP: one operator per kid */
    const char **kwn;        /* keyword args; N_MACRO: parameter names */
    struct jnode **kwv;      /* their values; N_MACRO: defaults (NULL where none) */
    int nkw;
    const char **names;      /* N_FOR, N_SET: target names */
    int nnames;
} jnode;

struct jinja_template {
    jarena ar;
    jnode *body;
};

/* ---- render context ---- */
typedef struct jscope {
    struct jscope *parent;
    int n, cap;
    const char **names;
    jv *vals;
} jscope;

typedef struct jbuf { char *p; size_t n, cap; } jbuf;

typedef struct jctx {
    jarena *ar;
    jscope *root, *scope; /* the template's globals; the innermost scope now */
    int line;             /* of the node being evaluated, for messages */
    jbuf *out;
    int depth, max_depth;
    uint64_t steps, max_steps;
    size_t max_output;
    int brk;          /* 1 after {% break %}, 2 after {% continue %}, until the loop sees it */
    jv hole;          /* the body's text in a filter block */
    int64_t now;
    jmp_buf jb;
    herr *e;
} jctx;

HEARTH_NORETURN void jfail(jctx *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void *jalloc(jctx *c, size_t n) { return jarena_alloc(c->ar, n); }

/* constructors */
static inline jv jv_undef(const char *name) { jv v = {.t = JV_UNDEF}; v.s.p = name; v.s.n = 0; return v; }
static inline jv jv_none(void) { return (jv){.t = JV_NONE}; }
static inline jv jv_bool(bool b) { jv v = {.t = JV_BOOL}; v.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {.t = JV_INT}; v.i = i; return v; }
static inline jv jv_float(double f) { jv v = {.t = JV_FLOAT}; v.f = f; return v; }
jv jv_str(jctx *c, const char *p, size_t n); /* copies */
static inline jv jv_strref(const char *p, size_t n) { jv v = {.t = JV_STR}; v.s.p = p; v.s.n = n; return v; }
jv jv_list(jctx *c, size_t cap, int sub);
void jv_push(jctx *c, jv list, jv item);
jv jv_dict(jctx *c, size_t cap);
void jdict_set(jctx *c, jdict *d, jv k, jv v);
bool jdict_get(const jdict *d, jv k, jv *out);
bool jdict_gets(const jdict *d, const char *k, size_t n, jv *out);
jv jv_func(jctx *c, jfn fn, jv self, const char *name);
jv jv_from_cjson(jctx *c, const cJSON *j, int depth);

/* buffers (in the arena) */
void jbuf_put(jctx *c, jbuf *b, const char *p, size_t n);
static inline void jbuf_puts(jctx *c, jbuf *b, const char *s) { jbuf_put(c, b, s, strlen(s)); }
void jbuf_putc(jctx *c, jbuf *b, char ch);
void jbuf_printf(jctx *c, jbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline jv jbuf_str(jbuf *b) { return jv_strref(b->p ? b->p : "", b->n); }

/* Python semantics */
const char *jv_typename(jv v); /* Python's type name, for messages */
bool jv_truthy(jv v);
bool jv_eq(jv a, jv b);
int jv_cmp(jctx *c, jv a, jv b, int line); /* <0, 0, >0; an error where Python raises */
bool jv_is_num(jv v);                       /* bool, int or float */
double jv_num(jv v);
void jv_put_str(jctx *c, jbuf *b, jv v, int line);  /* str(v) */
void jv_put_repr(jctx *c, jbuf *b, jv v, int line); /* repr(v) */
jv jv_to_str(jctx *c, jv v, int line);
void jv_put_float(jbuf *b, jctx *c, double f);      /* float.__repr__ */
typedef struct jjson_opts {
    bool ensure_ascii, sort_keys;
    int indent;         /* -1: none */
    const char *indent_str;
    const char *item_sep, *key_sep;
} jjson_opts;
void jv_put_json(jctx *c, jbuf *b, jv v, const jjson_opts *o, int level, int line);

/* A stable merge sort of n records of `width` values each, ordered by cmp (which may fail). */
typedef int (*jcmp_fn)(jctx *c, const jv *x, const jv *y, void *arg);
void jsort(jctx *c, jv *rec, size_t n, size_t width, jcmp_fn cmp, void *arg);

/* UTF-8 (all strings here are valid UTF-8: inputs are checked on the way in) */
bool utf8_valid(const char *p, size_t n);
uint32_t u8_next(const char *p, size_t n, size_t *i);
size_t u8_len(const char *p, size_t n);              /* code points */
size_t u8_offset(const char *p, size_t n, size_t k); /* byte offset of code point k (n if past) */
bool py_isspace(uint32_t cp);                        /* str.isspace() */

/* jinja_eval.c */
jv jeval(jctx *c, const jnode *n);
void jexec(jctx *c, const jnode *n);
jv jcall(jctx *c, jv callee, const jargs *a, int line);
jv jgetattr(jctx *c, jv obj, const char *name, size_t n, int line); /* obj.name */
jv jgetitem(jctx *c, jv obj, jv key, int line);                    /* obj[key] */
void jiter(jctx *c, jv v, int line, jlist *out);                   /* the items `for` sees */

/* jinja_builtin.c */
bool jb_known_filter(const char *name); /* a filter python jinja2 knows */
bool jb_known_test(const char *name);
jv jb_filter(jctx *c, const char *name, jv v, const jargs *a);
bool jb_test(jctx *c, const char *name, jv v, const jargs *a);
jv jb_method(jctx *c, jv obj, const char *name, size_t n); /* a bound method, or undefined */
jv jb_global(jctx *c, const char *name);                   /* range, namespace, ...; or undefined */
jv jarg(const jargs *a, int pos, const char *kw, jv dflt);  /* positional pos or keyword kw */

#endif
