// gdn_conv.cuh: the GDN layer's causal conv with its L2 norms and gates (and, in decode, the
// rings), and the rings' kernel; gdn.cu includes it (its KMUT and M_ defects defined first),
// as does tests/unit/test_fused_emu.cc (the CPU emulation: decode's loaded-at-once form
// against the prompt form and the rings' kernel, bit for bit).
#ifndef HEARTH_CUDA_GDN_CONV_CUH
#define HEARTH_CUDA_GDN_CONV_CUH

// row j (0..dc-1) of the concatenation [ring; piece rows] ending at pass row r, channel ch
__device__ __forceinline__ float conv_x(const float *qkv, const float *ring, const hk_piece *pc, int64_t r, int64_t j,
                                        int64_t cd, int64_t dc, int64_t ch) {
    const int64_t idx = r - pc->r0 - (dc - 1) + j;
    return idx >= 0 || (KMUT(M_NEIGHBOUR) && pc->r0 + idx >= 0) ? qkv[(pc->r0 + idx) * cd + ch] : ring[(idx + dc - 1) * cd + ch];
}

// the rings of a piece's marks (the dc-1 rows up to each mark's end row, into the staging
// area) and its new ring (up to its last row) for channel ch, written over the old in place:
// the thread reads the channel's old ring before it writes it
#define RING_MAX 8
#define CONV_FAST 4 /* the taps of decode's loaded-at-once form (the model's ssm_d_conv) */
__device__ __forceinline__ void ring_channel(const float *qkv, float *ring, const hk_piece *pc, const hk_mark *marks,
                                             float *stage0, size_t stage_stride, int64_t cd, int64_t dc, int64_t ch) {
    for (int k = 0; k < pc->n_marks && !KMUT(M_RING_SKIP); k++) {
        const hk_mark *mk = &marks[pc->mark0 + k];
        float *dst = stage0 + (size_t)mk->slot * stage_stride;
        for (int64_t j = 0; j < dc - 1; j++) dst[j * cd + ch] = conv_x(qkv, ring, pc, pc->r0 + mk->m - 1, j + 1, cd, dc, ch);
    }
    float nr[RING_MAX];
    for (int64_t j = 0; j < dc - 1; j++) nr[j] = conv_x(qkv, ring, pc, pc->r0 + pc->n - 1, j + 1, cd, dc, ch);
    for (int64_t j = 0; j < dc - 1; j++) ring[j * cd + ch] = nr[KMUT(M_RING_REVERSE) ? dc - 2 - j : j];
}

// a one-row piece's marks' rings and its new ring for channel ch from its window win (rows
// [ring; row] of the channel: what ring_channel reads through conv_x for such a piece, where
// a mark can only be m = 1), written after every read
__device__ __forceinline__ void ring_window(const float win[CONV_FAST], float *ring, const hk_piece *pc, const hk_mark *marks,
                                            float *stage0, size_t stage_stride, int64_t cd, int64_t ch) {
    for (int k = 0; k < pc->n_marks && !KMUT(M_RING_SKIP); k++) {
        float *dst = stage0 + (size_t)marks[pc->mark0 + k].slot * stage_stride;
#pragma unroll
        for (int j = 0; j < CONV_FAST - 1; j++) dst[j * cd + ch] = win[j + 1];
    }
#pragma unroll
    for (int j = 0; j < CONV_FAST - 1; j++) ring[j * cd + ch] = win[KMUT(M_RING_REVERSE) ? CONV_FAST - 1 - j : j + 1];
}

// decode's loaded-at-once form of one channel: its window (rows [ring; row] up to pass row r)
// and its taps, every load issued before any is used; then silu of the taps' sum, in order
__device__ __forceinline__ void conv_load(const float *qkv, const float *ring, const hk_piece *pc, int64_t r, const float *w,
                                          int64_t cd, int64_t ch, float win[CONV_FAST], float wt[CONV_FAST]) {
#pragma unroll
    for (int j = 0; j < CONV_FAST; j++) wt[j] = w[ch * CONV_FAST + j], win[j] = conv_x(qkv, ring, pc, r, j, cd, CONV_FAST, ch);
}
__device__ __forceinline__ float conv_out(const float win[CONV_FAST], const float wt[CONV_FAST]) {
    float s = 0;
#pragma unroll
    for (int j = 0; j < CONV_FAST; j++) s = __fmaf_rn(wt[j], win[j], s);
    return silu(s);
}

// grid (heads / 8, n), 256 threads: warp w takes head hh = 8 blockIdx.x + w of row r (heads
// of S channels: the Gk q heads, the Gk k heads, the Gv v heads), lane l its channels l,
// l + 32, ...: cv = silu(causal conv of [ring; qkv rows of the piece]), and for a q or k head
// its L2 norm over the head (the sums in that channel order, then the warp tree; q also times
// 1/sqrt(S)). Block 0 of a row makes the row's gates: b = sigmoid(b), a = A softplus(a + dt).
// With ring_too (every piece of the pass one row: decode) the thread that made a channel
// then writes that channel's ring (ring_channel) after its conv read the old one; ring_too
// 2 (decode's fused form, the part conv of HEARTH_CUDA_FUSE), at the model's shape (heads of 128, 4 taps):
// a lane loads its 4 channels' windows at once (ring_window writes the rings from them),
// with the loop's arithmetic (explicit fmas). ring_too CONV_PROMPT: that form without the
// rings, for a prompt pass at the model's shape (hk_gdn_conv_norm picks it): the loop's
// steps each wait for a load (four channels of four taps one after another), which left a
// 2,048-row pass latency-bound (~170 us a call on an H100) where its 134 MB want ~45. In
// the loaded-at-once forms a q or k head's channels stay in registers until the head's scale
// is known and are stored once, scaled (the loop stores, then reads back and scales: the
// same product of the same floats).
#define CONV_PROMPT 3
// a q or k head's scale from its lanes' sums of squares: the warp's tree, its L2 norm, q's
// (q) also times 1/sqrt(S)
__device__ __forceinline__ float conv_head_scale(float ss, bool q, int64_t S, float eps) {
    float sc = 1.0f / sqrtf(warp_sum(ss) + eps);
    if (q) sc *= 1.0f / sqrtf((float)S);
    return sc;
}
__global__ void conv_norm_kernel(const float *qkv, float *ring0, size_t seq_stride, const float *w,
                                 const int32_t *row_piece, const hk_piece *pieces, const hk_mark *marks, float *stage0,
                                 size_t stage_stride, int ring_too, float *cv, float *b, float *a, const float *ssm_a,
                                 const float *dt, int64_t S, int64_t Gk, int64_t Gv, int64_t cd, int64_t dc, float eps) {
    pdl_enter();
    const int64_t r = blockIdx.y, hh = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    const hk_piece *pc = &pieces[row_piece[r]];
    float *ring = ring0 + (size_t)pc->seq * seq_stride;
    if (hh < cd / S) {
        float ss = 0;
        if ((ring_too == 2 || ring_too == CONV_PROMPT) && S == 4 * 32 && dc == CONV_FAST) {
            /* the model's shape: a lane's 4 channels' windows and taps loaded at once, then the
             * same arithmetic as the loop below; in decode the rings written from the windows */
            float win[4][CONV_FAST], wt[4][CONV_FAST], x[4];
#pragma unroll
            for (int i = 0; i < 4; i++) conv_load(qkv, ring, pc, r, w, cd, hh * S + lane + 32 * i, win[i], wt[i]);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int64_t ch = hh * S + lane + 32 * i;
                x[i] = conv_out(win[i], wt[i]);
                ss = __fmaf_rn(x[i], x[i], ss);
                if (ring_too == 2) ring_window(win[i], ring, pc, marks, stage0, stage_stride, cd, ch);
            }
            float sc = 1.0f;
            if (hh < 2 * Gk) sc = conv_head_scale(ss, hh < Gk, S, eps);
#pragma unroll
            for (int i = 0; i < 4; i++) cv[r * cd + hh * S + lane + 32 * i] = hh < 2 * Gk ? x[i] * sc : x[i];
        } else {
            for (int64_t i = lane; i < S; i += 32) {
                const int64_t ch = hh * S + i;
                float s = 0;
                for (int64_t j = 0; j < dc; j++) s = __fmaf_rn(w[ch * dc + j], conv_x(qkv, ring, pc, r, j, cd, dc, ch), s);
                const float x = silu(s);
                cv[r * cd + ch] = x;
                ss = __fmaf_rn(x, x, ss);
                if (ring_too) ring_channel(qkv, ring, pc, marks, stage0, stage_stride, cd, dc, ch);
            }
            if (hh < 2 * Gk) {
                const float sc = conv_head_scale(ss, hh < Gk, S, eps);
                for (int64_t i = lane; i < S; i += 32) cv[r * cd + hh * S + i] *= sc;
            }
        }
    }
    if (blockIdx.x == 0)
        for (int64_t h = threadIdx.x; h < Gv; h += blockDim.x) {
            const float av = a[r * Gv + h] + dt[h];
            b[r * Gv + h] = sigm(b[r * Gv + h]);
            a[r * Gv + h] = ssm_a[h] * (av > 20.0f ? av : log1pf(expf(av)));
        }
}

// Decode's conv inside the chunked delta rule's block (hk_gconv): value head h, columns c0..
// c0 + 31, key head hk, the one-row piece pc. Thread t makes channel t of the q head (t <
// 128) or of the k head; threads < 32 also value channel c0 + t; the windows loaded at once,
// conv_norm_kernel's arithmetic (the same taps order, the head's sum of squares in its lane
// order: lane l takes channels l, l + 32, l + 64, l + 96); gates as it makes them. sm: 258
// floats of scratch. The value channels' rings are this block's alone to write; a key head's
// q and k rings are written by the last of the 4 Gv / Gk blocks that read them (a ticket).
__device__ __forceinline__ void conv_in_block(const hk_gconv &g, const hk_piece *pc, const hk_mark *marks, int64_t h,
                                              int64_t hk, int64_t c0, int64_t Gk, int64_t Gv, int64_t cd, float *sm,
                                              float &beta, float &g0, float &q, float &k, float &v) {
    const int tid = threadIdx.x, lane = tid & 31;
    constexpr int64_t S = 128;
    const int64_t r = pc->r0, ch = tid < S ? hk * S + tid : Gk * S + hk * S + (tid - S), vch = 2 * Gk * S + h * S + c0 + tid;
    float *ring = g.ring0 + (size_t)pc->seq * g.ring_stride;
    float win[CONV_FAST], wt[CONV_FAST], vwin[CONV_FAST], vwt[CONV_FAST];
    conv_load(g.qkv, ring, pc, r, g.w, cd, ch, win, wt);
    if (tid < 32) conv_load(g.qkv, ring, pc, r, g.w, cd, vch, vwin, vwt);
    const float braw = g.braw[r * Gv + h], araw = g.araw[r * Gv + h];
    sm[tid] = conv_out(win, wt);
    if (tid < 32) {
        v = conv_out(vwin, vwt);
        ring_window(vwin, ring, pc, marks, g.stage0, g.stage_stride, cd, vch);
    }
    __syncthreads();
    if (tid < 64) { /* warp 0 the q head's L2 norm, warp 1 the k head's */
        const float *x = sm + (tid / 32) * S;
        float ss = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) ss = __fmaf_rn(x[lane + 32 * i], x[lane + 32 * i], ss);
        ss = warp_sum(ss);
        float sc = 1.0f / sqrtf(ss + g.eps);
        if (tid < 32) sc *= 1.0f / sqrtf((float)S);
        if (lane == 0) sm[2 * S + tid / 32] = sc;
    }
    __syncthreads();
    if (tid < S) q = sm[tid] * sm[2 * S], k = sm[S + tid] * sm[2 * S + 1];
    beta = sigm(braw);
    const float av = araw + g.dt[h];
    g0 = g.ssm_a[h] * (av > 20.0f ? av : log1pf(expf(av)));
    if (tail_last(g.cnt + blockIdx.y * Gk + hk, (unsigned)(4 * (Gv / Gk))))
        ring_window(win, ring, pc, marks, g.stage0, g.stage_stride, cd, ch);
}

// grid (cd / 256, n_pieces): ring_channel for every channel of every piece
__global__ void ring_kernel(const float *qkv, float *ring0, size_t seq_stride, const hk_piece *pieces, const hk_mark *marks,
                            float *stage0, size_t stage_stride, int64_t cd, int64_t dc) {
    pdl_enter();
    const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= cd) return;
    const hk_piece *pc = &pieces[blockIdx.y];
    ring_channel(qkv, ring0 + (size_t)pc->seq * seq_stride, pc, marks, stage0, stage_stride, cd, dc, ch);
}

#endif
