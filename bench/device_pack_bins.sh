#!/usr/bin/env bash
# bench/device_pack_bins.sh: builds here (nvcc, sm_90a) what bench/device_wg.sh runs on the GPU
# machine and packs it for the device tool's carry: hearth, test_cuda, test_gdn_chunk, gates,
# mut_hearth and mut_test_engine, stripped, in DIR/bins.tar.xz (~3 MB; the tree and .peer
# leave ~15 MiB of the 64 carried). With REV, hearth_b too: hearth built at that revision in a
# scratch worktree (device_wg.sh's abbin step runs the two against each other); with REV2,
# hearth_c and test_cuda_c built at that one (abbin runs the three).
#   bench/device_pack_bins.sh [DIR (default .dev/next)] [REV] [REV2]
# then the device tool, carrying [".peer", DIR]:  BIN=DIR STEPS="..." bash bench/device_wg.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.dev/next} rev=${2:-} rev2=${3:-}
export PATH="$PATH:/usr/local/cuda/bin"
command -v nvcc >/dev/null || { echo "device_pack_bins: no nvcc" >&2; exit 1; }
bins=(build/hearth build/tests/test_cuda build/tests/test_gdn_chunk build/gates build/mut/hearth build/mut/test_engine)
make -j2 "${bins[@]}" >/tmp/device_pack_bins.log 2>&1 || { tail -20 /tmp/device_pack_bins.log >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
names=(hearth test_cuda test_gdn_chunk gates mut_hearth mut_test_engine)
for i in "${!bins[@]}"; do strip -o "$tmp/${names[$i]}" "${bins[$i]}"; done
# at_rev REV SUFFIX TARGET..: the targets built at REV in a scratch worktree, packed as NAME_SUFFIX
at_rev() {
    local r=$1 x=$2 wt=$tmp/wt t
    shift 2
    git worktree add --detach --quiet "$wt" "$r"
    if ! make -C "$wt" -j2 "$@" >>/tmp/device_pack_bins.log 2>&1; then
        git worktree remove --force "$wt"; tail -20 /tmp/device_pack_bins.log >&2; exit 1
    fi
    for t in "$@"; do strip -o "$tmp/$(basename "$t")_$x" "$wt/$t"; names+=("$(basename "$t")_$x"); done
    git worktree remove --force "$wt"
}
[ -n "$rev" ] && at_rev "$rev" b build/hearth
[ -n "$rev2" ] && at_rev "$rev2" c build/hearth build/tests/test_cuda
mkdir -p "$dir"
(cd "$tmp" && tar -cJf bins.tar.xz "${names[@]}")
mv "$tmp/bins.tar.xz" "$dir/bins.tar.xz.new" && mv "$dir/bins.tar.xz.new" "$dir/bins.tar.xz"
echo "$dir/bins.tar.xz: ${names[*]} ($(du -h "$dir/bins.tar.xz" | cut -f1); $("$tmp/hearth" --version | head -1)$([ -n "$rev" ] && echo "; b: $("$tmp/hearth_b" --version | head -1)")$([ -n "$rev2" ] && echo "; c: $("$tmp/hearth_c" --version | head -1)"))"
