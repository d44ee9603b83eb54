/* test_cuda.c: the CUDA backend's kernels against the CPU on fresh random blocks. Without
 * a CUDA build or a GPU every test says SKIP, visibly (CI has no GPU). */
#include "harness.h"
#include "format/quant.h"
#include "base/util.h"
#ifdef HEARTH_CUDA
#include "engine/cuda/cuda.h"
#include "engine/cuda/kernels.h"
#endif
#include <math.h>

#ifdef HEARTH_CUDA
static bool have_gpu(void) {
    herr e;
    if (hcuda_device_count(&e) > 0) return true;
    harness_skip_why = "no CUDA device on this machine";
    return false;
}

/* random bytes make valid blocks for every type, save the f16 scales, which are set to
 * finite values so that NaN != NaN cannot hide a mismatch */
static void random_blocks(uint32_t t, uint8_t *buf, size_t bytes, int64_t rows, int64_t k, uint64_t seed) {
    for (size_t i = 0; i < bytes; i++) buf[i] = (uint8_t)rng_at(seed, i);
    size_t rb = qtype_row_bytes(t, k), bb = qtype_block_bytes(t);
    for (int64_t r = 0; r < rows; r++)
        for (size_t b = 0; b < rb / bb; b++) {
            uint8_t *blk = buf + (size_t)r * rb + b * bb;
            float d1 = 0.001f + 0.01f * rng_unit(seed ^ 1, (uint64_t)r * 1000 + b);
            f16_t h = f32_to_f16(d1);
            switch (t) {
            case QT_Q8_0: memcpy(blk, &h, 2); break;
            case QT_Q4_K: case QT_Q5_K: memcpy(blk, &h, 2); memcpy(blk + 2, &h, 2); break;
            case QT_Q6_K: memcpy(blk + bb - 2, &h, 2); break;
            case QT_F16: for (size_t i = 0; i < bb; i += 2) memcpy(blk + i, &h, 2); break;
            case QT_F32: { for (size_t i = 0; i < bb; i += 4) memcpy(blk + i, &d1, 4); break; }
            default: break;
            }
        }
}
#endif

TEST(dequant_matches_cpu) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const uint32_t types[] = {QT_F32, QT_F16, QT_BF16, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    const int64_t rows = 37, k = 1024;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        size_t bytes = qtype_row_bytes(t, k) * (size_t)rows;
        uint8_t *src = xmalloc(bytes);
        random_blocks(t, src, bytes, rows, k, 100 + ti);
        float *cpu = xmalloc(sizeof(float) * (size_t)(rows * k)), *gpu = xmalloc(sizeof(float) * (size_t)(rows * k));
        for (int64_t r = 0; r < rows; r++)
            quant_dequantize_row(t, src + (size_t)r * qtype_row_bytes(t, k), cpu + r * k, k);
        herr e;
        CHECK_MSG(hcuda_dequantize(t, src, gpu, rows, k, &e) == 0, "%s: %s", qtype_name(t), e.msg);
        int64_t bad = 0;
        for (int64_t i = 0; i < rows * k; i++) bad += memcmp(&cpu[i], &gpu[i], 4) != 0;
        /* same f32 operations in the same order on both sides: bit-identical, no tolerance */
        CHECK_MSG(bad == 0, "%s: %lld of %lld weights differ from the CPU", qtype_name(t), (long long)bad,
                  (long long)(rows * k));
        free(src);
        free(cpu);
        free(gpu);
    }
#endif
}

/* hk_matmul (dq8's reads of every type, the warp sums, the row tiles) against a double dot
 * product of the CPU's dequantized weights. Bound (Higham's, for recursive summation): a
 * lane sums K/32 products in order with fma, then 5 levels of the warp tree, so
 * |y - y_exact| <= gamma(K/32 + 6) * sum |w x|, gamma(m) = m u / (1 - m u), u = 2^-24. A
 * wrong scale, a nibble from the wrong half or a shifted group misses it by orders of
 * magnitude. Then batch invariance: row r of an 11-row launch equals, bit for bit, the same
 * row launched alone. */
TEST(matmul_matches_cpu) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const uint32_t types[] = {QT_F32, QT_F16, QT_BF16, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    const int64_t M = 37, K = 1024, n = 11;
    const double u = ldexp(1.0, -24), m_eff = (double)(K / 32 + 6), gamma = m_eff * u / (1 - m_eff * u);
    herr e;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti];
        const size_t rb = qtype_row_bytes(t, K), bytes = rb * (size_t)M;
        uint8_t *src = xmalloc(bytes);
        random_blocks(t, src, bytes, M, K, 200 + ti);
        if (t == QT_BF16) /* random bytes can be NaN: finite weights in [-1, 1] instead */
            for (int64_t i = 0; i < M * K; i++) {
                const float f = (float)(2 * rng_unit(250, (uint64_t)i) - 1);
                uint32_t b;
                memcpy(&b, &f, 4);
                const uint16_t h = (uint16_t)(b >> 16);
                memcpy(src + 2 * i, &h, 2);
            }
        float *wf = xmalloc(sizeof(float) * (size_t)(M * K)), *x = xmalloc(sizeof(float) * (size_t)(n * K));
        for (int64_t r = 0; r < M; r++) quant_dequantize_row(t, src + (size_t)r * rb, wf + r * K, K);
        for (int64_t i = 0; i < n * K; i++) x[i] = (float)(2 * rng_unit(300 + ti, (uint64_t)i) - 1);
        void *dw, *dx, *dy, *dy1;
        CHECK(hk_malloc(&dw, bytes, &e) == 0 && hk_malloc(&dx, sizeof(float) * (size_t)(n * K), &e) == 0 &&
              hk_malloc(&dy, sizeof(float) * (size_t)(n * M), &e) == 0 && hk_malloc(&dy1, sizeof(float) * (size_t)M, &e) == 0);
        hk_h2d(dw, src, bytes, &e);
        hk_h2d(dx, x, sizeof(float) * (size_t)(n * K), &e);
        hk_w w = {.d = dw, .type = t, .K = K, .M = M, .row_bytes = rb, .slice_bytes = bytes};
        CHECK_MSG(hk_matmul(&w, dx, K, n, dy, M, &e) == 0, "%s: %s", qtype_name(t), e.msg);
        CHECK_MSG(hk_matmul(&w, (const float *)dx + 5 * K, K, 1, dy1, M, &e) == 0, "%s: %s", qtype_name(t), e.msg);
        float *y = xmalloc(sizeof(float) * (size_t)(n * M)), *y1 = xmalloc(sizeof(float) * (size_t)M);
        CHECK_MSG(hk_d2h(y, dy, sizeof(float) * (size_t)(n * M), &e) == 0 && hk_d2h(y1, dy1, sizeof(float) * (size_t)M, &e) == 0,
                  "%s", e.msg);
        double worst = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t o = 0; o < M; o++) {
                double exact = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    exact += (double)wf[o * K + k] * x[r * K + k];
                    mag += fabs((double)wf[o * K + k] * x[r * K + k]);
                }
                worst = fmax(worst, fabs(y[r * M + o] - exact) / (gamma * mag));
            }
        CHECK_MSG(worst <= 1.0, "%s: error %.2f times the bound", qtype_name(t), worst);
        CHECK_MSG(!memcmp(y1, y + 5 * M, sizeof(float) * (size_t)M), "%s: row 5 alone differs from row 5 of 11", qtype_name(t));
        printf("  matmul %s: worst error %.3f of the bound; row alone = row in a tile\n", qtype_name(t), worst);
        hk_free(dw), hk_free(dx), hk_free(dy), hk_free(dy1);
        free(src), free(wf), free(x), free(y), free(y1);
    }
#endif
}

TEST(device_name) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    char name[256];
    herr e;
    CHECK(hcuda_device_name(0, name, sizeof name, &e) == 0);
    printf("  device 0: %s\n", name);
#endif
}

int main(void) {
    RUN(dequant_matches_cpu);
    RUN(matmul_matches_cpu);
    RUN(device_name);
    return harness_done();
}
