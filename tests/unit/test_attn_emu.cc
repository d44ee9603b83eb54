/* test_attn_emu.cc: the tensor-core attention (src/engine/cuda/attn_mma.cuh) run on the CPU
 * under tests/unit/cuda_emu.h, which emulates mma.sync, ldmatrix and cp.async: the prompt
 * kernel's tiles against a double reference within the bound derived beside it; the decode
 * form (one-row tiles: a CTA a segment, then attn_fold_kernel), other cuts of the same rows
 * into tiles, the whole form and its split form (a CTA per tile and segment, then
 * attn_fold_rows_kernel), the wgmma form with its cp.async fetch and with the copy engine's
 * (TMA boxes and mbarriers) against the tiles, bit for bit; eight planted defects red. The
 * emulated tensor core rounds its own way (cuda_emu.h), so the bits carry over only as a
 * structure: test_cuda.c's attn_matches_ref repeats the equalities on a GPU. Shapes: the
 * model's 16 query heads on 2 KV heads, heads of 128 and 256, segments of 64 keys (four
 * blocks), 24 rows across a segment's end and 5 rows at depth across another; the cache past
 * the last row NaN (a block's rows past its keys must be zeroed, not read). */
#include "cuda_emu.h"

extern "C" {
#include "harness.h"
#include "engine/cuda/kernels.h"
}

#include <vector>

static unsigned emu_mut;
#define AMUT(bit) (emu_mut & (bit))
#include "engine/cuda/attn_mma.cuh"
#include "engine/cuda/attn_wg.cuh"

#define EMU_SEED 91
#include "emu_rand.h"

struct case_t {
    int64_t H = 16, Hkv = 2, D, n_ctx, n, p0, seg = 64, n_seg;
    std::vector<uint16_t> k, v;   /* (n_ctx, Hkv, D) f16 */
    std::vector<float> qf;        /* (n, H, [q D | gate D]) */
    std::vector<float> part;      /* (n, H, n_seg, PART(D)): NaN before every run, so a partial not written shows */
    std::vector<int64_t> pos;     /* (n): p0 + r */
    int whole = 0;      /* the prompt kernel's whole form in tiles of this many warps (4, 6), (8) two warpgroups on
                         * wgmma (attn_wg.cuh; 9: its blocks fetched by the copy engine, TMA), else (0) its pairs */
    bool split = false; /* the multi-row tiles through the split form (attn.cu's HEARTH_CUDA_ATTN_SPLIT) */
    /* n rows at positions p0.. of one sequence, over a cache of n_ctx keys */
    explicit case_t(int64_t d, int64_t rows = 24, int64_t first = 110, int64_t ctx = 160)
        : D(d), n_ctx(ctx), n(rows), p0(first), n_seg((n_ctx + seg - 1) / seg) {
        for (int64_t r = 0; r < n; r++) pos.push_back(p0 + r);
        k.resize((size_t)(n_ctx * Hkv * D)), v.resize(k.size());
        for (auto &x : k) x = __half_as_ushort(__float2half_rn(rndf(-1.0f, 1.0f)));
        for (auto &x : v) x = __half_as_ushort(__float2half_rn(rndf(-1.0f, 1.0f)));
        /* the cache past the pass's last row holds no key of it (a stale or unwritten row on a
         * GPU): NaN there, so a kernel that reads it into a block instead of zeroing the rows
         * past the block's keys gives 0 x NaN */
        for (size_t i = (size_t)((p0 + n) * Hkv * D); i < k.size(); i++) k[i] = v[i] = 0x7E00;
        qf.resize((size_t)(n * 2 * H * D));
        for (auto &x : qf) x = rndf(-0.3f, 0.3f);
        part.assign((size_t)(n * H * n_seg * PART(D)), NAN);
    }
    /* tiles: rows 0..ones-1 one row each, then tiles of the prompt kernel's rows from there */
    std::vector<hk_qtile> tiles(int64_t ones) const {
        const int64_t qt = (whole >= 8 ? WG_QV : whole ? 16 * whole : AM_QV) / (H / Hkv);
        std::vector<hk_qtile> t;
        for (int64_t r = 0; r < ones; r++) t.push_back(hk_qtile{(int32_t)r, 1, 0, 0, p0 + r});
        for (int64_t r = ones; r < n; r += qt) t.push_back(hk_qtile{(int32_t)r, (int32_t)(n - r < qt ? n - r : qt), 0, 0, p0 + r});
        return t;
    }
    /* hk_attn's launches of the tensor-core form (attn.cu's mma_launch) */
    template <int DD> std::vector<float> run(const std::vector<hk_qtile> &t) {
        int n_one = 0;
        for (const auto &x : t) n_one += x.n == 1;
        std::vector<float> ao((size_t)(n * H * D), NAN);
        const int nt = (int)t.size();
        const size_t stride = (size_t)(n_ctx * Hkv * D);
        part.assign(part.size(), NAN);
        if (split && n_one < nt) { /* the split form: every row's partials, then one fold over the rows */
            const dim3 g((unsigned)nt, (unsigned)Hkv, (unsigned)n_seg);
            if (n_one > 0)
                emu::launch(attn_mma_split_kernel<DD>, g, dim3(AM_T), am_cfg<DD>::DECODE_BYTES, (const float *)qf.data(), t.data(),
                            H, Hkv, (const uint16_t *)k.data(), (const uint16_t *)v.data(), stride, seg, n_seg, part.data());
            if (whole == 6)
                emu::launch(attn_mma_whole_split_kernel<DD, 6>, g, dim3(192), am_cfg<DD>::whole_split_bytes(6), (const float *)qf.data(),
                            t.data(), nt, H, Hkv, (const uint16_t *)k.data(), (const uint16_t *)v.data(), stride, seg, n_seg,
                            part.data());
            else /* 4 warps, or the pairs' tiles of 64 vectors */
                emu::launch(attn_mma_whole_split_kernel<DD, 4>, g, dim3(128), am_cfg<DD>::whole_split_bytes(4), (const float *)qf.data(),
                            t.data(), nt, H, Hkv, (const uint16_t *)k.data(), (const uint16_t *)v.data(), stride, seg, n_seg,
                            part.data());
            emu::launch(attn_fold_rows_kernel, dim3((unsigned)H, (unsigned)n), dim3((unsigned)D), 0, (const float *)qf.data(),
                        (const int64_t *)pos.data(), H, D, seg, n_seg, (const float *)part.data(), ao.data(), hk_act{});
            return ao;
        }
        if (n_one > 0) {
            emu::launch(attn_mma_split_kernel<DD>, dim3((unsigned)nt, (unsigned)Hkv, (unsigned)n_seg), dim3(AM_T),
                        am_cfg<DD>::DECODE_BYTES, qf.data(), t.data(), H, Hkv, (const uint16_t *)k.data(),
                        (const uint16_t *)v.data(), stride, seg, n_seg, part.data());
            emu::launch(attn_fold_kernel, dim3((unsigned)H, (unsigned)nt), dim3((unsigned)D), 0, (const float *)qf.data(),
                        t.data(), H, D, seg, n_seg, (const float *)part.data(), ao.data(), hk_act{});
        }
        /* the TMA form's views of the cache: Hkv D halves x n_ctx rows (one sequence) */
        const wg_map km = {k.data(), Hkv * D, n_ctx}, vm = {v.data(), Hkv * D, n_ctx};
        if (n_one < nt && whole == 8)
            emu::launch(attn_wg_kernel<DD, false>, dim3((unsigned)nt, (unsigned)Hkv), dim3(WG_T), wg_cfg<DD>::BYTES,
                        (const float *)qf.data(), t.data(), nt, H, Hkv, (const uint16_t *)k.data(), (const uint16_t *)v.data(), stride,
                        seg, ao.data(), km, vm, false);
        else if (n_one < nt && whole >= 9) /* 10: the boxes asked for by a lane of each warp */
            emu::launch(attn_wg_kernel<DD, true>, dim3((unsigned)nt, (unsigned)Hkv), dim3(WG_T), wg_cfg<DD>::BYTES,
                        (const float *)qf.data(), t.data(), nt, H, Hkv, (const uint16_t *)k.data(), (const uint16_t *)v.data(), stride,
                        seg, ao.data(), km, vm, whole == 10);
        else if (n_one < nt && whole == 4)
            emu::launch(attn_mma_whole_kernel<DD, 4>, dim3((unsigned)nt, (unsigned)Hkv), dim3(128), am_cfg<DD>::whole_bytes(4),
                        (const float *)qf.data(), t.data(), nt, H, Hkv, (const uint16_t *)k.data(), (const uint16_t *)v.data(),
                        stride, seg, ao.data());
        else if (n_one < nt && whole == 6)
            emu::launch(attn_mma_whole_kernel<DD, 6>, dim3((unsigned)nt, (unsigned)Hkv), dim3(192), am_cfg<DD>::whole_bytes(6),
                        (const float *)qf.data(), t.data(), nt, H, Hkv, (const uint16_t *)k.data(), (const uint16_t *)v.data(),
                        stride, seg, ao.data());
        else if (n_one < nt)
            emu::launch(attn_mma_tile_kernel<DD>, dim3((unsigned)nt, (unsigned)Hkv), dim3(AM_TP), am_cfg<DD>::PROMPT_BYTES,
                        (const float *)qf.data(), t.data(), nt, H, Hkv, (const uint16_t *)k.data(), (const uint16_t *)v.data(),
                        stride, seg, ao.data());
        return ao;
    }
    /* the largest error over every (row, head, dim) in units of its bound (> 1: outside) */
    double worst(const std::vector<float> &ao) const {
        const double uu = ldexp(1.0, -24), u16 = ldexp(1.0, -11), t = 2 * uu, G = (double)(H / Hkv);
        double w = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t h = 0; h < H; h++) {
                const float *q = &qf[(size_t)(r * 2 * H * D + h * 2 * D)];
                const int64_t kh = (int64_t)(h / G), nk = p0 + r + 1;
                std::vector<double> s((size_t)nk);
                double mx = -1e300, sum = 0, smax = 0, vmax = 0;
                for (int64_t j = 0; j < nk; j++) {
                    double d = 0, mag = 0;
                    for (int64_t i = 0; i < D; i++) {
                        const double kk = __half2float(__ushort_as_half(k[(size_t)((j * Hkv + kh) * D + i)]));
                        d += (double)q[i] * kk, mag += fabs((double)q[i] * kk);
                        vmax = fmax(vmax, fabs((double)__half2float(__ushort_as_half(v[(size_t)((j * Hkv + kh) * D + i)]))));
                    }
                    s[(size_t)j] = d / sqrt((double)D), smax = fmax(smax, mag / sqrt((double)D)), mx = fmax(mx, s[(size_t)j]);
                }
                /* test_cuda.c's f16 bound: q rounded to f16 (u16 a product), the D products'
                 * sum (2 uu a step: the tensor core's rounding is not documented) and the scale
                 * (log2(e) / sqrt(D), two roundings: 2 uu) move a score by ds, the weights by
                 * twice that; p rounded to f16 moves
                 * them by 2 u16 / (1 - u16) in all; the P V sums over nk keys and the folds
                 * add (nk + 8) steps of 2 uu */
                const double gD = D * t / (1 - D * t), gN = (nk + 8) * t / (1 - (nk + 8) * t);
                const double ds = (u16 + gD + 2 * uu) * smax, bound = (2 * ds + gN + 2 * u16 / (1 - u16)) * vmax;
                for (int64_t j = 0; j < nk; j++) sum += (s[(size_t)j] = exp(s[(size_t)j] - mx));
                for (int64_t i = 0; i < D; i++) {
                    double o = 0;
                    for (int64_t j = 0; j < nk; j++)
                        o += s[(size_t)j] / sum * __half2float(__ushort_as_half(v[(size_t)((j * Hkv + kh) * D + i)]));
                    o *= 1.0 / (1.0 + exp(-(double)q[D + i]));
                    const double err = fabs(ao[(size_t)(r * H * D + h * D + i)] - o);
                    w = fmax(w, err != err ? 1e300 : err / bound);
                }
            }
        return w;
    }
};

static bool same(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && !memcmp(a.data(), b.data(), 4 * a.size());
}

/* the split form's outputs on tiles(0) and tiles(3) (3 one-row tiles beside it) in each of
 * the prompt kernel's tilings (pairs, 4 and 6 warps) */
/* the split form in the default tiling (6 warps), whole and cut beside 3 one-row tiles (its
 * tiles are the whole form's, and its bits follow positions alone, as the other tilings'
 * checks above show for the whole form; kept to two runs for CI's time) */
template <int D> static void split_runs(case_t &c, std::vector<float> out[2]) {
    c.split = true, c.whole = 6;
    out[0] = c.run<D>(c.tiles(0)), out[1] = c.run<D>(c.tiles(3));
    c.split = false, c.whole = 0;
}

/* the tiles within their bound; the decode form, a shifted cut (3 one-row tiles beside
 * tiles from row 3), the prompt kernel's whole form and its split form give the tiles' bits */
template <int D> static void forms_agree(case_t &c, const char *what) {
    const std::vector<float> tiled = c.run<D>(c.tiles(0)), decoded = c.run<D>(c.tiles(c.n)), cut = c.run<D>(c.tiles(3));
    c.whole = 4;
    const std::vector<float> whole = c.run<D>(c.tiles(0)), whole_cut = c.run<D>(c.tiles(3));
    c.whole = 6;
    const std::vector<float> whole6 = c.run<D>(c.tiles(0)), whole6_cut = c.run<D>(c.tiles(3));
    c.whole = 8;
    const std::vector<float> wg = c.run<D>(c.tiles(0));
    emu::threads_reversed = true; /* the second warpgroup's threads run ahead: the folds' barriers keep their order */
    const std::vector<float> wg_cut = c.run<D>(c.tiles(3));
    emu::threads_reversed = false;
    c.whole = 9; /* the TMA form: the later threads first in the cut too (a wait before its copies' ask aborts) */
    const std::vector<float> tma = c.run<D>(c.tiles(0));
    emu::threads_reversed = true;
    const std::vector<float> tma_cut = c.run<D>(c.tiles(3));
    c.whole = 10; /* its boxes asked for by a lane of each warp, some before the bytes are counted */
    const std::vector<float> tma_spread = c.run<D>(c.tiles(3));
    emu::threads_reversed = false;
    c.whole = 0;
    std::vector<float> split[2];
    split_runs<D>(c, split);
    const double w = c.worst(tiled);
    CHECK_MSG(w <= 1.0, "%s: the tiles %.3g times their bound from the double reference", what, w);
    CHECK_MSG(same(decoded, tiled), "%s: rows decoded alone differ from the rows in tiles", what);
    CHECK_MSG(same(cut, tiled), "%s: the rows cut into other tiles differ", what);
    CHECK_MSG(same(whole, tiled), "%s: the whole form's tiles differ from the pairs'", what);
    CHECK_MSG(same(whole_cut, tiled), "%s: the whole form's other cut differs", what);
    CHECK_MSG(same(whole6, tiled), "%s: the whole form's tiles of 6 warps (two stages) differ from the pairs'", what);
    CHECK_MSG(same(whole6_cut, tiled), "%s: the whole form's tiles of 6 warps cut otherwise differ", what);
    CHECK_MSG(same(wg, tiled), "%s: the wgmma form's tiles differ from the pairs'", what);
    CHECK_MSG(same(wg_cut, tiled), "%s: the wgmma form's tiles cut otherwise (its later threads run first) differ", what);
    CHECK_MSG(same(tma, tiled), "%s: the wgmma form's tiles with the copy engine's fetch differ from the pairs'", what);
    CHECK_MSG(same(tma_cut, tiled), "%s: the wgmma form's TMA tiles cut otherwise (its later threads run first) differ", what);
    CHECK_MSG(same(tma_spread, tiled), "%s: the wgmma form's TMA tiles, boxes asked by each warp, differ", what);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(same(split[i], tiled), "%s: the split form in tiles of 6 warps%s differs from the tiles", what,
                  i ? " (cut beside 3 one-row tiles)" : "");
    printf("  %s: %.3f of the bound; decoded alone, cut otherwise, the whole form (4 and 6 warps), the wgmma form (its "
           "cp.async and TMA fetches) and the split form (2 cuts each) = the tiles, bit for bit\n", what, w);
}

TEST(heads_128) {
    case_t c(128);
    forms_agree<128>(c, "heads of 128, 24 rows at 110..133");
}
TEST(heads_256) {
    case_t c(256);
    forms_agree<256>(c, "heads of 256, 24 rows at 110..133");
}
/* a short pass at depth (the split form's case): 5 rows at 318..322 over 6 segments of 64
 * keys, the rows across the end of the fifth; one tile in every tiling */
TEST(few_rows_at_depth) {
    case_t a(128, 5, 318, 384);
    forms_agree<128>(a, "heads of 128, 5 rows at 318..322");
    case_t b(256, 5, 318, 384);
    forms_agree<256>(b, "heads of 256, 5 rows at 318..322");
}

/* each planted defect turns a check above red, run where it lives (CI's time: ~30 emulated
 * launches, not every form under every defect): 1 and 2 in each prompt form (pairs, 4 and 6
 * warps; 1 in the split form too, 2 cannot happen there: a split CTA walks one segment), 4 in
 * the decode form, 8 and 16 (the split form's own) in the split form */
TEST(planted_defects_red) {
    const char *fname[9] = {"pairs", "", "", "", "whole, 4 warps", "", "whole, 6 warps", "", "wgmma"};
    for (unsigned bit = 1; bit <= 16; bit <<= 1) {
        const char *name = bit == 1 ? "a tile's rows see its last row's keys" : bit == 2 ? "segments not restarted" :
                           bit == 4 ? "decode warps on one quarter of the dims" :
                           bit == 8 ? "the split form's fold takes the segments last first" : "the split form's last segment of a tile unwritten";
        for (int form = 0; form <= 8; form += form ? 2 : 4) {
            /* 2 in the wgmma form: a segment's first P V adds to the last one's o (its restart is
             * the scale-d of that P V, wg_pv's acc, o neither zeroed nor rescaled at the fold) */
            const bool prompt = bit == 1 || bit == 2, decode = bit == 4 && form == 0,
                       split = (bit == 1 || bit >= 8) && form == 6;
            if (!prompt && !decode && !split) continue;
            case_t c(128);
            c.whole = form;
            const std::vector<float> good = c.run<128>(c.tiles(0));
            CHECK_MSG(c.worst(good) <= 1.0, "the unplanted run of the %s form is out of its bound", fname[form]);
            emu_mut = bit;
            if (prompt || decode) {
                const std::vector<float> tiled = c.run<128>(c.tiles(0)), decoded = c.run<128>(c.tiles(c.n));
                const bool red = !same(decoded, tiled) || !same(tiled, good) || c.worst(tiled) > 1.0 || c.worst(decoded) > 1.0;
                CHECK_MSG(red, "planted defect '%s' passed every check of the %s form", name, fname[form]);
                printf("  planted '%s' (%s form): red\n", name, decode ? "decode" : fname[form]);
            }
            if (split || (bit == 2 && form == 6)) {
                c.split = true;
                const std::vector<float> sp = c.run<128>(c.tiles(0)), sp_cut = c.run<128>(c.tiles(3));
                c.split = false;
                if (bit == 2) {
                    CHECK_MSG(same(sp, good) && same(sp_cut, good), "planted '%s' moved the split form", name);
                    printf("  planted '%s' (split form): does not apply, its bits unmoved\n", name);
                } else {
                    const bool red = !same(sp, good) || !same(sp_cut, good) || c.worst(sp) > 1.0;
                    CHECK_MSG(red, "planted defect '%s' passed every check of the split form", name);
                    printf("  planted '%s' (split form): red%s%s%s\n", name, !same(sp, good) ? " [split != tiles]" : "",
                           !same(sp_cut, good) ? " [split cut != tiles]" : "", c.worst(sp) > 1.0 ? " [split out of bound]" : "");
                }
            }
            emu_mut = 0;
        }
    }
}

/* 32: the wgmma form's warpgroups fold without waiting for each other: which segment folds
 * first then depends on the schedule. Six segments (5 rows at 318..322, segments of 64), run
 * with the threads in index order and with the later threads first (as a GPU may schedule
 * them): the folds out of order in at least one, red (forms_agree runs the form itself with
 * the later threads first and finds the tiles' bits) */
TEST(planted_fold_order_red) {
    case_t c(128, 5, 318, 384);
    c.whole = 8;
    const std::vector<float> good = c.run<128>(c.tiles(0));
    emu_mut = 32;
    const std::vector<float> in_order = c.run<128>(c.tiles(0));
    emu::threads_reversed = true;
    const std::vector<float> reversed = c.run<128>(c.tiles(0));
    emu::threads_reversed = false;
    emu_mut = 0;
    CHECK_MSG(!same(in_order, good) || !same(reversed, good), "planted defect 'the wgmma form's folds unordered' passed");
    printf("  planted 'the wgmma form's warpgroups fold without waiting' (wgmma form): red%s%s\n",
           !same(in_order, good) ? " [threads in order]" : "", !same(reversed, good) ? " [later threads first]" : "");
}

/* 64: the wgmma form's warpgroup not fetching its next segment's first block during its
 * segment's last (the fetch that replaced the one at the segment's start): that segment then
 * reads a stale stage. Six segments of 64 keys, three a warpgroup: red */
TEST(planted_segment_prefetch_red) {
    for (int form = 8; form <= 9; form++) {
        case_t c(128, 5, 318, 384);
        c.whole = form;
        const std::vector<float> good = c.run<128>(c.tiles(0));
        CHECK_MSG(c.worst(good) <= 1.0, "the unplanted run of the wgmma form is out of its bound");
        emu_mut = 64;
        const std::vector<float> bad = c.run<128>(c.tiles(0));
        emu_mut = 0;
        CHECK_MSG(!same(bad, good) || c.worst(bad) > 1.0, "planted defect 'the next segment's block not fetched' passed");
        printf("  planted 'the wgmma form's next segment not fetched' (%s): red%s%s\n", form == 9 ? "TMA fetch" : "cp.async",
               !same(bad, good) ? " [bits moved]" : "", c.worst(bad) > 1.0 ? " [out of bound]" : "");
    }
}

/* 128: the TMA form not zeroing the rows of a block past its keys (the tile's last block): the
 * copy engine brings whole boxes, and the cache past the pass's last row is NaN here (case_t),
 * so 0 x NaN reaches the outputs. 24 rows at 110..133: the last block ends at key 133 */
TEST(planted_tma_rows_red) {
    case_t c(128);
    c.whole = 9;
    const std::vector<float> good = c.run<128>(c.tiles(0));
    CHECK_MSG(c.worst(good) <= 1.0, "the unplanted run of the TMA form is out of its bound");
    emu_mut = 128;
    const std::vector<float> bad = c.run<128>(c.tiles(0));
    emu_mut = 0;
    CHECK_MSG(!same(bad, good) && c.worst(bad) > 1.0, "planted defect 'the TMA form's rows past the keys not zeroed' passed");
    printf("  planted 'the TMA form's rows past a block's keys kept' (TMA fetch): red\n");
}

int main(void) {
    RUN(heads_128);
    RUN(heads_256);
    RUN(few_rows_at_depth);
    RUN(planted_defects_red);
    RUN(planted_fold_order_red);
    RUN(planted_segment_prefetch_red);
    RUN(planted_tma_rows_red);
    return harness_done();
}
