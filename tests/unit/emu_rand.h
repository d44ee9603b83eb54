/* emu_rand.h: the draws of the tests that run kernels under cuda_emu.h (test_attn_emu.cc,
 * test_fused_emu.cc, test_mmq_emu.cc): splitmix64's high half from the seed the test names
 * (EMU_SEED, defined before this is included), uniform floats in [lo, hi), f16 bits. */
#ifndef HEARTH_EMU_RAND_H
#define HEARTH_EMU_RAND_H

#include <stdint.h>

static uint64_t seed = EMU_SEED;
static uint32_t rnd() {
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}
static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 8) / 16777216.0f; }
[[maybe_unused]] static uint16_t f16_bits(float f) { return __float2half_rn(f).x; }

#endif
