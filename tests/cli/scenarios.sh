#!/usr/bin/env bash
# scenarios.sh: F13's sessions (issue 32, 3a-3g: the agent loop, a chat with thinking, four
# conversations on two slots, an edit, a restart on --cache-dir, sub-agents sent at once, Claude
# Code's /v1/messages with its billing line; and 3h, F13 item 2's parked sequences) played against warm servers on the demo model with
# Qwen3.5's template; every turn's greedy answer and log-probabilities equal a cold pass's, bit
# for bit, and the warm server resumed where a point serves (tests/cli/scenarios_test.py).
# Then 3a, 3b, 3d, 3e and 3g again on the dense architecture (qwen35, F16: "the server serves
# them with points as for qwen35moe"): tiny-dense made with Qwen3's real tokenizer (cached by
# tools/peer/fetch_tokenizer.sh; a skip where it is not), whose random weights answer random
# tokens, which the warm = cold checks do not mind.
# About 35 s of two cores. One summary line.
cd "$(dirname "$0")/../.."
run() { # NAME LETTERS [ENV=VALUE..]: scenarios_test.py's output (LETTERS: its scenarios, "" all), its summary counted
    local name=$1 letters=$2 out rc line p f
    shift 2
    out=$(env "$@" timeout 300 python3 tests/cli/scenarios_test.py $letters 2>&1)
    rc=$?
    echo "$out" | sed "s/^/[$name] /"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL [$name] scenarios_test.py printed no summary (exit $rc)"
        fail=$((fail + 1))
        return
    fi
    p=$(sed -E 's/^([0-9]+) passed.*/\1/' <<<"$line")
    f=$(sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")
    [ $rc -ne 0 ] && [ "$f" = 0 ] && f=1 # a crash after the summary still fails
    pass=$((pass + p)) fail=$((fail + f))
}
pass=0 fail=0 skip=0
run demo ""
qdir=${HEARTH_PEER_DIR:-${HOME:-/tmp}/.cache/hearth-peer}/tokenizer-qwen3
if [ -f "$qdir/tokenizer.json" ]; then
    tmp=$(mktemp -d "${HEARTH_TMP:-/tmp}/scenarios.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    if build/hearth gen --preset tiny-dense --quant q8_0 --seed 3 --tokenizer "$qdir" -o "$tmp/dense.gguf" >"$tmp/gen.log" 2>&1; then
        run tiny-dense abdeg HEARTH_DEMO="$tmp/dense.gguf"
    else
        cat "$tmp/gen.log"
        echo "FAIL hearth gen --preset tiny-dense --tokenizer $qdir"
        fail=$((fail + 1))
    fi
else
    echo "SKIP the dense architecture's sessions: no Qwen3 tokenizer cached (tools/peer/fetch_tokenizer.sh)"
    skip=1
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
