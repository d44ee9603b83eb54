// bench/small_kernels.cu: a prompt pass's small memory-bound kernels at q36's widths (2,048
// rows; E 2048, conv dim 8192 in heads of 128, 32 value heads, top 8 experts): the engine's
// launchers (hk_rmsnorm, hk_moe_combine, hk_gdn_conv_norm, hk_gdn_gated_norm) against
// verbatim copies of their kernels as they were before the row forms (namespace old, from
// commit ffca76b). Every output is compared bit for bit on fresh random inputs, then each
// form timed (median of REPS launches, us, and TB/s of the bytes it must move). Exits 1 if
// any bit differs.
//   make build/libhearth.a && nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -DHEARTH_CUDA \
//     -o build/small_kernels bench/small_kernels.cu build/libhearth.a -lm && build/small_kernels [REPS]
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "engine/cuda/common.cuh"
#include "engine/cuda/act.cuh"

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } \
    } while (0)
#define HK(x)                                                                  \
    do {                                                                       \
        if ((x) < 0) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, e.msg); exit(1); } \
    } while (0)

namespace old {
__device__ __forceinline__ float row_ss(const float *xr, int64_t E) {
    float s = 0.0f;
#pragma unroll 8
    for (int64_t i = threadIdx.x & 31; i < E; i += 32) {
        const float v = __ldcg(xr + i);
        s += v * v;
    }
    return warp_sum(s);
}
__device__ __forceinline__ void norm_blk(const float *xr, const float *w, float *y, float sc, int64_t r, int64_t blk,
                                         const hk_act &a, const hk_act &a2) {
    const int64_t i0 = blk * 256 + 8 * (threadIdx.x & 31);
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = __ldcg(xr + i0 + i) * sc * w[i0 + i];
    float4 *o = (float4 *)(y + i0);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
    if (a.q) round_into(a, r, blk, v);
    if (a2.q) round_into(a2, r, blk, v);
}
__device__ __forceinline__ void norm_row(const float *xr, const float *w, float *y, int64_t E, float sc, int64_t r,
                                         const hk_act &a, const hk_act &a2) {
    if (E % 256) {
        for (int64_t i = threadIdx.x; i < E; i += blockDim.x) y[i] = __ldcg(xr + i) * sc * w[i];
        return;
    }
    for (int64_t blk = threadIdx.x / 32; blk < E / 256; blk += blockDim.x / 32) old::norm_blk(xr, w, y, sc, r, blk, a, a2);
}
__device__ __forceinline__ void rms_row(const float *xr, const float *w, float *y, int64_t E, float eps, int64_t r,
                                        const hk_act &a, const hk_act &a2) {
    const float ss = old::row_ss(xr, E);
    old::norm_row(xr, w, y, E, 1.0f / sqrtf(ss / (float)E + eps), r, a, a2);
}
__device__ __forceinline__ float combine_elem(const float *x, const float *eo, const float *so, const float *wsel, float sg,
                                              int64_t r, int64_t i, int64_t E, int K) {
    float o = 0;
    for (int k = 0; k < K; k++) o += __ldcg(wsel + r * K + k) * __ldcg(eo + (r * K + k) * E + i);
    return __ldcg(x + r * E + i) + (o + sg * __ldcg(so + r * E + i));
}
__global__ void rmsnorm_kernel(const float *x, const int32_t *rows, const float *w, float *y, int64_t E, float eps,
                               hk_act a, hk_act a2) {
    pdl_enter();
    const int64_t r = blockIdx.x, src = rows ? rows[r] : r;
    old::rms_row(x + src * E, w, y + r * E, E, eps, r, a, a2);
}
__global__ void combine_kernel(float *x, const float *gl, int64_t gls, const float *eo, const float *so, const float *wsel,
                               int64_t E, int K, const float *nw, float *h, float eps, hk_act a, hk_act a2) {
    pdl_enter();
    const int64_t r = blockIdx.x;
    const float sg = sigm(gl[r * gls]);
    for (int64_t i = threadIdx.x; i < E; i += blockDim.x) {
        x[r * E + i] = combine_elem(x, eo, so, wsel, sg, r, i, E, K);
    }
    if (!nw) return;
    __threadfence();
    __syncthreads();
    old::rms_row(x + r * E, nw, h + r * E, E, eps, r, a, a2);
}
#define GN_DS 128
__device__ __forceinline__ void gated_blk(float *o, const float *z, const float *nw, int64_t r, int64_t blk, int64_t Vd,
                                          float eps, const hk_act &a) {
    const int lane = threadIdx.x & 31;
    const int64_t i0 = r * Vd + blk * 256 + 8 * lane;
    const int d0 = (8 * lane) % GN_DS;
    float v[8], ss = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = __ldcg(o + i0 + i), ss += v[i] * v[i];
    for (int off = 1; off < 16; off <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float sc = 1.0f / sqrtf(ss / (float)GN_DS + eps);
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = v[i] * sc * nw[d0 + i] * silu(z[i0 + i]);
#pragma unroll
    for (int i = 0; i < 8; i++) o[i0 + i] = v[i];
    if (a.q) round_into(a, r, blk, v);
}
__global__ void gated_norm_kernel(float *o, const float *z, const float *nw, int64_t Vd, float eps, hk_act a) {
    pdl_enter();
    for (int64_t blk = threadIdx.x / 32; blk < Vd / 256; blk += 8) gated_blk(o, z, nw, blockIdx.x, blk, Vd, eps, a);
}
/* conv_norm_kernel's prompt form (ring_too 0: the loop; no mutants) */
__device__ __forceinline__ float conv_x(const float *qkv, const float *ring, const hk_piece *pc, int64_t r, int64_t j,
                                        int64_t cd, int64_t dc, int64_t ch) {
    const int64_t idx = r - pc->r0 - (dc - 1) + j;
    return idx >= 0 ? qkv[(pc->r0 + idx) * cd + ch] : ring[(idx + dc - 1) * cd + ch];
}
__global__ void conv_norm_kernel(const float *qkv, float *ring0, size_t seq_stride, const float *w, const int32_t *row_piece,
                                 const hk_piece *pieces, float *cv, float *b, float *a, const float *ssm_a, const float *dt,
                                 int64_t S, int64_t Gk, int64_t Gv, int64_t cd, int64_t dc, float eps) {
    pdl_enter();
    const int64_t r = blockIdx.y, hh = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    const hk_piece *pc = &pieces[row_piece[r]];
    float *ring = ring0 + (size_t)pc->seq * seq_stride;
    if (hh < cd / S) {
        float ss = 0;
        for (int64_t i = lane; i < S; i += 32) {
            const int64_t ch = hh * S + i;
            float s = 0;
            for (int64_t j = 0; j < dc; j++) s = __fmaf_rn(w[ch * dc + j], conv_x(qkv, ring, pc, r, j, cd, dc, ch), s);
            const float x = silu(s);
            cv[r * cd + ch] = x;
            ss = __fmaf_rn(x, x, ss);
        }
        if (hh < 2 * Gk) {
            ss = warp_sum(ss);
            float sc = 1.0f / sqrtf(ss + eps);
            if (hh < Gk) sc *= 1.0f / sqrtf((float)S);
            for (int64_t i = lane; i < S; i += 32) cv[r * cd + hh * S + i] *= sc;
        }
    }
    if (blockIdx.x == 0)
        for (int64_t h = threadIdx.x; h < Gv; h += blockDim.x) {
            const float av = a[r * Gv + h] + dt[h];
            b[r * Gv + h] = sigm(b[r * Gv + h]);
            a[r * Gv + h] = ssm_a[h] * (av > 20.0f ? av : log1pf(expf(av)));
        }
}
} // namespace old

static uint64_t rng = 88172645463325252ull;
static float rndf(float lo, float hi) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return lo + (hi - lo) * (float)(rng >> 40) / (float)(1ull << 24);
}
static float *dev_rand(size_t n, float lo, float hi) {
    std::vector<float> h(n);
    for (auto &v : h) v = rndf(lo, hi);
    float *d;
    CK(cudaMalloc(&d, 4 * n));
    CK(cudaMemcpy(d, h.data(), 4 * n, cudaMemcpyHostToDevice));
    return d;
}
static void *dev_zero(size_t bytes) {
    void *d;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemset(d, 0, bytes));
    return d;
}
static float *dev_copy(const float *s, size_t n) {
    float *d;
    CK(cudaMalloc(&d, 4 * n));
    CK(cudaMemcpy(d, s, 4 * n, cudaMemcpyDeviceToDevice));
    return d;
}
static hk_act act_new(int64_t n, int64_t K, bool q80) {
    hk_act a = {(int8_t *)dev_zero((size_t)(n * K)), (float *)dev_zero(4 * (size_t)(n * K / 32)),
                (int32_t *)dev_zero(4 * (size_t)(n * K / 32)), K, q80};
    return a;
}
/* the number of differing bytes between two device buffers */
static long diff(const void *a, const void *b, size_t bytes) {
    std::vector<uint8_t> x(bytes), y(bytes);
    CK(cudaMemcpy(x.data(), a, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), b, bytes, cudaMemcpyDeviceToHost));
    long d = 0;
    for (size_t i = 0; i < bytes; i++) d += x[i] != y[i];
    return d;
}
static long diff_act(const hk_act &a, const hk_act &b, int64_t n) {
    return diff(a.q, b.q, (size_t)(n * a.K)) + diff(a.d, b.d, 4 * (size_t)(n * a.K / (a.q80 ? 32 : 256))) +
           (a.q80 ? 0 : diff(a.s, b.s, 4 * (size_t)(n * a.K / 32)));
}

static int reps = 30, fails = 0;
static cudaStream_t st;
template <typename F> static double time_us(F f) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int i = 0; i < reps + 3; i++) {
        CK(cudaEventRecord(e0, st));
        f();
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3) t.push_back(ms * 1000.0f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}
static void report(const char *name, long bad, double mb, double t_old, double t_new) {
    printf("%-14s %s (%ld bytes differ)  old %7.1f us  new %7.1f us  (%.2fx)  %.0f MB: %.2f -> %.2f TB/s\n", name,
           bad ? "DIFFER" : "same bits", bad, t_old, t_new, t_old / t_new, mb, mb / t_old, mb / t_new);
    fails += bad != 0;
}

int main(int argc, char **argv) {
    if (argc > 1) reps = atoi(argv[1]);
    herr e;
    CK(cudaStreamCreate(&st));
    void *stv = st;
    hk_pdl(false);
    const int64_t n = 2048, E = 2048, K = 8, F = 512, S = 128, Gk = 16, Gv = 32, cd = (2 * Gk + Gv) * S, Vd = Gv * S, dc = 4;
    const float eps = 1e-6f;
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    printf("%s, %d SMs; %lld rows, %d launches a form\n", pr.name, pr.multiProcessorCount, (long long)n, reps);
    { /* the norm (the layer's post-attention norm), rounded into Q8_K and Q8_0 */
        float *x = dev_rand((size_t)(n * E), -3, 3), *w = dev_rand((size_t)E, 0.5f, 1.5f);
        float *ya = (float *)dev_zero(4 * (size_t)(n * E)), *yb = (float *)dev_zero(4 * (size_t)(n * E));
        hk_act aa = act_new(n, E, false), ab = act_new(n, E, false), a2a = act_new(n, E, true), a2b = act_new(n, E, true);
        old::rmsnorm_kernel<<<(unsigned)n, 256, 0, st>>>(x, NULL, w, ya, E, eps, aa, a2a);
        HK(hk_rmsnorm(stv, x, NULL, w, yb, n, E, eps, &ab, &a2b, &e));
        CK(cudaStreamSynchronize(st));
        const long bad = diff(ya, yb, 4 * (size_t)(n * E)) + diff_act(aa, ab, n) + diff_act(a2a, a2b, n);
        const double t0 = time_us([&] { old::rmsnorm_kernel<<<(unsigned)n, 256, 0, st>>>(x, NULL, w, ya, E, eps, aa, a2a); });
        const double t1 = time_us([&] { hk_rmsnorm(stv, x, NULL, w, yb, n, E, eps, &ab, &a2b, &e); });
        report("norm", bad, (double)n * E * (4 + 4 + 1 + 1) / 1e6, t0, t1);
    }
    { /* the combine with the next layer's norm */
        const int64_t nr = n * K;
        float *eo = dev_rand((size_t)(nr * E), -2, 2), *so = dev_rand((size_t)(n * E), -2, 2);
        float *wsel = dev_rand((size_t)nr, 0, 0.3f), *gl = dev_rand((size_t)(n * 257), -3, 3), *nw = dev_rand((size_t)E, 0.5f, 1.5f);
        float *x0 = dev_rand((size_t)(n * E), -3, 3), *xa = dev_copy(x0, (size_t)(n * E)), *xb = dev_copy(x0, (size_t)(n * E));
        float *ha = (float *)dev_zero(4 * (size_t)(n * E)), *hb = (float *)dev_zero(4 * (size_t)(n * E));
        hk_act aa = act_new(n, E, false), ab = act_new(n, E, false);
        const hk_act none = {};
        old::combine_kernel<<<(unsigned)n, 512, 0, st>>>(xa, gl + 256, 257, eo, so, wsel, E, (int)K, nw, ha, eps, aa, none);
        HK(hk_moe_combine(stv, xb, gl + 256, 257, eo, so, wsel, n, E, (int)K, nw, hb, eps, &ab, NULL, &e));
        CK(cudaStreamSynchronize(st));
        const long bad = diff(xa, xb, 4 * (size_t)(n * E)) + diff(ha, hb, 4 * (size_t)(n * E)) + diff_act(aa, ab, n);
        const double t0 = time_us([&] {
            old::combine_kernel<<<(unsigned)n, 512, 0, st>>>(xa, gl + 256, 257, eo, so, wsel, E, (int)K, nw, ha, eps, aa, none);
        });
        const double t1 = time_us([&] { hk_moe_combine(stv, xb, gl + 256, 257, eo, so, wsel, n, E, (int)K, nw, hb, eps, &ab, NULL, &e); });
        report("moe combine", bad, (double)n * E * (4 * K + 4 + 4 + 4 + 4 + 1) / 1e6, t0, t1);
    }
    { /* the conv with its norms and gates: two pieces (of 1,000 and 1,048 rows, two sequences) */
        float *qkv = dev_rand((size_t)(n * cd), -2, 2), *w = dev_rand((size_t)(cd * dc), -0.5f, 0.5f);
        float *ring = dev_rand((size_t)(2 * (dc - 1) * cd), -2, 2);
        float *b0 = dev_rand((size_t)(n * Gv), -2, 2), *a0 = dev_rand((size_t)(n * Gv), -2, 2);
        float *ssm_a = dev_rand((size_t)Gv, -1, -0.1f), *dt = dev_rand((size_t)Gv, -0.5f, 0.5f);
        float *ba = dev_copy(b0, (size_t)(n * Gv)), *bb = dev_copy(b0, (size_t)(n * Gv));
        float *aa = dev_copy(a0, (size_t)(n * Gv)), *ab = dev_copy(a0, (size_t)(n * Gv));
        float *cva = (float *)dev_zero(4 * (size_t)(n * cd)), *cvb = (float *)dev_zero(4 * (size_t)(n * cd));
        const hk_piece hp[2] = {{0, 1000, 5, 0, 0, 0, 0}, {1000, n - 1000, 77, 1, 0, 0, 0}};
        std::vector<int32_t> rp((size_t)n);
        for (int64_t r = 0; r < n; r++) rp[r] = r < 1000 ? 0 : 1;
        hk_piece *pcs;
        int32_t *drp;
        CK(cudaMalloc(&pcs, sizeof hp));
        CK(cudaMemcpy(pcs, hp, sizeof hp, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&drp, 4 * (size_t)n));
        CK(cudaMemcpy(drp, rp.data(), 4 * (size_t)n, cudaMemcpyHostToDevice));
        const size_t rs = (size_t)((dc - 1) * cd);
        const dim3 g((unsigned)((cd / S + 7) / 8), (unsigned)n);
        old::conv_norm_kernel<<<g, 256, 0, st>>>(qkv, ring, rs, w, drp, pcs, cva, ba, aa, ssm_a, dt, S, Gk, Gv, cd, dc, eps);
        HK(hk_gdn_conv_norm(stv, qkv, ring, rs, w, drp, pcs, n, NULL, NULL, rs, 0, cvb, bb, ab, ssm_a, dt, S, Gk, Gv, cd, dc, eps, &e));
        CK(cudaStreamSynchronize(st));
        const long bad = diff(cva, cvb, 4 * (size_t)(n * cd)) + diff(ba, bb, 4 * (size_t)(n * Gv)) + diff(aa, ab, 4 * (size_t)(n * Gv));
        const double t0 = time_us([&] {
            old::conv_norm_kernel<<<g, 256, 0, st>>>(qkv, ring, rs, w, drp, pcs, cva, ba, aa, ssm_a, dt, S, Gk, Gv, cd, dc, eps);
        });
        const double t1 = time_us([&] {
            hk_gdn_conv_norm(stv, qkv, ring, rs, w, drp, pcs, n, NULL, NULL, rs, 0, cvb, bb, ab, ssm_a, dt, S, Gk, Gv, cd, dc, eps, &e);
        });
        report("gdn conv norm", bad, (double)n * cd * 8 / 1e6, t0, t1);
    }
    { /* the gated norm, rounded into Q8_K */
        float *o0 = dev_rand((size_t)(n * Vd), -2, 2), *z = dev_rand((size_t)(n * Vd), -3, 3), *nw = dev_rand((size_t)S, 0.5f, 1.5f);
        float *oa = dev_copy(o0, (size_t)(n * Vd)), *ob = dev_copy(o0, (size_t)(n * Vd));
        hk_act aa = act_new(n, Vd, false), ab = act_new(n, Vd, false);
        old::gated_norm_kernel<<<(unsigned)n, 256, 0, st>>>(oa, z, nw, Vd, eps, aa);
        HK(hk_gdn_gated_norm(stv, ob, z, nw, n, S, Gv, eps, &ab, &e));
        CK(cudaStreamSynchronize(st));
        const long bad = diff(oa, ob, 4 * (size_t)(n * Vd)) + diff_act(aa, ab, n);
        const double t0 = time_us([&] { old::gated_norm_kernel<<<(unsigned)n, 256, 0, st>>>(oa, z, nw, Vd, eps, aa); });
        const double t1 = time_us([&] { hk_gdn_gated_norm(stv, ob, z, nw, n, S, Gv, eps, &ab, &e); });
        report("gdn gated norm", bad, (double)n * Vd * (4 + 4 + 4 + 1) / 1e6, t0, t1);
    }
    CK(cudaGetLastError());
    printf("%s\n", fails ? "FAIL: some kernel's bits differ" : "all kernels: the same bits as before");
    return fails ? 1 : 0;
}
