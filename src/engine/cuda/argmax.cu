// argmax.cu: a greedy decode's token on the GPU (argmax.cuh's kernel), so that only its id
// leaves the device (a logits row is ~1 MB at the real vocab).
#include "engine/cuda/common.cuh"
#include "engine/cuda/argmax.cuh"

extern "C" size_t hk_argmax_scratch(int64_t rows) { return am_scratch_bytes(rows); }

extern "C" int hk_argmax(void *st, const float *logits, int64_t V, int64_t rows, void *scratch, int32_t *tok, herr *e) {
    if (rows == 0) return 0;
    if (V <= 0 || V > INT32_MAX) return herr_set(e, "hk_argmax: rows of %lld", (long long)V);
    unsigned *ticket;
    float *pv;
    int *pi;
    am_layout(scratch, rows, &ticket, &pv, &pi);
    LAUNCH(e, argmax_kernel, dim3(AM_BLOCKS, (unsigned)rows), AM_THREADS, 0, st, logits, V, pv, pi, ticket, tok);
    return 0;
}
