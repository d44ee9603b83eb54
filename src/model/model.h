/* model.h: the qwen35moe model (and the dense qwen35) as stored in GGUF: hyperparameters, the table of tensors
 * with their expected shapes (one table serves the loader's checks and `hearth gen`), and
 * read-only weight views into the mapped file. Weights never share a struct with a
 * sequence's state (state.h holds KV rows, lanes and rings). */
#ifndef HEARTH_MODEL_H
#define HEARTH_MODEL_H

#include <stdint.h>
#include <stdbool.h>
#include "format/gguf.h"
#include "base/util.h"

#define MODEL_MAX_LAYERS 128

typedef struct model_hparams {
    char arch[32];              /* "qwen35moe", or "qwen35" (dense) */
    bool dense;                 /* qwen35: a SwiGLU MLP of n_ff in every layer instead of the MoE */
    bool tied;                  /* no output.weight: the head is token_embd (tie_word_embeddings); set by
                                 * `hearth gen`'s tied presets, not read from a file (a file without
                                 * output.weight loads with token_embd as its head either way) */
    int64_t n_ff;               /* dense: the MLP's width (feed_forward_length) */
    int64_t n_layer;            /* trunk layers (block_count minus nextn_predict_layers) */
    int64_t n_layer_nextn;      /* MTP blocks stored after the trunk (block_count counts them); one is
                                 * read (model.has_mtp), more are ignored */
    int64_t n_ctx_train;
    int64_t n_embd;             /* E: hidden size */
    int64_t n_vocab;            /* V: rows of token_embd / output */
    int64_t n_head;             /* H: query heads */
    int64_t n_head_kv;          /* Hkv: key/value heads */
    int64_t head_dim;           /* D: key_length = value_length */
    float rms_eps;
    int64_t rope_dims;          /* rotated dims at the start of each head (partial RoPE) */
    float rope_theta;
    int32_t rope_sections[4];
    int64_t n_expert;           /* X: routed experts (0 where dense) */
    int64_t n_expert_used;      /* K: top-k */
    int64_t n_ff_exp;           /* F: expert FFN width */
    int64_t n_ff_shexp;         /* Fs: shared expert FFN width */
    int64_t ssm_d_conv;         /* conv kernel (4) */
    int64_t ssm_d_state;        /* S: key head dim = value head dim (128) */
    int64_t ssm_n_group;        /* Gk: key heads (16) */
    int64_t ssm_dt_rank;        /* Gv: value heads (32) */
    int64_t ssm_d_inner;        /* Gv*S */
    int64_t full_attn_interval; /* layer i is attention iff (i+1) % interval == 0 */
    bool is_recurrent[MODEL_MAX_LAYERS];
} model_hparams;

/* GDN derived sizes */
static inline int64_t hp_key_dim(const model_hparams *hp) { return hp->ssm_n_group * hp->ssm_d_state; }
static inline int64_t hp_value_dim(const model_hparams *hp) { return hp->ssm_dt_rank * hp->ssm_d_state; }
static inline int64_t hp_conv_dim(const model_hparams *hp) { return 2 * hp_key_dim(hp) + hp_value_dim(hp); }

/* What a tensor is for: the loader's slot and gen's initialisation and type choice. */
enum tensor_role {
    TR_TOKEN_EMBD, TR_OUTPUT_NORM, TR_OUTPUT,
    TR_ATTN_NORM, TR_POST_NORM,
    TR_ATTN_QKV, TR_ATTN_GATE, TR_SSM_CONV1D, TR_SSM_DT, TR_SSM_A, TR_SSM_BETA, TR_SSM_ALPHA,
    TR_SSM_NORM, TR_SSM_OUT,
    TR_ATTN_Q, TR_ATTN_K, TR_ATTN_V, TR_ATTN_OUT, TR_ATTN_Q_NORM, TR_ATTN_K_NORM,
    TR_FFN_GATE_INP, TR_FFN_GATE_EXPS, TR_FFN_UP_EXPS, TR_FFN_DOWN_EXPS,
    TR_FFN_GATE_INP_SHEXP, TR_FFN_GATE_SHEXP, TR_FFN_UP_SHEXP, TR_FFN_DOWN_SHEXP,
    TR_FFN_GATE, TR_FFN_UP, TR_FFN_DOWN, /* qwen35's dense MLP */
    /* the MTP block's own (its layer is an attention layer with the trunk's roles) */
    TR_NEXTN_EH_PROJ, TR_NEXTN_ENORM, TR_NEXTN_HNORM, TR_NEXTN_HEAD_NORM,
    TR_COUNT
};

typedef struct tensor_spec {
    char name[64];
    enum tensor_role role;
    int layer;                  /* -1 for global tensors */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];  /* ggml order: ne[0] is the input dim */
} tensor_spec;

/* The trunk's tensors in file order, then the MTP block's where hp->n_layer_nextn is 1 (its
 * layer blk.n_layer, then the nextn tensors; model_spec_is_mtp tells them). Returns the
 * count; *out is malloc'd. */
int64_t model_tensor_specs(const model_hparams *hp, tensor_spec **out);

static inline bool model_spec_is_mtp(const model_hparams *hp, const tensor_spec *s) { return s->layer >= hp->n_layer; }

/* Reads and checks the hyperparameters of a qwen35moe or qwen35 file. */
int model_hparams_read(const gguf_file *f, model_hparams *hp, herr *e);
/* Writes the keys of hp under its architecture's prefix (used by gen and convert). */
void model_hparams_write(const model_hparams *hp, gguf_writer *w);
/* Fills derived fields (is_recurrent) and checks consistency; -1 names the bad field. */
int model_hparams_check(model_hparams *hp, herr *e);

/* A weight as the engine sees it: a view into the mapping. */
typedef struct qtensor {
    const void *data;
    uint32_t type;              /* quant.h qtype */
    int64_t ne[GGUF_MAX_DIMS];
    size_t row_bytes;           /* bytes of one ne[0] row */
    const char *name;
} qtensor;

typedef struct model_layer {
    bool recurrent;
    qtensor attn_norm, post_norm;                        /* (E) */
    /* GDN */
    qtensor attn_qkv;       /* (E, conv_dim) */
    qtensor attn_gate;      /* (E, Gv*S) : z */
    qtensor ssm_conv1d;     /* (d_conv, conv_dim) */
    qtensor ssm_dt;         /* (Gv) */
    qtensor ssm_a;          /* (Gv) = -exp(A_log) */
    qtensor ssm_beta, ssm_alpha; /* (E, Gv) */
    qtensor ssm_norm;       /* (S) */
    qtensor ssm_out;        /* (Gv*S, E) */
    /* attention */
    qtensor attn_q;         /* (E, 2*H*D): query and gate interleaved per head */
    qtensor attn_k, attn_v; /* (E, Hkv*D) */
    qtensor attn_out;       /* (H*D, E) */
    qtensor attn_q_norm, attn_k_norm; /* (D) */
    /* MoE */
    qtensor ffn_gate_inp;   /* (E, X) */
    qtensor ffn_gate_exps, ffn_up_exps; /* (E, F, X) */
    qtensor ffn_down_exps;  /* (F, E, X) */
    qtensor ffn_gate_inp_shexp; /* (E) */
    qtensor ffn_gate_shexp, ffn_up_shexp; /* (E, Fs) */
    qtensor ffn_down_shexp; /* (Fs, E) */
    /* dense MLP (qwen35) */
    qtensor ffn_gate, ffn_up; /* (E, n_ff) */
    qtensor ffn_down;       /* (n_ff, E) */
} model_layer;

/* The multi-token-prediction (MTP) block, llama.cpp's "nextn" names: the draft of the token
 * after next from the trunk's last hidden row h (after output_norm) and the next token's
 * embedding e: x = eh_proj [enorm(e); hnorm(h)], one attention layer with its MoE
 * (layers[n_layer]), head_norm, then the trunk's output matrix (docs/MODEL.md). */
typedef struct model_mtp {
    qtensor eh_proj;        /* (2E, E): the embedding's E columns first, then h's */
    qtensor enorm, hnorm;   /* (E) */
    qtensor head_norm;      /* (E): shared_head_norm */
} model_mtp;

typedef struct model {
    gguf_file *file;
    model_hparams hp;
    qtensor token_embd;     /* (E, V) */
    qtensor output_norm;    /* (E) */
    qtensor output;         /* (E, V) */
    model_layer layers[MODEL_MAX_LAYERS]; /* the trunk's n_layer, then the MTP block's layer */
    bool has_mtp;           /* the file holds one whole MTP block (n_layer_nextn 1) */
    model_mtp mtp;
} model;

/* Opens a GGUF file and binds every tensor the table names, checking shape and type;
 * an error names the tensor and the expected shape. */
int model_load(model **out, const char *path, herr *e);
int model_load_file(model **out, gguf_file *f, herr *e); /* takes ownership of f on success */
void model_free(model *m);

#endif
