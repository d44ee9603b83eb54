/* fuzz_tokenizer.c: libFuzzer target for the BPE tokenizer on any bytes. The first byte
 * picks the vocabulary (bit 0: Qwen2's pre-tokenizer, else Qwen3.5's; the fixtures of
 * tests/fixtures/vocab) and whether special tokens are parsed (bit 1); the rest is the
 * text. Properties: every id is in the vocabulary, the count does not depend on the output
 * room asked for, and the streaming decoder gives back the input bytes (byte-level BPE loses
 * nothing, special tokens included) up to one rewrite the tokenizer makes on purpose, as
 * llama.cpp does: each UTF-8 sequence is read as a code point and written again, so an
 * overlong form comes back short and a bad byte as U+FFFD. Seeds: tests/fuzz/corpus/tokenizer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "text/unicode.h"

static tokenizer *toks[2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    toks[0] = fuzz_vocab("ggml-vocab-qwen35.gguf");
    toks[1] = fuzz_vocab("ggml-vocab-qwen2.gguf");
    return 0;
}

/* text with every UTF-8 sequence decoded and encoded again (utf8_decode's reading) */
static char *normalized(const uint8_t *s, size_t n, size_t *out_len) {
    char *r = malloc(3 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) k += (size_t)utf8_encode(utf8_decode(s, n, &i), (uint8_t *)r + k);
    *out_len = k;
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const tokenizer *t = toks[data[0] & 1];
    const bool special = data[0] & 2;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    int64_t n;
    int32_t *ids = tokenizer_encode_alloc(t, text, len, special, &n);
    FUZZ_CHECK(n >= 0 && (size_t)n <= 3 * len, "%lld ids for %zu bytes", (long long)n, len);
    int32_t few[4];
    FUZZ_CHECK(tokenizer_encode(t, text, len, special, few, 4) == n, "the count depends on cap");
    const int32_t V = tokenizer_n_vocab(t);
    tokdec d;
    tokdec_init(&d, t);
    size_t want_len;
    char *want = normalized(data + 1, len, &want_len);
    char *back = malloc(want_len + 1), piece[64];
    size_t nb = 0;
    for (int64_t i = 0; i < n; i++) {
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < V, "id %d outside [0, %d)", ids[i], V);
        if (!special) FUZZ_CHECK(!(tokenizer_attr(t, ids[i]) & TOK_ATTR_CONTROL), "control token %d from plain text", ids[i]);
        /* a small buffer on purpose: what does not fit comes out on a later call */
        const size_t k = tokdec_push(&d, ids[i], piece, sizeof piece);
        FUZZ_CHECK(nb + k <= want_len, "decoded more bytes than the input's %zu", want_len);
        memcpy(back + nb, piece, k);
        nb += k;
    }
    size_t k;
    while ((k = tokdec_flush(&d, piece, sizeof piece)) > 0) {
        FUZZ_CHECK(nb + k <= want_len, "decoded more bytes than the input's %zu", want_len);
        memcpy(back + nb, piece, k);
        nb += k;
    }
    FUZZ_CHECK(nb == want_len && !memcmp(back, want, nb), "decode(encode(text)) != text (%zu vs %zu bytes)", nb, want_len);
    tokdec_free(&d);
    free(back);
    free(want);
    free(ids);
    return 0;
}
