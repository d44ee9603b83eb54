/* cli/convert.c: `hearth convert`: a Hugging Face Qwen3.5/3.6 MoE checkpoint folder to a
 * qwen35moe GGUF (src/convert.h), with llama.cpp's converter transforms. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "make/convert.h"

static int parse_quant(const char *v, void *dst, herr *e) { return convert_quant_parse(v, (convert_quant *)dst, e); }

int cmd_convert(int argc, char **argv) {
    convert_opts o = {.quant = CONVERT_F32, .log = stderr};
    herr e;
    const arg_opt opts[] = {
        ARG_FN("--quant", NULL, &o.quant, parse_quant, "f32|q8_0|q4_k_m",
               "f32 (default) | q8_0 (matrices Q8_0, norms/router/conv taps F32) |\n"
               "q4_k_m (llama-quantize's Q4_K_M mix of the same matrices)"),
        ARG_STR("--output", "-o", &o.out_path, "FILE", "the file to write"),
        ARG_FLAG("--no-mtp", NULL, &o.no_mtp, "leave the multi-token-prediction block (mtp.*) out"),
        ARG_END,
    };
    const arg_cmd cmd = {
        .name = "convert",
        .usage = "hearth convert HF_DIR -o FILE [--quant f32|q8_0|q4_k_m] [--no-mtp]",
        .about = "Converts a Hugging Face Qwen3.5/3.6 MoE checkpoint (config.json, model.safetensors or\n"
                 "shards listed in model.safetensors.index.json, F32/F16/BF16 tensors) to a qwen35moe GGUF\n"
                 "with the tensor transforms of llama.cpp's convert_hf_to_gguf.py (norms +1, ssm_a =\n"
                 "-exp(A_log), V heads re-tiled, experts stacked; the MTP block as blk.N's nextn tensors).\n"
                 "tokenizer.json in HF_DIR is imported when present; otherwise hearth's built-in\n"
                 "vocabulary is padded to the vocab size.",
        .opts = opts,
        .pos_name = "HF_DIR",
        .max_pos = 1,
    };
    int rc = args_parse(&cmd, argc, argv, &o.hf_dir, NULL);
    if (rc != ARGS_RUN) return rc;
    if (!o.hf_dir) {
        fprintf(stderr, "hearth convert: HF_DIR is required\n");
        args_usage(&cmd, stderr);
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
