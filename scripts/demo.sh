#!/usr/bin/env bash
# The main job on the embedded default: installs missing Debian packages, builds hearth,
# makes the demo model if absent (a synthetic tiny qwen35moe file: random weights, so the
# text is gibberish until a trained demo model lands), and runs it on the CPU engine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
make -j"$(nproc)" build/hearth
model=${HEARTH_MODEL:-models/demo-tiny-q4_k_m.gguf}
if [ ! -f "$model" ]; then
    mkdir -p "$(dirname "$model")"
    build/hearth gen --preset tiny --quant q4_k_m --seed 1 -o "$model"
fi
exec build/hearth run -m "$model" -p "${1:-<|im_start|>user
Tell me about hearths.<|im_end|>
<|im_start|>assistant
}" -n "${HEARTH_N:-48}"
