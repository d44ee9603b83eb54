#!/usr/bin/env bash
# tests/cli/shapes.sh: hearth serve and llama-server on the same GGUF file, the shapes of what
# a client can notice compared (tests/cli/shapes_test.py), on the binary users run and on the
# AddressSanitizer + UBSan build where it is built (`make asan`; a leak at exit fails). When the
# llama.cpp peer is not built (tools/peer/build.sh) the suite is a visible skip; in CI, where
# the peer is built, a missing one fails. One summary line.
set -u
cd "$(dirname "$0")/../.."
source tests/cli/lib.sh
if ! bin=$(tools/peer/path.sh); then
    if [ -n "${CI:-}" ]; then check "CI: the llama.cpp peer is built" false; summary; exit; fi
    skip "shapes against llama-server" "llama.cpp peer not built: run tools/peer/build.sh"
    summary; exit
fi
p=0 f=0
run() { # the test on the binary $1
    local out rc line
    out=$(HEARTH=$1 PEER_BIN=$bin python3 tests/cli/shapes_test.py 2>&1); rc=$?
    echo "$out"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -n 1)
    if [ -z "$line" ]; then f=$((f + 1)); return; fi
    p=$((p + $(sed -E 's/^([0-9]+) passed.*/\1/' <<<"$line")))
    f=$((f + $(sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")))
    [ $rc -ne 0 ] && [ "$(sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")" = 0 ] && f=$((f + 1))
}
run "$HEARTH"
if [ -x build-asan/hearth ]; then
    echo "== the same against build-asan/hearth"
    run build-asan/hearth
else
    echo "SKIP shapes under the sanitizers: build-asan/hearth missing (make asan)"
    _s=1
fi
_p=$p _f=$f
summary
