/* fuzz_gguf.c: libFuzzer target for the GGUF reader. Opens the input as a buffer and, when
 * it parses, touches everything a caller could: every kv (nested arrays too), every getter,
 * every tensor's bytes, and the lookups. Built by `make fuzz` (clang, ASan + UBSan). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "format/gguf.h"

static volatile uint64_t sink; /* keeps the reads from being optimised away */

static void walk_value(const gguf_value *v) {
    if (v->type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < v->v.str.len; i++) sink += (unsigned char)v->v.str.ptr[i];
        return;
    }
    if (v->type != GGUF_TYPE_ARRAY) {
        sink += v->v.u64;
        return;
    }
    uint32_t et = v->v.arr.type;
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        if (et == GGUF_TYPE_STRING) {
            gguf_str s = v->v.arr.strs[i];
            if (s.len) sink += (unsigned char)s.ptr[0] + (unsigned char)s.ptr[s.len - 1];
        } else if (et == GGUF_TYPE_ARRAY) {
            walk_value(&v->v.arr.elems[i]);
        } else {
            sink += (uint64_t)gguf_arr_int(v, i);
            double d = gguf_arr_float(v, i);
            sink += d == d;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f;
    herr e;
    if (gguf_open_buffer(&f, data, size, &e) < 0) {
        sink += strlen(e.msg);
        return 0;
    }
    sink += gguf_version(f) + gguf_alignment(f) + gguf_data_offset(f) + gguf_file_size(f);
    char key[256];
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        walk_value(&kv->val);
        snprintf(key, sizeof key, "%.*s", (int)(kv->key.len < 200 ? kv->key.len : 200), kv->key.ptr);
        uint32_t u32; uint64_t u64; int32_t i32; float f32; bool b; gguf_str s; const gguf_value *arr;
        sink += gguf_get_u32(f, key, &u32, &e) + gguf_get_u64(f, key, &u64, &e) + gguf_get_i32(f, key, &i32, &e) +
                gguf_get_f32(f, key, &f32, &e) + gguf_get_bool(f, key, &b, &e) + gguf_get_str(f, key, &s, &e) +
                gguf_get_arr(f, key, GGUF_TYPE_COUNT, &arr, &e) + gguf_get_arr(f, key, GGUF_TYPE_STRING, &arr, &e);
        sink += gguf_find(f, key) != NULL;
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const uint8_t *p = t->data;
        if (t->nbytes) sink += p[0] + p[t->nbytes - 1];
        if (gguf_find_tensor(f, t->name) != t) __builtin_trap();
    }
    sink += gguf_find_tensor(f, "missing") != NULL;
    gguf_close(f);
    return 0;
}
