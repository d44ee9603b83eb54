/* test_mmq_emu.cc: the prompt rows' quantized products on int8 tensor cores (mmq_kernel,
 * src/engine/cuda/mmq.cuh) run on the CPU under tests/unit/cuda_emu.h, both forms of the
 * Q4_K / Q5_K block, dense tiles and experts' tiles, against the block-by-block reference
 * written here from the formats: per 256-block the integer sums sum_j sc_j (q_j . x_j) and
 * sum_j m_j s_j, finished with term_kmin and added in block order. Equal bits are asked
 * (integer sums are exact whichever way they are formed; the float steps are the same).
 * Planted (mmq.cuh's QMUT): the second form's mins' sum without its 128, and its scales of
 * sub-blocks 4..7 without their high bits: each must be red. What the emulation cannot
 * show is the GPU's own ldmatrix and mma: test_cuda.c's matmul checks run the kernel there
 * against the CPU engine at the model's widths. */
#include "cuda_emu.h"

extern "C" {
#include "harness.h"
#include "engine/cuda/kernels.h"
}

#include <vector>

static unsigned emu_mut;
#define QMUT(bit) (emu_mut & (bit))
#include "engine/cuda/act.cuh"
#include "engine/cuda/gemv.cuh"
#include "engine/cuda/mmq.cuh"

#define EMU_SEED 91
#include "emu_rand.h"

/* rows (M a slice, `slices` slices) of K weights of type t (Q4_K or Q5_K, the file's
 * layout), random bytes, the two f16 scales finite */
struct wbuf {
    std::vector<uint8_t> d;
    hk_w w;
    void make(uint32_t t, int64_t K, int64_t M, int64_t slices) {
        const int64_t nb = K / 256, rows = M * slices;
        const size_t bb = t == QT_Q4_K ? 144 : 176;
        d.resize((size_t)rows * nb * bb);
        for (auto &v : d) v = (uint8_t)rnd();
        for (int64_t i = 0; i < rows * nb; i++) {
            const uint16_t dd = f16_bits(rndf(0.001f, 0.01f)), m = f16_bits(rndf(0.001f, 0.01f));
            memcpy(&d[(size_t)i * bb], &dd, 2), memcpy(&d[(size_t)i * bb + 2], &m, 2);
        }
        w = hk_w{d.data(), nullptr, t, K, M, (size_t)nb * bb, (size_t)(nb * bb * M), 0, 0};
    }
};

/* rows of K rounded to Q8_K blocks by act.cuh's round_into (a warp per block) */
struct abuf {
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> s;
    hk_act a;
};
static void round_kernel(const float *x, hk_act a) {
    const int64_t r = blockIdx.x, blk = threadIdx.x / 32;
    float v[8];
    for (int i = 0; i < 8; i++) v[i] = x[r * a.K + blk * 256 + 8 * (threadIdx.x & 31) + i];
    round_into(a, r, blk, v);
}
static void make_act(abuf &b, int64_t n, int64_t K) {
    std::vector<float> x((size_t)(n * K));
    for (auto &v : x) v = rndf(-2.0f, 2.0f);
    b.q.assign((size_t)(n * K), 0), b.d.assign((size_t)(n * K / 256), 0.0f), b.s.assign((size_t)(n * K / 32), 0);
    b.a = hk_act{b.q.data(), b.d.data(), b.s.data(), K, false};
    emu::launch(round_kernel, dim3((unsigned)n), dim3((unsigned)(32 * K / 256)), 0, (const float *)x.data(), b.a);
}

/* weight row o of slice e against input row r, block by block */
static float ref_dot(const wbuf &w, int64_t e, int64_t o, const abuf &a, int64_t r) {
    const int64_t K = w.w.K, nb = K / 256;
    const bool five = w.w.type == QT_Q5_K;
    const uint8_t *row = w.d.data() + (size_t)e * w.w.slice_bytes + (size_t)o * w.w.row_bytes;
    float acc = 0.0f;
    for (int64_t kb = 0; kb < nb; kb++) {
        const uint8_t *b = row + kb * (five ? 176 : 144);
        const uint8_t *qs = b + (five ? 48 : 16), *qh = b + 16;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min(j, b + 4, &sc, &m);
            int c = 0;
            for (int l = 0; l < 32; l++) {
                int q = (qs[(j / 2) * 32 + l] >> (4 * (j & 1))) & 0xF;
                if (five) q |= ((qh[l] >> j) & 1) << 4;
                c += q * a.q[(size_t)(r * K + kb * 256 + 32 * j + l)];
            }
            sumi += sc * c, summ += m * a.s[(size_t)(r * (K / 32) + kb * 8 + j)];
        }
        const float dw = __half2float(__ushort_as_half(*(const uint16_t *)b));
        const float dm = __half2float(__ushort_as_half(*(const uint16_t *)(b + 2)));
        acc = FADD(acc, term_kmin(a.d[(size_t)(r * nb + kb)], dw, dm, sumi, summ));
    }
    return acc;
}

template <int T, int NT, bool NF>
static void run(const wbuf &w, const abuf &a, int64_t n, const int32_t *offs, const int32_t *list, const int32_t *tiles,
                int64_t grid_y, int in_div, std::vector<float> &y, int64_t ys, bool add) {
    emu::launch(mmq_kernel<T, NT, NF>, dim3((unsigned)((w.w.M + MM_BM - 1) / MM_BM), (unsigned)grid_y), dim3(128),
                (size_t)mq_smem<T, NT>::TOTAL, w.w, a.a, n, offs, list, tiles, in_div, y.data(), ys, add);
}

static int64_t first_diff(const std::vector<float> &a, const std::vector<float> &b) {
    for (size_t i = 0; i < a.size(); i++)
        if (memcmp(&a[i], &b[i], 4) || a[i] != a[i]) return (int64_t)i;
    return -1;
}

/* dense: M = 80 outputs (a partial tile of 64), K = 512, n rows in tiles of 8 NT (the last
 * partial), written and added into a row stride wider than M */
template <int T, int NT> static void dense_case(const char *name, int64_t n) {
    const int64_t K = 512, M = 80, ys = 96;
    wbuf w;
    w.make(T, K, M, 1);
    abuf a;
    make_act(a, n, K);
    std::vector<float> want((size_t)(n * ys), 0.5f);
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = 0; o < M; o++) want[(size_t)(r * ys + o)] = FADD(0.5f, ref_dot(w, 0, o, a, r));
    const int64_t gy = (n + 8 * NT - 1) / (8 * NT);
    for (int f = 0; f < 2; f++) {
        std::vector<float> y((size_t)(n * ys), 0.5f);
        if (f) run<T, NT, true>(w, a, n, nullptr, nullptr, nullptr, gy, 1, y, ys, true);
        else run<T, NT, false>(w, a, n, nullptr, nullptr, nullptr, gy, 1, y, ys, true);
        const int64_t at = first_diff(y, want);
        CHECK_MSG(at < 0, "%s dense, %lld rows, form %d: row %lld output %lld is %.9g, the blocks give %.9g", name, (long long)n,
                  f + 1, (long long)(at / ys), (long long)(at % ys), at < 0 ? 0.0 : y[(size_t)at], at < 0 ? 0.0 : want[(size_t)at]);
    }
    printf("  %s dense: %lld rows in tiles of %d, 80 outputs of 512 inputs, added: both forms = the blocks, bit for bit\n", name,
           (long long)n, 8 * NT);
}

/* experts: 48 input rows, each to k = 3 of E = 6 experts (pair p: row p / 3), the pairs
 * grouped by expert into tiles of 16 or 32 as hk_moe_sort lays them (expert 0 in every row,
 * over 32 pairs; one expert with none); output rows the pairs */
template <int T> static std::vector<float> experts(const wbuf &w, const abuf &a, const std::vector<int32_t> &sel, int E, bool nf,
                                                   int tile, int64_t ys) {
    const int64_t np = (int64_t)sel.size();
    std::vector<int32_t> offs((size_t)E + 1, 0), list((size_t)np), tiles(1, 0);
    std::vector<int> cnt((size_t)E, 0);
    for (int32_t s : sel) cnt[(size_t)s]++;
    for (int x = 0; x < E; x++) offs[(size_t)x + 1] = offs[(size_t)x] + cnt[(size_t)x];
    for (int x = 0; x < E; x++)
        for (int k = 0; k * tile < cnt[(size_t)x]; k++) tiles.push_back(x), tiles.push_back(offs[(size_t)x] + tile * k), tiles[0]++;
    std::vector<int32_t> at(offs.begin(), offs.end() - 1);
    for (int64_t p = 0; p < np; p++) list[(size_t)at[(size_t)sel[(size_t)p]]++] = (int32_t)p;
    const int64_t gy = tiles[0] + 2; /* more blocks than tiles: the spare ones return */
    std::vector<float> y((size_t)(np * ys), -7.0f);
    if (tile == 32) {
        if (nf) run<T, 4, true>(w, a, np, offs.data(), list.data(), tiles.data(), gy, 3, y, ys, false);
        else run<T, 4, false>(w, a, np, offs.data(), list.data(), tiles.data(), gy, 3, y, ys, false);
    } else {
        if (nf) run<T, 2, true>(w, a, np, offs.data(), list.data(), tiles.data(), gy, 3, y, ys, false);
        else run<T, 2, false>(w, a, np, offs.data(), list.data(), tiles.data(), gy, 3, y, ys, false);
    }
    return y;
}
template <int T> static void expert_case(const char *name) {
    const int64_t K = 512, M = 64, n = 48, ys = 64;
    const int E = 6;
    wbuf w;
    w.make(T, K, M, E);
    abuf a;
    make_act(a, n, K);
    std::vector<int32_t> sel;
    for (int64_t r = 0; r < n; r++) { /* 3 distinct experts a row, expert 5 never, expert 0 often */
        const int32_t e0 = 0, e1 = 1 + (int32_t)(rnd() % 4);
        int32_t e2 = 1 + (int32_t)(rnd() % 4);
        if (e2 == e1) e2 = 1 + e1 % 4;
        sel.push_back(e0), sel.push_back(e1), sel.push_back(e2);
    }
    std::vector<float> want(sel.size() * (size_t)ys);
    for (size_t p = 0; p < sel.size(); p++)
        for (int64_t o = 0; o < M; o++) want[p * (size_t)ys + (size_t)o] = ref_dot(w, sel[p], o, a, (int64_t)p / 3);
    for (int tile = 16; tile <= 32; tile *= 2)
        for (int f = 0; f < 2; f++) {
            const std::vector<float> y = experts<T>(w, a, sel, E, f == 1, tile, ys);
            const int64_t d = first_diff(y, want);
            CHECK_MSG(d < 0, "%s experts, tiles of %d, form %d: pair %lld output %lld is %.9g, the blocks give %.9g", name, tile,
                      f + 1, (long long)(d / ys), (long long)(d % ys), d < 0 ? 0.0 : y[(size_t)d], d < 0 ? 0.0 : want[(size_t)d]);
        }
    /* the planted defects of the second form */
    for (unsigned bit = 1; bit <= 2; bit <<= 1) {
        emu_mut = bit;
        const std::vector<float> y = experts<T>(w, a, sel, E, true, 16, ys);
        emu_mut = 0;
        CHECK_MSG(first_diff(y, want) >= 0, "%s experts: planted defect %u went unseen", name, bit);
    }
    printf("  %s experts: 144 pairs of 48 rows over 6 experts in tiles of 16 and of 32: both forms = the blocks; planted "
           "defects red\n", name);
}

TEST(q4k_dense_matches_blocks) {
    dense_case<QT_Q4_K, 4>("Q4_K", 40);
    dense_case<QT_Q4_K, 8>("Q4_K", 70);
}
TEST(q5k_dense_matches_blocks) { dense_case<QT_Q5_K, 8>("Q5_K", 70); }
TEST(q4k_experts_match_blocks) { expert_case<QT_Q4_K>("Q4_K"); }
TEST(q5k_experts_match_blocks) { expert_case<QT_Q5_K>("Q5_K"); }

int main(void) {
    RUN(q4k_dense_matches_blocks);
    RUN(q5k_dense_matches_blocks);
    RUN(q4k_experts_match_blocks);
    RUN(q5k_experts_match_blocks);
    return harness_done();
}
