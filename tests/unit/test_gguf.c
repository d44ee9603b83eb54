/* test_gguf.c: the GGUF reader and writer: a write→read round trip of every value type
 * (nested and empty arrays, empty strings), tensors of several types, a non-default
 * alignment, a byte-identical rewrite through gguf_set_value, the getters' conversions,
 * and malformed files built from a valid one (every truncation, absurd fields), each of
 * which must fail with a message naming the field. Replays tests/fuzz/regress/gguf/ too. */
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf.h"
#include "harness.h"
#include "format/quant.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

/* Deterministic tensor bytes: byte j of tensor i. */
static uint8_t tbyte(int64_t i, uint64_t j) { return (uint8_t)(i * 131 + j * 7 + 1); }

static int write_tensor_data(gguf_writer *w, int64_t n_t, herr *e) {
    for (int64_t i = 0; i < n_t; i++) {
        uint64_t nb = gguf_writer_tensor_nbytes(w, i);
        uint8_t *buf = malloc(nb);
        for (uint64_t j = 0; j < nb; j++) buf[j] = tbyte(i, j);
        /* two halves, second first: any order must work */
        uint64_t h = nb / 2;
        int rc = gguf_writer_write(w, i, h, buf + h, nb - h, e);
        if (rc == 0) rc = gguf_writer_write(w, i, 0, buf, h, e);
        free(buf);
        if (rc < 0) return -1;
    }
    return 0;
}

/* The reference file: every value type, nested arrays, and four tensor types. */
static void fill_writer(gguf_writer *w, uint32_t align) {
    gguf_set_str(w, "general.architecture", "test");
    if (align) gguf_set_u32(w, "general.alignment", align);
    gguf_set_u8(w, "t.u8", 250);
    gguf_set_u32(w, "t.u32", 4000000000u);
    gguf_set_i32(w, "t.i32", -123456);
    gguf_set_u64(w, "t.u64", 0xfedcba9876543210ull);
    gguf_set_f32(w, "t.f32", 1.5f);
    gguf_set_bool(w, "t.bool", true);
    gguf_set_str(w, "t.str", "héllo\nworld");
    gguf_set_str(w, "t.empty", "");
    int16_t i16[] = {-1, 2, -3};
    gguf_set_arr_data(w, "t.arr_i16", GGUF_TYPE_INT16, i16, 3);
    double f64[] = {0.25, -1e300};
    gguf_set_arr_data(w, "t.arr_f64", GGUF_TYPE_FLOAT64, f64, 2);
    gguf_set_arr_data(w, "t.arr_empty", GGUF_TYPE_UINT32, NULL, 0);
    const char *strs[] = {"a", "", "Ġthe", "<|im_start|>"};
    gguf_set_arr_str(w, "t.arr_str", strs, 4);
    gguf_set_arr_str(w, "t.arr_str_empty", NULL, 0);
    gguf_set_u32(w, "t.replaced", 1);
    gguf_set_u32(w, "t.replaced", 2); /* keeps its place, takes the new value */
    int64_t ne0[] = {8, 3};
    int64_t ne1[] = {64, 2, 2};
    int64_t ne2[] = {256};
    int64_t ne3[] = {8};
    int64_t ne4[] = {512, 1};
    gguf_add_tensor(w, "token_embd.weight", QT_F32, 2, ne0);
    gguf_add_tensor(w, "blk.0.attn_q.weight", QT_Q8_0, 3, ne1);
    gguf_add_tensor(w, "blk.0.ffn_down.weight", QT_Q4_K, 1, ne2);
    gguf_add_tensor(w, "output_norm.weight", QT_BF16, 1, ne3);
    gguf_add_tensor(w, "output.weight", QT_Q6_K, 2, ne4);
}

/* A nested array value built by hand: [[u8 1,2], [string "x",""], [], [[i32 -7]]]. */
static void set_nested(gguf_writer *w) {
    static const uint8_t u8s[] = {1, 2};
    static const int32_t i32s[] = {-7};
    static gguf_str s2[2];
    s2[0] = (gguf_str){"x", 1};
    s2[1] = (gguf_str){"", 0};
    static gguf_value inner[1], el[4], top;
    inner[0].type = GGUF_TYPE_ARRAY;
    inner[0].v.arr.type = GGUF_TYPE_INT32, inner[0].v.arr.n = 1, inner[0].v.arr.data = i32s;
    el[0].type = GGUF_TYPE_ARRAY, el[0].v.arr.type = GGUF_TYPE_UINT8, el[0].v.arr.n = 2, el[0].v.arr.data = u8s;
    el[1].type = GGUF_TYPE_ARRAY, el[1].v.arr.type = GGUF_TYPE_STRING, el[1].v.arr.n = 2, el[1].v.arr.strs = s2;
    el[2].type = GGUF_TYPE_ARRAY, el[2].v.arr.type = GGUF_TYPE_ARRAY, el[2].v.arr.n = 0;
    el[3].type = GGUF_TYPE_ARRAY, el[3].v.arr.type = GGUF_TYPE_ARRAY, el[3].v.arr.n = 1, el[3].v.arr.elems = inner;
    top.type = GGUF_TYPE_ARRAY, top.v.arr.type = GGUF_TYPE_ARRAY, top.v.arr.n = 4, top.v.arr.elems = el;
    gguf_set_value(w, "t.nested", &top);
}

static int write_reference(const char *path, uint32_t align, herr *e) {
    gguf_writer *w = gguf_writer_new();
    fill_writer(w, align);
    set_nested(w);
    int rc = gguf_writer_open(w, path, e);
    if (rc == 0) rc = write_tensor_data(w, 5, e);
    if (rc == 0) rc = gguf_writer_close(w, e);
    gguf_writer_free(w);
    return rc;
}

static void check_reference(gguf_file *f, uint64_t align) {
    herr e;
    CHECK(gguf_version(f) == 3);
    CHECK(gguf_alignment(f) == align);
    CHECK(gguf_data_offset(f) % align == 0);
    CHECK(gguf_n_kv(f) == (align != 32 ? 17 : 16));
    if (harness_cur_failed) return; /* the index checks below assume the count */
    CHECK(gguf_str_eq(gguf_kv_at(f, 0)->key, "general.architecture"));
    CHECK(gguf_kv_at(f, gguf_n_kv(f)) == NULL && gguf_kv_at(f, -1) == NULL);

    uint32_t u32 = 0;
    uint64_t u64 = 0;
    int32_t i32 = 0;
    float f32 = 0;
    bool b = false;
    gguf_str s;
    CHECK(gguf_get_u32(f, "t.u8", &u32, &e) == 0 && u32 == 250);
    CHECK(gguf_get_u32(f, "t.u32", &u32, &e) == 0 && u32 == 4000000000u);
    CHECK(gguf_get_u64(f, "t.u64", &u64, &e) == 0 && u64 == 0xfedcba9876543210ull);
    CHECK(gguf_get_i32(f, "t.i32", &i32, &e) == 0 && i32 == -123456);
    CHECK(gguf_get_f32(f, "t.f32", &f32, &e) == 0 && f32 == 1.5f);
    CHECK(gguf_get_bool(f, "t.bool", &b, &e) == 0 && b);
    CHECK(gguf_get_str(f, "t.str", &s, &e) == 0 && gguf_str_eq(s, "héllo\nworld"));
    CHECK(gguf_get_str(f, "t.empty", &s, &e) == 0 && s.len == 0);
    CHECK(gguf_get_u32(f, "t.replaced", &u32, &e) == 0 && u32 == 2);
    CHECK(gguf_str_eq(gguf_kv_at(f, align != 32 ? 16 : 15)->key, "t.nested")); /* replaced kept its place */

    const gguf_value *a;
    CHECK(gguf_get_arr(f, "t.arr_i16", GGUF_TYPE_INT16, &a, &e) == 0 && a->v.arr.n == 3 &&
          gguf_arr_int(a, 0) == -1 && gguf_arr_int(a, 2) == -3 && gguf_arr_float(a, 1) == 2.0);
    CHECK(gguf_get_arr(f, "t.arr_f64", GGUF_TYPE_COUNT, &a, &e) == 0 && gguf_arr_float(a, 1) == -1e300 &&
          gguf_arr_float(a, 0) == 0.25);
    CHECK(gguf_get_arr(f, "t.arr_empty", GGUF_TYPE_UINT32, &a, &e) == 0 && a->v.arr.n == 0);
    CHECK(gguf_get_arr(f, "t.arr_str", GGUF_TYPE_STRING, &a, &e) == 0 && a->v.arr.n == 4 &&
          gguf_str_eq(a->v.arr.strs[0], "a") && a->v.arr.strs[1].len == 0 &&
          gguf_str_eq(a->v.arr.strs[2], "Ġthe") && gguf_str_eq(a->v.arr.strs[3], "<|im_start|>"));
    CHECK(gguf_get_arr(f, "t.arr_str_empty", GGUF_TYPE_STRING, &a, &e) == 0 && a->v.arr.n == 0);
    CHECK(gguf_get_arr(f, "t.nested", GGUF_TYPE_ARRAY, &a, &e) == 0 && a->v.arr.n == 4);
    if (!harness_cur_failed) {
        const gguf_value *el = a->v.arr.elems;
        CHECK(el[0].v.arr.type == GGUF_TYPE_UINT8 && el[0].v.arr.n == 2 && gguf_arr_int(&el[0], 1) == 2);
        CHECK(el[1].v.arr.type == GGUF_TYPE_STRING && gguf_str_eq(el[1].v.arr.strs[0], "x") && el[1].v.arr.strs[1].len == 0);
        CHECK(el[2].v.arr.type == GGUF_TYPE_ARRAY && el[2].v.arr.n == 0);
        CHECK(el[3].v.arr.n == 1 && el[3].v.arr.elems[0].v.arr.type == GGUF_TYPE_INT32 &&
              gguf_arr_int(&el[3].v.arr.elems[0], 0) == -7);
    }

    CHECK(gguf_n_tensors(f) == 5);
    static const char *names[] = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight",
                                  "output_norm.weight", "output.weight"};
    static const uint32_t types[] = {QT_F32, QT_Q8_0, QT_Q4_K, QT_BF16, QT_Q6_K};
    static const uint64_t nbytes[] = {8 * 3 * 4, 2 * 34 * 2 * 2, 144, 16, 2 * 210};
    for (int64_t i = 0; i < 5; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, names[i]);
        CHECK_MSG(t == gguf_tensor_at(f, i), "tensor %s at %" PRId64, names[i], i);
        if (!t) continue;
        CHECK(t->type == types[i] && t->nbytes == nbytes[i] && t->offset % align == 0);
        int ok = 1;
        for (uint64_t j = 0; j < t->nbytes; j++) ok &= ((const uint8_t *)t->data)[j] == tbyte(i, j);
        CHECK_MSG(ok, "tensor %s data", names[i]);
    }
    const gguf_tensor *q = gguf_find_tensor(f, "blk.0.attn_q.weight");
    CHECK(q && q->n_dims == 3 && q->ne[0] == 64 && q->ne[1] == 2 && q->ne[2] == 2 && q->ne[3] == 1);
    CHECK(gguf_find_tensor(f, "nope") == NULL && gguf_find(f, "nope") == NULL);
    CHECK(gguf_tensor_at(f, 5) == NULL);
}

TEST(round_trip_default_alignment) {
    herr e;
    gguf_file *f;
    CHECK_MSG(write_reference(tmp_path("ref32.gguf"), 0, &e) == 0, "%s", e.msg);
    CHECK_MSG(gguf_open(&f, tmp_path("ref32.gguf"), &e) == 0, "%s", e.msg);
    if (harness_cur_failed) return;
    check_reference(f, 32);
    /* the writer pads the end too, like llama.cpp */
    CHECK(gguf_file_size(f) % 32 == 0);
    gguf_close(f);
}

TEST(round_trip_alignment_64) {
    herr e;
    gguf_file *f;
    CHECK_MSG(write_reference(tmp_path("ref64.gguf"), 64, &e) == 0, "%s", e.msg);
    CHECK_MSG(gguf_open(&f, tmp_path("ref64.gguf"), &e) == 0, "%s", e.msg);
    if (harness_cur_failed) return;
    check_reference(f, 64);
    gguf_close(f);
}

/* Reads path, copies every kv with gguf_set_value and every tensor, writes out. */
static int rewrite(const char *in, const char *out, herr *e) {
    gguf_file *f;
    if (gguf_open(&f, in, e) < 0) return -1;
    gguf_writer *w = gguf_writer_new();
    char key[256];
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        gguf_set_value(w, key, &kv->val);
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
    }
    int rc = gguf_writer_open(w, out, e);
    for (int64_t i = 0; rc == 0 && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        rc = gguf_writer_write(w, i, 0, t->data, t->nbytes, e);
    }
    if (rc == 0) rc = gguf_writer_close(w, e);
    gguf_writer_free(w);
    gguf_close(f);
    return rc;
}

TEST(rewrite_is_byte_identical) {
    herr e;
    const char *names[][2] = {{"ref32.gguf", "re32.gguf"}, {"ref64.gguf", "re64.gguf"}};
    for (int k = 0; k < 2; k++) {
        char in[512];
        snprintf(in, sizeof in, "%s", tmp_path(names[k][0]));
        CHECK_MSG(rewrite(in, tmp_path(names[k][1]), &e) == 0, "%s", e.msg);
        size_t na = 0, nb = 0;
        uint8_t *a = test_read(in, &na), *b = test_read(tmp_path(names[k][1]), &nb);
        CHECK_MSG(a && b && na == nb && !memcmp(a, b, na), "%s: %zu vs %zu bytes", names[k][0], na, nb);
        free(a);
        free(b);
    }
}

TEST(getter_conversions_and_errors) {
    herr e;
    gguf_writer *w = gguf_writer_new();
    gguf_set_u64(w, "big", 1ull << 40);
    gguf_set_i32(w, "neg", -5);
    gguf_set_u32(w, "u32max", UINT32_MAX);
    gguf_set_value(w, "i64", &(gguf_value){.type = GGUF_TYPE_INT64, .v.i64 = INT32_MIN});
    gguf_set_value(w, "f64", &(gguf_value){.type = GGUF_TYPE_FLOAT64, .v.f64 = 0.1});
    gguf_set_value(w, "f64big", &(gguf_value){.type = GGUF_TYPE_FLOAT64, .v.f64 = 1e300});
    gguf_set_value(w, "u16", &(gguf_value){.type = GGUF_TYPE_UINT16, .v.u64 = 65535});
    gguf_set_value(w, "i8", &(gguf_value){.type = GGUF_TYPE_INT8, .v.i64 = -128});
    gguf_set_bool(w, "flag", false);
    gguf_set_str(w, "s", "x");
    uint8_t u8s[] = {1, 2, 3};
    gguf_set_arr_data(w, "arr", GGUF_TYPE_UINT8, u8s, 3);
    CHECK_MSG(gguf_writer_open(w, tmp_path("getters.gguf"), &e) == 0, "%s", e.msg);
    CHECK_MSG(gguf_writer_close(w, &e) == 0, "%s", e.msg);
    gguf_writer_free(w);
    gguf_file *f;
    CHECK_MSG(gguf_open(&f, tmp_path("getters.gguf"), &e) == 0, "%s", e.msg);
    if (harness_cur_failed) return;
    CHECK(gguf_n_tensors(f) == 0);
    uint32_t u32;
    uint64_t u64;
    int32_t i32;
    float f32;
    bool b;
    gguf_str s;
    const gguf_value *a;
    /* successes across types */
    CHECK(gguf_get_u64(f, "big", &u64, &e) == 0 && u64 == 1ull << 40);
    CHECK(gguf_get_u32(f, "u32max", &u32, &e) == 0 && u32 == UINT32_MAX);
    CHECK(gguf_get_i32(f, "i64", &i32, &e) == 0 && i32 == INT32_MIN);
    CHECK(gguf_get_i32(f, "neg", &i32, &e) == 0 && i32 == -5);
    CHECK(gguf_get_u32(f, "u16", &u32, &e) == 0 && u32 == 65535);
    CHECK(gguf_get_i32(f, "u16", &i32, &e) == 0 && i32 == 65535);
    CHECK(gguf_get_i32(f, "i8", &i32, &e) == 0 && i32 == -128);
    CHECK(gguf_get_f32(f, "f64", &f32, &e) == 0 && f32 == 0.1f);
    CHECK(gguf_get_bool(f, "flag", &b, &e) == 0 && !b);
    CHECK(gguf_get_arr(f, "arr", GGUF_TYPE_COUNT, &a, &e) == 0 && gguf_arr_int(a, 2) == 3);
    /* failures name the key and why */
    CHECK(gguf_get_u32(f, "big", &u32, &e) < 0 && strstr(e.msg, "big") && strstr(e.msg, "does not fit in u32"));
    CHECK(gguf_get_i32(f, "u32max", &i32, &e) < 0 && strstr(e.msg, "does not fit in i32"));
    CHECK(gguf_get_u32(f, "neg", &u32, &e) < 0 && strstr(e.msg, "-5 does not fit in u32"));
    CHECK(gguf_get_u64(f, "neg", &u64, &e) < 0 && strstr(e.msg, "neg"));
    CHECK(gguf_get_u32(f, "s", &u32, &e) < 0 && strstr(e.msg, "s has type string, expected an integer"));
    CHECK(gguf_get_u32(f, "flag", &u32, &e) < 0 && strstr(e.msg, "type bool"));
    CHECK(gguf_get_u32(f, "f64", &u32, &e) < 0 && strstr(e.msg, "type f64"));
    CHECK(gguf_get_f32(f, "neg", &f32, &e) < 0 && strstr(e.msg, "expected f32 or f64"));
    CHECK(gguf_get_f32(f, "f64big", &f32, &e) < 0 && strstr(e.msg, "does not fit in f32"));
    CHECK(gguf_get_bool(f, "neg", &b, &e) < 0 && strstr(e.msg, "expected bool"));
    CHECK(gguf_get_str(f, "neg", &s, &e) < 0 && strstr(e.msg, "expected string"));
    CHECK(gguf_get_arr(f, "neg", GGUF_TYPE_COUNT, &a, &e) < 0 && strstr(e.msg, "expected an array"));
    CHECK(gguf_get_arr(f, "arr", GGUF_TYPE_STRING, &a, &e) < 0 && strstr(e.msg, "array of u8, expected an array of string"));
    CHECK(gguf_get_u32(f, "missing.key", &u32, &e) < 0 && strstr(e.msg, "missing.key not found"));
    gguf_close(f);
}

typedef struct { gguf_writer *w; int64_t n; int part, parts; int rc; } wjob;

static void *write_part(void *arg) {
    wjob *j = arg;
    herr e;
    for (int64_t i = 0; i < j->n; i++) {
        uint64_t nb = gguf_writer_tensor_nbytes(j->w, i), lo = nb * (uint64_t)j->part / (uint64_t)j->parts,
                 hi = nb * (uint64_t)(j->part + 1) / (uint64_t)j->parts;
        uint8_t *buf = malloc(hi - lo + 1);
        for (uint64_t k = lo; k < hi; k++) buf[k - lo] = tbyte(i, k);
        if (gguf_writer_write(j->w, i, lo, buf, hi - lo, &e) < 0) j->rc = -1;
        free(buf);
    }
    return NULL;
}

TEST(writer_threads_and_checks) {
    herr e;
    gguf_writer *w = gguf_writer_new();
    fill_writer(w, 0);
    set_nested(w);
    CHECK_MSG(gguf_writer_open(w, tmp_path("threads.gguf"), &e) == 0, "%s", e.msg);
    pthread_t th[4];
    wjob jobs[4];
    for (int k = 0; k < 4; k++) {
        jobs[k] = (wjob){w, 5, k, 4, 0};
        pthread_create(&th[k], NULL, write_part, &jobs[k]);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        CHECK(jobs[k].rc == 0);
    }
    uint8_t x = 0;
    CHECK(gguf_writer_write(w, 0, 96, &x, 1, &e) < 0 && strstr(e.msg, "token_embd.weight") && strstr(e.msg, "runs past"));
    CHECK(gguf_writer_write(w, 9, 0, &x, 1, &e) < 0 && strstr(e.msg, "out of range"));
    CHECK_MSG(gguf_writer_close(w, &e) == 0, "%s", e.msg);
    gguf_writer_free(w);
    size_t na, nb;
    uint8_t *a = test_read(tmp_path("threads.gguf"), &na), *b = test_read(tmp_path("ref32.gguf"), &nb);
    CHECK(a && b && na == nb && !memcmp(a, b, na));
    free(a);
    free(b);

    /* a tensor left short is an error at close */
    w = gguf_writer_new();
    int64_t ne[] = {64};
    gguf_add_tensor(w, "w", QT_F32, 1, ne);
    CHECK_MSG(gguf_writer_open(w, tmp_path("short.gguf"), &e) == 0, "%s", e.msg);
    float z[32] = {0};
    CHECK(gguf_writer_write(w, 0, 0, z, sizeof z, &e) == 0);
    CHECK(gguf_writer_close(w, &e) < 0 && strstr(e.msg, "tensor w: 128 of 256 bytes written"));
    gguf_writer_free(w);
    /* an unwritable path */
    w = gguf_writer_new();
    CHECK(gguf_writer_open(w, "/nonexistent-dir/x.gguf", &e) < 0 && strstr(e.msg, "/nonexistent-dir/x.gguf"));
    gguf_writer_free(w);
}

/* ---- malformed files ---- */

static uint8_t *ref;  /* ref32.gguf in memory */
static size_t ref_n;

/* Opens a copy (an exact-size heap block, so ASan sees any read past the end). */
static int open_copy(const uint8_t *b, size_t n, herr *e) {
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, b, n);
    gguf_file *f;
    int rc = gguf_open_buffer(&f, c, n, e);
    if (rc == 0) gguf_close(f);
    free(c);
    return rc;
}

TEST(every_truncation_fails_cleanly) {
    herr e;
    if (!ref) SKIP("no reference file");
    gguf_file *f;
    CHECK(gguf_open_buffer(&f, ref, ref_n, &e) == 0);
    if (harness_cur_failed) return;
    const gguf_tensor *last = gguf_tensor_at(f, gguf_n_tensors(f) - 1);
    size_t data_end = (size_t)(gguf_data_offset(f) + last->offset + last->nbytes);
    gguf_close(f);
    CHECK(data_end < ref_n); /* the writer pads the end, like llama.cpp */
    /* Everything up to the last tensor's last byte is needed; the end padding is not. */
    for (size_t n = 0; n <= ref_n; n++) {
        e.msg[0] = 0;
        int rc = open_copy(ref, n, &e);
        if (n < data_end) {
            CHECK_MSG(rc < 0, "truncated to %zu bytes: opened", n);
            CHECK_MSG(strstr(e.msg, "at byte "), "truncated to %zu: %s", n, e.msg);
        } else {
            CHECK_MSG(rc == 0, "truncated to %zu bytes (data ends at %zu): %s", n, data_end, e.msg);
        }
    }
}

/* Offsets of the fields of the reference file, found by walking it the same way. */
typedef struct { size_t kv_key[32], kv_type[32], kv_val[32], ti_name[8], ti_dims[8], ti_ne[8], ti_type[8], ti_off[8]; int n_kv, n_t; } layout;

static uint64_t ld64(const uint8_t *p) { uint64_t x; memcpy(&x, p, 8); return x; }
static uint32_t ld32(const uint8_t *p) { uint32_t x; memcpy(&x, p, 4); return x; }

static size_t skip_arr(const uint8_t *b, size_t p);
static size_t skip_val(const uint8_t *b, size_t p, uint32_t t) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == GGUF_TYPE_STRING) return p + 8 + ld64(b + p);
    if (t == GGUF_TYPE_ARRAY) return skip_arr(b, p);
    return p + sz[t];
}
static size_t skip_arr(const uint8_t *b, size_t p) {
    uint32_t et = ld32(b + p);
    uint64_t n = ld64(b + p + 4);
    p += 12;
    for (uint64_t i = 0; i < n; i++) p = et == GGUF_TYPE_ARRAY ? skip_arr(b, p) : skip_val(b, p, et);
    return p;
}

static void find_layout(layout *L) {
    size_t p = 24;
    L->n_t = (int)ld64(ref + 8);
    L->n_kv = (int)ld64(ref + 16);
    for (int i = 0; i < L->n_kv; i++) {
        L->kv_key[i] = p;
        p += 8 + ld64(ref + p);
        L->kv_type[i] = p;
        uint32_t t = ld32(ref + p);
        p += 4;
        L->kv_val[i] = p;
        p = skip_val(ref, p, t);
    }
    for (int i = 0; i < L->n_t; i++) {
        L->ti_name[i] = p;
        p += 8 + ld64(ref + p);
        L->ti_dims[i] = p;
        uint32_t nd = ld32(ref + p);
        p += 4;
        L->ti_ne[i] = p;
        p += 8 * nd;
        L->ti_type[i] = p;
        p += 4;
        L->ti_off[i] = p;
        p += 8;
    }
}

/* Patches `n` bytes of `v` at `at` into a copy of ref, opens it, and checks the message. */
static void expect_bad(const char *what, size_t at, const void *v, size_t n, const char *want) {
    uint8_t *c = malloc(ref_n);
    memcpy(c, ref, ref_n);
    memcpy(c + at, v, n);
    herr e;
    e.msg[0] = 0;
    int rc = open_copy(c, ref_n, &e);
    CHECK_MSG(rc < 0, "%s: opened", what);
    CHECK_MSG(rc < 0 && strstr(e.msg, want) && strstr(e.msg, "at byte "), "%s: message '%s' lacks '%s'", what, e.msg, want);
    free(c);
}

static void put64(uint8_t *b, uint64_t x) { memcpy(b, &x, 8); }

TEST(corrupted_fields_are_named) {
    if (!ref) SKIP("no reference file");
    layout L;
    find_layout(&L);
    CHECK(L.n_kv == 16 && L.n_t == 5);
    uint64_t big = 1ull << 62, huge = UINT64_MAX;
    uint32_t u;
    uint8_t b8[8];

    expect_bad("magic", 0, "GGUX", 4, "magic: not a GGUF file");
    u = 1; expect_bad("version 1", 4, &u, 4, "version 1 is not supported");
    u = 4; expect_bad("version 4", 4, &u, 4, "version 4 is not supported");
    expect_bad("n_tensors", 8, &big, 8, "n_tensors 4611686018427387904 is more than");
    expect_bad("n_kv", 16, &huge, 8, "n_kv 18446744073709551615 is more than");
    put64(b8, 17); expect_bad("n_kv one too many", 16, b8, 8, "runs past the end");
    expect_bad("key length", L.kv_key[3], &big, 8, "kv 3: key: length 4611686018427387904 runs past the end");
    u = 13; expect_bad("value type", L.kv_type[3], &u, 4, "kv 3 (t.i32): unknown value type 13");
    u = 0x80000000u; expect_bad("value type high", L.kv_type[3], &u, 4, "unknown value type 2147483648");
    /* t.str is kv 7: its value is a string length */
    expect_bad("string length", L.kv_val[7], &huge, 8, "kv 7 (t.str): string value: length 18446744073709551615 runs past");
    /* t.arr_i16 is kv 9: element type then count */
    u = 99; expect_bad("array elem type", L.kv_val[9], &u, 4, "kv 9 (t.arr_i16): unknown array element type 99");
    expect_bad("array count", L.kv_val[9] + 4, &big, 8, "kv 9 (t.arr_i16): array count 4611686018427387904 of i16");
    expect_bad("array count wrap", L.kv_val[9] + 4, &huge, 8, "array count 18446744073709551615");
    /* t.arr_str is kv 12 */
    expect_bad("string array count", L.kv_val[12] + 4, &big, 8, "kv 12 (t.arr_str): array count 4611686018427387904 of strings");
    expect_bad("string array elem length", L.kv_val[12] + 12, &big, 8, "kv 12 (t.arr_str): element 0: string: length");
    /* t.nested is kv 15 */
    expect_bad("nested array count", L.kv_val[15] + 4, &big, 8, "kv 15 (t.nested): array count 4611686018427387904 of arrays");
    u = 42; expect_bad("nested inner type", L.kv_val[15] + 12, &u, 4, "kv 15 (t.nested): element 0: unknown array element type 42");
    /* a duplicate key: rename t.u64 (kv 4) to t.i32 (kv 3): same length */
    {
        size_t at = L.kv_key[4];
        uint64_t len = ld64(ref + at);
        CHECK(len == 5); /* "t.u64" */
        uint8_t patch[8 + 5];
        put64(patch, 5);
        memcpy(patch + 8, "t.i32", 5); /* kv 3's name */
        expect_bad("duplicate key", at, patch, sizeof patch, "kv 4 (t.i32): duplicate key (first as kv 3 at byte 106) at byte 127");
    }
    /* tensor infos */
    expect_bad("tensor name length", L.ti_name[2], &big, 8, "tensor info 2: name: length 4611686018427387904 runs past");
    u = 5; expect_bad("n_dims", L.ti_dims[1], &u, 4, "tensor info 1 (blk.0.attn_q.weight): n_dims 5 is more than 4");
    {
        int64_t z = 0, neg = -64;
        expect_bad("ne zero", L.ti_ne[0], &z, 8, "tensor info 0 (token_embd.weight): ne[0] = 0 is not positive");
        expect_bad("ne negative", L.ti_ne[0] + 8, &neg, 8, "ne[1] = -64 is not positive");
        int64_t h = INT64_MAX;
        expect_bad("ne overflow", L.ti_ne[1] + 8, &h, 8, "tensor info 1 (blk.0.attn_q.weight): element count overflows");
        int64_t odd = 65;
        expect_bad("row not blocks", L.ti_ne[1], &odd, 8, "tensor info 1 (blk.0.attn_q.weight): row length ne[0] = 65 is not a multiple");
        int64_t wide = (int64_t)1 << 61;
        expect_bad("bytes overflow", L.ti_ne[0], &wide, 8, "tensor info 0 (token_embd.weight): byte size overflows");
    }
    u = 77; expect_bad("tensor type", L.ti_type[3], &u, 4, "tensor info 3 (output_norm.weight): unknown tensor type 77");
    u = QT_COUNT + 100; expect_bad("tensor type big", L.ti_type[3], &u, 4, "unknown tensor type");
    put64(b8, 8); expect_bad("unaligned offset", L.ti_off[2], b8, 8, "tensor info 2 (blk.0.ffn_down.weight): offset 8 is not a multiple of the alignment 32");
    put64(b8, 1 << 20); expect_bad("offset past end", L.ti_off[4], b8, 8, "tensor info 4 (output.weight): offset 1048576 + 420 bytes runs past the end");
    put64(b8, UINT64_MAX - 31); expect_bad("offset wraps", L.ti_off[4], b8, 8, "tensor info 4 (output.weight): offset 18446744073709551584");
}

/* Builds small files by hand for the cases a patch of ref cannot express. */
typedef struct { uint8_t b[4096]; size_t n; } hbuf;
static void h_put(hbuf *h, const void *p, size_t n) { memcpy(h->b + h->n, p, n); h->n += n; }
static void h_u32(hbuf *h, uint32_t x) { h_put(h, &x, 4); }
static void h_u64(hbuf *h, uint64_t x) { h_put(h, &x, 8); }
static void h_str(hbuf *h, const char *s) { h_u64(h, strlen(s)); h_put(h, s, strlen(s)); }
static void h_head(hbuf *h, uint64_t n_t, uint64_t n_kv) { h->n = 0; h_u32(h, GGUF_MAGIC); h_u32(h, 3); h_u64(h, n_t); h_u64(h, n_kv); }
static void h_tinfo(hbuf *h, const char *name, uint32_t type, int64_t ne0, uint64_t off) {
    h_str(h, name); h_u32(h, 1); h_u64(h, (uint64_t)ne0); h_u32(h, type); h_u64(h, off);
}
static void h_pad(hbuf *h, size_t a) { while (h->n % a) h->b[h->n++] = 0; }

static void expect_bad_buf(const char *what, const hbuf *h, const char *want) {
    herr e;
    e.msg[0] = 0;
    int rc = open_copy(h->b, h->n, &e);
    CHECK_MSG(rc < 0, "%s: opened", what);
    CHECK_MSG(rc < 0 && strstr(e.msg, want), "%s: message '%s' lacks '%s'", what, e.msg, want);
}

TEST(hand_built_bad_files) {
    hbuf h;
    herr e;
    /* duplicate tensor names */
    h_head(&h, 2, 0);
    h_tinfo(&h, "a.weight", QT_F32, 8, 0);
    h_tinfo(&h, "a.weight", QT_F32, 8, 32);
    h_pad(&h, 32);
    memset(h.b + h.n, 0, 64); h.n += 64;
    expect_bad_buf("dup tensor", &h, "tensor info 1 (a.weight): duplicate tensor name (first as tensor info 0) at byte 64");
    /* the same file with distinct names opens */
    h.b[24 + 8] = 'b';
    CHECK_MSG(open_copy(h.b, h.n, &e) == 0, "%s", e.msg);

    /* alignment: wrong type, zero, not a power of two; a good 64 moves the data */
    h_head(&h, 0, 1); h_str(&h, "general.alignment"); h_u32(&h, GGUF_TYPE_UINT64); h_u64(&h, 32);
    expect_bad_buf("alignment type", &h, "general.alignment): type u64, expected u32 at byte 24");
    h_head(&h, 0, 1); h_str(&h, "general.alignment"); h_u32(&h, GGUF_TYPE_UINT32); h_u32(&h, 0);
    expect_bad_buf("alignment 0", &h, "0 is not a power of two");
    h_head(&h, 0, 1); h_str(&h, "general.alignment"); h_u32(&h, GGUF_TYPE_UINT32); h_u32(&h, 96);
    expect_bad_buf("alignment 96", &h, "96 is not a power of two");

    /* nesting: 8 levels open, 9 do not */
    for (int depth = 8; depth <= 9; depth++) {
        h_head(&h, 0, 1); h_str(&h, "deep"); h_u32(&h, GGUF_TYPE_ARRAY);
        for (int d = 1; d < depth; d++) { h_u32(&h, GGUF_TYPE_ARRAY); h_u64(&h, 1); }
        h_u32(&h, GGUF_TYPE_UINT8); h_u64(&h, 1); h.b[h.n++] = 5;
        int rc = open_copy(h.b, h.n, &e);
        if (depth == 8) CHECK_MSG(rc == 0, "depth 8: %s", e.msg);
        else CHECK_MSG(rc < 0 && strstr(e.msg, "kv 0 (deep)") && strstr(e.msg, "nested deeper than 8"), "depth 9: %s", e.msg);
    }
    /* a huge array of empty arrays: bounded by the bytes left, allocates nothing absurd */
    h_head(&h, 0, 1); h_str(&h, "k"); h_u32(&h, GGUF_TYPE_ARRAY); h_u32(&h, GGUF_TYPE_ARRAY); h_u64(&h, 1ull << 40);
    expect_bad_buf("array of arrays count", &h, "array count 1099511627776 of arrays");
    /* a tensor name with a NUL, and one too long for llama.cpp */
    h_head(&h, 1, 0); h_u64(&h, 3); h_put(&h, "a\0b", 3); h_u32(&h, 1); h_u64(&h, 8); h_u32(&h, 0); h_u64(&h, 0);
    h_pad(&h, 32); memset(h.b + h.n, 0, 32); h.n += 32;
    expect_bad_buf("NUL in name", &h, "name contains a NUL byte");
    char longname[80];
    memset(longname, 'x', 64); longname[64] = 0;
    h_head(&h, 1, 0); h_tinfo(&h, longname, QT_F32, 8, 0); h_pad(&h, 32); memset(h.b + h.n, 0, 32); h.n += 32;
    expect_bad_buf("long name", &h, "name is 64 bytes, the limit is 63");
    /* padding to the data section missing */
    h_head(&h, 1, 0); h_tinfo(&h, "t", QT_F32, 8, 0);
    expect_bad_buf("no padding", &h, "data section: padding to alignment 32 runs past the end");
    /* invalid UTF-8 in keys and values is allowed */
    h_head(&h, 0, 1); h_str(&h, "k\xff\xfe"); h_u32(&h, GGUF_TYPE_STRING); h_str(&h, "\xc3\x28");
    CHECK_MSG(open_copy(h.b, h.n, &e) == 0, "invalid UTF-8: %s", e.msg);
    /* version 2 is read like 3 */
    h_head(&h, 0, 0); memcpy(h.b + 4, &(uint32_t){2}, 4);
    CHECK_MSG(open_copy(h.b, h.n, &e) == 0, "v2: %s", e.msg);
    /* a directory and a missing file */
    gguf_file *f;
    CHECK(gguf_open(&f, tmpdir, &e) < 0 && strstr(e.msg, "not a regular file"));
    CHECK(gguf_open(&f, tmp_path("missing.gguf"), &e) < 0 && strstr(e.msg, "missing.gguf"));
    /* an empty file */
    FILE *fp = fopen(tmp_path("empty.gguf"), "wb");
    fclose(fp);
    CHECK(gguf_open(&f, tmp_path("empty.gguf"), &e) < 0 && strstr(e.msg, "magic: needs 4 bytes"));
}

/* The fuzzer's finds, kept: each must open or fail without a crash. */
TEST(fuzz_regressions) {
    DIR *d = opendir("tests/fuzz/regress/gguf");
    if (!d) SKIP("tests/fuzz/regress/gguf not found (run from the repo root)");
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 4 || strcmp(de->d_name + len - 4, ".bin")) continue;
        char path[512];
        snprintf(path, sizeof path, "tests/fuzz/regress/gguf/%s", de->d_name);
        size_t nb;
        uint8_t *b = test_read(path, &nb);
        herr e;
        CHECK(b != NULL);
        if (b) open_copy(b, nb, &e);
        free(b);
        n++;
    }
    closedir(d);
    if (!n) SKIP("no regression inputs");
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_gguf.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(round_trip_default_alignment);
    RUN(round_trip_alignment_64);
    RUN(rewrite_is_byte_identical);
    RUN(getter_conversions_and_errors);
    RUN(writer_threads_and_checks);
    ref = test_read(tmp_path("ref32.gguf"), &ref_n);
    RUN(every_truncation_fails_cleanly);
    RUN(corrupted_fields_are_named);
    RUN(hand_built_bad_files);
    RUN(fuzz_regressions);
    free(ref);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return harness_done();
}
