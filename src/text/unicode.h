/* unicode.h: what the byte-level BPE pre-tokenizer needs to know about code points: their
 * class (letter, number, mark, white space; Unicode 15.1 tables, the same as llama.cpp's),
 * and UTF-8 decoding with llama.cpp's lenient rules, so that any bytes split the same way. */
#ifndef HEARTH_UNICODE_H
#define HEARTH_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    UCP_LETTER = 1, /* \p{L} */
    UCP_NUMBER = 2, /* \p{N} */
    UCP_MARK = 4,   /* \p{M} */
    UCP_SPACE = 8,  /* \s: the White_Space property */
};

/* The generated table (unicode_data.c): entries (first code point << 4) | flags, sorted. */
extern const uint32_t unicode_ranges[];
extern const size_t unicode_n_ranges;

/* UCP_* flags of a code point; 0 for anything past U+10FFFF. */
unsigned unicode_flags(uint32_t cp);

/* Decodes one code point at s[*i] (i < n) and advances *i. The rules are llama.cpp's: the
 * lead byte gives the length, continuation bytes must be 10xxxxxx, but overlong forms and
 * surrogates pass as their value. A byte that starts no valid sequence decodes to U+FFFD and
 * advances one byte; so does a 4-byte form above U+10FFFF (llama.cpp throws on those). */
uint32_t utf8_decode(const uint8_t *s, size_t n, size_t *i);
/* Writes cp (<= U+10FFFF) as 1-4 bytes; returns the count. */
int utf8_encode(uint32_t cp, uint8_t out[4]);

#endif
