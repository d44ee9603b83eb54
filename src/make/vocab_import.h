/* vocab_import.h: the tokenizer half of `hearth gen`: a byte-level BPE vocabulary as the
 * tokenizer.ggml.* keys of a GGUF file need it, either built in (256 GPT-2 byte symbols,
 * a few hundred merges learnt from a list of common English words, Qwen's special tokens,
 * a ChatML template) or imported from a Hugging Face tokenizer.json (+ tokenizer_config.json
 * beside it). It only describes a vocabulary; encoding text is tokenizer.{c,h}'s job. */
#ifndef HEARTH_VOCAB_IMPORT_H
#define HEARTH_VOCAB_IMPORT_H

#include <stdbool.h>
#include <stdint.h>
#include "format/gguf.h"
#include "base/util.h"

/* llama.cpp's token types (tokenizer.ggml.token_type values). */
enum vocab_token_type {
    VTT_NORMAL = 1, VTT_UNKNOWN = 2, VTT_CONTROL = 3, VTT_USER_DEFINED = 4, VTT_UNUSED = 5, VTT_BYTE = 6
};

typedef struct vocab_def {
    int64_t n_tokens;           /* entries in tokens/types (after vocab_def_pad: n_vocab) */
    int64_t n_real;             /* tokens the source defined (before padding to n_vocab) */
    char **tokens;              /* UTF-8, GPT-2 byte-to-unicode form; id = index */
    int32_t *types;             /* enum vocab_token_type */
    int64_t n_merges;
    char **merges;              /* "left right", rank = index */
    int64_t bos, eos, pad;      /* token ids, -1 when unset */
    bool add_bos, add_eos;
    char *chat_template;        /* NULL when the source has none */
    char pre[32];               /* tokenizer.ggml.pre */
} vocab_def;

/* The built-in vocabulary (deterministic: 256 bytes, 737 merged tokens, 7 special = 1000 tokens). */
void vocab_def_builtin(vocab_def *v);
/* Imports a byte-level BPE tokenizer.json; reads tokenizer_config.json (chat_template,
 * bos/eos/pad tokens, add_bos_token) and config.json (bos/eos ids) from the same folder
 * when present. Errors name the file and the field. */
int vocab_def_from_hf(vocab_def *v, const char *tokenizer_json, herr *e);
/* Pads with "[PAD{id}]" tokens of type UNUSED up to n_vocab (>= n_tokens). */
void vocab_def_pad(vocab_def *v, int64_t n_vocab);
/* The id of a token by its text, -1 if absent (linear: for a handful of look-ups). */
int64_t vocab_def_find(const vocab_def *v, const char *text);
/* Writes tokenizer.ggml.* and tokenizer.chat_template. v must outlive gguf_writer_open. */
void vocab_def_write(const vocab_def *v, gguf_writer *w);
void vocab_def_free(vocab_def *v);

/* GPT-2's byte-to-unicode map: the UTF-8 form (1 or 2 bytes + NUL) of byte b's symbol. */
void vocab_byte_symbol(uint8_t b, char out[4]);

#endif
