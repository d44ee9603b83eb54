#!/usr/bin/env bash
# bench/device_fuse_parts.sh: decode's fused launches part by part (HEARTH_CUDA_FUSE's names, as
# in backend.c's fuse_parts), on the GPU machine (the device tool, .peer carried): `gates all
# tiny` on the cuda engine under each set of parts in CF (`gates all tiny-dense` under none, all and
# combine: the dense MLP's down product with the next norm as its tail), an unknown name's error, the op
# profile (HEARTH_CUDA_PROFILE=1) with none and all, then tg128 on the q36 file under each set,
# 2 rounds interleaved (a fresh process a set). Logs to $OUT/logs and $OUT/logs.tgz (the tool
# returns 8 files: unpack the archive).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_deps.sh
export HEARTH_TMP=/dev/shm
t0=$(date +%s)
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/host.txt
make -j16 build/hearth build/gates >$L/make.log 2>&1 || { tail -20 $L/make.log; exit 1; }
echo "built at $(( $(date +%s) - t0 )) s"
build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >/dev/null 2>&1 &
CF=${CF:-"0 1 in conv gated conv,gated norm route combine merge in,conv,gated,route,merge"}
for c in $CF; do HEARTH_CUDA_FUSE=$c HEARTH_GATES_DEVICE=cuda build/gates all tiny > $L/gates_$c.log 2>&1; echo "gates tiny $c: $(tail -1 $L/gates_$c.log)"; done
for c in 0 1 combine; do HEARTH_CUDA_FUSE=$c HEARTH_GATES_DEVICE=cuda build/gates all tiny-dense > $L/gates_dense_$c.log 2>&1; echo "gates tiny-dense $c: $(tail -1 $L/gates_dense_$c.log)"; done
HEARTH_CUDA_FUSE=bogus build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 0 -n 1 > $L/bogus.log 2>&1; echo "bogus: rc $? $(tail -1 $L/bogus.log)"
wait
B="build/hearth bench --device cuda -m /dev/shm/q36.gguf --kv f16"
for c in 0 1; do HEARTH_CUDA_FUSE=$c HEARTH_CUDA_PROFILE=1 $B -p 16 -n 64 -r 1 > $L/prof_$c.log 2>&1; done
echo "profiled at $(( $(date +%s) - t0 )) s"
for i in 1 2; do for c in $CF; do HEARTH_CUDA_FUSE=$c $B -p 0 -n 128 -r 2 2>&1 | grep "tg128" | sed "s/^/$c $i /"; done; done > $L/ab.log
awk '{split($0,f,"|"); print $1, $2, f[7]+0, f[9]}' $L/ab.log | sed 's/1975.7 MB.token read, //'
tar czf $OUT/logs.tgz -C $OUT logs; echo "done at $(( $(date +%s) - t0 )) s"
