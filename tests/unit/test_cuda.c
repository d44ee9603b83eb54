/* test_cuda.c: the CUDA backend's kernels against the CPU on fresh random blocks. Without
 * a CUDA build or a GPU every test says SKIP, visibly (CI has no GPU). */
#include "harness.h"
#include "format/quant.h"
#include "base/util.h"
#ifdef HEARTH_CUDA
#include "engine/cuda/cuda.h"
#endif

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
    RUN(device_name);
    return harness_done();
}
