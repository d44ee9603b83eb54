/* gen.h: synthetic qwen35moe GGUF files (`hearth gen`): the presets' hyperparameters, the
 * per-tensor type choice of llama.cpp's F32 / Q8_0 / Q4_K_M file types, and a streaming,
 * multi-threaded writer of random weights that is deterministic per seed and independent
 * of the thread count. The weights are random, not trained: they exercise shapes, types
 * and numerics (finite through all layers, a router that spreads tokens), not quality. */
#ifndef HEARTH_GEN_H
#define HEARTH_GEN_H

#include <stdint.h>
#include <stdio.h>
#include "model/model.h"
#include "base/util.h"

typedef enum gen_quant { GEN_F32, GEN_Q8_0, GEN_Q4_K_M } gen_quant;

/* Fills hp for a preset named in gen.c (tiny, small, wide, q36, the q35-* sizes, tiny-dense; checked,
 * is_recurrent set); -1 for other names. */
int gen_preset(const char *name, model_hparams *hp, herr *e);
/* "f32" | "q8_0" | "q4_k_m" (case-insensitive, "q4_K_M" too); -1 otherwise. */
int gen_quant_parse(const char *s, gen_quant *q, herr *e);
const char *gen_quant_name(gen_quant q);
/* general.file_type: llama.cpp's LLAMA_FTYPE_ value (0 ALL_F32, 7 MOSTLY_Q8_0, 15 MOSTLY_Q4_K_M). */
uint32_t gen_file_type(gen_quant q);
/* The ggml type llama.cpp's quantizer would give this tensor (llama-quant.cpp rules). */
uint32_t gen_tensor_type(const model_hparams *hp, const tensor_spec *s, gen_quant q);

typedef struct gen_opts {
    const char *preset;         /* a gen_preset name: "tiny", "q36", "q35-9b", ... */
    gen_quant quant;
    uint64_t seed;
    const char *tokenizer;      /* HF tokenizer.json (or its folder); NULL: built-in vocabulary */
    int n_threads;              /* <= 0: every online core */
    const char *out_path;
    FILE *log;                  /* notes and progress (stderr in the CLI); NULL: silent */
    const model_hparams *hparams; /* non-NULL: these shapes instead of the preset's (tests);
                                   * the preset then only names the file */
    bool mtp;                   /* also the MTP block (nextn_predict_layers 1, blk.n_layer) */
} gen_opts;

typedef struct gen_stats {
    int64_t n_tensors;
    int64_t n_vocab;
    uint64_t file_bytes;
    double seconds;
} gen_stats;

/* Writes the file; on error removes what it wrote and returns -1 with e set. */
int gen_write(const gen_opts *o, gen_stats *st, herr *e);

#endif
