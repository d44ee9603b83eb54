/* inspect.c: `hearth inspect FILE`: the header, every metadata key with its type and value
 * (arrays and long strings abridged), and the tensor table with totals by type. Reads only
 * the header pages of the mapping, so it is instant on a 20 GB model. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "model/model.h"

#define STR_SHOWN 80     /* bytes of a long string shown before "..." */
#define ARR_SHOWN 6      /* elements of an array shown */

static const arg_cmd inspect_cmd = {
    .name = "inspect",
    .usage = "hearth inspect FILE",
    .about = "Prints a GGUF file's header, every metadata key with its type and value (arrays\n"
             "and long strings abridged) and the tensor table: name, type, shape (ggml order,\n"
             "ne[0] first), bytes, with totals of bytes and parameters and a count by type.\n"
             "Exits 1 with a message naming the field and its byte offset if the file is malformed.\n",
    .opts = (const arg_opt[]){ARG_END},
    .pos_name = "FILE",
    .max_pos = 1,
};

/* A string quoted, with escapes for quotes, backslashes and control bytes; UTF-8 passes. */
static void put_quoted(const char *p, uint64_t n, uint64_t max) {
    putchar('"');
    uint64_t shown = n < max ? n : max;
    for (uint64_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
    if (n > max) printf("... (%" PRIu64 " bytes)", n);
}

/* The shortest decimal that reads back as the same float (1e-06, not 9.99999997e-07). */
static void put_f32(double d) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, d);
        if ((float)strtod(buf, NULL) == (float)d) break;
    }
    fputs(buf, stdout);
}

/* Bytes as they are, but control bytes escaped: a hostile key cannot drive the terminal. */
static void put_raw(const char *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

static void put_scalar(const gguf_value *v) {
    switch (v->type) {
    case GGUF_TYPE_BOOL: fputs(v->v.u64 ? "true" : "false", stdout); break;
    case GGUF_TYPE_FLOAT32: put_f32(v->v.f64); break;
    case GGUF_TYPE_FLOAT64: printf("%.17g", v->v.f64); break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        printf("%" PRId64, v->v.i64);
        break;
    default: printf("%" PRIu64, v->v.u64); break;
    }
}

/* "[type x n] e0, e1, ..." with nested arrays shown the same way, bracketed. */
static void put_array(const gguf_value *v) {
    uint32_t et = v->v.arr.type;
    uint64_t n = v->v.arr.n;
    printf("[%s x %" PRIu64 "]", gguf_type_name(et), n);
    for (uint64_t i = 0; i < n && i < ARR_SHOWN; i++) {
        fputs(i ? ", " : " ", stdout);
        if (et == GGUF_TYPE_STRING) {
            put_quoted(v->v.arr.strs[i].ptr, v->v.arr.strs[i].len, 40);
        } else if (et == GGUF_TYPE_ARRAY) {
            putchar('(');
            put_array(&v->v.arr.elems[i]);
            putchar(')');
        } else if (et == GGUF_TYPE_FLOAT32) {
            put_f32(gguf_arr_float(v, i));
        } else if (et == GGUF_TYPE_FLOAT64) {
            printf("%.17g", gguf_arr_float(v, i));
        } else if (et == GGUF_TYPE_BOOL) {
            fputs(gguf_arr_int(v, i) ? "true" : "false", stdout);
        } else if (et == GGUF_TYPE_UINT64) {
            printf("%" PRIu64, (uint64_t)gguf_arr_int(v, i));
        } else {
            printf("%" PRId64, gguf_arr_int(v, i));
        }
    }
    if (n > ARR_SHOWN) fputs(", ...", stdout);
}

static void put_value(const gguf_value *v) {
    if (v->type == GGUF_TYPE_ARRAY) {
        put_array(v);
    } else if (v->type == GGUF_TYPE_STRING) {
        printf("string ");
        put_quoted(v->v.str.ptr, v->v.str.len, STR_SHOWN);
    } else {
        printf("%s ", gguf_type_name(v->type));
        put_scalar(v);
    }
}

static void put_shape(const gguf_tensor *t, char *buf, size_t cap) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    uint32_t nd = t->n_dims ? t->n_dims : 1;
    for (uint32_t j = 0; j < nd && k < cap; j++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, j ? ", " : "", t->ne[j]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* The multi-token-prediction block of a qwen35moe file, from its tensors: what --spec-mtp
 * needs, or why there is none (a file of another architecture says nothing here). */
static void print_mtp(const gguf_file *f) {
    model_hparams hp;
    herr e;
    if (model_hparams_read(f, &hp, &e) < 0) return;
    if (hp.n_layer_nextn == 0) {
        printf("mtp: none (nextn_predict_layers 0)\n");
        return;
    }
    if (hp.n_layer_nextn > 1) {
        printf("mtp: %" PRId64 " blocks; hearth reads one only and ignores these\n", hp.n_layer_nextn);
        return;
    }
    tensor_spec *s;
    const int64_t n = model_tensor_specs(&hp, &s);
    int64_t want = 0, found = 0;
    uint64_t bytes = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!model_spec_is_mtp(&hp, &s[i])) continue;
        const gguf_tensor *t = gguf_find_tensor(f, s[i].name);
        want++;
        if (t) found++, bytes += t->nbytes;
    }
    free(s);
    if (found == 0)
        printf("mtp: none (nextn_predict_layers 1, but no blk.%" PRId64 " tensors)\n", hp.n_layer);
    else if (found < want)
        printf("mtp: broken: %" PRId64 " of the block's %" PRId64 " tensors (blk.%" PRId64 "); the file will not load\n", found, want,
               hp.n_layer);
    else
        printf("mtp: 1 block, blk.%" PRId64 " (%" PRId64 " tensors, %.2f MiB): drafts for --spec-mtp\n", hp.n_layer, found,
               (double)bytes / (1024.0 * 1024.0));
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int n_pos, rc = args_parse(&inspect_cmd, argc, argv, &path, &n_pos);
    if (rc != ARGS_RUN) return rc;
    if (!path) {
        fprintf(stderr, "hearth inspect: FILE is required\n");
        args_usage(&inspect_cmd, stderr);
        return 2;
    }
    gguf_file *f;
    herr e;
    if (gguf_open(&f, path, &e) < 0) {
        fprintf(stderr, "hearth inspect: %s\n", e.msg);
        return 1;
    }
    uint64_t size = gguf_file_size(f);
    printf("file:         %s\n", path);
    printf("size:         %" PRIu64 " bytes (%.2f MiB)\n", size, (double)size / (1024.0 * 1024.0));
    printf("version:      %u\n", gguf_version(f));
    printf("alignment:    %" PRIu64 "\n", gguf_alignment(f));
    printf("data offset:  %" PRIu64 "\n", gguf_data_offset(f));
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch, &e) == 0)
        printf("architecture: %.*s\n", (int)(arch.len < 64 ? arch.len : 64), arch.ptr);
    else
        printf("architecture: (none: %s)\n", e.msg);

    printf("\nmetadata: %" PRId64 " keys\n", gguf_n_kv(f));
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        fputs("  ", stdout);
        put_raw(kv->key.ptr, kv->key.len);
        fputs(": ", stdout);
        put_value(&kv->val);
        putchar('\n');
    }

    int64_t nt = gguf_n_tensors(f);
    printf("\ntensors: %" PRId64 "\n", nt);
    printf("  %-40s %-6s %-28s %14s\n", "name", "type", "shape", "bytes");
    uint64_t total_bytes = 0, total_params = 0;
    uint64_t by_type[QT_COUNT] = {0}, by_type_bytes[QT_COUNT] = {0};
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char shape[128];
        put_shape(t, shape, sizeof shape);
        printf("  %-40s %-6s %-28s %14" PRIu64 "\n", t->name, qtype_name(t->type), shape, t->nbytes);
        uint64_t params = 1;
        for (int j = 0; j < GGUF_MAX_DIMS; j++) params *= (uint64_t)t->ne[j]; /* checked by the reader */
        total_params += params;
        total_bytes += t->nbytes;
        if (t->type < QT_COUNT) {
            by_type[t->type]++;
            by_type_bytes[t->type] += t->nbytes;
        }
    }
    printf("\ntotal: %" PRIu64 " bytes (%.2f MiB), %" PRIu64 " parameters (%.3f B)\n", total_bytes,
           (double)total_bytes / (1024.0 * 1024.0), total_params, (double)total_params / 1e9);
    printf("by type:");
    for (uint32_t t = 0; t < QT_COUNT; t++)
        if (by_type[t]) printf(" %s %" PRIu64 " (%.2f MiB)", qtype_name(t), by_type[t], (double)by_type_bytes[t] / (1024.0 * 1024.0));
    printf("\n");
    print_mtp(f);
    gguf_close(f);
    return 0;
}
