/* gen.c: `hearth gen`'s library part: presets, llama.cpp's type choice, random weights and
 * the streaming parallel writer. Each tensor is cut into chunks of whole rows (~2 MiB of
 * output); threads take chunks in file order, fill a private buffer and pwrite it, so no
 * big tensor is ever held whole and the bytes do not depend on the thread count.
 *
 * Weights are generated element by element (F32/F16) or block by block (quantized types)
 * from the counter-based RNG keyed by rng_key(seed, tensor name) at the element or block
 * index: the value never depends on which thread or chunk produced it.
 *
 * Quantized tensors are generated directly in the quantized domain (random codes with
 * scales and mins chosen so the dequantized weights have mean 0 and the target std): one
 * code path for every preset. Quantizing 35e9 random floats with ggml's reference K-quant
 * search would take minutes on 16 cores; drawing codes costs two hash mixes per 8 bytes.
 * Consequence: the f32, q8_0 and q4_k_m files of one seed are three random models from
 * the same distributions, not quantizations of one another (compare an engine against a
 * reference on the same file's dequantized weights instead). */
#include "make/gen.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "make/vocab_import.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- presets ---- */

int gen_preset(const char *name, model_hparams *hp, herr *e) {
    memset(hp, 0, sizeof *hp);
    snprintf(hp->arch, sizeof hp->arch, "qwen35moe");
    /* common to the family */
    hp->rms_eps = 1e-6f;
    hp->rope_theta = 1e7f;
    hp->rope_sections[0] = 11; hp->rope_sections[1] = 11; hp->rope_sections[2] = 10; hp->rope_sections[3] = 0;
    hp->ssm_d_conv = 4;
    hp->ssm_d_state = 128;
    hp->full_attn_interval = 4;
    hp->n_layer_nextn = 0; /* no MTP block: it is ignored for inference anyway */
    if (!strcmp(name, "tiny")) { /* a few MB: unit tests, chat smoke tests */
        hp->n_embd = 256; hp->n_layer = 4; hp->n_head = 2; hp->n_head_kv = 1; hp->head_dim = 128;
        hp->rope_dims = 32; hp->n_expert = 8; hp->n_expert_used = 2; hp->n_ff_exp = 256; hp->n_ff_shexp = 256;
        hp->ssm_n_group = 2; hp->ssm_dt_rank = 4; hp->n_ctx_train = 8192; hp->n_vocab = 1024;
    } else if (!strcmp(name, "small")) { /* a few hundred MB at q4_k_m: CPU benchmarks */
        hp->n_embd = 1024; hp->n_layer = 8; hp->n_head = 8; hp->n_head_kv = 2; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_expert = 64; hp->n_expert_used = 4; hp->n_ff_exp = 256; hp->n_ff_shexp = 512;
        hp->ssm_n_group = 4; hp->ssm_dt_rank = 8; hp->n_ctx_train = 32768; hp->n_vocab = 16384;
    } else if (!strcmp(name, "q36")) { /* the shapes of Qwen3.6-35B-A3B (MODEL.md) */
        hp->n_embd = 2048; hp->n_layer = 40; hp->n_head = 16; hp->n_head_kv = 2; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_expert = 256; hp->n_expert_used = 8; hp->n_ff_exp = 512; hp->n_ff_shexp = 512;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 32; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else if (!strcmp(name, "wide")) { /* every real width of q36 (vocab, experts, heads), 3 GDN + 1 attention layer */
        hp->n_embd = 2048; hp->n_layer = 4; hp->n_head = 16; hp->n_head_kv = 2; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_expert = 256; hp->n_expert_used = 8; hp->n_ff_exp = 512; hp->n_ff_shexp = 512;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 32; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else if (!strcmp(name, "tiny-dense")) { /* tiny's widths, arch qwen35: the dense MLP's tests */
        snprintf(hp->arch, sizeof hp->arch, "qwen35");
        hp->n_embd = 256; hp->n_layer = 4; hp->n_head = 2; hp->n_head_kv = 1; hp->head_dim = 128;
        hp->rope_dims = 32; hp->n_ff = 512;
        hp->ssm_n_group = 2; hp->ssm_dt_rank = 4; hp->n_ctx_train = 8192; hp->n_vocab = 1024;
    } else if (!strcmp(name, "wide-dense")) { /* every width of q35-27b (vocab, heads, MLP), 3 GDN + 1 attention layer */
        snprintf(hp->arch, sizeof hp->arch, "qwen35");
        hp->n_embd = 5120; hp->n_layer = 4; hp->n_head = 24; hp->n_head_kv = 4; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_ff = 17408;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 48; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else if (!strcmp(name, "q35-0.8b")) { /* Qwen3.5-0.8B's shapes (docs/MODEL.md: the sources) */
        snprintf(hp->arch, sizeof hp->arch, "qwen35");
        hp->tied = true; /* tie_word_embeddings (docs/MODEL.md) */
        hp->n_embd = 1024; hp->n_layer = 24; hp->n_head = 8; hp->n_head_kv = 2; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_ff = 3584;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 16; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else if (!strcmp(name, "q35-2b")) { /* Qwen3.5-2B's shapes (docs/MODEL.md: the sources) */
        snprintf(hp->arch, sizeof hp->arch, "qwen35");
        hp->tied = true; /* tie_word_embeddings (docs/MODEL.md) */
        hp->n_embd = 2048; hp->n_layer = 24; hp->n_head = 8; hp->n_head_kv = 2; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_ff = 6144;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 16; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else if (!strcmp(name, "q35-4b")) { /* Qwen3.5-4B's shapes (docs/MODEL.md: the sources) */
        snprintf(hp->arch, sizeof hp->arch, "qwen35");
        hp->tied = true; /* tie_word_embeddings (docs/MODEL.md) */
        hp->n_embd = 2560; hp->n_layer = 32; hp->n_head = 16; hp->n_head_kv = 4; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_ff = 9216;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 32; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else if (!strcmp(name, "q35-9b")) { /* Qwen3.5-9B's shapes (docs/MODEL.md: the sources) */
        snprintf(hp->arch, sizeof hp->arch, "qwen35");
        hp->n_embd = 4096; hp->n_layer = 32; hp->n_head = 16; hp->n_head_kv = 4; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_ff = 12288;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 32; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else if (!strcmp(name, "q35-27b")) { /* Qwen3.5-27B's shapes (docs/MODEL.md: the sources) */
        snprintf(hp->arch, sizeof hp->arch, "qwen35");
        hp->n_embd = 5120; hp->n_layer = 64; hp->n_head = 24; hp->n_head_kv = 4; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_ff = 17408;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 48; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else if (!strcmp(name, "q35-122b")) { /* Qwen3.5-122B-A10B's shapes (docs/MODEL.md: the sources) */
        hp->n_embd = 3072; hp->n_layer = 48; hp->n_head = 32; hp->n_head_kv = 2; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_expert = 256; hp->n_expert_used = 8; hp->n_ff_exp = 1024; hp->n_ff_shexp = 1024;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 64; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else if (!strcmp(name, "q35-397b")) { /* Qwen3.5-397B-A17B's shapes (docs/MODEL.md: the sources) */
        hp->n_embd = 4096; hp->n_layer = 60; hp->n_head = 32; hp->n_head_kv = 2; hp->head_dim = 256;
        hp->rope_dims = 64; hp->n_expert = 512; hp->n_expert_used = 10; hp->n_ff_exp = 1024; hp->n_ff_shexp = 1024;
        hp->ssm_n_group = 16; hp->ssm_dt_rank = 64; hp->n_ctx_train = 262144; hp->n_vocab = 248320;
    } else {
        return herr_set(e, "unknown preset '%s' (tiny, small, wide, q36, q35-122b, q35-397b, tiny-dense, wide-dense, q35-0.8b, "
                           "q35-2b, q35-4b, q35-9b, q35-27b)", name);
    }
    hp->ssm_d_inner = hp->ssm_dt_rank * hp->ssm_d_state;
    return model_hparams_check(hp, e);
}

int gen_quant_parse(const char *s, gen_quant *q, herr *e) {
    char low[16];
    size_t n = strlen(s);
    if (n >= sizeof low) return herr_set(e, "unknown quantization '%.32s' (f32, q8_0, q4_k_m)", s);
    for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)s[i]);
    if (!strcmp(low, "f32")) *q = GEN_F32;
    else if (!strcmp(low, "q8_0")) *q = GEN_Q8_0;
    else if (!strcmp(low, "q4_k_m")) *q = GEN_Q4_K_M;
    else return herr_set(e, "unknown quantization '%s' (f32, q8_0, q4_k_m)", s);
    return 0;
}

const char *gen_quant_name(gen_quant q) {
    switch (q) {
    case GEN_F32: return "F32";
    case GEN_Q8_0: return "Q8_0";
    case GEN_Q4_K_M: return "Q4_K_M";
    }
    return "?";
}

uint32_t gen_file_type(gen_quant q) {
    switch (q) {
    case GEN_F32: return 0;     /* LLAMA_FTYPE_ALL_F32 */
    case GEN_Q8_0: return 7;    /* LLAMA_FTYPE_MOSTLY_Q8_0 */
    case GEN_Q4_K_M: return 15; /* LLAMA_FTYPE_MOSTLY_Q4_K_M */
    }
    return 0;
}

/* ---- type choice: llama.cpp's src/llama-quant.cpp, for the tensors qwen35moe has ---- */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* tensor_allows_quantization: 2-D/3-D "*weight" tensors except norms, the router and the
 * conv taps; 1-D tensors, ssm_a and ssm_dt.bias keep their (F32) type. */
static bool allows_quantization(const tensor_spec *s) {
    if (s->n_dims < 2) return false;
    if (!ends_with(s->name, "weight")) return false;
    if (strstr(s->name, "_norm.weight")) return false;
    if (strstr(s->name, "ffn_gate_inp.weight")) return false;
    if (strstr(s->name, "ssm_conv1d")) return false;
    return true;
}

enum category { CAT_OUTPUT, CAT_TOKEN_EMBD, CAT_ATTN_QKV, CAT_ATTN_V, CAT_ATTN_K, CAT_ATTN_Q, CAT_ATTN_OUTPUT,
                CAT_FFN_UP, CAT_FFN_GATE, CAT_FFN_DOWN, CAT_OTHER };

/* tensor_get_category: substring tests in llama.cpp's order ("ffn_gate_shexp" is FFN_GATE,
 * "attn_gate" and the ssm_* matrices are OTHER). */
static enum category category_of(const char *name) {
    if (!strcmp(name, "output.weight")) return CAT_OUTPUT;
    if (!strcmp(name, "token_embd.weight")) return CAT_TOKEN_EMBD;
    if (strstr(name, "attn_qkv.weight")) return CAT_ATTN_QKV;
    if (strstr(name, "attn_v.weight")) return CAT_ATTN_V;
    if (strstr(name, "attn_k.weight")) return CAT_ATTN_K;
    if (strstr(name, "attn_q.weight")) return CAT_ATTN_Q;
    if (strstr(name, "attn_output.weight")) return CAT_ATTN_OUTPUT;
    if (strstr(name, "ffn_up")) return CAT_FFN_UP;
    if (strstr(name, "ffn_gate")) return CAT_FFN_GATE;
    if (strstr(name, "ffn_down")) return CAT_FFN_DOWN;
    return CAT_OTHER;
}

static bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* tensor_type_fallback: a row that is not a whole number of blocks. */
static uint32_t type_fallback(uint32_t t, int64_t ncols) {
    if (ncols % qtype_block_elems(t) == 0) return t;
    switch (t) {
    case QT_Q4_K: t = QT_Q5_0; break;
    case QT_Q5_K: t = QT_Q5_1; break;
    case QT_Q6_K: t = QT_Q8_0; break;
    default: break; /* Q8_0: already a 32-block type */
    }
    if (ncols % qtype_block_elems(t) != 0) t = QT_F16;
    return t;
}

uint32_t gen_tensor_type(const model_hparams *hp, const tensor_spec *s, gen_quant q) {
    if (q == GEN_F32 || !allows_quantization(s)) return QT_F32;
    const uint32_t def = q == GEN_Q8_0 ? QT_Q8_0 : QT_Q4_K;
    uint32_t t = def;
    const bool q4km = q == GEN_Q4_K_M;
    const int64_t n_layer = hp->n_layer + hp->n_layer_nextn; /* hparams.n_layer_all */
    switch (category_of(s->name)) {
    case CAT_TOKEN_EMBD: /* untied: the default type; tied (no output.weight), the output's (llama.cpp's
                          * quantizer takes a tied token_embd for the output) */
        if (!hp->tied) break;
        /* fall through */
    case CAT_OUTPUT:
        if (s->ne[0] % qtype_block_elems(def) != 0) t = QT_Q8_0;
        else if (def != QT_Q8_0) t = QT_Q6_K;
        break;
    case CAT_ATTN_QKV: case CAT_ATTN_V:
        /* category_is_attn_v covers attn_qkv too, and its branch comes first, so the later
         * "attn_qkv -> Q5_K for Q4_K_M" branch of llama.cpp never fires. The counter
         * i_attention_wv runs over attn_v-like tensors in file order; every qwen35moe layer
         * has exactly one (attn_qkv in GDN layers, attn_v in attention layers), so it
         * equals the layer index and n_attention_wv the layer count. */
        if (q4km && use_more_bits(s->layer, n_layer)) t = QT_Q6_K;
        if (hp->n_expert == 8) t = QT_Q8_0; /* "for the 8-expert model" (tiny) */
        break;
    case CAT_ATTN_K:
        if (hp->n_expert == 8) t = QT_Q8_0;
        break;
    case CAT_ATTN_OUTPUT:
        if (q4km && hp->n_expert == 8) t = QT_Q5_K;
        break;
    case CAT_FFN_DOWN: /* experts and shared expert alike; the layer comes from the name */
        if (q4km && use_more_bits(s->layer, n_layer)) t = QT_Q6_K;
        break;
    default:
        break;
    }
    return type_fallback(t, s->ne[0]);
}

/* ---- weight initialisation ---- */

enum init_kind {
    INIT_ONES,    /* every norm weight: rmsnorm output passes through unscaled */
    INIT_NORMAL,  /* std * N(0,1) */
    INIT_SSM_A,   /* -exp(U(-1,1)): decay rates in [0.37, 2.7] per unit of dt */
    INIT_DT_BIAS, /* softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] (HF's init) */
};

typedef struct gen_tensor {
    const tensor_spec *spec;
    int64_t index;              /* in the writer */
    uint32_t type;
    enum init_kind init;
    float std;
    uint64_t key;               /* rng_key(seed, name) */
    size_t row_bytes;
    int64_t n_rows;
} gen_tensor;

/* Magnitudes. Every activation entering a matrix is RMS-normed or a product of normed
 * things of O(1) size, so a matrix with std 1/sqrt(fan_in) (fan_in = ne[0]) maps unit-RMS
 * inputs to unit-RMS outputs: q, k, v, z, gates, expert hidden units and logits all come
 * out O(1). Each layer then adds O(1) to the residual stream (mixer and MoE outputs are
 * further damped by SiLU/sigmoid gates and the router's convex weights), so after 40
 * layers the stream's RMS is a few units: finite, and rmsnorm undoes the scale. The router
 * (ffn_gate_inp, kept F32) sees unit-RMS h2 and gives logits of std 1 over the experts:
 * top-k picks vary by token and the softmax is far from one-hot. Special cases:
 * token_embd std 1 (any scale works, the first rmsnorm follows), but a tied one (no output.weight:
 * it is the head too) the output's 1/sqrt(E), so the logits stay O(1); ssm_conv1d std
 * 1/sqrt(kernel) = 1/sqrt(ne[0]) too, so the 4-tap conv keeps unit scale;
 * ffn_gate_inp_shexp {E} std 1/sqrt(E), a sigmoid gate of O(1) logits.
 * Measured with the float64 reference (tests/ref) on q36's shapes at q4_k_m with 32 experts
 * and a 1024 vocab, 8 tokens: the stream's RMS rises smoothly from 1.2 after layer 0 to 4.2
 * after layer 39, logits have std 1.0 (top probability 1-6%), and top-8 routing used 24-31
 * of the 32 experts per layer with top-1 weights 0.25-0.67. */
static void init_of(const model_hparams *hp, const tensor_spec *s, enum init_kind *kind, float *std) {
    *std = 1.0f / sqrtf((float)s->ne[0]);
    switch (s->role) {
    case TR_OUTPUT_NORM: case TR_ATTN_NORM: case TR_POST_NORM: case TR_SSM_NORM:
    case TR_ATTN_Q_NORM: case TR_ATTN_K_NORM: case TR_NEXTN_ENORM: case TR_NEXTN_HNORM: case TR_NEXTN_HEAD_NORM:
        *kind = INIT_ONES;
        break;
    case TR_SSM_A: *kind = INIT_SSM_A; break;
    case TR_SSM_DT: *kind = INIT_DT_BIAS; break;
    case TR_TOKEN_EMBD: *kind = INIT_NORMAL; *std = hp->tied ? *std : 1.0f; break;
    default: *kind = INIT_NORMAL; break;
    }
}

static float init_value(enum init_kind kind, float std, uint64_t key, uint64_t i) {
    switch (kind) {
    case INIT_ONES: return 1.0f;
    case INIT_NORMAL: return std * rng_normal(key, i);
    case INIT_SSM_A: return -expf(2.0f * rng_unit(key, i) - 1.0f);
    case INIT_DT_BIAS: {
        /* dt = exp(U(log 1e-3, log 1e-1)); bias = dt + log(-expm1(-dt)) is the inverse of
         * softplus, so softplus(0 + bias) = dt: slow decays, as after HF's init. */
        double dt = exp(log(1e-3) + (double)rng_unit(key, i) * (log(1e-1) - log(1e-3)));
        return (float)(dt + log(-expm1(-dt)));
    }
    }
    return 0;
}

/* ---- quantized blocks drawn directly ----
 * Block b of a tensor (b = row * blocks_per_row + j) uses the 64-bit words
 * rng_at(key, 32 b + k), k < 32. Code bits are uniform; scales are set so that the
 * dequantized weights w have E[w] = 0 and sd(w) = std:
 *   Q8_0  w = d q, q uniform in [-127, 127] (byte 0x80 -> 0, as ggml never writes -128),
 *         E[q^2] = 2 sum_{k<=127} k^2 / 256 = 5397.5; d's sign is random per block.
 *   Q4_K  w = d sc q - dmin m, q in 0..15; sc in {2,4,6,8}, m = 7.5 sc and dmin = d, so
 *         w = d sc (q - 7.5) exactly; E[sc^2] = 30, Var q = 255/12 = 21.25.
 *   Q5_K  the same with q in 0..31: sc in {2,4}, m = 15.5 sc; E[sc^2] = 10, Var q = 85.25.
 *   Q6_K  w = d sc (q - 32), q in 0..63, sc = +-{8,16,24,32} (random sign makes it
 *         symmetric); E[sc^2] = 480, E[(q-32)^2] = 341.5.
 * Scales vary per sub-block like real ones do. */
#define BLOCK_WORDS 32

static inline uint64_t bw(uint64_t key, uint64_t block, int k) { return rng_at(key, block * BLOCK_WORDS + (uint64_t)k); }

static void fill_bytes(uint8_t *dst, int n_words, uint64_t key, uint64_t block, int k0) {
    for (int k = 0; k < n_words; k++) {
        uint64_t r = bw(key, block, k0 + k);
        memcpy(dst + 8 * k, &r, 8); /* little-endian hosts only (x86-64, arm64) */
    }
}

/* ggml's 12-byte packing of eight 6-bit (scale, min) pairs (get_scale_min_k4's inverse). */
static void pack_scale_min_k4(uint8_t out[K_SCALE_SIZE], const uint8_t sc[8], const uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

static void gen_q8_0(block_q8_0 *blk, float std, uint64_t key, uint64_t b) {
    uint64_t r = bw(key, b, 0);
    float d = std / sqrtf(5397.5f);
    blk->d = f32_to_f16((r & 1) ? -d : d);
    fill_bytes((uint8_t *)blk->qs, 4, key, b, 1);
    for (int i = 0; i < QK8_0; i++)
        if (blk->qs[i] == INT8_MIN) blk->qs[i] = 0;
}

static void gen_q4_k(block_q4_K *blk, float std, uint64_t key, uint64_t b) {
    uint64_t r = bw(key, b, 0);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        int s = 1 + (int)((r >> (2 * j)) & 3); /* sc = 2s, m = 15s */
        sc[j] = (uint8_t)(2 * s);
        m[j] = (uint8_t)(15 * s);
    }
    pack_scale_min_k4(blk->scales, sc, m);
    blk->d = blk->dmin = f32_to_f16(std / sqrtf(30.0f * 21.25f));
    fill_bytes(blk->qs, 16, key, b, 1);
}

static void gen_q5_k(block_q5_K *blk, float std, uint64_t key, uint64_t b) {
    uint64_t r = bw(key, b, 0);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        int s = 1 + (int)((r >> j) & 1); /* sc = 2s, m = 31s */
        sc[j] = (uint8_t)(2 * s);
        m[j] = (uint8_t)(31 * s);
    }
    pack_scale_min_k4(blk->scales, sc, m);
    blk->d = blk->dmin = f32_to_f16(std / sqrtf(10.0f * 85.25f));
    fill_bytes(blk->qh, 4, key, b, 1);
    fill_bytes(blk->qs, 16, key, b, 5);
}

static void gen_q6_k(block_q6_K *blk, float std, uint64_t key, uint64_t b) {
    uint64_t r = bw(key, b, 0);
    for (int j = 0; j < QK_K / 16; j++) {
        int bits = (int)((r >> (4 * j)) & 7);
        int mag = 8 * (1 + (bits & 3));
        blk->scales[j] = (int8_t)((bits & 4) ? -mag : mag);
    }
    blk->d = f32_to_f16(std / sqrtf(480.0f * 341.5f));
    fill_bytes(blk->ql, 16, key, b, 1);
    fill_bytes(blk->qh, 8, key, b, 17);
}

static bool type_writable(uint32_t t) {
    return t == QT_F32 || t == QT_F16 || t == QT_Q8_0 || t == QT_Q4_K || t == QT_Q5_K || t == QT_Q6_K;
}

/* Fills rows [row0, row0 + n) of tensor t into dst. */
static void gen_rows(const gen_tensor *t, int64_t row0, int64_t n, uint8_t *dst) {
    const int64_t ne0 = t->spec->ne[0];
    switch (t->type) {
    case QT_F32: {
        float *o = (float *)dst;
        for (int64_t i = 0, base = row0 * ne0; i < n * ne0; i++) o[i] = init_value(t->init, t->std, t->key, (uint64_t)(base + i));
        return;
    }
    case QT_F16: {
        f16_t *o = (f16_t *)dst;
        for (int64_t i = 0, base = row0 * ne0; i < n * ne0; i++)
            o[i] = f32_to_f16(init_value(t->init, t->std, t->key, (uint64_t)(base + i)));
        return;
    }
    default:
        break;
    }
    HEARTH_CHECK(t->init == INIT_NORMAL);
    const int64_t bpr = ne0 / qtype_block_elems(t->type);
    const int64_t nb = n * bpr;
    const uint64_t b0 = (uint64_t)(row0 * bpr);
    for (int64_t i = 0; i < nb; i++) {
        const uint64_t b = b0 + (uint64_t)i;
        switch (t->type) {
        case QT_Q8_0: gen_q8_0((block_q8_0 *)dst + i, t->std, t->key, b); break;
        case QT_Q4_K: gen_q4_k((block_q4_K *)dst + i, t->std, t->key, b); break;
        case QT_Q5_K: gen_q5_k((block_q5_K *)dst + i, t->std, t->key, b); break;
        case QT_Q6_K: gen_q6_k((block_q6_K *)dst + i, t->std, t->key, b); break;
        default: HEARTH_DIE("gen: no generator for type %s", qtype_name(t->type));
        }
    }
}

/* ---- the parallel writer ---- */

#define CHUNK_BYTES ((size_t)2 << 20)

typedef struct gen_task {
    int32_t tensor;
    int64_t row0, n_rows;
} gen_task;

typedef struct gen_job {
    gguf_writer *w;
    const gen_tensor *tensors;
    const gen_task *tasks;
    int64_t n_tasks;
    size_t buf_bytes;
    atomic_llong next;
    atomic_int failed;
    atomic_ullong done_bytes;
    uint64_t total_bytes;
    FILE *progress;             /* NULL: no progress lines */
    double t0;
    pthread_mutex_t lock;       /* guards err and the progress line */
    int last_decile;
    herr err;
} gen_job;

static void *gen_worker(void *arg) {
    gen_job *j = arg;
    uint8_t *buf = xmalloc_aligned(64, j->buf_bytes);
    for (;;) {
        int64_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->n_tasks || atomic_load(&j->failed)) break;
        const gen_task *task = &j->tasks[k];
        const gen_tensor *t = &j->tensors[task->tensor];
        const size_t n = (size_t)task->n_rows * t->row_bytes;
        gen_rows(t, task->row0, task->n_rows, buf);
        herr e;
        if (gguf_writer_write(j->w, t->index, (uint64_t)task->row0 * t->row_bytes, buf, n, &e) < 0) {
            pthread_mutex_lock(&j->lock);
            if (!atomic_load(&j->failed)) j->err = e;
            atomic_store(&j->failed, 1);
            pthread_mutex_unlock(&j->lock);
            break;
        }
        uint64_t done = atomic_fetch_add(&j->done_bytes, n) + n;
        if (j->progress) {
            int decile = (int)(done * 10 / (j->total_bytes ? j->total_bytes : 1));
            pthread_mutex_lock(&j->lock);
            if (decile > j->last_decile) {
                j->last_decile = decile;
                fprintf(j->progress, "gen: %3d%% %.2f GB, %.1f s\n", decile * 10, (double)done / 1e9, time_now() - j->t0);
                fflush(j->progress);
            }
            pthread_mutex_unlock(&j->lock);
        }
    }
    free(buf);
    return NULL;
}

static int load_vocab(const gen_opts *o, vocab_def *v, herr *e) {
    if (!o->tokenizer) {
        vocab_def_builtin(v);
        return 0;
    }
    /* a folder stands for the tokenizer.json inside it */
    struct stat sb;
    if (stat(o->tokenizer, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        size_t n = strlen(o->tokenizer) + sizeof "/tokenizer.json";
        char *p = xmalloc(n);
        snprintf(p, n, "%s/tokenizer.json", o->tokenizer);
        int rc = vocab_def_from_hf(v, p, e);
        free(p);
        return rc;
    }
    return vocab_def_from_hf(v, o->tokenizer, e);
}

int gen_write(const gen_opts *o, gen_stats *st, herr *e) {
    const double t0 = time_now();
    model_hparams hp;
    gen_quant q = o->quant;
    if (gen_preset(o->preset, &hp, e) < 0) return -1;
    if (o->hparams) hp = *o->hparams;
    if (o->mtp) hp.n_layer_nextn = 1;
    if ((o->hparams || o->mtp) && model_hparams_check(&hp, e) < 0) return -1;
    if (!o->out_path || !o->out_path[0]) return herr_set(e, "no output file");

    vocab_def v;
    if (load_vocab(o, &v, e) < 0) return -1;
    if (v.n_tokens > hp.n_vocab) {
        int64_t grown = (v.n_tokens + 255) / 256 * 256;
        if (o->log)
            fprintf(o->log, "gen: the tokenizer has %" PRId64 " tokens, more than preset %s's vocab of %" PRId64
                    ": vocab grown to %" PRId64 "\n", v.n_tokens, o->preset, hp.n_vocab, grown);
        hp.n_vocab = grown;
        if (model_hparams_check(&hp, e) < 0) { vocab_def_free(&v); return -1; }
    }
    const int64_t n_real = v.n_real;
    vocab_def_pad(&v, hp.n_vocab);

    tensor_spec *specs;
    const int64_t n_specs = model_tensor_specs(&hp, &specs);
    gen_tensor *tens = xcalloc((size_t)n_specs, sizeof *tens);
    gguf_writer *w = gguf_writer_new();

    model_hparams_write(&hp, w);
    char name[96];
    snprintf(name, sizeof name, "hearth-gen %s %s seed %" PRIu64, o->preset, gen_quant_name(q), o->seed);
    gguf_set_str(w, "general.name", name);
    gguf_set_u32(w, "general.file_type", gen_file_type(q));
    gguf_set_u32(w, "general.quantization_version", 2); /* GGML_QNT_VERSION */
    gguf_set_str(w, "hearth.gen.preset", o->preset);
    gguf_set_u64(w, "hearth.gen.seed", o->seed);
    vocab_def_write(&v, w);

    int rc = -1;
    bool opened = false;
    gen_task *tasks = NULL;
    int64_t n_tasks = 0;
    uint64_t total = 0;
    size_t max_chunk = CHUNK_BYTES;
    for (int64_t i = 0; i < n_specs; i++) {
        const tensor_spec *s = &specs[i];
        gen_tensor *t = &tens[i];
        t->spec = s;
        t->type = gen_tensor_type(&hp, s, q);
        if (!type_writable(t->type)) {
            herr_set(e, "tensor %s would be %s (llama.cpp's fallback for rows of %" PRId64 "), which gen cannot write",
                     s->name, qtype_name(t->type), s->ne[0]);
            goto out;
        }
        init_of(&hp, s, &t->init, &t->std);
        t->key = rng_key(o->seed, s->name);
        t->row_bytes = qtype_row_bytes(t->type, s->ne[0]);
        HEARTH_CHECK(t->row_bytes > 0);
        t->n_rows = s->ne[1] * s->ne[2] * s->ne[3];
        t->index = gguf_add_tensor(w, s->name, t->type, s->n_dims, s->ne);
        int64_t per = (int64_t)(CHUNK_BYTES / t->row_bytes);
        if (per < 1) per = 1;
        if ((size_t)per * t->row_bytes > max_chunk) max_chunk = (size_t)per * t->row_bytes;
        n_tasks += (t->n_rows + per - 1) / per;
        total += (uint64_t)t->n_rows * t->row_bytes;
    }
    tasks = xmalloc((size_t)n_tasks * sizeof *tasks);
    n_tasks = 0;
    for (int64_t i = 0; i < n_specs; i++) {
        int64_t per = (int64_t)(CHUNK_BYTES / tens[i].row_bytes);
        if (per < 1) per = 1;
        for (int64_t r = 0; r < tens[i].n_rows; r += per)
            tasks[n_tasks++] = (gen_task){(int32_t)i, r, r + per <= tens[i].n_rows ? per : tens[i].n_rows - r};
    }

    if (gguf_writer_open(w, o->out_path, e) < 0) goto out;
    opened = true;
    for (int64_t i = 0; i < n_specs; i++)
        HEARTH_CHECK(gguf_writer_tensor_nbytes(w, tens[i].index) == (uint64_t)tens[i].n_rows * tens[i].row_bytes);

    int n_threads = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    if (n_threads > n_tasks) n_threads = (int)n_tasks;
    gen_job job = {.w = w, .tensors = tens, .tasks = tasks, .n_tasks = n_tasks, .buf_bytes = max_chunk,
                   .total_bytes = total, .t0 = t0, .last_decile = 0,
                   .progress = o->log && isatty(fileno(o->log)) ? o->log : NULL};
    atomic_init(&job.next, 0);
    atomic_init(&job.failed, 0);
    atomic_init(&job.done_bytes, 0);
    pthread_mutex_init(&job.lock, NULL);
    pthread_t *th = xcalloc((size_t)n_threads, sizeof *th);
    int started = 0;
    for (; started < n_threads - 1; started++)
        if (pthread_create(&th[started], NULL, gen_worker, &job) != 0) break; /* fewer threads still finish */
    gen_worker(&job);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);
    pthread_mutex_destroy(&job.lock);
    if (atomic_load(&job.failed)) {
        if (e) *e = job.err;
        goto out;
    }
    if (gguf_writer_close(w, e) < 0) goto out;
    if (st) {
        struct stat sb;
        st->n_tensors = n_specs;
        st->n_vocab = hp.n_vocab;
        st->file_bytes = stat(o->out_path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        st->seconds = time_now() - t0;
    }
    if (o->log && n_real != hp.n_vocab)
        fprintf(o->log, "gen: tokenizer: %" PRId64 " tokens, padded with [PAD] to %" PRId64 "\n", n_real, hp.n_vocab);
    rc = 0;
out:
    gguf_writer_free(w);
    if (rc < 0 && opened) unlink(o->out_path); /* no half-written model left behind */
    free(tasks);
    free(tens);
    free(specs);
    vocab_def_free(&v);
    return rc;
}
