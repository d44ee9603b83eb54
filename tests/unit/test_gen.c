/* test_gen.c: `hearth gen`'s library: the q36 tensor table and the Qwen3.5 size presets against
 * MODEL.md, llama.cpp's Q4_K_M type mix, tiny files at every quantization that model_load binds, determinism
 * (per seed, independent of the thread count), finite weights with the intended means and
 * spreads, and the vocabularies (built-in, a synthetic tokenizer.json with its malformed
 * variants, and Qwen3's real tokenizer when tools/peer/fetch_tokenizer.sh has cached it). */
#include "unit/harness.h"
#include "make/gen.h"
#include "format/gguf.h"
#include "model/model.h"
#include "format/quant.h"
#include "base/util.h"
#include "make/vocab_import.h"

#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    fputs(text, f);
    fclose(f);
}

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = test_read(a, &na), *y = test_read(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static const tensor_spec *find_spec(const tensor_spec *s, int64_t n, const char *name) {
    for (int64_t i = 0; i < n; i++) if (!strcmp(s[i].name, name)) return &s[i];
    return NULL;
}

static void check_shape(const tensor_spec *s, int64_t n, const char *name, int64_t a, int64_t b, int64_t c) {
    const tensor_spec *t = find_spec(s, n, name);
    CHECK_MSG(t, "missing %s", name);
    if (!t) return;
    int64_t want[3] = {a, b, c};
    uint32_t dims = c > 1 ? 3 : b > 1 ? 2 : 1;
    CHECK_MSG(t->n_dims == dims && t->ne[0] == want[0] && t->ne[1] == want[1] && t->ne[2] == want[2],
              "%s: {%lld, %lld, %lld} (%u dims), expected {%lld, %lld, %lld}", name, (long long)t->ne[0],
              (long long)t->ne[1], (long long)t->ne[2], t->n_dims, (long long)a, (long long)b, (long long)c);
}

TEST(q36_table_matches_model_md) {
    model_hparams hp;
    herr e;
    CHECK(gen_preset("q36", &hp, &e) == 0);
    CHECK(hp.n_layer == 40 && hp.n_vocab == 248320 && hp.n_embd == 2048 && hp.n_expert == 256);
    CHECK(hp.ssm_d_inner == 4096 && hp.n_ctx_train == 262144 && hp.n_layer_nextn == 0);
    tensor_spec *s;
    int64_t n = model_tensor_specs(&hp, &s);
    CHECK_MSG(n == 3 + 30 * 19 + 10 * 16, "%lld tensors", (long long)n);
    check_shape(s, n, "token_embd.weight", 2048, 248320, 1);
    check_shape(s, n, "output.weight", 2048, 248320, 1);
    check_shape(s, n, "output_norm.weight", 2048, 1, 1);
    check_shape(s, n, "blk.0.attn_norm.weight", 2048, 1, 1);
    check_shape(s, n, "blk.0.post_attention_norm.weight", 2048, 1, 1);
    check_shape(s, n, "blk.0.attn_qkv.weight", 2048, 8192, 1);
    check_shape(s, n, "blk.0.attn_gate.weight", 2048, 4096, 1);
    check_shape(s, n, "blk.0.ssm_conv1d.weight", 4, 8192, 1);
    check_shape(s, n, "blk.0.ssm_dt.bias", 32, 1, 1);
    check_shape(s, n, "blk.0.ssm_a", 32, 1, 1);
    check_shape(s, n, "blk.0.ssm_beta.weight", 2048, 32, 1);
    check_shape(s, n, "blk.0.ssm_alpha.weight", 2048, 32, 1);
    check_shape(s, n, "blk.0.ssm_norm.weight", 128, 1, 1);
    check_shape(s, n, "blk.0.ssm_out.weight", 4096, 2048, 1);
    check_shape(s, n, "blk.3.attn_q.weight", 2048, 8192, 1);
    check_shape(s, n, "blk.3.attn_k.weight", 2048, 512, 1);
    check_shape(s, n, "blk.3.attn_v.weight", 2048, 512, 1);
    check_shape(s, n, "blk.3.attn_output.weight", 4096, 2048, 1);
    check_shape(s, n, "blk.3.attn_q_norm.weight", 256, 1, 1);
    check_shape(s, n, "blk.3.attn_k_norm.weight", 256, 1, 1);
    check_shape(s, n, "blk.39.attn_q.weight", 2048, 8192, 1);
    check_shape(s, n, "blk.0.ffn_gate_inp.weight", 2048, 256, 1);
    check_shape(s, n, "blk.0.ffn_gate_exps.weight", 2048, 512, 256);
    check_shape(s, n, "blk.0.ffn_up_exps.weight", 2048, 512, 256);
    check_shape(s, n, "blk.0.ffn_down_exps.weight", 512, 2048, 256);
    check_shape(s, n, "blk.0.ffn_gate_inp_shexp.weight", 2048, 1, 1);
    check_shape(s, n, "blk.0.ffn_gate_shexp.weight", 2048, 512, 1);
    check_shape(s, n, "blk.0.ffn_up_shexp.weight", 2048, 512, 1);
    check_shape(s, n, "blk.0.ffn_down_shexp.weight", 512, 2048, 1);
    CHECK(!find_spec(s, n, "blk.3.attn_qkv.weight") && !find_spec(s, n, "blk.0.attn_q.weight"));
    free(s);
}

static uint32_t type_of(const model_hparams *hp, const tensor_spec *s, int64_t n, const char *name, gen_quant q) {
    const tensor_spec *t = find_spec(s, n, name);
    return t ? gen_tensor_type(hp, t, q) : UINT32_MAX;
}

TEST(q4_k_m_mix_follows_llama_cpp) {
    model_hparams hp;
    herr e;
    CHECK(gen_preset("q36", &hp, &e) == 0);
    tensor_spec *s;
    int64_t n = model_tensor_specs(&hp, &s);
    const gen_quant Q = GEN_Q4_K_M;
    CHECK(type_of(&hp, s, n, "output.weight", Q) == QT_Q6_K);
    CHECK(type_of(&hp, s, n, "token_embd.weight", Q) == QT_Q4_K);
    /* use_more_bits(i, 40): i < 5, i >= 35, (i - 5) % 3 == 2 */
    CHECK(type_of(&hp, s, n, "blk.0.attn_qkv.weight", Q) == QT_Q6_K);
    CHECK(type_of(&hp, s, n, "blk.3.attn_v.weight", Q) == QT_Q6_K);
    CHECK(type_of(&hp, s, n, "blk.5.attn_qkv.weight", Q) == QT_Q4_K);
    CHECK(type_of(&hp, s, n, "blk.7.attn_v.weight", Q) == QT_Q6_K);
    CHECK(type_of(&hp, s, n, "blk.11.attn_v.weight", Q) == QT_Q4_K);
    CHECK(type_of(&hp, s, n, "blk.0.ffn_down_exps.weight", Q) == QT_Q6_K);
    CHECK(type_of(&hp, s, n, "blk.0.ffn_down_shexp.weight", Q) == QT_Q6_K);
    CHECK(type_of(&hp, s, n, "blk.6.ffn_down_exps.weight", Q) == QT_Q4_K);
    CHECK(type_of(&hp, s, n, "blk.37.ffn_down_exps.weight", Q) == QT_Q6_K);
    CHECK(type_of(&hp, s, n, "blk.6.ffn_gate_exps.weight", Q) == QT_Q4_K);
    CHECK(type_of(&hp, s, n, "blk.3.attn_k.weight", Q) == QT_Q4_K);
    CHECK(type_of(&hp, s, n, "blk.3.attn_output.weight", Q) == QT_Q4_K);
    CHECK(type_of(&hp, s, n, "blk.0.ssm_beta.weight", Q) == QT_Q4_K);
    CHECK(type_of(&hp, s, n, "blk.0.ssm_out.weight", Q) == QT_Q4_K);
    CHECK(type_of(&hp, s, n, "blk.0.ffn_gate_inp.weight", Q) == QT_F32);
    CHECK(type_of(&hp, s, n, "blk.0.ffn_gate_inp_shexp.weight", Q) == QT_F32);
    CHECK(type_of(&hp, s, n, "blk.0.ssm_conv1d.weight", Q) == QT_F32);
    CHECK(type_of(&hp, s, n, "blk.0.ssm_a", Q) == QT_F32);
    CHECK(type_of(&hp, s, n, "blk.0.ssm_dt.bias", Q) == QT_F32);
    CHECK(type_of(&hp, s, n, "blk.3.attn_q_norm.weight", Q) == QT_F32);
    CHECK(type_of(&hp, s, n, "blk.0.ffn_gate_exps.weight", GEN_Q8_0) == QT_Q8_0);
    CHECK(type_of(&hp, s, n, "output.weight", GEN_Q8_0) == QT_Q8_0);
    CHECK(type_of(&hp, s, n, "blk.0.ffn_gate_inp.weight", GEN_Q8_0) == QT_F32);
    CHECK(type_of(&hp, s, n, "blk.0.ffn_gate_exps.weight", GEN_F32) == QT_F32);
    /* the whole file: about 21 GB, like the public Q4_K_M files of the 35B-A3B */
    uint64_t bytes = 0;
    for (int64_t i = 0; i < n; i++)
        bytes += qtype_row_bytes(gen_tensor_type(&hp, &s[i], Q), s[i].ne[0]) * (uint64_t)(s[i].ne[1] * s[i].ne[2]);
    CHECK_MSG(bytes > 19e9 && bytes < 23e9, "q36 q4_k_m tensor bytes %.2f GB", bytes / 1e9);
    free(s);

    /* the 8-expert rules of llama.cpp apply to tiny */
    CHECK(gen_preset("tiny", &hp, &e) == 0);
    n = model_tensor_specs(&hp, &s);
    CHECK(type_of(&hp, s, n, "blk.0.attn_qkv.weight", Q) == QT_Q8_0);
    CHECK(type_of(&hp, s, n, "blk.3.attn_v.weight", Q) == QT_Q8_0);
    CHECK(type_of(&hp, s, n, "blk.3.attn_k.weight", Q) == QT_Q8_0);
    CHECK(type_of(&hp, s, n, "blk.3.attn_output.weight", Q) == QT_Q5_K);
    CHECK(type_of(&hp, s, n, "blk.2.ffn_down_exps.weight", Q) == QT_Q6_K);
    CHECK(type_of(&hp, s, n, "blk.1.ffn_down_exps.weight", Q) == QT_Q4_K);
    free(s);
}

/* The Qwen3.5 size presets against docs/MODEL.md's tables: hyperparameters, the tensor count,
 * the widths the GDN and attention layers and the FFN derive from them, and two published
 * totals: the parameter count and the Q8_0 file size of Unsloth's GGUF files (ggml-org/Llama-
 * macOS pull request 63; the 122B's count from a llama.cpp run of its file, the 397B's from its
 * name). A wrong width, or a separate head on a tied model, moves them by more than the
 * rounding. Tied models (the 0.8B, 2B, 4B) ship no lm_head and gen writes none for them: their
 * head is token_embd, at the output's type (Q6_K at q4_k_m, as llama-quantize gives a tied
 * token_embd). Only the tables: no file is written. */
TEST(q35_presets_match_model_md) {
    static const struct {
        const char *name;
        bool dense, tied;
        int64_t embd, layers, heads, kv, ff, experts, used, ff_exp, ff_shexp, k_heads, v_heads;
        double params, q8_gb; /* published; the file sizes rounded to 0.1 GB (0.8B: to 1 MB) */
    } P[] = {
        {"q35-0.8b", true, true, 1024, 24, 8, 2, 3584, 0, 0, 0, 0, 16, 16, 0.758e9, 0.812},
        {"q35-2b", true, true, 2048, 24, 8, 2, 6144, 0, 0, 0, 0, 16, 16, 1.89e9, 2.0},
        {"q35-4b", true, true, 2560, 32, 16, 4, 9216, 0, 0, 0, 0, 16, 32, 4.21e9, 4.5},
        {"q35-9b", true, false, 4096, 32, 16, 4, 12288, 0, 0, 0, 0, 16, 32, 8.96e9, 9.5},
        {"q35-27b", true, false, 5120, 64, 24, 4, 17408, 0, 0, 0, 0, 16, 48, 26.9e9, 28.6},
        {"q35-122b", false, false, 3072, 48, 32, 2, 0, 256, 8, 1024, 1024, 16, 64, 122.11e9, 129.9},
        {"q35-397b", false, false, 4096, 60, 32, 2, 0, 512, 10, 1024, 1024, 16, 64, 397e9, 421.5},
    };
    for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) {
        model_hparams hp;
        herr e;
        const char *nm = P[i].name;
        CHECK_MSG(gen_preset(nm, &hp, &e) == 0, "%s: %s", nm, e.msg);
        CHECK_MSG(!strcmp(hp.arch, P[i].dense ? "qwen35" : "qwen35moe") && hp.dense == P[i].dense, "%s: %s", nm, hp.arch);
        CHECK_MSG(hp.n_embd == P[i].embd && hp.n_layer == P[i].layers && hp.n_head == P[i].heads &&
                  hp.n_head_kv == P[i].kv && hp.head_dim == 256 && hp.rope_dims == 64, "%s: attention widths", nm);
        CHECK_MSG(hp.n_ff == P[i].ff && hp.n_expert == P[i].experts && hp.n_expert_used == P[i].used &&
                  hp.n_ff_exp == P[i].ff_exp && hp.n_ff_shexp == P[i].ff_shexp, "%s: FFN widths", nm);
        CHECK_MSG(hp.ssm_n_group == P[i].k_heads && hp.ssm_dt_rank == P[i].v_heads && hp.ssm_d_state == 128 &&
                  hp.ssm_d_conv == 4 && hp.ssm_d_inner == P[i].v_heads * 128 && hp.full_attn_interval == 4,
                  "%s: GDN widths", nm);
        CHECK_MSG(hp.n_vocab == 248320 && hp.n_ctx_train == 262144 && hp.rms_eps == 1e-6f && hp.rope_theta == 1e7f &&
                  hp.n_layer_nextn == 0, "%s: vocab, context, eps, theta", nm);
        tensor_spec *s;
        const int64_t n = model_tensor_specs(&hp, &s);
        const int64_t L = P[i].layers, E = P[i].embd, ffn = P[i].dense ? 3 : 8;
        CHECK_MSG(n == 3 - P[i].tied + (L - L / 4) * (11 + ffn) + L / 4 * (8 + ffn), "%s: %lld tensors", nm, (long long)n);
        const int64_t conv = 2 * 16 * 128 + P[i].v_heads * 128;
        check_shape(s, n, "blk.0.attn_qkv.weight", E, conv, 1);
        check_shape(s, n, "blk.0.ssm_conv1d.weight", 4, conv, 1);
        check_shape(s, n, "blk.0.ssm_a", P[i].v_heads, 1, 1);
        check_shape(s, n, "blk.0.ssm_out.weight", P[i].v_heads * 128, E, 1);
        check_shape(s, n, "blk.3.attn_q.weight", E, 2 * P[i].heads * 256, 1);
        check_shape(s, n, "blk.3.attn_k.weight", E, P[i].kv * 256, 1);
        check_shape(s, n, "blk.3.attn_output.weight", P[i].heads * 256, E, 1);
        if (P[i].dense) {
            check_shape(s, n, "blk.0.ffn_gate.weight", E, P[i].ff, 1);
            check_shape(s, n, "blk.3.ffn_down.weight", P[i].ff, E, 1);
        } else {
            check_shape(s, n, "blk.0.ffn_gate_exps.weight", E, P[i].ff_exp, P[i].experts);
            check_shape(s, n, "blk.3.ffn_down_exps.weight", P[i].ff_exp, E, P[i].experts);
            check_shape(s, n, "blk.0.ffn_up_shexp.weight", E, P[i].ff_shexp, 1);
        }
        if (P[i].tied) {
            bool head = false;
            for (int64_t j = 0; j < n; j++) head |= !strcmp(s[j].name, "output.weight");
            CHECK_MSG(!head, "%s: tied, yet an output.weight", nm);
            CHECK_MSG(type_of(&hp, s, n, "token_embd.weight", GEN_Q4_K_M) == QT_Q6_K, "%s: a tied token_embd at q4_k_m", nm);
        } else {
            check_shape(s, n, "output.weight", E, 248320, 1);
            CHECK_MSG(type_of(&hp, s, n, "token_embd.weight", GEN_Q4_K_M) == QT_Q4_K, "%s: token_embd at q4_k_m", nm);
        }
        double params = 0, q8 = 0;
        for (int64_t j = 0; j < n; j++) {
            params += (double)s[j].ne[0] * (double)s[j].ne[1] * (double)s[j].ne[2] * (double)s[j].ne[3];
            q8 += (double)qtype_row_bytes(gen_tensor_type(&hp, &s[j], GEN_Q8_0), s[j].ne[0]) * (double)s[j].ne[1] *
                  (double)s[j].ne[2];
        }
        CHECK_MSG(fabs(params / P[i].params - 1) < 0.01, "%s: %.4g parameters, published %.4g", nm, params, P[i].params);
        /* half the rounding, and the metadata (the 248320 tokens and merges: ~10 MB) */
        CHECK_MSG(fabs(q8 / 1e9 - P[i].q8_gb) <= 0.05 + 0.002 * P[i].q8_gb, "%s: Q8_0 tensors %.3f GB, the file %.3f GB",
                  nm, q8 / 1e9, P[i].q8_gb);
        free(s);
    }
}

TEST(cli_parsers) {
    model_hparams hp;
    gen_quant q;
    herr e;
    CHECK(gen_preset("huge", &hp, &e) < 0 && strstr(e.msg, "huge") && strstr(e.msg, "tiny"));
    CHECK(gen_quant_parse("Q4_K_M", &q, &e) == 0 && q == GEN_Q4_K_M);
    CHECK(gen_quant_parse("q8_0", &q, &e) == 0 && q == GEN_Q8_0);
    CHECK(gen_quant_parse("q5_k", &q, &e) < 0 && strstr(e.msg, "q5_k"));
    CHECK(gen_file_type(GEN_F32) == 0 && gen_file_type(GEN_Q8_0) == 7 && gen_file_type(GEN_Q4_K_M) == 15);
    CHECK(gen_preset("small", &hp, &e) == 0 && hp.n_vocab == 16384 && hp.n_expert == 64);
}

static int gen_file(const char *preset, gen_quant q, uint64_t seed, int threads, const char *tok, const char *path) {
    gen_opts o = {.preset = preset, .quant = q, .seed = seed, .n_threads = threads, .tokenizer = tok, .out_path = path};
    herr e;
    gen_stats st;
    if (gen_write(&o, &st, &e) < 0) {
        fprintf(stderr, "    gen_write %s: %s\n", path, e.msg);
        return -1;
    }
    return 0;
}

/* Every tensor finite; norms 1; ssm_a and ssm_dt in range; random matrices with mean ~0
 * and the std init_of intends (1/sqrt(ne0), token_embd 1). */
static void check_weights(model *m, gen_quant q) {
    gguf_file *f = m->file;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
        const size_t rb = qtype_row_bytes(t->type, ne0);
        float *row = xmalloc((size_t)ne0 * sizeof *row);
        double sum = 0, sum2 = 0, lo = INFINITY, hi = -INFINITY;
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; r++) {
            quant_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, row, ne0);
            for (int64_t k = 0; k < ne0; k++) {
                double x = row[k];
                if (!isfinite(x)) bad++;
                sum += x; sum2 += x * x;
                if (x < lo) lo = x;
                if (x > hi) hi = x;
            }
        }
        free(row);
        const double n = (double)(ne0 * rows), mean = sum / n, sd = sqrt(sum2 / n - mean * mean);
        CHECK_MSG(bad == 0, "%s (%s): %lld non-finite values", t->name, gen_quant_name(q), (long long)bad);
        if (strstr(t->name, "norm.weight")) {
            CHECK_MSG(lo == 1 && hi == 1, "%s: norm weights in [%g, %g], expected 1", t->name, lo, hi);
        } else if (strstr(t->name, ".ssm_a") && !strstr(t->name, "ssm_alpha")) {
            CHECK_MSG(lo >= -expf(1) - 1e-5 && hi <= -expf(-1) + 1e-6, "%s in [%g, %g]", t->name, lo, hi);
        } else if (strstr(t->name, "ssm_dt")) {
            double slo = log1p(exp(lo)), shi = log1p(exp(hi)); /* softplus(bias) = dt */
            CHECK_MSG(slo >= 0.99e-3 && shi <= 1.01e-1, "%s: softplus in [%g, %g]", t->name, slo, shi);
        } else if (n >= 8192) {
            const double want = !strcmp(t->name, "token_embd.weight") ? 1.0 : 1.0 / sqrt((double)ne0);
            CHECK_MSG(fabs(mean) < 6 * want / sqrt(n) + 0.01 * want, "%s (%s): mean %g, std wanted %g", t->name,
                      qtype_name(t->type), mean, want);
            CHECK_MSG(fabs(sd / want - 1) < 0.05, "%s (%s): std %g, wanted %g", t->name, qtype_name(t->type), sd, want);
        }
    }
}

TEST(tiny_files_load_at_every_quant) {
    const gen_quant qs[] = {GEN_F32, GEN_Q8_0, GEN_Q4_K_M};
    for (int k = 0; k < 3; k++) {
        const char *path = tmp_path(k == 0 ? "tiny_f32.gguf" : k == 1 ? "tiny_q8_0.gguf" : "tiny_q4km.gguf");
        CHECK(gen_file("tiny", qs[k], 1, 2, NULL, path) == 0);
        model *m = NULL;
        herr e;
        int rc = model_load(&m, path, &e);
        CHECK_MSG(rc == 0, "model_load %s: %s", path, rc ? e.msg : "");
        if (rc) continue;
        CHECK(m->hp.n_layer == 4 && m->hp.n_vocab == 1024 && !m->hp.is_recurrent[3] && m->hp.is_recurrent[0]);
        /* types as chosen, shapes as the table */
        tensor_spec *s;
        int64_t n = model_tensor_specs(&m->hp, &s);
        CHECK(gguf_n_tensors(m->file) == n);
        for (int64_t i = 0; i < n; i++) {
            const gguf_tensor *t = gguf_find_tensor(m->file, s[i].name);
            CHECK_MSG(t && t->type == gen_tensor_type(&m->hp, &s[i], qs[k]), "%s type", s[i].name);
        }
        free(s);
        CHECK(m->layers[3].attn_out.type == (qs[k] == GEN_Q4_K_M ? QT_Q5_K : qs[k] == GEN_Q8_0 ? QT_Q8_0 : QT_F32));
        /* metadata */
        uint32_t ft = 99, qv = 0;
        CHECK(gguf_get_u32(m->file, "general.file_type", &ft, &e) == 0 && ft == gen_file_type(qs[k]));
        CHECK(gguf_get_u32(m->file, "general.quantization_version", &qv, &e) == 0 && qv == 2);
        gguf_str name;
        CHECK(gguf_get_str(m->file, "general.name", &name, &e) == 0 && name.len > 0);
        const gguf_value *toks, *types, *merges;
        CHECK(gguf_get_arr(m->file, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &e) == 0 && toks->v.arr.n == 1024);
        CHECK(gguf_get_arr(m->file, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, &e) == 0 &&
              types->v.arr.n == 1024);
        CHECK(gguf_get_arr(m->file, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges, &e) == 0 &&
              merges->v.arr.n > 300);
        uint32_t eos = 0, bos = 0;
        CHECK(gguf_get_u32(m->file, "tokenizer.ggml.eos_token_id", &eos, &e) == 0 && eos < 1024 &&
              gguf_str_eq(toks->v.arr.strs[eos], "<|im_end|>") && gguf_arr_int(types, eos) == VTT_CONTROL);
        CHECK(gguf_get_u32(m->file, "tokenizer.ggml.bos_token_id", &bos, &e) == 0 &&
              gguf_str_eq(toks->v.arr.strs[bos], "<|endoftext|>"));
        CHECK(gguf_str_eq(toks->v.arr.strs[1023], "[PAD1023]") && gguf_arr_int(types, 1023) == VTT_UNUSED);
        gguf_str s1;
        CHECK(gguf_get_str(m->file, "tokenizer.ggml.model", &s1, &e) == 0 && gguf_str_eq(s1, "gpt2"));
        CHECK(gguf_get_str(m->file, "tokenizer.ggml.pre", &s1, &e) == 0 && gguf_str_eq(s1, "qwen2"));
        CHECK(gguf_get_str(m->file, "tokenizer.chat_template", &s1, &e) == 0 && s1.len > 50);
        bool add_bos = true;
        CHECK(gguf_get_bool(m->file, "tokenizer.ggml.add_bos_token", &add_bos, &e) == 0 && !add_bos);
        check_weights(m, qs[k]);
        model_free(m);
    }
}

TEST(deterministic_per_seed_and_thread_count) {
    const gen_quant qs[] = {GEN_F32, GEN_Q4_K_M};
    for (int k = 0; k < 2; k++) {
        const char *a = tmp_path("det_a.gguf"), *b = tmp_path("det_b.gguf"), *c = tmp_path("det_c.gguf");
        CHECK(gen_file("tiny", qs[k], 7, 1, NULL, a) == 0);
        CHECK(gen_file("tiny", qs[k], 7, 2, NULL, b) == 0);
        CHECK(gen_file("tiny", qs[k], 8, 3, NULL, c) == 0);
        CHECK_MSG(same_file(a, b), "%s: -t 1 and -t 2 differ", gen_quant_name(qs[k]));
        CHECK_MSG(!same_file(a, c), "%s: seeds 7 and 8 give the same file", gen_quant_name(qs[k]));
        /* the weights differ, not just the seed recorded in the metadata */
        model *ma = NULL, *mc = NULL;
        herr e;
        if (model_load(&ma, a, &e) == 0 && model_load(&mc, c, &e) == 0) {
            size_t nb = qtype_row_bytes(ma->layers[0].ffn_up_exps.type, ma->layers[0].ffn_up_exps.ne[0]);
            CHECK(memcmp(ma->layers[0].ffn_up_exps.data, mc->layers[0].ffn_up_exps.data, nb) != 0);
        } else {
            CHECK_MSG(0, "model_load: %s", e.msg);
        }
        model_free(ma);
        model_free(mc);
        unlink(a); unlink(b); unlink(c);
    }
}

TEST(failure_leaves_no_file) {
    gen_opts o = {.preset = "tiny", .quant = GEN_F32, .seed = 1, .n_threads = 1,
                  .tokenizer = tmp_path("no_such_tokenizer.json"), .out_path = tmp_path("never.gguf")};
    herr e;
    CHECK(gen_write(&o, NULL, &e) < 0 && strstr(e.msg, "no_such_tokenizer.json"));
    CHECK(access(o.out_path, F_OK) != 0);
    o.tokenizer = NULL;
    o.out_path = tmp_path("no_dir/x.gguf");
    CHECK(gen_write(&o, NULL, &e) < 0);
}

/* ---- vocabularies ---- */

static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Plain BPE over one pre-token (already in byte-symbol form): merge the lowest-ranked pair.
 * Symbols are [start, end) spans of the pre-token's symbol string. */
static int bpe_count(const vocab_def *v, const char *text) {
    char str[256] = "";
    int start[64], n = 0;
    size_t len = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && n < 63; p++) {
        char sym[4];
        vocab_byte_symbol(*p, sym);
        start[n++] = (int)len;
        memcpy(str + len, sym, strlen(sym));
        len += strlen(sym);
    }
    start[n] = (int)len;
    for (;;) {
        int best = -1;
        int64_t best_rank = INT64_MAX;
        for (int i = 0; i + 1 < n; i++) {
            char m[300];
            int la = start[i + 1] - start[i], lb = start[i + 2] - start[i + 1];
            snprintf(m, sizeof m, "%.*s %.*s", la, str + start[i], lb, str + start[i + 1]);
            for (int64_t r = 0; r < v->n_merges && r < best_rank; r++)
                if (!strcmp(v->merges[r], m)) { best_rank = r; best = i; break; }
        }
        if (best < 0) return n;
        memmove(&start[best + 1], &start[best + 2], (size_t)(n - best - 1) * sizeof start[0]);
        n--;
    }
}

TEST(builtin_vocab) {
    vocab_def v;
    vocab_def_builtin(&v);
    CHECK_MSG(v.n_tokens <= 1024 && v.n_tokens > 800, "%lld tokens", (long long)v.n_tokens);
    CHECK(v.n_real == v.n_tokens && v.n_merges > 500);
    /* unique strings */
    char **sorted = xmalloc((size_t)v.n_tokens * sizeof *sorted);
    memcpy(sorted, v.tokens, (size_t)v.n_tokens * sizeof *sorted);
    qsort(sorted, (size_t)v.n_tokens, sizeof *sorted, str_cmp);
    for (int64_t i = 1; i < v.n_tokens; i++) CHECK_MSG(strcmp(sorted[i - 1], sorted[i]), "duplicate token %s", sorted[i]);
    free(sorted);
    /* every merge joins two tokens into a token */
    int bad = 0;
    for (int64_t i = 0; i < v.n_merges; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", v.merges[i]);
        char *sp = strchr(buf + 1, ' ');
        if (!sp) { bad++; continue; }
        *sp = 0;
        char joined[256];
        snprintf(joined, sizeof joined, "%s%s", buf, sp + 1);
        if (vocab_def_find(&v, buf) < 0 || vocab_def_find(&v, sp + 1) < 0 || vocab_def_find(&v, joined) < 0) bad++;
    }
    CHECK_MSG(bad == 0, "%d inconsistent merges", bad);
    /* byte symbols: space is U+0120, "!" is token 0 (GPT-2 order) */
    char sym[4];
    vocab_byte_symbol(' ', sym);
    CHECK(!strcmp(sym, "\xc4\xa0") && !strcmp(v.tokens[0], "!"));
    CHECK(vocab_def_find(&v, "\xc4\xa0the") >= 256);
    int64_t ims = vocab_def_find(&v, "<|im_start|>"), think = vocab_def_find(&v, "<think>");
    CHECK(ims > 0 && v.types[ims] == VTT_CONTROL && think > 0 && v.types[think] == VTT_USER_DEFINED);
    CHECK(vocab_def_find(&v, "</tool_call>") > 0 && v.eos == vocab_def_find(&v, "<|im_end|>"));
    CHECK(v.bos == v.pad && v.pad == vocab_def_find(&v, "<|endoftext|>") && !v.add_bos);
    CHECK(v.chat_template && strstr(v.chat_template, "<|im_start|>") && strstr(v.chat_template, "add_generation_prompt"));
    /* English compresses: fewer tokens than bytes */
    const char *words[] = {"The", " people", " would", " like", " to", " know", " the", " answer", " to", " this",
                           " question", " because", " it", " is", " important", ".\n"};
    int bytes = 0, toks = 0;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        bytes += (int)strlen(words[i]);
        toks += bpe_count(&v, words[i]);
    }
    CHECK_MSG(toks * 2 < bytes, "%d tokens for %d bytes", toks, bytes);
    vocab_def_pad(&v, 1024);
    CHECK(v.n_tokens == 1024 && !strcmp(v.tokens[1023], "[PAD1023]") && v.types[1023] == VTT_UNUSED);
    vocab_def_free(&v);
}

static const char *synthetic_tokenizer =
    "{\"version\": \"1.0\", \"added_tokens\": ["
    "  {\"id\": 9, \"content\": \"<|endoftext|>\", \"special\": true},"
    "  {\"id\": 10, \"content\": \"<|im_end|>\", \"special\": true},"
    "  {\"id\": 12, \"content\": \"<think>\", \"special\": false},"
    "  {\"id\": 13, \"content\": \"<|fim_pad|>\", \"special\": false}],"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\"}, {\"type\": \"ByteLevel\"}]},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\xc4\xa0\": 3, \"\xc4\xa0" "ab\": 4,"
    "   \"c\": 5, \"abc\": 6, \"x y\": 7},"
    "  \"merges\": %s}}";

static void write_tokenizer(const char *dir, const char *merges, const char *config) {
    mkdir(dir, 0755);
    char path[600], buf[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(buf, sizeof buf, synthetic_tokenizer, merges);
    write_text(path, buf);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (config) write_text(path, config);
    else unlink(path);
}

TEST(hf_import_synthetic) {
    const char *dir = tmp_path("tok1");
    write_tokenizer(dir, "[\"a b\", \"\xc4\xa0 ab\", \"ab c\"]",
                    "{\"eos_token\": \"<|im_end|>\", \"bos_token\": null, \"pad_token\": {\"content\": \"<|endoftext|>\"},"
                    " \"add_bos_token\": false, \"chat_template\": \"{{ messages }}\"}");
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    vocab_def v;
    herr e;
    int rc = vocab_def_from_hf(&v, path, &e);
    CHECK_MSG(rc == 0, "%s", rc ? e.msg : "");
    if (rc) return;
    CHECK(v.n_tokens == 14 && v.n_real == 12);
    CHECK(!strcmp(v.tokens[11], "[PAD11]") && v.types[11] == VTT_UNUSED);
    CHECK(v.types[0] == VTT_NORMAL && v.types[9] == VTT_CONTROL && v.types[12] == VTT_USER_DEFINED);
    CHECK(v.types[13] == VTT_CONTROL); /* looks special */
    CHECK(v.eos == 10 && v.pad == 9 && v.bos == 9 && !v.add_bos);
    CHECK(v.n_merges == 3 && !strcmp(v.merges[1], "\xc4\xa0 ab"));
    CHECK(v.chat_template && !strcmp(v.chat_template, "{{ messages }}"));
    vocab_def_free(&v);

    /* merges as pairs; a space inside a part becomes U+0120; no tokenizer_config.json */
    write_tokenizer(dir, "[[\"a\", \"b\"], [\"x\", \" y\"]]", NULL);
    rc = vocab_def_from_hf(&v, path, &e);
    CHECK_MSG(rc == 0, "%s", rc ? e.msg : "");
    if (rc) return;
    CHECK(v.n_merges == 2 && !strcmp(v.merges[0], "a b") && !strcmp(v.merges[1], "x \xc4\xa0y"));
    CHECK(v.eos == 10 && v.chat_template == NULL); /* defaults: <|im_end|> ends a turn */
    vocab_def_free(&v);
}

static void expect_import_error(const char *merges, const char *config, const char *raw, const char *want1, const char *want2) {
    const char *dir = tmp_path("tokbad");
    write_tokenizer(dir, merges, config);
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (raw) write_text(path, raw);
    vocab_def v;
    herr e;
    int rc = vocab_def_from_hf(&v, path, &e);
    CHECK_MSG(rc < 0, "accepted a bad tokenizer (expected /%s/)", want2);
    if (rc == 0) { vocab_def_free(&v); return; }
    CHECK_MSG(strstr(e.msg, want1) && strstr(e.msg, want2), "message '%s' lacks '%s' / '%s'", e.msg, want1, want2);
}

TEST(hf_import_errors_name_file_and_field) {
    expect_import_error("[]", NULL, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", "tokenizer.json", "not valid JSON");
    expect_import_error("[]", NULL, "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"merges\": []}}",
                        "tokenizer.json", "model.vocab");
    expect_import_error("[]", NULL, "[1, 2]", "tokenizer.json", "model");
    expect_import_error("[]", NULL,
                        "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"Unigram\", \"vocab\": {}}}",
                        "tokenizer.json", "model.type");
    expect_import_error("[]", NULL, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                        "tokenizer.json", "ByteLevel");
    expect_import_error("[]", NULL,
                        "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}}",
                        "tokenizer.json", "model.vocab[\"a\"]");
    expect_import_error("[]", NULL,
                        "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
                        "tokenizer.json", "id 0");
    expect_import_error("[\"a b\", \"ab\"]", NULL, NULL, "tokenizer.json", "model.merges[1]");
    expect_import_error("[\"a b\", [\"a\"]]", NULL, NULL, "tokenizer.json", "model.merges[1]");
    expect_import_error("{}", NULL, NULL, "tokenizer.json", "model.merges");
    expect_import_error("[]", NULL,
                        "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [{\"id\": \"x\", \"content\": \"<a>\"}],"
                        " \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}",
                        "tokenizer.json", "added_tokens[0].id");
    expect_import_error("[]", "{\"eos_token\": ", NULL, "tokenizer_config.json", "not valid JSON");
    expect_import_error("[]", "{\"eos_token\": \"<nope>\"}", NULL, "tokenizer_config.json", "eos_token");
    expect_import_error("[]", "{\"chat_template\": 5}", NULL, "tokenizer_config.json", "chat_template");
}

static const char *qwen3_dir(void) {
    static char buf[512];
    const char *root = getenv("HEARTH_PEER_DIR");
    if (root) snprintf(buf, sizeof buf, "%s/tokenizer-qwen3", root);
    else snprintf(buf, sizeof buf, "%s/.cache/hearth-peer/tokenizer-qwen3", getenv("HOME") ? getenv("HOME") : "/tmp");
    return buf;
}

TEST(qwen3_real_tokenizer) {
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", qwen3_dir());
    if (access(path, R_OK) != 0) SKIP("no Qwen3 tokenizer cached (tools/peer/fetch_tokenizer.sh)");
    vocab_def v;
    herr e;
    int rc = vocab_def_from_hf(&v, path, &e);
    CHECK_MSG(rc == 0, "%s", rc ? e.msg : "");
    if (rc) return;
    CHECK_MSG(v.n_real == 151669 && v.n_tokens == 151669, "%lld tokens", (long long)v.n_real);
    CHECK(v.n_merges == 151387);
    CHECK(vocab_def_find(&v, "<|im_start|>") == 151644 && v.types[151644] == VTT_CONTROL);
    CHECK(v.eos == 151645 && !strcmp(v.tokens[151645], "<|im_end|>"));
    CHECK(v.pad == 151643 && v.bos == 151643 && !v.add_bos);
    CHECK(!strcmp(v.tokens[151667], "<think>") && v.types[151667] == VTT_USER_DEFINED);
    CHECK(!strcmp(v.tokens[151657], "<tool_call>") && v.types[151657] == VTT_USER_DEFINED);
    CHECK(v.types[151659] == VTT_CONTROL); /* <|fim_prefix|>: special=false, looks special */
    CHECK(!strcmp(v.tokens[0], "!") && vocab_def_find(&v, "\xc4\xa0the") == 279);
    CHECK(v.chat_template && strstr(v.chat_template, "<|im_start|>"));
    vocab_def_free(&v);

    /* tiny grows its vocab to hold it: 151669 -> 151808 (a multiple of 256) */
    const char *out = tmp_path("tiny_qwen3.gguf");
    CHECK(gen_file("tiny", GEN_Q4_K_M, 1, 2, qwen3_dir(), out) == 0);
    model *m = NULL;
    rc = model_load(&m, out, &e);
    CHECK_MSG(rc == 0, "%s", rc ? e.msg : "");
    if (rc) return;
    CHECK(m->hp.n_vocab == 151808);
    const gguf_value *toks;
    CHECK(gguf_get_arr(m->file, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &e) == 0 && toks->v.arr.n == 151808);
    CHECK(gguf_str_eq(toks->v.arr.strs[151644], "<|im_start|>") && gguf_str_eq(toks->v.arr.strs[151807], "[PAD151807]"));
    model_free(m);
    unlink(out);
}

int main(void) {
    const char *base = getenv("HEARTH_TMP");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_gen.XXXXXX", base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) { perror(tmpdir); return 1; }
    RUN(q36_table_matches_model_md);
    RUN(q4_k_m_mix_follows_llama_cpp);
    RUN(q35_presets_match_model_md);
    RUN(cli_parsers);
    RUN(tiny_files_load_at_every_quant);
    RUN(deterministic_per_seed_and_thread_count);
    RUN(failure_leaves_no_file);
    RUN(builtin_vocab);
    RUN(hf_import_synthetic);
    RUN(hf_import_errors_name_file_and_field);
    RUN(qwen3_real_tokenizer);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return harness_done();
}
