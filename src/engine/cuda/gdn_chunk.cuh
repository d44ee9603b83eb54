// gdn_chunk.cuh: the gated delta rule in the chunked WY form (chunks of 64 rows), device
// code only: the prep kernel (per value head and chunk: decays, the triangular solve, W, U)
// and the state kernel (per value head, 32 columns and piece: the chunks in order, the
// outputs, the points, the end state). gdn.cu includes it (host wrapper, mutants); so does
// tests/unit/test_gdn_chunk.cc, through a CPU emulation of the execution model
// (tests/unit/cuda_emu.h). The includer defines KMUT(bit) and M_COPY_LATE, M_COPY_EARLY,
// M_POINT_INPLACE, M_DECAY_SKIP (the planted defects, gdn.cu).
//
// The form, per value head h (key head h % Gk), lane S (128 x 128, rows the key dim) and
// chunk of L <= 64 rows with start state S0; a_i the row's log decay, beta_i its gate:
//   G_i   = a_0 + a_1 + ... + a_i                       (summed in that order)
//   nA_ij = -beta_i (k_i . k_j) exp(G_i - G_j)           j < i
//   W_i   = beta_i exp(G_i) k_i + sum_{j<i} nA_ij W_j   (W = T beta exp(G) K, T = (I + A)^-1,
//   U_i   = beta_i v_i        + sum_{j<i} nA_ij U_j      forward substitution, j ascending)
//   V'_i  = U_i - W_i^T S0                               (the delta of row i; W_i^T S0 and
//                                                         q_i^T S0 each one chain over the key dim)
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
// Cost and limits: the prep makes the dots as register tiles and solves the triangle down
// each column with the column's 64 rows in registers (no blocked solve); the state kernel
// walks a piece's chunks in order, 512 threads a block (256 in decode's one-row form and
// under HEARTH_CUDA_GDN_WIDE=0) making P and the end state as register tiles of 4 entries a row. Each takes about 100 KB of shared memory (two blocks an SM). The GPU's bits are not the CPU's (expf, the sums' orders), only
// self-consistent, as the contract asks.
#ifndef HEARTH_CUDA_GDN_CHUNK_CUH
#define HEARTH_CUDA_GDN_CHUNK_CUH

#ifndef HK_DYN_SMEM
#endif

#define GC_DS 128  /* the lane's side */
#define GC_C 64    /* rows of a chunk */
#define GC_COLS 32 /* the state kernel's columns per block */
#define GC_XP 132  /* a pitch for rows of 128 read by float4: rows r and r + 1..7 on distinct banks */

// x . y over 128: one chain, i ascending (the prep's register tiles sum in the same order)
__device__ __forceinline__ float gc_dot128(const float *x, const float *y) {
    float s = 0.0f;
#pragma unroll 16
    for (int i = 0; i < GC_DS; i++) s = __fmaf_rn(x[i], y[i], s);
    return s;
}

// row i's entries, one expression for the prep and the one-row path
__device__ __forceinline__ float gc_w0(float beta, float eg, float k) { return __fmul_rn(__fmul_rn(beta, eg), k); }
__device__ __forceinline__ float gc_u0(float beta, float v) { return __fmul_rn(beta, v); }
__device__ __forceinline__ float gc_qk(float dot, float gi, float gj) { return __fmul_rn(dot, expf(__fsub_rn(gi, gj))); }

// Scratch of a pass (r the pass row, h the value head): W and U (n, Gv, 128); QK (n, Gv, 64),
// row i's entries j <= i of its chunk (zero past i); G (n, Gv).
//
// The prep's shared memory (floats): q, k [64][GC_XP]; v [64][128]; nA [64][64] over q once
// the dots are made; a (then G), beta, exp(G) [64]: 101 KB, two blocks an SM.
__host__ __device__ static constexpr int gc_prep_smem_floats() { return 2 * GC_C * GC_XP + GC_C * GC_DS + 3 * GC_C; }

// grid (Gv, any), 256 threads, gc_prep_smem_floats() of shared memory: block (h, y) takes
// chunks y, y + gridDim.y, ... of the pass (pchunk[n_pieces] of them). Every quantity of
// row i is made from rows j <= i only (see the header). The dots k_i . k_j and q_i . k_j are
// register tiles: thread (ti, tj) = (tid / 16, tid % 16) makes pairs (ti + 16a, tj + 16b),
// each one chain over the key dim as gc_dot128 sums. The solve is a column a thread (W's for
// tid < 128, U's above), its 64 rows in registers, every sum j ascending.
__global__ void __launch_bounds__(256, 2) gdn_chunk_prep_kernel(const float *cv, const float *b, const float *a,
                                                                 const hk_piece *pieces, const hk_chunk *chunks,
                                                                 const int32_t *pchunk, int n_pieces, int64_t Gk,
                                                                 int64_t Gv, int64_t cd, float *wsc, float *usc,
                                                                 float *qksc, float *gsc) {
    pdl_enter();
    HK_DYN_SMEM(sm);
    float *qs = sm;                  /* [64][GC_XP] */
    float *na = sm;                  /* [64][64], over q once the dots are made */
    float *ks = qs + GC_C * GC_XP;   /* [64][GC_XP] */
    float *vs = ks + GC_C * GC_XP;   /* [64][128] */
    float *gs = vs + GC_C * GC_DS;   /* [64] a, then G */
    float *bs = gs + GC_C;           /* [64] */
    float *eg = bs + GC_C;           /* [64] exp(G) */
    const int tid = threadIdx.x, ti = tid / 16, tj = tid % 16;
    const int64_t h = blockIdx.x, hk = h % Gk;
    const int nch = pchunk[n_pieces];
    for (int ci = blockIdx.y; ci < nch; ci += gridDim.y) {
        const hk_chunk ch = chunks[ci];
        const int64_t rb = pieces[ch.piece].r0 + ch.c0; /* the chunk's first pass row */
        const int L = ch.n;
        __syncthreads(); /* the previous chunk is done with the shared memory */
        /* q, k, v rows by float4 (rows past L zero), eight loads a thread in flight at a time */
        for (int part = 0; part < 3; part++) {
            float4 t[8];
#pragma unroll
            for (int it = 0; it < 8; it++) {
                const int idx = tid + 256 * it, i = idx / 32, c4 = idx % 32;
                const float *row = cv + (rb + i) * cd + (part == 0 ? hk * GC_DS : part == 1 ? Gk * GC_DS + hk * GC_DS : 2 * Gk * GC_DS + h * GC_DS);
                t[it] = i < L ? ((const float4 *)row)[c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int it = 0; it < 8; it++) {
                const int idx = tid + 256 * it, i = idx / 32, c4 = idx % 32;
                *(float4 *)(part == 2 ? vs + i * GC_DS + 4 * c4 : (part == 0 ? qs : ks) + i * GC_XP + 4 * c4) = t[it];
            }
        }
        if (tid < GC_C) {
            gs[tid] = tid < L ? a[(rb + tid) * Gv + h] : 0.0f;
            bs[tid] = tid < L ? b[(rb + tid) * Gv + h] : 0.0f;
        }
        __syncthreads();
        if (tid == 0)
            for (int i = 1; i < L; i++) gs[i] = __fadd_rn(gs[i - 1], gs[i]);
        __syncthreads();
        if (tid < L) {
            eg[tid] = expf(gs[tid]);
            gsc[(rb + tid) * Gv + h] = gs[tid];
        }
        /* the dots: kk[a][b] = k_i . k_j, qq[a][b] = q_i . k_j, i = ti + 16a, j = tj + 16b */
        float kk[4][4], qq[4][4];
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int w = 0; w < 4; w++) kk[u][w] = qq[u][w] = 0.0f;
#pragma unroll 1
        for (int k = 0; k < GC_DS; k += 4) {
            float4 ki[4], qi[4], kj[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                ki[u] = *(const float4 *)(ks + (ti + 16 * u) * GC_XP + k);
                qi[u] = *(const float4 *)(qs + (ti + 16 * u) * GC_XP + k);
                kj[u] = *(const float4 *)(ks + (tj + 16 * u) * GC_XP + k);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float kiv[4] = {ki[u].x, ki[u].y, ki[u].z, ki[u].w}, qiv[4] = {qi[u].x, qi[u].y, qi[u].z, qi[u].w};
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    const float kjv[4] = {kj[w].x, kj[w].y, kj[w].z, kj[w].w};
#pragma unroll
                    for (int m = 0; m < 4; m++) {
                        kk[u][w] = __fmaf_rn(kiv[m], kjv[m], kk[u][w]);
                        qq[u][w] = __fmaf_rn(qiv[m], kjv[m], qq[u][w]);
                    }
                }
            }
        }
        __syncthreads(); /* q is read: nA goes over it */
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const int i = ti + 16 * u, j = tj + 16 * w;
                float nav = 0.0f, qk = 0.0f;
                if (j <= i) {
                    qk = gc_qk(qq[u][w], gs[i], gs[j]);
                    if (j < i) nav = -__fmul_rn(__fmul_rn(bs[i], kk[u][w]), expf(__fsub_rn(gs[i], gs[j])));
                }
                na[i * GC_C + j] = nav;
                if (i < L) qksc[((rb + i) * Gv + h) * GC_C + j] = qk;
            }
        __syncthreads();
        /* forward substitution, a column a thread, the rows unrolled so that x stays in registers */
        const int c = tid % GC_DS;
        const bool isw = tid < GC_DS;
        float *out = (isw ? wsc : usc) + (rb * Gv + h) * GC_DS + c;
        float x[GC_C];
#pragma unroll
        for (int i = 0; i < GC_C; i++) {
            float acc = isw ? gc_w0(bs[i], eg[i], ks[i * GC_XP + c]) : gc_u0(bs[i], vs[i * GC_DS + c]);
#pragma unroll
            for (int j = 0; j < i; j++) acc = __fmaf_rn(na[i * GC_C + j], x[j], acc);
            x[i] = acc;
            if (i < L) out[i * Gv * GC_DS] = acc;
        }
    }
}

// The state kernel's layout. A block takes value head h, columns c0..c0+31 of its lane and a
// piece; NTH threads (256, or 512 for chunks of 64: twice the warps an SM to hide the
// latencies of a block's serial chunks; HEARTH_CUDA_GDN_WIDE). Thread (warp w, lane l): column
// group cg = l % 8 (the block's columns 4cg..4cg+3) and row group rg = 4w + l / 8 (RG =
// NTH / 8 of them): it makes P and O for chunk rows rg + RG a (a < CR / RG) and holds the
// state entries of key rows rg + RG a (a < 128 / RG: 16 entries at 256 threads, 8 at 512).
// Each entry's sums are the same chains whichever thread makes them: the bits do not depend
// on NTH.
// Shared memory (floats), for chunks of up to CR rows:
//   x   [2][CR][GC_XP]  W rows, then q rows (the pitch puts a warp's four rows on distinct banks)
//   the chunk's second half, over x once P is made (CR > 1; after x when CR = 1):
//       ks [CR][128] k rows, qk [CR][CR], vp [CR][32] V' of the block's columns
//   s0  [128][32]       the state's block columns (S0 of the chunk, then its end state)
//   gs, eg, cf [CR]     G, exp(G), exp(G_e - G_j)
#define GC_THREADS 256 /* one-row pieces (decode), and the narrow form of chunks of 64 */
#define GC_THREADS_WIDE 512
__host__ __device__ static constexpr int gc_x_floats(int CR) { return 2 * CR * GC_XP; }
__host__ __device__ static constexpr int gc_qk_floats(int CR) { return (CR * CR + 3) / 4 * 4; } /* vp after it stays 16-byte aligned */
__host__ __device__ static constexpr int gc_half_floats(int CR) { return CR * GC_DS + gc_qk_floats(CR) + CR * GC_COLS; }
__host__ __device__ static constexpr int gc_half_at(int CR) { return CR > 1 ? 0 : gc_x_floats(CR); }
__host__ __device__ static constexpr int gc_s0_at(int CR) {
    return gc_half_at(CR) + gc_half_floats(CR) > gc_x_floats(CR) ? gc_half_at(CR) + gc_half_floats(CR) : gc_x_floats(CR);
}
__host__ __device__ static constexpr int gc_state_smem_floats(int CR) {
    return gc_s0_at(CR) + GC_DS * GC_COLS + 3 * CR + (CR == 1 ? 2 * GC_COLS : 0); /* CR = 1: P's row too */
}

// S(e) of the thread's 4 SA state entries (key rows rg + RG a, RG = 128 / SA, columns
// 4cg..4cg+3) into acc: exp(G_e) S0 + sum_{j<=e} (exp(G_e - G_j) k_j) V'_j, j ascending; e = -1
// is S0 itself. Every thread of the block calls it with the same e (it syncs). point: for a
// mark (where the decay_skip defect lives).
template <int SA>
__device__ __forceinline__ void gc_end_state(int e, const float *s0, const float *ks, const float *vp, const float *gs,
                                             const float *eg, float *cf, bool point, float acc[SA][4]) {
    constexpr int RG = GC_DS / SA;
    const int tid = threadIdx.x, lane = tid % 32, cg = lane % 8, rg = 4 * (tid / 32) + lane / 8;
    __syncthreads(); /* an earlier call is done with cf */
    if (tid <= e) cf[tid] = expf(__fsub_rn(gs[e], gs[tid]));
    __syncthreads();
    const float d = e < 0 ? 1.0f : point && KMUT(M_DECAY_SKIP) ? 1.0f : eg[e];
#pragma unroll
    for (int a = 0; a < SA; a++) {
        const float4 s = *(const float4 *)(s0 + (rg + RG * a) * GC_COLS + 4 * cg);
        if (e < 0) {
            acc[a][0] = s.x, acc[a][1] = s.y, acc[a][2] = s.z, acc[a][3] = s.w;
        } else {
            acc[a][0] = __fmul_rn(d, s.x), acc[a][1] = __fmul_rn(d, s.y), acc[a][2] = __fmul_rn(d, s.z), acc[a][3] = __fmul_rn(d, s.w);
        }
    }
    for (int j = 0; j <= e; j++) {
        const float cj = cf[j];
        const float4 v = *(const float4 *)(vp + j * GC_COLS + 4 * cg);
#pragma unroll
        for (int a = 0; a < SA; a++) {
            const float kk = __fmul_rn(cj, ks[j * GC_DS + rg + RG * a]);
            acc[a][0] = __fmaf_rn(kk, v.x, acc[a][0]), acc[a][1] = __fmaf_rn(kk, v.y, acc[a][1]);
            acc[a][2] = __fmaf_rn(kk, v.z, acc[a][2]), acc[a][3] = __fmaf_rn(kk, v.w, acc[a][3]);
        }
    }
}

// grid (Gv * 4, n_pieces), NTH threads, gc_state_smem_floats(CR) of shared memory:
// value head h = blockIdx.x / 4, columns c0..c0+31 (c0 = 32 (blockIdx.x % 4)), the piece's
// chunks (pchunk[p] .. pchunk[p+1]) in order. Per chunk: P = [W; Q] S0 (each entry one fmaf
// chain over the key dim, ascending), V' = U - P_W, O = exp(G) P_Q + QK V' (j ascending), the
// marks' points, then the end state. CR = 64 reads the prep's scratch; CR = 1 takes one-row
// pieces (decode, every piece of the pass one row) and makes W_0, U_0, QK_00 itself, by the
// prep's expressions (no prep launch).
template <int CR, int NTH = GC_THREADS>
__global__ void __launch_bounds__(NTH, CR == 1 ? 4 : NTH == GC_THREADS ? 2 : 1)
    gdn_chunk_state_kernel(const float *cv, const float *b, const float *a, float *lane0, size_t seq_stride,
                           const hk_piece *pieces, const hk_chunk *chunks, const int32_t *pchunk, const hk_mark *marks,
                           float *stage0, size_t stage_stride, int64_t Gk, int64_t Gv, int64_t cd, const float *wsc,
                           const float *usc, const float *qksc, const float *gsc, hk_gconv gv, hk_gtail gt, float *o) {
    pdl_enter();
    HK_DYN_SMEM(sm);
    float *xw = sm, *xq = sm + CR * GC_XP;  /* [CR][GC_XP] each */
    float *ks = sm + gc_half_at(CR);        /* [CR][128] */
    float *qk = ks + CR * GC_DS;            /* [CR][CR] */
    float *vp = qk + gc_qk_floats(CR);      /* [CR][32] */
    float *s0 = sm + gc_s0_at(CR);          /* [128][32] */
    float *gs = s0 + GC_DS * GC_COLS, *eg = gs + CR, *cf = eg + CR; /* [CR] each */
    const int64_t h = blockIdx.x / 4, hk = h % Gk, c0 = (int64_t)(blockIdx.x % 4) * GC_COLS;
    const hk_piece *pc = &pieces[blockIdx.y];
    const int tid = threadIdx.x, lane = tid % 32, cg = lane % 8, rg = 4 * (tid / 32) + lane / 8;
    static_assert(CR > 1 || NTH == GC_THREADS, "one-row pieces: 256 threads (conv_in_block, gated_tail)");
    constexpr int RG = NTH / 8, SA = GC_DS / RG; /* row groups; state rows a thread holds: rg + RG a */
    constexpr int NR = CR > 1 ? CR / RG : 1;     /* chunk rows a thread makes P and O for (CR = 64): rg + RG a */
    float *lane_p = lane0 + (size_t)pc->seq * seq_stride + (size_t)(h * GC_DS * GC_DS) + c0 + 4 * cg;
    /* CR = 1 (a piece is its one row): the row's values are loaded with S0, one wait for both;
     * or, with gv (decode's conv in the launch: gdn_conv.cuh), made here from the input
     * products' row and the rings while S0 loads */
    float r_beta = 0.0f, r_g0 = 0.0f, r_k = 0.0f, r_q = 0.0f, r_v = 0.0f;
    if constexpr (CR == 1)
        if (!gv.qkv) {
            const float *row = cv + pc->r0 * cd;
            r_beta = b[pc->r0 * Gv + h], r_g0 = a[pc->r0 * Gv + h];
            if (tid < GC_DS) r_k = row[Gk * GC_DS + hk * GC_DS + tid], r_q = row[hk * GC_DS + tid];
            if (tid < GC_COLS) r_v = row[2 * Gk * GC_DS + h * GC_DS + c0 + tid];
        }
#pragma unroll
    for (int a = 0; a < SA; a++) *(float4 *)(s0 + (rg + RG * a) * GC_COLS + 4 * cg) = *(const float4 *)(lane_p + (rg + RG * a) * GC_DS);
    if constexpr (CR == 1)
        if (gv.qkv) conv_in_block(gv, pc, marks, h, hk, c0, Gk, Gv, cd, sm, r_beta, r_g0, r_q, r_k, r_v);
    int mk = 0;
    for (int ci = pchunk[blockIdx.y]; ci < pchunk[blockIdx.y + 1]; ci++) {
        const hk_chunk ch = chunks[ci];
        const int L = ch.n < CR ? ch.n : CR; /* CR = 1 is launched for one-row pieces only */
        const int64_t rb = pc->r0 + ch.c0;
        __syncthreads(); /* the previous chunk is done with the shared memory */
        constexpr int NX = CR > 1 ? 2 * CR * 32 / NTH : 1, NK = CR > 1 ? CR * 32 / NTH : 1, NQ = CR > 1 ? CR * CR / 4 / NTH : 1;
        float4 kpre[NK], qpre[NQ], upre[NR];
        if constexpr (CR > 1) {
            /* W and q rows into x (by float4, all of a thread's loads issued first) */
            float4 t[NX];
#pragma unroll
            for (int it = 0; it < NX; it++) {
                const int idx = tid + NTH * it, xr = idx / 32, c4 = idx % 32, i = xr % CR;
                const float *src = xr < CR ? wsc + ((rb + i) * Gv + h) * GC_DS : cv + (rb + i) * cd + hk * GC_DS;
                t[it] = i < L ? ((const float4 *)src)[c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int it = 0; it < NX; it++) {
                const int idx = tid + NTH * it, xr = idx / 32, c4 = idx % 32;
                *(float4 *)(sm + xr * GC_XP + 4 * c4) = t[it];
            }
            /* the chunk's second half into registers, in flight while P is made */
#pragma unroll
            for (int it = 0; it < NK; it++) {
                const int idx = tid + NTH * it, i = idx / 32, c4 = idx % 32;
                kpre[it] = i < L ? ((const float4 *)(cv + (rb + i) * cd + Gk * GC_DS + hk * GC_DS))[c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int it = 0; it < NQ; it++) {
                const int idx = tid + NTH * it, i = idx / (CR / 4), j4 = idx % (CR / 4);
                qpre[it] = i < L ? ((const float4 *)(qksc + ((rb + i) * Gv + h) * GC_C))[j4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int a = 0; a < NR; a++) {
                const int i = rg + RG * a;
                upre[a] = i < L ? *(const float4 *)(usc + ((rb + i) * Gv + h) * GC_DS + c0 + 4 * cg) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            if (tid < L) {
                gs[tid] = gsc[(rb + tid) * Gv + h];
                eg[tid] = expf(gs[tid]);
            }
        } else { /* row 0 as the prep makes it: G_0 = a_0, no earlier rows */
            if (tid < GC_DS) {
                xw[tid] = gc_w0(r_beta, expf(r_g0), r_k);
                xq[tid] = r_q;
                ks[tid] = r_k;
            }
            if (tid == 0) gs[0] = r_g0, eg[0] = expf(r_g0);
            if (tid < GC_COLS) vp[tid] = gc_u0(r_beta, r_v); /* U_0, V' below */
        }
        __syncthreads();
        if constexpr (CR == 1) {
            /* one row: P's 64 entries a thread each (one chain over the key dim, ascending, as
             * the tiles sum), QK_00 by another warp meanwhile; then V'_0 and O_0 */
            float *pb = cf + CR; /* [64] P_W, then P_Q */
            if (tid < 2 * GC_COLS) {
                const float *x = tid < GC_COLS ? xw : xq;
                const int c = tid % GC_COLS;
                float p = 0.0f;
#pragma unroll 16
                for (int k = 0; k < GC_DS; k++) p = __fmaf_rn(x[k], s0[k * GC_COLS + c], p);
                pb[tid] = p;
            } else if (tid == 2 * GC_COLS) {
                qk[0] = gc_qk(gc_dot128(xq, ks), gs[0], gs[0]);
            }
            __syncthreads();
            if (tid < GC_COLS) {
                const float v = __fsub_rn(vp[tid], pb[tid]);
                vp[tid] = v;
                o[rb * (Gv * GC_DS) + h * GC_DS + c0 + tid] = __fmaf_rn(qk[0], v, __fmul_rn(eg[0], pb[GC_COLS + tid]));
            }
        } else {
            /* P = [W; Q] S0 for the thread's rows: one chain an entry, the key dim ascending */
            float pw[NR][4], pq[NR][4];
#pragma unroll
            for (int a = 0; a < NR; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) pw[a][c] = pq[a][c] = 0.0f;
#pragma unroll 2
            for (int k = 0; k < GC_DS; k += 4) {
                float4 s[4], xa[NR], xb[NR];
#pragma unroll
                for (int u = 0; u < 4; u++) s[u] = *(const float4 *)(s0 + (k + u) * GC_COLS + 4 * cg);
#pragma unroll
                for (int a = 0; a < NR; a++) {
                    xa[a] = *(const float4 *)(xw + (rg + RG * a) * GC_XP + k);
                    xb[a] = *(const float4 *)(xq + (rg + RG * a) * GC_XP + k);
                }
#pragma unroll
                for (int a = 0; a < NR; a++) {
                    const float wv[4] = {xa[a].x, xa[a].y, xa[a].z, xa[a].w}, qv[4] = {xb[a].x, xb[a].y, xb[a].z, xb[a].w};
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const float sv[4] = {s[u].x, s[u].y, s[u].z, s[u].w};
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            pw[a][c] = __fmaf_rn(wv[u], sv[c], pw[a][c]);
                            pq[a][c] = __fmaf_rn(qv[u], sv[c], pq[a][c]);
                        }
                    }
                }
            }
            __syncthreads(); /* x is read: the second half goes over it */
#pragma unroll
            for (int it = 0; it < NK; it++) ((float4 *)ks)[tid + NTH * it] = kpre[it];
#pragma unroll
            for (int it = 0; it < NQ; it++) ((float4 *)qk)[tid + NTH * it] = qpre[it];
#pragma unroll
            for (int a = 0; a < NR; a++)
                *(float4 *)(vp + (rg + RG * a) * GC_COLS + 4 * cg) =
                    make_float4(__fsub_rn(upre[a].x, pw[a][0]), __fsub_rn(upre[a].y, pw[a][1]), __fsub_rn(upre[a].z, pw[a][2]),
                                __fsub_rn(upre[a].w, pw[a][3]));
            __syncthreads();
            /* O_i = exp(G_i) P_Q,i + sum_{j<=i} QK_ij V'_j for the thread's rows */
#pragma unroll
            for (int a = 0; a < NR; a++) {
                const int i = rg + RG * a;
                if (i >= L) continue;
                float acc[4];
#pragma unroll
                for (int c = 0; c < 4; c++) acc[c] = __fmul_rn(eg[i], pq[a][c]);
                for (int j = 0; j <= i; j++) {
                    const float q = qk[i * CR + j];
                    const float4 v = *(const float4 *)(vp + j * GC_COLS + 4 * cg);
                    acc[0] = __fmaf_rn(q, v.x, acc[0]), acc[1] = __fmaf_rn(q, v.y, acc[1]);
                    acc[2] = __fmaf_rn(q, v.z, acc[2]), acc[3] = __fmaf_rn(q, v.w, acc[3]);
                }
                *(float4 *)(o + (rb + i) * (Gv * GC_DS) + h * GC_DS + c0 + 4 * cg) = make_float4(acc[0], acc[1], acc[2], acc[3]);
            }
        }
        /* the points whose end row falls in this chunk, from S0 (still in s0) */
        float acc[SA][4];
        for (; mk < pc->n_marks; mk++) {
            const hk_mark *m = &marks[pc->mark0 + mk];
            int e = (int)(m->m - 1 - ch.c0) + (KMUT(M_COPY_LATE) ? 1 : 0);
            if (e >= L) break; /* a later chunk's (copy_late past the piece: never written) */
            if (KMUT(M_COPY_EARLY)) e -= 1; /* before row m-1's decay and update */
            /* the live state moved one ulp, then copied (an increment, not a flip: two marks of a
             * chunk would flip it back) */
            if (KMUT(M_POINT_INPLACE))
#pragma unroll
                for (int a = 0; a < SA; a++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        float *p = s0 + (rg + RG * a) * GC_COLS + 4 * cg + c;
                        *p = __int_as_float(__float_as_int(*p) + 1);
                    }
            gc_end_state<SA>(e, s0, ks, vp, gs, eg, cf, true, acc);
            float *dst = stage0 + (size_t)m->slot * stage_stride + (size_t)(h * GC_DS * GC_DS) + c0 + 4 * cg;
#pragma unroll
            for (int a = 0; a < SA; a++) *(float4 *)(dst + (rg + RG * a) * GC_DS) = make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
        }
        gc_end_state<SA>(L - 1, s0, ks, vp, gs, eg, cf, false, acc);
#pragma unroll
        for (int a = 0; a < SA; a++) *(float4 *)(s0 + (rg + RG * a) * GC_COLS + 4 * cg) = make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < SA; a++) *(float4 *)(lane_p + (rg + RG * a) * GC_DS) = *(const float4 *)(s0 + (rg + RG * a) * GC_COLS + 4 * cg);
    if constexpr (CR == 1)
        if (gt.z) gated_tail(gt, o, pc->r0, h, Gv); /* decode: the gated norm of the row's two heads (gdn.cu) */
}

#endif
