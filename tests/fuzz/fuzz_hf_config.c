/* fuzz_hf_config.c: libFuzzer target for convert's config.json reader
 * (convert_parse_config): any bytes are refused with a message naming config.json, or give
 * hyperparameters that pass model_hparams_check, from which the tensor table (the shapes
 * convert then asks the checkpoint for) is built and sized without overflow. Seeds:
 * tests/fuzz/corpus/hf_config (the hf_tiny fixture's config and variants). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "make/convert.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    model_hparams hp;
    herr e;
    if (convert_parse_config((const char *)data, size, &hp, &e) < 0) {
        FUZZ_CHECK(strstr(e.msg, "config.json") != NULL, "the error does not name config.json: %s", e.msg);
        return 0;
    }
    model_hparams again = hp;
    FUZZ_CHECK(model_hparams_check(&again, &e) == 0, "accepted hyperparameters fail the check: %s", e.msg);
    tensor_spec *specs;
    const int64_t n = model_tensor_specs(&hp, &specs);
    FUZZ_CHECK(n > 0, "no tensors for %lld layers", (long long)hp.n_layer);
    for (int64_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (uint32_t d = 0; d < specs[i].n_dims; d++) {
            FUZZ_CHECK(specs[i].ne[d] > 0, "%s: dim %u is %lld", specs[i].name, d, (long long)specs[i].ne[d]);
            FUZZ_CHECK(mul_u64(numel, (uint64_t)specs[i].ne[d], &numel), "%s: its size overflows", specs[i].name);
        }
    }
    free(specs);
    return 0;
}
