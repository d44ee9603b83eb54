// base.cu: the CUDA engine's memory, streams and graphs; the weights' upload (Q6_K and
// Q8_0 repacked so every block is 16-byte aligned, kernels.h); the embedding; RMSNorm fused
// with the rounding of its rows for the integer products, and that rounding alone
// (quant_quantize_act's bytes: Q8_K per 256, Q8_0 per 32).
#include <cuda_fp16.h>
#include <stdio.h>

#include "engine/cuda/common.cuh"
#include "engine/cuda/dq.cuh"
#include "engine/cuda/act.cuh"
#include "engine/cuda/tail.cuh"

extern "C" int hk_malloc(void **p, size_t bytes, herr *e) {
    *p = NULL;
    if (bytes == 0) return 0;
    cudaError_t err = cudaMalloc(p, bytes);
    if (err != cudaSuccess) {
        *p = NULL;
        cudaGetLastError(); /* an out-of-memory is not sticky: clear it */
        return herr_set(e, "cannot allocate %.1f MiB on the GPU: %s", (double)bytes / (1 << 20), cudaGetErrorString(err));
    }
    return 0;
}
extern "C" void hk_free(void *p) {
    if (p) cudaFree(p);
}
extern "C" int hk_host_alloc(void **p, size_t bytes, herr *e) {
    *p = NULL;
    if (bytes == 0) return 0;
    cudaError_t err = cudaMallocHost(p, bytes);
    if (err != cudaSuccess) {
        *p = NULL;
        cudaGetLastError();
        return herr_set(e, "cannot pin %.1f MiB of host memory: %s", (double)bytes / (1 << 20), cudaGetErrorString(err));
    }
    return 0;
}
extern "C" void hk_host_free(void *p) {
    if (p) cudaFreeHost(p);
}
bool hk_pdl_on = true;
extern "C" void hk_pdl(bool on) { hk_pdl_on = on; }

extern "C" int hk_stream_new(void **st, herr *e) {
    cudaStream_t s;
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), e);
    *st = (void *)s;
    return 0;
}
extern "C" void hk_stream_free(void *st) {
    if (st) cudaStreamDestroy(STREAM(st));
}
/* Done when it returns, as kernels.h promises. cudaMemcpy alone is not: from pageable host
 * memory it returns once the bytes are in the driver's staging buffer, and the DMA of the
 * last piece into d may still be under way (the runtime's "API synchronization behavior").
 * That copy is queued on the legacy stream, which the engine's streams (non-blocking) do not
 * wait for: a kernel launched on them just after could read the old bytes at d's end (a
 * restored lane, a written KV row; test_cuda's gated_tail_matches_apart read a stale lane
 * that way on an H200: the last head of the last piece). So wait for that stream here. */
extern "C" int hk_h2d(void *d, const void *h, size_t n, herr *e) {
    if (!n) return 0;
    CUDA_TRY(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), e);
    CUDA_TRY(cudaStreamSynchronize(0), e); /* 0: the stream cudaMemcpy used (this file's default) */
    return 0;
}
extern "C" int hk_d2h(void *h, const void *d, size_t n, herr *e) {
    if (n) CUDA_TRY(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), e);
    return 0;
}
extern "C" int hk_h2d_async(void *st, void *d, const void *h, size_t n, herr *e) {
    if (n) CUDA_TRY(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, STREAM(st)), e);
    return 0;
}
extern "C" int hk_d2h_async(void *st, void *h, const void *d, size_t n, herr *e) {
    if (n) CUDA_TRY(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, STREAM(st)), e);
    return 0;
}
/* done before it returns: the engine's stream does not wait for the legacy stream */
extern "C" int hk_memset(void *d, int v, size_t n, herr *e) {
    if (n) CUDA_TRY(cudaMemset(d, v, n), e);
    CUDA_TRY(cudaDeviceSynchronize(), e);
    return 0;
}
extern "C" int hk_sync(herr *e) {
    CUDA_TRY(cudaDeviceSynchronize(), e);
    return 0;
}
extern "C" int hk_stream_sync(void *st, herr *e) {
    CUDA_TRY(cudaStreamSynchronize(STREAM(st)), e);
    return 0;
}
extern "C" int hk_mem_info(size_t *free_b, size_t *total_b, herr *e) {
    CUDA_TRY(cudaMemGetInfo(free_b, total_b), e);
    return 0;
}
extern "C" bool hk_type_ok(uint32_t t) {
    bool ok = false;
    DQ_DISPATCH(t, ok = T_ >= 0);
    return ok;
}

// ------------------------------------------------------------------ graphs

extern "C" int hk_capture_begin(void *st, herr *e) {
    CUDA_TRY(cudaStreamBeginCapture(STREAM(st), cudaStreamCaptureModeRelaxed), e);
    return 0;
}
extern "C" int hk_capture_end(void *st, void **graph, herr *e) {
    cudaGraph_t g = NULL;
    *graph = NULL;
    CUDA_TRY(cudaStreamEndCapture(STREAM(st), &g), e);
    cudaGraphExec_t x = NULL;
    cudaError_t err = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (err != cudaSuccess) return herr_set(e, "cudaGraphInstantiate: %s", cudaGetErrorString(err));
    *graph = (void *)x;
    return 0;
}
extern "C" int hk_graph_launch(void *st, void *graph, herr *e) {
    CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)graph, STREAM(st)), e);
    return 0;
}
extern "C" void hk_graph_free(void *graph) {
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

extern "C" int hk_event_new(void **ev, herr *e) {
    cudaEvent_t x;
    CUDA_TRY(cudaEventCreate(&x), e);
    *ev = (void *)x;
    return 0;
}
extern "C" int hk_event_new_sync(void **ev, herr *e) {
    cudaEvent_t x;
    CUDA_TRY(cudaEventCreateWithFlags(&x, cudaEventDisableTiming), e);
    *ev = (void *)x;
    return 0;
}
extern "C" int hk_stream_wait(void *st, void *ev, herr *e) {
    CUDA_TRY(cudaStreamWaitEvent(STREAM(st), (cudaEvent_t)ev, 0), e);
    return 0;
}
extern "C" void hk_event_free(void *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}
extern "C" int hk_event_record(void *st, void *ev, herr *e) {
    CUDA_TRY(cudaEventRecord((cudaEvent_t)ev, STREAM(st)), e);
    return 0;
}
extern "C" float hk_event_ms(void *a, void *b) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b) != cudaSuccess) return 0;
    return ms;
}

// ------------------------------------------------------------------ weights

extern "C" void hk_w_bytes(uint32_t type, int64_t K, int64_t rows, size_t *d_bytes, size_t *dd_bytes) {
    *dd_bytes = 0;
    if (type == QT_Q6_K) {
        *d_bytes = (size_t)rows * (size_t)(K / QK_K) * 208;
        *dd_bytes = sizeof(uint16_t) * (size_t)rows * (size_t)(K / QK_K);
    } else if (type == QT_Q8_0) {
        *d_bytes = (size_t)rows * (size_t)K;
        *dd_bytes = sizeof(uint16_t) * (size_t)rows * (size_t)(K / QK8_0);
    } else {
        *d_bytes = (size_t)rows * qtype_row_bytes(type, K);
    }
}

// one thread per block: the file's 210 bytes (2-byte aligned) to 208 in d and the scale in dd
__global__ void repack_q6k_kernel(const uint16_t *src, int64_t n_blocks, uint16_t *d, uint16_t *dd) {
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint16_t *s = src + b * 105;
    uint16_t *o = d + b * 104;
    for (int i = 0; i < 104; i++) o[i] = s[i];
    dd[b] = s[104];
}

// one thread per block: the file's 34 bytes to 32 int8 in d and the scale in dd
__global__ void repack_q80_kernel(const uint16_t *src, int64_t n_blocks, uint16_t *d, uint16_t *dd) {
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint16_t *s = src + b * 17;
    dd[b] = s[0];
    uint16_t *o = d + b * 16;
    for (int i = 0; i < 16; i++) o[i] = s[1 + i];
}

extern "C" int hk_w_upload(hk_w *w, const void *src, int64_t rows, size_t src_row_bytes, herr *e) {
    const size_t total = src_row_bytes * (size_t)rows;
    if (w->type != QT_Q6_K && w->type != QT_Q8_0) return hk_h2d((void *)w->d, src, total, e);
    /* through a staging buffer of whole rows, at most ~256 MiB at a time */
    const int64_t per = (int64_t)((256u << 20) / src_row_bytes) > 0 ? (int64_t)((256u << 20) / src_row_bytes) : 1;
    const int64_t chunk_rows = per < rows ? per : rows;
    void *tmp;
    if (hk_malloc(&tmp, src_row_bytes * (size_t)chunk_rows, e) < 0) return -1;
    const int64_t blocks_per_row = w->type == QT_Q6_K ? w->K / QK_K : w->K / QK8_0;
    const size_t dst_block = w->type == QT_Q6_K ? 208 : 32;
    int rc = 0;
    for (int64_t r0 = 0; r0 < rows && rc == 0; r0 += chunk_rows) {
        const int64_t nr = rows - r0 < chunk_rows ? rows - r0 : chunk_rows, nbk = nr * blocks_per_row;
        if (hk_h2d(tmp, (const uint8_t *)src + (size_t)r0 * src_row_bytes, src_row_bytes * (size_t)nr, e) < 0) {
            rc = -1;
            break;
        }
        uint16_t *d = (uint16_t *)((uint8_t *)w->d + (size_t)(r0 * blocks_per_row) * dst_block);
        uint16_t *dd = (uint16_t *)w->dd + r0 * blocks_per_row;
        if (w->type == QT_Q6_K) repack_q6k_kernel<<<blocks_of(nbk, 256), 256>>>((const uint16_t *)tmp, nbk, d, dd);
        else repack_q80_kernel<<<blocks_of(nbk, 256), 256>>>((const uint16_t *)tmp, nbk, d, dd);
        cudaError_t err = cudaDeviceSynchronize();
        if (err == cudaSuccess) err = cudaGetLastError();
        if (err != cudaSuccess) rc = herr_set(e, "repacking %s: %s", qtype_name(w->type), cudaGetErrorString(err));
    }
    hk_free(tmp);
    return rc;
}

extern "C" int hk_quantize(void *st, const float *x, int64_t xs, int64_t n, hk_act *a, herr *e) {
    if (n == 0) return 0;
    if (a->K % 256 || xs % 4) return herr_set(e, "hk_quantize: rows of %lld are no blocks of 256", (long long)a->K);
    dim3 g((unsigned)n, blocks_of(a->K / 256, 8));
    LAUNCH(e, quantize_kernel<>, g, 256, 0, st, x, xs, *a);
    return 0;
}

// ------------------------------------------------------------------ embedding, norms

template <int T> __global__ void embed_kernel(const uint8_t *w, size_t row_bytes, const int32_t *ids, int64_t E, float *x) {
    pdl_enter();
    const int64_t r = blockIdx.y;
    const uint8_t *row = w + (size_t)ids[r] * row_bytes;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < E; i += (int64_t)gridDim.x * blockDim.x)
        x[r * E + i] = dq<T>(row, i);
}

extern "C" int hk_embed(void *st, const hk_w *te, const int32_t *ids, int64_t n, float *x, herr *e) {
    if (n == 0) return 0;
    dim3 g(blocks_of(te->K, 256), (unsigned)n);
    DQ_DISPATCH(te->type, LAUNCH(e, embed_kernel<T_>, g, 256, 0, st, (const uint8_t *)te->d, te->row_bytes, ids, te->K, x));
    return 0;
}

extern "C" int hk_rmsnorm(void *st, const float *x, const int32_t *rows, const float *w, float *y, int64_t n, int64_t E,
                          float eps, hk_act *a, hk_act *a2, herr *e) {
    if (n == 0) return 0;
    hk_act none = {0};
    if ((a || a2) && E % 256) return herr_set(e, "hk_rmsnorm: rows of %lld cannot be rounded in blocks of 256", (long long)E);
    if (rows_form(E, x, y, NULL, NULL))
        LAUNCH(e, rmsnorm_rows_kernel<>, (unsigned)n, (unsigned)(E / 8), sizeof(float) * (size_t)E, st, x, rows, w, y, E, eps,
               a ? *a : none, a2 ? *a2 : none);
    else
        LAUNCH(e, rmsnorm_kernel<>, (unsigned)n, NORM_THREADS, 0, st, x, rows, w, y, E, eps, a ? *a : none, a2 ? *a2 : none);
    return 0;
}
