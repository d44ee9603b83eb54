/* test_cuda.c: the CUDA backend's kernels against the CPU on fresh random inputs. Without
 * a CUDA build or a GPU every test says SKIP, visibly (CI has no GPU).
 *
 * The integer products are held to the CPU's bits, not to a band: the GPU rounds a row to
 * 8-bit blocks with quant_quantize_act's arithmetic and finishes every block with
 * quant_dot_ref's float expression in block order (kernels.h), so its product of a row must
 * equal quant_dot_ref on the same blocks exactly, whichever path (dp4a per output, tensor
 * cores per tile, pair by pair or grouped by expert) computed it. */
#include "harness.h"
#include "format/quant.h"
#include "engine/sampler.h"
#include "base/util.h"
#ifdef HEARTH_CUDA
#include "engine/cuda/cuda.h"
#include "engine/cuda/kernels.h"
#include "gdn_chunk_ref.h"
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

/* a weight of `rows` rows of K (M per slice) from the file's bytes into the GPU's layout */
static int dev_w(uint32_t t, int64_t K, int64_t M, int64_t rows, const void *src, hk_w *w, herr *e) {
    size_t db, ddb;
    hk_w_bytes(t, K, rows, &db, &ddb);
    void *d = NULL, *dd = NULL;
    if (hk_malloc(&d, db, e) < 0 || hk_malloc(&dd, ddb, e) < 0) return -1;
    const size_t rb = db / (size_t)rows, ddr = ddb / 2 / (size_t)rows;
    *w = (hk_w){.d = d, .dd = dd, .type = t, .K = K, .M = M, .row_bytes = rb, .slice_bytes = rb * (size_t)M,
                .dd_row = ddr, .dd_slice = ddr * (size_t)M};
    return hk_w_upload(w, src, rows, qtype_row_bytes(t, K), e);
}

static void dev_w_free(hk_w *w) {
    hk_free((void *)w->d);
    hk_free((void *)w->dd);
}

/* n rows of K rounded on the host for a weight of type wt (quant_quantize_act: the blocks
 * the reference dots read, into *blocks) and the same as an hk_act on the device */
static int dev_act(uint32_t wt, const float *x, int64_t n, int64_t K, void **blocks, hk_act *a, herr *e) {
    const size_t rb = quant_act_row_bytes(wt, K);
    uint8_t *bl = xmalloc(rb * (size_t)n);
    for (int64_t r = 0; r < n; r++) quant_quantize_act(wt, x + r * K, bl + (size_t)r * rb, K);
    *blocks = bl;
    const bool q80 = wt == QT_Q8_0;
    const int64_t nd = q80 ? K / 32 : K / 256;
    int8_t *q = xmalloc((size_t)(n * K));
    float *d = xmalloc(sizeof(float) * (size_t)(n * nd));
    int32_t *s = xmalloc(sizeof(int32_t) * (size_t)(n * (K / 32)));
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < nd; b++) {
            if (q80) {
                const block_q8_0 *y = (const block_q8_0 *)(bl + (size_t)r * rb) + b;
                memcpy(q + r * K + b * 32, y->qs, 32);
                d[r * nd + b] = f16_to_f32(y->d);
            } else {
                const block_q8_K *y = (const block_q8_K *)(bl + (size_t)r * rb) + b;
                memcpy(q + r * K + b * 256, y->qs, 256);
                d[r * nd + b] = y->d;
                for (int j = 0; j < 8; j++) s[r * (K / 32) + b * 8 + j] = y->bsums[2 * j] + y->bsums[2 * j + 1];
            }
        }
    *a = (hk_act){.K = K, .q80 = q80};
    int rc = hk_malloc((void **)&a->q, (size_t)(n * K), e) < 0 || hk_malloc((void **)&a->d, sizeof(float) * (size_t)(n * nd), e) < 0 ||
                     (!q80 && hk_malloc((void **)&a->s, sizeof(int32_t) * (size_t)(n * K / 32), e) < 0) ||
                     hk_h2d(a->q, q, (size_t)(n * K), e) < 0 || hk_h2d(a->d, d, sizeof(float) * (size_t)(n * nd), e) < 0 ||
                     (!q80 && hk_h2d(a->s, s, sizeof(int32_t) * (size_t)(n * K / 32), e) < 0)
                 ? -1
                 : 0;
    free(q), free(d), free(s);
    return rc;
}

static void dev_act_free(hk_act *a) {
    hk_free(a->q);
    hk_free(a->d);
    hk_free(a->s);
}

static float *randf(int64_t n, uint64_t seed, float lo, float hi) {
    float *x = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * rng_unit(seed, (uint64_t)i);
    return x;
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

/* hk_quantize and the rounding fused into hk_rmsnorm against quant_quantize_act: the same
 * bytes, scales and sums. Rows with the cases that decide a Q8_K scale: all zeros, the
 * largest magnitude twice with both signs (the first one sets the sign), values at .5
 * steps. */
TEST(rounding_matches_cpu) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const int64_t n = 9, K = 2048;
    float *x = randf(n * K, 400, -3.0f, 3.0f);
    memset(x + 1 * K, 0, sizeof(float) * 256);           /* row 1, block 0: zeros */
    x[2 * K + 17] = 5.0f, x[2 * K + 3] = -5.0f;          /* row 2, block 0: -5 first */
    x[3 * K + 300] = 5.0f, x[3 * K + 400] = -5.0f;       /* row 3, block 1: +5 first */
    for (int64_t i = 0; i < 256; i++) x[4 * K + i] = (float)(i % 64) * 0.5f - 16.0f; /* halves */
    herr e;
    void *dx, *dy, *dw;
    float *w = randf(K, 401, 0.5f, 1.5f);
    CHECK(hk_malloc(&dx, sizeof(float) * (size_t)(n * K), &e) == 0 && hk_malloc(&dy, sizeof(float) * (size_t)(n * K), &e) == 0 &&
          hk_malloc(&dw, sizeof(float) * (size_t)K, &e) == 0);
    hk_h2d(dx, x, sizeof(float) * (size_t)(n * K), &e);
    hk_h2d(dw, w, sizeof(float) * (size_t)K, &e);
    void *st;
    CHECK(hk_stream_new(&st, &e) == 0);
    for (int pass = 0; pass < 2; pass++) /* 0: hk_quantize of x; 1: hk_rmsnorm's rows */
        for (int f = 0; f < 2; f++) {
            const uint32_t wt = f ? QT_Q8_0 : QT_Q4_K;
            hk_act a = {.K = K, .q80 = f == 1};
            const int64_t nd = f ? K / 32 : K / 256;
            CHECK(hk_malloc((void **)&a.q, (size_t)(n * K), &e) == 0 && hk_malloc((void **)&a.d, 4 * (size_t)(n * nd), &e) == 0 &&
                  hk_malloc((void **)&a.s, 4 * (size_t)(n * K / 32), &e) == 0);
            float *src = x;
            if (pass == 0) CHECK_MSG(hk_quantize(st, dx, K, n, &a, &e) == 0, "%s", e.msg);
            else {
                CHECK_MSG(hk_rmsnorm(st, dx, NULL, dw, dy, n, K, 1e-6f, &a, NULL, &e) == 0, "%s", e.msg);
                src = xmalloc(sizeof(float) * (size_t)(n * K));
                CHECK(hk_stream_sync(st, &e) == 0);
                hk_d2h(src, dy, sizeof(float) * (size_t)(n * K), &e);
            }
            CHECK_MSG(hk_stream_sync(st, &e) == 0, "%s", e.msg);
            int8_t *q = xmalloc((size_t)(n * K));
            float *d = xmalloc(4 * (size_t)(n * nd));
            int32_t *s = xmalloc(4 * (size_t)(n * K / 32));
            hk_d2h(q, a.q, (size_t)(n * K), &e), hk_d2h(d, a.d, 4 * (size_t)(n * nd), &e);
            hk_d2h(s, a.s, 4 * (size_t)(n * K / 32), &e);
            const size_t rb = quant_act_row_bytes(wt, K);
            uint8_t *bl = xmalloc(rb);
            int64_t bad_q = 0, bad_d = 0, bad_s = 0;
            for (int64_t r = 0; r < n; r++) {
                quant_quantize_act(wt, src + r * K, bl, K);
                for (int64_t b = 0; b < nd; b++) {
                    if (f) {
                        const block_q8_0 *y = (const block_q8_0 *)bl + b;
                        bad_q += memcmp(y->qs, q + r * K + b * 32, 32) != 0;
                        const float dv = f16_to_f32(y->d);
                        bad_d += memcmp(&dv, &d[r * nd + b], 4) != 0;
                    } else {
                        const block_q8_K *y = (const block_q8_K *)bl + b;
                        bad_q += memcmp(y->qs, q + r * K + b * 256, 256) != 0;
                        bad_d += memcmp(&y->d, &d[r * nd + b], 4) != 0;
                        for (int j = 0; j < 8; j++) bad_s += s[r * (K / 32) + b * 8 + j] != y->bsums[2 * j] + y->bsums[2 * j + 1];
                    }
                }
            }
            CHECK_MSG(bad_q == 0 && bad_d == 0 && bad_s == 0, "%s %s: %lld blocks' bytes, %lld scales, %lld sums differ",
                      pass ? "rmsnorm" : "quantize", f ? "Q8_0" : "Q8_K", (long long)bad_q, (long long)bad_d, (long long)bad_s);
            free(q), free(d), free(s), free(bl);
            if (pass) free(src);
            hk_free(a.q), hk_free(a.d), hk_free(a.s);
        }
    printf("  Q8_K and Q8_0 rounding (alone and fused into rmsnorm): the CPU's bytes, scales and sums\n");
    hk_stream_free(st);
    hk_free(dx), hk_free(dy), hk_free(dw);
    free(x), free(w);
#endif
}

/* Every quantized type, every path: dp4a per output (n <= 8) and tensor-core tiles (n > 8,
 * tiles of 32 and 64 rows, M not a multiple of the 64-row tile), against quant_dot_ref on
 * the same blocks, bit for bit; with add, y + the product, one add. */
TEST(qmatmul_matches_ref) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const uint32_t types[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q8_0};
    const int64_t M = 100, ns[] = {1, 2, 3, 8, 9, 40, 100};
    herr e;
    void *st;
    CHECK(hk_stream_new(&st, &e) == 0);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int kk = 0; kk < 4; kk++) {
            /* one row takes 8, 16 or 32 lanes and 1, 2 or 4 steps in flight by its block count:
             * 256 .. 4096 inputs reach every form */
            const uint32_t t = types[ti];
            const int64_t Ks[] = {256, 512, 2048, 4096}, K = Ks[kk], nmax = 100;
            const size_t rb = qtype_row_bytes(t, K);
            uint8_t *src = xmalloc(rb * (size_t)M);
            random_blocks(t, src, rb * (size_t)M, M, K, 500 + ti * 7 + (uint64_t)kk);
            hk_w w;
            CHECK_MSG(dev_w(t, K, M, M, src, &w, &e) == 0, "%s", e.msg);
            float *x = randf(nmax * K, 600 + ti, -2.0f, 2.0f);
            void *blocks;
            hk_act a;
            CHECK_MSG(dev_act(t, x, nmax, K, &blocks, &a, &e) == 0, "%s", e.msg);
            const size_t arb = quant_act_row_bytes(t, K);
            float *ref = xmalloc(sizeof(float) * (size_t)(nmax * M)), *y = xmalloc(sizeof(float) * (size_t)(nmax * M));
            for (int64_t r = 0; r < nmax; r++)
                for (int64_t o = 0; o < M; o++)
                    ref[r * M + o] = quant_dot_ref(t, src + (size_t)o * rb, (const uint8_t *)blocks + (size_t)r * arb, K);
            void *dy;
            CHECK(hk_malloc(&dy, sizeof(float) * (size_t)(nmax * M), &e) == 0);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (int fo = 0; fo < 4; fo++) { /* tensor cores: mmq.cuh's two forms of Q4_K and Q5_K, each with
                                                    * capped registers (the default) and uncapped (HEARTH_CUDA_MMQ_OCC=0) */
                    const int64_t n = ns[ni];
                    const int form = fo & 1;
                    hk_mmq_form(form == 0);
                    hk_mmq_occ(fo < 2);
                    hk_memset(dy, 0xff, sizeof(float) * (size_t)(n * M), &e);
                    CHECK_MSG(hk_matmul(st, &w, NULL, 0, &a, n, dy, M, false, &e) == 0, "%s", e.msg);
                    CHECK_MSG(hk_stream_sync(st, &e) == 0, "%s n=%lld: %s", qtype_name(t), (long long)n, e.msg);
                    hk_d2h(y, dy, sizeof(float) * (size_t)(n * M), &e);
                    int64_t bad = 0, first = -1;
                    for (int64_t i = 0; i < n * M; i++)
                        if (memcmp(&y[i], &ref[i], 4)) bad++, first = first < 0 ? i : first;
                    CHECK_MSG(bad == 0, "%s K=%lld n=%lld form %d%s: %lld of %lld products differ from quant_dot_ref (first: "
                              "row %lld out %lld: %.9g vs %.9g)", qtype_name(t), (long long)K, (long long)n, form + 1,
                              fo < 2 ? "" : ", registers uncapped",
                              (long long)bad, (long long)(n * M), (long long)(first / M), (long long)(first % M),
                              first < 0 ? 0.0 : y[first], first < 0 ? 0.0 : ref[first]);
                }
            hk_mmq_form(true);
            hk_mmq_occ(true);
            /* two weights in one launch (hk_matmul2: rows past the first's M are the second's, a
             * block of rows straddling the two): both outputs equal the reference */
            for (int pi = 0; pi < 2; pi++) {
                const int64_t n = pi ? 3 : 1;
                void *dy2;
                CHECK(hk_malloc(&dy2, sizeof(float) * (size_t)(n * M), &e) == 0);
                hk_memset(dy, 0xff, sizeof(float) * (size_t)(n * M), &e);
                hk_memset(dy2, 0xff, sizeof(float) * (size_t)(n * M), &e);
                CHECK_MSG(hk_matmul2(st, &w, &w, &a, n, dy, dy2, M, &e) == 0 && hk_stream_sync(st, &e) == 0, "%s", e.msg);
                for (int out = 0; out < 2; out++) {
                    hk_d2h(y, out ? dy2 : dy, sizeof(float) * (size_t)(n * M), &e);
                    int64_t bad = 0;
                    for (int64_t i = 0; i < n * M; i++) bad += memcmp(&y[i], &ref[i], 4) != 0;
                    CHECK_MSG(bad == 0, "%s K=%lld hk_matmul2 n=%lld output %d: %lld of %lld differ", qtype_name(t),
                              (long long)K, (long long)n, out + 1, (long long)bad, (long long)(n * M));
                }
                hk_free(dy2);
            }
            /* add: y = 1 + the product for n = 3 and n = 40 */
            for (int pi = 0; pi < 2; pi++) {
                const int64_t n = pi ? 40 : 3;
                float *ones = xmalloc(sizeof(float) * (size_t)(n * M));
                for (int64_t i = 0; i < n * M; i++) ones[i] = 1.0f;
                hk_h2d(dy, ones, sizeof(float) * (size_t)(n * M), &e);
                CHECK(hk_matmul(st, &w, NULL, 0, &a, n, dy, M, true, &e) == 0 && hk_stream_sync(st, &e) == 0);
                hk_d2h(y, dy, sizeof(float) * (size_t)(n * M), &e);
                int64_t bad = 0;
                for (int64_t i = 0; i < n * M; i++) {
                    const float want = 1.0f + ref[i];
                    bad += memcmp(&y[i], &want, 4) != 0;
                }
                CHECK_MSG(bad == 0, "%s add n=%lld: %lld differ", qtype_name(t), (long long)n, (long long)bad);
                free(ones);
            }
            printf("  %s K=%lld: n = 1, 2, 3, 8 (dp4a), 9, 40, 100 (tensor cores), two weights in one launch equal "
                   "quant_dot_ref bit for bit\n",
                   qtype_name(t), (long long)K);
            hk_free(dy);
            dev_w_free(&w);
            dev_act_free(&a);
            free(src), free(x), free(blocks), free(ref), free(y);
        }
    hk_stream_free(st);
#endif
}

/* Expert products: X experts with a shared expert, pairs pair by pair (few rows) and grouped
 * by expert on the GPU (hk_moe_sort, tensor cores), for the gate/up shape (input row =
 * pair / K) and the down shape (input row = pair, the shared rows after the routed), against
 * quant_dot_ref bit for bit. */
TEST(moe_matmul_matches_ref) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const uint32_t types[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q8_0};
    const int X = 16, Kx = 4;
    const int64_t M = 72, K = 512, rows_list[] = {3, 8, 40, 150};
    herr e;
    void *st;
    CHECK(hk_stream_new(&st, &e) == 0);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++)
            for (int down = 0; down < 2; down++) {
                const uint32_t t = types[ti];
                const int64_t n = rows_list[ri], nr = n * Kx, np = nr + n;
                const size_t rb = qtype_row_bytes(t, K);
                uint8_t *src = xmalloc(rb * (size_t)(M * X)), *ssrc = xmalloc(rb * (size_t)M);
                random_blocks(t, src, rb * (size_t)(M * X), M * X, K, 700 + ti);
                random_blocks(t, ssrc, rb * (size_t)M, M, K, 710 + ti);
                hk_w w, ws;
                CHECK_MSG(dev_w(t, K, M, M * X, src, &w, &e) == 0 && dev_w(t, K, M, M, ssrc, &ws, &e) == 0, "%s", e.msg);
                const int64_t arows = down ? np : n; /* input rows: the pairs' own (down) or the rows' (gate/up) */
                float *x = randf(arows * K, 720 + ri, -2.0f, 2.0f);
                void *blocks;
                hk_act a;
                CHECK_MSG(dev_act(t, x, arows, K, &blocks, &a, &e) == 0, "%s", e.msg);
                int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)nr);
                for (int64_t r = 0; r < n; r++) /* K distinct experts per row */
                    for (int k = 0; k < Kx; k++) sel[r * Kx + k] = (int32_t)((rng_at(730 + ri, (uint64_t)r) + (uint64_t)k * 5) % X);
                const size_t arb = quant_act_row_bytes(t, K);
                float *ref = xmalloc(sizeof(float) * (size_t)(np * M)), *y = xmalloc(sizeof(float) * (size_t)(np * M));
                for (int64_t p = 0; p < np; p++) {
                    const int64_t ar = p < nr ? (down ? p : p / Kx) : (down ? p : p - nr);
                    const uint8_t *wr = p < nr ? src + (size_t)(sel[p] * M) * rb : ssrc;
                    for (int64_t o = 0; o < M; o++)
                        ref[p * M + o] = quant_dot_ref(t, wr + (size_t)o * rb, (const uint8_t *)blocks + (size_t)ar * arb, K);
                }
                void *dsel, *dy, *dy2, *doffs, *dlist, *dtiles;
                CHECK(hk_malloc(&dsel, 4 * (size_t)nr, &e) == 0 && hk_malloc(&dy, sizeof(float) * (size_t)(np * M), &e) == 0 &&
                      hk_malloc(&dy2, sizeof(float) * (size_t)(np * M), &e) == 0 &&
                      hk_malloc(&doffs, 4 * (size_t)(X + 1), &e) == 0 && hk_malloc(&dlist, 4 * (size_t)nr, &e) == 0 &&
                      hk_malloc(&dtiles, 4 * (size_t)(2 * (nr + X) + 2), &e) == 0);
                hk_h2d(dsel, sel, 4 * (size_t)nr, &e);
                /* pairs; sorted (tensor cores) in tiles of 16 and of 32, each in mmq.cuh's two forms */
                for (int way = 0; way < 7; way++) { /* 5, 6: tiles of 16 and 32 with registers uncapped (HEARTH_CUDA_MMQ_OCC=0) */
                    const int sorted = way > 0, tile = way == 3 || way == 4 || way == 6 ? 32 : 16;
                    hk_mmq_form(way != 2 && way != 4);
                    hk_mmq_occ(way < 5);
                    hk_moe_sorted so = {.offs = doffs, .list = dlist, .tiles = dtiles,
                                        .max_tiles = nr / tile + (X < nr ? X : nr), .tile = tile};
                    if (sorted) CHECK_MSG(hk_moe_sort(st, dsel, nr, X, tile, doffs, dlist, dtiles, &e) == 0, "%s", e.msg);
                    hk_memset(dy, 0xff, sizeof(float) * (size_t)(np * M), &e); /* NaN: every output must be written */
                    hk_memset(dy2, 0xff, sizeof(float) * (size_t)(np * M), &e);
                    /* gate/up: the same weights twice in one launch (hk_moe_matmul2), both outputs checked */
                    if (down)
                        CHECK_MSG(hk_moe_matmul(st, &w, &ws, dsel, nr, np, 1, nr, &a, sorted ? &so : NULL, dy, M, &e) == 0, "%s",
                                  e.msg);
                    else
                        CHECK_MSG(hk_moe_matmul2(st, &w, &ws, &w, &ws, dsel, nr, np, Kx, 0, &a, sorted ? &so : NULL, dy, dy2, M,
                                                 &e) == 0,
                                  "%s", e.msg);
                    CHECK_MSG(hk_stream_sync(st, &e) == 0, "%s", e.msg);
                    for (int out = 0; out < (down ? 1 : 2); out++) {
                        hk_d2h(y, out ? dy2 : dy, sizeof(float) * (size_t)(np * M), &e);
                        int64_t bad = 0;
                        for (int64_t i = 0; i < np * M; i++) bad += memcmp(&y[i], &ref[i], 4) != 0;
                        CHECK_MSG(bad == 0, "%s %s rows=%lld %s: %lld of %lld products differ", qtype_name(t),
                                  down ? "down" : out ? "up (second weight)" : "gate", (long long)n,
                                  !sorted ? "pairs" : way == 1 ? "tiles of 16" : way == 2 ? "tiles of 16, first form"
                                  : way == 3 ? "tiles of 32" : way == 4 ? "tiles of 32, first form"
                                  : way == 5 ? "tiles of 16, registers uncapped" : "tiles of 32, registers uncapped",
                                  (long long)bad, (long long)(np * M));
                    }
                }
                hk_mmq_form(true);
                hk_mmq_occ(true);
                hk_free(dsel), hk_free(dy), hk_free(dy2), hk_free(doffs), hk_free(dlist), hk_free(dtiles);
                dev_w_free(&w), dev_w_free(&ws), dev_act_free(&a);
                free(src), free(ssrc), free(x), free(blocks), free(sel), free(ref), free(y);
            }
    printf("  experts Q4_K, Q5_K, Q6_K, Q8_0: pair by pair and sorted by expert (tiles of 16 and 32, both forms) equal "
           "quant_dot_ref bit for bit\n");
    hk_stream_free(st);
#endif
}

/* The down product that makes its SwiGLU rows inside its launch (decode) against the two
 * launches it replaces (hk_swiglu_quant, then hk_moe_matmul pair by pair), bit for bit: rows
 * of 512 (two 256-blocks: 16 lanes a row) and 768 (three: a warp a row), routed pairs and the
 * shared expert's. */
TEST(down_swiglu_matches_apart) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const uint32_t types[] = {QT_Q4_K, QT_Q6_K, QT_Q8_0};
    const int X = 16, Kx = 4;
    const int64_t M = 72, n = 3, nr = n * Kx, np = nr + n, Fs[] = {512, 768};
    herr e;
    void *st;
    CHECK(hk_stream_new(&st, &e) == 0);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t fi = 0; fi < sizeof Fs / sizeof Fs[0]; fi++) {
            const uint32_t t = types[ti];
            const int64_t F = Fs[fi];
            const size_t rb = qtype_row_bytes(t, F);
            uint8_t *src = xmalloc(rb * (size_t)(M * X)), *ssrc = xmalloc(rb * (size_t)M);
            random_blocks(t, src, rb * (size_t)(M * X), M * X, F, 900 + ti);
            random_blocks(t, ssrc, rb * (size_t)M, M, F, 910 + ti);
            hk_w w, ws;
            CHECK_MSG(dev_w(t, F, M, M * X, src, &w, &e) == 0 && dev_w(t, F, M, M, ssrc, &ws, &e) == 0, "%s", e.msg);
            float *g = randf(np * F, 920 + fi, -4.0f, 4.0f), *u = randf(np * F, 930 + fi, -2.0f, 2.0f);
            int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)nr);
            for (int64_t p = 0; p < nr; p++) sel[p] = (int32_t)((rng_at(940, (uint64_t)p) + (uint64_t)(p % Kx) * 5) % X);
            const bool q80 = t == QT_Q8_0;
            hk_act a = {.K = F, .q80 = q80};
            void *dg, *dg2, *du, *dsel, *dy, *dy2;
            CHECK(hk_malloc(&dg, sizeof(float) * (size_t)(np * F), &e) == 0 && hk_malloc(&dg2, sizeof(float) * (size_t)(np * F), &e) == 0 &&
                  hk_malloc(&du, sizeof(float) * (size_t)(np * F), &e) == 0 && hk_malloc(&dsel, 4 * (size_t)nr, &e) == 0 &&
                  hk_malloc(&dy, sizeof(float) * (size_t)(np * M), &e) == 0 && hk_malloc(&dy2, sizeof(float) * (size_t)(np * M), &e) == 0 &&
                  hk_malloc((void **)&a.q, (size_t)(np * F), &e) == 0 &&
                  hk_malloc((void **)&a.d, sizeof(float) * (size_t)(np * F / 32), &e) == 0 &&
                  hk_malloc((void **)&a.s, sizeof(int32_t) * (size_t)(np * F / 32), &e) == 0);
            hk_h2d(dg, g, sizeof(float) * (size_t)(np * F), &e), hk_h2d(dg2, g, sizeof(float) * (size_t)(np * F), &e);
            hk_h2d(du, u, sizeof(float) * (size_t)(np * F), &e), hk_h2d(dsel, sel, 4 * (size_t)nr, &e);
            hk_memset(dy, 0xff, sizeof(float) * (size_t)(np * M), &e); /* NaN: every output must be written */
            CHECK_MSG(hk_moe_down_swiglu(st, &w, &ws, dsel, nr, np, dg, du, dy, M, NULL, &e) == 0, "%s", e.msg);
            CHECK_MSG(hk_swiglu_quant(st, dg2, du, np, F, &a, &e) == 0 &&
                          hk_moe_matmul(st, &w, &ws, dsel, nr, np, 1, nr, &a, NULL, dy2, M, &e) == 0 && hk_stream_sync(st, &e) == 0,
                      "%s", e.msg);
            float *y = xmalloc(sizeof(float) * (size_t)(np * M)), *y2 = xmalloc(sizeof(float) * (size_t)(np * M));
            hk_d2h(y, dy, sizeof(float) * (size_t)(np * M), &e), hk_d2h(y2, dy2, sizeof(float) * (size_t)(np * M), &e);
            int64_t bad = 0;
            for (int64_t i = 0; i < np * M; i++) bad += memcmp(&y[i], &y2[i], 4) != 0;
            CHECK_MSG(bad == 0, "%s F=%lld: %lld of %lld products differ from SwiGLU then the down product", qtype_name(t),
                      (long long)F, (long long)bad, (long long)(np * M));
            hk_free(dg), hk_free(dg2), hk_free(du), hk_free(dsel), hk_free(dy), hk_free(dy2), dev_act_free(&a);
            dev_w_free(&w), dev_w_free(&ws);
            free(src), free(ssrc), free(g), free(u), free(sel), free(y), free(y2);
        }
    printf("  down with its SwiGLU in the launch: Q4_K, Q6_K, Q8_0 at 512 and 768 equal the two launches bit for bit\n");
    hk_stream_free(st);
#endif
}

/* Decode's fused launches (tail.cuh) against the launches they replace, bit for bit, at the
 * model's widths (n_embd 2048, 256 experts + the shared gate's row, 8 a row, experts of 512,
 * a value dim of 4096, the GDN input products 8192 + 4096 + 32 + 32 rows), 1, 3 and 8 rows:
 * the input products in one launch (hk_matmul_n: a Q6_K run and a Q4_K run; all Q4_K in
 * one); the output product with the norm as its tail (x, h and the rounded rows); the router
 * with the route as its tail (logits, choices, weights); the down product with the combine
 * and the next norm as its tail (x, h, rounded rows; and without the norm). Each fused call
 * runs twice (the tickets it leaves must serve the next), and the tickets end at zero. */
#ifdef HEARTH_CUDA /* helpers of the fused tests: device buffers made and read back */
static int64_t diff_f(const void *da, const void *db, size_t n, herr *e) {
    float *a = xmalloc(4 * n), *b = xmalloc(4 * n);
    hk_d2h(a, da, 4 * n, e), hk_d2h(b, db, 4 * n, e);
    int64_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
    free(a), free(b);
    return bad;
}
static int64_t diff_act(const hk_act *a, const hk_act *b, int64_t n, herr *e) {
    const int64_t K = a->K;
    int64_t bad = diff_f(a->d, b->d, (size_t)(n * K / 256), e) + diff_f(a->s, b->s, (size_t)(n * K / 32), e);
    int8_t *qa = xmalloc((size_t)(n * K)), *qb = xmalloc((size_t)(n * K));
    hk_d2h(qa, a->q, (size_t)(n * K), e), hk_d2h(qb, b->q, (size_t)(n * K), e);
    bad += memcmp(qa, qb, (size_t)(n * K)) != 0;
    free(qa), free(qb);
    return bad;
}
static void act8k_new(hk_act *a, int64_t n, int64_t K, herr *e) {
    *a = (hk_act){.K = K};
    hk_malloc((void **)&a->q, (size_t)(n * K), e), hk_malloc((void **)&a->d, 4 * (size_t)(n * K / 256), e);
    hk_malloc((void **)&a->s, 4 * (size_t)(n * K / 32), e);
    hk_memset(a->q, 0, (size_t)(n * K), e), hk_memset(a->d, 0, 4 * (size_t)(n * K / 256), e);
    hk_memset(a->s, 0, 4 * (size_t)(n * K / 32), e);
}
static void *dev_f(const float *h, size_t n, herr *e) {
    void *d = NULL;
    hk_malloc(&d, 4 * n, e);
    hk_h2d(d, h, 4 * n, e);
    return d;
}
#endif

/* hk_h2d is done when it returns, for every stream (kernels.h). cudaMemcpy from pageable
 * memory alone is not: it may return with the DMA of its last piece still under way on the
 * legacy stream, which the engine's non-blocking streams do not wait for; the tests below
 * (and the engine's restore of a lane) launch on such a stream right after their copies.
 * Rounds of 64 MiB from malloc'd memory, each a new pattern over the last; right after each
 * copy the engine's stream reads d's last MiB into pinned memory: every byte the new one. */
TEST(h2d_done_on_return) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const size_t n = (size_t)16 << 20, tail = (size_t)256 << 10; /* 4-byte words: 64 MiB, its last MiB */
    herr e;
    void *st, *d, *pin;
    CHECK(hk_stream_new(&st, &e) == 0 && hk_malloc(&d, 4 * n, &e) == 0 && hk_host_alloc(&pin, 4 * tail, &e) == 0);
    hk_memset(d, 0, 4 * n, &e);
    uint32_t *h = xmalloc(4 * n);
    const uint32_t *got = pin;
    int64_t bad = 0;
    int bad_rounds = 0;
    for (uint32_t round = 1; round <= 16; round++) {
        for (size_t i = 0; i < n; i++) h[i] = round * 0x9e3779b9u + (uint32_t)i;
        CHECK_MSG(hk_h2d(d, h, 4 * n, &e) == 0 && hk_d2h_async(st, pin, (uint32_t *)d + (n - tail), 4 * tail, &e) == 0 &&
                      hk_stream_sync(st, &e) == 0,
                  "%s", e.msg);
        int64_t r = 0;
        for (size_t i = 0; i < tail; i++) r += got[i] != h[n - tail + i];
        bad += r, bad_rounds += r != 0;
    }
    CHECK_MSG(bad == 0, "%d of 16 rounds: %lld words at d's end still old when hk_h2d had returned", bad_rounds, (long long)bad);
    free(h), hk_free(d), hk_host_free(pin);
    printf("  hk_h2d done on return: 16 copies of 64 MiB, each one's last MiB read at once on the engine's stream\n");
    hk_stream_free(st);
#endif
}

TEST(fused_tails_match_apart) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const int64_t E = 2048, Vd = 4096, X = 256, K = 8, F = 512, Xd = 16, rows_[] = {1, 3, 8};
    herr e;
    void *st, *tickets;
    CHECK(hk_stream_new(&st, &e) == 0 && hk_malloc(&tickets, 4 * (size_t)(E + 2), &e) == 0);
    hk_memset(tickets, 0, 4 * (size_t)(E + 2), &e);
    /* weights: the input products (qkv as Q6_K and as Q4_K), the output product, the router, the experts' down */
    const int64_t in_M[] = {8192, 4096, 32, 32};
    hk_w in6, in4[4], wout, router, wd, wds;
    {
        size_t rb6 = qtype_row_bytes(QT_Q6_K, E), rb4 = qtype_row_bytes(QT_Q4_K, E);
        uint8_t *b = xmalloc(rb6 * 8192);
        random_blocks(QT_Q6_K, b, rb6 * 8192, 8192, E, 1200);
        CHECK_MSG(dev_w(QT_Q6_K, E, 8192, 8192, b, &in6, &e) == 0, "%s", e.msg);
        for (int i = 0; i < 4; i++) {
            random_blocks(QT_Q4_K, b, rb4 * (size_t)in_M[i], in_M[i], E, 1210 + (uint64_t)i);
            CHECK_MSG(dev_w(QT_Q4_K, E, in_M[i], in_M[i], b, &in4[i], &e) == 0, "%s", e.msg);
        }
        free(b);
        const size_t rbo = qtype_row_bytes(QT_Q4_K, Vd), rbd = qtype_row_bytes(QT_Q4_K, F);
        b = xmalloc(rbo * (size_t)E);
        random_blocks(QT_Q4_K, b, rbo * (size_t)E, E, Vd, 1220);
        CHECK_MSG(dev_w(QT_Q4_K, Vd, E, E, b, &wout, &e) == 0, "%s", e.msg);
        free(b);
        b = xmalloc(rbd * (size_t)(E * Xd));
        random_blocks(QT_Q4_K, b, rbd * (size_t)(E * Xd), E * Xd, F, 1230);
        CHECK_MSG(dev_w(QT_Q4_K, F, E, E * Xd, b, &wd, &e) == 0, "%s", e.msg);
        random_blocks(QT_Q4_K, b, rbd * (size_t)E, E, F, 1231);
        CHECK_MSG(dev_w(QT_Q4_K, F, E, E, b, &wds, &e) == 0, "%s", e.msg);
        free(b);
        float *rw = randf((X + 1) * E, 1240, -0.05f, 0.05f);
        void *d = dev_f(rw, (size_t)((X + 1) * E), &e);
        router = (hk_w){.d = d, .type = QT_F32, .K = E, .M = X + 1, .row_bytes = 4 * (size_t)E, .slice_bytes = 4 * (size_t)(E * (X + 1))};
        free(rw);
    }
    float *nw = randf(E, 1250, 0.5f, 1.5f);
    void *dnw = dev_f(nw, (size_t)E, &e);
    for (size_t ri = 0; ri < sizeof rows_ / sizeof rows_[0]; ri++) {
        const int64_t n = rows_[ri], nr = n * K, np = nr + n;
        /* the input products */
        float *hx = randf(n * E, 1300 + (uint64_t)n, -2.0f, 2.0f);
        void *blocks;
        hk_act ax;
        CHECK_MSG(dev_act(QT_Q4_K, hx, n, E, &blocks, &ax, &e) == 0, "%s", e.msg);
        free(blocks);
        for (int form = 0; form < 2; form++) { /* 0: qkv Q6_K (two launches), 1: all Q4_K (one) */
            void *ya[4], *yb[4];
            hk_out outs[4];
            for (int i = 0; i < 4; i++) {
                hk_malloc(&ya[i], 4 * (size_t)(n * in_M[i]), &e), hk_malloc(&yb[i], 4 * (size_t)(n * in_M[i]), &e);
                hk_memset(ya[i], 0xff, 4 * (size_t)(n * in_M[i]), &e);
                outs[i] = (hk_out){i == 0 && form == 0 ? &in6 : &in4[i], ya[i], in_M[i]};
                CHECK_MSG(hk_matmul(st, outs[i].w, NULL, 0, &ax, n, yb[i], in_M[i], false, &e) == 0, "%s", e.msg);
            }
            CHECK_MSG(hk_matmul_n(st, outs, 4, &ax, n, &e) == 0 && hk_stream_sync(st, &e) == 0, "%s", e.msg);
            for (int i = 0; i < 4; i++) {
                const int64_t bad = diff_f(ya[i], yb[i], (size_t)(n * in_M[i]), &e);
                CHECK_MSG(bad == 0, "input products (%s) rows=%lld output %d: %lld differ from its own launch",
                          form ? "all Q4_K" : "Q6_K then Q4_K", (long long)n, i, (long long)bad);
                hk_free(ya[i]), hk_free(yb[i]);
            }
        }
        dev_act_free(&ax);
        free(hx);
        /* the output product with the norm as its tail */
        float *ho = randf(n * Vd, 1400 + (uint64_t)n, -1.0f, 1.0f), *x0 = randf(n * E, 1410 + (uint64_t)n, -3.0f, 3.0f);
        hk_act ao;
        CHECK_MSG(dev_act(QT_Q4_K, ho, n, Vd, &blocks, &ao, &e) == 0, "%s", e.msg);
        free(blocks);
        void *xa = dev_f(x0, (size_t)(n * E), &e), *xb = dev_f(x0, (size_t)(n * E), &e), *ha, *hb;
        hk_malloc(&ha, 4 * (size_t)(n * E), &e), hk_malloc(&hb, 4 * (size_t)(n * E), &e);
        hk_act aa, ab;
        act8k_new(&aa, n, E, &e), act8k_new(&ab, n, E, &e);
        const hk_act none = {0};
        CHECK_MSG(hk_matmul(st, &wout, NULL, 0, &ao, n, xb, E, true, &e) == 0 &&
                      hk_rmsnorm(st, xb, NULL, dnw, hb, n, E, 1e-6f, &ab, NULL, &e) == 0, "%s", e.msg);
        const hk_tail tn = {.kind = HK_TAIL_NORM, .cnt = tickets, .n = n, .E = E, .x = xa, .h = ha, .nw = dnw, .eps = 1e-6f,
                            .a = aa, .a2 = none};
        CHECK_MSG(hk_matmul_tail(st, &wout, NULL, 0, &ao, n, xa, E, true, &tn, &e) == 0 && hk_stream_sync(st, &e) == 0, "%s", e.msg);
        int64_t bad = diff_f(xa, xb, (size_t)(n * E), &e) + diff_f(ha, hb, (size_t)(n * E), &e) + diff_act(&aa, &ab, n, &e);
        CHECK_MSG(bad == 0, "output product + norm tail rows=%lld: %lld values differ from the two launches", (long long)n, (long long)bad);
        /* the router with the route as its tail */
        void *la, *lb, *sa, *sb, *wa, *wb;
        hk_malloc(&la, 4 * (size_t)(n * (X + 1)), &e), hk_malloc(&lb, 4 * (size_t)(n * (X + 1)), &e);
        hk_malloc(&sa, 4 * (size_t)nr, &e), hk_malloc(&sb, 4 * (size_t)nr, &e), hk_malloc(&wa, 4 * (size_t)nr, &e), hk_malloc(&wb, 4 * (size_t)nr, &e);
        const hk_tail tr = {.kind = HK_TAIL_ROUTE, .cnt = tickets, .n = n, .ls = X + 1, .X = (int)X, .K = (int)K, .sel = sa, .wsel = wa};
        for (int rep = 0; rep < 2; rep++)
            CHECK_MSG(hk_matmul_tail(st, &router, hb, E, NULL, n, la, X + 1, false, &tr, &e) == 0, "%s", e.msg);
        CHECK_MSG(hk_matmul(st, &router, hb, E, NULL, n, lb, X + 1, false, &e) == 0 &&
                      hk_moe_route(st, lb, X + 1, n, (int)X, (int)K, sb, wb, &e) == 0 && hk_stream_sync(st, &e) == 0, "%s", e.msg);
        bad = diff_f(la, lb, (size_t)(n * (X + 1)), &e) + diff_f(sa, sb, (size_t)nr, &e) + diff_f(wa, wb, (size_t)nr, &e);
        CHECK_MSG(bad == 0, "router + route tail rows=%lld: %lld values differ from the two launches", (long long)n, (long long)bad);
        /* the down product with the combine (and the next norm) as its tail */
        float *g = randf(np * F, 1500 + (uint64_t)n, -4.0f, 4.0f), *u = randf(np * F, 1510 + (uint64_t)n, -2.0f, 2.0f);
        int32_t *sel = xmalloc(4 * (size_t)nr);
        for (int64_t p = 0; p < nr; p++) sel[p] = (int32_t)((rng_at(1520, (uint64_t)p) + (uint64_t)(p % K) * 3) % Xd);
        float *ws = randf(nr, 1530 + (uint64_t)n, 0.0f, 0.25f), *gl = randf(n * (X + 1), 1540 + (uint64_t)n, -3.0f, 3.0f);
        void *dg = dev_f(g, (size_t)(np * F), &e), *du = dev_f(u, (size_t)(np * F), &e), *dws = dev_f(ws, (size_t)nr, &e);
        void *dgl = dev_f(gl, (size_t)(n * (X + 1)), &e), *dsel, *eoa, *eob;
        hk_malloc(&dsel, 4 * (size_t)nr, &e), hk_h2d(dsel, sel, 4 * (size_t)nr, &e);
        hk_malloc(&eoa, 4 * (size_t)(np * E), &e), hk_malloc(&eob, 4 * (size_t)(np * E), &e);
        for (int with_norm = 0; with_norm < 2; with_norm++) {
            hk_h2d(xa, x0, 4 * (size_t)(n * E), &e), hk_h2d(xb, x0, 4 * (size_t)(n * E), &e);
            const hk_tail tc = {.kind = HK_TAIL_COMBINE, .cnt = tickets, .n = n, .E = E, .K = (int)K, .x = xa, .gl = (float *)dgl + X,
                                .gls = X + 1, .so = (float *)eoa + nr * E, .wsel = dws, .nw = with_norm ? dnw : NULL, .h = ha,
                                .eps = 1e-6f, .a = aa, .a2 = none};
            CHECK_MSG(hk_moe_down_swiglu(st, &wd, &wds, dsel, nr, np, dg, du, eoa, E, &tc, &e) == 0, "%s", e.msg);
            CHECK_MSG(hk_moe_down_swiglu(st, &wd, &wds, dsel, nr, np, dg, du, eob, E, NULL, &e) == 0 &&
                          hk_moe_combine(st, xb, (float *)dgl + X, X + 1, eob, (float *)eob + nr * E, dws, n, E, (int)K,
                                         with_norm ? dnw : NULL, hb, 1e-6f, &ab, NULL, &e) == 0 &&
                          hk_stream_sync(st, &e) == 0, "%s", e.msg);
            bad = diff_f(eoa, eob, (size_t)(np * E), &e) + diff_f(xa, xb, (size_t)(n * E), &e);
            if (with_norm) bad += diff_f(ha, hb, (size_t)(n * E), &e) + diff_act(&aa, &ab, n, &e);
            CHECK_MSG(bad == 0, "down + combine%s tail rows=%lld: %lld values differ from the two launches",
                      with_norm ? " + norm" : "", (long long)n, (long long)bad);
        }
        unsigned *tk = xmalloc(4 * (size_t)(E + 2));
        hk_d2h(tk, tickets, 4 * (size_t)(E + 2), &e);
        int64_t left = 0;
        for (int64_t i = 0; i < E + 2; i++) left += tk[i] != 0;
        CHECK_MSG(left == 0, "rows=%lld: %lld tickets left nonzero after the tails", (long long)n, (long long)left);
        free(tk);
        hk_free(dg), hk_free(du), hk_free(dws), hk_free(dgl), hk_free(dsel), hk_free(eoa), hk_free(eob);
        hk_free(la), hk_free(lb), hk_free(sa), hk_free(sb), hk_free(wa), hk_free(wb);
        hk_free(xa), hk_free(xb), hk_free(ha), hk_free(hb), dev_act_free(&aa), dev_act_free(&ab), dev_act_free(&ao);
        free(ho), free(x0), free(g), free(u), free(sel), free(ws), free(gl);
    }
    dev_w_free(&in6), dev_w_free(&wout), dev_w_free(&wd), dev_w_free(&wds), hk_free((void *)router.d);
    for (int i = 0; i < 4; i++) dev_w_free(&in4[i]);
    hk_free(dnw), hk_free(tickets), free(nw);
    printf("  fused launches (input products, norm, route, combine tails) at the model's widths, 1, 3, 8 rows: the separate launches' bits\n");
    hk_stream_free(st);
#endif
}

/* Decode's gated norm as the delta rule's tail (hk_gtail) against the delta rule then
 * hk_gdn_gated_norm, bit for bit, at the model's 32 value heads on 16 key heads, 1, 3 and 8
 * one-row pieces, both forms of the rule (chunked, row by row): outputs, the rounded rows and
 * the lanes; the tickets end at zero. The row form runs second: the copies of l0 that start
 * it go over the chunked pass's lanes, so a copy not done when hk_h2d returned shows there
 * (h2d_done_on_return; at ee527d2 an H200 saw it: 2 blocks of the last head's lane stale). */
TEST(gated_tail_matches_apart) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const int64_t Gk = 16, Gv = 32, S = 128, cd = 2 * Gk * S + Gv * S, Vd = Gv * S, lane = Gv * S * S, nps[] = {1, 3, 8};
    herr e;
    void *st, *tickets;
    CHECK(hk_stream_new(&st, &e) == 0 && hk_malloc(&tickets, 4 * 256, &e) == 0);
    hk_memset(tickets, 0, 4 * 256, &e);
    float *nw = randf(S, 1600, 0.5f, 1.5f);
    void *dnw = dev_f(nw, (size_t)S, &e);
    for (size_t pi = 0; pi < sizeof nps / sizeof nps[0]; pi++) {
        const int64_t np = nps[pi], n = np;
        float *cv = randf(n * cd, 1610 + (uint64_t)np, -0.1f, 0.1f), *b = randf(n * Gv, 1620, 0.1f, 0.9f);
        float *a = randf(n * Gv, 1630, -0.5f, -0.01f), *z = randf(n * Vd, 1640, -2.0f, 2.0f);
        float *l0 = randf(np * lane, 1650 + (uint64_t)np, -0.2f, 0.2f);
        hk_piece *pcs = xmalloc(sizeof(hk_piece) * (size_t)np);
        hk_chunk *chs = xmalloc(sizeof(hk_chunk) * (size_t)np);
        int32_t *pch = xmalloc(4 * (size_t)(np + 1));
        for (int64_t p = 0; p < np; p++) {
            pcs[p] = (hk_piece){.r0 = p, .n = 1, .pos0 = 5, .seq = (int32_t)p};
            chs[p] = (hk_chunk){.piece = (int32_t)p, .c0 = 0, .n = 1};
            pch[p] = (int32_t)p;
        }
        pch[np] = (int32_t)np;
        void *dcv = dev_f(cv, (size_t)(n * cd), &e), *db = dev_f(b, (size_t)(n * Gv), &e), *da = dev_f(a, (size_t)(n * Gv), &e);
        void *dz = dev_f(z, (size_t)(n * Vd), &e), *la = dev_f(l0, (size_t)(np * lane), &e), *lb = dev_f(l0, (size_t)(np * lane), &e);
        void *dp, *dc, *dpc, *oa, *ob;
        hk_malloc(&dp, sizeof(hk_piece) * (size_t)np, &e), hk_h2d(dp, pcs, sizeof(hk_piece) * (size_t)np, &e);
        hk_malloc(&dc, sizeof(hk_chunk) * (size_t)np, &e), hk_h2d(dc, chs, sizeof(hk_chunk) * (size_t)np, &e);
        hk_malloc(&dpc, 4 * (size_t)(np + 1), &e), hk_h2d(dpc, pch, 4 * (size_t)(np + 1), &e);
        hk_malloc(&oa, 4 * (size_t)(n * Vd), &e), hk_malloc(&ob, 4 * (size_t)(n * Vd), &e);
        hk_act aa, ab;
        act8k_new(&aa, n, Vd, &e), act8k_new(&ab, n, Vd, &e);
        for (int form = 0; form < 2; form++) {
            hk_h2d(la, l0, 4 * (size_t)(np * lane), &e), hk_h2d(lb, l0, 4 * (size_t)(np * lane), &e);
            const hk_gtail gt = {.z = dz, .nw = dnw, .eps = 1e-6f, .a = aa, .cnt = tickets};
            int rc;
            if (form == 0)
                rc = hk_gdn_chunk(st, dcv, db, da, la, (size_t)lane, dp, (int)np, dc, dpc, n, NULL, NULL, 0, S, Gk, Gv, cd, NULL, NULL, &gt, oa, &e) |
                     hk_gdn_chunk(st, dcv, db, da, lb, (size_t)lane, dp, (int)np, dc, dpc, n, NULL, NULL, 0, S, Gk, Gv, cd, NULL, NULL, NULL, ob, &e);
            else
                rc = hk_gdn_delta(st, dcv, db, da, la, (size_t)lane, dp, (int)np, NULL, NULL, 0, S, Gk, Gv, cd, &gt, oa, &e) |
                     hk_gdn_delta(st, dcv, db, da, lb, (size_t)lane, dp, (int)np, NULL, NULL, 0, S, Gk, Gv, cd, NULL, ob, &e);
            rc |= hk_gdn_gated_norm(st, ob, dz, dnw, n, S, Gv, 1e-6f, &ab, &e) | hk_stream_sync(st, &e);
            CHECK_MSG(rc == 0, "%s", e.msg);
            const int64_t bad = diff_f(oa, ob, (size_t)(n * Vd), &e) + diff_act(&aa, &ab, n, &e) + diff_f(la, lb, (size_t)(np * lane), &e);
            CHECK_MSG(bad == 0, "%s rule, %lld pieces: %lld values differ from the delta rule then the gated norm",
                      form ? "row" : "chunked", (long long)np, (long long)bad);
        }
        unsigned tk[256];
        hk_d2h(tk, tickets, sizeof tk, &e);
        int left = 0;
        for (int i = 0; i < 256; i++) left += tk[i] != 0;
        CHECK_MSG(left == 0, "%lld pieces: %d tickets left nonzero", (long long)np, left);
        hk_free(dcv), hk_free(db), hk_free(da), hk_free(dz), hk_free(la), hk_free(lb), hk_free(dp), hk_free(dc), hk_free(dpc);
        hk_free(oa), hk_free(ob), dev_act_free(&aa), dev_act_free(&ab);
        free(cv), free(b), free(a), free(z), free(l0), free(pcs), free(chs), free(pch);
    }
    hk_free(dnw), hk_free(tickets), free(nw);
    printf("  gated norm as the delta rule's tail (chunked and row forms, 32 heads, 1, 3, 8 pieces): the separate launches' bits\n");
    hk_stream_free(st);
#endif
}

/* Decode's conv inside the chunked delta rule's launch (hk_gconv) against hk_gdn_conv_norm
 * then hk_gdn_chunk, bit for bit, at the model's 32 value heads on 16 key heads and 4 taps,
 * 1, 3 and 8 one-row pieces, the first with a point: outputs, lanes, rings, the point's lanes
 * and rings; the tickets end at zero. */
TEST(conv_in_matches_apart) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const int64_t Gk = 16, Gv = 32, S = 128, dc = 4, cd = 2 * Gk * S + Gv * S, Vd = Gv * S, lane = Gv * S * S, nps[] = {1, 3, 8};
    const int64_t rfl = (dc - 1) * cd;
    herr e;
    void *st, *tickets;
    CHECK(hk_stream_new(&st, &e) == 0 && hk_malloc(&tickets, 4 * 256, &e) == 0);
    hk_memset(tickets, 0, 4 * 256, &e);
    float *w = randf(cd * dc, 1700, -0.5f, 0.5f), *sa = randf(Gv, 1701, -1.0f, -0.1f), *dt = randf(Gv, 1702, -0.5f, 0.5f);
    void *dw = dev_f(w, (size_t)(cd * dc), &e), *dsa = dev_f(sa, (size_t)Gv, &e), *ddt = dev_f(dt, (size_t)Gv, &e);
    for (size_t pi = 0; pi < sizeof nps / sizeof nps[0]; pi++) {
        const int64_t np = nps[pi], n = np;
        float *qkv = randf(n * cd, 1710 + (uint64_t)np, -2.0f, 2.0f), *r0 = randf(np * rfl, 1720, -2.0f, 2.0f);
        float *b = randf(n * Gv, 1730, -2.0f, 2.0f), *a = randf(n * Gv, 1740, -2.0f, 2.0f), *l0 = randf(np * lane, 1750, -0.2f, 0.2f);
        hk_piece *pcs = xmalloc(sizeof(hk_piece) * (size_t)np);
        hk_chunk *chs = xmalloc(sizeof(hk_chunk) * (size_t)np);
        int32_t *pch = xmalloc(4 * (size_t)(np + 1)), *rp = xmalloc(4 * (size_t)np);
        for (int64_t p = 0; p < np; p++) {
            pcs[p] = (hk_piece){.r0 = p, .n = 1, .pos0 = 7, .seq = (int32_t)p, .mark0 = 0, .n_marks = p == 0};
            chs[p] = (hk_chunk){.piece = (int32_t)p, .c0 = 0, .n = 1};
            pch[p] = (int32_t)p, rp[p] = (int32_t)p;
        }
        pch[np] = (int32_t)np;
        const hk_mark mk = {.m = 1, .slot = 0, .piece = 0};
        void *dqkv = dev_f(qkv, (size_t)(n * cd), &e), *ra = dev_f(r0, (size_t)(np * rfl), &e), *rb = dev_f(r0, (size_t)(np * rfl), &e);
        void *db = dev_f(b, (size_t)(n * Gv), &e), *da = dev_f(a, (size_t)(n * Gv), &e), *db2 = dev_f(b, (size_t)(n * Gv), &e);
        void *da2 = dev_f(a, (size_t)(n * Gv), &e), *la = dev_f(l0, (size_t)(np * lane), &e), *lb = dev_f(l0, (size_t)(np * lane), &e);
        void *dp, *dc2, *dpc, *drp, *dmk, *cv, *oa, *ob, *sra, *srb, *sla, *slb;
        hk_malloc(&dp, sizeof(hk_piece) * (size_t)np, &e), hk_h2d(dp, pcs, sizeof(hk_piece) * (size_t)np, &e);
        hk_malloc(&dc2, sizeof(hk_chunk) * (size_t)np, &e), hk_h2d(dc2, chs, sizeof(hk_chunk) * (size_t)np, &e);
        hk_malloc(&dpc, 4 * (size_t)(np + 1), &e), hk_h2d(dpc, pch, 4 * (size_t)(np + 1), &e);
        hk_malloc(&drp, 4 * (size_t)np, &e), hk_h2d(drp, rp, 4 * (size_t)np, &e);
        hk_malloc(&dmk, sizeof mk, &e), hk_h2d(dmk, &mk, sizeof mk, &e);
        hk_malloc(&cv, 4 * (size_t)(n * cd), &e), hk_malloc(&oa, 4 * (size_t)(n * Vd), &e), hk_malloc(&ob, 4 * (size_t)(n * Vd), &e);
        hk_malloc(&sra, 4 * (size_t)rfl, &e), hk_malloc(&srb, 4 * (size_t)rfl, &e);
        hk_malloc(&sla, 4 * (size_t)lane, &e), hk_malloc(&slb, 4 * (size_t)lane, &e);
        const hk_gconv gv = {.qkv = dqkv, .w = dw, .ssm_a = dsa, .dt = ddt, .braw = db, .araw = da, .ring0 = ra, .stage0 = sra,
                             .ring_stride = (size_t)rfl, .stage_stride = (size_t)rfl, .eps = 1e-6f, .cnt = tickets};
        int rc = hk_gdn_chunk(st, NULL, NULL, NULL, la, (size_t)lane, dp, (int)np, dc2, dpc, n, dmk, sla, (size_t)lane, S, Gk, Gv, cd,
                              NULL, &gv, NULL, oa, &e);
        rc |= hk_gdn_conv_norm(st, dqkv, rb, (size_t)rfl, dw, drp, dp, n, dmk, srb, (size_t)rfl, 1, cv, db2, da2, dsa, ddt, S, Gk,
                               Gv, cd, dc, 1e-6f, &e);
        rc |= hk_gdn_chunk(st, cv, db2, da2, lb, (size_t)lane, dp, (int)np, dc2, dpc, n, dmk, slb, (size_t)lane, S, Gk, Gv, cd, NULL,
                           NULL, NULL, ob, &e);
        rc |= hk_stream_sync(st, &e);
        CHECK_MSG(rc == 0, "%s", e.msg);
        const int64_t bad = diff_f(oa, ob, (size_t)(n * Vd), &e) + diff_f(la, lb, (size_t)(np * lane), &e) +
                            diff_f(ra, rb, (size_t)(np * rfl), &e) + diff_f(sra, srb, (size_t)rfl, &e) + diff_f(sla, slb, (size_t)lane, &e);
        CHECK_MSG(bad == 0, "%lld pieces: %lld values differ from the conv then the delta rule", (long long)np, (long long)bad);
        unsigned tk[256];
        hk_d2h(tk, tickets, sizeof tk, &e);
        int left = 0;
        for (int i = 0; i < 256; i++) left += tk[i] != 0;
        CHECK_MSG(left == 0, "%lld pieces: %d tickets left nonzero", (long long)np, left);
        void *fr[] = {dqkv, ra, rb, db, da, db2, da2, la, lb, dp, dc2, dpc, drp, dmk, cv, oa, ob, sra, srb, sla, slb};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) hk_free(fr[i]);
        free(qkv), free(r0), free(b), free(a), free(l0), free(pcs), free(chs), free(pch), free(rp);
    }
    hk_free(dw), hk_free(dsa), hk_free(ddt), hk_free(tickets), free(w), free(sa), free(dt);
    printf("  conv in the chunked delta rule's launch (32 heads, 1, 3, 8 pieces, a point): the separate launches' bits\n");
    hk_stream_free(st);
#endif
}

/* Float weights (F32, F16, BF16: a warp per output over f32 inputs) against a double dot
 * product of the CPU's dequantized weights. Bound (Higham's, for recursive summation): a
 * lane sums K/32 products in order with fma, then 5 levels of the warp tree, so
 * |y - y_exact| <= gamma(K/32 + 6) * sum |w x|, gamma(m) = m u / (1 - m u), u = 2^-24. Then
 * batch invariance: rows 5 and 36 of a 37-row launch (fmm_tile_kernel's warp tiles of 4
 * outputs x 8 rows, the last tile partial; M = 37 leaves a partial block of outputs too)
 * equal, bit for bit, the row launched alone (fmm_kernel, the decode form). */
TEST(fmatmul_matches_cpu) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const uint32_t types[] = {QT_F32, QT_F16, QT_BF16};
    /* K: 128 leaves lanes with no group of eight, 1024 one round of loads ahead, 4096 four */
    const int64_t M = 37, Ks[] = {128, 1024, 4096}, n = 37, alone[2] = {5, 36};
    herr e;
    void *st;
    CHECK(hk_stream_new(&st, &e) == 0);
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int64_t K = Ks[ki];
        const double u = ldexp(1.0, -24), m_eff = (double)(K / 32 + 6), gamma = m_eff * u / (1 - m_eff * u);
        const uint32_t t = types[ti];
        const size_t rb = qtype_row_bytes(t, K), bytes = rb * (size_t)M;
        uint8_t *src = xmalloc(bytes);
        random_blocks(t, src, bytes, M, K, 200 + ti);
        if (t == QT_BF16) /* random bytes can be NaN: finite weights in [-1, 1] instead */
            for (int64_t i = 0; i < M * K; i++) {
                const bf16_t h = f32_to_bf16((float)(2 * rng_unit(250, (uint64_t)i) - 1));
                memcpy(src + 2 * i, &h, 2);
            }
        float *wf = xmalloc(sizeof(float) * (size_t)(M * K)), *x = randf(n * K, 300 + ti, -1.0f, 1.0f);
        for (int64_t r = 0; r < M; r++) quant_dequantize_row(t, src + (size_t)r * rb, wf + r * K, K);
        hk_w w;
        void *dx, *dy, *dy1;
        CHECK(dev_w(t, K, M, M, src, &w, &e) == 0 && hk_malloc(&dx, sizeof(float) * (size_t)(n * K), &e) == 0 &&
              hk_malloc(&dy, sizeof(float) * (size_t)(n * M), &e) == 0 && hk_malloc(&dy1, sizeof(float) * (size_t)(2 * M), &e) == 0);
        hk_h2d(dx, x, sizeof(float) * (size_t)(n * K), &e);
        CHECK_MSG(hk_matmul(st, &w, dx, K, NULL, n, dy, M, false, &e) == 0, "%s: %s", qtype_name(t), e.msg);
        for (int i = 0; i < 2; i++)
            CHECK_MSG(hk_matmul(st, &w, (const float *)dx + alone[i] * K, K, NULL, 1, (float *)dy1 + i * M, M, false, &e) == 0,
                      "%s: %s", qtype_name(t), e.msg);
        CHECK(hk_stream_sync(st, &e) == 0);
        float *y = xmalloc(sizeof(float) * (size_t)(n * M)), *y1 = xmalloc(sizeof(float) * (size_t)(2 * M));
        hk_d2h(y, dy, sizeof(float) * (size_t)(n * M), &e), hk_d2h(y1, dy1, sizeof(float) * (size_t)(2 * M), &e);
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
        CHECK_MSG(worst <= 1.0, "%s K=%lld: error %.2f times the bound", qtype_name(t), (long long)K, worst);
        for (int i = 0; i < 2; i++)
            CHECK_MSG(!memcmp(y1 + i * M, y + alone[i] * M, sizeof(float) * (size_t)M), "%s K=%lld: row %lld alone differs from row %lld of %lld",
                      qtype_name(t), (long long)K, (long long)alone[i], (long long)alone[i], (long long)n);
        /* the one-warp form (HEARTH_CUDA_FM_TILE=0) gives the warp tiles' bits; 37 outputs and
         * rows leave both forms a partial tile */
        float *yf = xmalloc(sizeof(float) * (size_t)(n * M));
        hk_fm_tile(false);
        CHECK_MSG(hk_matmul(st, &w, dx, K, NULL, n, dy, M, false, &e) == 0, "%s: %s", qtype_name(t), e.msg);
        CHECK(hk_stream_sync(st, &e) == 0);
        hk_d2h(yf, dy, sizeof(float) * (size_t)(n * M), &e);
        hk_fm_tile(true);
        CHECK_MSG(!memcmp(yf, y, sizeof(float) * (size_t)(n * M)), "%s K=%lld: the one-warp form's bits differ from the tiles'",
                  qtype_name(t), (long long)K);
        free(yf);
        printf("  matmul %s K=%lld: worst error %.3f of the bound; row alone = row in a tile\n", qtype_name(t), (long long)K,
               worst);
        dev_w_free(&w);
        hk_free(dx), hk_free(dy), hk_free(dy1);
        free(src), free(wf), free(x), free(y), free(y1);
    }
    hk_stream_free(st);
#endif
}

/* Routing: softmax, top K with ties to the lower id, weights renormalised, against the host
 * doing the same sums in double (no near-ties in random logits at this spread). */
TEST(route_matches_cpu) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const int64_t n = 37;
    const int X = 256, K = 8;
    float *l = randf(n * X, 800, -4.0f, 4.0f);
    herr e;
    void *st, *dl, *dsel, *dw;
    CHECK(hk_stream_new(&st, &e) == 0 && hk_malloc(&dl, 4 * (size_t)(n * X), &e) == 0 &&
          hk_malloc(&dsel, 4 * (size_t)(n * K), &e) == 0 && hk_malloc(&dw, 4 * (size_t)(n * K), &e) == 0);
    hk_h2d(dl, l, 4 * (size_t)(n * X), &e);
    CHECK_MSG(hk_moe_route(st, dl, X, n, X, K, dsel, dw, &e) == 0 && hk_stream_sync(st, &e) == 0, "%s", e.msg);
    int32_t *sel = xmalloc(4 * (size_t)(n * K));
    float *wv = xmalloc(4 * (size_t)(n * K));
    hk_d2h(sel, dsel, 4 * (size_t)(n * K), &e), hk_d2h(wv, dw, 4 * (size_t)(n * K), &e);
    int bad_sel = 0;
    double worst = 0;
    for (int64_t r = 0; r < n; r++) {
        const float *lr = l + r * X;
        bool taken[256] = {false};
        double ws = 0, wk[8];
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int x = 0; x < X; x++)
                if (!taken[x] && (best < 0 || lr[x] > lr[best])) best = x;
            taken[best] = true;
            bad_sel += sel[r * K + k] != best;
            double mx = -1e30, s = 0;
            for (int x = 0; x < X; x++) mx = fmax(mx, lr[x]);
            for (int x = 0; x < X; x++) s += exp(lr[x] - mx);
            wk[k] = exp(lr[best] - mx) / s;
            ws += wk[k];
        }
        for (int k = 0; k < K; k++) worst = fmax(worst, fabs(wv[r * K + k] - wk[k] / ws) / (wk[k] / ws));
    }
    /* the weights: a softmax of 256 f32 exps and a division, renormalised: a few hundred u */
    CHECK_MSG(bad_sel == 0, "%d of %lld choices differ", bad_sel, (long long)(n * K));
    CHECK_MSG(worst < 1e-5, "weights %.3g from the double softmax (band 1e-5 = 168 u)", worst);
    printf("  route: %lld rows, choices equal, weights within %.2g of double\n", (long long)n, worst);
    hk_free(dl), hk_free(dsel), hk_free(dw);
    hk_stream_free(st);
    free(l), free(sel), free(wv);
#endif
}

#ifdef HEARTH_CUDA
/* rows [0, n) at positions p0.. cut otherwise: rows 0..4 one-row tiles (the decode form), the
 * rest in tiles of qt from row 5 (every tile's rows moved); the count of tiles */
static int cut_tiles(hk_qtile *cut, int64_t n, int64_t qt, int64_t p0) {
    int nc = 0;
    for (int64_t r = 0; r < 5; r++) cut[nc++] = (hk_qtile){.r0 = (int32_t)r, .n = 1, .seq = 0, .pos0 = p0 + r};
    for (int64_t t0 = 5; t0 < n; t0 += qt)
        cut[nc++] = (hk_qtile){.r0 = (int32_t)t0, .n = (int32_t)(n - t0 < qt ? n - t0 : qt), .seq = 0, .pos0 = p0 + t0};
    return nc;
}
#endif

/* Attention against a double reference, and a row's bits whatever shares its tile: 300 rows
 * of one sequence at positions 700..999 of a cache of 1000 keys (segments of 512: rows on
 * both sides of the cut), with f32 and f16 KV (the reference reads the same rounded K and
 * V); then row 999 alone (a decode step) equals its row in the full launch, bit for bit.
 * Bound per output (first order, Higham's gamma(m) = m u / (1 - m u), u = 2^-24): a score
 * is a D-term fma sum, off by at most gamma(D) sum_i |q_i k_i| / sqrt(D) <= gamma(D) smax;
 * exp turns that into a relative error of the weight, and a weighted mean moves by at most
 * twice the largest relative weight error times max |v|; the running sums over nk keys and
 * the segment merge add gamma(nk + 8) of max |v|. A wrong key, mask or rescale moves the
 * output by about its own size (~1e-2 here), two orders past the bound. */
#ifdef HEARTH_CUDA
/* attn_matches_ref's checks for heads of D (256: q36's; 128: the tiny preset's, and the wgmma
 * form's m64n128 products) */
static void attn_case(const int64_t D) {
    printf("  heads of %lld\n", (long long)D);
    const int64_t H = 16, Hkv = 2, n_ctx = 1000, n = 300, p0 = 700, seg = 128, n_seg = 8;
    const int64_t G = H / Hkv;
    herr e;
    void *st;
    CHECK(hk_stream_new(&st, &e) == 0);
    float *kc = randf(n_ctx * Hkv * D, 900, -1.0f, 1.0f), *vc = randf(n_ctx * Hkv * D, 901, -1.0f, 1.0f);
    float *qf = randf(n * 2 * H * D, 902, -0.15f, 0.15f);
    for (int f16 = 0; f16 < 2; f16++) {
        const int64_t qt = hk_attn_tile_rows(G, f16); /* f16: the default tensor-core form's rows a tile (the wgmma form: 8) */
        const size_t esz = f16 ? 2 : 4, kvb = esz * (size_t)(n_ctx * Hkv * D);
        uint8_t *hk = xmalloc(kvb), *hv = xmalloc(kvb);
        float *kr = xmalloc(4 * (size_t)(n_ctx * Hkv * D)), *vr = xmalloc(4 * (size_t)(n_ctx * Hkv * D));
        for (int64_t i = 0; i < n_ctx * Hkv * D; i++) {
            if (f16) {
                f16_t a = f32_to_f16(kc[i]), b = f32_to_f16(vc[i]);
                memcpy(hk + 2 * i, &a, 2), memcpy(hv + 2 * i, &b, 2);
                kr[i] = f16_to_f32(a), vr[i] = f16_to_f32(b);
            } else {
                memcpy(hk + 4 * i, &kc[i], 4), memcpy(hv + 4 * i, &vc[i], 4);
                kr[i] = kc[i], vr[i] = vc[i];
            }
        }
        void *dk, *dv, *dq, *dpos, *dtiles, *dpart, *dao;
        int64_t *pos = xmalloc(8 * (size_t)n);
        for (int64_t r = 0; r < n; r++) pos[r] = p0 + r;
        hk_qtile *tiles = xmalloc(sizeof(hk_qtile) * (size_t)n);
        int nt = 0;
        for (int64_t t0 = 0; t0 < n; t0 += qt)
            tiles[nt++] = (hk_qtile){.r0 = (int32_t)t0, .n = (int32_t)(n - t0 < qt ? n - t0 : qt), .seq = 0, .pos0 = p0 + t0};
        CHECK(hk_malloc(&dk, kvb, &e) == 0 && hk_malloc(&dv, kvb, &e) == 0 && hk_malloc(&dq, 4 * (size_t)(n * 2 * H * D), &e) == 0 &&
              hk_malloc(&dpos, 8 * (size_t)n, &e) == 0 && hk_malloc(&dtiles, sizeof(hk_qtile) * (size_t)n, &e) == 0 &&
              hk_malloc(&dpart, 4 * (size_t)(n * H * n_seg * hk_attn_part_floats(D)), &e) == 0 && hk_malloc(&dao, 4 * (size_t)(n * H * D), &e) == 0);
        hk_h2d(dk, hk, kvb, &e), hk_h2d(dv, hv, kvb, &e), hk_h2d(dq, qf, 4 * (size_t)(n * 2 * H * D), &e);
        hk_h2d(dpos, pos, 8 * (size_t)n, &e), hk_h2d(dtiles, tiles, sizeof(hk_qtile) * (size_t)nt, &e);
        CHECK_MSG(hk_attn(st, dq, dtiles, nt, 0, dpos, n, H, Hkv, D, dk, dv, (size_t)(n_ctx * Hkv * D), n_ctx, f16, seg, n_seg, dpart, dao,
                          NULL, &e) == 0 && hk_stream_sync(st, &e) == 0,
                  "%s", e.msg);
        float *ao = xmalloc(4 * (size_t)(n * H * D));
        hk_d2h(ao, dao, 4 * (size_t)(n * H * D), &e);
        const double uu = ldexp(1.0, -24);
        double worst = 0, worst_abs = 0;
        for (int64_t r = 0; r < n; r += 7)
            for (int64_t h = 0; h < H; h++) {
                const float *q = qf + r * 2 * H * D + h * 2 * D;
                const int64_t kh = h / G, nk = pos[r] + 1;
                double *s = xmalloc(sizeof(double) * (size_t)nk), mx = -1e300, sum = 0, smax = 0, vmax = 0;
                for (int64_t j = 0; j < nk; j++) {
                    double d = 0, mag = 0;
                    for (int64_t i = 0; i < D; i++) {
                        d += (double)q[i] * kr[(j * Hkv + kh) * D + i];
                        mag += fabs((double)q[i] * kr[(j * Hkv + kh) * D + i]);
                        vmax = fmax(vmax, fabs(vr[(j * Hkv + kh) * D + i]));
                    }
                    s[j] = d / sqrt((double)D);
                    smax = fmax(smax, mag / sqrt((double)D));
                    mx = fmax(mx, s[j]);
                }
                /* f32 (CUDA cores): each score D products summed in f32 (gD), the scores' errors
                 * moving the softmax weights by at most twice theirs, the weighted sum of V
                 * over nk keys and the merges in f32 (gN). f16 (tensor cores): q rounded to f16
                 * (u16 of each product), the products exact and summed in the tensor core,
                 * whose rounding is not documented (2 uu a step, as truncation), and the
                 * scale (log2(e) / sqrt(D): 2 uu); p rounded to f16 (the weights p/sum p move by 2 u16 / (1 - u16)
                 * in all, since the sum adds the rounded p); the P V sums likewise at 2 uu. */
                const double u16 = ldexp(1.0, -11), t = f16 ? 2 * uu : uu;
                const double gD = D * t / (1 - D * t), gN = (nk + 8) * t / (1 - (nk + 8) * t);
                const double ds = f16 ? (u16 + gD + 2 * uu) * smax : gD * smax;
                const double bound = (2 * ds + gN + (f16 ? 2 * u16 / (1 - u16) : 0)) * vmax;
                for (int64_t j = 0; j < nk; j++) sum += (s[j] = exp(s[j] - mx));
                for (int64_t i = 0; i < D; i++) {
                    double o = 0;
                    for (int64_t j = 0; j < nk; j++) o += s[j] / sum * vr[(j * Hkv + kh) * D + i];
                    o *= 1.0 / (1.0 + exp(-(double)q[D + i]));
                    const double err = fabs(ao[r * H * D + h * D + i] - o);
                    worst = fmax(worst, err / bound);
                    worst_abs = fmax(worst_abs, err);
                }
                free(s);
            }
        CHECK_MSG(worst <= 1.0, "%s KV: attention %.3g times its bound from the double reference", f16 ? "f16" : "f32", worst);
        /* the same rows cut otherwise in one launch: rows 0..4 one-row tiles (the decode form,
         * beside the tiles in the same call), the rest in tiles from row 5 (every tile's rows
         * moved): the same bits */
        {
            hk_qtile *cut = xmalloc(sizeof(hk_qtile) * (size_t)n);
            const int nc = cut_tiles(cut, n, qt, p0);
            float *ao2 = xmalloc(4 * (size_t)(n * H * D));
            hk_h2d(dtiles, cut, sizeof(hk_qtile) * (size_t)nc, &e);
            CHECK_MSG(hk_attn(st, dq, dtiles, nc, 5, dpos, n, H, Hkv, D, dk, dv, (size_t)(n_ctx * Hkv * D), n_ctx, f16, seg, n_seg, dpart,
                              dao, NULL, &e) == 0 && hk_stream_sync(st, &e) == 0,
                      "%s", e.msg);
            hk_d2h(ao2, dao, 4 * (size_t)(n * H * D), &e);
            int64_t bad = 0;
            for (int64_t i = 0; i < n * H * D; i++) bad += memcmp(&ao2[i], &ao[i], 4) != 0;
            CHECK_MSG(bad == 0, "%s KV: %lld values differ when the rows are cut into other tiles", f16 ? "f16" : "f32", (long long)bad);
            free(cut), free(ao2);
        }
        /* f16: every form of the prompt kernel = the default (HK_ATTN_FORM_DEFAULT: the wgmma
         * form, two warpgroups, 8 rows, attn_wg.cuh), bit for bit: mma.sync in pairs of warps
         * (hk_attn_form(0)) and its whole form in tiles of 4 warps (8 rows) and 6 (12 rows) */
        /* (9: the wgmma form with its blocks fetched by every thread's cp.async, hk_attn_tma(0),
         * where the default fetches them through the copy engine; 10: the copy engine asked by a
         * lane of each warp, hk_attn_tma(2)) */
        static const int forms[] = {0, 4, 6, 8, 9, 10};
        CHECK(hk_attn_tma(3) == -1);
        for (int fi = 0; f16 && fi < 6; fi++) {
            const int form = forms[fi];
            if (form == HK_ATTN_FORM_DEFAULT) continue;
            float *ao3 = xmalloc(4 * (size_t)(n * H * D));
            hk_attn_form(form >= 9 ? 8 : form);
            hk_attn_tma(form == 9 ? 0 : form == 10 ? 2 : 1);
            const int64_t qf_rows = hk_attn_tile_rows(G, f16);
            hk_qtile *ft = xmalloc(sizeof(hk_qtile) * (size_t)n);
            int nf = 0;
            for (int64_t t0 = 0; t0 < n; t0 += qf_rows)
                ft[nf++] = (hk_qtile){.r0 = (int32_t)t0, .n = (int32_t)(n - t0 < qf_rows ? n - t0 : qf_rows), .seq = 0, .pos0 = p0 + t0};
            hk_h2d(dtiles, ft, sizeof(hk_qtile) * (size_t)nf, &e);
            CHECK_MSG(hk_attn(st, dq, dtiles, nf, 0, dpos, n, H, Hkv, D, dk, dv, (size_t)(n_ctx * Hkv * D), n_ctx, f16, seg, n_seg, dpart,
                              dao, NULL, &e) == 0 && hk_stream_sync(st, &e) == 0,
                      "%s", e.msg);
            hk_attn_form(HK_ATTN_FORM_DEFAULT);
            hk_attn_tma(1);
            hk_d2h(ao3, dao, 4 * (size_t)(n * H * D), &e);
            int64_t bad = 0;
            double far = 0; /* the largest difference, relative to the default's value: a rounding (~1e-7) or a layout (~1) */
            for (int64_t i = 0; i < n * H * D; i++)
                if (memcmp(&ao3[i], &ao[i], 4)) bad++, far = fmax(far, fabs((double)ao3[i] - ao[i]) / (fabs((double)ao[i]) + 1e-30));
            CHECK_MSG(bad == 0,
                      "f16 KV: %lld values differ between the prompt kernel's default and its form %d (%lld-row tiles), the "
                      "largest by %.3g of its value",
                      (long long)bad, form, (long long)qf_rows, far);
            free(ao3), free(ft);
        }
        /* f16: the split form of the multi-row tiles (hk_attn_split(2): a CTA per tile, KV head
         * and segment, then a fold over the rows) = the default, bit for bit: the tiles; the
         * cut beside 5 one-row tiles; and a short pass at depth, rows 193..197 alone in one
         * launch (positions 893..897, across the segment end at 896), in both forms, with its
         * rows rounded in the fold = hk_quantize of them */
        if (f16) {
            CHECK(hk_attn_split(3) == -1);
            hk_attn_split(2);
            hk_qtile *cut = xmalloc(sizeof(hk_qtile) * (size_t)n);
            const int nc = cut_tiles(cut, n, qt, p0);
            float *ao4 = xmalloc(4 * (size_t)(n * H * D));
            for (int c = 0; c < 2; c++) {
                hk_h2d(dtiles, c ? cut : tiles, sizeof(hk_qtile) * (size_t)(c ? nc : nt), &e);
                CHECK_MSG(hk_attn(st, dq, dtiles, c ? nc : nt, c ? 5 : 0, dpos, n, H, Hkv, D, dk, dv, (size_t)(n_ctx * Hkv * D), n_ctx, f16, seg,
                                  n_seg, dpart, dao, NULL, &e) == 0 && hk_stream_sync(st, &e) == 0,
                          "%s", e.msg);
                hk_d2h(ao4, dao, 4 * (size_t)(n * H * D), &e);
                int64_t bad = 0;
                for (int64_t i = 0; i < n * H * D; i++) bad += memcmp(&ao4[i], &ao[i], 4) != 0;
                CHECK_MSG(bad == 0, "f16 KV: %lld values of the split form differ from the default's (%s)", (long long)bad,
                          c ? "cut beside 5 one-row tiles" : "the tiles");
            }
            const int64_t r5 = 193;
            const hk_qtile five = {.r0 = 0, .n = 5, .seq = 0, .pos0 = p0 + r5};
            float *q5 = (float *)dq + r5 * 2 * H * D, *ao5 = (float *)dao + r5 * H * D;
            int64_t *pos5 = (int64_t *)dpos + r5;
            hk_h2d(dtiles, &five, sizeof five, &e);
            for (int64_t i = 0; i < 5 * H * D; i++) ao4[i] = NAN;
            for (int split = 0; split <= 2; split += 2) {
                hk_attn_split(split);
                hk_h2d(ao5, ao4, 4 * (size_t)(5 * H * D), &e); /* NaN: a row not written shows */
                CHECK_MSG(hk_attn(st, q5, dtiles, 1, 0, pos5, 5, H, Hkv, D, dk, dv, (size_t)(n_ctx * Hkv * D), n_ctx, f16, seg, n_seg, dpart, ao5,
                                  NULL, &e) == 0 && hk_stream_sync(st, &e) == 0,
                          "%s", e.msg);
                hk_d2h(ao4 + 5 * H * D, ao5, 4 * (size_t)(5 * H * D), &e);
                CHECK_MSG(!memcmp(ao4 + 5 * H * D, ao + r5 * H * D, 4 * (size_t)(5 * H * D)),
                          "f16 KV: rows 193..197 alone in a pass differ from the rows in the full one (%s form)", split ? "split" : "whole");
            }
            if (D % 256 == 0) { /* (rows rounded in the fold: heads of whole 256-blocks, as hk_attn says) */
                hk_act ra, rb;
                act8k_new(&ra, 5, H * D, &e), act8k_new(&rb, 5, H * D, &e);
                CHECK_MSG(hk_attn(st, q5, dtiles, 1, 0, pos5, 5, H, Hkv, D, dk, dv, (size_t)(n_ctx * Hkv * D), n_ctx, f16, seg, n_seg, dpart,
                                  ao5, &ra, &e) == 0 && hk_quantize(st, ao5, H * D, 5, &rb, &e) == 0 && hk_stream_sync(st, &e) == 0,
                          "%s", e.msg);
                CHECK_MSG(diff_act(&ra, &rb, 5, &e) == 0, "f16 KV: the split form's rounding in its fold differs from hk_quantize");
                dev_act_free(&ra), dev_act_free(&rb);
            }
            hk_attn_split(0);
            free(cut), free(ao4);
        }
        /* rows 0, 150 and the last, each alone in one launch: the decode form (every tile one
         * row), which must give the tile kernel's bits */
        const int64_t alone[3] = {0, 150, n - 1};
        hk_qtile one[3];
        int64_t one_pos[3];
        for (int i = 0; i < 3; i++) {
            one[i] = (hk_qtile){.r0 = i, .n = 1, .seq = 0, .pos0 = pos[alone[i]]};
            one_pos[i] = pos[alone[i]];
            hk_h2d((float *)dq + i * 2 * H * D, qf + alone[i] * 2 * H * D, 4 * (size_t)(2 * H * D), &e);
        }
        hk_h2d(dtiles, one, sizeof one, &e);
        hk_h2d(dpos, one_pos, sizeof one_pos, &e);
        CHECK_MSG(hk_attn(st, dq, dtiles, 3, 3, dpos, 3, H, Hkv, D, dk, dv, (size_t)(n_ctx * Hkv * D), n_ctx, f16, seg, n_seg, dpart, dao,
                          NULL, &e) == 0 && hk_stream_sync(st, &e) == 0,
                  "%s", e.msg);
        float *one_ao = xmalloc(4 * (size_t)(3 * H * D));
        hk_d2h(one_ao, dao, 4 * (size_t)(3 * H * D), &e);
        for (int i = 0; i < 3; i++)
            CHECK_MSG(!memcmp(one_ao + i * H * D, ao + alone[i] * H * D, 4 * (size_t)(H * D)),
                      "%s KV: row %lld decoded alone differs from the row in a tile", f16 ? "f16" : "f32", (long long)alone[i]);
        /* the rows rounded in the merge's launch (decode's fused form) = hk_quantize of them;
         * heads that are not whole 256-blocks are refused by name (hk_attn) */
        hk_act ra, rb;
        act8k_new(&ra, 3, H * D, &e), act8k_new(&rb, 3, H * D, &e);
        if (D % 256 == 0) {
            CHECK_MSG(hk_attn(st, dq, dtiles, 3, 3, dpos, 3, H, Hkv, D, dk, dv, (size_t)(n_ctx * Hkv * D), n_ctx, f16, seg, n_seg, dpart, dao,
                              &ra, &e) == 0 && hk_quantize(st, dao, H * D, 3, &rb, &e) == 0 && hk_stream_sync(st, &e) == 0,
                      "%s", e.msg);
            CHECK_MSG(diff_act(&ra, &rb, 3, &e) == 0, "%s KV: the merge's rounding differs from hk_quantize", f16 ? "f16" : "f32");
        } else {
            e.msg[0] = 0;
            CHECK_MSG(hk_attn(st, dq, dtiles, 3, 3, dpos, 3, H, Hkv, D, dk, dv, (size_t)(n_ctx * Hkv * D), n_ctx, f16, seg, n_seg, dpart, dao,
                              &ra, &e) < 0 && strstr(e.msg, "rounded into rows"),
                      "heads of %lld rounded into rows: not refused by name (%s)", (long long)D, e.msg);
        }
        dev_act_free(&ra), dev_act_free(&rb);
        printf("  attention %s KV: %.2g from double (%.3f of the bound) at 300 rows over 1000 keys; 3 rows decoded "
               "alone = the rows in tiles%s, bit for bit\n", f16 ? "f16" : "f32", worst_abs, worst,
               f16 ? " (the wgmma form, TMA) = its cp.async fetch = the pairs form = 4 warps = 6 warps = the split form (tiles, cut, 5 rows alone)"
                   : "");
        hk_free(dk), hk_free(dv), hk_free(dq), hk_free(dpos), hk_free(dtiles), hk_free(dpart), hk_free(dao);
        free(hk), free(hv), free(kr), free(vr), free(pos), free(tiles), free(ao), free(one_ao);
    }
    hk_stream_free(st);
    free(kc), free(vc), free(qf);
}
#endif

TEST(attn_matches_ref) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    attn_case(256);
    attn_case(128);
#endif
}

#ifdef HEARTH_CUDA
/* ---- the chunked delta rule (gdn_chunk.cuh) through hk_gdn_chunk; the CPU emulation of the
 * same kernels is tests/unit/test_gdn_chunk.cc, whose checks these repeat at the real head
 * counts (the planted defects are shown red there: this program links the shipped kernels) */
typedef struct gpiece {
    const gr_stream *s;
    int64_t from, len; /* rows [from, from + len) of the stream */
    const int64_t *marks;
    int n_marks;
    const float *init; /* the start state */
} gpiece;

/* one pass: o (n, Gv*128) in piece order, the pieces' end states (np, lane) and the points
 * (the marks in piece order, lane each) */
static int gdn_pass(void *st, const gpiece *ps, int np, float *o, float *lanes, float *pts, herr *e) {
    const int Gk = ps[0].s->Gk, Gv = ps[0].s->Gv;
    const int64_t cd = ps[0].s->cd, lane = (int64_t)Gv * 128 * 128;
    int64_t n = 0;
    int nm = 0;
    for (int p = 0; p < np; p++) n += ps[p].len, nm += ps[p].n_marks;
    float *cv = xmalloc(sizeof(float) * (size_t)(n * cd)), *a = xmalloc(sizeof(float) * (size_t)(n * Gv));
    float *b = xmalloc(sizeof(float) * (size_t)(n * Gv)), *hl = xmalloc(sizeof(float) * (size_t)(np * lane));
    hk_piece *pieces = xmalloc(sizeof(hk_piece) * (size_t)np);
    hk_mark *marks = xmalloc(sizeof(hk_mark) * (size_t)(nm + 1));
    hk_chunk *chunks = xmalloc(sizeof(hk_chunk) * (size_t)n);
    int32_t *pchunk = xmalloc(sizeof(int32_t) * (size_t)(np + 1));
    int64_t r0 = 0;
    int mk = 0, nc = 0;
    for (int p = 0; p < np; p++) {
        const gpiece *g = &ps[p];
        memcpy(cv + r0 * cd, g->s->cv + g->from * cd, sizeof(float) * (size_t)(g->len * cd));
        memcpy(a + r0 * Gv, g->s->a + g->from * Gv, sizeof(float) * (size_t)(g->len * Gv));
        memcpy(b + r0 * Gv, g->s->b + g->from * Gv, sizeof(float) * (size_t)(g->len * Gv));
        memcpy(hl + p * lane, g->init, sizeof(float) * (size_t)lane);
        pieces[p] = (hk_piece){.r0 = r0, .n = g->len, .pos0 = g->from, .seq = p, .mark0 = mk, .n_marks = g->n_marks};
        for (int k = 0; k < g->n_marks; k++, mk++) marks[mk] = (hk_mark){.m = g->marks[k], .slot = mk, .piece = p};
        pchunk[p] = nc;
        for (int64_t c0 = 0; c0 < g->len; c0 += 64)
            chunks[nc++] = (hk_chunk){.piece = p, .c0 = (int32_t)c0, .n = (int32_t)(g->len - c0 < 64 ? g->len - c0 : 64)};
        pchunk[p + 1] = nc;
        r0 += g->len;
    }
    void *d[13] = {0};
    const size_t bytes[13] = {sizeof(float) * (size_t)(n * cd), sizeof(float) * (size_t)(n * Gv), sizeof(float) * (size_t)(n * Gv),
                              sizeof(float) * (size_t)(np * lane), sizeof(hk_piece) * (size_t)np, sizeof(hk_chunk) * (size_t)n,
                              sizeof(int32_t) * (size_t)(np + 1), sizeof(hk_mark) * (size_t)(nm + 1),
                              sizeof(float) * (size_t)((nm + 1) * lane), sizeof(float) * (size_t)(n * Gv * 128),
                              sizeof(float) * (size_t)(n * Gv * 128), sizeof(float) * (size_t)(n * Gv * 64 + n * Gv),
                              sizeof(float) * (size_t)(n * Gv * 128)};
    int rc = 0;
    for (int i = 0; i < 13 && rc == 0; i++) rc = hk_malloc(&d[i], bytes[i], e);
    const void *src[8] = {cv, a, b, hl, pieces, chunks, pchunk, marks};
    for (int i = 0; i < 8 && rc == 0; i++) rc = hk_h2d(d[i], src[i], bytes[i], e);
    if (rc == 0) rc = hk_memset(d[8], 0xff, bytes[8], e); /* NaN: a point not written shows */
    hk_gdn_scratch sc = {.w = d[9], .u = d[10], .qk = d[11], .g = (float *)d[11] + n * Gv * 64};
    if (rc == 0)
        rc = hk_gdn_chunk(st, d[0], d[2], d[1], d[3], (size_t)lane, d[4], np, d[5], d[6], n, d[7], d[8], (size_t)lane, 128, Gk,
                          Gv, cd, &sc, NULL, NULL, d[12], e);
    if (rc == 0) rc = hk_stream_sync(st, e);
    if (rc == 0) rc = hk_d2h(o, d[12], bytes[12], e);
    if (rc == 0) rc = hk_d2h(lanes, d[3], bytes[3], e);
    if (rc == 0 && nm) rc = hk_d2h(pts, d[8], sizeof(float) * (size_t)(nm * lane), e);
    for (int i = 0; i < 13; i++) hk_free(d[i]);
    free(cv), free(a), free(b), free(hl), free(pieces), free(marks), free(chunks), free(pchunk);
    return rc;
}

/* the row-by-row rule (hk_gdn_delta) and the chunked one (hk_gdn_chunk) timed on np pieces of
 * len rows each at 32 value heads (ms a launch sequence, the median of 5 after a warm-up):
 * printed, not checked */
static void gdn_time(int np, int64_t len) {
    enum { GK = 16, GV = 32 };
    const int64_t cd = 2 * GK * 128 + GV * 128, n = np * len, lane = (int64_t)GV * 128 * 128;
    uint64_t rng = 77;
    gr_stream s = gr_stream_new(len, GK, GV, &rng);
    hk_piece *pieces = xmalloc(sizeof(hk_piece) * (size_t)np);
    hk_chunk *chunks = xmalloc(sizeof(hk_chunk) * (size_t)n);
    int32_t *pchunk = xmalloc(sizeof(int32_t) * (size_t)(np + 1));
    int nc = 0;
    for (int p = 0; p < np; p++) {
        pieces[p] = (hk_piece){.r0 = p * len, .n = len, .seq = p};
        pchunk[p] = nc;
        for (int64_t c0 = 0; c0 < len; c0 += 64) chunks[nc++] = (hk_chunk){.piece = p, .c0 = (int32_t)c0, .n = (int32_t)(len - c0 < 64 ? len - c0 : 64)};
        pchunk[p + 1] = nc;
    }
    herr e;
    void *st, *ev[2], *d[10] = {0};
    const size_t bytes[10] = {sizeof(float) * (size_t)(n * cd), sizeof(float) * (size_t)(n * GV), sizeof(float) * (size_t)(n * GV),
                              sizeof(float) * (size_t)(np * lane), sizeof(hk_piece) * (size_t)np, sizeof(hk_chunk) * (size_t)n,
                              sizeof(int32_t) * (size_t)(np + 1), sizeof(float) * (size_t)(n * GV * 128) * 2,
                              sizeof(float) * (size_t)(n * GV * 65), sizeof(float) * (size_t)(n * GV * 128)};
    int rc = hk_stream_new(&st, &e) | hk_event_new(&ev[0], &e) | hk_event_new(&ev[1], &e);
    for (int i = 0; i < 10 && rc == 0; i++) rc = hk_malloc(&d[i], bytes[i], &e);
    for (int p = 0; p < np && rc == 0; p++)
        rc = hk_h2d((float *)d[0] + p * len * cd, s.cv, sizeof(float) * (size_t)(len * cd), &e) |
             hk_h2d((float *)d[1] + p * len * GV, s.a, sizeof(float) * (size_t)(len * GV), &e) |
             hk_h2d((float *)d[2] + p * len * GV, s.b, sizeof(float) * (size_t)(len * GV), &e);
    if (rc == 0)
        rc = hk_h2d(d[4], pieces, bytes[4], &e) | hk_h2d(d[5], chunks, bytes[5], &e) | hk_h2d(d[6], pchunk, bytes[6], &e) |
             hk_memset(d[3], 0, bytes[3], &e);
    hk_gdn_scratch sc = {.w = d[7], .u = (float *)d[7] + n * GV * 128, .qk = d[8], .g = (float *)d[8] + n * GV * 64};
    float ms[4][5];
    for (int form = 0; form < 4 && rc == 0; form++)
        for (int r = -1; r < 5 && rc == 0; r++) {
            hk_gdn_wide(form == 1 ? 1 : form == 2 ? 0 : 2); /* the chunked rule's state kernel: as chosen, 256, 512 threads */
            rc |= hk_event_record(st, ev[0], &e);
            if (form == 0)
                rc |= hk_gdn_delta(st, d[0], d[2], d[1], d[3], (size_t)lane, d[4], np, NULL, NULL, 0, 128, GK, GV, cd, NULL, d[9], &e);
            else
                rc |= hk_gdn_chunk(st, d[0], d[2], d[1], d[3], (size_t)lane, d[4], np, d[5], d[6], n, NULL, NULL, 0, 128, GK, GV, cd,
                                   &sc, NULL, NULL, d[9], &e);
            rc |= hk_event_record(st, ev[1], &e) | hk_stream_sync(st, &e);
            if (r >= 0) ms[form][r] = hk_event_ms(ev[0], ev[1]);
        }
    hk_gdn_wide(1);
    if (rc == 0) {
        for (int f = 0; f < 4; f++) /* median of 5 */
            for (int i = 0; i < 5; i++)
                for (int j = i + 1; j < 5; j++)
                    if (ms[f][j] < ms[f][i]) { const float t = ms[f][i]; ms[f][i] = ms[f][j]; ms[f][j] = t; }
        printf("  gdn delta rule, %d piece(s) of %lld rows, 32 heads: row by row %.4f ms, chunked %.4f ms (state kernel in 256 "
               "threads: %.4f, in 512: %.4f)\n", np, (long long)len, ms[0][2], ms[1][2], ms[2][2], ms[3][2]);
    } else
        printf("  gdn timing failed: %s\n", e.msg);
    for (int i = 0; i < 10; i++) hk_free(d[i]);
    hk_event_free(ev[0]), hk_event_free(ev[1]), hk_stream_free(st);
    gr_stream_free(&s), free(pieces), free(chunks), free(pchunk);
}
#endif

/* the chunked delta rule on the GPU at the model's head counts (32 value heads on 16 key
 * heads): against float64 within gdn_chunk_ref.h's derived bound; marks exact (a point =
 * the prefill of its prefix) and neutral; the one-row kernel = the chunk path's rows;
 * batch invariance */
TEST(gdn_chunk_matches_ref) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    enum { GK = 16, GV = 32, NR = 130 };
    const int64_t lane = (int64_t)GV * 128 * 128, vd = GV * 128;
    uint64_t rng = 0x5eed0f5a11ull;
    gr_stream s[3];
    for (int i = 0; i < 3; i++) s[i] = gr_stream_new(NR, GK, GV, &rng);
    herr e;
    void *st;
    CHECK(hk_stream_new(&st, &e) == 0);
    float *o = xmalloc(sizeof(float) * (size_t)(3 * NR * vd)), *lanes = xmalloc(sizeof(float) * (size_t)(16 * lane));
    float *pts = xmalloc(sizeof(float) * (size_t)(16 * lane));
    /* accuracy: pieces of 1, 63, 64, 65 and 130 rows in one pass */
    const int64_t lens[5] = {1, 63, 64, 65, 130};
    gpiece acc[5];
    for (int i = 0; i < 5; i++) acc[i] = (gpiece){.s = &s[i % 3], .from = 0, .len = lens[i], .init = s[i % 3].lane};
    CHECK_MSG(gdn_pass(st, acc, 5, o, lanes, pts, &e) == 0, "%s", e.msg);
    gr_stats so = {0}, sl = {0};
    double *ro = xmalloc(sizeof(double) * (size_t)(NR * vd)), *bo = xmalloc(sizeof(double) * (size_t)(NR * vd));
    double *rl = xmalloc(sizeof(double) * (size_t)lane), *bl = xmalloc(sizeof(double) * (size_t)lane);
    int64_t r0 = 0;
    for (int i = 0; i < 5; i++) {
        gr_sequential(acc[i].s, 0, lens[i], acc[i].init, ro, rl);
        gr_bounds(acc[i].s, 0, lens[i], acc[i].init, bo, bl);
        gr_compare(o + r0 * vd, ro, bo, lens[i] * vd, &so);
        gr_compare(lanes + i * lane, rl, bl, lane, &sl);
        r0 += lens[i];
    }
    printf("  gdn chunk: o max |err| %.3g (%.3f of its bound), end states %.3g (%.3f), %lld + %lld outside\n", so.max_err,
           so.max_ratio, sl.max_err, sl.max_ratio, (long long)so.bad, (long long)sl.bad);
    CHECK(so.bad == 0 && sl.bad == 0);
    /* marks: a piece of 130 rows marked at 12 rows against the prefills of its prefixes (one
     * pass, a piece each) and against itself unmarked */
    static const int64_t mk[12] = {1, 2, 33, 63, 64, 65, 66, 100, 127, 128, 129, 130};
    gpiece marked = {.s = &s[0], .from = 0, .len = NR, .marks = mk, .n_marks = 12, .init = s[0].lane};
    CHECK_MSG(gdn_pass(st, &marked, 1, o, lanes, pts, &e) == 0, "%s", e.msg);
    float *o_marked = xmalloc(sizeof(float) * (size_t)(NR * vd)), *l_marked = xmalloc(sizeof(float) * (size_t)lane);
    memcpy(o_marked, o, sizeof(float) * (size_t)(NR * vd)), memcpy(l_marked, lanes, sizeof(float) * (size_t)lane);
    gpiece plain = marked;
    plain.marks = NULL, plain.n_marks = 0;
    CHECK_MSG(gdn_pass(st, &plain, 1, o, lanes, NULL, &e) == 0, "%s", e.msg);
    CHECK_MSG(!memcmp(o, o_marked, sizeof(float) * (size_t)(NR * vd)) && !memcmp(lanes, l_marked, sizeof(float) * (size_t)lane),
              "marks moved the pass's outputs or end state");
    gpiece pre[12];
    for (int k = 0; k < 12; k++) pre[k] = (gpiece){.s = &s[0], .from = 0, .len = mk[k], .init = s[0].lane};
    float *pre_l = xmalloc(sizeof(float) * (size_t)(12 * lane)), *pre_o = xmalloc(sizeof(float) * (size_t)(12 * NR * vd));
    CHECK_MSG(gdn_pass(st, pre, 12, pre_o, pre_l, NULL, &e) == 0, "%s", e.msg);
    int bad = 0;
    for (int k = 0; k < 12; k++) bad += memcmp(pts + k * lane, pre_l + k * lane, sizeof(float) * (size_t)lane) != 0;
    CHECK_MSG(bad == 0, "%d of 12 points differ from the prefills of their prefixes", bad);
    /* decode: a pass of one-row pieces (the one-launch kernel) = the chunk path's row 0 and
     * its point at m = 1; a step after a prefill of [0, 64) = the last chunk of [0, 65) */
    const int64_t one = 1;
    gpiece dec[2] = {{.s = &s[2], .from = 0, .len = 1, .init = s[2].lane},
                     {.s = &s[0], .from = 0, .len = 1, .marks = &one, .n_marks = 1, .init = s[0].lane}};
    CHECK_MSG(gdn_pass(st, dec, 2, o, lanes, pts, &e) == 0, "%s", e.msg);
    CHECK_MSG(!memcmp(lanes + lane, pre_l, sizeof(float) * (size_t)lane) &&
                  !memcmp(pts, pre_l, sizeof(float) * (size_t)lane) && !memcmp(o + vd, o_marked, sizeof(float) * (size_t)vd),
              "a one-row pass differs from row 0 of the chunk path");
    gpiece p64 = {.s = &s[1], .from = 0, .len = 64, .init = s[1].lane};
    CHECK_MSG(gdn_pass(st, &p64, 1, o, lanes, NULL, &e) == 0, "%s", e.msg);
    float *l64 = xmalloc(sizeof(float) * (size_t)lane);
    memcpy(l64, lanes, sizeof(float) * (size_t)lane);
    gpiece step = {.s = &s[1], .from = 64, .len = 1, .init = l64};
    CHECK_MSG(gdn_pass(st, &step, 1, o, lanes, NULL, &e) == 0, "%s", e.msg);
    float *o_step = xmalloc(sizeof(float) * (size_t)vd), *l_step = xmalloc(sizeof(float) * (size_t)lane);
    memcpy(o_step, o, sizeof(float) * (size_t)vd), memcpy(l_step, lanes, sizeof(float) * (size_t)lane);
    gpiece p65 = {.s = &s[1], .from = 0, .len = 65, .init = s[1].lane};
    CHECK_MSG(gdn_pass(st, &p65, 1, o, lanes, NULL, &e) == 0, "%s", e.msg);
    CHECK_MSG(!memcmp(l_step, lanes, sizeof(float) * (size_t)lane) && !memcmp(o_step, o + 64 * vd, sizeof(float) * (size_t)vd),
              "a step after [0, 64) differs from the last row of a prefill of [0, 65)");
    /* batch invariance: the marked piece second among others */
    static const int64_t m3 = 3;
    gpiece mixed[4] = {{.s = &s[1], .from = 0, .len = 65, .marks = &m3, .n_marks = 1, .init = s[1].lane}, marked,
                       {.s = &s[2], .from = 5, .len = 1, .init = s[2].lane}, {.s = &s[2], .from = 0, .len = 64, .init = s[1].lane}};
    float *pts_alone = xmalloc(sizeof(float) * (size_t)(12 * lane));
    CHECK_MSG(gdn_pass(st, &marked, 1, o, lanes, pts_alone, &e) == 0, "%s", e.msg);
    CHECK_MSG(gdn_pass(st, mixed, 4, o, lanes, pts, &e) == 0, "%s", e.msg);
    CHECK_MSG(!memcmp(o + 65 * vd, o_marked, sizeof(float) * (size_t)(NR * vd)) &&
                  !memcmp(lanes + lane, l_marked, sizeof(float) * (size_t)lane) &&
                  !memcmp(pts + lane, pts_alone, sizeof(float) * (size_t)(12 * lane)),
              "a piece beside others differs from the piece alone");
    /* the state kernel in 256 threads (HEARTH_CUDA_GDN_WIDE=0) gives the 512-thread form's
     * bits: outputs, end states and points of the mixed pass, each form forced (by default
     * its 4 pieces' 512 blocks would take 256 threads) */
    const int64_t mixed_rows = 65 + NR + 1 + 64;
    float *o_w = xmalloc(sizeof(float) * (size_t)(mixed_rows * vd)), *l_w = xmalloc(sizeof(float) * (size_t)(4 * lane));
    float *p_w = xmalloc(sizeof(float) * (size_t)(13 * lane));
    CHECK(hk_gdn_wide(3) == -1);
    hk_gdn_wide(2); /* always 512 */
    CHECK_MSG(gdn_pass(st, mixed, 4, o_w, l_w, p_w, &e) == 0, "%s", e.msg);
    hk_gdn_wide(0); /* always 256 */
    CHECK_MSG(gdn_pass(st, mixed, 4, o, lanes, pts, &e) == 0, "%s", e.msg);
    hk_gdn_wide(1);
    CHECK_MSG(!memcmp(o, o_w, sizeof(float) * (size_t)(mixed_rows * vd)) && !memcmp(lanes, l_w, sizeof(float) * (size_t)(4 * lane)) &&
                  !memcmp(pts, p_w, sizeof(float) * (size_t)(13 * lane)),
              "the state kernel in 256 threads differs from 512");
    free(o_w), free(l_w), free(p_w);
    hk_stream_free(st);
    gdn_time(1, 4096), gdn_time(1, 2048), gdn_time(4, 512), gdn_time(8, 1), gdn_time(64, 1);
    for (int i = 0; i < 3; i++) gr_stream_free(&s[i]);
    free(o), free(lanes), free(pts), free(ro), free(bo), free(rl), free(bl), free(o_marked), free(l_marked), free(pre_l);
    free(pre_o), free(l64), free(o_step), free(l_step), free(pts_alone);
#endif
}

/* The greedy token on the GPU (hk_argmax) against sampler_argmax over rows at the real vocab
 * (248,320) with the cases the rule has to get right: random rows, maxima tied at several ids
 * (the lowest wins), NaN at id 0 (id 0), NaN at the true maximum and elsewhere (skipped),
 * all -inf (id 0), all NaN (id 0), the maximum at the last id and at a block's first; then
 * launched again over fewer rows, which the tickets the first launch left must not upset. */
TEST(argmax_matches_sampler) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    const int64_t V = 248320, n = 9;
    float *l = randf(n * V, 900, -30.0f, 30.0f);
    float *r1 = l + V, *r2 = l + 2 * V, *r3 = l + 3 * V, *r4 = l + 4 * V, *r5 = l + 5 * V, *r6 = l + 6 * V, *r7 = l + 7 * V;
    r1[5000] = r1[100] = r1[200000] = 99.0f;
    r2[0] = NAN, r2[7] = 99.0f;
    r3[1234] = NAN, r3[77] = 98.0f, r3[V - 2] = NAN, r3[4242] = 97.0f;
    for (int64_t i = 0; i < V; i++) r4[i] = -INFINITY, r5[i] = NAN;
    r6[V - 1] = 99.0f;
    r7[(V + 31) / 32 * 5] = 99.0f; /* the first value of block 5's slice */
    herr e;
    void *st, *dl, *dt, *scr;
    const size_t sb = hk_argmax_scratch(n);
    CHECK(hk_stream_new(&st, &e) == 0 && hk_malloc(&dl, 4 * (size_t)(n * V), &e) == 0 && hk_malloc(&dt, 4 * (size_t)n, &e) == 0 &&
          hk_malloc(&scr, sb, &e) == 0 && hk_memset(scr, 0, sb, &e) == 0);
    hk_h2d(dl, l, 4 * (size_t)(n * V), &e);
    int32_t tok[9], tok2[3];
    CHECK_MSG(hk_argmax(st, dl, V, n, scr, dt, &e) == 0 && hk_stream_sync(st, &e) == 0, "%s", e.msg);
    hk_d2h(tok, dt, sizeof tok, &e);
    CHECK_MSG(hk_argmax(st, (float *)dl + 4 * V, V, 3, scr, dt, &e) == 0 && hk_stream_sync(st, &e) == 0, "%s", e.msg);
    hk_d2h(tok2, dt, sizeof tok2, &e);
    int bad = 0;
    for (int64_t r = 0; r < n; r++) {
        const int32_t want = sampler_argmax(l + r * V, V);
        if (tok[r] != want) bad++, printf("  row %lld: GPU %d, sampler_argmax %d\n", (long long)r, tok[r], want);
        if (r >= 4 && r < 7 && tok2[r - 4] != want) bad++, printf("  second launch, row %lld: GPU %d, sampler_argmax %d\n", (long long)r, tok2[r - 4], want);
    }
    CHECK_MSG(bad == 0, "%d greedy tokens differ from sampler_argmax", bad);
    CHECK(tok[1] == 100 && tok[2] == 0 && tok[3] == 77 && tok[4] == 0 && tok[5] == 0 && tok[6] == V - 1);
    printf("  argmax: %lld rows of %lld (ties, NaN, -inf, edges) equal sampler_argmax, twice\n", (long long)n, (long long)V);
    hk_free(dl), hk_free(dt), hk_free(scr);
    hk_stream_free(st);
    free(l);
#endif
}

/* The one-row products again, staged through shared memory (HEARTH_CUDA_GEMV_STAGE=1:
 * gemv_staged_kernel): the same loads and arithmetic on copies, so every check above must
 * hold bit for bit as it did with the rows read in registers */
TEST(products_staged) {
#ifndef HEARTH_CUDA
    SKIP("built without CUDA (nvcc not found)");
#else
    if (!have_gpu()) return;
    hk_gemv_stage(true);
    qmatmul_matches_ref();
    moe_matmul_matches_ref();
    down_swiglu_matches_apart();
    hk_gemv_stage(false);
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
#ifdef HEARTH_CUDA
    if (getenv("HEARTH_GDN_TIME_ONLY")) { /* the delta rule's timings alone (for a profiler); no checks */
        gdn_time(1, 4096), gdn_time(4, 512), gdn_time(8, 1);
        return 0;
    }
    if (getenv("HEARTH_ATTN_ONLY")) { /* the attention's test alone (a short device call) */
        RUN(attn_matches_ref);
        return harness_done();
    }
#endif
    RUN(dequant_matches_cpu);
    RUN(rounding_matches_cpu);
    RUN(qmatmul_matches_ref);
    RUN(moe_matmul_matches_ref);
    RUN(down_swiglu_matches_apart);
    RUN(h2d_done_on_return);
    RUN(fused_tails_match_apart);
    RUN(gated_tail_matches_apart);
    RUN(conv_in_matches_apart);
    RUN(fmatmul_matches_cpu);
    RUN(route_matches_cpu);
    RUN(attn_matches_ref);
    RUN(gdn_chunk_matches_ref);
    RUN(argmax_matches_sampler);
    RUN(products_staged);
    RUN(device_name);
    return harness_done();
}
