/* fuzz_safetensors.c: libFuzzer target for the .safetensors reader (st_open_buffer): when
 * the input parses, every tensor's bytes must lie inside the input and match its dtype and
 * shape, and convert's reads (st_read_f32) of the first and last elements must work or be
 * refused by name. Seeds: tests/fuzz/corpus/safetensors (from the hf_tiny fixture and
 * hand-made headers). */
#include <stdint.h>
#include <string.h>

#include "fuzz.h"
#include "format/safetensors.h"

static volatile float sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file *f;
    herr e;
    if (st_open_buffer(&f, data, size, "fuzz.safetensors", &e) < 0) {
        FUZZ_CHECK(strstr(e.msg, "fuzz.safetensors: ") == e.msg, "the error does not name the file: %s", e.msg);
        return 0;
    }
    float buf[64];
    for (int64_t i = 0; i < st_n_tensors(f); i++) {
        const st_tensor *t = st_tensor_at(f, i);
        FUZZ_CHECK(t->data >= data && t->nbytes <= size && t->data - data <= (ptrdiff_t)(size - t->nbytes),
                   "tensor %s's bytes leave the input", t->name);
        FUZZ_CHECK(t->nbytes == (uint64_t)t->numel * st_dtype_size(t->dtype), "tensor %s: bytes vs dtype x shape", t->name);
        int64_t numel = 1;
        for (int d = 0; d < t->n_dims; d++) numel *= t->shape[d];
        FUZZ_CHECK(numel == t->numel, "tensor %s: numel is not the shape's product", t->name);
        const int64_t n = t->numel < 64 ? t->numel : 64;
        if (st_read_f32(t, 0, n, buf, &e) == 0) {
            for (int64_t k = 0; k < n; k++) sink += buf[k];
            st_read_f32(t, t->numel - n, n, buf, &e);
            for (int64_t k = 0; k < n; k++) sink += buf[k];
        } else {
            FUZZ_CHECK(strstr(e.msg, t->name) != NULL, "a refused read does not name the tensor: %s", e.msg);
        }
    }
    FUZZ_CHECK(st_tensor_at(f, st_n_tensors(f)) == NULL && st_tensor_at(f, -1) == NULL, "st_tensor_at out of range");
    st_close(f);
    return 0;
}
