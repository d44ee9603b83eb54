// dequant.cu: block dequantizers on the GPU (one thread per weight, dq.cuh's reads) and
// device discovery. Results are checked bit for bit against the CPU dequantizers, since
// both do the same f32 multiply-adds.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "engine/cuda/cuda.h"
}
#include "engine/cuda/common.cuh"
#include "engine/cuda/dq.cuh"

// one thread per output weight, i = row * k + col
template <int T> __global__ void dequant_kernel(const uint8_t *src, float *dst, int64_t n, int64_t k, size_t row_bytes) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dst[i] = dq<T>(src + (size_t)(i / k) * row_bytes, i % k);
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
    CUDA_TRY(cudaGetDeviceProperties(&p, dev), e);
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
    CUDA_TRY(cudaMalloc(&d_src, rb * (size_t)n_rows), e);
    CUDA_TRY(cudaMalloc(&d_dst, sizeof(float) * (size_t)n), e);
    CUDA_TRY(cudaMemcpy(d_src, src, rb * (size_t)n_rows, cudaMemcpyHostToDevice), e);
    const int threads = 256;
    const unsigned blocks = (unsigned)((n + threads - 1) / threads);
    DQ_DISPATCH(t, (dequant_kernel<T_><<<blocks, threads>>>(d_src, d_dst, n, k, rb)));
    CUDA_TRY(cudaGetLastError(), e);
    CUDA_TRY(cudaMemcpy(dst, d_dst, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost), e);
    CUDA_TRY(cudaFree(d_src), e);
    CUDA_TRY(cudaFree(d_dst), e);
    return 0;
}
