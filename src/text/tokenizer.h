/* tokenizer.h: byte-level BPE (tokenizer.ggml.model "gpt2") read from GGUF metadata, with the
 * pre-tokenizers of Qwen2/Qwen3 ("qwen2"), Qwen3.5/3.6 ("qwen35") and Llama 3 ("llama-bpe"),
 * special-token splitting, and a streaming decoder. The ids match llama.cpp's tokenizer bit
 * for bit (tests/unit/test_tokenizer.c checks its vectors and a corpus); any bytes are valid
 * input. A loaded tokenizer is immutable: encode and decode from any number of threads. */
#ifndef HEARTH_TOKENIZER_H
#define HEARTH_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "base/util.h"

typedef struct tokenizer tokenizer;

/* Token attributes, from tokenizer.ggml.token_type (and llama.cpp's rule that tokens named
 * like <|im_end|>, <|fim_prefix|> or </s> are CONTROL whatever the file says). */
enum {
    TOK_ATTR_NORMAL = 1 << 0,
    TOK_ATTR_CONTROL = 1 << 1,      /* split out of text only when parse_special */
    TOK_ATTR_USER_DEFINED = 1 << 2, /* always split out of text, decoded verbatim */
    TOK_ATTR_UNKNOWN = 1 << 3,
    TOK_ATTR_UNUSED = 1 << 4,
    TOK_ATTR_BYTE = 1 << 5,
    TOK_ATTR_EOG = 1 << 6,          /* ends generation: EOS, EOT and the <|im_end|> family */
};

/* Reads the vocabulary of f. Needs only the tokenizer.ggml.* keys (a vocab-only file will
 * do). The tokenizer copies what it needs: f may be closed afterwards. */
int tokenizer_load(tokenizer **out, const gguf_file *f, herr *e);
void tokenizer_free(tokenizer *t);

int32_t tokenizer_n_vocab(const tokenizer *t);
const char *tokenizer_pre(const tokenizer *t); /* "qwen2", "qwen35", "llama-bpe", ... */
int32_t tokenizer_bos(const tokenizer *t);     /* -1 when the file names none */
int32_t tokenizer_eos(const tokenizer *t);
int32_t tokenizer_eot(const tokenizer *t);
int32_t tokenizer_pad(const tokenizer *t);
bool tokenizer_add_bos(const tokenizer *t);    /* tokenizer.ggml.add_bos_token */
bool tokenizer_is_eog(const tokenizer *t, int32_t id);
unsigned tokenizer_attr(const tokenizer *t, int32_t id); /* TOK_ATTR_*; 0 if id is out of range */
/* The id of the token whose text is exactly s[0..n) (as stored: "<|im_end|>", "Ġthe"), or -1. */
int32_t tokenizer_find(const tokenizer *t, const char *s, size_t n);
/* The stored text of a token (byte-encoded for normal tokens); NULL if id is out of range. */
const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len);
/* The bytes a token stands for. CONTROL and UNKNOWN tokens give their text only when
 * special is true, else nothing. NULL (and *len 0) if id is out of range. */
const char *tokenizer_piece(const tokenizer *t, int32_t id, bool special, size_t *len);

/* Splits text[0..len) into ids. Special tokens are split out first (the longest first, as
 * llama.cpp does): CONTROL ones only when parse_special, USER_DEFINED ones always. No BOS is
 * added (see tokenizer_add_bos). Writes at most cap ids to out and returns the total count;
 * call again with a larger out when it exceeds cap. cap >= 3 * len always suffices. */
int64_t tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool parse_special,
                         int32_t *out, int64_t cap);
/* The same into a new array (free() it); *n gets the count. */
int32_t *tokenizer_encode_alloc(const tokenizer *t, const char *text, size_t len, bool parse_special,
                                int64_t *n);
/* tokenizer_encode_alloc's ids of text, reusing those of an earlier text (prev_ids: prev's
 * ids under the same parse_special) up to the last special token of prev that ends well
 * inside the bytes both texts share and that no special token's text crosses: special tokens
 * are cut out first and the spans between them encoded apart, so the ids before such a cut
 * are the same whatever follows it. A chat's next turn so encodes its new messages, not its
 * history (the byte comparison aside). *reused: the ids taken from prev (0: encoded whole). */
int32_t *tokenizer_encode_after(const tokenizer *t, const char *text, size_t len, bool parse_special,
                                const char *prev, size_t prev_len, const int32_t *prev_ids, int64_t n_prev,
                                int64_t *n, int64_t *reused);
/* The BOS a prompt starts with: the vocabulary's BOS id where it adds one (as llama.cpp does:
 * tokenizer_add_bos and a BOS id), else -1. */
int32_t tokenizer_prompt_bos(const tokenizer *t);
/* The ids a prompt runs as: tokenizer_prompt_bos first (when add_bos is asked and there is
 * one), then the text's; a new array (free() it). */
int32_t *tokenizer_encode_prompt(const tokenizer *t, const char *text, size_t len, bool parse_special, bool add_bos,
                                 int64_t *n);

/* Streaming detokenizer: takes ids one at a time and hands out only whole UTF-8 characters,
 * holding back a character split across tokens until its last byte arrives. Bytes that can
 * never complete a character are passed through as they are. */
typedef struct tokdec {
    const tokenizer *tok;
    bool special;      /* render CONTROL tokens' text (tokdec_init sets true) */
    char *pend;        /* bytes not handed out yet */
    size_t n_pend, cap;
} tokdec;

void tokdec_init(tokdec *d, const tokenizer *t);
void tokdec_free(tokdec *d);
/* Adds id's bytes and copies out up to cap bytes of whole characters; returns the count.
 * Whatever did not fit in cap comes out on the next call. */
size_t tokdec_push(tokdec *d, int32_t id, char *buf, size_t cap);
/* At the end of the stream: copies out up to cap of the bytes still held (an incomplete
 * character included); call until it returns 0. */
size_t tokdec_flush(tokdec *d, char *buf, size_t cap);

#endif
