/* ops.c: small row-wise helpers of the CPU backend. */
#include "engine/cpu/cpu.h"

void cpu_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    float ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float sc = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * sc * w[i];
}
