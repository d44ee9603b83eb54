/* safetensors.c: the .safetensors reader (mmap + cJSON over the header). Checks at open:
 * the header length against the file and the format's 100 MiB limit, the header is a JSON
 * object, every entry has a known dtype, a shape of non-negative integers whose byte size
 * does not overflow, and data_offsets [begin, end] inside the data section whose length is
 * exactly that byte size. Nothing is trusted after that because nothing else is read. */
#include "format/safetensors.h"
#include "format/quant.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct st_file {
    char *path;
    void *map;
    size_t map_size;
    int64_t n;
    st_tensor *tensors;
};

static const struct { const char *name; size_t size; } dtypes[ST_DTYPE_COUNT] = {
    [ST_F64] = {"F64", 8}, [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4}, [ST_I16] = {"I16", 2}, [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1}, [ST_BOOL] = {"BOOL", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_U16] = {"U16", 2}, [ST_U32] = {"U32", 4}, [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].name : "?"; }
size_t st_dtype_size(st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].size : 0; }

/* a JSON number that is a whole number in [0, 2^53) (exact in a double) */
static bool json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d < 9007199254740992.0) || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

static int parse_entry(st_file *f, const cJSON *j, uint64_t data_size, const uint8_t *data, st_tensor *t, herr *e) {
    const char *nm = j->string;
    if (!cJSON_IsObject(j)) return herr_set(e, "tensor %.200s: entry is not a JSON object", nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt)) return herr_set(e, "tensor %.200s: dtype is missing or not a string", nm);
    int k = 0;
    for (; k < ST_DTYPE_COUNT; k++)
        if (!strcmp(dt->valuestring, dtypes[k].name)) break;
    if (k == ST_DTYPE_COUNT) return herr_set(e, "tensor %.200s: unknown dtype \"%.32s\"", nm, dt->valuestring);
    t->dtype = (st_dtype)k;
    if (!cJSON_IsArray(sh)) return herr_set(e, "tensor %.200s: shape is missing or not an array", nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS) return herr_set(e, "tensor %.200s: shape has %d dims, at most %d are read", nm, nd, ST_MAX_DIMS);
    t->n_dims = nd;
    uint64_t numel = 1;
    for (int d = 0; d < nd; d++) {
        uint64_t v;
        if (!json_u64(cJSON_GetArrayItem(sh, d), &v) || v > ((uint64_t)1 << 40))
            return herr_set(e, "tensor %.200s: shape[%d] is not a dimension (a whole number in [0, 2^40])", nm, d);
        t->shape[d] = (int64_t)v;
        if (!mul_u64(numel, v, &numel)) return herr_set(e, "tensor %.200s: shape overflows", nm);
    }
    uint64_t nbytes;
    if (!mul_u64(numel, dtypes[k].size, &nbytes) || numel > (uint64_t)INT64_MAX)
        return herr_set(e, "tensor %.200s: byte size overflows", nm);
    uint64_t b, en;
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 || !json_u64(cJSON_GetArrayItem(of, 0), &b) ||
        !json_u64(cJSON_GetArrayItem(of, 1), &en))
        return herr_set(e, "tensor %.200s: data_offsets is not a pair of byte offsets", nm);
    if (b > en) return herr_set(e, "tensor %.200s: data_offsets [%" PRIu64 ", %" PRIu64 "] run backwards", nm, b, en);
    if (en > data_size)
        return herr_set(e, "tensor %.200s: data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of the data (%" PRIu64
                        " bytes: the file is truncated or the header is wrong)", nm, b, en, data_size);
    if (en - b != nbytes)
        return herr_set(e, "tensor %.200s: data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64 " bytes, but %s of %" PRIu64
                        " elements needs %" PRIu64, nm, b, en, en - b, dtypes[k].name, numel, nbytes);
    t->name = xstrdup(nm);
    t->numel = (int64_t)numel;
    t->data = data + b;
    t->nbytes = nbytes;
    (void)f;
    return 0;
}

/* The header and entries of the bytes p[0..size) (at least 8), into f. */
static int parse(st_file *f, const uint8_t *p, uint64_t size, herr *e) {
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)p[i] << (8 * i);
    if (hlen > size - 8)
        return herr_set(e, "header length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)", hlen, size);
    if (hlen > ST_MAX_HEADER)
        return herr_set(e, "header length %" PRIu64 " exceeds the format's limit of %" PRIu64 " bytes", hlen, ST_MAX_HEADER);
    cJSON *root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        herr_set(e, "the %" PRIu64 "-byte header is not a JSON object", hlen);
        goto out;
    }
    const uint8_t *data = p + 8 + hlen;
    const uint64_t data_size = size - 8 - hlen;
    int n = cJSON_GetArraySize(root);
    f->tensors = xcalloc((size_t)(n > 0 ? n : 1), sizeof *f->tensors);
    for (const cJSON *j = root->child; j; j = j->next) {
        if (!j->string) { herr_set(e, "header entry without a name"); goto out; }
        if (!strcmp(j->string, "__metadata__")) continue;
        if (parse_entry(f, j, data_size, data, &f->tensors[f->n], e) < 0) goto out;
        f->n++;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int st_open_buffer(st_file **out, const void *buf, size_t size, const char *name, herr *e) {
    *out = NULL;
    if (size < 8) return herr_set(e, "%s: %zu bytes is too short for a safetensors header", name, size);
    st_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(name);
    if (parse(f, buf, size, e) < 0) {
        herr_wrap(e, "%s", name);
        st_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

int st_open(st_file **out, const char *path, herr *e) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return herr_set(e, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return herr_set(e, "%s: not a regular file", path);
    }
    const uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return herr_set(e, "%s: %" PRIu64 " bytes is too short for a safetensors header", path, size);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return herr_set(e, "%s: mmap: %s", path, strerror(errno));
    st_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    f->map = map;
    f->map_size = (size_t)size;
    if (parse(f, map, size, e) < 0) {
        herr_wrap(e, "%s", path);
        st_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

void st_close(st_file *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->map) munmap(f->map, f->map_size);
    free(f->path);
    free(f);
}

const char *st_path(const st_file *f) { return f->path; }
int64_t st_n_tensors(const st_file *f) { return f->n; }
const st_tensor *st_tensor_at(const st_file *f, int64_t i) { return i >= 0 && i < f->n ? &f->tensors[i] : NULL; }

int st_read_f32(const st_tensor *t, int64_t off, int64_t n, float *dst, herr *e) {
    HEARTH_CHECK(off >= 0 && n >= 0 && off + n <= t->numel);
    const uint8_t *s = t->data;
    switch (t->dtype) {
    case ST_F32:
        memcpy(dst, s + 4 * off, sizeof(float) * (size_t)n); /* little-endian hosts only */
        return 0;
    case ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * (off + i), 2);
            dst[i] = f16_to_f32(h);
        }
        return 0;
    case ST_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * (off + i), 2);
            dst[i] = bf16_to_f32(h);
        }
        return 0;
    default:
        return herr_set(e, "tensor %s has dtype %s: convert reads F32, F16 and BF16 (dequantize the checkpoint first)",
                        t->name, st_dtype_name(t->dtype));
    }
}
