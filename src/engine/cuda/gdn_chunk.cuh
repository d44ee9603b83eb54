// gdn_chunk.cuh: the gated delta rule in the chunked WY form (chunks of 64 rows), device
// code only: the prep kernel (per value head and chunk: decays, the triangular solve, W, U)
// and the state kernel (per value head, 32 columns and piece: the chunks in order, the
// outputs, the points, the end state). gdn.cu includes it (host wrapper, mutants); so does
// tests/unit/test_gdn_chunk.cc, through a CPU emulation of the execution model
// (tests/unit/cuda_emu.h). The includer defines KMUT(bit) and M_COPY_LATE, M_COPY_EARLY,
// M_POINT_INPLACE, M_DECAY_SKIP (the planted defects, gdn.cu). Off by default (HEARTH_CUDA_GDN_CHUNK=1): it has run only under the
// emulation so far, never on a GPU.
//
// The form, per value head h (key head h % Gk), lane S (128 x 128, rows the key dim) and
// chunk of L <= 64 rows with start state S0; a_i the row's log decay, beta_i its gate:
//   G_i   = a_0 + a_1 + ... + a_i                       (summed in that order)
//   nA_ij = -beta_i (k_i . k_j) exp(G_i - G_j)           j < i
//   W_i   = beta_i exp(G_i) k_i + sum_{j<i} nA_ij W_j   (W = T beta exp(G) K, T = (I + A)^-1,
//   U_i   = beta_i v_i        + sum_{j<i} nA_ij U_j      forward substitution, j ascending)
//   V'_i  = U_i - W_i^T S0                               (the delta of row i)
//   O_i   = exp(G_i) S0^T q_i + sum_{j<=i} QK_ij V'_j,   QK_ij = (q_i . k_j) exp(G_i - G_j)
//   S(e)  = exp(G_e) S0 + sum_{j<=e} exp(G_e - G_j) k_j V'_j^T   (the state after row e)
// The pass goes on from S(L-1). Exactness: every row's quantities (G_i, nA_i., W_i, U_i,
// QK_i., V'_i, O_i) are computed by loops over rows j <= i only, with explicit roundings
// (__fmaf_rn, __fmul_rn, __fadd_rn: no contraction can differ between two sites), so their
// bits do not depend on whether rows past i exist. S(e) is one routine of e (end_state):
// a mark m inside a chunk is S(m-1-c0) over the same rows, which is what a prefill of
// exactly [0, m) computes for its last, partial chunk; marks are computed from S0 before the
// chunk's own end state and write only the staging area, so the pass's outputs and end state
// do not move. A one-row piece (decode) runs the same state kernel with its row's W_0, U_0,
// QK_00 made in place by the prep's expressions at i = 0 (the sums over j < 0 are empty,
// exp(G_0 - G_0) = 1): so a step is the bits of a one-row prefill and of a point at m = 1,
// in one launch. Chunks are laid by the host from each piece's start and restarted at the
// span's anchors (a piece starts on its span's grid); a block computes one piece (state) or
// one chunk (prep) from that piece's rows alone, so other pieces move no bit.
//
// Cost and limits: the prep's triangular solve is a column a thread, row after row (no
// blocked solve yet); the state kernel walks a piece's chunks in order with 193 KB of shared
// memory (one block an SM), so a pass of many long pieces runs in waves. The GPU's bits are
// not the CPU's (expf, the sums' orders), only self-consistent, as the contract asks.
#ifndef HEARTH_CUDA_GDN_CHUNK_CUH
#define HEARTH_CUDA_GDN_CHUNK_CUH

#ifndef HK_DYN_SMEM
#define HK_DYN_SMEM(name) extern __shared__ __align__(16) float name[]
#endif

#define GC_DS 128  /* the lane's side */
#define GC_C 64    /* rows of a chunk */
#define GC_COLS 32 /* the state kernel's columns per block */
#define GC_KP 129  /* the prep's row pitch for q and k: pairs (i, j) of a warp read distinct banks */

// floats of the prep kernel's shared memory: q, k [64][129]; W, U [64][128]; nA [64][64]; G, beta
static constexpr int gc_prep_smem_floats() { return 2 * GC_C * GC_KP + 2 * GC_C * GC_DS + GC_C * GC_C + 2 * GC_C; }
// floats of the state kernel's shared memory for chunks of up to CR rows: W, q, k [CR][128];
// QK [CR][CR]; U, V' [CR][32]; two partial sums [4][CR][32]; G, exp(G), coefficients [CR]
static constexpr int gc_state_smem_floats(int CR) {
    return 3 * CR * GC_DS + CR * CR + 2 * CR * GC_COLS + 2 * 4 * CR * GC_COLS + 3 * CR;
}

// x . y over 128: four chains of 32 (a fixed order), then ((s0 + s1) + (s2 + s3))
__device__ __forceinline__ float gc_dot128(const float *x, const float *y) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll 8
    for (int i = 0; i < 32; i++) {
        s0 = __fmaf_rn(x[i], y[i], s0);
        s1 = __fmaf_rn(x[32 + i], y[32 + i], s1);
        s2 = __fmaf_rn(x[64 + i], y[64 + i], s2);
        s3 = __fmaf_rn(x[96 + i], y[96 + i], s3);
    }
    return __fadd_rn(__fadd_rn(s0, s1), __fadd_rn(s2, s3));
}

// row i's entries, one expression for the prep and the one-row path
__device__ __forceinline__ float gc_w0(float beta, float eg, float k) { return __fmul_rn(__fmul_rn(beta, eg), k); }
__device__ __forceinline__ float gc_u0(float beta, float v) { return __fmul_rn(beta, v); }
__device__ __forceinline__ float gc_qk(float dot, float gi, float gj) { return __fmul_rn(dot, expf(__fsub_rn(gi, gj))); }

// Scratch of a pass (r the pass row, h the value head): W and U (n, Gv, 128); QK (n, Gv, 64),
// row i's entries j <= i of its chunk (zero past i); G (n, Gv).
//
// grid (Gv, any), 256 threads, gc_prep_smem_floats() of shared memory: block (h, y) takes
// chunks y, y + gridDim.y, ... of the pass (pchunk[n_pieces] of them). Every quantity of
// row i is made by a loop over j <= i (see the header).
__global__ void __launch_bounds__(256) gdn_chunk_prep_kernel(const float *cv, const float *b, const float *a,
                                                              const hk_piece *pieces, const hk_chunk *chunks,
                                                              const int32_t *pchunk, int n_pieces, int64_t Gk,
                                                              int64_t Gv, int64_t cd, float *wsc, float *usc,
                                                              float *qksc, float *gsc) {
    pdl_enter();
    HK_DYN_SMEM(sm);
    float *qs = sm;                   /* [64][129] */
    float *ks = qs + GC_C * GC_KP;    /* [64][129] */
    float *xs = ks + GC_C * GC_KP;    /* [2][64][128]: W, then U */
    float *na = xs + 2 * GC_C * GC_DS; /* [64][64] */
    float *gs = na + GC_C * GC_C;     /* [64] */
    float *bs = gs + GC_C;            /* [64] */
    const int tid = threadIdx.x;
    const int64_t h = blockIdx.x, hk = h % Gk;
    const int nch = pchunk[n_pieces];
    for (int ci = blockIdx.y; ci < nch; ci += gridDim.y) {
        const hk_chunk ch = chunks[ci];
        const int64_t rb = pieces[ch.piece].r0 + ch.c0; /* the chunk's first pass row */
        const int L = ch.n;
        __syncthreads(); /* the previous chunk is done with the shared memory */
#pragma unroll 4
        for (int idx = tid; idx < L * 32; idx += blockDim.x) { /* by float4 */
            const int i = idx / 32, c = 4 * (idx % 32);
            const float *row = cv + (rb + i) * cd;
            const float4 q4 = *(const float4 *)(row + hk * GC_DS + c), k4 = *(const float4 *)(row + Gk * GC_DS + hk * GC_DS + c);
            float *qd = qs + i * GC_KP + c, *kd = ks + i * GC_KP + c;
            qd[0] = q4.x, qd[1] = q4.y, qd[2] = q4.z, qd[3] = q4.w;
            kd[0] = k4.x, kd[1] = k4.y, kd[2] = k4.z, kd[3] = k4.w;
        }
        if (tid < L) bs[tid] = b[(rb + tid) * Gv + h];
        if (tid == 0) {
            float g = a[rb * Gv + h];
            gs[0] = g;
            for (int i = 1; i < L; i++) gs[i] = g = __fadd_rn(g, a[(rb + i) * Gv + h]);
        }
        __syncthreads();
        for (int p = tid; p < L * GC_C; p += blockDim.x) {
            const int i = p / GC_C, j = p % GC_C;
            float nav = 0.0f, qk = 0.0f;
            if (j < i) nav = -__fmul_rn(__fmul_rn(bs[i], gc_dot128(ks + i * GC_KP, ks + j * GC_KP)), expf(__fsub_rn(gs[i], gs[j])));
            if (j <= i) qk = gc_qk(gc_dot128(qs + i * GC_KP, ks + j * GC_KP), gs[i], gs[j]);
            na[p] = nav;
            qksc[((rb + i) * Gv + h) * GC_C + j] = qk;
        }
        __syncthreads();
        /* forward substitution, a column a thread: W's (tid < 128), U's (tid >= 128); a
         * thread reads only the rows of its own column it wrote */
        const int c = tid % GC_DS;
        const bool isw = tid < GC_DS;
        float *x = xs + (isw ? 0 : GC_C * GC_DS);
        float *out = isw ? wsc : usc;
        for (int i = 0; i < L; i++) {
            const int64_t r = rb + i;
            float acc = isw ? gc_w0(bs[i], expf(gs[i]), ks[i * GC_KP + c]) : gc_u0(bs[i], cv[r * cd + 2 * Gk * GC_DS + h * GC_DS + c]);
            for (int j = 0; j < i; j++) acc = __fmaf_rn(na[i * GC_C + j], x[j * GC_DS + c], acc);
            x[i * GC_DS + c] = acc;
            out[(r * Gv + h) * GC_DS + c] = acc;
        }
        if (tid < L) gsc[(rb + tid) * Gv + h] = gs[tid];
    }
}

// S(e) of the block's rows and columns into out (may be st): e = -1 is S0 itself. Every
// thread of the block calls it with the same e (it syncs). point: for a mark (where the
// decay_skip defect lives).
template <int CR>
__device__ __forceinline__ void gc_end_state(int e, const float *st, float *out, const float *ks, const float *vp,
                                             const float *gs, const float *eg, float *cf, bool point) {
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    __syncthreads(); /* an earlier call is done with cf */
    if (tid <= e) cf[tid] = expf(__fsub_rn(gs[e], gs[tid]));
    __syncthreads();
    if (e < 0) {
#pragma unroll
        for (int r = 0; r < 32; r++) out[r] = st[r];
        return;
    }
    const float d = point && KMUT(M_DECAY_SKIP) ? 1.0f : eg[e];
    /* 32 sums at once, each over j ascending (the order is per entry: the loop nest is free) */
    float acc[32];
#pragma unroll
    for (int r = 0; r < 32; r++) acc[r] = __fmul_rn(d, st[r]);
    for (int j = 0; j <= e; j++) {
        const float cj = cf[j], vj = vp[j * GC_COLS + lane], *kj = ks + j * GC_DS + 32 * w;
#pragma unroll
        for (int r = 0; r < 32; r++) acc[r] = __fmaf_rn(__fmul_rn(cj, kj[r]), vj, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < 32; r++) out[r] = acc[r];
}

// grid (Gv * 4, n_pieces), 128 threads, gc_state_smem_floats(CR) of shared memory: value head
// h = blockIdx.x / 4, columns c0..c0+31 (c0 = 32 (blockIdx.x % 4)); warp w holds st[i] =
// S[32w + i][c0 + lane] in registers through the piece's chunks (pchunk[p] .. pchunk[p+1]).
// CR = 64 reads the prep's scratch; CR = 1 takes one-row pieces (decode, every piece of the
// pass one row) and makes W_0, U_0, QK_00 itself, by the prep's expressions (no prep launch).
template <int CR>
__global__ void __launch_bounds__(128, 1) gdn_chunk_state_kernel(const float *cv, const float *b, const float *a, float *lane0,
                                                               size_t seq_stride, const hk_piece *pieces,
                                                               const hk_chunk *chunks, const int32_t *pchunk,
                                                               const hk_mark *marks, float *stage0, size_t stage_stride,
                                                               int64_t Gk, int64_t Gv, int64_t cd, const float *wsc,
                                                               const float *usc, const float *qksc, const float *gsc,
                                                               float *o) {
    pdl_enter();
    HK_DYN_SMEM(sm);
    float *ws = sm;                    /* [CR][128] W rows */
    float *qs = ws + CR * GC_DS;       /* [CR][128] q rows */
    float *ks = qs + CR * GC_DS;       /* [CR][128] k rows */
    float *qk = ks + CR * GC_DS;       /* [CR][CR] */
    float *us = qk + CR * CR;          /* [CR][32] U, the block's columns */
    float *vp = us + CR * GC_COLS;     /* [CR][32] V' */
    float *pw = vp + CR * GC_COLS;     /* [4][CR][32] W_i^T S0, a warp's rows */
    float *pq = pw + 4 * CR * GC_COLS; /* [4][CR][32] q_i^T S0, a warp's rows */
    float *gs = pq + 4 * CR * GC_COLS; /* [CR] G */
    float *eg = gs + CR;               /* [CR] exp(G) */
    float *cf = eg + CR;               /* [CR] exp(G_e - G_j) */
    const int64_t h = blockIdx.x / 4, hk = h % Gk, c0 = (int64_t)(blockIdx.x % 4) * GC_COLS;
    const hk_piece *pc = &pieces[blockIdx.y];
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    const int64_t col = c0 + lane;
    float *lane_p = lane0 + (size_t)pc->seq * seq_stride + (size_t)(h * GC_DS * GC_DS);
    float st[32];
#pragma unroll
    for (int i = 0; i < 32; i++) st[i] = lane_p[(32 * w + i) * GC_DS + col];
    int mk = 0;
    for (int ci = pchunk[blockIdx.y]; ci < pchunk[blockIdx.y + 1]; ci++) {
        const hk_chunk ch = chunks[ci];
        const int L = ch.n < CR ? ch.n : CR; /* CR = 1 is launched for one-row pieces only */
        const int64_t rb = pc->r0 + ch.c0;
        __syncthreads(); /* the previous chunk is done with the shared memory */
        /* the chunk's rows by float4 (a row's 128 floats are 32 of them), unrolled so that
         * a thread has several loads in flight */
#pragma unroll 4
        for (int idx = tid; idx < L * 32; idx += 128) {
            const int i = idx / 32, c4 = idx % 32;
            const float *row = cv + (rb + i) * cd;
            ((float4 *)qs)[idx] = ((const float4 *)(row + hk * GC_DS))[c4];
            ((float4 *)ks)[idx] = ((const float4 *)(row + Gk * GC_DS + hk * GC_DS))[c4];
            if (CR > 1) ((float4 *)ws)[idx] = ((const float4 *)(wsc + ((rb + i) * Gv + h) * GC_DS))[c4];
        }
        if (CR > 1) {
#pragma unroll 2
            for (int idx = tid; idx < L * 8; idx += 128) {
                const int i = idx / 8, c4 = idx % 8;
                ((float4 *)us)[idx] = ((const float4 *)(usc + ((rb + i) * Gv + h) * GC_DS + c0))[c4];
            }
            constexpr int Q4 = CR >= 4 ? CR / 4 : 1; /* float4 of a QK row */
#pragma unroll 4
            for (int idx = tid; idx < L * Q4; idx += 128) {
                const int i = idx / Q4, j4 = idx % Q4;
                ((float4 *)qk)[idx] = ((const float4 *)(qksc + ((rb + i) * Gv + h) * GC_C))[j4];
            }
            if (tid < L) {
                gs[tid] = gsc[(rb + tid) * Gv + h];
                eg[tid] = expf(gs[tid]);
            }
        } else { /* row 0 as the prep makes it: G_0 = a_0, no earlier rows */
            const float beta = b[rb * Gv + h], g0 = a[rb * Gv + h];
            if (tid == 0) gs[0] = g0, eg[0] = expf(g0);
            if (tid < GC_COLS) us[tid] = gc_u0(beta, cv[rb * cd + 2 * Gk * GC_DS + h * GC_DS + c0 + tid]);
            __syncthreads(); /* q and k rows in */
            ws[tid] = gc_w0(beta, expf(g0), ks[tid]);
            if (tid == 0) qk[0] = gc_qk(gc_dot128(qs, ks), g0, g0);
        }
        __syncthreads();
        /* W_i^T S0 and q_i^T S0 over the warp's 32 rows (rows i unrolled: independent sums) */
#pragma unroll 4
        for (int i = 0; i < L; i++) {
            const float *wr = ws + i * GC_DS + 32 * w, *qr = qs + i * GC_DS + 32 * w;
            float sw = 0.0f, sq = 0.0f;
#pragma unroll
            for (int r = 0; r < 32; r++) {
                sw = __fmaf_rn(wr[r], st[r], sw);
                sq = __fmaf_rn(qr[r], st[r], sq);
            }
            pw[(w * CR + i) * GC_COLS + lane] = sw;
            pq[(w * CR + i) * GC_COLS + lane] = sq;
        }
        __syncthreads();
        for (int idx = tid; idx < L * GC_COLS; idx += 128) {
            const int i = idx / GC_COLS, c = idx % GC_COLS;
            const float *p0 = pw + i * GC_COLS + c;
            const float s = __fadd_rn(__fadd_rn(p0[0], p0[CR * GC_COLS]), __fadd_rn(p0[2 * CR * GC_COLS], p0[3 * CR * GC_COLS]));
            vp[idx] = __fsub_rn(us[idx], s);
        }
        __syncthreads();
        for (int idx = tid; idx < L * GC_COLS; idx += 128) {
            const int i = idx / GC_COLS, c = idx % GC_COLS;
            const float *p0 = pq + i * GC_COLS + c;
            const float s = __fadd_rn(__fadd_rn(p0[0], p0[CR * GC_COLS]), __fadd_rn(p0[2 * CR * GC_COLS], p0[3 * CR * GC_COLS]));
            float acc = __fmul_rn(eg[i], s);
            for (int j = 0; j <= i; j++) acc = __fmaf_rn(qk[i * CR + j], vp[j * GC_COLS + c], acc);
            o[(rb + i) * (Gv * GC_DS) + h * GC_DS + c0 + c] = acc;
        }
        /* the points whose end row falls in this chunk, from S0 (still in st) */
        for (; mk < pc->n_marks; mk++) {
            const hk_mark *m = &marks[pc->mark0 + mk];
            int e = (int)(m->m - 1 - ch.c0) + (KMUT(M_COPY_LATE) ? 1 : 0);
            if (e >= L) break; /* a later chunk's (copy_late past the piece: never written) */
            if (KMUT(M_COPY_EARLY)) e -= 1; /* before row m-1's decay and update */
            if (KMUT(M_POINT_INPLACE)) { /* the live state's low bits flipped, then copied */
#pragma unroll
                for (int r = 0; r < 32; r++) st[r] = __int_as_float(__float_as_int(st[r]) ^ 1);
            }
            float pt[32];
            gc_end_state<CR>(e, st, pt, ks, vp, gs, eg, cf, true);
            float *dst = stage0 + (size_t)m->slot * stage_stride + (size_t)(h * GC_DS * GC_DS);
#pragma unroll
            for (int r = 0; r < 32; r++) dst[(32 * w + r) * GC_DS + col] = pt[r];
        }
        gc_end_state<CR>(L - 1, st, st, ks, vp, gs, eg, cf, false);
    }
#pragma unroll
    for (int i = 0; i < 32; i++) lane_p[(32 * w + i) * GC_DS + col] = st[i];
}

#endif
