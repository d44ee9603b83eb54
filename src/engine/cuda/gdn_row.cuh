// gdn_row.cuh: the delta rule row by row (HEARTH_CUDA_GDN_CHUNK=0; gdn.cu's hk_gdn_delta
// launches it), with decode's gated norm as its tail (tail.cuh's gated_tail). A header so
// that tests/unit/test_fused_emu.cc runs it on the CPU too (tests/unit/cuda_emu.h), as it
// runs the chunked form's state kernel. The includer defines KMUT (gdn.cu: the gates'
// planted defects) and includes tail.cuh.
#ifndef HEARTH_CUDA_GDN_ROW_CUH
#define HEARTH_CUDA_GDN_ROW_CUH

#define DS 128   /* the lane's side */
#define DCOLS 32 /* columns per block */
#define DCH 16   /* rows staged in shared memory at a time */

// grid (Gv * 4, n_pieces), 128 threads: value head h = blockIdx.x / 4, columns
// c0..c0+31 (c0 = 32 (blockIdx.x % 4)); warp w holds st[i] = S[32w + i][c0 + lane].
__global__ void __launch_bounds__(128) delta_kernel(const float *cv, const float *b, const float *a, float *lane0,
                                                    size_t seq_stride, const hk_piece *pieces, const hk_mark *marks,
                                                    float *stage0, size_t stage_stride, int64_t Gk, int64_t Gv, int64_t cd,
                                                    hk_gtail gt, float *o) {
    pdl_enter();
    __shared__ __align__(16) float qs[DCH][DS], ks[DCH][DS], vs[DCH][DCOLS];
    __shared__ float bs[DCH], gs[DCH];
    __shared__ float part[4][DCOLS];
    const int64_t h = blockIdx.x / 4, hk = h % Gk, c0 = (int64_t)(blockIdx.x % 4) * DCOLS;
    const hk_piece *pc = &pieces[blockIdx.y];
    const int tid = threadIdx.x, w = tid / 32, lane = tid & 31;
    const int64_t col = c0 + lane;
    float *lane_p = lane0 + (size_t)pc->seq * seq_stride + (size_t)(h * DS * DS);
    float st[32];
#pragma unroll
    for (int i = 0; i < 32; i++) st[i] = lane_p[(32 * w + i) * DS + col];
    int mk = 0;
    /* a chunk of DCH rows' q, k (8 float4 a thread), the block's v columns (one float4), beta
     * and gate: the next chunk's loads are in flight while this one is computed */
    float4 pq[8], pv;
    float pb = 0.0f, pg = 0.0f;
    auto fetch = [&](int64_t t0) {
        const int nrows = pc->n - t0 < DCH ? (int)(pc->n - t0) : DCH;
#pragma unroll
        for (int it = 0; it < 8; it++) {
            const int i = tid + 128 * it, rr = i / 64, c4 = i % 64;
            pq[it] = make_float4(0, 0, 0, 0);
            if (rr < nrows) {
                const float *row = cv + (pc->r0 + t0 + rr) * cd;
                pq[it] = c4 < 32 ? ((const float4 *)(row + hk * DS))[c4] : ((const float4 *)(row + Gk * DS + hk * DS))[c4 - 32];
            }
        }
        const int rv = tid / 8, c8 = tid % 8;
        pv = rv < nrows ? ((const float4 *)(cv + (pc->r0 + t0 + rv) * cd + 2 * Gk * DS + h * DS + c0))[c8] : make_float4(0, 0, 0, 0);
        if (tid < nrows) pb = b[(pc->r0 + t0 + tid) * Gv + h], pg = a[(pc->r0 + t0 + tid) * Gv + h];
    };
    fetch(0);
    for (int64_t t0 = 0; t0 < pc->n; t0 += DCH) {
        const int nrows = pc->n - t0 < DCH ? (int)(pc->n - t0) : DCH;
        __syncthreads(); /* the previous rows are done with the stage */
#pragma unroll
        for (int it = 0; it < 8; it++) {
            const int i = tid + 128 * it, rr = i / 64, c4 = i % 64;
            if (c4 < 32) *(float4 *)&qs[rr][4 * c4] = pq[it];
            else *(float4 *)&ks[rr][4 * (c4 - 32)] = pq[it];
        }
        *(float4 *)&vs[tid / 8][4 * (tid % 8)] = pv;
        if (tid < nrows) bs[tid] = pb, gs[tid] = expf(pg);
        __syncthreads();
        if (t0 + DCH < pc->n) fetch(t0 + DCH);
        for (int rr = 0; rr < nrows; rr++) {
            const float eg = gs[rr];
            if (KMUT(M_COPY_EARLY))
                for (; mk < pc->n_marks && marks[pc->mark0 + mk].m == t0 + rr + 1; mk++) {
                    float *dst = stage0 + (size_t)marks[pc->mark0 + mk].slot * stage_stride + (size_t)(h * DS * DS);
                    for (int i = 0; i < 32; i++) dst[(32 * w + i) * DS + col] = st[i];
                }
            const float *kk = ks[rr] + 32 * w, *qq = qs[rr] + 32 * w;
            float kv = 0;
#pragma unroll
            for (int i = 0; i < 32; i++) {
                st[i] *= eg;
                kv = fmaf(st[i], kk[i], kv);
            }
            part[w][lane] = kv;
            __syncthreads();
            kv = (part[0][lane] + part[1][lane]) + (part[2][lane] + part[3][lane]);
            const float d = bs[rr] * (vs[rr][lane] - kv);
            float out = 0;
#pragma unroll
            for (int i = 0; i < 32; i++) {
                st[i] = fmaf(kk[i], d, st[i]);
                out = fmaf(st[i], qq[i], out);
            }
            __syncthreads(); /* every warp has read part */
            part[w][lane] = out;
            __syncthreads();
            if (w == 0) {
                const int64_t r = pc->r0 + t0 + rr;
                o[r * (Gv * DS) + h * DS + col] = (part[0][lane] + part[1][lane]) + (part[2][lane] + part[3][lane]);
            }
            const int64_t t = t0 + rr;
            while (mk < pc->n_marks && marks[pc->mark0 + mk].m + (KMUT(M_COPY_LATE) ? 1 : 0) == t + 1) {
                float *dst = stage0 + (size_t)marks[pc->mark0 + mk].slot * stage_stride + (size_t)(h * DS * DS);
                if (KMUT(M_POINT_INPLACE))
                    for (int i = 0; i < 32; i++) st[i] = __int_as_float(__float_as_int(st[i]) ^ 1);
#pragma unroll
                for (int i = 0; i < 32; i++) dst[(32 * w + i) * DS + col] = st[i];
                mk++;
            }
            __syncthreads(); /* part is read before the next row writes it */
        }
    }
#pragma unroll
    for (int i = 0; i < 32; i++) lane_p[(32 * w + i) * DS + col] = st[i];
    if (gt.z) gated_tail(gt, o, pc->r0, h, Gv);
}

#endif
