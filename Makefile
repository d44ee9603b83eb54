# hearth: one binary, C11, warnings as errors. `make` builds build/hearth; `make test`
# runs every test (tests/run). The CUDA backend is compiled only where nvcc is found.
CC      ?= cc
.DEFAULT_GOAL := all
BUILD   ?= build
OPT     ?= -O2
CFLAGS  += -std=c11 $(OPT) -g -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
           -D_GNU_SOURCE -pthread -Isrc -MMD -MP
LDLIBS  += -lm -pthread -lcjson -lmicrohttpd

# Layers (README "Layout"): base <- format <- model <- engine; text and make beside them;
# cli on top. Every include is written from src/ ("format/gguf.h").
LIB_SRC := $(wildcard src/base/*.c src/format/*.c src/model/*.c src/text/*.c src/make/*.c src/engine/*.c \
                      src/engine/cpu/*.c src/serve/*.c)
CLI_SRC := $(wildcard src/cli/*.c)
# The engine again with its planted defects compiled in (-DHEARTH_MUTANTS), for the gates only:
# the binary users run has none. The scheduler too (build/mut/hearth: serve_test.py's end points).
ENG_SRC := $(wildcard src/engine/*.c src/engine/cpu/*.c) src/serve/sched.c
TEST_SRC := $(wildcard tests/unit/test_*.c)
REF_SRC := $(wildcard tests/ref/*.c)

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
MUT_OBJ := $(filter-out $(ENG_SRC:%.c=$(BUILD)/obj/%.o),$(LIB_OBJ)) $(ENG_SRC:%.c=$(BUILD)/obj-mut/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
REF_OBJ := $(REF_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%) $(BUILD)/tests/test_gdn_chunk $(BUILD)/tests/test_argmax_emu \
            $(BUILD)/tests/test_fused_emu $(BUILD)/tests/test_attn_emu $(BUILD)/tests/test_mmq_emu

# `hearth --version` names the commit; main.o is rebuilt when the description changes (the
# stamp file is rewritten only then). Outside a git checkout: "unknown".
HEARTH_GIT := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
GIT_STAMP := $(BUILD)/git-describe.txt
ifneq ($(MAKECMDGOALS),clean)
$(shell mkdir -p $(BUILD) && [ "$$(cat $(GIT_STAMP) 2>/dev/null)" = "$(HEARTH_GIT)" ] || echo "$(HEARTH_GIT)" >$(GIT_STAMP))
endif
$(BUILD)/obj/src/cli/main.o: CFLAGS += -DHEARTH_GIT='"$(HEARTH_GIT)"'
$(BUILD)/obj/src/cli/main.o: $(GIT_STAMP)
$(GIT_STAMP): ;

# SIMD kernels: compiled for AVX2/FMA/F16C, called only after a run-time CPU check.
$(BUILD)/obj/src/format/quant_avx2.o: CFLAGS += -mavx2 -mfma -mf16c
$(BUILD)/obj/src/engine/cpu/%_avx2.o: CFLAGS += -mavx2 -mfma -mf16c
$(BUILD)/obj-mut/src/engine/cpu/%_avx2.o: CFLAGS += -mavx2 -mfma -mf16c
$(BUILD)/obj-mut/%.o: CFLAGS += -DHEARTH_MUTANTS

NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
CU_SRC := $(wildcard src/engine/cuda/*.cu)
ifneq ($(NVCC),)
ifneq ($(CU_SRC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
CFLAGS += -DHEARTH_CUDA
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
NVFLAGS ?= -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -DHEARTH_CUDA -Xcompiler -Wall,-Werror
CUDA_C_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard src/engine/cuda/*.c))
LIB_OBJ += $(CU_OBJ) $(CUDA_C_OBJ)
# the gates' library: the kernels with planted defects (gdn.cu) and the host side built again
# with -DHEARTH_MUTANTS, the other kernels as shipped
CU_MUT_SRC := src/engine/cuda/gdn.cu
CU_MUT_OBJ := $(CU_MUT_SRC:%.cu=$(BUILD)/obj-mut/%.o)
MUT_OBJ += $(filter-out $(CU_MUT_SRC:%.cu=$(BUILD)/obj/%.o),$(CU_OBJ)) $(CU_MUT_OBJ) \
           $(patsubst %.c,$(BUILD)/obj-mut/%.o,$(wildcard src/engine/cuda/*.c))
endif
endif

.PHONY: all test tests clean fuzz fuzz-bins fuzz-replay-bins unit-bins asan asan-test tsan
# the reference's objects are inputs of every test program: keep them between builds
.SECONDARY: $(REF_OBJ)
all: $(BUILD)/hearth tests

$(BUILD)/libhearth.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && $(AR) rcs $@ $^

$(BUILD)/libhearth-mut.a: $(MUT_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && $(AR) rcs $@ $^

$(BUILD)/hearth: $(CLI_OBJ) $(BUILD)/libhearth.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libhearth.a $(LDLIBS)

tests: $(TEST_BIN) $(BUILD)/gates $(BUILD)/mut/test_engine $(BUILD)/mut/test_spec $(BUILD)/mut/hearth

$(BUILD)/gates: tests/gates/gates.c $(REF_OBJ) $(BUILD)/libhearth-mut.a tests/unit/harness.h tests/unit/models.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(REF_OBJ) $(BUILD)/libhearth-mut.a $(LDLIBS)

# test_engine against the engine with planted defects: tests/gates/mutants shows its
# reference bands red under the one defect only the float64 reference can see
$(BUILD)/mut/test_engine: tests/unit/test_engine.c $(REF_OBJ) $(BUILD)/libhearth-mut.a tests/unit/harness.h tests/unit/models.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(REF_OBJ) $(BUILD)/libhearth-mut.a $(LDLIBS)

# test_spec against the same defects: speculative decoding's planted defects turn it red
$(BUILD)/mut/test_spec: tests/unit/test_spec.c $(REF_OBJ) $(BUILD)/libhearth-mut.a tests/unit/harness.h tests/unit/models.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(REF_OBJ) $(BUILD)/libhearth-mut.a $(LDLIBS)

# the binary against the same defects: the mutant runner shows `hearth perplexity`'s check
# against llama-perplexity red under its planted defects
$(BUILD)/mut/hearth: $(CLI_OBJ) $(BUILD)/libhearth-mut.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libhearth-mut.a $(LDLIBS)

# the chunked delta rule's CUDA kernels run on the CPU under a fiber emulation of the
# execution model (tests/unit/cuda_emu.h): C++, no GPU, no nvcc; no sanitizer (fibers and
# ASan's stack tracking do not mix), and no fused multiply-adds but the kernels' own
CXX ?= c++
EMU_CUH := src/engine/cuda/warp.cuh src/engine/cuda/act.cuh src/engine/cuda/tail.cuh src/engine/cuda/kernels.h \
           src/engine/cuda/attn_merge.cuh
$(BUILD)/tests/test_gdn_chunk: tests/unit/test_gdn_chunk.cc tests/unit/cuda_emu.h tests/unit/gdn_chunk_ref.h tests/unit/harness.h \
                               src/engine/cuda/gdn_chunk.cuh src/engine/cuda/gdn_conv.cuh $(EMU_CUH)
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas -ffp-contract=off -fno-strict-aliasing \
	    -D_GNU_SOURCE -Isrc -Itests/unit -o $@ $< -lm

$(BUILD)/tests/test_fused_emu: tests/unit/test_fused_emu.cc tests/unit/cuda_emu.h tests/unit/emu_rand.h tests/unit/harness.h src/engine/cuda/gemv.cuh \
                               src/engine/cuda/gdn_chunk.cuh src/engine/cuda/gdn_conv.cuh src/engine/cuda/gdn_row.cuh $(EMU_CUH)
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas -ffp-contract=off -fno-strict-aliasing \
	    -D_GNU_SOURCE -Isrc -Itests/unit -o $@ $< -lm

$(BUILD)/tests/test_attn_emu: tests/unit/test_attn_emu.cc tests/unit/cuda_emu.h tests/unit/emu_rand.h tests/unit/harness.h src/engine/cuda/attn_mma.cuh \
                             src/engine/cuda/attn_wg.cuh $(EMU_CUH)
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas -ffp-contract=off -fno-strict-aliasing \
	    -D_GNU_SOURCE -Isrc -Itests/unit -o $@ $< -lm

$(BUILD)/tests/test_mmq_emu: tests/unit/test_mmq_emu.cc tests/unit/cuda_emu.h tests/unit/emu_rand.h tests/unit/harness.h src/engine/cuda/mmq.cuh \
                             src/engine/cuda/gemv.cuh $(EMU_CUH)
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas -ffp-contract=off -fno-strict-aliasing \
	    -D_GNU_SOURCE -Isrc -Itests/unit -o $@ $< -lm

$(BUILD)/tests/test_argmax_emu: tests/unit/test_argmax_emu.cc tests/unit/cuda_emu.h tests/unit/harness.h src/engine/cuda/argmax.cuh
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas -ffp-contract=off -fno-strict-aliasing \
	    -D_GNU_SOURCE -Isrc -Itests/unit -o $@ $< -lm

$(BUILD)/tests/%: tests/unit/%.c $(REF_OBJ) $(BUILD)/libhearth.a tests/unit/harness.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(REF_OBJ) $(BUILD)/libhearth.a $(LDLIBS)

# the chat page's bytes go into webui.o by .incbin (src/serve/webui.c): its input, which -MMD
# cannot see
$(BUILD)/obj/src/serve/webui.o: src/serve/webui.html

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/obj-mut/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

$(CU_OBJ) $(CU_MUT_OBJ): $(wildcard src/engine/cuda/*.cuh src/engine/cuda/*.h src/format/quant.h src/base/util.h)
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(BUILD)/obj-mut/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -DHEARTH_MUTANTS -c -o $@ $<

test: all asan tsan
	tests/run

# AddressSanitizer + UBSan build of the binary, for the bad-input tests (tests/cli/gguf_bad.sh
# replays every malformed file under it), and of the fuzz targets' replay programs
# (tests/cli/fuzz_replay.sh replays each target's corpus and regressions under them).
ASAN_OPT := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
# The unit programs and the gates too (build-asan/tests/test_*, build-asan/gates; not
# test_cuda, which needs nvcc, no sanitizer's): tests/cli/asan_units.sh runs them; `make
# asan-test` builds and runs them alone.
asan:
	$(MAKE) BUILD=build-asan OPT="$(ASAN_OPT)" NVCC= build-asan/hearth build-asan/gates fuzz-replay-bins unit-bins
asan-test: asan
	bash tests/cli/asan_units.sh
unit-bins: $(if $(NVCC),$(TEST_BIN),$(filter-out %/test_cuda,$(TEST_BIN)))

# ThreadSanitizer build of the binary (no CUDA): tests/cli/tsan_serve.sh runs serve_test.py
# against it (the engine thread, the HTTP threads, the pool, the cache). The SIMD kernels
# (TSAN_PLAIN: pure functions of their arguments, no shared state, no synchronisation) are
# compiled without TSan's instrumentation, which slows them ~50x; the pool's tasks that call
# them, the pool, the scheduler and the server are instrumented.
TSAN_PLAIN := src/format/quant.c src/format/quant_avx2.c src/engine/cpu/gdn_avx2.c src/engine/cpu/attn_avx2.c
tsan:
	$(MAKE) BUILD=build-tsan OPT="-O1 -g -fsanitize=thread -fno-omit-frame-pointer" NVCC= TSAN_BUILD=1 build-tsan/hearth
ifeq ($(TSAN_BUILD),1)
$(TSAN_PLAIN:%.c=$(BUILD)/obj/%.o): CFLAGS += -fno-sanitize=thread
endif

# Fuzz targets (tests/fuzz/fuzz_NAME.c, README there): one per parser of untrusted bytes.
# `make fuzz` builds them with clang's libFuzzer against the whole library compiled by clang
# with the same sanitizers (build-fuzz, no CUDA); the ASan build links each with
# tests/fuzz/replay.c instead, a main() that runs the files it is given.
FUZZ_NAMES := gguf safetensors hf_config request jinja tokenizer answer cache grammar
FUZZ_CFLAGS = -Itests -DFUZZ_ROOT='"$(CURDIR)"'
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang NVCC= OPT="-O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	    fuzz-bins
fuzz-bins: $(FUZZ_NAMES:%=$(BUILD)/fuzz_%)
$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(BUILD)/libhearth.a
	$(CC) $(CFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(BUILD)/libhearth.a $(LDLIBS)
fuzz-replay-bins: $(FUZZ_NAMES:%=$(BUILD)/replay/fuzz_%)
$(BUILD)/replay/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h tests/fuzz/replay.c $(BUILD)/libhearth.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(FUZZ_CFLAGS) -o $@ $< tests/fuzz/replay.c $(BUILD)/libhearth.a $(LDLIBS)

# the grammar mask's cost per token at Qwen3.5's vocabulary (bench/RESULTS.md): build/grammar_mask [reps]
$(BUILD)/grammar_mask: bench/grammar_mask.c $(BUILD)/libhearth.a
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libhearth.a $(LDLIBS)

clean:
	rm -rf build build-asan build-fuzz build-tsan

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(REF_OBJ:.o=.d) $(MUT_OBJ:.o=.d)
