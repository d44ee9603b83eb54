/* fuzz_grammar.c: libFuzzer target for the GBNF compiler and matcher (src/serve/grammar.c)
 * and the JSON Schema and tool-list converters (src/serve/schema.c). Input: a mode byte
 * (low 2 bits: 0 GBNF text, 1 a JSON schema, 2 a tools array for a forced call; bit 2 the
 * XML call form, bit 3 one or more calls), the text, a NUL, then bytes to feed the
 * matcher. Properties: bad input is refused with a message, never a crash; whatever a
 * converter makes compiles; the matcher's mask over a vocabulary of every byte, an end
 * token and multi-byte tokens that run past a rule's end (`",`, `"}`, `a)`: the position
 * cache's context-dependent tokens) equals each token checked alone, at the start and after
 * each byte it takes, the vocabulary primed as a server primes it (schema_prime). Seeds:
 * tests/fuzz/corpus/grammar. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "serve/grammar.h"
#include "serve/schema.h"
#include "serve/sched.h"

static gvocab *bytes_vocab;

/* tokens of several bytes, beside the 256 bytes and the end token (id 256) */
static const char *const multi[] = {
    "\"", "\",", "\":", "\"}", "\", \"", "{\"", "[\"", "\"]", "\\\"", "\\n", "\\u00", "ab", "abc", "a\"", "xyz\"",
    "\"a\"", "\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac", "\xc3", "\xa9\"", "</", "<t", ">\n", "  ", "\n\n", "true", "null",
    ",\"", "}]", "}}", "]}", "1.5", "-1", "e+", "0,", "))", "((", "(a", "a)", "a b", " \"", "\"\n", "\n<", "=x", "_n",
};
#define N_MULTI ((int)(sizeof multi / sizeof multi[0]))

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static char b[256];
    const char *p[257 + N_MULTI];
    size_t l[257 + N_MULTI];
    bool eog[257 + N_MULTI] = {0};
    for (int i = 0; i < 256; i++) b[i] = (char)i, p[i] = &b[i], l[i] = 1;
    p[256] = "", l[256] = 0, eog[256] = true;
    for (int i = 0; i < N_MULTI; i++) p[257 + i] = multi[i], l[257 + i] = strlen(multi[i]);
    bytes_vocab = gvocab_from(257 + N_MULTI, p, l, eog);
    /* primed as a server primes at start-up (sched.c): a schema's or tool list's masks then
     * take the primed entries of their strings and texts, compared below like any other */
    schema_prime(bytes_vocab, SCHED_PRIME_STATES, NULL, NULL);
    return 0;
}

/* The mask (the position cache) against each token alone and against the whole walk of
 * the trie by a twin matcher fed the same bytes. Where the whole walk is refused as too
 * ambiguous (over the stack cap) a token's check alone may be too, while the cache, which
 * runs fewer bytes against the whole state, still answers: no comparison there. */
static void check_mask(gmatch *m, gmatch *whole) {
    const uint64_t *bits, *wbits;
    herr e;
    const int64_t nw = gmatch_mask(whole, &wbits, &e);
    const int64_t n = gmatch_mask(m, &bits, &e);
    if (nw < 0 || n < 0) return; /* too ambiguous: refused with a message */
    int64_t count = 0;
    for (int32_t id = 0; id < gvocab_n(bytes_vocab); id++) {
        const bool in = (bits[id >> 6] >> (id & 63)) & 1, w = (wbits[id >> 6] >> (id & 63)) & 1;
        count += in;
        FUZZ_CHECK(in == w, "token %d: mask %d, whole walk %d", id, in, w);
        FUZZ_CHECK(in == gmatch_token_ok(m, id), "token %d: mask %d, alone %d", id, in, !in);
    }
    FUZZ_CHECK(count == n && nw == n, "mask count %lld, bits %lld, whole walk %lld", (long long)n, (long long)count, (long long)nw);
    FUZZ_CHECK(((bits[256 >> 6] >> (256 & 63)) & 1) == gmatch_complete(m), "the end token iff complete");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 8192) return 0;
    if (!bytes_vocab) LLVMFuzzerInitialize(NULL, NULL);
    const int mode = data[0] & 3;
    const bool xml = data[0] & 4, many = data[0] & 8;
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
            gbnf = mode == 1 ? schema_to_gbnf(j, "json_schema", &e) : schema_tool_gbnf(j, NULL, xml, many, &e);
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
        gmatch *m = gmatch_new(g, bytes_vocab, &e), *whole = m ? gmatch_new(g, bytes_vocab, &e) : NULL;
        if (whole) gmatch_set_whole_walks(whole, true);
        for (size_t i = 0; m && whole && i <= rest_len && i < 256; i++) {
            check_mask(m, whole);
            if (i == rest_len || gmatch_bytes(m, (const char *)rest + i, 1) < 0) break;
            FUZZ_CHECK(gmatch_bytes(whole, (const char *)rest + i, 1) == 0, "the twin refused a byte the matcher took");
        }
        gmatch_free(m);
        gmatch_free(whole);
        grammar_free(g);
    }
    free(gbnf);
    free(text);
    return 0;
}
