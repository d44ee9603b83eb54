/* gguf.h: GGUF v3 files, read through mmap with every count, length, offset and size
 * checked against the file (a malformed file is an error naming the field and its byte
 * offset), and written streaming so that a 20 GB model is never held in memory. */
#ifndef HEARTH_GGUF_H
#define HEARTH_GGUF_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "base/util.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_VERSION 3
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

enum gguf_type {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12, GGUF_TYPE_COUNT
};
const char *gguf_type_name(uint32_t t);

/* A string inside the mapped file: not NUL-terminated. */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

/* A metadata value. Scalars are decoded; arrays point into the file. */
typedef struct gguf_value {
    uint32_t type;              /* enum gguf_type */
    union {
        uint64_t u64;           /* any unsigned integer type, and bool (0/1) */
        int64_t i64;            /* any signed integer type */
        double f64;             /* FLOAT32 and FLOAT64 */
        gguf_str str;
        struct {
            uint32_t type;      /* element type */
            uint64_t n;         /* element count */
            const void *data;   /* packed little-endian scalars (non-string, non-array) */
            const gguf_str *strs;            /* n strings when type == STRING */
            const struct gguf_value *elems;  /* n nested values when type == ARRAY */
        } arr;
    } v;
} gguf_value;

typedef struct gguf_kv {
    gguf_str key;
    gguf_value val;
    uint64_t offset;            /* byte offset of the key in the file (for messages) */
} gguf_kv;

typedef struct gguf_tensor {
    char *name;                 /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];  /* ggml order: ne[0] is the row length; unused dims are 1 */
    uint32_t type;              /* ggml type id (quant.h) */
    uint64_t offset;            /* relative to the data section */
    uint64_t nbytes;
    const void *data;           /* into the mapping */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Opens and validates a GGUF file. On error returns -1 and e names what was wrong. */
int gguf_open(gguf_file **out, const char *path, herr *e);
/* The same over bytes already in memory (the fuzz target, tests); buf must outlive it. */
int gguf_open_buffer(gguf_file **out, const void *buf, size_t size, herr *e);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_alignment(const gguf_file *f);
uint64_t gguf_data_offset(const gguf_file *f);
uint64_t gguf_file_size(const gguf_file *f);

int64_t gguf_n_kv(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i);
const gguf_value *gguf_find(const gguf_file *f, const char *key); /* NULL if absent */

/* Typed getters: 0 on success; -1 with e naming the key when absent or of a type that
 * does not convert exactly (any integer type that fits converts; floats from F32/F64). */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, herr *e);
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, herr *e);
int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, herr *e);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, herr *e);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out, herr *e);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, herr *e);
/* An array whose elements have type elem_type (GGUF_TYPE_COUNT = any). */
int gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, const gguf_value **out, herr *e);
/* Element i of a numeric array as an integer or float (the array type must be numeric). */
int64_t gguf_arr_int(const gguf_value *arr, uint64_t i);
double gguf_arr_float(const gguf_value *arr, uint64_t i);
bool gguf_str_eq(gguf_str s, const char *c);

int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL if absent */

/* ---- writing ---- */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
/* Metadata, in the order added (a key added twice replaces the earlier value). */
void gguf_set_u8(gguf_writer *w, const char *key, uint8_t v);
void gguf_set_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_set_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_set_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_set_f32(gguf_writer *w, const char *key, float v);
void gguf_set_bool(gguf_writer *w, const char *key, bool v);
void gguf_set_str(gguf_writer *w, const char *key, const char *v);
void gguf_set_arr_data(gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n);
void gguf_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
/* Copies one value (any type, nested arrays too) from a read file: round trips. */
void gguf_set_value(gguf_writer *w, const char *key, const gguf_value *v);
/* Declares a tensor; data offsets follow declaration order, each aligned. Returns its index. */
int64_t gguf_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne);

/* Writes header, metadata and tensor infos to path, then sizes the file to its final
 * length. Tensor data is then written with gguf_writer_write (any order, any thread:
 * pwrite at the tensor's offset). gguf_writer_close checks every byte was written. */
int gguf_writer_open(gguf_writer *w, const char *path, herr *e);
uint64_t gguf_writer_tensor_nbytes(const gguf_writer *w, int64_t i);
/* Writes n bytes at byte offset off inside tensor i. Thread-safe. */
int gguf_writer_write(gguf_writer *w, int64_t i, uint64_t off, const void *data, uint64_t n, herr *e);
int gguf_writer_close(gguf_writer *w, herr *e);

#endif
