/* quant.h: ggml's block types, with their exact byte layouts (ggml-common.h):
 * dequantize rows, reference quantizers, and dot products of a weight row with an
 * activation row already quantized to the type's partner (quant_vec_dot_type).
 * Every dot has a plain scalar version (the reference) and an AVX2/FMA one picked at
 * run time; HEARTH_NO_SIMD=1 in the environment forces the scalar path. */
#ifndef HEARTH_QUANT_H
#define HEARTH_QUANT_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>

/* ggml type ids as stored in GGUF tensor infos. */
enum qtype {
    QT_F32 = 0, QT_F16 = 1, QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q5_1 = 7,
    QT_Q8_0 = 8, QT_Q8_1 = 9, QT_Q2_K = 10, QT_Q3_K = 11, QT_Q4_K = 12, QT_Q5_K = 13,
    QT_Q6_K = 14, QT_Q8_K = 15, QT_BF16 = 30, QT_COUNT = 43
};

#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t f16_t;   /* IEEE half, bits */
typedef uint16_t bf16_t;  /* bfloat16, bits */

typedef struct { f16_t d; int8_t qs[QK8_0]; } block_q8_0;                       /* 34 bytes */
typedef struct { f16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K; /* 144 */
typedef struct { f16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K; /* 176 */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; f16_t d; } block_q6_K; /* 210 */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K; /* 292 */

/* Names and sizes are known for every ggml type id (so `inspect` can print any file);
 * `supported` says whether hearth can compute with it. */
const char *qtype_name(uint32_t t);        /* "q4_K", … ; "type<N>" for unknown ids */
bool qtype_known(uint32_t t);              /* a ggml type id with a known block layout */
bool qtype_supported(uint32_t t);          /* F32 F16 BF16 Q8_0 Q4_K Q5_K Q6_K (and Q8_K) */
int64_t qtype_block_elems(uint32_t t);     /* weights per block (1 for float types) */
size_t qtype_block_bytes(uint32_t t);      /* bytes per block */
/* Bytes of a row of n weights; 0 when n is not a multiple of the block size. */
size_t qtype_row_bytes(uint32_t t, int64_t n);
uint32_t quant_vec_dot_type(uint32_t t);   /* Q8_0→Q8_0, K-quants→Q8_K, F32/F16/BF16→F32 */

float f16_to_f32(f16_t h);
f16_t f32_to_f16(float f);                 /* round to nearest even, like F16C */
float bf16_to_f32(bf16_t h);
bf16_t f32_to_bf16(float f);               /* round to nearest even; NaN stays NaN */

/* n must be a multiple of the block size (callers check shapes before). */
void quant_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n);
/* Reference quantizers, matching ggml's quantize_row_*_ref byte for byte. */
void quant_quantize_row(uint32_t t, const float *src, void *dst, int64_t n);
/* true when quant_quantize_row writes type t */
bool quant_can_quantize(uint32_t t);

/* dot(weight row of type t, activation row of type quant_vec_dot_type(t)), n weights. */
float quant_dot(uint32_t t, const void *w, const void *a, int64_t n);
float quant_dot_ref(uint32_t t, const void *w, const void *a, int64_t n); /* scalar path */
bool quant_simd_active(void);              /* true when the AVX2/FMA kernels are in use */

/* Many dots at once: y[r][o] = quant_dot(t, w + o * w_stride, a[r], n) for o < nw, r < na,
 * bit for bit (so results do not depend on how callers tile their work). The AVX2 path
 * unpacks each K-quant weight block once for up to 4 activation rows (8 with AVX-512). */
void quant_dot_rows(uint32_t t, int64_t n, const void *w, size_t w_stride, int nw, const void *const *a, int na,
                    float *const *y);
void quant_dot_rows_ref(uint32_t t, int64_t n, const void *w, size_t w_stride, int nw, const void *const *a, int na,
                        float *const *y);  /* one quant_dot_ref per pair */

/* Activations for the CPU engine: quantize a float row x (n values) to the partner type of
 * weight type wtype (Q8_K for K-quants, Q8_0 for Q8_0, a plain f32 copy for float weights),
 * the way ggml's CPU backend does on x86, so dots see the same operands as llama.cpp. */
void quant_quantize_act(uint32_t wtype, const float *x, void *dst, int64_t n);
size_t quant_act_row_bytes(uint32_t wtype, int64_t n);    /* bytes quant_quantize_act writes */

/* Internal: the AVX2/FMA kernels (src/quant_avx2.c). Call only through quant_dot, which
 * runs them after the CPU check; the tests compare them with quant_dot_ref. */
float quant_dot_avx2(uint32_t t, const void *w, const void *a, int64_t n);
void quant_dot_rows_avx2(uint32_t t, int64_t n, const void *w, size_t w_stride, int nw, const void *const *a, int na,
                         float *const *y);
/* whether quant_dot_rows_avx2 uses its AVX-512BW+VNNI tiles (CPU check; HEARTH_NO_AVX512=1 keeps AVX2) */
bool quant_avx512_active(void);

#endif
