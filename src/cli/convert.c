/* cli/convert.c: `hearth convert`: a Hugging Face Qwen3.5/3.6 MoE checkpoint folder to a
 * qwen35moe GGUF (src/convert.h), with llama.cpp's converter transforms. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "make/convert.h"

static void convert_usage(FILE *out) {
    fprintf(out,
            "usage: hearth convert HF_DIR -o FILE [--quant f32|q8_0]\n"
            "\n"
            "Converts a Hugging Face Qwen3.5/3.6 MoE checkpoint (config.json, model.safetensors or\n"
            "shards listed in model.safetensors.index.json, F32/F16/BF16 tensors) to a qwen35moe GGUF\n"
            "with the tensor transforms of llama.cpp's convert_hf_to_gguf.py (norms +1, ssm_a =\n"
            "-exp(A_log), V heads re-tiled, experts stacked). tokenizer.json in HF_DIR is imported\n"
            "when present; otherwise hearth's built-in vocabulary is padded to the vocab size.\n"
            "  --quant       f32 (default) | q8_0 (matrices Q8_0, norms/router/conv taps F32)\n"
            "  -o, --output  the file to write\n");
}

int cmd_convert(int argc, char **argv) {
    convert_opts o = {.quant = CONVERT_F32, .log = stderr};
    herr e;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            convert_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--quant") || !strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "hearth convert: %s needs a value\n", a);
                return 2;
            }
            const char *val = argv[++i];
            if (!strcmp(a, "--quant")) {
                if (convert_quant_parse(val, &o.quant, &e) < 0) {
                    fprintf(stderr, "hearth convert: %s\n", e.msg);
                    return 2;
                }
            } else {
                o.out_path = val;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "hearth convert: unknown option '%s'\n", a);
            convert_usage(stderr);
            return 2;
        } else if (o.hf_dir) {
            fprintf(stderr, "hearth convert: one HF_DIR only ('%s' and '%s')\n", o.hf_dir, a);
            return 2;
        } else {
            o.hf_dir = a;
        }
    }
    if (!o.hf_dir) {
        fprintf(stderr, "hearth convert: HF_DIR is required\n");
        convert_usage(stderr);
        return 2;
    }
    if (!o.out_path || !*o.out_path) {
        fprintf(stderr, "hearth convert: -o FILE is required\n");
        return 2;
    }
    convert_stats st;
    if (convert_hf(&o, &st, &e) < 0) {
        fprintf(stderr, "hearth convert: %s\n", e.msg);
        return 1;
    }
    fprintf(stderr, "convert: wrote %s: %" PRId64 " tensors, vocab %" PRId64 ", %" PRIu64 " bytes (%.2f GB) in %.2f s\n",
            o.out_path, st.n_tensors, st.n_vocab, st.file_bytes, (double)st.file_bytes / 1e9, st.seconds);
    return 0;
}
