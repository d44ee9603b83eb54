// bench/wgmma_probe.cu: two facts the prompt attention's next form needs from the GPU itself
// (F11: at 32k the whole form is latency-bound at 1.5 warps a scheduler, bench/RESULTS.md,
// thirteenth session; wgmma is the way to more work a warp):
//   1. whether wgmma (a warpgroup's m64nNk16, f16 in, f32 accumulators) gives, bit for bit,
//      the sums mma.sync m16n8k16 gives over the same k-steps in the same order. If it does,
//      the prompt kernel can move to wgmma while the decode and split forms keep mma.sync and
//      decode = prefill still holds; if not, every form has to move together.
//   2. which of the shared-memory descriptor's two byte offsets (LBO, SBO) is the step along K
//      and which the step along M/N for operands without swizzle, K-major (Q, K) and MN-major
//      (V, read transposed): the probe lays its tiles out one way and tries both readings;
//      the reading that matches is the layout's.
// One CTA of 128 threads (one warpgroup): A 64 x 64 (four k-steps of 16), B 64 x 32, D = A B,
// accumulated k-step by k-step from zero and from a random start; values +-(1 + u) 2^e,
// e in [-6, 6], so the sums round and cancel. Each variant's D is compared with mma.sync's,
// bit for bit, per element. Prints a line a variant; exit 0 whatever it finds (a probe).
//   nvcc -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_probe bench/wgmma_probe.cu && /tmp/wgmma_probe
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } \
    } while (0)

enum { M = 64, N = 32, K = 64, KS = K / 16, TRIALS = 8 };

// D (64 x 32) of a trial, one variant: [M][N] floats
struct probe_out {
    float d[M * N];
};

__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// a shared-memory matrix descriptor: start address, leading and stride byte offsets (all >> 4),
// no swizzle (bits 62-63 zero), base offset zero
__device__ __forceinline__ uint64_t desc(const void *p, uint32_t lbo, uint32_t sbo) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a >> 4) & 0x3FFF) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 | (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
}

#define D16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define DOUT(d)                                                                                                      \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),          \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])

// D += A B, m64n32k16: A and B from shared memory (B K-major: trans-b 0; MN-major: 1)
template <int TB> __device__ __forceinline__ void wg_ss(float d[16], uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " D16 ", %16, %17, 1, 1, 1, 0, %18;"
                 : DOUT(d)
                 : "l"(da), "l"(db), "n"(TB));
}
// D += A B, m64n32k16: A from registers (the mma.sync A fragment of the warp's 16 rows)
template <int TB> __device__ __forceinline__ void wg_rs(float d[16], const uint32_t a[4], uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " D16 ", {%16,%17,%18,%19}, %20, 1, 1, 1, %21;"
                 : DOUT(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB));
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ uint32_t h2(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | (uint32_t)__half_as_ushort(hi) << 16;
}

// variants: 0 mma.sync (the reference); 1, 2 A and B (K-major) from shared memory, offsets read
// one way and the other; 3, 4 A from registers, B K-major, the two readings; 5, 6 A from
// registers, B MN-major (transposed), the two readings
__global__ void __launch_bounds__(128) probe_kernel(const __half *A, const __half *B, const float *C0, int variant, probe_out *out) {
    // core matrices: 8 rows x 16 bytes (8 halves), 128 contiguous bytes each
    __shared__ __align__(128) __half sa[KS][M / 8][2][8][8];     // A: k-step, row group, k half, row, k
    __shared__ __align__(128) __half sbk[KS][N / 8][2][8][8];    // B K-major: k-step, n group, k half, n, k
    __shared__ __align__(128) __half sbm[KS][2][N / 8][8][8];    // B MN-major: k-step, k group, n group, k, n
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    for (int i = tid; i < M * K; i += 128) {
        const int r = i / K, k = i % K;
        sa[k / 16][r / 8][(k % 16) / 8][r % 8][k % 8] = A[i];
    }
    for (int i = tid; i < K * N; i += 128) {
        const int k = i / N, n = i % N;
        sbk[k / 16][n / 8][(k % 16) / 8][n % 8][k % 8] = B[i];
        sbm[k / 16][(k % 16) / 8][n / 8][k % 8][n % 8] = B[i];
    }
    proxy_fence();
    __syncthreads();
    // the thread's D entries, in the m16n8 C layout per warp and 8-column block j:
    // (16 w + g, 8 j + 2 t), (.., + 1), (16 w + g + 8, 8 j + 2 t), (.., + 1)
    float d[16];
    for (int j = 0; j < 4; j++)
        for (int q = 0; q < 4; q++) {
            const int r = 16 * w + g + 8 * (q / 2), c = 8 * j + 2 * t + q % 2;
            d[4 * j + q] = C0 ? C0[r * N + c] : 0.0f;
        }
    for (int s = 0; s < KS; s++) {
        uint32_t a[4];
        {
            const int r0 = 16 * w + g, k0 = 16 * s + 2 * t;
            a[0] = h2(A[r0 * K + k0], A[r0 * K + k0 + 1]);
            a[1] = h2(A[(r0 + 8) * K + k0], A[(r0 + 8) * K + k0 + 1]);
            a[2] = h2(A[r0 * K + k0 + 8], A[r0 * K + k0 + 9]);
            a[3] = h2(A[(r0 + 8) * K + k0 + 8], A[(r0 + 8) * K + k0 + 9]);
        }
        if (variant == 0) {
            for (int j = 0; j < 4; j++) {
                const int n = 8 * j + g, k0 = 16 * s + 2 * t;
                const uint32_t b[2] = {h2(B[k0 * N + n], B[(k0 + 1) * N + n]), h2(B[(k0 + 8) * N + n], B[(k0 + 9) * N + n])};
                mma16816(&d[4 * j], a, b);
            }
            continue;
        }
        // K-major layouts: K-adjacent core matrices 128 bytes apart, M/N-adjacent 256
        const uint64_t a1 = desc(&sa[s][0][0][0][0], 128, 256), a2 = desc(&sa[s][0][0][0][0], 256, 128);
        const uint64_t b1 = desc(&sbk[s][0][0][0][0], 128, 256), b2 = desc(&sbk[s][0][0][0][0], 256, 128);
        // MN-major B: N-adjacent core matrices 128 bytes apart, K-adjacent 512
        const uint64_t m1 = desc(&sbm[s][0][0][0][0], 128, 512), m2 = desc(&sbm[s][0][0][0][0], 512, 128);
        wg_fence();
        switch (variant) {
        case 1: wg_ss<0>(d, a1, b1); break;
        case 2: wg_ss<0>(d, a2, b2); break;
        case 3: wg_rs<0>(d, a, b1); break;
        case 4: wg_rs<0>(d, a, b2); break;
        case 5: wg_rs<1>(d, a, m1); break;
        default: wg_rs<1>(d, a, m2); break;
        }
        wg_commit_wait();
    }
    for (int j = 0; j < 4; j++)
        for (int q = 0; q < 4; q++) {
            const int r = 16 * w + g + 8 * (q / 2), c = 8 * j + 2 * t + q % 2;
            out->d[r * N + c] = d[4 * j + q];
        }
}

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}
static __half rval(void) {
    const int e = (int)(urand() * 13) - 6;
    const double v = (urand() < 0.5 ? -1 : 1) * (1 + urand()) * ldexp(1.0, e);
    return __float2half_rn((float)v);
}

int main(void) {
    static const char *names[7] = {"mma.sync m16n8k16 (reference)", "wgmma A, B smem K-major, LBO = K step",
                                   "wgmma A, B smem K-major, LBO = M/N step", "wgmma A regs, B K-major, LBO = K step",
                                   "wgmma A regs, B K-major, LBO = N step", "wgmma A regs, B MN-major (trans), LBO = N step",
                                   "wgmma A regs, B MN-major (trans), LBO = K step"};
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    printf("wgmma_probe on %s (sm_%d%d): %d trials of D (64 x 32) = A (64 x 64) B (64 x 32), 4 k-steps, from zero and from a "
           "random start\n", pr.name, pr.major, pr.minor, TRIALS);
    __half *hA = (__half *)malloc(sizeof(__half) * M * K), *hB = (__half *)malloc(sizeof(__half) * K * N);
    float *hC = (float *)malloc(sizeof(float) * M * N);
    __half *dA, *dB;
    float *dC;
    probe_out *dout, *ref = (probe_out *)malloc(sizeof(probe_out)), *got = (probe_out *)malloc(sizeof(probe_out));
    CK(cudaMalloc(&dA, sizeof(__half) * M * K));
    CK(cudaMalloc(&dB, sizeof(__half) * K * N));
    CK(cudaMalloc(&dC, sizeof(float) * M * N));
    CK(cudaMalloc(&dout, sizeof(probe_out)));
    long bad[7][2] = {{0}}, cnt = 0;
    double worst[7] = {0};
    for (int tr = 0; tr < TRIALS; tr++) {
        for (int i = 0; i < M * K; i++) hA[i] = rval();
        for (int i = 0; i < K * N; i++) hB[i] = rval();
        for (int i = 0; i < M * N; i++) hC[i] = (float)((urand() - 0.5) * 4096.0);
        CK(cudaMemcpy(dA, hA, sizeof(__half) * M * K, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dB, hB, sizeof(__half) * K * N, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dC, hC, sizeof(float) * M * N, cudaMemcpyHostToDevice));
        for (int from = 0; from < 2; from++) {
            for (int v = 0; v < 7; v++) {
                probe_kernel<<<1, 128>>>(dA, dB, from ? dC : NULL, v, dout);
                CK(cudaGetLastError());
                CK(cudaMemcpy(v ? got : ref, dout, sizeof(probe_out), cudaMemcpyDeviceToHost));
                if (!v) continue;
                for (int i = 0; i < M * N; i++) {
                    if (memcmp(&got->d[i], &ref->d[i], 4)) bad[v][from]++;
                    const double e = fabs((double)got->d[i] - ref->d[i]) / (fabs((double)ref->d[i]) + 1e-30);
                    if (e > worst[v]) worst[v] = e;
                }
            }
        }
        cnt += M * N;
    }
    for (int v = 1; v < 7; v++)
        printf("  %-52s %6ld + %6ld of %ld + %ld entries differ from mma.sync (from zero + from a start), worst rel %.3g%s\n", names[v],
               bad[v][0], bad[v][1], cnt, cnt, worst[v], !bad[v][0] && !bad[v][1] ? ": the same bits" : worst[v] > 1e-2 ? ": another layout" : "");
    return 0;
}
