/* ref.h: a deliberately plain float64 forward pass of qwen35moe, used only by tests as the
 * reference the engines are checked against. One token at a time, no batching, no chunked
 * forms: the delta rule is run sequentially, attention is a naive causal softmax over a
 * float64 KV history. Weights come from a loaded `model` (any supported type), dequantized
 * with quant_dequantize_row to float and widened to double at use; all arithmetic is double.
 *
 * Letters: E hidden, V vocab, H query heads, Hkv KV heads, D head dim, R rotated dims,
 * X experts, K experts used, F expert FFN, Fs shared FFN, Gk GDN key heads, Gv GDN value
 * heads, S GDN head dim (key = value), C conv channels = 2*Gk*S + Gv*S, W conv kernel.
 *
 * ---- Conventions, settled from llama.cpp (2026-09-28) and MODEL.md; engines must follow ----
 * Sources: src/models/qwen35moe.cpp (graph), src/models/delta-net-base.cpp (delta rule),
 * src/models/models.h (build_gdn_l2_norm), src/llama-graph.cpp (build_moe_ffn, build_ffn,
 * llm_graph_input_pos::set_input), src/llama-model.cpp (rope type), ggml/src/ggml-cpu/ops.cpp
 * (rms_norm, rope / ggml_mrope_cache_init, ssm_conv, gated_delta_net), unary-ops.cpp (softplus).
 *
 * Layer:   x = token_embd[id] (no scale). h = rmsnorm(x)*attn_norm; x += mixer(h);
 *          h2 = rmsnorm(x)*post_attention_norm; x += moe(h2). logits = output·(rmsnorm(x)*output_norm).
 *          rmsnorm(v) = v / sqrt(mean(v²) + eps), eps = hp.rms_eps, every norm a plain multiply.
 * Attention layer (il+1) % full_attn_interval == 0:
 *   - attn_q gives 2*H*D: head h's query is [2Dh, 2Dh+D), its gate is [2Dh+D, 2D(h+1)).
 *   - q and k RMS-normed per head over D with attn_q_norm / attn_k_norm (eps = rms_eps),
 *     BEFORE RoPE; v is not normed.
 *   - RoPE: NeoX pairing on the first R = rope_dims dims: pair i in [0, R/2) rotates
 *     (x_i, x_{i+R/2}) by angle p_i * theta^(-2i/R); dims R..D-1 pass through. llama.cpp runs
 *     qwen35moe as IMROPE (interleaved M-RoPE) with rope.dimension_sections; for text tokens
 *     the position components are (t, h, w, e) = (pos, pos, pos, 0). Pair i's sector is
 *     s = i % (Σ sections); it takes component t if s%3==0 && s < 3*sec[0], h if s%3==1 &&
 *     s < 3*sec[1], w if s%3==2 && s < 3*sec[2], else e (= 0: not rotated). For [11,11,10,0]
 *     with R = 64 (and R = 32, gen's tiny) every pair takes pos, i.e. plain 1-D NeoX RoPE.
 *     No YaRN (ext_factor 0, freq_scale 1, mscale 1). ref_rope_pair_rotates() gives the
 *     rule. Angles here are pos * pow(theta, -2i/R) in double; ggml builds them in float by
 *     repeated multiplication by theta^(-2/R), which drifts ~1e-6 relative per pair index.
 *   - scores = q·k / sqrt(D) over keys 0..pos inclusive, softmax; query head h reads KV head
 *     h / (H/Hkv) (grouped, as ggml's mul_mat broadcast).
 *   - o_h ⊙ sigmoid(gate_h), then attn_output (H*D → E).
 * GDN layer:
 *   - qkv = attn_qkv·h (C), z = attn_gate·h (Gv*S), b = ssm_beta·h (Gv), a = ssm_alpha·h (Gv).
 *   - causal depthwise conv, no bias: y_c = Σ_{j<W} w[c][j] · qkv_c(t-W+1+j), w[c][j] at
 *     ssm_conv1d[c*W + j]; tap W-1 is the current token. Then SiLU. The ring holds the last
 *     W-1 pre-conv qkv rows (zeros at start), oldest first.
 *   - y splits as q = [0, Gk*S), k = [Gk*S, 2*Gk*S), v = [2*Gk*S, C); head j of q/k is
 *     [j*S, (j+1)*S), value head h of v is [h*S, (h+1)*S).
 *   - L2 norm of each q and k head: x / sqrt(Σx² + eps), eps = hp.rms_eps (llama.cpp's
 *     build_gdn_l2_norm = rms_norm(x, eps/n)/sqrt(n), which is exactly this; HF: 1e-6).
 *   - q scaled by 1/sqrt(S) after the L2 norm (llama.cpp's unfused paths scale q; its fused
 *     op scales o instead: the same in exact arithmetic).
 *   - value head h uses key head h % Gk (tiled order in GGUF: ggml broadcast is modulo).
 *   - β = sigmoid(b_h); g = ssm_a[h] * softplus(a_h + ssm_dt[h]) with softplus(x) = x if
 *     x > 20 else log(1 + exp(x)) (ggml's form); ssm_a already holds -exp(A_log).
 *   - lane S (S×S, rows key dim i, columns value dim j), per token:
 *     S ← exp(g)·S; u = Sᵀk; δ = β(v − u); S ← S + k δᵀ; o = Sᵀq.
 *     (llama.cpp stores each lane transposed: M[j*S + i] = S[i][j].)
 *   - o_h = rmsnorm(o_h) * ssm_norm (eps = rms_eps, weight shared by heads) * SiLU(z_h);
 *     then ssm_out (Gv*S → E).
 * MoE (every layer):
 *   - router logits = ffn_gate_inp·h2 (X); p = softmax over all X; top-K by p (ties: lower
 *     index first, here; ggml's argsort leaves ties unspecified); weights w_k = p_k / Σ_top p
 *     (llama.cpp clamps the sum at >= 6.1035e-5; no expert_weights_scale for qwen35moe).
 *   - expert e: down_e(silu(gate_e·h2) ⊙ (up_e·h2)); gate_e rows are ffn_gate_exps rows
 *     [e*F, (e+1)*F), down_e rows are ffn_down_exps rows [e*E, (e+1)*E).
 *   - shared: down_sh(silu(gate_sh·h2) ⊙ (up_sh·h2)) * sigmoid(ffn_gate_inp_shexp · h2)
 *     (a dot product with the E-vector, one scalar per token).
 *   - out = Σ_k w_k·expert_{e_k} + gated shared.
 * Dense MLP (architecture qwen35, in place of the MoE): down(silu(gate·h2) ⊙ (up·h2)) with
 *   ffn_gate / ffn_up / ffn_down (llama.cpp src/models/qwen35.cpp, build_layer_ffn).
 *
 * Dot products sum in double with four partial sums over i % 4, combined (s0+s1)+(s2+s3):
 * a fixed order, so every result is deterministic. */
#ifndef HEARTH_REF_H
#define HEARTH_REF_H

#include <stdint.h>
#include <stdbool.h>
#include "model/model.h"

/* Float copies of the weights of one model: F32 tensors alias the mapping; other types are
 * dequantized once (non-expert matrices at creation, each expert's matrices the first time
 * a sequence routes to it) while a budget lasts (2 GiB; HEARTH_REF_CACHE_MB in the
 * environment sets it), and row by row at every use past it.
 * Sequences fill the expert copies as they run, so one ref_model serves one thread at a
 * time. The model must outlive it. */
typedef struct ref_model ref_model;
ref_model *ref_model_new(const model *m);
void ref_model_free(ref_model *rm);
const model *ref_model_of(const ref_model *rm);

/* One sequence: KV history (max_tokens rows per attention layer), lanes and rings per GDN
 * layer, the position, and what the last step chose. */
typedef struct ref_seq ref_seq;
ref_seq *ref_seq_new(ref_model *rm, int64_t max_tokens);
ref_seq *ref_seq_clone(const ref_seq *s);       /* a deep copy (same model, same capacity) */
void ref_seq_free(ref_seq *s);

/* Runs one token at position ref_seq_pos(s), then advances the position. logits (V
 * doubles) may be NULL to skip the output matrix. Dies if the position reaches max_tokens
 * or the token is out of range (a test's bug, not input). */
void ref_step(ref_seq *s, int32_t token, double *logits);

/* Runs layer il's mixer (attention or GDN) on h (E) for the token at ref_seq_pos(s),
 * writing its output (E) and recording the layer's state (KV row, or lane and ring); the
 * position is not advanced. ref_step calls it once per layer. Exposed for layer checks. */
void ref_mixer(ref_seq *s, int il, const double *h, double *out);
/* The MoE block of layer il on h2 (E) → out (E); records the chosen experts. */
void ref_moe(ref_seq *s, int il, const double *h2, double *out);
/* After driving the layers by hand with ref_mixer / ref_moe: moves to the next position. */
void ref_seq_advance(ref_seq *s);

/* ---- the MTP block (a model with has_mtp) ----
 * The trunk's last hidden row of the last step after output_norm (E): the block's h. */
void ref_seq_head_input(const ref_seq *s, double *h);
/* The block's row at position pos (its KV row written there; ref_seq_pos unchanged): x =
 * eh_proj [rmsnorm(e of token)*enorm; rmsnorm(h_prev)*hnorm] (h_prev NULL: zeros), then the
 * attention layer blk.n_layer with its MoE (its own routing), rmsnorm(x)*head_norm into h_out
 * (E, may be NULL: the next draft's h_prev) and the output matrix into logits (may be NULL).
 * The pairing is llama.cpp's (graph_mtp, common/speculative.cpp): the row at p reads the
 * trunk's h at p - 1 and the token at p. */
void ref_mtp_row(ref_seq *s, int64_t pos, int32_t token, const double *h_prev, double *h_out, double *logits);

/* ---- introspection (pointers into the sequence; valid until it is freed) ---- */
int64_t ref_seq_pos(const ref_seq *s);
/* Layer il's lane: Gv × S × S doubles, index (h*S + i)*S + j, i key dim, j value dim.
 * NULL for attention layers. */
double *ref_seq_lane(ref_seq *s, int il);
/* Layer il's ring: (W-1) × C doubles, row 0 the oldest pre-conv qkv row. NULL for
 * attention layers. */
double *ref_seq_ring(ref_seq *s, int il);
/* Layer il's KV history: rows [0, pos), each Hkv × D doubles, k after norm and RoPE.
 * NULL for GDN layers. */
const double *ref_seq_kv_k(const ref_seq *s, int il);
const double *ref_seq_kv_v(const ref_seq *s, int il);
/* The K experts layer il chose in the last step (by descending probability) and their
 * renormalised weights. */
const int32_t *ref_seq_experts(const ref_seq *s, int il);
/* The top-K the reference itself chose in the last step (differs from ref_seq_experts only
 * under forced routing), and layer il's router probabilities (X) in the last step. */
const int32_t *ref_seq_own_experts(const ref_seq *s, int il);
const double *ref_seq_router_probs(const ref_seq *s, int il);
/* Forced routing: the following steps use these experts ((L, K), e.g. an engine's choices)
 * instead of the reference's own top-K, weighted by the reference's own probabilities
 * renormalised over them; NULL returns to its own choice. The pointer must stay valid. So
 * an engine and the reference can be compared on arithmetic alone, routing flips counted
 * apart. */
void ref_seq_force_experts(ref_seq *s, const int32_t *experts);
const double *ref_seq_expert_weights(const ref_seq *s, int il);
/* Activation rounding: with on, every matrix-vector product whose weights are quantized
 * first rounds its input as the engines do (float, then quant_quantize_act's 8-bit blocks:
 * Q8_K for K-quants, Q8_0 for Q8_0), the rest stays double. A second, independent draw of
 * the noise that rounding adds, so a test can measure that noise instead of guessing it. */
void ref_seq_round_activations(ref_seq *s, bool on);
/* The residual stream (E) after layer il in the last step. */
const double *ref_seq_hidden(const ref_seq *s, int il);

/* ---- primitives (what the layers use; exposed for unit checks) ---- */
/* One delta-rule step on one head: S (n×n, row i key dim, column j value dim), q k (n,
 * q already scaled), v (n), decay g (S is multiplied by exp(g)), beta; o (n) = Sᵀq after
 * the update. */
void ref_delta_step(double *S, int64_t n, const double *q, const double *k, const double *v,
                    double g, double beta, double *o);
/* NeoX RoPE on the first n_rot dims of x at position pos with base theta; sections may be
 * NULL (plain 1-D: every pair rotates by pos) or the 4 M-RoPE sections (text positions). */
void ref_rope(double *x, int64_t n_rot, int64_t pos, double theta, const int32_t sections[4]);
/* Whether pair i (of n_rot/2) takes the token position (true) or the zero 4th component. */
bool ref_rope_pair_rotates(const int32_t sections[4], int64_t i);
/* x (n) → x / sqrt(mean(x²) + eps) * w (w may be NULL for no weight). In place. */
void ref_rmsnorm(double *x, int64_t n, double eps, const double *w);

#endif
