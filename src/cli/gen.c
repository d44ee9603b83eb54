/* cli/gen.c: `hearth gen`: writes a synthetic qwen35moe GGUF of a preset's shapes with random
 * weights (src/gen.h) and a built-in or imported tokenizer (src/vocab_import.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "make/gen.h"

static int parse_quant(const char *v, void *dst, herr *e) { return gen_quant_parse(v, (gen_quant *)dst, e); }

int cmd_gen(int argc, char **argv) {
    gen_opts o = {.preset = NULL, .quant = GEN_Q4_K_M, .seed = 1, .n_threads = 0, .log = stderr};
    int64_t seed = 1;
    herr e;
    const arg_opt opts[] = {
        ARG_STR("--preset", NULL, &o.preset, "NAME",
                "tiny (4 layers, 8 experts), small (8 layers, 64 experts, CPU benches),\n"
                "wide (every width of q36: vocab, experts, heads; 3 GDN + 1 attention layer),\n"
                "q36 (the shapes of Qwen3.6-35B-A3B: 40 layers, 256 experts, ~21 GB at q4_k_m),\n"
                "q35-122b and q35-397b (the shapes of Qwen3.5-122B-A10B and -397B-A17B);\n"
                "dense (architecture qwen35): tiny-dense (tiny's widths), wide-dense (every width\n"
                "of q35-27b; 3 GDN + 1 attention layer), q35-0.8b, q35-2b,\n"
                "q35-4b, q35-9b and q35-27b (the shapes of Qwen3.5-0.8B, -2B, -4B, -9B and -27B)"),
        ARG_FN("--quant", NULL, &o.quant, parse_quant, "f32|q8_0|q4_k_m", "tensor types (default q4_k_m)"),
        ARG_I64("--seed", NULL, &seed, 0, INT64_MAX, "N", "weights' seed (default 1)"),
        ARG_STR("--tokenizer", NULL, &o.tokenizer, "FILE|DIR",
                "a Hugging Face byte-level BPE tokenizer.json (tokenizer_config.json\n"
                "beside it is read too); default: a small built-in vocabulary with\n"
                "Qwen's special tokens and a ChatML template"),
        ARG_FLAG("--mtp", NULL, &o.mtp, "also the multi-token-prediction block (one more attention layer\n"
                 "with its MoE, as Qwen3.5/3.6 ship it), for --spec-mtp"),
        ARG_INT("--threads", "-t", &o.n_threads, 1, 1024, "N", "writer threads (default: every core)"),
        ARG_STR("--output", "-o", &o.out_path, "FILE", "the file to write"),
        ARG_END,
    };
    const arg_cmd cmd = {
        .name = "gen",
        .usage = "hearth gen --preset NAME --quant f32|q8_0|q4_k_m -o FILE\n"
                 "                  [--seed N] [--tokenizer tokenizer.json|DIR] [--mtp] [-t THREADS]",
        .about = "Writes a qwen35moe (or dense qwen35) GGUF with random weights (deterministic per seed, whatever the\n"
                 "thread count) in llama.cpp's F32, Q8_0 or Q4_K_M tensor-type mix.",
        .opts = opts,
    };
    int rc = args_parse(&cmd, argc, argv, NULL, NULL);
    if (rc != ARGS_RUN) return rc;
    o.seed = (uint64_t)seed;
    if (!o.preset) {
        fprintf(stderr, "hearth gen: --preset is required (tiny, small, wide, q36, q35-122b, q35-397b, tiny-dense, "
                        "wide-dense, q35-0.8b, q35-2b, q35-4b, q35-9b, q35-27b)\n");
        return 2;
    }
    model_hparams hp;
    if (gen_preset(o.preset, &hp, &e) < 0) {
        fprintf(stderr, "hearth gen: %s\n", e.msg);
        return 2;
    }
    if (!o.out_path || !*o.out_path) {
        fprintf(stderr, "hearth gen: -o FILE is required\n");
        return 2;
    }
    gen_stats st;
    if (gen_write(&o, &st, &e) < 0) {
        fprintf(stderr, "hearth gen: %s\n", e.msg);
        return 1;
    }
    fprintf(stderr, "gen: wrote %s: preset %s, %s, seed %" PRIu64 ", %" PRId64 " tensors, vocab %" PRId64
            ", %" PRIu64 " bytes (%.2f GB) in %.2f s\n",
            o.out_path, o.preset, gen_quant_name(o.quant), o.seed, st.n_tensors, st.n_vocab, st.file_bytes,
            (double)st.file_bytes / 1e9, st.seconds);
    return 0;
}
