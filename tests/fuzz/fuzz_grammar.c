/* fuzz_grammar.c: libFuzzer target for the GBNF compiler and matcher (src/serve/grammar.c)
 * and the JSON Schema and tool-list converters (src/serve/schema.c). Input: a mode byte
 * (low 2 bits: 0 GBNF text, 1 a JSON schema, 2 a tools array for a forced call; bit 2 the
 * XML call form), the text, a NUL, then bytes to feed the matcher. Properties: bad input is
 * refused with a message, never a crash; whatever a converter makes compiles; the matcher's
 * mask over a byte vocabulary (each byte a token, and an end token) equals each token
 * checked alone, at the start and after each byte it takes. Seeds: tests/fuzz/corpus/grammar. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "serve/grammar.h"
#include "serve/schema.h"

static gvocab *bytes_vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static char b[256];
    const char *p[257];
    size_t l[257];
    bool eog[257] = {0};
    for (int i = 0; i < 256; i++) b[i] = (char)i, p[i] = &b[i], l[i] = 1;
    p[256] = "", l[256] = 0, eog[256] = true;
    bytes_vocab = gvocab_from(257, p, l, eog);
    return 0;
}

/* the mask against each token alone */
static void check_mask(gmatch *m) {
    const uint64_t *bits;
    herr e;
    const int64_t n = gmatch_mask(m, &bits, &e);
    if (n < 0) return; /* too ambiguous: refused with a message */
    int64_t count = 0;
    for (int32_t id = 0; id < 257; id++) {
        const bool in = (bits[id >> 6] >> (id & 63)) & 1;
        count += in;
        FUZZ_CHECK(in == gmatch_token_ok(m, id), "token %d: mask %d, alone %d", id, in, !in);
    }
    FUZZ_CHECK(count == n, "mask count %lld, bits %lld", (long long)n, (long long)count);
    FUZZ_CHECK(((bits[256 >> 6] >> (256 & 63)) & 1) == gmatch_complete(m), "the end token iff complete");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 8192) return 0;
    if (!bytes_vocab) LLVMFuzzerInitialize(NULL, NULL);
    const int mode = data[0] & 3;
    const bool xml = data[0] & 4;
    const uint8_t *rest;
    size_t rest_len;
    char *text = fuzz_cut(data + 1, size - 1, &rest, &rest_len);
    herr e = {0};
    char *gbnf = NULL;
    if (mode == 0) {
        gbnf = text, text = NULL;
    } else {
        cJSON *j = cJSON_Parse(text);
        if (j) {
            gbnf = mode == 1 ? schema_to_gbnf(j, "json_schema", &e) : schema_tool_gbnf(j, NULL, xml, &e);
            FUZZ_CHECK(gbnf || e.msg[0], "a refused schema names why");
            cJSON_Delete(j);
        }
    }
    grammar *g = gbnf ? grammar_parse(gbnf, strlen(gbnf), &e) : NULL;
    if (gbnf && !g) {
        FUZZ_CHECK(e.msg[0], "a refused grammar names why");
        FUZZ_CHECK(mode == 0, "the converter made a grammar that does not compile: %s\n%s", e.msg, gbnf);
    }
    if (g) {
        gmatch *m = gmatch_new(g, bytes_vocab, &e);
        for (size_t i = 0; m && i <= rest_len && i < 256; i++) {
            check_mask(m);
            if (i == rest_len || gmatch_bytes(m, (const char *)rest + i, 1) < 0) break;
        }
        gmatch_free(m);
        grammar_free(g);
    }
    free(gbnf);
    free(text);
    return 0;
}
