#!/usr/bin/env bash
# bench/device_demo_train.sh: trains the demo model on the GPU machine (tools/demo/train.py,
# PyTorch + transformers there) from the ids made here, with build/demo carried:
#     python3 tools/demo/corpus.py --out build/demo && python3 tools/demo/ids.py
#     device run, carry ["build/demo/train_ids.u16", "build/demo/heldout_ids.u16",
#       "build/demo/prompts.json"] (7.6 MB): MINUTES=7 bash bench/device_demo_train.sh
# then, here, tools/demo/finish.sh with the files that came back. MINUTES is the training
# budget (the evaluation, the answers and the save add about a minute); MINUTES=0.3 is a smoke
# run of the whole script. Everything lands in $OUT: hf/ (the checkpoint), report.json,
# loss.png, train.log: 8 files at most, the device's limit on what comes back.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for f in train_ids.u16 heldout_ids.u16 prompts.json; do
    [ -f "build/demo/$f" ] || { echo "build/demo/$f missing: run corpus.py and ids.py here and carry build/demo"; exit 1; }
done
python3 tools/demo/train.py --data build/demo --minutes "${MINUTES:-7}" --out "$out" 2>&1 | tee "$out/train.log"
