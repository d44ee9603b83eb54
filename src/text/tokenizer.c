/* tokenizer.c: byte-level BPE as llama.cpp runs it. Text goes through three stages:
 * special tokens are cut out (longest text first), each remaining span is split into words
 * by the pre-tokenizer (llama.cpp's hand-written forms of the Qwen2/Qwen3.5/Llama 3 regexes,
 * including their quirks), and each word's bytes are merged by rank. Merges are keyed by the
 * ids of their two halves, so the merge loop never hashes strings; strings that occur only
 * in merges get ids past the vocabulary so that odd files still behave like llama.cpp.
 * Not done: llama.cpp's per-model LSTRIP/RSTRIP attributes (phi-3, jina, modern-bert) and
 * pre-tokenizers other than qwen2, qwen35 and llama-bpe (loading one is an error). */
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/unicode.h"

enum pre_kind { PRE_QWEN2, PRE_QWEN35, PRE_LLAMA3 };

typedef struct merge_slot {
    uint64_t key;   /* (left id << 32) | right id; UINT64_MAX when empty */
    int32_t rank;
    int32_t result; /* string id of left + right */
} merge_slot;

struct tokenizer {
    int32_t n_vocab;
    int32_t n_str;               /* vocabulary strings, then strings found only in merges */
    int32_t str_cap;
    char *blob;                  /* every string, back to back */
    size_t blob_len, blob_cap;
    uint32_t *str_off, *str_len; /* per string id */
    uint8_t *attr;               /* per token: TOK_ATTR_* */
    int32_t *hslot;              /* string hash table: string id or -1 */
    uint64_t hmask;
    merge_slot *mslot;
    uint64_t mmask;
    int32_t *special;            /* CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    int32_t n_special;
    int32_t byte_sym[256];       /* string id of the byte-encoded character of each byte */
    int32_t byte_tok1[256];      /* token whose text is that single byte (last-resort path) */
    uint8_t byte_enc[256][2];    /* GPT-2 byte-to-unicode map, as UTF-8 */
    uint8_t byte_enc_len[256];
    int16_t cp_byte[324];        /* its inverse: code point -> byte, or -1 */
    char *pieces;                /* decoded bytes per token */
    uint32_t *piece_off, *piece_len;
    enum pre_kind pre;
    char pre_name[32];
    bool ignore_merges;
    int32_t bos, eos, eot, pad;
    bool add_bos;
};

/* ---- strings and the hash table ---- */

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static int32_t str_lookup(const tokenizer *t, const char *s, size_t n) {
    for (uint64_t i = hash_bytes(s, n) & t->hmask;; i = (i + 1) & t->hmask) {
        int32_t id = t->hslot[i];
        if (id < 0) return -1;
        if (t->str_len[id] == n && !memcmp(t->blob + t->str_off[id], s, n)) return id;
    }
}

/* Adds a string; with replace, an equal string already present is remapped to the new id
 * (a vocabulary with duplicates resolves to the last, like llama.cpp's token_to_id). */
static int32_t str_add(tokenizer *t, const char *s, size_t n, bool replace) {
    if (t->n_str == t->str_cap) {
        t->str_cap = t->str_cap ? t->str_cap * 2 : 1024;
        t->str_off = xrealloc(t->str_off, (size_t)t->str_cap * sizeof *t->str_off);
        t->str_len = xrealloc(t->str_len, (size_t)t->str_cap * sizeof *t->str_len);
    }
    while (t->blob_len + n + 1 > t->blob_cap) {
        t->blob_cap = t->blob_cap ? t->blob_cap * 2 : 1 << 20;
        t->blob = xrealloc(t->blob, t->blob_cap);
    }
    int32_t id = t->n_str++;
    memcpy(t->blob + t->blob_len, s, n);
    t->blob[t->blob_len + n] = 0;
    t->str_off[id] = (uint32_t)t->blob_len;
    t->str_len[id] = (uint32_t)n;
    t->blob_len += n + 1;
    for (uint64_t i = hash_bytes(s, n) & t->hmask;; i = (i + 1) & t->hmask) {
        int32_t o = t->hslot[i];
        if (o < 0) { t->hslot[i] = id; return id; }
        if (t->str_len[o] == n && !memcmp(t->blob + t->str_off[o], s, n)) {
            if (replace) t->hslot[i] = id;
            return replace ? id : o;
        }
    }
}

static int32_t str_intern(tokenizer *t, const char *s, size_t n) {
    int32_t id = str_lookup(t, s, n);
    return id >= 0 ? id : str_add(t, s, n, false);
}

static const char *str_ptr(const tokenizer *t, int32_t id) { return t->blob + t->str_off[id]; }

/* ---- merges ---- */

static uint64_t merge_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static const merge_slot *merge_find(const tokenizer *t, int32_t a, int32_t b) {
    uint64_t k = merge_key(a, b);
    for (uint64_t i = rng_mix(k) & t->mmask;; i = (i + 1) & t->mmask) {
        const merge_slot *m = &t->mslot[i];
        if (m->key == k) return m;
        if (m->key == UINT64_MAX) return NULL;
    }
}

static void merge_add(tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t result) {
    uint64_t k = merge_key(a, b);
    for (uint64_t i = rng_mix(k) & t->mmask;; i = (i + 1) & t->mmask) {
        merge_slot *m = &t->mslot[i];
        if (m->key == k) return; /* a repeated merge keeps its first rank */
        if (m->key == UINT64_MAX) { m->key = k; m->rank = rank; m->result = result; return; }
    }
}

/* ---- the GPT-2 byte-to-unicode map ---- */

static bool byte_is_printable(int b) { return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae); }

static void byte_map_init(tokenizer *t) {
    int n = 0;
    for (int c = 0; c < 324; c++) t->cp_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = byte_is_printable(b) ? (uint32_t)b : 256u + (uint32_t)n++;
        t->cp_byte[cp] = (int16_t)b;
        uint8_t u[4];
        int k = utf8_encode(cp, u);
        memcpy(t->byte_enc[b], u, (size_t)k);
        t->byte_enc_len[b] = (uint8_t)k;
    }
}

/* The byte a code point of a token's text stands for, or -1. */
static int byte_of_cp(const tokenizer *t, uint32_t cp) { return cp < 324 ? t->cp_byte[cp] : -1; }

/* ---- loading ---- */

/* Token texts llama.cpp treats as CONTROL whatever their type (it finds end-of-generation
 * and fill-in-the-middle tokens by name). The first group also ends generation. */
static const char *const eog_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[", NULL};
/* Fill-in-the-middle names by role; a role whose id the file gives is not searched. The
 * three last roles also end generation. */
static const struct { const char *key; const char *names[9]; } fim_roles[] = {
    {"tokenizer.ggml.fim_pre_token_id", {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>", "\xe2\x96\x81<PRE>",
        "<|code_prefix|>", "<|prefix|>", NULL}},
    {"tokenizer.ggml.fim_suf_token_id", {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>", "\xe2\x96\x81<SUF>",
        "<|code_suffix|>", "<|suffix|>", NULL}},
    {"tokenizer.ggml.fim_mid_token_id", {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>", "\xe2\x96\x81<MID>",
        "<|code_middle|>", "<|middle|>", NULL}},
    {"tokenizer.ggml.fim_pad_token_id", {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL}},
    {"tokenizer.ggml.fim_rep_token_id", {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL}},
    {"tokenizer.ggml.fim_sep_token_id", {"<|file_sep|>", NULL}},
};

static int32_t find_cstr(const tokenizer *t, const char *s) { return tokenizer_find(t, s, strlen(s)); }

/* An optional token id from the file: -1 when absent or out of range. */
static int32_t opt_id(const gguf_file *f, const char *key, int32_t n_vocab) {
    uint32_t v;
    if (!gguf_find(f, key) || gguf_get_u32(f, key, &v, NULL) != 0 || v >= (uint32_t)n_vocab) return -1;
    return (int32_t)v;
}

static int cmp_special(const void *a, const void *b, void *arg) {
    const tokenizer *t = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->str_len[x] != t->str_len[y]) return t->str_len[x] > t->str_len[y] ? -1 : 1;
    return (x > y) - (x < y);
}

static void build_pieces(tokenizer *t) {
    size_t cap = t->blob_len + 1024, len = 0;
    t->pieces = xmalloc(cap);
    t->piece_off = xmalloc((size_t)t->n_vocab * sizeof *t->piece_off);
    t->piece_len = xmalloc((size_t)t->n_vocab * sizeof *t->piece_len);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const uint8_t *s = (const uint8_t *)str_ptr(t, id);
        size_t n = t->str_len[id];
        unsigned a = t->attr[id];
        /* worst case: every code point unknown, each "[UNK_BYTE_0x" + 8 hex + text + "]" */
        size_t need = len + (n + 1) * (n + 24);
        if (need > cap) {
            while (need > cap) cap *= 2;
            t->pieces = xrealloc(t->pieces, cap);
        }
        t->piece_off[id] = (uint32_t)len;
        if (a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN | TOK_ATTR_USER_DEFINED)) {
            memcpy(t->pieces + len, s, n);
            len += n;
        } else if (a & (TOK_ATTR_NORMAL | TOK_ATTR_BYTE)) {
            for (size_t i = 0; i < n;) {
                size_t i0 = i;
                uint32_t cp = utf8_decode(s, n, &i);
                int b = byte_of_cp(t, cp);
                if (b >= 0) { t->pieces[len++] = (char)b; continue; }
                /* llama.cpp's marker for a character outside the byte map */
                uint8_t u[4];
                int k = utf8_encode(cp, u);
                len += (size_t)sprintf(t->pieces + len, "[UNK_BYTE_0x");
                for (int j = 0; j < k; j++) len += (size_t)sprintf(t->pieces + len, "%02x", u[j]);
                memcpy(t->pieces + len, s, n);
                len += n;
                t->pieces[len++] = ']';
                (void)i0;
            }
        } /* UNUSED and undefined types decode to nothing, as in llama.cpp */
        t->piece_len[id] = (uint32_t)(len - t->piece_off[id]);
    }
}

int tokenizer_load(tokenizer **out, const gguf_file *f, herr *e) {
    *out = NULL;
    gguf_str model, pre;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, e)) return herr_wrap(e, "tokenizer");
    if (!gguf_str_eq(model, "gpt2"))
        return herr_set(e, "tokenizer: tokenizer.ggml.model is '%.*s'; only 'gpt2' (byte-level BPE) is supported",
                        (int)(model.len > 64 ? 64 : model.len), model.ptr);
    if (gguf_get_str(f, "tokenizer.ggml.pre", &pre, e)) return herr_wrap(e, "tokenizer");
    enum pre_kind kind;
    bool ignore_merges = false;
    if (gguf_str_eq(pre, "qwen2") || gguf_str_eq(pre, "deepseek-r1-qwen") || gguf_str_eq(pre, "kormo") ||
        gguf_str_eq(pre, "f2llmv2"))
        kind = PRE_QWEN2;
    else if (gguf_str_eq(pre, "qwen35"))
        kind = PRE_QWEN35;
    else if (gguf_str_eq(pre, "llama3") || gguf_str_eq(pre, "llama-v3") || gguf_str_eq(pre, "llama-bpe"))
        kind = PRE_LLAMA3, ignore_merges = true;
    else
        return herr_set(e, "tokenizer: pre-tokenizer '%.*s' is not supported (qwen2, qwen35, llama-bpe are)",
                        (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);

    const gguf_value *toks, *types = NULL, *merges;
    if (gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, e)) return herr_wrap(e, "tokenizer");
    if (gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges, e)) return herr_wrap(e, "tokenizer");
    if (gguf_find(f, "tokenizer.ggml.token_type")) {
        if (gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, e)) return herr_wrap(e, "tokenizer");
        if (types->v.arr.n < toks->v.arr.n)
            return herr_set(e, "tokenizer: token_type has %llu entries for %llu tokens",
                            (unsigned long long)types->v.arr.n, (unsigned long long)toks->v.arr.n);
    }
    uint64_t n_vocab = toks->v.arr.n;
    if (n_vocab == 0 || n_vocab > (1u << 30)) return herr_set(e, "tokenizer: %llu tokens", (unsigned long long)n_vocab);
    if (merges->v.arr.n > (1u << 30)) return herr_set(e, "tokenizer: %llu merges", (unsigned long long)merges->v.arr.n);

    tokenizer *t = xcalloc(1, sizeof *t);
    t->n_vocab = (int32_t)n_vocab;
    t->pre = kind;
    t->ignore_merges = ignore_merges;
    snprintf(t->pre_name, sizeof t->pre_name, "%.*s", (int)pre.len, pre.ptr);
    uint64_t hcap = 1;
    while (hcap < 2 * (n_vocab + 2 * merges->v.arr.n + 256)) hcap <<= 1;
    t->hmask = hcap - 1;
    t->hslot = xmalloc(hcap * sizeof *t->hslot);
    memset(t->hslot, 0xff, hcap * sizeof *t->hslot);

    t->attr = xmalloc(n_vocab);
    for (uint64_t i = 0; i < n_vocab; i++) {
        gguf_str s = toks->v.arr.strs[i];
        char empty[32];
        if (s.len == 0) { /* llama.cpp names empty tokens so that they stay distinct */
            s.len = (uint64_t)snprintf(empty, sizeof empty, "[EMPTY_%llu]", (unsigned long long)i);
            s.ptr = empty;
        }
        if (s.len > (1u << 20)) { tokenizer_free(t); return herr_set(e, "tokenizer: token %llu is %llu bytes long", (unsigned long long)i, (unsigned long long)s.len); }
        str_add(t, s.ptr, s.len, true);
        int64_t ty = types ? gguf_arr_int(types, i) : 1;
        t->attr[i] = ty == 1 ? TOK_ATTR_NORMAL : ty == 2 ? TOK_ATTR_UNKNOWN : ty == 3 ? TOK_ATTR_CONTROL
                   : ty == 4 ? TOK_ATTR_USER_DEFINED : ty == 5 ? TOK_ATTR_UNUSED : ty == 6 ? TOK_ATTR_BYTE : 0;
    }

    /* merges: "left right", split at the first space after the first byte */
    uint64_t mcap = 1;
    while (mcap < 2 * merges->v.arr.n + 16) mcap <<= 1;
    t->mmask = mcap - 1;
    t->mslot = xmalloc(mcap * sizeof *t->mslot);
    for (uint64_t i = 0; i < mcap; i++) t->mslot[i].key = UINT64_MAX;
    char *cat = NULL;
    size_t cat_cap = 0;
    for (uint64_t i = 0; i < merges->v.arr.n; i++) {
        gguf_str m = merges->v.arr.strs[i];
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!sp) continue; /* llama.cpp files it under ("", ""), which nothing matches */
        size_t nl = (size_t)(sp - m.ptr), nr = m.len - nl - 1;
        if (nr == 0) continue;
        int32_t a = str_intern(t, m.ptr, nl), b = str_intern(t, sp + 1, nr);
        if (nl + nr > cat_cap) { cat_cap = 2 * (nl + nr); cat = xrealloc(cat, cat_cap); }
        memcpy(cat, m.ptr, nl);
        memcpy(cat + nl, sp + 1, nr);
        merge_add(t, a, b, (int32_t)i, str_intern(t, cat, nl + nr));
    }
    free(cat);

    byte_map_init(t);
    for (int b = 0; b < 256; b++) {
        t->byte_sym[b] = str_lookup(t, (const char *)t->byte_enc[b], t->byte_enc_len[b]);
        char c = (char)b;
        t->byte_tok1[b] = tokenizer_find(t, &c, 1);
    }

    /* llama.cpp's by-name attribute rules (see eog_names) */
    for (int k = 0; eog_names[k]; k++) {
        int32_t id = find_cstr(t, eog_names[k]);
        if (id >= 0) t->attr[id] |= TOK_ATTR_CONTROL | TOK_ATTR_EOG;
    }
    for (size_t r = 0; r < sizeof fim_roles / sizeof fim_roles[0]; r++) {
        int32_t id = opt_id(f, fim_roles[r].key, t->n_vocab);
        if (id < 0) {
            for (int k = 0; fim_roles[r].names[k] && id < 0; k++) id = find_cstr(t, fim_roles[r].names[k]);
            if (id >= 0) t->attr[id] |= TOK_ATTR_CONTROL;
        }
        if (id >= 0 && r >= 3) t->attr[id] |= TOK_ATTR_EOG;
    }
    static const char *const always_user[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (int k = 0; always_user[k]; k++) {
        int32_t id = find_cstr(t, always_user[k]);
        if (id >= 0) t->attr[id] = TOK_ATTR_USER_DEFINED;
    }

    t->bos = opt_id(f, "tokenizer.ggml.bos_token_id", t->n_vocab);
    t->eos = opt_id(f, "tokenizer.ggml.eos_token_id", t->n_vocab);
    t->eot = opt_id(f, "tokenizer.ggml.eot_token_id", t->n_vocab);
    t->pad = opt_id(f, "tokenizer.ggml.padding_token_id", t->n_vocab);
    if (t->eot < 0) { /* llama.cpp's by-name search for the end-of-turn token */
        static const char *const eot_names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
            "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<end_of_utterance>", NULL};
        for (int j = 0; eot_names[j] && t->eot < 0; j++) t->eot = find_cstr(t, eot_names[j]);
    }
    if (t->eos >= 0) t->attr[t->eos] |= TOK_ATTR_EOG;
    if (t->eot >= 0) t->attr[t->eot] |= TOK_ATTR_EOG;
    bool b = false;
    if (gguf_find(f, "tokenizer.ggml.add_bos_token") && gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b, NULL) == 0)
        t->add_bos = b && t->bos >= 0;

    t->special = xmalloc((size_t)t->n_vocab * sizeof *t->special);
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) t->special[t->n_special++] = id;
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special, t);

    build_pieces(t);
    *out = t;
    return 0;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->blob); free(t->str_off); free(t->str_len); free(t->attr); free(t->hslot); free(t->mslot);
    free(t->special); free(t->pieces); free(t->piece_off); free(t->piece_len);
    free(t);
}

int32_t tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
const char *tokenizer_pre(const tokenizer *t) { return t->pre_name; }
int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer *t) { return t->eos; }
int32_t tokenizer_eot(const tokenizer *t) { return t->eot; }
int32_t tokenizer_pad(const tokenizer *t) { return t->pad; }
bool tokenizer_add_bos(const tokenizer *t) { return t->add_bos; }
unsigned tokenizer_attr(const tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab ? t->attr[id] : 0; }
bool tokenizer_is_eog(const tokenizer *t, int32_t id) { return (tokenizer_attr(t, id) & TOK_ATTR_EOG) != 0; }

int32_t tokenizer_find(const tokenizer *t, const char *s, size_t n) {
    int32_t id = str_lookup(t, s, n);
    return id < t->n_vocab ? id : -1; /* strings known only from merges are not tokens */
}

const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) { if (len) *len = 0; return NULL; }
    if (len) *len = t->str_len[id];
    return str_ptr(t, id);
}

const char *tokenizer_piece(const tokenizer *t, int32_t id, bool special, size_t *len) {
    *len = 0;
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (!special && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) return t->pieces;
    *len = t->piece_len[id];
    return t->pieces + t->piece_off[id];
}

/* ---- encoding ---- */

typedef struct sym {
    int32_t id;         /* string id, or -1 for a character no merge or token knows */
    int32_t prev, next;
    uint32_t start, n;  /* bytes of the word; n == 0 once merged into its left neighbour */
} sym;

typedef struct bigram {
    int32_t rank, left, right;
} bigram;

/* Scratch of one encode call, grown as needed. */
typedef struct enc {
    const tokenizer *t;
    int32_t *out;
    int64_t cap, n;
    uint32_t *cps;
    uint8_t *fl;
    size_t cps_cap;
    uint8_t *word;
    size_t word_cap;
    sym *syms;
    bigram *heap;
    size_t syms_cap, heap_cap;
} enc;

static void emit(enc *E, int32_t id) {
    if (E->n < E->cap) E->out[E->n] = id;
    E->n++;
}

static bool bigram_less(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(enc *E, size_t *hn, bigram b) {
    if (*hn == E->heap_cap) {
        E->heap_cap = E->heap_cap ? 2 * E->heap_cap : 256;
        E->heap = xrealloc(E->heap, E->heap_cap * sizeof *E->heap);
    }
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_less(&b, &E->heap[p])) break;
        E->heap[i] = E->heap[p];
        i = p;
    }
    E->heap[i] = b;
}

static bigram heap_pop(enc *E, size_t *hn) {
    bigram top = E->heap[0], last = E->heap[--*hn];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_less(&E->heap[c + 1], &E->heap[c])) c++;
        if (!bigram_less(&E->heap[c], &last)) break;
        E->heap[i] = E->heap[c];
        i = c;
    }
    if (n) E->heap[i] = last;
    return top;
}

static void try_bigram(enc *E, size_t *hn, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    int32_t a = E->syms[left].id, b = E->syms[right].id;
    if (a < 0 || b < 0) return;
    const merge_slot *m = merge_find(E->t, a, b);
    if (m) heap_push(E, hn, (bigram){m->rank, left, right});
}

/* A symbol that is no token: llama.cpp falls back to the tokens of the single bytes of its
 * byte-encoded text (only ASCII ones exist in a sane vocabulary). */
static void emit_fallback(enc *E, const uint8_t *w, const sym *s) {
    const tokenizer *t = E->t;
    for (uint32_t i = s->start; i < s->start + s->n; i++)
        for (int k = 0; k < t->byte_enc_len[w[i]]; k++) {
            int32_t id = t->byte_tok1[t->byte_enc[w[i]][k]];
            if (id >= 0) emit(E, id);
        }
}

/* Merges the bytes of one word by rank (lowest first, leftmost among equals). */
static void bpe_word(enc *E, const uint8_t *w, size_t n) {
    const tokenizer *t = E->t;
    if (n == 1) { /* the common one-byte word: no merges to try */
        sym s = {t->byte_sym[w[0]], -1, -1, 0, 1};
        if (s.id >= 0 && s.id < t->n_vocab) emit(E, s.id);
        else emit_fallback(E, w, &s);
        return;
    }
    if (t->ignore_merges) { /* Llama 3: a word that is a token stays whole */
        size_t need = 2 * n;
        uint8_t *enc_w = NULL, small[256] = {0};
        enc_w = need <= sizeof small ? small : xmalloc(need);
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            for (int k = 0; k < t->byte_enc_len[w[i]]; k++) enc_w[m++] = t->byte_enc[w[i]][k];
        int32_t id = tokenizer_find(t, (const char *)enc_w, m);
        if (enc_w != small) free(enc_w);
        if (id >= 0) { emit(E, id); return; }
    }
    if (n > E->syms_cap) {
        E->syms_cap = n > 2 * E->syms_cap ? n : 2 * E->syms_cap;
        E->syms = xrealloc(E->syms, E->syms_cap * sizeof *E->syms);
    }
    sym *s = E->syms;
    for (size_t i = 0; i < n; i++)
        s[i] = (sym){t->byte_sym[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, (uint32_t)i, 1};
    size_t hn = 0;
    for (size_t i = 1; i < n; i++) try_bigram(E, &hn, (int32_t)i - 1, (int32_t)i);
    while (hn) {
        bigram b = heap_pop(E, &hn);
        sym *l = &s[b.left], *r = &s[b.right];
        /* stale: either side merged since (a side that grew has a new id) */
        if (l->n == 0 || r->n == 0 || l->next != b.right) continue;
        const merge_slot *m = merge_find(t, l->id, r->id);
        if (!m || m->rank != b.rank) continue;
        l->id = m->result;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = b.left;
        try_bigram(E, &hn, l->prev, b.left);
        try_bigram(E, &hn, b.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        if (s[i].id >= 0 && s[i].id < t->n_vocab) emit(E, s[i].id);
        else emit_fallback(E, w, &s[i]);
    }
}

/* The end of the word that starts at pos: llama.cpp's hand-written matcher of
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * with [\p{L}\p{M}] for letters in qwen35 and \p{N}{1,3} in llama3. */
static size_t split_next(const uint32_t *cp, const uint8_t *fl, size_t pos, size_t end, enum pre_kind pre) {
#define FL(p) ((p) < end ? fl[p] : 0u)
#define CP(p) ((p) < end ? cp[p] : 0xFFFFFFFFu)
    const unsigned letter = pre == PRE_QWEN35 ? UCP_LETTER | UCP_MARK : UCP_LETTER;
    uint32_t c = cp[pos];
    unsigned f = fl[pos];
    if (c == '\'' && pos + 1 < end) {
        uint32_t c1 = cp[pos + 1] | (cp[pos + 1] >= 'A' && cp[pos + 1] <= 'Z' ? 0x20 : 0);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
        if (pos + 2 < end) {
            uint32_t c2 = cp[pos + 2] | (cp[pos + 2] >= 'A' && cp[pos + 2] <= 'Z' ? 0x20 : 0);
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return pos + 3;
        }
    }
    if (!(c == '\r' || c == '\n' || (f & UCP_NUMBER))) {
        if ((f & letter) || (FL(pos + 1) & letter)) {
            pos++;
            while (FL(pos) & letter) pos++;
            return pos;
        }
    }
    if (f & UCP_NUMBER) {
        size_t lim = pre == PRE_LLAMA3 ? 3 : 1, k = 0;
        while (k < lim && (FL(pos) & UCP_NUMBER)) pos++, k++;
        return pos;
    }
    const unsigned stop = UCP_SPACE | UCP_NUMBER | letter;
    unsigned f2 = c == ' ' ? FL(pos + 1) : f;
    if (!(f2 & stop)) {
        pos += c == ' ';
        while (pos < end && !(fl[pos] & stop)) pos++;
        while (CP(pos) == '\r' || CP(pos) == '\n') pos++;
        return pos;
    }
    size_t nws = 0, last_rn = 0;
    while (FL(pos + nws) & UCP_SPACE) {
        uint32_t c2 = cp[pos + nws];
        if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
        nws++;
    }
    if (last_rn > 0) return last_rn;
    if (nws > 1 && pos + nws < end) return pos + nws - 1;
    if (nws > 0) return pos + nws;
    return pos + 1;
#undef FL
#undef CP
}

/* Pre-tokenizes and merges one span of text that holds no special token. */
static void encode_span(enc *E, const uint8_t *s, size_t n) {
    if (n == 0) return;
    if (n > E->cps_cap) {
        E->cps_cap = n;
        E->cps = xrealloc(E->cps, n * sizeof *E->cps);
        E->fl = xrealloc(E->fl, n);
    }
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c = utf8_decode(s, n, &i);
        E->cps[m] = c;
        E->fl[m] = (uint8_t)unicode_flags(c);
        m++;
    }
    for (size_t pos = 0; pos < m;) {
        size_t end = split_next(E->cps, E->fl, pos, m, E->t->pre);
        /* the word's bytes, re-encoded from its code points as llama.cpp does (so an
         * overlong form becomes the short one and a bad byte becomes U+FFFD) */
        size_t need = 4 * (end - pos);
        if (need > E->word_cap) {
            E->word_cap = need > 2 * E->word_cap ? need : 2 * E->word_cap;
            E->word = xrealloc(E->word, E->word_cap);
        }
        size_t wn = 0;
        for (size_t k = pos; k < end; k++) wn += (size_t)utf8_encode(E->cps[k], E->word + wn);
        bpe_word(E, E->word, wn);
        pos = end;
    }
}

typedef struct match {
    size_t pos;
    int32_t rank; /* index into t->special */
} match;

static int cmp_match(const void *a, const void *b) {
    const match *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static int cmp_match_pos(const void *a, const void *b) {
    const match *x = a, *y = b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

int64_t tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool parse_special,
                         int32_t *out, int64_t cap) {
    enc E = {.t = t, .out = out, .cap = cap < 0 ? 0 : cap};
    const uint8_t *s = (const uint8_t *)text;

    /* Special tokens. llama.cpp takes them one by one, longest text first, and cuts every
     * occurrence out of the spans still left as text; this finds every candidate in one pass
     * and then replays that order: an occurrence is taken if all its bytes are still text. */
    match *acc = NULL;
    size_t n_acc = 0;
    if (t->n_special > 0 && len > 0) {
        bool first[256] = {false};
        for (int32_t k = 0; k < t->n_special; k++) {
            int32_t id = t->special[k];
            if (!parse_special && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
            first[(uint8_t)str_ptr(t, id)[0]] = true;
        }
        match *cand = NULL;
        size_t n_cand = 0, cand_cap = 0;
        for (size_t i = 0; i < len; i++) {
            if (!first[s[i]]) continue;
            for (int32_t k = 0; k < t->n_special; k++) {
                int32_t id = t->special[k];
                size_t n = t->str_len[id];
                const char *p = str_ptr(t, id);
                if ((uint8_t)p[0] != s[i] || n > len - i || memcmp(p, s + i, n)) continue;
                if (!parse_special && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
                if (n_cand == cand_cap) {
                    cand_cap = cand_cap ? 2 * cand_cap : 64;
                    cand = xrealloc(cand, cand_cap * sizeof *cand);
                }
                cand[n_cand++] = (match){i, k};
            }
        }
        if (n_cand) {
            qsort(cand, n_cand, sizeof *cand, cmp_match);
            uint8_t *taken = xcalloc(len, 1);
            for (size_t c = 0; c < n_cand; c++) {
                size_t p = cand[c].pos, n = t->str_len[t->special[cand[c].rank]];
                bool free_run = true;
                for (size_t q = p; q < p + n && free_run; q++) free_run = !taken[q];
                if (!free_run) continue;
                memset(taken + p, 1, n);
                cand[n_acc++] = cand[c];
            }
            free(taken);
            qsort(cand, n_acc, sizeof *cand, cmp_match_pos);
            acc = cand;
        } else {
            free(cand);
        }
    }

    size_t at = 0;
    for (size_t k = 0; k < n_acc; k++) {
        int32_t id = t->special[acc[k].rank];
        encode_span(&E, s + at, acc[k].pos - at);
        emit(&E, id);
        at = acc[k].pos + t->str_len[id];
    }
    encode_span(&E, s + at, len - at);

    free(acc);
    free(E.cps); free(E.fl); free(E.word); free(E.syms); free(E.heap);
    return E.n;
}

int32_t *tokenizer_encode_alloc(const tokenizer *t, const char *text, size_t len, bool parse_special,
                                int64_t *n) {
    int64_t cap = (int64_t)len + 16;
    int32_t *ids = xmalloc((size_t)cap * sizeof *ids);
    int64_t got = tokenizer_encode(t, text, len, parse_special, ids, cap);
    if (got > cap) {
        ids = xrealloc(ids, (size_t)got * sizeof *ids);
        tokenizer_encode(t, text, len, parse_special, ids, got);
    }
    *n = got;
    return ids;
}

/* whether special token k (an index into t->special) is cut out of text under parse_special */
static bool special_cut(const tokenizer *t, int32_t k, bool parse_special) {
    return parse_special || !(t->attr[t->special[k]] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN));
}

int32_t *tokenizer_encode_after(const tokenizer *t, const char *text, size_t len, bool parse_special,
                                const char *prev, size_t prev_len, const int32_t *prev_ids, int64_t n_prev,
                                int64_t *n, int64_t *reused) {
    *reused = 0;
    size_t common = 0;
    const size_t most = len < prev_len ? len : prev_len;
    while (common < most && text[common] == prev[common]) common++;
    const size_t maxlen = t->n_special ? t->str_len[t->special[0]] : 0;
    /* the last cut (the end of a special token of prev's ids) with the bytes of any special
     * token that could touch it inside the common prefix; the pieces must spell prev */
    int64_t cut_i = 0;
    size_t cut_b = 0, b = 0;
    for (int64_t i = 0; i < n_prev && maxlen; i++) {
        size_t pl;
        const char *pc = tokenizer_piece(t, prev_ids[i], true, &pl);
        if (b + pl > common || memcmp(pc, prev + b, pl)) break;
        b += pl;
        if (t->attr[prev_ids[i]] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) cut_i = i + 1, cut_b = b;
    }
    /* and no special token's text crosses it (then the text's cut-out tokens on either side
     * are decided apart, here as in prev, and the spans between them are encoded apart) */
    for (size_t i = cut_b > maxlen ? cut_b - maxlen : 0; cut_i && i < cut_b; i++)
        for (int32_t k = 0; k < t->n_special && cut_i; k++) {
            const int32_t id = t->special[k];
            const size_t sl = t->str_len[id];
            if (i + sl > cut_b && i + sl <= len && special_cut(t, k, parse_special) && !memcmp(str_ptr(t, id), text + i, sl))
                cut_i = 0;
        }
    if (cut_i == 0) return tokenizer_encode_alloc(t, text, len, parse_special, n);
    int64_t nr;
    int32_t *rest = tokenizer_encode_alloc(t, text + cut_b, len - cut_b, parse_special, &nr);
    int32_t *ids = xmalloc(sizeof *ids * (size_t)(cut_i + nr + 1));
    memcpy(ids, prev_ids, sizeof *ids * (size_t)cut_i);
    memcpy(ids + cut_i, rest, sizeof *ids * (size_t)nr);
    free(rest);
    *n = cut_i + nr;
    *reused = cut_i;
    return ids;
}

int32_t tokenizer_prompt_bos(const tokenizer *t) { return t->add_bos && t->bos >= 0 ? t->bos : -1; }

int32_t *tokenizer_encode_prompt(const tokenizer *t, const char *text, size_t len, bool parse_special, bool add_bos,
                                 int64_t *n) {
    const int32_t bos_id = add_bos ? tokenizer_prompt_bos(t) : -1;
    const int bos = bos_id >= 0;
    int64_t nb;
    int32_t *body = tokenizer_encode_alloc(t, text, len, parse_special, &nb);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(nb + 1));
    if (bos) ids[0] = bos_id;
    memcpy(ids + bos, body, sizeof(int32_t) * (size_t)nb);
    free(body);
    *n = nb + bos;
    return ids;
}

/* ---- streaming decoding ---- */

void tokdec_init(tokdec *d, const tokenizer *t) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->special = true;
}

void tokdec_free(tokdec *d) {
    free(d->pend);
    memset(d, 0, sizeof *d);
}

/* Length of the UTF-8 sequence a lead byte starts (0 for bytes that start none). */
static int utf8_seq_len(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) return 2;
    if (b >= 0xe0 && b <= 0xef) return 3;
    if (b >= 0xf0 && b <= 0xf4) return 4;
    return 0;
}

static size_t tokdec_take(tokdec *d, size_t avail, char *buf, size_t cap) {
    size_t k = avail < cap ? avail : cap;
    if (k) {
        memcpy(buf, d->pend, k);
        memmove(d->pend, d->pend + k, d->n_pend - k);
        d->n_pend -= k;
    }
    return k;
}

size_t tokdec_push(tokdec *d, int32_t id, char *buf, size_t cap) {
    size_t plen;
    const char *p = tokenizer_piece(d->tok, id, d->special, &plen);
    if (d->n_pend + plen > d->cap) {
        d->cap = 2 * (d->n_pend + plen) + 64;
        d->pend = xrealloc(d->pend, d->cap);
    }
    if (plen) memcpy(d->pend + d->n_pend, p, plen);
    d->n_pend += plen;
    /* hold back a trailing lead byte and the continuation bytes that do not yet complete it */
    size_t whole = d->n_pend;
    for (size_t back = 1; back <= 3 && back <= d->n_pend; back++) {
        uint8_t b = (uint8_t)d->pend[d->n_pend - back];
        if ((b & 0xc0) == 0x80) continue;
        if (utf8_seq_len(b) > (int)back) whole = d->n_pend - back;
        break;
    }
    return tokdec_take(d, whole, buf, cap);
}

size_t tokdec_flush(tokdec *d, char *buf, size_t cap) { return tokdec_take(d, d->n_pend, buf, cap); }
