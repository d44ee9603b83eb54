#!/usr/bin/env bash
# tools/demo/finish.sh FROM: here, after bench/device_demo_train.sh: FROM holds what came back
# from the device (hf/ with the checkpoint, report.json, loss.png, train.log). Lays out:
#   build/demo/hearth-demo/      the checkpoint + the tokenizer (tools/demo/tokenizer); not in the
#                                repo (37 MB: the device tool carries at most 64 MiB of tree);
#                                demo/checkpoint.sha256 names its files
#   demo/hearth-demo-q8_0.gguf   hearth convert --quant q8_0 of it: the file the README runs
#   demo/report.json, loss.png, train.log, heldout.txt (build/demo's), stats.json, ids.json
#   demo/ppl.md, ppl.log         the perplexity table (tests/cli/demo_check.py --checkpoint --table)
#   demo/README.md               the model card (tools/demo/card.py)
# Needs build/hearth, build/demo (corpus.py, ids.py) and the llama.cpp peer (tools/peer/build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
from=${1:?usage: tools/demo/finish.sh FROM}
for f in hf/config.json hf/model.safetensors.index.json report.json loss.png; do
    [ -f "$from/$f" ] || { echo "finish: $from/$f missing" >&2; exit 1; }
done
bin=$(tools/peer/path.sh)
ck=build/demo/hearth-demo   # convert names the file (general.name) after this folder
rm -rf "$ck"
mkdir -p "$ck" demo
cp "$from"/hf/* "$ck"/
cp tools/demo/tokenizer/tokenizer.json tools/demo/tokenizer/tokenizer_config.json "$ck"/
(cd "$ck" && sha256sum -- *) >demo/checkpoint.sha256
cp "$from/report.json" "$from/loss.png" demo/
[ -f "$from/train.log" ] && cp "$from/train.log" demo/
cp build/demo/heldout.txt build/demo/stats.json build/demo/ids.json demo/
cp /usr/share/doc/fortunes/copyright demo/COPYRIGHT-fortunes
build/hearth convert "$ck" --quant q8_0 -o demo/hearth-demo-q8_0.gguf
python3 tests/cli/demo_check.py build/hearth "$bin" demo --checkpoint "$ck" --table | tee demo/ppl.log
sed -n '/^| file/,$p' demo/ppl.log >demo/ppl.md
python3 tools/demo/card.py demo >demo/README.md
du -sh demo demo/*
