/* cli/gen.c: `hearth gen`: writes a synthetic qwen35moe GGUF of a preset's shapes with random
 * weights (src/gen.h) and a built-in or imported tokenizer (src/vocab_import.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "make/gen.h"

static void gen_usage(FILE *out) {
    fprintf(out,
            "usage: hearth gen --preset tiny|small|q36 --quant f32|q8_0|q4_k_m -o FILE\n"
            "                  [--seed N] [--tokenizer tokenizer.json|DIR] [-t THREADS]\n"
            "\n"
            "Writes a qwen35moe GGUF with random weights (deterministic per seed, whatever the\n"
            "thread count) in llama.cpp's F32, Q8_0 or Q4_K_M tensor-type mix.\n"
            "  --preset      tiny (4 layers, 8 experts), small (8 layers, 64 experts, CPU benches),\n"
            "                q36 (the shapes of Qwen3.6-35B-A3B: 40 layers, 256 experts, ~21 GB at q4_k_m)\n"
            "  --quant       f32 | q8_0 | q4_k_m (default q4_k_m)\n"
            "  --seed        weights' seed (default 1)\n"
            "  --tokenizer   a Hugging Face byte-level BPE tokenizer.json (tokenizer_config.json\n"
            "                beside it is read too); default: a small built-in vocabulary with\n"
            "                Qwen's special tokens and a ChatML template\n"
            "  -t, --threads writer threads (default: every core)\n"
            "  -o, --output  the file to write\n");
}

static int parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int cmd_gen(int argc, char **argv) {
    gen_opts o = {.preset = NULL, .quant = GEN_Q4_K_M, .seed = 1, .n_threads = 0, .log = stderr};
    herr e;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            gen_usage(stdout);
            return 0;
        }
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = !strcmp(a, "--preset") || !strcmp(a, "--quant") || !strcmp(a, "--seed") ||
                     !strcmp(a, "--tokenizer") || !strcmp(a, "-t") || !strcmp(a, "--threads") ||
                     !strcmp(a, "-o") || !strcmp(a, "--output");
        if (!takes) {
            fprintf(stderr, "hearth gen: unknown option '%s'\n", a);
            gen_usage(stderr);
            return 2;
        }
        if (!val) {
            fprintf(stderr, "hearth gen: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--preset")) {
            o.preset = val;
        } else if (!strcmp(a, "--quant")) {
            if (gen_quant_parse(val, &o.quant, &e) < 0) {
                fprintf(stderr, "hearth gen: %s\n", e.msg);
                return 2;
            }
        } else if (!strcmp(a, "--seed")) {
            if (parse_u64(val, &o.seed) < 0) {
                fprintf(stderr, "hearth gen: --seed '%s' is not a non-negative integer\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--tokenizer")) {
            o.tokenizer = val;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            uint64_t t;
            if (parse_u64(val, &t) < 0 || t < 1 || t > 1024) {
                fprintf(stderr, "hearth gen: %s '%s' must be a thread count in [1, 1024]\n", a, val);
                return 2;
            }
            o.n_threads = (int)t;
        } else {
            o.out_path = val;
        }
    }
    if (!o.preset) {
        fprintf(stderr, "hearth gen: --preset is required (tiny, small, q36)\n");
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
