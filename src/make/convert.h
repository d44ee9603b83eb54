/* convert.h: `hearth convert`: a Hugging Face Qwen3.5/3.6 MoE checkpoint (config.json and
 * model.safetensors, or shards listed by model.safetensors.index.json) to a qwen35moe GGUF,
 * with the tensor transforms of llama.cpp's convert_hf_to_gguf.py for Qwen3_5MoeForCausalLM
 * / Qwen3_5MoeForConditionalGeneration (text part), so the file matches what users download. */
#ifndef HEARTH_CONVERT_H
#define HEARTH_CONVERT_H

#include <stdint.h>
#include <stdio.h>
#include "model/model.h"
#include "base/util.h"

typedef enum convert_quant { CONVERT_F32, CONVERT_Q8_0, CONVERT_Q4_K_M } convert_quant;

/* "f32" | "q8_0" | "q4_k_m" (case-insensitive); -1 otherwise. */
int convert_quant_parse(const char *s, convert_quant *q, herr *e);

typedef struct convert_opts {
    const char *hf_dir;         /* config.json + safetensors (+ tokenizer.json, optional) */
    const char *out_path;
    convert_quant quant;
    FILE *log;                  /* notes (stderr in the CLI); NULL: silent */
    bool no_mtp;                /* leave the MTP block (mtp.*) out, as llama.cpp's --no-mtp */
} convert_opts;

typedef struct convert_stats {
    int64_t n_tensors;          /* GGUF tensors written */
    int64_t n_vocab;
    int64_t n_unused;           /* HF tensors not read (vision tower, MTP block, ...) */
    uint64_t file_bytes;
    double seconds;
} convert_stats;

/* The hyperparameters config.json describes (checked; is_recurrent from layer_types). */
int convert_read_config(const char *hf_dir, model_hparams *hp, herr *e);
/* The same from config.json's text json[0..len) (the fuzz target's entry). */
int convert_parse_config(const char *json, size_t len, model_hparams *hp, herr *e);

/* Writes the GGUF; on error removes what it wrote and returns -1 with e naming the file,
 * the tensor or the config field. */
int convert_hf(const convert_opts *o, convert_stats *st, herr *e);

#endif
