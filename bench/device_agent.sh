#!/usr/bin/env bash
# bench/device_agent.sh: bench/agent_turns.py (or with MANY set, bench/agent_many.py) on the GPU machine: hearth serve --device cuda against
# llama-server (CUDA build, -ngl 99 -fa on --jinja) on the q36 file with Qwen3's real tokenizer,
# the same chat template on both (tests/fixtures/templates/Qwen3.5-4B.jinja), one slot, 64k
# context. The agent trace (--target-tokens, default 40000) first, then the chat trace; reps
# interleaved, rep 0 dropped (agent_turns.py's header says what is measured).
#
# Here, before the device call (the GPU machine reaches no registry):
#   bench/device_pack.sh && bench/device_agent.sh pack
# `pack` adds to .peer: tokenizer-qwen3.tar.xz (tools/peer/fetch_tokenizer.sh's tokenizer.json and
# tokenizer_config.json, 1.4 MB) and llama-server-extra.tar.xz (the few files of llama.cpp's
# checkout that llama-server's build reads and device_pack.sh leaves out). Then the device tool,
# carrying .peer:   bash bench/device_agent.sh   (F13 item 6: MANY=16 bash bench/device_agent.sh)
# There: builds hearth, starts (or finds) bench/device_peer_build.sh (llama-bench and
# llama-server), writes /dev/shm/q36-qwen3tok.gguf (hearth gen --preset q36 --quant q4_k_m --seed 1
# --tokenizer ...), waits for llama-server, runs agent_turns.py, and stops before DEADLINE seconds
# (default 480) so the call returns its logs.
#   REPS (default 2) measured reps; TRACE (default both: agent|chat|both); TARGET (default 40000)
#   the agent trace's tokens; FRESH (default conversation; server: a new process per rep, if both
#   servers do not fit on the GPU together)
#   MANY=N (F13 item 6): bench/agent_many.py instead: N agent sessions at once on -np N on both
#   servers (default when set: 16 on -np 16), TURNS requests each (default 6; tool results
#   1500-3000 tokens), max_tokens 32, REPS measured reps (+ rep 0, dropped); CTX is then a
#   slot's context (default 16384; llama-server's -c is N x CTX, set by the script) and both
#   get --cache-ram CACHE_RAM (default 16384 MiB); hearth runs with --metrics, so the table
#   counts the point buffers allocated on its passes' path (F11). To $OUT the same files.
#   For a dry run off the GPU (a CPU box with the CPU peer): PRESET (default q36), CTX (65536),
#   HEARTH_DEV (cuda), LLAMA_DIR (/tmp/llama-cuda: bin/llama-server and the done marker),
#   LLAMA_ARGS ("-ngl 99 -fa on"), THREADS (unset: no -t), and NVCC= to build hearth without CUDA
# To $OUT: results.md (the tables), samples.tsv, host.txt, run.log, agent-logs.tgz (every log: make,
# gen, peer build, both servers'); the device tool returns at most 8 files a call.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = pack ]; then
    set -e
    tok=$(tools/peer/fetch_tokenizer.sh)
    src=${HEARTH_PEER_DIR:-$HOME/.cache/hearth-peer}/llama.cpp
    [ -f .peer/llama-src.commit ] || { echo "device_agent: run bench/device_pack.sh first" >&2; exit 1; }
    mkdir -p .git/info
    grep -qx '/.peer/' .git/info/exclude 2>/dev/null || echo /.peer/ >>.git/info/exclude
    tar -cJf .peer/tokenizer-qwen3.tar.xz -C "$tok" tokenizer.json tokenizer_config.json
    have=$(git -C "$src" log -1 --format='%h of %cd' --date=short)
    [ "$have" = "$(cat .peer/llama-src.commit)" ] || { echo "device_agent: $src is at $have, .peer at $(cat .peer/llama-src.commit)" >&2; exit 1; }
    tar -cJf .peer/llama-server-extra.tar.xz -C "$src" scripts/ui-assets.cmake tools/ui/ui.cpp.in tools/ui/ui.h.in \
        tools/ui/sources.cmake
    du -sh .peer/tokenizer-qwen3.tar.xz .peer/llama-server-extra.tar.xz
    exit 0
fi

out=${OUT:-/tmp/out}; mkdir -p "$out"
work=/tmp/agent-logs; rm -rf "$work"; mkdir -p "$work"
t_start=$(date +%s) deadline=${DEADLINE:-480}
left() { echo $(( deadline - ($(date +%s) - t_start) )); }
finish() { # the tables and the small files to $OUT, everything else in one archive
    cp "$work/at/results.md" "$work/at/samples.tsv" "$out/" 2>/dev/null
    cp /tmp/peer-build.log "$work/peer.log" 2>/dev/null
    tar czf "$out/agent-logs.tgz" -C "$work" . 2>/dev/null
    echo "done with $(left) s left"
    exit "${1:-0}"
}
main() {
. bench/device_deps.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; git log -1 --format=%h 2>/dev/null; } >"$out/host.txt" 2>&1
cat "$out/host.txt"
ldir=${LLAMA_DIR:-/tmp/llama-cuda} preset=${PRESET:-q36}
peer_ok() { [ -f "$ldir/done" ] && [ -x "$ldir/bin/llama-server" ]; }
for f in .peer/llama-src.tar.xz .peer/tokenizer-qwen3.tar.xz; do
    [ -f "$f" ] || { echo "no $f: run bench/device_pack.sh && bench/device_agent.sh pack here, and carry .peer"; finish 1; }
done
peer_ok || pgrep -f device_peer_build.sh >/dev/null || (setsid nohup bash bench/device_peer_build.sh >/tmp/peer-build.log 2>&1 &)

t0=$(date +%s)
# HEARTH_BIN_READY=1: build/hearth was put there (a carried binary, bench/device_wg.sh's agentvs), not built
if [ "${HEARTH_BIN_READY:-0}" = 1 ] && [ -x build/hearth ]; then echo "== hearth: carried, not built"
else
    make -j12 build/hearth >"$work/make.log" 2>&1 || { tail -30 "$work/make.log"; finish 1; }
    echo "== build hearth: $(( $(date +%s) - t0 )) s"
fi

tok=/tmp/tokenizer-qwen3 model=/dev/shm/$preset-qwen3tok.gguf
[ -f $tok/tokenizer.json ] || { mkdir -p $tok && tar -xJf .peer/tokenizer-qwen3.tar.xz -C $tok; } || finish 1
if [ ! -f $model ]; then
    t0=$(date +%s)
    build/hearth gen --preset "$preset" --quant q4_k_m --seed 1 --tokenizer $tok -o $model.tmp >"$work/gen.log" 2>&1 \
        && mv $model.tmp $model || { rm -f $model.tmp; cat "$work/gen.log"; finish 1; }
    echo "== gen: $(( $(date +%s) - t0 )) s: $(tail -1 "$work/gen.log")"
fi

t0=$(date +%s)
while ! peer_ok; do
    pgrep -f device_peer_build.sh >/dev/null || { sleep 2; peer_ok && break; echo "== peer build failed:"; tail -30 /tmp/peer-build.log; finish 1; }
    [ "$(left)" -lt 150 ] && { echo "== peer build still running with $(left) s left: call again (it goes on)"; tail -3 /tmp/peer-build.log; finish 1; }
    sleep 5
done
echo "== peer (llama.cpp $(cat "$ldir/done")): waited $(( $(date +%s) - t0 )) s"

tmpl=tests/fixtures/templates/Qwen3.5-4B.jinja l=$(left) thr=${THREADS:+-t $THREADS}
label="$(head -1 "$out/host.txt"); preset $preset, Q4_K_M, seed 1, Qwen3's tokenizer (151,669 tokens); template $tmpl; llama.cpp $(cat "$ldir/done")"
if [ -n "${MANY:-}" ]; then
    ctx=${CTX:-16384} cram=${CACHE_RAM:-16384}
    timeout -s TERM $(( l - 15 )) python3 bench/agent_many.py --sessions "$MANY" --turns "${TURNS:-6}" \
        --reps $(( ${REPS:-2} + 1 )) --max-tokens 32 --deadline $(( l - 150 )) --out "$work/at" --start-timeout 180 \
        --label "$label; $(git log -1 --format=%h 2>/dev/null)" \
        --hearth-cmd "build/hearth serve -m $model -c $ctx -np 1 $thr --device ${HEARTH_DEV:-cuda} --metrics --cache-ram $cram --chat-template-file $tmpl --port {port}" \
        --llama-cmd "$ldir/bin/llama-server -m $model -c $ctx -np 1 $thr ${LLAMA_ARGS--ngl 99 -fa on} --jinja --cache-ram $cram --chat-template-file $tmpl --port {port}" \
        >"$work/agent_turns.log" 2>&1
    rc=$?
    cp "$work/at/reps.tsv" "$out/" 2>/dev/null
    echo "== agent_many.py: rc $rc"
    grep -v '^$' "$work/agent_turns.log" | tail -40
    finish $rc
fi
ctx=${CTX:-65536}
timeout -s TERM $(( l - 15 )) python3 bench/agent_turns.py --trace "${TRACE:-both}" --reps "${REPS:-2}" \
    --target-tokens "${TARGET:-40000}" --fresh "${FRESH:-conversation}" --deadline $(( l - 120 )) --out "$work/at" \
    --start-timeout 180 --label "$label" \
    --hearth-cmd "build/hearth serve -m $model -c $ctx -np 1 $thr --device ${HEARTH_DEV:-cuda} --metrics --chat-template-file $tmpl --port {port}" \
    --llama-cmd "$ldir/bin/llama-server -m $model -c $ctx -np 1 $thr ${LLAMA_ARGS--ngl 99 -fa on} --jinja --chat-template-file $tmpl --port {port}" \
    >"$work/agent_turns.log" 2>&1
rc=$?
echo "== agent_turns.py: rc $rc"
grep -v '^$' "$work/agent_turns.log" | tail -60
finish $rc
}
main 2>&1 | tee "$out/run.log"
exit "${PIPESTATUS[0]}"
