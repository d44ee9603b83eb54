// bench/point_copy.cu: what copying one point off the GPU costs, by way of copy, at q36's
// point size (30 GDN layers: lanes 32 heads x 128 x 128 floats, rings 3 x 8192 floats; 65.8 MB).
// The CUDA engine copies each point of a pass into the caller's engine_point (calloc'd host
// memory) with cudaMemcpy after the pass; this times the ways it could:
//   pageable, fresh    cudaMemcpy into newly calloc'd memory (what the engine does: a new point)
//   pageable, reused   cudaMemcpy into memory written before (a point reused from a pool)
//   pinned             cudaMemcpyAsync into cudaMallocHost memory, then synchronize
//   pinned + memcpy    the same, then memcpy into newly calloc'd memory (a pinned staging area)
//   pinned + memcpy reused   ... into memory written before
//   mmap populate      cudaMemcpy into new mmap(MAP_POPULATE) memory, the mmap timed too
//   mmap hugepage      cudaMemcpy into new mmap memory advised MADV_HUGEPAGE, the mmap timed too
// Medians (min..max) of REPS copies, ms, and GB/s at the median.
//   nvcc -O2 -o /tmp/point_copy bench/point_copy.cu && /tmp/point_copy [REPS]
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *ms, int n, size_t bytes) {
    qsort(ms, n, sizeof *ms, cmp);
    const double med = ms[n / 2];
    printf("| %s | %.2f (%.2f..%.2f) | %.1f |\n", what, med, ms[0], ms[n - 1], bytes / med / 1e6);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 9;
    const size_t lanes = 30ull * 32 * 128 * 128 * 4, rings = 30ull * 3 * 8192 * 4, bytes = lanes + rings;
    void *d, *pin;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemset(d, 1, bytes));
    CK(cudaMallocHost(&pin, bytes));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    double *ms = (double *)malloc(sizeof(double) * reps);
    char *reused = (char *)calloc(1, bytes);
    memset(reused, 2, bytes);
    printf("point of %.1f MB, %d copies each\n\n| way | ms, median (min..max) | GB/s |\n|---|---:|---:|\n", bytes / 1e6, reps);
    for (int i = 0; i < reps; i++) {
        char *h = (char *)calloc(1, bytes);
        double t0 = now();
        CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
        ms[i] = (now() - t0) * 1e3;
        free(h);
    }
    report("pageable, fresh", ms, reps, bytes);
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        CK(cudaMemcpy(reused, d, bytes, cudaMemcpyDeviceToHost));
        ms[i] = (now() - t0) * 1e3;
    }
    report("pageable, reused", ms, reps, bytes);
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        CK(cudaMemcpyAsync(pin, d, bytes, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        ms[i] = (now() - t0) * 1e3;
    }
    report("pinned", ms, reps, bytes);
    for (int i = 0; i < reps; i++) {
        char *h = (char *)calloc(1, bytes);
        double t0 = now();
        CK(cudaMemcpyAsync(pin, d, bytes, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        memcpy(h, pin, bytes);
        ms[i] = (now() - t0) * 1e3;
        free(h);
    }
    report("pinned + memcpy, fresh", ms, reps, bytes);
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        CK(cudaMemcpyAsync(pin, d, bytes, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        memcpy(reused, pin, bytes);
        ms[i] = (now() - t0) * 1e3;
    }
    report("pinned + memcpy, reused", ms, reps, bytes);
    for (int huge = 0; huge < 2; huge++) { /* new mapped memory: populated up front, or huge pages */
        for (int i = 0; i < reps; i++) {
            double t0 = now();
            void *h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (huge ? 0 : MAP_POPULATE), -1, 0);
            if (h == MAP_FAILED) { perror("mmap"); exit(1); }
            if (huge) madvise(h, bytes, MADV_HUGEPAGE);
            CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
            ms[i] = (now() - t0) * 1e3;
            munmap(h, bytes);
        }
        report(huge ? "mmap hugepage, fresh" : "mmap populate, fresh", ms, reps, bytes);
    }
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        void *p2;
        CK(cudaMallocHost(&p2, bytes));
        ms[i] = (now() - t0) * 1e3;
        CK(cudaFreeHost(p2));
    }
    report("cudaMallocHost of a point (no copy)", ms, reps, bytes);
    return 0;
}
