/* cuda.h: the CUDA backend's C face. Built only where nvcc is found (HEARTH_CUDA); every
 * function here is extern "C" and returns an error code or a herr, never a C++ exception.
 * Today it holds device discovery and the block dequantizers the CUDA engine will build
 * on; each is checked against the CPU's quant_dequantize_row (tests/unit/test_cuda.c). */
#ifndef HEARTH_CUDA_H
#define HEARTH_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 (and a reason in e) when there is no driver or GPU. */
int hcuda_device_count(herr *e);
/* "NVIDIA H200, sm_90, 139.8 GiB" into buf. */
int hcuda_device_name(int dev, char *buf, size_t n, herr *e);
/* Dequantizes n_rows rows of k weights of ggml type t from host src to host dst (f32),
 * on the GPU. Types: F32 F16 BF16 Q8_0 Q4_K Q5_K Q6_K. */
int hcuda_dequantize(uint32_t t, const void *src, float *dst, int64_t n_rows, int64_t k, herr *e);

#ifdef __cplusplus
}
#endif

#endif
