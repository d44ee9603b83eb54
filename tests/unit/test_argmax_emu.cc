/* test_argmax_emu.cc: the greedy token's kernel (src/engine/cuda/argmax.cuh) and its scratch
 * layout run on the CPU under tests/unit/cuda_emu.h (warp shuffles, block barriers and the
 * last block's ticket emulated; no GPU needed), against sampler_argmax's rule written out
 * here: the lowest id among equal maxima, NaN never chosen, id 0 when the row starts with
 * NaN. Rows at the real vocab (248,320) with the cases the rule must get right, launched
 * twice over one scratch with fewer rows the second time (the layout that moved the tickets
 * with the row count failed exactly there, on the GPU, before this test existed), and that
 * old layout planted and shown red. test_cuda runs the same cases on a GPU. */
#include "cuda_emu.h"

extern "C" {
#include "harness.h"
}

#include <stdint.h>
#include <vector>

#include "engine/cuda/argmax.cuh"

/* sampler_argmax (src/engine/sampler.c), the rule the kernel must reproduce */
static int32_t seq_argmax(const float *l, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return (int32_t)best;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float unit(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1 << 24);
}

enum { V = 248320, N = 9 };

/* the planted defect: the first layout, tickets after the partial sums (where they move
 * with the row count) */
static void moving_layout(void *scratch, int64_t rows, unsigned **ticket, float **pv, int **pi) {
    *pv = (float *)scratch;
    *pi = (int *)(*pv + rows * AM_BLOCKS);
    *ticket = (unsigned *)(*pi + rows * AM_BLOCKS);
}

/* the kernel over `rows` rows from l, with the scratch as hk_argmax lays it (or planted) */
static void launch(const float *l, int64_t rows, void *scratch, int32_t *tok, bool planted = false) {
    unsigned *ticket;
    float *pv;
    int *pi;
    (planted ? moving_layout : am_layout)(scratch, rows, &ticket, &pv, &pi);
    emu::launch(argmax_kernel, dim3(AM_BLOCKS, (unsigned)rows), dim3(AM_THREADS), 0, l, (int64_t)V, pv, pi, ticket, tok);
}

static std::vector<float> rows_with_cases(void) {
    std::vector<float> l((size_t)N * V);
    for (auto &x : l) x = -30.0f + 60.0f * unit();
    float *r1 = &l[1 * (size_t)V], *r2 = &l[2 * (size_t)V], *r3 = &l[3 * (size_t)V], *r4 = &l[4 * (size_t)V];
    float *r5 = &l[5 * (size_t)V], *r6 = &l[6 * (size_t)V], *r7 = &l[7 * (size_t)V];
    r1[5000] = r1[100] = r1[200000] = 99.0f;                            /* ties: 100 */
    r2[0] = NAN, r2[7] = 99.0f;                                         /* NaN first: 0 */
    r3[1234] = NAN, r3[77] = 98.0f, r3[V - 2] = NAN, r3[4242] = 97.0f; /* NaN skipped: 77 */
    for (int64_t i = 0; i < V; i++) r4[i] = -INFINITY, r5[i] = NAN;    /* 0 and 0 */
    r6[V - 1] = 99.0f;                                                  /* the last id */
    r7[(V + AM_BLOCKS - 1) / AM_BLOCKS * 5] = 99.0f;                    /* a block's first */
    return l;
}

/* both launches; the tokens that differ from the rule (printed unless quiet) */
static int run_cases(const std::vector<float> &l, bool planted, bool quiet) {
    std::vector<unsigned char> scratch(am_scratch_bytes(N), 0);
    int32_t tok[N], tok2[3] = {-1, -1, -1};
    launch(l.data(), N, scratch.data(), tok, planted);
    launch(l.data() + 4 * (size_t)V, 3, scratch.data(), tok2, planted); /* fewer rows, the same scratch */
    int bad = 0;
    for (int r = 0; r < N; r++) {
        const int32_t want = seq_argmax(&l[(size_t)r * V], V);
        if (tok[r] != want && ++bad && !quiet) printf("  row %d: kernel %d, rule %d\n", r, tok[r], want);
        if (r >= 4 && r < 7 && tok2[r - 4] != want && ++bad && !quiet)
            printf("  second launch, row %d: kernel %d, rule %d\n", r, tok2[r - 4], want);
    }
    return bad;
}

TEST(argmax_matches_rule) {
    std::vector<float> l = rows_with_cases();
    CHECK(l[(size_t)1 * V + 100] == 99.0f && seq_argmax(&l[(size_t)1 * V], V) == 100 && seq_argmax(&l[(size_t)3 * V], V) == 77);
    const int bad = run_cases(l, false, false);
    CHECK_MSG(bad == 0, "%d greedy tokens differ from sampler_argmax's rule", bad);
    printf("  %d rows of %d (ties, NaN, -inf, edges) and a second launch of 3 equal the rule\n", N, V);
}

TEST(moving_tickets_caught) {
    const int bad = run_cases(rows_with_cases(), true, true);
    CHECK_MSG(bad > 0, "the tickets laid after the partial sums went unnoticed");
    printf("  tickets after the partial sums (the first layout): %d of 12 tokens wrong\n", bad);
}

int main(void) {
    RUN(argmax_matches_rule);
    RUN(moving_tickets_caught);
    return harness_done();
}
