/* test_gdn_chunk.cc: the chunked delta rule's kernels (src/engine/cuda/gdn_chunk.cuh) run on
 * the CPU under tests/unit/cuda_emu.h (no GPU needed; C++ because the kernels are). Checks:
 * outputs and end states against a float64 sequential recurrence within a bound derived by
 * running error analysis of the kernels' own order of operations; every mark bit-equal to a
 * separate prefill of its prefix; marks bit-neutral; a one-row pass (the decode kernel)
 * equal to a longer pass's row; batch invariance; the four planted defects of the delta
 * rule caught. Shapes: S = 128 (the real lane), Gv = 4 value heads on Gk = 2 key heads, and the
 * model's 32 on 16 in real_heads (a planted fold of heads 16..31 onto 0..15 is red there only).
 * What it cannot show: the GPU's own bits (expf, fmaf and the compiler's code there); the
 * same checks on a GPU belong in test_cuda.c. */
#include "cuda_emu.h"

extern "C" {
#include "harness.h"
#include "engine/cuda/kernels.h"
#include "gdn_chunk_ref.h"
}

#include <time.h>
#include <unistd.h>
#include <vector>

static unsigned emu_mut; /* the planted defect the kernels see (gdn.cu's M_ bits) */
#define KMUT(bit) (emu_mut & (bit))
enum { M_NEIGHBOUR = 1 << 0, M_RING_SKIP = 1 << 1, M_RING_REVERSE = 1 << 2, M_COPY_LATE = 1 << 3, M_COPY_EARLY = 1 << 4,
       M_POINT_INPLACE = 1 << 5, M_DECAY_SKIP = 1 << 6 }; /* gdn.cu's bits */
#include "engine/cuda/tail.cuh"     /* the tails and the conv of a decode pass (test_fused_emu checks them) */
#include "engine/cuda/gdn_conv.cuh"
#include "engine/cuda/gdn_chunk.cuh"

enum { DS = 128, GK = 2, GV = 4, NROWS = 130, LANE = GV * DS * DS };
typedef gr_stats acc_stats;

static uint64_t rng_state; /* main seeds it: fresh inputs each run, the seed printed */
typedef gr_stream stream;

/* ---- one pass through the kernels, as hk_gdn_chunk launches them ---- */

struct piece_in {
    const stream *s;
    int64_t from, len;            /* rows [from, from + len) of the stream */
    std::vector<int64_t> marks;   /* relative to the piece */
    const float *init;            /* the start state (LANE floats) */
    float beta_scale = 1.0f;      /* a planted input error (1: none) */
};
struct piece_out {
    std::vector<float> o, lane;         /* (len, GV*DS), (LANE) */
    std::vector<std::vector<float>> pt; /* a point per mark */
};

/* the pieces' streams share one shape (the head counts GK, GV here; the model's in real_heads) */
/* the state kernel's threads for chunks of 64 (gdn.cu: 512 by default, 256 under
 * HEARTH_CUDA_GDN_WIDE=0) */
static int g_nth = GC_THREADS_WIDE;

static std::vector<piece_out> run_pass(const std::vector<piece_in> &ps) {
    const int np = (int)ps.size();
    const int GK = ps[0].s->Gk, GV = ps[0].s->Gv;
    const int64_t CD = ps[0].s->cd, LANE = (int64_t)GV * DS * DS;
    int64_t n = 0;
    for (const piece_in &p : ps) n += p.len;
    std::vector<float> cv(n * CD), a(n * GV), b(n * GV), lanes((size_t)np * LANE);
    std::vector<hk_piece> pieces(np);
    std::vector<hk_mark> marks;
    std::vector<hk_chunk> chunks;
    std::vector<int32_t> pchunk(np + 1);
    int64_t r0 = 0;
    for (int p = 0; p < np; p++) {
        const piece_in &pi = ps[p];
        memcpy(&cv[r0 * CD], &pi.s->cv[pi.from * CD], sizeof(float) * pi.len * CD);
        memcpy(&a[r0 * GV], &pi.s->a[pi.from * GV], sizeof(float) * pi.len * GV);
        for (int64_t i = 0; i < pi.len * GV; i++) b[r0 * GV + i] = pi.s->b[pi.from * GV + i] * pi.beta_scale;
        memcpy(&lanes[(size_t)p * LANE], pi.init, sizeof(float) * LANE);
        pieces[p] = hk_piece{r0, pi.len, pi.from, p, (int32_t)marks.size(), (int32_t)pi.marks.size(), 0};
        for (int64_t m : pi.marks) marks.push_back(hk_mark{m, (int32_t)marks.size(), p});
        pchunk[p] = (int32_t)chunks.size();
        for (int64_t c0 = 0; c0 < pi.len; c0 += GC_C)
            chunks.push_back(hk_chunk{p, (int32_t)c0, (int32_t)(pi.len - c0 < GC_C ? pi.len - c0 : GC_C), 0});
        pchunk[p + 1] = (int32_t)chunks.size();
        r0 += pi.len;
    }
    std::vector<float> o(n * GV * DS, NAN), stage(marks.size() * LANE + 1, NAN);
    std::vector<float> wsc(n * GV * DS, NAN), usc(n * GV * DS, NAN), qksc(n * GV * GC_C, NAN), gsc(n * GV, NAN);
    const size_t ss = LANE;
    const dim3 gs(GV * 4, np);
    if (n == np) {
        emu::launch(gdn_chunk_state_kernel<1>, gs, dim3(GC_THREADS), sizeof(float) * gc_state_smem_floats(1), (const float *)cv.data(),
                    (const float *)b.data(), (const float *)a.data(), lanes.data(), ss, (const hk_piece *)pieces.data(),
                    (const hk_chunk *)chunks.data(), (const int32_t *)pchunk.data(), (const hk_mark *)marks.data(),
                    stage.data(), ss, (int64_t)GK, (int64_t)GV, (int64_t)CD, (const float *)nullptr, (const float *)nullptr,
                    (const float *)nullptr, (const float *)nullptr, hk_gconv{}, hk_gtail{}, o.data());
    } else {
        emu::launch(gdn_chunk_prep_kernel, dim3(GV, (unsigned)((n + GC_C - 1) / GC_C + np)), dim3(256),
                    sizeof(float) * gc_prep_smem_floats(), (const float *)cv.data(), (const float *)b.data(),
                    (const float *)a.data(), (const hk_piece *)pieces.data(), (const hk_chunk *)chunks.data(),
                    (const int32_t *)pchunk.data(), np, (int64_t)GK, (int64_t)GV, (int64_t)CD, wsc.data(), usc.data(),
                    qksc.data(), gsc.data());
        if (g_nth == GC_THREADS_WIDE)
            emu::launch(gdn_chunk_state_kernel<GC_C, GC_THREADS_WIDE>, gs, dim3(GC_THREADS_WIDE),
                        sizeof(float) * gc_state_smem_floats(GC_C), (const float *)cv.data(), (const float *)b.data(),
                        (const float *)a.data(), lanes.data(), ss, (const hk_piece *)pieces.data(),
                        (const hk_chunk *)chunks.data(), (const int32_t *)pchunk.data(), (const hk_mark *)marks.data(),
                        stage.data(), ss, (int64_t)GK, (int64_t)GV, (int64_t)CD, (const float *)wsc.data(),
                        (const float *)usc.data(), (const float *)qksc.data(), (const float *)gsc.data(), hk_gconv{},
                        hk_gtail{}, o.data());
        else
            emu::launch(gdn_chunk_state_kernel<GC_C>, gs, dim3(GC_THREADS), sizeof(float) * gc_state_smem_floats(GC_C),
                        (const float *)cv.data(), (const float *)b.data(), (const float *)a.data(), lanes.data(), ss,
                        (const hk_piece *)pieces.data(), (const hk_chunk *)chunks.data(), (const int32_t *)pchunk.data(),
                        (const hk_mark *)marks.data(), stage.data(), ss, (int64_t)GK, (int64_t)GV, (int64_t)CD,
                        (const float *)wsc.data(), (const float *)usc.data(), (const float *)qksc.data(),
                        (const float *)gsc.data(), hk_gconv{}, hk_gtail{}, o.data());
    }
    std::vector<piece_out> out(np);
    for (int p = 0; p < np; p++) {
        out[p].o.assign(o.begin() + pieces[p].r0 * GV * DS, o.begin() + (pieces[p].r0 + pieces[p].n) * GV * DS);
        out[p].lane.assign(lanes.begin() + (size_t)p * LANE, lanes.begin() + (size_t)(p + 1) * LANE);
        for (int k = 0; k < pieces[p].n_marks; k++) {
            const size_t slot = (size_t)(pieces[p].mark0 + k);
            out[p].pt.emplace_back(stage.begin() + slot * LANE, stage.begin() + (slot + 1) * LANE);
        }
    }
    return out;
}

static bool same_bits(const std::vector<float> &x, const std::vector<float> &y) {
    return x.size() == y.size() && memcmp(x.data(), y.data(), sizeof(float) * x.size()) == 0;
}

static stream S1, S2, S3; /* three sequences' rows */

/* pieces of 1, 63, 64, 65 and 130 rows in one pass, each from its own start state */
static acc_stats accuracy_run(float beta_scale, acc_stats *lanes_st) {
    std::vector<piece_in> ps;
    const int64_t lens[] = {1, 63, 64, 65, 130};
    const stream *ss[] = {&S1, &S2, &S3, &S1, &S2};
    for (int i = 0; i < 5; i++) ps.push_back(piece_in{ss[i], 0, lens[i], {}, ss[i]->lane, beta_scale});
    std::vector<piece_out> out = run_pass(ps);
    acc_stats so = {};
    *lanes_st = acc_stats{};
    for (int i = 0; i < 5; i++) {
        std::vector<double> o(lens[i] * GV * DS), lane(LANE), bo(o.size()), bl(LANE);
        gr_sequential(ss[i], 0, lens[i], ss[i]->lane, o.data(), lane.data());
        gr_bounds(ss[i], 0, lens[i], ss[i]->lane, bo.data(), bl.data());
        gr_compare(out[i].o.data(), o.data(), bo.data(), (int64_t)o.size(), &so);
        gr_compare(out[i].lane.data(), lane.data(), bl.data(), LANE, lanes_st);
    }
    return so;
}

TEST(accuracy) {
    acc_stats sl;
    acc_stats so = accuracy_run(1.0f, &sl);
    printf("    o: max |err| %.3g (bound up to %.3g), worst err/bound %.3f, %lld outside\n", so.max_err, so.max_bound,
           so.max_ratio, (long long)so.bad);
    printf("    end states: max |err| %.3g (bound up to %.3g), worst err/bound %.3f, %lld outside\n", sl.max_err,
           sl.max_bound, sl.max_ratio, (long long)sl.bad);
    CHECK(so.bad == 0);
    CHECK(sl.bad == 0);
}

/* the bound is tight enough to see an error well below a float's precision losses of
 * practice: every beta off by 2^-16 relative (as if it had passed through a 16-bit
 * mantissa), against the reference on the true beta */
TEST(accuracy_catches_planted) {
    acc_stats sl;
    acc_stats so = accuracy_run(1.0f + 0x1p-16f, &sl);
    printf("    beta * (1 + 2^-16): o max |err| %.3g, %lld of %d outside; end states max |err| %.3g, %lld outside\n",
           so.max_err, (long long)so.bad, (1 + 63 + 64 + 65 + 130) * GV * DS, sl.max_err, (long long)sl.bad);
    CHECK(so.bad > 0 || sl.bad > 0);
}

static const std::vector<int64_t> MARKS = {1, 2, 33, 63, 64, 65, 66, 100, 127, 128, 129, 130};

/* a piece of 130 rows with MARKS; its points against prefills of the prefixes (in one pass,
 * each its own piece); its outputs and end state against the same piece without marks.
 * Returns the number of failures of each kind. */
struct mark_result {
    int point_bad, neutral_bad;
};
static mark_result mark_checks(bool report) {
    std::vector<piece_out> marked = run_pass({piece_in{&S1, 0, NROWS, MARKS, S1.lane}});
    std::vector<piece_out> plain = run_pass({piece_in{&S1, 0, NROWS, {}, S1.lane}});
    std::vector<piece_in> pre;
    for (int64_t m : MARKS) pre.push_back(piece_in{&S1, 0, m, {}, S1.lane});
    const unsigned mut = emu_mut;
    emu_mut = 0; /* the prefixes carry no marks: the defects do not touch them */
    std::vector<piece_out> pref = run_pass(pre);
    emu_mut = mut;
    mark_result r = {0, 0};
    for (size_t k = 0; k < MARKS.size(); k++) {
        const bool ok = same_bits(marked[0].pt[k], pref[k].lane);
        if (!ok && report) printf("    point at m = %lld differs from the prefill of [0, %lld)\n", (long long)MARKS[k], (long long)MARKS[k]);
        r.point_bad += !ok;
    }
    r.neutral_bad += !same_bits(marked[0].o, plain[0].o);
    r.neutral_bad += !same_bits(marked[0].lane, plain[0].lane);
    if (r.neutral_bad && report) printf("    marks moved the pass's outputs or end state\n");
    return r;
}

TEST(marks_exact_and_neutral) {
    mark_result r = mark_checks(true);
    CHECK(r.point_bad == 0);
    CHECK(r.neutral_bad == 0);
}

/* the one-row kernel (a pass of one-row pieces: decode) against the chunk path */
TEST(decode_is_row_zero) {
    std::vector<piece_out> longp = run_pass({piece_in{&S1, 0, 65, {1}, S1.lane}, piece_in{&S2, 0, 64, {}, S2.lane}});
    std::vector<piece_out> dec = run_pass({piece_in{&S3, 0, 1, {}, S3.lane}, piece_in{&S1, 0, 1, {1}, S1.lane}});
    /* row 0: W_0, U_0, QK_00 made in the state kernel give the prep's bits */
    CHECK(same_bits(dec[1].lane, longp[0].pt[0]));
    CHECK(same_bits(dec[1].pt[0], longp[0].pt[0]));
    CHECK(memcmp(dec[1].o.data(), longp[0].o.data(), sizeof(float) * GV * DS) == 0);
    /* a step after a prefill of [0, 64) is the last, one-row chunk of a prefill of [0, 65) */
    std::vector<piece_out> pre = run_pass({piece_in{&S2, 0, 64, {}, S2.lane}, piece_in{&S3, 0, 1, {}, S3.lane}});
    std::vector<piece_out> step = run_pass({piece_in{&S2, 64, 1, {}, pre[0].lane.data()}, piece_in{&S3, 1, 1, {}, pre[1].lane.data()}});
    std::vector<piece_out> full = run_pass({piece_in{&S2, 0, 65, {}, S2.lane}});
    CHECK(same_bits(step[0].lane, full[0].lane));
    CHECK(memcmp(step[0].o.data(), full[0].o.data() + 64 * GV * DS, sizeof(float) * GV * DS) == 0);
}

/* a piece alone and beside others (placed second, so at another pass row) */
TEST(batch_invariance) {
    std::vector<piece_out> alone = run_pass({piece_in{&S1, 0, NROWS, {64, 100}, S1.lane}});
    std::vector<piece_out> mixed = run_pass({piece_in{&S2, 0, 65, {3}, S2.lane}, piece_in{&S1, 0, NROWS, {64, 100}, S1.lane},
                                             piece_in{&S3, 5, 1, {1}, S3.lane}, piece_in{&S3, 0, 64, {}, S2.lane}});
    CHECK(same_bits(alone[0].o, mixed[1].o));
    CHECK(same_bits(alone[0].lane, mixed[1].lane));
    CHECK(same_bits(alone[0].pt[0], mixed[1].pt[0]) && same_bits(alone[0].pt[1], mixed[1].pt[1]));
}

/* the state kernel in 512 threads (the default) and in 256: the same bits in the outputs,
 * the end states and the points, over pieces of 1..130 rows with marks inside and at the
 * chunks' edges */
TEST(wide_same_bits) {
    const std::vector<piece_in> ps = {piece_in{&S2, 0, 65, {3, 64}, S2.lane}, piece_in{&S1, 0, NROWS, MARKS, S1.lane},
                                      piece_in{&S3, 5, 1, {1}, S3.lane}, piece_in{&S3, 0, 63, {17}, S2.lane}};
    std::vector<piece_out> wide = run_pass(ps);
    g_nth = GC_THREADS;
    std::vector<piece_out> narrow = run_pass(ps);
    g_nth = GC_THREADS_WIDE;
    int bad = 0;
    for (size_t p = 0; p < ps.size(); p++) {
        bad += !same_bits(wide[p].o, narrow[p].o) + !same_bits(wide[p].lane, narrow[p].lane);
        for (size_t k = 0; k < wide[p].pt.size(); k++) bad += !same_bits(wide[p].pt[k], narrow[p].pt[k]);
    }
    if (bad) printf("    %d of the outputs, end states and points differ between 512 and 256 threads\n", bad);
    CHECK(bad == 0);
}

/* the model's head counts (32 value heads on 16 key heads, as test_cuda's GPU check): one
 * piece of 65 rows (a full chunk and a one-row chunk) with marks at 1, 64 and 65, against the
 * float64 recurrence within the derived bound; each point bit-equal to a prefill of its
 * prefix; a one-row pass (decode) equal to the piece's row 0 and its point at 1 */
TEST(real_heads) {
    uint64_t rng = rng_state ^ 0x9e3779b97f4a7c15ull;
    enum { RK = 16, RV = 32, RN = 65 };
    const int64_t lane_n = (int64_t)RV * DS * DS;
    gr_stream r = gr_stream_new(RN, RK, RV, &rng);
    const std::vector<int64_t> mk = {1, 64, 65};
    std::vector<piece_out> out = run_pass({piece_in{&r, 0, RN, mk, r.lane}});
    std::vector<double> o(RN * RV * DS), lane(lane_n), bo(o.size()), bl(lane_n);
    gr_sequential(&r, 0, RN, r.lane, o.data(), lane.data());
    gr_bounds(&r, 0, RN, r.lane, bo.data(), bl.data());
    acc_stats so = {}, sl = {};
    gr_compare(out[0].o.data(), o.data(), bo.data(), (int64_t)o.size(), &so);
    gr_compare(out[0].lane.data(), lane.data(), bl.data(), lane_n, &sl);
    printf("    32 heads: o worst err/bound %.3f, end state %.3f, %lld + %lld outside\n", so.max_ratio, sl.max_ratio,
           (long long)so.bad, (long long)sl.bad);
    CHECK(so.bad == 0 && sl.bad == 0);
    std::vector<piece_in> pre;
    for (int64_t m : mk) pre.push_back(piece_in{&r, 0, m, {}, r.lane});
    std::vector<piece_out> pref = run_pass(pre);
    for (size_t k = 0; k < mk.size(); k++)
        CHECK_MSG(same_bits(out[0].pt[k], pref[k].lane), "32 heads: the point at %lld differs from the prefill of its prefix",
                  (long long)mk[k]);
    std::vector<piece_out> dec = run_pass({piece_in{&r, 0, 1, {}, r.lane}, piece_in{&r, 0, 1, {}, r.lane}});
    CHECK(same_bits(dec[1].lane, out[0].pt[0]));
    CHECK(memcmp(dec[1].o.data(), out[0].o.data(), sizeof(float) * RV * DS) == 0);
    gr_stream_free(&r);
}

/* each planted defect of the delta rule turns its check red */
TEST(mutants_caught) {
    const struct {
        const char *name;
        unsigned bit;
        bool point, neutral; /* which checks must fail */
    } muts[] = {{"copy_late", M_COPY_LATE, true, false},
                {"copy_early_decay", M_COPY_EARLY, true, false},
                {"point_inplace", M_POINT_INPLACE, false, true},
                {"decay_skip", M_DECAY_SKIP, true, false}};
    for (const auto &m : muts) {
        emu_mut = m.bit;
        mark_result r = mark_checks(false);
        emu_mut = 0;
        printf("    %s: %d of %zu points differ, marks %s\n", m.name, r.point_bad, MARKS.size(),
               r.neutral_bad ? "move the pass" : "leave the pass alone");
        if (m.point) CHECK_MSG(r.point_bad > 0, "%s not caught by the point check", m.name);
        if (m.neutral) CHECK_MSG(r.neutral_bad > 0, "%s not caught by the neutrality check", m.name);
    }
}

int main(void) {
    const char *seed_env = getenv("HEARTH_TEST_SEED"); /* to replay a run */
    rng_state = seed_env ? strtoull(seed_env, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (!rng_state) rng_state = 1;
    printf("seed %llu (HEARTH_TEST_SEED)\n", (unsigned long long)rng_state);
    S1 = gr_stream_new(NROWS, GK, GV, &rng_state), S2 = gr_stream_new(NROWS, GK, GV, &rng_state);
    S3 = gr_stream_new(NROWS, GK, GV, &rng_state);
    RUN(accuracy);
    RUN(accuracy_catches_planted);
    RUN(marks_exact_and_neutral);
    RUN(decode_is_row_zero);
    RUN(batch_invariance);
    RUN(wide_same_bits);
    RUN(real_heads);
    RUN(mutants_caught);
    gr_stream_free(&S1), gr_stream_free(&S2), gr_stream_free(&S3);
    return harness_done();
}
