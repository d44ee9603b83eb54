/* fuzz.h: what the libFuzzer targets share: the vocabulary fixtures (gunzipped once per
 * process), cutting an input at its first NUL byte (a target that takes two texts reads
 * "first\0second"), and a failure that names the property broken. FUZZ_ROOT is the repo
 * root, baked in by the Makefile so that a target runs from any directory. */
#ifndef HEARTH_FUZZ_H
#define HEARTH_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "text/tokenizer.h"

#ifndef FUZZ_ROOT
#define FUZZ_ROOT "."
#endif

/* A broken property (not bad input): print it and crash, so libFuzzer keeps the input. */
#define FUZZ_CHECK(cond, ...)                                                          \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* tests/fixtures/vocab/NAME.gz ("ggml-vocab-qwen35.gguf") as a tokenizer; exits on failure
 * (a broken fixture is no finding). */
static inline tokenizer *fuzz_vocab(const char *name) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s/tests/fixtures/vocab/%s.gz'", FUZZ_ROOT, name);
    FILE *p = popen(cmd, "r");
    if (!p) { perror("popen gzip"); exit(1); }
    size_t cap = 4 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + len, 1, cap - len, p)) > 0) {
        len += k;
        if (len == cap) buf = realloc(buf, cap *= 2);
    }
    if (pclose(p) != 0 || !buf || !len) { fprintf(stderr, "fuzz: cannot unpack %s\n", cmd); exit(1); }
    gguf_file *g;
    tokenizer *t;
    herr e;
    if (gguf_open_buffer(&g, buf, len, &e) < 0 || tokenizer_load(&t, g, &e) < 0) {
        fprintf(stderr, "fuzz: %s: %s\n", name, e.msg);
        exit(1);
    }
    gguf_close(g);
    free(buf);
    return t;
}

/* A copy of data[0..size) as a NUL-terminated string, cut at the first NUL; *rest and
 * *rest_len get what follows that NUL (NULL and 0 when there is none). */
static inline char *fuzz_cut(const uint8_t *data, size_t size, const uint8_t **rest, size_t *rest_len) {
    const uint8_t *z = memchr(data, 0, size);
    size_t n = z ? (size_t)(z - data) : size;
    char *s = malloc(n + 1);
    memcpy(s, data, n);
    s[n] = 0;
    *rest = z ? z + 1 : NULL;
    *rest_len = z ? size - n - 1 : 0;
    return s;
}

#endif
