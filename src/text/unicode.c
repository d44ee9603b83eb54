/* unicode.c: code point classes by binary search over the generated ranges (ASCII through a
 * small table first), and llama.cpp-compatible UTF-8 decoding. */
#include "text/unicode.h"

#include <pthread.h>

static unsigned lookup(uint32_t cp) {
    size_t lo = 0, hi = unicode_n_ranges; /* the last entry whose first code point <= cp */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((unicode_ranges[mid] >> 4) <= cp) lo = mid;
        else hi = mid;
    }
    return unicode_ranges[lo] & 15u;
}

/* ASCII's classes, filled once: pthread_once, not a flag tested and set by whoever comes first
 * (two server threads tokenizing at once raced on it: ThreadSanitizer, tests/cli/tsan_serve.sh) */
static unsigned char ascii[128];
static pthread_once_t ascii_once = PTHREAD_ONCE_INIT;

static void ascii_fill(void) {
    for (uint32_t c = 0; c < 128; c++) ascii[c] = (unsigned char)lookup(c);
}

unsigned unicode_flags(uint32_t cp) {
    if (cp < 128) {
        pthread_once(&ascii_once, ascii_fill);
        return ascii[cp];
    }
    if (cp > 0x10FFFF) return 0;
    return lookup(cp);
}

uint32_t utf8_decode(const uint8_t *s, size_t n, size_t *i) {
    size_t p = *i;
    uint8_t b = s[p];
    int len;
    uint32_t cp;
    if (b < 0x80) { *i = p + 1; return b; }
    if (!(b & 0x40)) goto bad;              /* a continuation byte as lead */
    if (!(b & 0x20)) { len = 2; cp = b & 0x1f; }
    else if (!(b & 0x10)) { len = 3; cp = b & 0x0f; }
    else if (!(b & 0x08)) { len = 4; cp = b & 0x07; }
    else goto bad;                          /* 0xF8..0xFF */
    if (p + (size_t)len > n) goto bad;
    for (int k = 1; k < len; k++) {
        if ((s[p + k] & 0xc0) != 0x80) goto bad;
        cp = (cp << 6) | (s[p + k] & 0x3f);
    }
    if (cp > 0x10FFFF) goto bad;
    *i = p + (size_t)len;
    return cp;
bad:
    *i = p + 1;
    return 0xFFFD;
}

int utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { out[0] = (uint8_t)(0xc0 | (cp >> 6)); out[1] = (uint8_t)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | (cp >> 12)); out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f)); return 3;
    }
    out[0] = (uint8_t)(0xf0 | (cp >> 18)); out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f)); out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}
