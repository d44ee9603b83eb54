/* quant_known.c: known answers from llama.cpp's ggml for hearth's quant tests. Built
 * against the peer build by make_quant_fixtures.sh; for each block type it writes one
 * fixture file of deterministic inputs and what ggml makes of them (format below).
 *   quant_known OUTDIR    write OUTDIR/<type>.bin
 *   quant_known --bench   print ggml's vec_dot time per block (for comparing speed) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml.h"
#include "ggml-cpu.h"

/* Q8_K has no entries in ggml's public type traits (only the CPU from_float); its
 * reference functions are exported from libggml-base, declared in ggml-quants.h */
void quantize_row_q8_K_ref(const float *x, void *y, int64_t k);
void dequantize_row_q8_K(const void *x, float *y, int64_t k);

/* Fixture file, little-endian:
 *   char magic[4] = "HQK1"; u32 type; u32 n; u32 act_type; u32 q_bytes; u32 act_bytes; u32 has_dot
 *   f32 x[n]               input row
 *   u8  q[q_bytes]         ggml's reference quantization of x (from_float_ref)
 *   f32 deq[n]             ggml's dequantization of q (to_float)
 *   f32 a[n]               activation row
 *   u8  act[act_bytes]     a as ggml's CPU backend quantizes it for the dot (from_float of
 *                          the vec_dot type; a copy for f32)
 *   f32 dot                ggml's vec_dot(q, act) (0 when has_dot is 0) */

static uint64_t lcg_state;
static double lcg_unit(void) { /* Knuth's MMIX LCG, top 53 bits */
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * (1.0 / 9007199254740992.0);
}
static double lcg_normal(void) { /* sum of four uniforms, variance 1: enough shape here */
    double s = 0;
    for (int k = 0; k < 4; k++) s += lcg_unit();
    return (s - 2.0) * sqrt(3.0);
}

/* Blocks of different character, so every code path of the quantizers runs: gaussian with
 * rare large outliers, an asymmetric uniform range (the K-quant mins matter), an all-zero
 * stretch, an all-positive stretch, and tiny values. */
static void make_input(float *x, int n, uint64_t seed) {
    lcg_state = seed;
    for (int i = 0; i < n; i++) {
        int part = (i / 32) % 8;
        double v;
        switch (part) {
        case 0: case 1: v = 0.5 * lcg_normal(); if (lcg_unit() < 0.03) v *= 25.0; break;
        case 2: v = -0.2 + 1.2 * lcg_unit(); break;
        case 3: v = (i / 256) % 2 ? 0.0 : 2.0 * lcg_normal(); break;
        case 4: v = 3.0 + lcg_unit(); break;
        case 5: v = 1e-3 * lcg_normal(); break;
        case 6: v = lcg_normal() * lcg_normal(); break;
        default: v = (i % 7) - 3.0; break;
        }
        x[i] = (float)v;
    }
}

/* f16/bf16 rows start with hand-picked values at rounding edges (ties, subnormals, the
 * top of the f16 range), all finite in f16 so the dot stays finite */
static void add_float_edges(float *x, int n) {
    static const float edges[] = {
        65504.f, 65519.f, -65519.99f, 6.1035156e-05f, 6.0975552e-05f, 5.9604645e-08f,
        2.9802322e-08f, 2.9802326e-08f, 8.940697e-08f, -1.0009765625f, 1.00048828125f,
        1.00146484375f, 3.0e-39f, -1e-45f, 1.0f / 3.0f,
        1.00390625f, 1.01171875f, 0.0f, -0.0f, 2048.5f, 2049.0f, 4097.0f,
    };
    int ne = (int)(sizeof edges / sizeof edges[0]);
    for (int i = 0; i < ne && i < n; i++) x[i] = edges[i];
}

static void write_all(FILE *f, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, f) != n) { perror("fixture write"); exit(1); }
}
static void put_u32(FILE *f, uint32_t v) { write_all(f, &v, 4); }

static void write_fixture(const char *dir, enum ggml_type t, int n) {
    const struct ggml_type_traits *tr = ggml_get_type_traits(t);
    const struct ggml_type_traits_cpu *tc = ggml_get_type_traits_cpu(t);
    enum ggml_type at = tc->vec_dot_type;
    int has_dot = tc->vec_dot != NULL && t != GGML_TYPE_Q8_K;
    if (!has_dot) at = GGML_TYPE_F32;
    size_t qb = ggml_row_size(t, n), ab = ggml_row_size(at, n);
    float *x = calloc((size_t)n, 4), *deq = calloc((size_t)n, 4), *a = calloc((size_t)n, 4);
    uint8_t *q = calloc(qb, 1), *act = calloc(ab, 1);
    make_input(x, n, 1000 + (uint64_t)t);
    if (t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) add_float_edges(x, n);
    if (t == GGML_TYPE_Q8_K) {
        quantize_row_q8_K_ref(x, q, n);
        dequantize_row_q8_K(q, deq, n);
    } else {
        tr->from_float_ref(x, q, n);
        tr->to_float(q, deq, n);
    }

    lcg_state = 77 + (uint64_t)t;
    for (int i = 0; i < n; i++) {
        /* for f16/bf16 the activation must be exact in the partner type (ggml's dot takes
         * f16/bf16 activations, hearth's takes f32): small multiples of 1/16 are */
        if (t == GGML_TYPE_F16 || t == GGML_TYPE_BF16)
            a[i] = (float)((int)(lcg_unit() * 33) - 16) / 16.0f;
        else
            a[i] = (float)lcg_normal();
    }
    if (at == GGML_TYPE_F32) memcpy(act, a, ab);
    else ggml_get_type_traits_cpu(at)->from_float(a, act, n);
    float dot = 0;
    if (has_dot) tc->vec_dot(n, &dot, 0, q, 0, act, 0, 1);

    char path[1024];
    snprintf(path, sizeof path, "%s/%s.bin", dir, ggml_type_name(t));
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    write_all(f, "HQK1", 4);
    put_u32(f, (uint32_t)t); put_u32(f, (uint32_t)n); put_u32(f, (uint32_t)at);
    put_u32(f, (uint32_t)qb); put_u32(f, (uint32_t)ab); put_u32(f, (uint32_t)has_dot);
    write_all(f, x, (size_t)n * 4);
    write_all(f, q, qb);
    write_all(f, deq, (size_t)n * 4);
    write_all(f, a, (size_t)n * 4);
    write_all(f, act, ab);
    write_all(f, &dot, 4);
    if (fclose(f)) { perror(path); exit(1); }
    printf("%s: n=%d q=%zu act=%zu dot=%.9g\n", path, n, qb, ab, dot);
    free(x); free(deq); free(a); free(q); free(act);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ggml's vec_dot over a 4096-wide row, repeated: ns per 256 weights, L1/L2-resident */
static void bench(void) {
    const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                    GGML_TYPE_Q6_K, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32};
    const int n = 4096, reps = 20000;
    float *x = malloc(n * 4), *a = malloc(n * 4);
    make_input(x, n, 5);
    lcg_state = 9;
    for (int i = 0; i < n; i++) a[i] = (float)lcg_normal();
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        enum ggml_type t = types[k];
        const struct ggml_type_traits_cpu *tc = ggml_get_type_traits_cpu(t);
        enum ggml_type at = tc->vec_dot_type;
        void *q = malloc(ggml_row_size(t, n)), *act = malloc(ggml_row_size(at, n));
        if (t == GGML_TYPE_F32) memcpy(q, x, n * 4);
        else ggml_get_type_traits(t)->from_float_ref(x, q, n);
        if (at == GGML_TYPE_F32) memcpy(act, a, n * 4);
        else ggml_get_type_traits_cpu(at)->from_float(a, act, n);
        float s = 0, tot = 0;
        double best = 1e30;
        for (int trial = 0; trial < 5; trial++) {
            double t0 = now_s();
            for (int r = 0; r < reps; r++) { tc->vec_dot(n, &s, 0, q, 0, act, 0, 1); tot += s; }
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        printf("ggml vec_dot %-5s %7.2f ns per 256 weights (checksum %g)\n", ggml_type_name(t),
               best * 1e9 / reps / (n / 256), tot);
        free(q); free(act);
    }
    free(x); free(a);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: quant_known OUTDIR | --bench\n");
        return 2;
    }
    ggml_cpu_init();
    if (!strcmp(argv[1], "--bench")) { bench(); return 0; }
    write_fixture(argv[1], GGML_TYPE_Q8_0, 256);
    write_fixture(argv[1], GGML_TYPE_Q4_K, 512);
    write_fixture(argv[1], GGML_TYPE_Q5_K, 512);
    write_fixture(argv[1], GGML_TYPE_Q6_K, 512);
    write_fixture(argv[1], GGML_TYPE_Q8_K, 512);
    write_fixture(argv[1], GGML_TYPE_F16, 256);
    write_fixture(argv[1], GGML_TYPE_BF16, 256);
    return 0;
}
