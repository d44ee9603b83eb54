/* test_fused_emu.cc: decode's fused launches (src/engine/cuda/tail.cuh, gemv.cuh) run on the
 * CPU under tests/unit/cuda_emu.h against the separate launches they stand for, bit for bit:
 * several weights' products in one launch (gemv_kernel's EX segments); the output product
 * with the norm as its tail; the experts' down product (SwiGLU made in the launch) with the
 * combine and the next norm as its tail; a product's route as its tail; the delta rule's
 * one-row pass (chunked and row by row) with the gated norm as its tail, its blocks in three
 * orders (cuda_emu.h's emu::order). Every tail's tickets must end at zero, and a
 * tail planted to fire early (its ticket primed: it runs before every block is in) must be
 * red. The kernels are the GPU's own code; what the emulation cannot show is the GPU's
 * memory model across blocks (its blocks run one after another here) and its bits for
 * expf and the like: test_cuda.c's fused_tails_match_apart and gated_tail_matches_apart
 * check those on a GPU, at the model's widths. The shapes here are smaller (the emulation
 * switches fibers at every shuffle) but keep the model's per-row structure: K-quant rows of
 * several 256-blocks, 16- and 32-lane groups, experts of 512, heads of 128. */
#include "cuda_emu.h"

extern "C" {
#include "harness.h"
#include "engine/cuda/kernels.h"
}

#include <vector>

static unsigned emu_mut;
#define KMUT(bit) (emu_mut & (bit))
enum { M_NEIGHBOUR = 1 << 0, M_RING_SKIP = 1 << 1, M_RING_REVERSE = 1 << 2, M_COPY_LATE = 1 << 3, M_COPY_EARLY = 1 << 4,
       M_POINT_INPLACE = 1 << 5, M_DECAY_SKIP = 1 << 6 }; /* gdn.cu's bits */
#include "engine/cuda/gemv.cuh"
#include "engine/cuda/gdn_conv.cuh"
#include "engine/cuda/gdn_chunk.cuh"
#include "engine/cuda/gdn_row.cuh"
#include "engine/cuda/attn_merge.cuh"

#define EMU_SEED 77
#include "emu_rand.h"

/* M rows of K weights of type t in the GPU's layout (Q4_K as in the file; Q6_K repacked:
 * 208 bytes a block, its f16 scale in dd), random, scales finite */
struct wbuf {
    std::vector<uint8_t> d;
    std::vector<uint16_t> dd;
    hk_w w;
};
static void make_w(wbuf &b, uint32_t t, int64_t K, int64_t M, int64_t slices = 1) {
    const int64_t nb = K / 256, rows = M * slices;
    const size_t bb = t == QT_Q4_K ? 144 : 208;
    b.d.resize((size_t)rows * nb * bb);
    for (auto &v : b.d) v = (uint8_t)rnd();
    if (t == QT_Q4_K)
        for (int64_t i = 0; i < rows * nb; i++) {
            const uint16_t d = f16_bits(rndf(0.001f, 0.01f)), m = f16_bits(rndf(0.001f, 0.01f));
            memcpy(&b.d[(size_t)i * bb], &d, 2), memcpy(&b.d[(size_t)i * bb + 2], &m, 2);
        }
    else {
        b.dd.resize((size_t)(rows * nb));
        for (auto &v : b.dd) v = f16_bits(rndf(0.001f, 0.01f));
    }
    b.w = hk_w{b.d.data(), t == QT_Q4_K ? nullptr : b.dd.data(), t, K, M, (size_t)nb * bb, (size_t)(nb * bb * M),
               (size_t)(t == QT_Q4_K ? 0 : nb), (size_t)(t == QT_Q4_K ? 0 : nb * M)};
}

/* rows of K rounded to Q8_K blocks (act.cuh's round_into, a warp per block) */
struct abuf {
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> s;
    hk_act a;
    void init(int64_t n, int64_t K) {
        q.assign((size_t)(n * K), 0), d.assign((size_t)(n * K / 256), 0.0f), s.assign((size_t)(n * K / 32), 0);
        a = hk_act{q.data(), d.data(), s.data(), K, false};
    }
    bool operator==(const abuf &o) const {
        return q == o.q && !memcmp(d.data(), o.d.data(), 4 * d.size()) && s == o.s;
    }
};
static void round_kernel(const float *x, hk_act a) {
    const int64_t r = blockIdx.x, blk = threadIdx.x / 32;
    float v[8];
    for (int i = 0; i < 8; i++) v[i] = x[r * a.K + blk * 256 + 8 * (threadIdx.x & 31) + i];
    round_into(a, r, blk, v);
}
static void make_act(abuf &b, const std::vector<float> &x, int64_t n, int64_t K) {
    b.init(n, K);
    emu::launch(round_kernel, dim3((unsigned)n), dim3((unsigned)(32 * K / 256)), 0, x.data(), b.a);
}
static std::vector<float> randv(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto &x : v) x = rndf(lo, hi);
    return v;
}
/* equal bits, and every value finite (so two sides that both failed to write, NaN, or
 * both overflowed cannot pass as equal) */
static bool same(const std::vector<float> &a, const std::vector<float> &b) {
    for (float v : b)
        if (!isfinite(v)) return false;
    return a.size() == b.size() && !memcmp(a.data(), b.data(), 4 * a.size());
}
static int nonzero(const std::vector<unsigned> &t) {
    int k = 0;
    for (unsigned v : t) k += v != 0;
    return k;
}

/* a fused form's verdict: its outputs equal the separate launches' and its tickets are back
 * at zero; or, its tail primed to fire early (plant), its outputs differ */
#define VERDICT(plant, eq, tk, fmt, ...)                                                              \
    do {                                                                                              \
        if (!(plant)) {                                                                               \
            CHECK_MSG(eq, fmt ": the fused form differs from the separate launches", __VA_ARGS__);    \
            CHECK_MSG(nonzero(tk) == 0, fmt ": %d tickets left", __VA_ARGS__, nonzero(tk));           \
        } else {                                                                                      \
            CHECK_MSG(!(eq), fmt ": its tail primed to fire early went unseen", __VA_ARGS__);         \
        }                                                                                             \
    } while (0)

static const hk_w W0 = {};
static const gv_sw SW0 = {nullptr, nullptr, 0};

/* Four weights of two types over the same rows in one launch (EX segments, each into its own
 * output and stride) against each alone (the plain kernel), 1 and 3 rows */
TEST(segments_match_alone) {
    const int64_t K = 1024, Ms[4] = {96, 64, 32, 32};
    for (int64_t n : {1, 3}) {
        std::vector<float> x = randv((size_t)(n * K), -2.0f, 2.0f);
        abuf a;
        make_act(a, x, n, K);
        for (uint32_t t : {(uint32_t)QT_Q4_K, (uint32_t)QT_Q6_K}) {
            wbuf w[4];
            for (int i = 0; i < 4; i++) make_w(w[i], t, K, Ms[i]);
            std::vector<float> ya[4], yb[4];
            for (int i = 0; i < 4; i++) ya[i].assign((size_t)(n * Ms[i]), NAN), yb[i].assign((size_t)(n * Ms[i]), NAN);
            gv_more mo = {w[2].w, w[3].w, ya[2].data(), ya[3].data(), Ms[1], Ms[2], Ms[3]};
            const hk_tail tn = {};
            const unsigned g = (unsigned)((Ms[0] + Ms[1] + Ms[2] + Ms[3] + 3) / 4);
            for (int i = 0; i < 4; i++) {
                gv_more m1 = {};
                m1.ys2 = Ms[i];
                const unsigned gi = (unsigned)((Ms[i] + 3) / 4);
                if (t == QT_Q4_K && n == 1)
                    emu::launch(gemv_kernel<QT_Q4_K, 1, 1, 32, false, false>, dim3(gi), dim3(128), 0, w[i].w, W0, a.a, n,
                                (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, yb[i].data(), Ms[i], false, W0, W0,
                                (float *)nullptr, SW0, m1, tn);
                else if (t == QT_Q4_K)
                    emu::launch(gemv_kernel<QT_Q4_K, 4, 4, 32, false, false>, dim3(gi), dim3(128), 0, w[i].w, W0, a.a, n,
                                (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, yb[i].data(), Ms[i], false, W0, W0,
                                (float *)nullptr, SW0, m1, tn);
                else if (n == 1)
                    emu::launch(gemv_kernel<QT_Q6_K, 1, 1, 32, false, false>, dim3(gi), dim3(128), 0, w[i].w, W0, a.a, n,
                                (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, yb[i].data(), Ms[i], false, W0, W0,
                                (float *)nullptr, SW0, m1, tn);
                else
                    emu::launch(gemv_kernel<QT_Q6_K, 4, 4, 32, false, false>, dim3(gi), dim3(128), 0, w[i].w, W0, a.a, n,
                                (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, yb[i].data(), Ms[i], false, W0, W0,
                                (float *)nullptr, SW0, m1, tn);
            }
#define SEG(TT, NR, IT)                                                                                                   \
    emu::launch(gemv_kernel<TT, NR, IT, 32, false, true>, dim3(g), dim3(128), 0, w[0].w, W0, a.a, n, (const int32_t *)nullptr, \
                (int64_t)0, 1, (int64_t)0, ya[0].data(), Ms[0], false, w[1].w, W0, ya[1].data(), SW0, mo, tn)
            if (t == QT_Q4_K) n == 1 ? SEG(QT_Q4_K, 1, 1) : SEG(QT_Q4_K, 4, 4);
            else n == 1 ? SEG(QT_Q6_K, 1, 1) : SEG(QT_Q6_K, 4, 4);
#undef SEG
            for (int i = 0; i < 4; i++)
                CHECK_MSG(same(ya[i], yb[i]), "%s rows=%lld: weight %d's outputs differ in the four-weight launch",
                          t == QT_Q4_K ? "Q4_K" : "Q6_K", (long long)n, i);
        }
    }
    printf("  four weights (Q4_K, Q6_K) in one launch: each one's bits alone, 1 and 3 rows\n");
}

/* The output product added to x with the norm as its tail, against the product then
 * rmsnorm_kernel: x, h and the rounded rows; the tickets end at zero. Planted: the ticket
 * primed so the tail fires three blocks early: h must differ. */
TEST(norm_tail_matches_apart) {
    const int64_t K = 1024, E = 512;
    wbuf w;
    make_w(w, QT_Q4_K, K, E);
    std::vector<float> nw = randv((size_t)E, 0.5f, 1.5f);
    for (int64_t n : {1, 3, 8}) {
        std::vector<float> xin = randv((size_t)(n * K), -1.0f, 1.0f), x0 = randv((size_t)(n * E), -3.0f, 3.0f);
        abuf a, ra, rb;
        make_act(a, xin, n, K);
        for (int plant = 0; plant < 2; plant++) {
            std::vector<float> xa = x0, xb = x0, ha((size_t)(n * E), NAN), hb((size_t)(n * E), NAN);
            std::vector<unsigned> tk(4, 0);
            ra.init(n, E), rb.init(n, E);
            const unsigned g = (unsigned)(E / 4);
            if (plant) tk[0] = 3; /* fires when g - 3 blocks are in */
            const hk_tail t = {HK_TAIL_NORM, 0, 0, tk.data(), n, E, 0, 0, xa.data(), ha.data(), nullptr, nw.data(), nullptr,
                               nullptr, nullptr, 1e-6f, ra.a, hk_act{}};
            const hk_tail none = {};
            gv_more m1 = {};
            m1.ys2 = E;
            if (n == 1) {
                emu::launch(gemv_kernel<QT_Q4_K, 1, 1, 32, false, true>, dim3(g), dim3(128), 0, w.w, W0, a.a, n,
                            (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, xa.data(), E, true, W0, W0, (float *)nullptr, SW0, m1, t);
                emu::launch(gemv_kernel<QT_Q4_K, 1, 1, 32, false, false>, dim3(g), dim3(128), 0, w.w, W0, a.a, n,
                            (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, xb.data(), E, true, W0, W0, (float *)nullptr, SW0, m1, none);
            } else if (n <= 4) {
                emu::launch(gemv_kernel<QT_Q4_K, 4, 4, 32, false, true>, dim3(g), dim3(128), 0, w.w, W0, a.a, n,
                            (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, xa.data(), E, true, W0, W0, (float *)nullptr, SW0, m1, t);
                emu::launch(gemv_kernel<QT_Q4_K, 4, 4, 32, false, false>, dim3(g), dim3(128), 0, w.w, W0, a.a, n,
                            (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, xb.data(), E, true, W0, W0, (float *)nullptr, SW0, m1, none);
            } else {
                emu::launch(gemv_kernel<QT_Q4_K, 8, 4, 32, false, true>, dim3(g), dim3(128), 0, w.w, W0, a.a, n,
                            (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, xa.data(), E, true, W0, W0, (float *)nullptr, SW0, m1, t);
                emu::launch(gemv_kernel<QT_Q4_K, 8, 4, 32, false, false>, dim3(g), dim3(128), 0, w.w, W0, a.a, n,
                            (const int32_t *)nullptr, (int64_t)0, 1, (int64_t)0, xb.data(), E, true, W0, W0, (float *)nullptr, SW0, m1, none);
            }
            emu::launch(rmsnorm_kernel<>, dim3((unsigned)n), dim3(256), 0, (const float *)xb.data(), (const int32_t *)nullptr,
                        (const float *)nw.data(), hb.data(), E, 1e-6f, rb.a, hk_act{});
            const bool eq = same(xa, xb) && same(ha, hb) && ra == rb;
            VERDICT(plant, eq, tk, "rows=%lld", (long long)n);
            /* the norm's row form (hk_rmsnorm's at these widths) = rmsnorm_kernel */
            std::vector<float> hc((size_t)(n * E), NAN);
            abuf rc;
            rc.init(n, E);
            emu::launch(rmsnorm_rows_kernel<>, dim3((unsigned)n), dim3((unsigned)(E / 8)), sizeof(float) * (size_t)E,
                        (const float *)xb.data(), (const int32_t *)nullptr, (const float *)nw.data(), hc.data(), E, 1e-6f,
                        rc.a, hk_act{});
            CHECK_MSG(same(hb, hc) && rb == rc, "rows=%lld: rmsnorm_rows_kernel differs from rmsnorm_kernel", (long long)n);
        }
    }
    printf("  output product + norm tail = the product then the norm (1, 3, 8 rows); an early tail is red;\n"
           "  rmsnorm_rows_kernel = rmsnorm_kernel\n");
}

/* The experts' down product, its SwiGLU rows made in the launch, with the combine (and the
 * next norm) as its tail, against the down product then combine_kernel: 16-lane rows of
 * two 256-blocks (experts of 512), 1 and 3 rows of 4 experts and the shared one. */
TEST(combine_tail_matches_apart) {
    const int64_t F = 512, E = 512, X = 6, K = 4;
    wbuf w, ws;
    make_w(w, QT_Q4_K, F, E, X), make_w(ws, QT_Q4_K, F, E);
    std::vector<float> nw = randv((size_t)E, 0.5f, 1.5f);
    for (int64_t n : {1, 3}) {
        const int64_t nr = n * K, np = nr + n;
        std::vector<float> g = randv((size_t)(np * F), -4.0f, 4.0f), u = randv((size_t)(np * F), -2.0f, 2.0f);
        std::vector<float> x0 = randv((size_t)(n * E), -3.0f, 3.0f), wsel = randv((size_t)nr, 0.0f, 0.3f);
        std::vector<float> gl = randv((size_t)n, -3.0f, 3.0f);
        std::vector<int32_t> sel((size_t)nr);
        for (auto &s : sel) s = (int32_t)(rnd() % X);
        const gv_sw sw = {g.data(), u.data(), F};
        const unsigned gx = (unsigned)(E / 8); /* 16-lane groups: 2 rows a warp, 8 a block */
        for (int with_norm = 0; with_norm < 2; with_norm++)
            for (int plant = 0; plant < 2; plant++) {
                std::vector<float> xa = x0, xb = x0, ha((size_t)(n * E), NAN), hb((size_t)(n * E), NAN);
                std::vector<float> eoa((size_t)(np * E), NAN), eob((size_t)(np * E), NAN);
                std::vector<unsigned> tk((size_t)gx + 1, 0);
                if (plant) tk[5] = 2; /* slice 5 combined before its last two pairs are in */
                abuf ra, rb;
                ra.init(n, E), rb.init(n, E);
                const hk_tail t = {HK_TAIL_COMBINE, 0, (int)K, tk.data(), n, E, 0, 1, xa.data(), ha.data(), wsel.data(),
                                   with_norm ? nw.data() : nullptr, gl.data(), eoa.data() + nr * E, nullptr, 1e-6f, ra.a, hk_act{}};
                const hk_tail none = {};
                gv_more m1 = {};
                m1.ys2 = E;
                const hk_act a0 = {nullptr, nullptr, nullptr, F, false};
                const size_t smem = sw_bytes(F);
                emu::launch(gemv_kernel<QT_Q4_K, 1, 1, 16, true, true>, dim3(gx, (unsigned)np), dim3(128), smem, w.w, ws.w, a0,
                            (int64_t)1, (const int32_t *)sel.data(), nr, 1, nr, eoa.data(), E, false, W0, W0, (float *)nullptr, sw,
                            m1, t);
                emu::launch(gemv_kernel<QT_Q4_K, 1, 1, 16, true, false>, dim3(gx, (unsigned)np), dim3(128), smem, w.w, ws.w, a0,
                            (int64_t)1, (const int32_t *)sel.data(), nr, 1, nr, eob.data(), E, false, W0, W0, (float *)nullptr, sw,
                            m1, none);
                emu::launch(combine_kernel<>, dim3((unsigned)n), dim3(512), 0, xb.data(), (const float *)gl.data(), (int64_t)1,
                            (const float *)eob.data(), (const float *)eob.data() + nr * E, (const float *)wsel.data(), E, (int)K,
                            (const float *)(with_norm ? nw.data() : nullptr), hb.data(), 1e-6f, rb.a, hk_act{});
                bool eq = same(eoa, eob) && same(xa, xb);
                if (with_norm) eq = eq && same(ha, hb) && ra == rb;
                VERDICT(plant, eq, tk, "rows=%lld%s", (long long)n, with_norm ? " (and the norm)" : "");
                /* the combine's row form (hk_moe_combine's at these widths) = combine_kernel */
                std::vector<float> xc = x0, hc((size_t)(n * E), NAN);
                abuf rc;
                rc.init(n, E);
                emu::launch(combine_rows_kernel<>, dim3((unsigned)n), dim3((unsigned)(E / 8)), sizeof(float) * (size_t)E,
                            xc.data(), (const float *)gl.data(), (int64_t)1, (const float *)eob.data(),
                            (const float *)eob.data() + nr * E, (const float *)wsel.data(), E, (int)K,
                            (const float *)(with_norm ? nw.data() : nullptr), hc.data(), 1e-6f, rc.a, hk_act{});
                bool eqc = same(xb, xc);
                if (with_norm) eqc = eqc && same(hb, hc) && rb == rc;
                CHECK_MSG(eqc, "rows=%lld%s: combine_rows_kernel differs from combine_kernel", (long long)n,
                          with_norm ? " (and the norm)" : "");
            }
    }
    printf("  down + combine (+ norm) tail = the down product then the combine (1, 3 rows); an early slice is red;\n"
           "  combine_rows_kernel = combine_kernel\n");
}

/* A product's route as its tail: each block writes 4 logits of every row, the last routes
 * (tail_run as fmm_kernel calls it), against route_kernel over the same logits */
static void logits_kernel(float *y, int64_t n, int64_t M, int64_t ls, uint32_t salt, hk_tail t) {
    const int64_t o = (int64_t)blockIdx.x * 4 + threadIdx.x / 32;
    if (o < M && (threadIdx.x & 31) == 0)
        for (int64_t r = 0; r < n; r++) {
            uint32_t h = (uint32_t)(o * 2654435761u) ^ (uint32_t)(r * 40503u) ^ salt;
            h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
            y[r * ls + o] = -4.0f + 8.0f * (float)(h >> 8) / 16777216.0f;
        }
    if (t.kind) tail_run<1u << HK_TAIL_ROUTE>(t, y, gridDim.x * gridDim.y, 0, 1, 1, 0, 0);
}
TEST(route_tail_matches_apart) {
    const int64_t X = 256, K = 8, ls = X + 1;
    for (int64_t n : {1, 3, 8})
        for (int plant = 0; plant < 2; plant++) {
            std::vector<float> y((size_t)(n * ls), NAN);
            std::vector<int32_t> sa((size_t)(n * K), -1), sb((size_t)(n * K), -2);
            std::vector<float> wa((size_t)(n * K), NAN), wb((size_t)(n * K), NAN);
            std::vector<unsigned> tk(2, 0);
            const unsigned g = (unsigned)((X + 1 + 3) / 4);
            if (plant) tk[0] = 4;
            const hk_tail t = {HK_TAIL_ROUTE, (int)X, (int)K, tk.data(), n, 0, ls, 0, nullptr, nullptr, wa.data(), nullptr,
                               nullptr, nullptr, sa.data(), 0.0f, hk_act{}, hk_act{}};
            emu::launch(logits_kernel, dim3(g), dim3(128), 0, y.data(), n, X + 1, ls, (uint32_t)(17 + n), t);
            std::vector<float> y2 = y;
            emu::launch(route_kernel<>, dim3((unsigned)((n + 3) / 4)), dim3(128), 0, (const float *)y2.data(), ls, n, (int)X,
                        (int)K, sb.data(), wb.data());
            const bool eq = sa == sb && same(wa, wb);
            VERDICT(plant, eq, tk, "rows=%lld", (long long)n);
        }
    printf("  route tail = route_kernel over the launch's logits (1, 3, 8 rows); an early route is red\n");
}

/* The delta rule's one-row pass (decode) with the gated norm as its tail, against the pass
 * then gated_norm_kernel: outputs, rounded rows, lanes; 4 value heads on 2 key heads, 1 and
 * 3 one-row pieces; both forms (the chunked state kernel, gdn_chunk.cuh; the row rule,
 * gdn_row.cuh), the fused launch's blocks in each order (emu::order: whichever block of a
 * head pair comes last makes its 256 values) */
TEST(gated_tail_matches_apart) {
    const int64_t Gk = 2, Gv = 4, S = 128, cd = 2 * Gk * S + Gv * S, Vd = Gv * S, lane = Gv * S * S;
    std::vector<float> nw = randv((size_t)S, 0.5f, 1.5f);
    static const char *const order_name[] = {"forward", "reverse", "shuffled"};
    for (int form = 0; form < 2; form++)
        for (int ord = 0; ord < 3; ord++)
            for (int64_t np : {1, 3})
                for (int plant = 0; plant < 2; plant++) {
                    const int64_t n = np;
                    std::vector<float> cv = randv((size_t)(n * cd), -0.1f, 0.1f), b = randv((size_t)(n * Gv), 0.1f, 0.9f);
                    std::vector<float> a = randv((size_t)(n * Gv), -0.5f, -0.01f), z = randv((size_t)(n * Vd), -2.0f, 2.0f);
                    std::vector<float> l0 = randv((size_t)(np * lane), -0.2f, 0.2f), la = l0, lb = l0;
                    std::vector<hk_piece> pcs((size_t)np);
                    std::vector<hk_chunk> chs((size_t)np);
                    std::vector<int32_t> pch((size_t)np + 1);
                    for (int64_t p = 0; p < np; p++) {
                        pcs[p] = hk_piece{p, 1, 5, (int32_t)p, 0, 0, 0};
                        chs[p] = hk_chunk{(int32_t)p, 0, 1, 0};
                        pch[p] = (int32_t)p;
                    }
                    pch[np] = (int32_t)np;
                    std::vector<float> oa((size_t)(n * Vd), NAN), ob((size_t)(n * Vd), NAN);
                    std::vector<unsigned> tk((size_t)(np * Gv / 2), 0);
                    if (plant) tk[0] = 1;
                    abuf ra, rb;
                    ra.init(n, Vd), rb.init(n, Vd);
                    const hk_gtail gt = {z.data(), nw.data(), 1e-6f, ra.a, tk.data()};
                    for (int side = 0; side < 2; side++) {
                        emu::order = side ? emu::FORWARD : (emu::block_order)ord; /* the fused launch in each order */
                        const dim3 g((unsigned)(Gv * 4), (unsigned)np);
                        float *l = side ? lb.data() : la.data(), *o = side ? ob.data() : oa.data();
                        if (form == 0)
                            emu::launch(gdn_chunk_state_kernel<1>, g, dim3(GC_THREADS), sizeof(float) * gc_state_smem_floats(1),
                                        (const float *)cv.data(), (const float *)b.data(), (const float *)a.data(), l, (size_t)lane,
                                        (const hk_piece *)pcs.data(), (const hk_chunk *)chs.data(), (const int32_t *)pch.data(),
                                        (const hk_mark *)nullptr, (float *)nullptr, (size_t)0, Gk, Gv, cd, (const float *)nullptr,
                                        (const float *)nullptr, (const float *)nullptr, (const float *)nullptr, hk_gconv{},
                                        side ? hk_gtail{} : gt, o);
                        else
                            emu::launch(delta_kernel, g, dim3(128), 0, (const float *)cv.data(), (const float *)b.data(),
                                        (const float *)a.data(), l, (size_t)lane, (const hk_piece *)pcs.data(), (const hk_mark *)nullptr,
                                        (float *)nullptr, (size_t)0, Gk, Gv, cd, side ? hk_gtail{} : gt, o);
                    }
                    emu::order = emu::FORWARD;
                    emu::launch(gated_norm_kernel<>, dim3((unsigned)n), dim3(256), 0, ob.data(), (const float *)z.data(),
                                (const float *)nw.data(), Vd, 1e-6f, rb.a);
                    const bool eq = same(oa, ob) && ra == rb && same(la, lb);
                    VERDICT(plant, eq, tk, "%s rule, blocks %s, %lld pieces", form ? "row" : "chunked", order_name[ord],
                            (long long)np);
                }
    printf("  delta rule + gated-norm tail = the pass then the gated norm (chunked and row forms, blocks forward, reversed,\n"
           "  shuffled; 1, 3 pieces); an early tail is red\n");
}

/* Decode's conv with its windows loaded at once (conv_norm_kernel's ring_too form at the
 * model's shape: heads of 128, 4 taps) against the prompt form (the loop, rings apart by
 * ring_kernel) on one-row pieces, two of them with a point (m = 1): conv outputs, gates,
 * rings and the points' rings, bit for bit. Planted: ring_reverse on the decode side only
 * must be red. */
TEST(conv_decode_matches_prompt_form) {
    const int64_t Gk = 2, Gv = 4, S = 128, cd = 2 * Gk * S + Gv * S, dc = 4, np = 3, n = np;
    const size_t rfl = (size_t)((dc - 1) * cd); /* a ring */
    std::vector<float> qkv = randv((size_t)(n * cd), -2.0f, 2.0f), w = randv((size_t)(cd * dc), -0.5f, 0.5f);
    std::vector<float> r0 = randv(rfl * np, -2.0f, 2.0f), b0 = randv((size_t)(n * Gv), -2.0f, 2.0f);
    std::vector<float> a0 = randv((size_t)(n * Gv), -2.0f, 2.0f), ssm_a = randv((size_t)Gv, -1.0f, -0.1f);
    std::vector<float> dt = randv((size_t)Gv, -0.5f, 0.5f);
    std::vector<hk_piece> pcs((size_t)np);
    std::vector<hk_mark> mks;
    std::vector<int32_t> row_piece((size_t)n);
    for (int64_t p = 0; p < np; p++) {
        const int nm = p == 1 ? 0 : 1;
        pcs[p] = hk_piece{p, 1, 9, (int32_t)p, (int32_t)mks.size(), nm, 0};
        if (nm) mks.push_back(hk_mark{1, (int32_t)mks.size(), (int32_t)p});
        row_piece[p] = (int32_t)p;
    }
    for (int plant = 0; plant < 2; plant++) {
        std::vector<float> ra = r0, rb = r0, ba = b0, bb = b0, aa = a0, ab = a0;
        std::vector<float> cva((size_t)(n * cd), NAN), cvb((size_t)(n * cd), NAN);
        std::vector<float> sa(rfl * mks.size(), NAN), sb(rfl * mks.size(), NAN);
        emu_mut = plant ? M_RING_REVERSE : 0;
        emu::launch(conv_norm_kernel, dim3((unsigned)((cd / S + 7) / 8), (unsigned)n), dim3(256), 0, (const float *)qkv.data(),
                    ra.data(), rfl, (const float *)w.data(), (const int32_t *)row_piece.data(), (const hk_piece *)pcs.data(),
                    (const hk_mark *)mks.data(), sa.data(), rfl, 2, cva.data(), ba.data(), aa.data(),
                    (const float *)ssm_a.data(), (const float *)dt.data(), S, Gk, Gv, cd, dc, 1e-6f);
        emu_mut = 0;
        emu::launch(conv_norm_kernel, dim3((unsigned)((cd / S + 7) / 8), (unsigned)n), dim3(256), 0, (const float *)qkv.data(),
                    rb.data(), rfl, (const float *)w.data(), (const int32_t *)row_piece.data(), (const hk_piece *)pcs.data(),
                    (const hk_mark *)mks.data(), sb.data(), rfl, 0, cvb.data(), bb.data(), ab.data(),
                    (const float *)ssm_a.data(), (const float *)dt.data(), S, Gk, Gv, cd, dc, 1e-6f);
        emu::launch(ring_kernel, dim3((unsigned)((cd + 255) / 256), (unsigned)np), dim3(256), 0, (const float *)qkv.data(),
                    rb.data(), rfl, (const hk_piece *)pcs.data(), (const hk_mark *)mks.data(), sb.data(), rfl, cd, dc);
        const bool eq = same(cva, cvb) && same(ba, bb) && same(aa, ab) && same(ra, rb) && same(sa, sb);
        if (!plant) CHECK_MSG(eq, "decode's conv differs from the prompt form and the rings' kernel");
        else CHECK_MSG(!eq, "ring_reverse planted in decode's conv went unseen");
    }
    printf("  decode's conv (windows at once) = the prompt form + the rings' kernel; ring_reverse planted is red\n");
}

/* A prompt's conv at the model's shape (conv_norm_kernel's CONV_PROMPT form, the windows
 * loaded at once, a q or k head stored once scaled) against the loop form (ring_too 0) on
 * pieces of 5 and 4 rows, their first rows' windows reaching into the rings: conv outputs
 * and gates bit for bit, the rings untouched. Planted: neighbour_leak (a piece's first rows
 * read the pass rows before it, not its ring) on the loaded-at-once side must be red. */
TEST(conv_prompt_matches_loop) {
    const int64_t Gk = 2, Gv = 4, S = 128, cd = 2 * Gk * S + Gv * S, dc = 4, np = 2, n = 9;
    const size_t rfl = (size_t)((dc - 1) * cd);
    std::vector<float> qkv = randv((size_t)(n * cd), -2.0f, 2.0f), w = randv((size_t)(cd * dc), -0.5f, 0.5f);
    std::vector<float> r0 = randv(rfl * np, -2.0f, 2.0f), b0 = randv((size_t)(n * Gv), -2.0f, 2.0f);
    std::vector<float> a0 = randv((size_t)(n * Gv), -2.0f, 2.0f), ssm_a = randv((size_t)Gv, -1.0f, -0.1f);
    std::vector<float> dt = randv((size_t)Gv, -0.5f, 0.5f);
    const std::vector<hk_piece> pcs = {hk_piece{0, 5, 9, 0, 0, 0, 0}, hk_piece{5, 4, 30, 1, 0, 0, 0}};
    std::vector<int32_t> row_piece((size_t)n);
    for (int64_t r = 0; r < n; r++) row_piece[r] = r < 5 ? 0 : 1;
    for (int plant = 0; plant < 2; plant++) {
        std::vector<float> ra = r0, rb = r0, ba = b0, bb = b0, aa = a0, ab = a0;
        std::vector<float> cva((size_t)(n * cd), NAN), cvb((size_t)(n * cd), NAN);
        emu_mut = plant ? M_NEIGHBOUR : 0;
        emu::launch(conv_norm_kernel, dim3((unsigned)((cd / S + 7) / 8), (unsigned)n), dim3(256), 0, (const float *)qkv.data(),
                    ra.data(), rfl, (const float *)w.data(), (const int32_t *)row_piece.data(), (const hk_piece *)pcs.data(),
                    (const hk_mark *)nullptr, (float *)nullptr, rfl, CONV_PROMPT, cva.data(), ba.data(), aa.data(),
                    (const float *)ssm_a.data(), (const float *)dt.data(), S, Gk, Gv, cd, dc, 1e-6f);
        emu_mut = 0;
        emu::launch(conv_norm_kernel, dim3((unsigned)((cd / S + 7) / 8), (unsigned)n), dim3(256), 0, (const float *)qkv.data(),
                    rb.data(), rfl, (const float *)w.data(), (const int32_t *)row_piece.data(), (const hk_piece *)pcs.data(),
                    (const hk_mark *)nullptr, (float *)nullptr, rfl, 0, cvb.data(), bb.data(), ab.data(),
                    (const float *)ssm_a.data(), (const float *)dt.data(), S, Gk, Gv, cd, dc, 1e-6f);
        const bool eq = same(cva, cvb) && same(ba, bb) && same(aa, ab) && same(ra, r0) && same(rb, r0);
        if (!plant) CHECK_MSG(eq, "the prompt's conv loaded at once differs from the loop form");
        else CHECK_MSG(!eq, "neighbour_leak planted in the prompt's conv went unseen");
    }
    printf("  a prompt's conv (windows at once) = the loop form (pieces of 5 and 4 rows); neighbour_leak planted is red\n");
}

/* Decode's conv inside the chunked delta rule's launch (hk_gconv: each block makes its q, k
 * and value columns from the input products' row and the rings; the rings written by their
 * readers, a key head's q and k rings by the last of its 8 blocks) against conv_norm_kernel
 * then the same launch reading its outputs: outputs, lanes, rings, and the points' lanes and
 * rings (pieces 0 and 2 with a point at m = 1). 4 value heads on 2 key heads, 3 one-row
 * pieces. Planted: a key head's ticket primed (its rings written before all its readers read
 * them) and ring_reverse on the fused side, each red. */
TEST(conv_in_delta_matches_apart) {
    const int64_t Gk = 2, Gv = 4, S = 128, cd = 2 * Gk * S + Gv * S, dc = 4, np = 3, n = np, Vd = Gv * S, lane = Gv * S * S;
    const size_t rfl = (size_t)((dc - 1) * cd);
    std::vector<float> qkv = randv((size_t)(n * cd), -2.0f, 2.0f), w = randv((size_t)(cd * dc), -0.5f, 0.5f);
    std::vector<float> r0 = randv(rfl * np, -2.0f, 2.0f), b0 = randv((size_t)(n * Gv), -2.0f, 2.0f);
    std::vector<float> a0 = randv((size_t)(n * Gv), -2.0f, 2.0f), ssm_a = randv((size_t)Gv, -1.0f, -0.1f);
    std::vector<float> dt = randv((size_t)Gv, -0.5f, 0.5f), l0 = randv((size_t)(np * lane), -0.2f, 0.2f);
    std::vector<hk_piece> pcs((size_t)np);
    std::vector<hk_chunk> chs((size_t)np);
    std::vector<int32_t> pch((size_t)np + 1), row_piece((size_t)n);
    std::vector<hk_mark> mks;
    for (int64_t p = 0; p < np; p++) {
        const int nm = p == 1 ? 0 : 1;
        pcs[p] = hk_piece{p, 1, 9, (int32_t)p, (int32_t)mks.size(), nm, 0};
        if (nm) mks.push_back(hk_mark{1, (int32_t)mks.size(), (int32_t)p});
        chs[p] = hk_chunk{(int32_t)p, 0, 1, 0};
        pch[p] = (int32_t)p, row_piece[p] = (int32_t)p;
    }
    pch[np] = (int32_t)np;
    const size_t nm = mks.size();
    for (int plant = 0; plant < 3; plant++) {
        std::vector<float> ra = r0, rb = r0, la = l0, lb = l0, bb = b0, ab = a0, cvb((size_t)(n * cd), NAN);
        std::vector<float> oa((size_t)(n * Vd), NAN), ob((size_t)(n * Vd), NAN);
        std::vector<float> sra(rfl * nm, NAN), srb(rfl * nm, NAN), sla((size_t)lane * nm, NAN), slb((size_t)lane * nm, NAN);
        std::vector<unsigned> tk((size_t)(np * Gk), 0);
        if (plant == 1) tk[1] = 1; /* piece 0, key head 1: its rings written by its 7th reader */
        emu_mut = plant == 2 ? M_RING_REVERSE : 0;
        const hk_gconv gv = {qkv.data(), w.data(), ssm_a.data(), dt.data(), b0.data(), a0.data(), ra.data(), sra.data(), rfl,
                             rfl, 1e-6f, tk.data()};
        const dim3 gs((unsigned)(Gv * 4), (unsigned)np);
        emu::launch(gdn_chunk_state_kernel<1>, gs, dim3(GC_THREADS), sizeof(float) * gc_state_smem_floats(1), (const float *)nullptr,
                    (const float *)nullptr, (const float *)nullptr, la.data(), (size_t)lane, (const hk_piece *)pcs.data(),
                    (const hk_chunk *)chs.data(), (const int32_t *)pch.data(), (const hk_mark *)mks.data(), sla.data(), (size_t)lane,
                    Gk, Gv, cd, (const float *)nullptr, (const float *)nullptr, (const float *)nullptr, (const float *)nullptr,
                    gv, hk_gtail{}, oa.data());
        emu_mut = 0;
        emu::launch(conv_norm_kernel, dim3((unsigned)((cd / S + 7) / 8), (unsigned)n), dim3(256), 0, (const float *)qkv.data(),
                    rb.data(), rfl, (const float *)w.data(), (const int32_t *)row_piece.data(), (const hk_piece *)pcs.data(),
                    (const hk_mark *)mks.data(), srb.data(), rfl, 1, cvb.data(), bb.data(), ab.data(), (const float *)ssm_a.data(),
                    (const float *)dt.data(), S, Gk, Gv, cd, dc, 1e-6f);
        emu::launch(gdn_chunk_state_kernel<1>, gs, dim3(GC_THREADS), sizeof(float) * gc_state_smem_floats(1), (const float *)cvb.data(),
                    (const float *)bb.data(), (const float *)ab.data(), lb.data(), (size_t)lane, (const hk_piece *)pcs.data(),
                    (const hk_chunk *)chs.data(), (const int32_t *)pch.data(), (const hk_mark *)mks.data(), slb.data(), (size_t)lane,
                    Gk, Gv, cd, (const float *)nullptr, (const float *)nullptr, (const float *)nullptr, (const float *)nullptr,
                    hk_gconv{}, hk_gtail{}, ob.data());
        const bool eq = same(oa, ob) && same(la, lb) && same(ra, rb) && same(sra, srb) && same(sla, slb);
        if (plant == 0) {
            CHECK_MSG(eq, "the conv in the delta rule's launch differs from conv_norm_kernel then the launch");
            CHECK_MSG(nonzero(tk) == 0, "%d tickets left", nonzero(tk));
        } else {
            CHECK_MSG(!eq, "%s went unseen", plant == 1 ? "a key head's rings written before its last reader" : "ring_reverse");
        }
    }
    printf("  conv in the delta rule's launch = conv_norm_kernel then the launch (3 pieces, 2 points); an early ring and ring_reverse red\n");
}

/* The attention's merge with the rounding for the out product in its launch (heads of 256:
 * a head's own Q8_K block) against the merge then quantize_kernel: 16 heads, 2 rows, 2 and 3
 * segments. Planted: the rounded block of a head taken from its neighbour's values is red. */
TEST(merge_round_matches_apart) {
    const int64_t H = 16, D = 256, n = 2, seg = 64, n_seg = 3;
    std::vector<float> qf = randv((size_t)(n * 2 * H * D), -2.0f, 2.0f);
    std::vector<float> part = randv((size_t)(n * H * n_seg * PART(D)), -1.0f, 1.0f);
    for (size_t i = 0; i < part.size(); i += PART(D)) part[i + D + 1] = rndf(0.5f, 2.0f); /* positive sums */
    const int64_t pos[2] = {100, 150}; /* 2 and 3 segments */
    std::vector<float> aoa((size_t)(n * H * D), NAN), aob((size_t)(n * H * D), NAN);
    abuf ra, rb;
    ra.init(n, H * D), rb.init(n, H * D);
    emu::launch(attn_merge_kernel, dim3((unsigned)H, (unsigned)n), dim3((unsigned)D), 0, (const float *)qf.data(), pos, H, D, seg,
                n_seg, (const float *)part.data(), aoa.data(), ra.a);
    emu::launch(attn_merge_kernel, dim3((unsigned)H, (unsigned)n), dim3((unsigned)D), 0, (const float *)qf.data(), pos, H, D, seg,
                n_seg, (const float *)part.data(), aob.data(), hk_act{});
    emu::launch(quantize_kernel<>, dim3((unsigned)n, (unsigned)((H * D / 256 + 7) / 8)), dim3(256), 0, (const float *)aob.data(),
                H * D, rb.a);
    CHECK_MSG(same(aoa, aob) && ra == rb, "the merge's rounding differs from the merge then quantize_kernel");
    /* planted: head 3's block rounded from head 4's values */
    abuf rc;
    rc.init(n, H * D);
    std::vector<float> shifted = aob;
    for (int64_t r = 0; r < n; r++) memcpy(&shifted[(size_t)(r * H * D + 3 * D)], &aob[(size_t)(r * H * D + 4 * D)], 4 * D);
    emu::launch(quantize_kernel<>, dim3((unsigned)n, (unsigned)((H * D / 256 + 7) / 8)), dim3(256), 0, (const float *)shifted.data(),
                H * D, rc.a);
    CHECK_MSG(!(ra == rc), "a head's block rounded from its neighbour's values went unseen");
    printf("  the merge's rounding = the merge then quantize_kernel (16 heads of 256, 2 rows); a shifted head red\n");
}

int main(void) {
    RUN(segments_match_alone);
    RUN(norm_tail_matches_apart);
    RUN(combine_tail_matches_apart);
    RUN(route_tail_matches_apart);
    RUN(gated_tail_matches_apart);
    RUN(conv_decode_matches_prompt_form);
    RUN(conv_prompt_matches_loop);
    RUN(conv_in_delta_matches_apart);
    RUN(merge_round_matches_apart);
    return harness_done();
}
