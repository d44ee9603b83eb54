/* gguf.c: the GGUF v2/v3 reader (mmap or a caller's buffer; every count, length and
 * offset is checked against the bytes that remain before it is used or allocated for) and
 * the streaming writer (header first, then tensor data by pwrite at precomputed offsets).
 * Assumes a little-endian host, like every machine hearth targets. */
#include "format/gguf.h"
#include "format/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c decodes little-endian fields with memcpy: a big-endian host needs byte swaps"
#endif

#define GGUF_MAX_DEPTH 8   /* arrays of arrays deeper than this are refused (bounds recursion) */
#define GGUF_MAX_NAME 64   /* llama.cpp's GGML_MAX_NAME: it refuses names this long or longer */
#define MIN_KV_BYTES 13    /* key length 8 + type 4 + the smallest value 1 */
#define MIN_TINFO_BYTES 24 /* name length 8 + n_dims 4 + type 4 + offset 8 */
#define MIN_ARR_BYTES 12   /* a nested array: element type 4 + count 8 */

static const char *const type_names[GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *gguf_type_name(uint32_t t) { return t < GGUF_TYPE_COUNT ? type_names[t] : "unknown"; }

/* Bytes of one packed scalar; 0 for STRING, ARRAY and unknown types. */
static size_t scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static bool type_signed(uint32_t t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}
static bool type_unsigned(uint32_t t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}
static bool type_float(uint32_t t) { return t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64; }

/* Decodes one packed scalar of type t at p into v (p may be unaligned). */
static void decode_scalar(uint32_t t, const uint8_t *p, gguf_value *v) {
    v->type = t;
    switch (t) {
    case GGUF_TYPE_UINT8: v->v.u64 = p[0]; break;
    case GGUF_TYPE_INT8: v->v.i64 = (int8_t)p[0]; break;
    case GGUF_TYPE_BOOL: v->v.u64 = p[0] != 0; break;
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); v->v.u64 = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); v->v.i64 = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); v->v.u64 = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); v->v.i64 = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); v->v.f64 = x; break; }
    case GGUF_TYPE_UINT64: memcpy(&v->v.u64, p, 8); break;
    case GGUF_TYPE_INT64: memcpy(&v->v.i64, p, 8); break;
    case GGUF_TYPE_FLOAT64: memcpy(&v->v.f64, p, 8); break;
    default: HEARTH_DIE("decode_scalar: type %u is not a scalar", t);
    }
}

/* Copies bytes into dst for an error message: non-ASCII and control bytes become '?',
 * long names are cut with "...", so a hostile name cannot garble the terminal. */
static const char *printable(char *dst, size_t cap, const char *p, uint64_t n) {
    size_t k = 0;
    for (uint64_t i = 0; i < n && k + 1 < cap; i++) {
        if (k + 4 >= cap && i + 1 < n) {
            memcpy(dst + k, "...", 3);
            k += 3;
            break;
        }
        unsigned char c = (unsigned char)p[i];
        dst[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    dst[k] = 0;
    return dst;
}

/* ---- name index: open addressing over (bytes, length), so lookups are O(1) ---- */

typedef gguf_str (*key_fn)(const void *owner, int64_t i);

typedef struct name_index {
    int64_t *slot;   /* entry index + 1; 0 = empty */
    uint64_t mask;   /* capacity - 1 (a power of two) */
    int64_t n;
} name_index;

static uint64_t hash_bytes(const char *p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
    return h;
}

static bool str_eq(gguf_str a, const char *p, uint64_t n) { return a.len == n && !memcmp(a.ptr, p, n); }

/* Index of the entry named (p, n), or -1. */
static int64_t index_find(const name_index *h, const void *owner, key_fn key, const char *p, uint64_t n) {
    if (!h->slot) return -1;
    for (uint64_t i = hash_bytes(p, n) & h->mask;; i = (i + 1) & h->mask) {
        int64_t s = h->slot[i];
        if (!s) return -1;
        if (str_eq(key(owner, s - 1), p, n)) return s - 1;
    }
}

static void index_put_raw(name_index *h, gguf_str k, int64_t idx) {
    uint64_t i = hash_bytes(k.ptr, k.len) & h->mask;
    while (h->slot[i]) i = (i + 1) & h->mask;
    h->slot[i] = idx + 1;
}

/* Adds entry idx (not already present); grows at half full so probes stay short. */
static void index_add(name_index *h, const void *owner, key_fn key, int64_t idx) {
    if (!h->slot || (uint64_t)(h->n + 1) * 2 > h->mask + 1) {
        uint64_t cap = h->slot ? (h->mask + 1) * 2 : 16;
        int64_t *old = h->slot;
        uint64_t old_cap = h->slot ? h->mask + 1 : 0;
        h->slot = xcalloc(cap, sizeof *h->slot);
        h->mask = cap - 1;
        for (uint64_t i = 0; i < old_cap; i++)
            if (old[i]) index_put_raw(h, key(owner, old[i] - 1), old[i] - 1);
        free(old);
    }
    index_put_raw(h, key(owner, idx), idx);
    h->n++;
}

/* ---- reader ---- */

struct gguf_file {
    const uint8_t *base;
    uint64_t size;
    void *map;                  /* mmap'd region (gguf_open) or NULL (gguf_open_buffer) */
    size_t map_len;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    gguf_kv *kvs;
    int64_t n_kv, cap_kv;
    gguf_tensor *tensors;
    int64_t n_tensors, cap_tensors;
    name_index kv_idx, t_idx;
};

static gguf_str kv_key(const void *owner, int64_t i) { return ((const gguf_file *)owner)->kvs[i].key; }
static gguf_str tensor_key(const void *owner, int64_t i) {
    const char *nm = ((const gguf_file *)owner)->tensors[i].name;
    return (gguf_str){nm, strlen(nm)};
}

/* A cursor over the file: pos <= size always holds. */
typedef struct reader {
    const uint8_t *b;
    uint64_t size, pos;
    herr *e;
} reader;

static uint64_t remain(const reader *r) { return r->size - r->pos; }

static int truncated(reader *r, const char *field, uint64_t need) {
    return herr_set(r->e, "%s: needs %" PRIu64 " bytes but the file ends (size %" PRIu64 ") at byte %" PRIu64,
                    field, need, r->size, r->pos);
}

static int rd_u32(reader *r, uint32_t *out, const char *field) {
    *out = 0; /* defined even on failure (and gcc can see it is) */
    if (remain(r) < 4) return truncated(r, field, 4);
    memcpy(out, r->b + r->pos, 4);
    r->pos += 4;
    return 0;
}

static int rd_u64(reader *r, uint64_t *out, const char *field) {
    *out = 0;
    if (remain(r) < 8) return truncated(r, field, 8);
    memcpy(out, r->b + r->pos, 8);
    r->pos += 8;
    return 0;
}

static int rd_str(reader *r, gguf_str *s, const char *field) {
    uint64_t at = r->pos, len;
    if (rd_u64(r, &len, field) < 0) return -1;
    if (len > remain(r)) {
        r->pos = at;
        return herr_set(r->e, "%s: length %" PRIu64 " runs past the end of the file (size %" PRIu64 ") at byte %" PRIu64,
                        field, len, r->size, at);
    }
    s->ptr = (const char *)r->b + r->pos;
    s->len = len;
    r->pos += len;
    return 0;
}

static void value_free(gguf_value *v) {
    if (v->type != GGUF_TYPE_ARRAY) return;
    if (v->v.arr.type == GGUF_TYPE_STRING) {
        free((void *)v->v.arr.strs);
    } else if (v->v.arr.type == GGUF_TYPE_ARRAY && v->v.arr.elems) {
        gguf_value *el = (gguf_value *)v->v.arr.elems;
        for (uint64_t j = 0; j < v->v.arr.n; j++) value_free(&el[j]);
        free(el);
    }
    v->v.arr.strs = NULL;
    v->v.arr.elems = NULL;
}

/* Reads an array body (element type, count, elements) into v. depth counts this array.
 * A dry read checks and skips without allocating: rd_value runs one before the real read,
 * so memory is only ever allocated for arrays whose every element is in the file. */
static int rd_array(reader *r, gguf_value *v, int depth, bool dry) {
    uint64_t at = r->pos, n;
    uint32_t et;
    v->type = GGUF_TYPE_ARRAY;
    if (depth > GGUF_MAX_DEPTH)
        return herr_set(r->e, "arrays nested deeper than %d levels at byte %" PRIu64, GGUF_MAX_DEPTH, at);
    if (rd_u32(r, &et, "array element type") < 0) return -1;
    if (et >= GGUF_TYPE_COUNT)
        return herr_set(r->e, "unknown array element type %u at byte %" PRIu64, et, at);
    uint64_t at_n = r->pos;
    if (rd_u64(r, &n, "array count") < 0) return -1;
    v->v.arr.type = et;
    v->v.arr.data = r->b + r->pos;
    size_t sz = scalar_size(et);
    if (sz) {
        uint64_t bytes;
        if (!mul_u64(n, sz, &bytes) || bytes > remain(r))
            return herr_set(r->e, "array count %" PRIu64 " of %s (%zu bytes each) runs past the end of the file (size %" PRIu64 ") at byte %" PRIu64,
                            n, type_names[et], sz, r->size, at_n);
        v->v.arr.n = n;
        r->pos += bytes;
        return 0;
    }
    if (et == GGUF_TYPE_STRING) {
        if (n > remain(r) / 8)
            return herr_set(r->e, "array count %" PRIu64 " of strings is more than the %" PRIu64 " bytes left could hold at byte %" PRIu64,
                            n, remain(r), at_n);
        /* Walk the lengths first, so a lying count allocates nothing. */
        uint64_t start = r->pos;
        for (uint64_t j = 0; j < n; j++) {
            gguf_str s;
            if (rd_str(r, &s, "string") < 0) return herr_wrap(r->e, "element %" PRIu64, j);
        }
        if (dry) return 0;
        r->pos = start;
        gguf_str *strs = xmalloc(n * sizeof *strs);
        for (uint64_t j = 0; j < n; j++) HEARTH_CHECK(rd_str(r, &strs[j], "string") == 0);
        v->v.arr.n = n;
        v->v.arr.strs = strs;
        return 0;
    }
    /* et == ARRAY */
    if (depth + 1 > GGUF_MAX_DEPTH && n > 0)
        return herr_set(r->e, "arrays nested deeper than %d levels at byte %" PRIu64, GGUF_MAX_DEPTH, at);
    if (n > remain(r) / MIN_ARR_BYTES)
        return herr_set(r->e, "array count %" PRIu64 " of arrays is more than the %" PRIu64 " bytes left could hold at byte %" PRIu64,
                        n, remain(r), at_n);
    if (dry) {
        for (uint64_t j = 0; j < n; j++) {
            gguf_value skip;
            if (rd_array(r, &skip, depth + 1, true) < 0) return herr_wrap(r->e, "element %" PRIu64, j);
        }
        return 0;
    }
    gguf_value *el = xcalloc(n, sizeof *el);
    v->v.arr.n = n;     /* attached before filling, so value_free cleans up a partial read */
    v->v.arr.elems = el;
    for (uint64_t j = 0; j < n; j++)
        if (rd_array(r, &el[j], depth + 1, false) < 0) return herr_wrap(r->e, "element %" PRIu64, j);
    return 0;
}

static int rd_value(reader *r, uint32_t type, gguf_value *v) {
    uint64_t at = r->pos;
    size_t sz = scalar_size(type);
    if (sz) {
        if (remain(r) < sz) return truncated(r, "value", sz);
        decode_scalar(type, r->b + r->pos, v);
        r->pos += sz;
        return 0;
    }
    if (type == GGUF_TYPE_STRING) {
        v->type = type;
        return rd_str(r, &v->v.str, "string value");
    }
    if (type == GGUF_TYPE_ARRAY) {
        gguf_value skip;
        if (rd_array(r, &skip, 1, true) < 0) return -1;
        r->pos = at;
        /* the dry read passed, so this one cannot fail */
        HEARTH_CHECK(rd_array(r, v, 1, false) == 0);
        return 0;
    }
    return herr_set(r->e, "unknown value type %u at byte %" PRIu64, type, at - 4);
}

static int read_header(gguf_file *f, reader *r) {
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    if (rd_u32(r, &magic, "magic") < 0) return -1;
    if (magic != GGUF_MAGIC) {
        char got[8];
        return herr_set(r->e, "magic: not a GGUF file (starts with \"%s\", expected \"GGUF\") at byte 0",
                        printable(got, sizeof got, (const char *)r->b, 4));
    }
    if (rd_u32(r, &version, "version") < 0) return -1;
    if (version != 2 && version != 3) {
        if (version == 1)
            return herr_set(r->e, "version 1 is not supported (its counts are 32-bit; convert the file to v3) at byte 4");
        return herr_set(r->e, "version %u is not supported (expected 3%s) at byte 4", version,
                        (version & 0xffff) == 0 ? "; a big-endian file?" : "");
    }
    f->version = version;
    if (rd_u64(r, &n_tensors, "n_tensors") < 0) return -1;
    if (rd_u64(r, &n_kv, "n_kv") < 0) return -1;
    uint64_t left = remain(r), need_kv, need_t, need;
    if (n_tensors > left / MIN_TINFO_BYTES)
        return herr_set(r->e, "n_tensors %" PRIu64 " is more than the %" PRIu64 " bytes after the header could hold at byte 8",
                        n_tensors, left);
    if (n_kv > left / MIN_KV_BYTES)
        return herr_set(r->e, "n_kv %" PRIu64 " is more than the %" PRIu64 " bytes after the header could hold at byte 16",
                        n_kv, left);
    if (!mul_u64(n_kv, MIN_KV_BYTES, &need_kv) || !mul_u64(n_tensors, MIN_TINFO_BYTES, &need_t) ||
        !add_u64(need_kv, need_t, &need) || need > left)
        return herr_set(r->e, "n_kv %" PRIu64 " and n_tensors %" PRIu64 " together are more than the %" PRIu64 " bytes after the header could hold at byte 8",
                        n_kv, n_tensors, left);
    f->n_tensors = (int64_t)n_tensors; /* the count to read; n grows as entries are filled */
    f->n_kv = (int64_t)n_kv;
    return 0;
}

static int read_kvs(gguf_file *f, reader *r, int64_t n_kv) {
    char name[80];
    f->n_kv = 0;
    for (int64_t i = 0; i < n_kv; i++) {
        uint64_t at = r->pos;
        gguf_str key;
        uint32_t type;
        if (rd_str(r, &key, "key") < 0) return herr_wrap(r->e, "kv %" PRId64, i);
        printable(name, sizeof name, key.ptr, key.len);
        int64_t dup = index_find(&f->kv_idx, f, kv_key, key.ptr, key.len);
        if (dup >= 0)
            return herr_set(r->e, "kv %" PRId64 " (%s): duplicate key (first as kv %" PRId64 " at byte %" PRIu64 ") at byte %" PRIu64,
                            i, name, dup, f->kvs[dup].offset, at);
        if (rd_u32(r, &type, "value type") < 0) return herr_wrap(r->e, "kv %" PRId64 " (%s)", i, name);
        if (type >= GGUF_TYPE_COUNT)
            return herr_set(r->e, "kv %" PRId64 " (%s): unknown value type %u at byte %" PRIu64, i, name, type, r->pos - 4);
        if (f->n_kv == f->cap_kv) {
            f->cap_kv = f->cap_kv ? f->cap_kv * 2 : 16;
            f->kvs = xrealloc(f->kvs, (size_t)f->cap_kv * sizeof *f->kvs);
        }
        gguf_kv *kv = &f->kvs[f->n_kv++]; /* counted now, so gguf_close frees a partial value */
        memset(kv, 0, sizeof *kv);
        kv->key = key;
        kv->offset = at;
        if (rd_value(r, type, &kv->val) < 0) return herr_wrap(r->e, "kv %" PRId64 " (%s)", i, name);
        index_add(&f->kv_idx, f, kv_key, f->n_kv - 1);
    }
    return 0;
}

static int read_alignment(gguf_file *f, herr *e) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = index_find(&f->kv_idx, f, kv_key, "general.alignment", strlen("general.alignment"));
    if (i < 0) return 0;
    const gguf_kv *kv = &f->kvs[i];
    if (kv->val.type != GGUF_TYPE_UINT32)
        return herr_set(e, "kv %" PRId64 " (general.alignment): type %s, expected u32 at byte %" PRIu64,
                        i, gguf_type_name(kv->val.type), kv->offset);
    uint64_t a = kv->val.v.u64;
    if (a == 0 || (a & (a - 1)))
        return herr_set(e, "kv %" PRId64 " (general.alignment): %" PRIu64 " is not a power of two at byte %" PRIu64,
                        i, a, kv->offset);
    f->alignment = a;
    return 0;
}

/* Reads the tensor infos; (*info_pos)[i] gets the byte offset of tensor i's offset field. */
static int read_tensor_infos(gguf_file *f, reader *r, int64_t n_tensors, uint64_t **info_pos) {
    char name[80];
    f->n_tensors = 0;
    for (int64_t i = 0; i < n_tensors; i++) {
        uint64_t at = r->pos;
        gguf_str nm;
        /* grown as read, not sized from the count: memory follows the bytes really there */
        if (i == f->cap_tensors) {
            f->cap_tensors = f->cap_tensors ? f->cap_tensors * 2 : 64;
            f->tensors = xrealloc(f->tensors, (size_t)f->cap_tensors * sizeof *f->tensors);
            *info_pos = xrealloc(*info_pos, (size_t)f->cap_tensors * sizeof **info_pos);
        }
        gguf_tensor *t = &f->tensors[i];
        memset(t, 0, sizeof *t);
        if (rd_str(r, &nm, "name") < 0) return herr_wrap(r->e, "tensor info %" PRId64, i);
        printable(name, sizeof name, nm.ptr, nm.len);
        if (nm.len >= GGUF_MAX_NAME)
            return herr_set(r->e, "tensor info %" PRId64 " (%s): name is %" PRIu64 " bytes, the limit is %d at byte %" PRIu64,
                            i, name, nm.len, GGUF_MAX_NAME - 1, at);
        if (memchr(nm.ptr, 0, nm.len))
            return herr_set(r->e, "tensor info %" PRId64 " (%s): name contains a NUL byte at byte %" PRIu64, i, name, at);
        t->name = xmalloc(nm.len + 1);
        memcpy(t->name, nm.ptr, nm.len);
        t->name[nm.len] = 0;
        f->n_tensors = i + 1;
        int64_t dup = index_find(&f->t_idx, f, tensor_key, nm.ptr, nm.len);
        if (dup >= 0) {
            f->n_tensors = i; /* not indexed: keep it out of lookups, still freed below */
            free(t->name);
            t->name = NULL;
            return herr_set(r->e, "tensor info %" PRId64 " (%s): duplicate tensor name (first as tensor info %" PRId64 ") at byte %" PRIu64,
                            i, name, dup, at);
        }
        index_add(&f->t_idx, f, tensor_key, i);

        uint64_t at_dims = r->pos;
        if (rd_u32(r, &t->n_dims, "n_dims") < 0) return herr_wrap(r->e, "tensor info %" PRId64 " (%s)", i, name);
        if (t->n_dims > GGUF_MAX_DIMS)
            return herr_set(r->e, "tensor info %" PRId64 " (%s): n_dims %u is more than %d at byte %" PRIu64,
                            i, name, t->n_dims, GGUF_MAX_DIMS, at_dims);
        uint64_t nel = 1;
        for (uint32_t j = 0; j < GGUF_MAX_DIMS; j++) {
            t->ne[j] = 1;
            if (j >= t->n_dims) continue;
            uint64_t at_ne = r->pos, x;
            if (rd_u64(r, &x, "ne") < 0) return herr_wrap(r->e, "tensor info %" PRId64 " (%s)", i, name);
            t->ne[j] = (int64_t)x;
            if (t->ne[j] <= 0)
                return herr_set(r->e, "tensor info %" PRId64 " (%s): ne[%u] = %" PRId64 " is not positive at byte %" PRIu64,
                                i, name, j, t->ne[j], at_ne);
            if (!mul_u64(nel, x, &nel) || nel > INT64_MAX)
                return herr_set(r->e, "tensor info %" PRId64 " (%s): element count overflows at ne[%u] = %" PRId64 " at byte %" PRIu64,
                                i, name, j, t->ne[j], at_ne);
        }
        uint64_t at_type = r->pos;
        if (rd_u32(r, &t->type, "type") < 0) return herr_wrap(r->e, "tensor info %" PRId64 " (%s)", i, name);
        if (!qtype_known(t->type))
            return herr_set(r->e, "tensor info %" PRId64 " (%s): unknown tensor type %u at byte %" PRIu64,
                            i, name, t->type, at_type);
        uint64_t blck = (uint64_t)qtype_block_elems(t->type), bb = qtype_block_bytes(t->type), nbytes;
        if ((uint64_t)t->ne[0] % blck)
            return herr_set(r->e, "tensor info %" PRId64 " (%s): row length ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRIu64 " at byte %" PRIu64,
                            i, name, t->ne[0], qtype_name(t->type), blck, at_dims);
        bool ok = mul_u64((uint64_t)t->ne[0] / blck, bb, &nbytes);
        for (int j = 1; j < GGUF_MAX_DIMS; j++) ok = ok && mul_u64(nbytes, (uint64_t)t->ne[j], &nbytes);
        if (!ok)
            return herr_set(r->e, "tensor info %" PRId64 " (%s): byte size overflows at byte %" PRIu64, i, name, at_dims);
        t->nbytes = nbytes;
        (*info_pos)[i] = r->pos;
        if (rd_u64(r, &t->offset, "offset") < 0) return herr_wrap(r->e, "tensor info %" PRId64 " (%s)", i, name);
    }
    return 0;
}

static int place_tensors(gguf_file *f, reader *r, const uint64_t *info_pos) {
    char name[80];
    uint64_t end = r->pos;
    if (f->n_tensors > 0) {
        /* llama.cpp pads to the data section only when there are tensors; so do we. */
        uint64_t pad = (f->alignment - end % f->alignment) % f->alignment;
        if (!add_u64(end, pad, &end) || end > r->size)
            return herr_set(r->e, "data section: padding to alignment %" PRIu64 " runs past the end of the file (size %" PRIu64 ") at byte %" PRIu64,
                            f->alignment, r->size, r->pos);
    }
    f->data_offset = end;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        printable(name, sizeof name, t->name, strlen(t->name));
        if (t->offset % f->alignment)
            return herr_set(r->e, "tensor info %" PRId64 " (%s): offset %" PRIu64 " is not a multiple of the alignment %" PRIu64 " at byte %" PRIu64,
                            i, name, t->offset, f->alignment, info_pos[i]);
        uint64_t start, stop;
        if (!add_u64(f->data_offset, t->offset, &start) || !add_u64(start, t->nbytes, &stop) || stop > r->size)
            return herr_set(r->e, "tensor info %" PRId64 " (%s): offset %" PRIu64 " + %" PRIu64 " bytes runs past the end of the file (size %" PRIu64 ", data at %" PRIu64 ") at byte %" PRIu64,
                            i, name, t->offset, t->nbytes, r->size, f->data_offset, info_pos[i]);
        t->data = r->b + start;
    }
    return 0;
}

static int parse(gguf_file *f, herr *e) {
    reader r = {f->base, f->size, 0, e};
    if (read_header(f, &r) < 0) return -1;
    int64_t n_kv = f->n_kv, n_tensors = f->n_tensors;
    f->n_kv = f->n_tensors = 0;
    if (read_kvs(f, &r, n_kv) < 0) return -1;
    if (read_alignment(f, e) < 0) return -1;
    uint64_t *info_pos = NULL;
    int rc = read_tensor_infos(f, &r, n_tensors, &info_pos);
    if (rc == 0) rc = place_tensors(f, &r, info_pos);
    free(info_pos);
    return rc;
}

int gguf_open_buffer(gguf_file **out, const void *buf, size_t size, herr *e) {
    *out = NULL;
    gguf_file *f = xcalloc(1, sizeof *f);
    f->base = buf;
    f->size = size;
    if (parse(f, e) < 0) {
        gguf_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

int gguf_open(gguf_file **out, const char *path, herr *e) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return herr_set(e, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        herr_set(e, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return herr_set(e, "%s: not a regular file", path);
    }
    void *map = NULL;
    size_t len = (size_t)st.st_size;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            herr_set(e, "%s: mmap of %zu bytes failed: %s", path, len, strerror(errno));
            close(fd);
            return -1;
        }
    }
    close(fd); /* the mapping keeps the file */
    gguf_file *f = xcalloc(1, sizeof *f);
    f->base = map ? map : (const uint8_t *)"";
    f->size = len;
    f->map = map;
    f->map_len = len;
    if (parse(f, e) < 0) {
        herr_wrap(e, "%s", path);
        gguf_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->n_kv; i++) value_free(&f->kvs[i].val);
    free(f->kvs);
    for (int64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->kv_idx.slot);
    free(f->t_idx.slot);
    if (f->map) munmap(f->map, f->map_len);
    free(f);
}

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_alignment(const gguf_file *f) { return f->alignment; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }
uint64_t gguf_file_size(const gguf_file *f) { return f->size; }
int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }
int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_kv ? &f->kvs[i] : NULL;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_value *gguf_find(const gguf_file *f, const char *key) {
    int64_t i = index_find(&f->kv_idx, f, kv_key, key, strlen(key));
    return i < 0 ? NULL : &f->kvs[i].val;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    int64_t i = index_find(&f->t_idx, f, tensor_key, name, strlen(name));
    return i < 0 ? NULL : &f->tensors[i];
}

bool gguf_str_eq(gguf_str s, const char *c) { return str_eq(s, c, strlen(c)); }

/* ---- typed getters ---- */

static const gguf_value *find_or_err(const gguf_file *f, const char *key, herr *e) {
    const gguf_value *v = gguf_find(f, key);
    if (!v) herr_set(e, "key %s not found", key);
    return v;
}

/* An integer value as (negative?, magnitude); false when v is not an integer type. */
static bool int_parts(const gguf_value *v, bool *neg, uint64_t *mag) {
    if (type_unsigned(v->type)) {
        *neg = false;
        *mag = v->v.u64;
        return true;
    }
    if (type_signed(v->type)) {
        *neg = v->v.i64 < 0;
        *mag = *neg ? (uint64_t)0 - (uint64_t)v->v.i64 : (uint64_t)v->v.i64;
        return true;
    }
    return false;
}

/* Checks that an integer value lies in [-neg_max, pos_max] (magnitudes). */
static int get_int(const gguf_file *f, const char *key, uint64_t neg_max, uint64_t pos_max, const char *want,
                   bool *neg, uint64_t *mag, herr *e) {
    const gguf_value *v = find_or_err(f, key, e);
    if (!v) return -1;
    if (!int_parts(v, neg, mag))
        return herr_set(e, "key %s has type %s, expected an integer (%s)", key, gguf_type_name(v->type), want);
    if ((*neg && *mag > neg_max) || (!*neg && *mag > pos_max))
        return herr_set(e, "key %s: value %s%" PRIu64 " does not fit in %s", key, *neg ? "-" : "", *mag, want);
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, herr *e) {
    bool neg;
    uint64_t mag;
    if (get_int(f, key, 0, UINT32_MAX, "u32", &neg, &mag, e) < 0) return -1;
    *out = (uint32_t)mag;
    return 0;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, herr *e) {
    bool neg;
    uint64_t mag;
    if (get_int(f, key, 0, UINT64_MAX, "u64", &neg, &mag, e) < 0) return -1;
    *out = mag;
    return 0;
}

int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, herr *e) {
    bool neg;
    uint64_t mag;
    if (get_int(f, key, (uint64_t)INT32_MAX + 1, INT32_MAX, "i32", &neg, &mag, e) < 0) return -1;
    *out = neg ? (int32_t)(-(int64_t)mag) : (int32_t)mag;
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, herr *e) {
    const gguf_value *v = find_or_err(f, key, e);
    if (!v) return -1;
    if (!type_float(v->type))
        return herr_set(e, "key %s has type %s, expected f32 or f64", key, gguf_type_name(v->type));
    double d = v->v.f64;
    if (d == d && (d > FLT_MAX || d < -FLT_MAX) && d - d == 0) /* finite but beyond f32 */
        return herr_set(e, "key %s: value %g does not fit in f32", key, d);
    *out = (float)d;
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out, herr *e) {
    const gguf_value *v = find_or_err(f, key, e);
    if (!v) return -1;
    if (v->type != GGUF_TYPE_BOOL)
        return herr_set(e, "key %s has type %s, expected bool", key, gguf_type_name(v->type));
    *out = v->v.u64 != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, herr *e) {
    const gguf_value *v = find_or_err(f, key, e);
    if (!v) return -1;
    if (v->type != GGUF_TYPE_STRING)
        return herr_set(e, "key %s has type %s, expected string", key, gguf_type_name(v->type));
    *out = v->v.str;
    return 0;
}

int gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, const gguf_value **out, herr *e) {
    const gguf_value *v = find_or_err(f, key, e);
    if (!v) return -1;
    if (v->type != GGUF_TYPE_ARRAY)
        return herr_set(e, "key %s has type %s, expected an array", key, gguf_type_name(v->type));
    if (elem_type != GGUF_TYPE_COUNT && v->v.arr.type != elem_type)
        return herr_set(e, "key %s is an array of %s, expected an array of %s", key,
                        gguf_type_name(v->v.arr.type), gguf_type_name(elem_type));
    *out = v;
    return 0;
}

/* Callers check the array's type and length first: a wrong one is a bug, so it aborts. */
static void arr_elem(const gguf_value *arr, uint64_t i, gguf_value *el) {
    HEARTH_CHECK(arr->type == GGUF_TYPE_ARRAY && scalar_size(arr->v.arr.type) != 0 && i < arr->v.arr.n);
    size_t sz = scalar_size(arr->v.arr.type);
    decode_scalar(arr->v.arr.type, (const uint8_t *)arr->v.arr.data + i * sz, el);
}

int64_t gguf_arr_int(const gguf_value *arr, uint64_t i) {
    gguf_value el;
    arr_elem(arr, i, &el);
    if (type_float(el.type)) return (int64_t)el.v.f64; /* truncates, like a C cast */
    return type_signed(el.type) ? el.v.i64 : (int64_t)el.v.u64;
}

double gguf_arr_float(const gguf_value *arr, uint64_t i) {
    gguf_value el;
    arr_elem(arr, i, &el);
    if (type_float(el.type)) return el.v.f64;
    return type_signed(el.type) ? (double)el.v.i64 : (double)el.v.u64;
}

/* ---- writer ---- */

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
} wbuf;

static void wb_put(wbuf *b, const void *d, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n) cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
}
static void wb_u32(wbuf *b, uint32_t x) { wb_put(b, &x, 4); }
static void wb_u64(wbuf *b, uint64_t x) { wb_put(b, &x, 8); }
static void wb_str(wbuf *b, const char *p, uint64_t n) {
    wb_u64(b, n);
    wb_put(b, p, (size_t)n);
}

typedef struct wkv {
    char *key;
    wbuf enc;                   /* the value type and value, encoded as in the file */
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes, offset;    /* offset relative to the data section, set at open */
    _Atomic uint64_t written;   /* bytes written so far, from any thread */
} wtensor;

struct gguf_writer {
    wkv *kvs;
    int64_t n_kv, cap_kv;
    wtensor *ts;
    int64_t n_t, cap_t;
    uint64_t alignment;
    int fd;                     /* -1 until open */
    uint64_t data_offset;
    char *path;
};

gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = xcalloc(1, sizeof *w);
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    w->fd = -1;
    return w;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].enc.p);
    }
    free(w->kvs);
    for (int64_t i = 0; i < w->n_t; i++) free(w->ts[i].name);
    free(w->ts);
    free(w->path);
    free(w);
}

/* The buffer for key, emptied: an existing key keeps its place and loses its old value. */
static wbuf *kv_slot(gguf_writer *w, const char *key, uint32_t type) {
    HEARTH_CHECK(w->fd < 0);
    if (!strcmp(key, "general.alignment") && type != GGUF_TYPE_UINT32)
        HEARTH_DIE("general.alignment must be u32, not %s", gguf_type_name(type));
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kvs[i].key, key)) {
            w->kvs[i].enc.len = 0;
            wb_u32(&w->kvs[i].enc, type);
            return &w->kvs[i].enc;
        }
    if (w->n_kv == w->cap_kv) {
        w->cap_kv = w->cap_kv ? w->cap_kv * 2 : 32;
        w->kvs = xrealloc(w->kvs, (size_t)w->cap_kv * sizeof *w->kvs);
    }
    wkv *kv = &w->kvs[w->n_kv++];
    kv->key = xstrdup(key);
    kv->enc = (wbuf){0};
    wb_u32(&kv->enc, type);
    return &kv->enc;
}

void gguf_set_u8(gguf_writer *w, const char *key, uint8_t v) { wb_put(kv_slot(w, key, GGUF_TYPE_UINT8), &v, 1); }
void gguf_set_i32(gguf_writer *w, const char *key, int32_t v) { wb_put(kv_slot(w, key, GGUF_TYPE_INT32), &v, 4); }
void gguf_set_u64(gguf_writer *w, const char *key, uint64_t v) { wb_u64(kv_slot(w, key, GGUF_TYPE_UINT64), v); }
void gguf_set_f32(gguf_writer *w, const char *key, float v) { wb_put(kv_slot(w, key, GGUF_TYPE_FLOAT32), &v, 4); }

void gguf_set_u32(gguf_writer *w, const char *key, uint32_t v) {
    if (!strcmp(key, "general.alignment")) {
        if (v == 0 || (v & (v - 1))) HEARTH_DIE("general.alignment %u is not a power of two", v);
        w->alignment = v;
    }
    wb_u32(kv_slot(w, key, GGUF_TYPE_UINT32), v);
}

void gguf_set_bool(gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    wb_put(kv_slot(w, key, GGUF_TYPE_BOOL), &b, 1);
}

void gguf_set_str(gguf_writer *w, const char *key, const char *v) {
    wb_str(kv_slot(w, key, GGUF_TYPE_STRING), v, strlen(v));
}

void gguf_set_arr_data(gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n) {
    size_t sz = scalar_size(elem_type);
    uint64_t bytes;
    if (!sz) HEARTH_DIE("gguf_set_arr_data(%s): element type %s is not a packed scalar", key, gguf_type_name(elem_type));
    HEARTH_CHECK(mul_u64(n, sz, &bytes) && bytes <= SIZE_MAX);
    wbuf *b = kv_slot(w, key, GGUF_TYPE_ARRAY);
    wb_u32(b, elem_type);
    wb_u64(b, n);
    wb_put(b, data, (size_t)bytes);
}

void gguf_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    wbuf *b = kv_slot(w, key, GGUF_TYPE_ARRAY);
    wb_u32(b, GGUF_TYPE_STRING);
    wb_u64(b, n);
    for (uint64_t i = 0; i < n; i++) wb_str(b, v[i], strlen(v[i]));
}

/* Element type, count and elements of an array value (what follows the ARRAY tag). */
static void enc_array_body(wbuf *b, const gguf_value *v, int depth) {
    HEARTH_CHECK(v->type == GGUF_TYPE_ARRAY && depth <= GGUF_MAX_DEPTH);
    uint32_t et = v->v.arr.type;
    uint64_t n = v->v.arr.n;
    wb_u32(b, et);
    wb_u64(b, n);
    size_t sz = scalar_size(et);
    if (sz) {
        uint64_t bytes;
        HEARTH_CHECK(mul_u64(n, sz, &bytes) && bytes <= SIZE_MAX);
        wb_put(b, v->v.arr.data, (size_t)bytes);
    } else if (et == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < n; i++) wb_str(b, v->v.arr.strs[i].ptr, v->v.arr.strs[i].len);
    } else if (et == GGUF_TYPE_ARRAY) {
        for (uint64_t i = 0; i < n; i++) enc_array_body(b, &v->v.arr.elems[i], depth + 1);
    } else {
        HEARTH_DIE("array element type %u is not a GGUF type", et);
    }
}

void gguf_set_value(gguf_writer *w, const char *key, const gguf_value *v) {
    switch (v->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT64: case GGUF_TYPE_BOOL: {
        uint64_t x = v->v.u64;
        wb_put(kv_slot(w, key, v->type), &x, scalar_size(v->type));
        break;
    }
    case GGUF_TYPE_UINT32:
        gguf_set_u32(w, key, (uint32_t)v->v.u64);
        break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64: {
        int64_t x = v->v.i64; /* little-endian: the low bytes are the narrower value */
        wb_put(kv_slot(w, key, v->type), &x, scalar_size(v->type));
        break;
    }
    case GGUF_TYPE_FLOAT32: {
        float x = (float)v->v.f64;
        wb_put(kv_slot(w, key, v->type), &x, 4);
        break;
    }
    case GGUF_TYPE_FLOAT64:
        wb_put(kv_slot(w, key, v->type), &v->v.f64, 8);
        break;
    case GGUF_TYPE_STRING:
        wb_str(kv_slot(w, key, v->type), v->v.str.ptr, v->v.str.len);
        break;
    case GGUF_TYPE_ARRAY:
        enc_array_body(kv_slot(w, key, v->type), v, 1);
        break;
    default:
        HEARTH_DIE("gguf_set_value(%s): type %u is not a GGUF type", key, v->type);
    }
}

int64_t gguf_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne) {
    HEARTH_CHECK(w->fd < 0);
    if (strlen(name) >= GGUF_MAX_NAME) HEARTH_DIE("tensor name %s is longer than %d bytes", name, GGUF_MAX_NAME - 1);
    if (!qtype_known(type)) HEARTH_DIE("tensor %s: unknown type %u", name, type);
    HEARTH_CHECK(n_dims >= 1 && n_dims <= GGUF_MAX_DIMS);
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->ts[i].name, name)) HEARTH_DIE("tensor %s added twice", name);
    if (w->n_t == w->cap_t) {
        w->cap_t = w->cap_t ? w->cap_t * 2 : 64;
        w->ts = xrealloc(w->ts, (size_t)w->cap_t * sizeof *w->ts);
    }
    wtensor *t = &w->ts[w->n_t];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t j = 0; j < GGUF_MAX_DIMS; j++) {
        t->ne[j] = j < n_dims ? ne[j] : 1;
        if (t->ne[j] <= 0) HEARTH_DIE("tensor %s: ne[%u] = %" PRId64 " is not positive", name, j, t->ne[j]);
    }
    uint64_t blck = (uint64_t)qtype_block_elems(type), nbytes;
    if ((uint64_t)t->ne[0] % blck)
        HEARTH_DIE("tensor %s: row length %" PRId64 " is not a multiple of the %s block size", name, t->ne[0], qtype_name(type));
    bool ok = mul_u64((uint64_t)t->ne[0] / blck, qtype_block_bytes(type), &nbytes);
    for (int j = 1; j < GGUF_MAX_DIMS; j++) ok = ok && mul_u64(nbytes, (uint64_t)t->ne[j], &nbytes);
    if (!ok) HEARTH_DIE("tensor %s: byte size overflows", name);
    t->nbytes = nbytes;
    t->name = xstrdup(name);
    atomic_init(&t->written, 0);
    return w->n_t++;
}

uint64_t gguf_writer_tensor_nbytes(const gguf_writer *w, int64_t i) {
    HEARTH_CHECK(i >= 0 && i < w->n_t);
    return w->ts[i].nbytes;
}

static uint64_t pad_to(uint64_t x, uint64_t a) {
    uint64_t r;
    HEARTH_CHECK(add_u64(x, (a - x % a) % a, &r));
    return r;
}

static int write_all(int fd, const uint8_t *p, size_t n, uint64_t off, herr *e, const char *path) {
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return herr_set(e, "%s: write at byte %" PRIu64 " failed: %s", path, off, strerror(errno));
        }
        if (k == 0) return herr_set(e, "%s: write at byte %" PRIu64 " wrote nothing", path, off);
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

int gguf_writer_open(gguf_writer *w, const char *path, herr *e) {
    HEARTH_CHECK(w->fd < 0);
    wbuf h = {0};
    wb_u32(&h, GGUF_MAGIC);
    wb_u32(&h, GGUF_VERSION);
    wb_u64(&h, (uint64_t)w->n_t);
    wb_u64(&h, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) {
        wb_str(&h, w->kvs[i].key, strlen(w->kvs[i].key));
        wb_put(&h, w->kvs[i].enc.p, w->kvs[i].enc.len);
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->ts[i];
        t->offset = off;
        off = pad_to(off + t->nbytes, w->alignment); /* like llama.cpp: tensors back to back, each padded */
        wb_str(&h, t->name, strlen(t->name));
        wb_u32(&h, t->n_dims);
        for (uint32_t j = 0; j < t->n_dims; j++) wb_u64(&h, (uint64_t)t->ne[j]);
        wb_u32(&h, t->type);
        wb_u64(&h, t->offset);
    }
    static const uint8_t zeros[256];
    while (h.len % w->alignment) wb_put(&h, zeros, (size_t)((w->alignment - h.len % w->alignment) < sizeof zeros ? w->alignment - h.len % w->alignment : sizeof zeros));
    w->data_offset = h.len;
    uint64_t total;
    HEARTH_CHECK(add_u64(w->data_offset, off, &total));

    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(h.p);
        return herr_set(e, "%s: %s", path, strerror(errno));
    }
    int rc = write_all(fd, h.p, h.len, 0, e, path);
    free(h.p);
    /* Sizing the file now leaves the padding as zeros and lets threads pwrite anywhere. */
    if (rc == 0 && ftruncate(fd, (off_t)total) < 0)
        rc = herr_set(e, "%s: sizing the file to %" PRIu64 " bytes failed: %s", path, total, strerror(errno));
    if (rc < 0) {
        close(fd);
        return -1;
    }
    w->fd = fd;
    free(w->path);
    w->path = xstrdup(path);
    return 0;
}

int gguf_writer_write(gguf_writer *w, int64_t i, uint64_t off, const void *data, uint64_t n, herr *e) {
    if (w->fd < 0) return herr_set(e, "gguf writer: write before open");
    if (i < 0 || i >= w->n_t) return herr_set(e, "gguf writer: tensor index %" PRId64 " out of range", i);
    wtensor *t = &w->ts[i];
    uint64_t end;
    if (!add_u64(off, n, &end) || end > t->nbytes)
        return herr_set(e, "tensor %s: write of %" PRIu64 " bytes at %" PRIu64 " runs past its %" PRIu64 " bytes",
                        t->name, n, off, t->nbytes);
    if (write_all(w->fd, data, (size_t)n, w->data_offset + t->offset + off, e, w->path) < 0)
        return herr_wrap(e, "tensor %s", t->name);
    atomic_fetch_add(&t->written, n);
    return 0;
}

int gguf_writer_close(gguf_writer *w, herr *e) {
    if (w->fd < 0) return herr_set(e, "gguf writer: close before open");
    int rc = 0;
    /* Counts bytes, not ranges: a caller that writes a range twice and skips another
     * passes this check; the writers in hearth write each range once. */
    for (int64_t i = 0; i < w->n_t && rc == 0; i++) {
        uint64_t got = atomic_load(&w->ts[i].written);
        if (got != w->ts[i].nbytes)
            rc = herr_set(e, "%s: tensor %s: %" PRIu64 " of %" PRIu64 " bytes written", w->path, w->ts[i].name,
                          got, w->ts[i].nbytes);
    }
    if (close(w->fd) < 0 && rc == 0) rc = herr_set(e, "%s: close failed: %s", w->path, strerror(errno));
    w->fd = -1;
    return rc;
}
