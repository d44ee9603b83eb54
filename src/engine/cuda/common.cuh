// common.cuh: what every kernel file of the CUDA engine shares: launches (programmatic
// dependent launch) and their error returns, the stream cast; and warp.cuh's device helpers.
#ifndef HEARTH_CUDA_COMMON_CUH
#define HEARTH_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "engine/cuda/kernels.h"
}
#include "engine/cuda/warp.cuh"

#define CUDA_TRY(call, e)                                                                       \
    do {                                                                                        \
        cudaError_t err_ = (call);                                                              \
        if (err_ != cudaSuccess) return herr_set(e, "%s: %s", #call, cudaGetErrorString(err_)); \
    } while (0)

#define STREAM(st) ((cudaStream_t)(st))

// *sms = the current device's SM count, read on the first call (the grid choices that depend
// on it: attn.cu's split form, gdn.cu's state kernel width); -1 with e set on a CUDA error
static inline int dev_sms(int *sms, herr *e) {
    if (*sms) return 0;
    int dev;
    CUDA_TRY(cudaGetDevice(&dev), e);
    CUDA_TRY(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev), e);
    return 0;
}

extern bool hk_pdl_on;

template <typename... P, typename... A>
static cudaError_t launch_k(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, void *st, A &&...args) {
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = STREAM(st);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = hk_pdl_on ? 1 : 0;
    c.attrs = at;
    c.numAttrs = 1;
    return cudaLaunchKernelEx(&c, kernel, static_cast<A &&>(args)...);
}

// launch_k, returning -1 with e set (naming the calling function) when the launch failed
#define LAUNCH(e, kernel, grid, block, smem, st, ...)                                                   \
    do {                                                                                                \
        cudaError_t err_ = launch_k(kernel, grid, block, smem, st, __VA_ARGS__);                        \
        if (err_ != cudaSuccess) {                                                                      \
            cudaGetLastError();                                                                         \
            return herr_set(e, "%s: %s", __func__, cudaGetErrorString(err_));                           \
        }                                                                                               \
    } while (0)

static inline unsigned blocks_of(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

#endif
