// dequant.cu: block dequantizers on the GPU (one thread per weight, blocks read in place)
// and device discovery. The layouts are quant.h's (ggml's); results are checked bit for
// bit against the CPU dequantizers, since both do the same f32 multiply-adds.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "engine/cuda/cuda.h"
#include "format/quant.h"
}

#define CUDA_OK(call, e)                                                                  \
    do {                                                                                  \
        cudaError_t err_ = (call);                                                        \
        if (err_ != cudaSuccess)                                                          \
            return herr_set(e, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
    } while (0)

__device__ static float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

__device__ static void k_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// one thread per output weight; _rn intrinsics keep nvcc from fusing into FMAs, so the
// rounding is the CPU's: d*sc first, then times q, minus dmin*m: i = row * k + col
__global__ void dequant_kernel(uint32_t t, const uint8_t *src, float *dst, int64_t n, int64_t k, size_t row_bytes) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int64_t row = i / k, col = i % k;
    const uint8_t *r = src + (size_t)row * row_bytes;
    float v = 0;
    switch (t) {
    case QT_F32: v = ((const float *)r)[col]; break;
    case QT_F16: v = h2f(((const uint16_t *)r)[col]); break;
    case QT_BF16: v = __uint_as_float((uint32_t)((const uint16_t *)r)[col] << 16); break;
    case QT_Q8_0: {
        const block_q8_0 *b = (const block_q8_0 *)r + col / QK8_0;
        v = h2f(b->d) * (float)b->qs[col % QK8_0];
        break;
    }
    case QT_Q4_K: {
        const block_q4_K *b = (const block_q4_K *)r + col / QK_K;
        int j = (int)(col % QK_K), sub = j / 32, l = j % 32;
        uint8_t sc, m;
        k_scale_min(sub, b->scales, &sc, &m);
        uint8_t q = b->qs[(sub / 2) * 32 + l];
        q = (sub & 1) ? (q >> 4) : (q & 0xF);
        v = __fsub_rn(__fmul_rn(__fmul_rn(h2f(b->d), (float)sc), (float)q), __fmul_rn(h2f(b->dmin), (float)m));
        break;
    }
    case QT_Q5_K: {
        const block_q5_K *b = (const block_q5_K *)r + col / QK_K;
        int j = (int)(col % QK_K), sub = j / 32, l = j % 32;
        uint8_t sc, m;
        k_scale_min(sub, b->scales, &sc, &m);
        uint8_t q = b->qs[(sub / 2) * 32 + l];
        q = (sub & 1) ? (q >> 4) : (q & 0xF);
        q += ((b->qh[l] >> sub) & 1) << 4;
        v = __fsub_rn(__fmul_rn(__fmul_rn(h2f(b->d), (float)sc), (float)q), __fmul_rn(h2f(b->dmin), (float)m));
        break;
    }
    case QT_Q6_K: {
        const block_q6_K *b = (const block_q6_K *)r + col / QK_K;
        int j = (int)(col % QK_K), half = j / 128, jj = j % 128, l = jj % 32, quarter = jj / 32;
        const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
        const int8_t *sc = b->scales + 8 * half;
        int q;
        switch (quarter) {
        case 0: q = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32; break;
        case 1: q = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32; break;
        case 2: q = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32; break;
        default: q = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32; break;
        }
        v = __fmul_rn(__fmul_rn(h2f(b->d), (float)sc[l / 16 + 2 * quarter]), (float)q);
        break;
    }
    default: v = __int_as_float(0x7fc00000); break;
    }
    dst[i] = v;
}

extern "C" int hcuda_device_count(herr *e) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        herr_set(e, "no CUDA device: %s", cudaGetErrorString(err));
        return 0;
    }
    if (n == 0) herr_set(e, "no CUDA device");
    return n;
}

extern "C" int hcuda_device_name(int dev, char *buf, size_t n, herr *e) {
    cudaDeviceProp p;
    CUDA_OK(cudaGetDeviceProperties(&p, dev), e);
    snprintf(buf, n, "%s, sm_%d%d, %.1f GiB", p.name, p.major, p.minor, (double)p.totalGlobalMem / (1 << 30));
    return 0;
}

extern "C" int hcuda_dequantize(uint32_t t, const void *src, float *dst, int64_t n_rows, int64_t k, herr *e) {
    if (!qtype_supported(t) || t == QT_Q8_K) return herr_set(e, "hcuda_dequantize: type %s not supported", qtype_name(t));
    size_t rb = qtype_row_bytes(t, k);
    if (rb == 0) return herr_set(e, "hcuda_dequantize: row of %lld is not whole blocks of %s", (long long)k, qtype_name(t));
    const int64_t n = n_rows * k;
    uint8_t *d_src = NULL;
    float *d_dst = NULL;
    CUDA_OK(cudaMalloc(&d_src, rb * (size_t)n_rows), e);
    CUDA_OK(cudaMalloc(&d_dst, sizeof(float) * (size_t)n), e);
    CUDA_OK(cudaMemcpy(d_src, src, rb * (size_t)n_rows, cudaMemcpyHostToDevice), e);
    const int threads = 256;
    dequant_kernel<<<(unsigned)((n + threads - 1) / threads), threads>>>(t, d_src, d_dst, n, k, rb);
    CUDA_OK(cudaGetLastError(), e);
    CUDA_OK(cudaMemcpy(dst, d_dst, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost), e);
    CUDA_OK(cudaFree(d_src), e);
    CUDA_OK(cudaFree(d_dst), e);
    return 0;
}
