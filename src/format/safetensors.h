/* safetensors.h: Hugging Face .safetensors files, read through mmap: an 8-byte little-endian
 * header length, a JSON header (name -> {dtype, shape, data_offsets}), then the data. The
 * file is untrusted input: every entry's dtype, shape and offsets are checked against the
 * file at open, and an error names the file, the tensor and the field. */
#ifndef HEARTH_SAFETENSORS_H
#define HEARTH_SAFETENSORS_H

#include <stdint.h>
#include <stddef.h>
#include "base/util.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER ((uint64_t)100 << 20) /* the format's own limit on the JSON header */

typedef enum st_dtype {
    ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL,
    ST_F8_E4M3, ST_F8_E5M2, ST_U16, ST_U32, ST_U64, ST_DTYPE_COUNT
} st_dtype;

const char *st_dtype_name(st_dtype t);
size_t st_dtype_size(st_dtype t);

typedef struct st_tensor {
    char *name;                 /* as stored (NUL-terminated copy) */
    st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS]; /* PyTorch order: shape[n_dims-1] is contiguous */
    int64_t numel;
    const uint8_t *data;        /* into the mapping */
    uint64_t nbytes;
} st_tensor;

typedef struct st_file st_file;

int st_open(st_file **out, const char *path, herr *e);
/* The same over bytes in memory (not copied: buf must outlive f); name stands for the path
 * in messages. The fuzz target's entry (tests/fuzz/fuzz_safetensors.c). */
int st_open_buffer(st_file **out, const void *buf, size_t size, const char *name, herr *e);
void st_close(st_file *f);
const char *st_path(const st_file *f);
int64_t st_n_tensors(const st_file *f);
const st_tensor *st_tensor_at(const st_file *f, int64_t i);

/* Elements [off, off + n) of a F32, F16 or BF16 tensor as floats (exact widening);
 * -1 naming the tensor for any other dtype. The range must be inside the tensor. */
int st_read_f32(const st_tensor *t, int64_t off, int64_t n, float *dst, herr *e);

#endif
