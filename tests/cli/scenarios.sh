#!/usr/bin/env bash
# scenarios.sh: F13's sessions (issue 32, 3a-3g: the agent loop, a chat with thinking, four
# conversations on two slots, an edit, a restart on --cache-dir, sub-agents sent at once, Claude
# Code's /v1/messages with its billing line; and 3h, F13 item 2's parked sequences) played against warm servers on the demo model with
# Qwen3.5's template; every turn's greedy answer and log-probabilities equal a cold pass's, bit
# for bit, and the warm server resumed where a point serves (tests/cli/scenarios_test.py).
# About 25 s of two cores. One summary line.
cd "$(dirname "$0")/../.."
out=$(timeout 300 python3 tests/cli/scenarios_test.py 2>&1)
rc=$?
echo "$out"
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -n 1)
if [ -z "$line" ]; then
    echo "FAIL scenarios_test.py printed no summary (exit $rc)"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
p=$(sed -E 's/^([0-9]+) passed.*/\1/' <<<"$line")
f=$(sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")
[ $rc -ne 0 ] && [ "$f" = 0 ] && f=1 # a crash after the summary still fails
echo "$p passed, $f failed, 0 skipped"
[ "$f" = 0 ]
