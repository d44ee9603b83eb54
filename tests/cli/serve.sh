#!/usr/bin/env bash
# serve.sh: hearth serve end to end (tests/cli/serve_test.py: HTTP, streaming, the prompt
# cache across turns, slots and restarts, parallel slots against solo runs, bad input, the
# key, the queue, SIGTERM; tests/cli/serve_hostile_test.py: idle sockets, errors as JSON, the
# fields refused or done by name, the hostile shapes; serve_grammar_test.py: structured output;
# serve_responses_test.py: OpenAI's Responses API; serve_share_test.py: a prefix shared by
# requests sent at once, prefilled once; serve_spec_test.py: --spec-mtp), once on the binary users run and once on the AddressSanitizer +
# UBSan build (`make asan`, which `make test` builds), where a leak at exit fails the
# SIGTERM check and any memory error kills the server mid-test. One summary line for both.
cd "$(dirname "$0")/../.."
p=0 f=0 s=0
run() {
    local out
    out=$(python3 "$1" 2>&1)
    local rc=$?
    echo "$out"
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -n 1)
    if [ -z "$line" ]; then f=$((f + 1)); return; fi
    p=$((p + $(sed -E 's/^([0-9]+) passed.*/\1/' <<<"$line")))
    f=$((f + $(sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")))
    [ $rc -ne 0 ] && [ "$(sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")" = 0 ] && f=$((f + 1))
}
run tests/cli/serve_test.py
run tests/cli/serve_hostile_test.py
run tests/cli/serve_grammar_test.py
run tests/cli/serve_responses_test.py
run tests/cli/serve_share_test.py
run tests/cli/serve_spec_test.py
if [ -x build-asan/hearth ]; then
    echo "== the same against build-asan/hearth"
    HEARTH=build-asan/hearth run tests/cli/serve_test.py
    HEARTH=build-asan/hearth run tests/cli/serve_hostile_test.py
    HEARTH=build-asan/hearth run tests/cli/serve_grammar_test.py
    HEARTH=build-asan/hearth run tests/cli/serve_responses_test.py
    HEARTH=build-asan/hearth run tests/cli/serve_share_test.py
    HEARTH=build-asan/hearth run tests/cli/serve_spec_test.py
else
    echo "SKIP serve_test under the sanitizers: build-asan/hearth missing (make asan)"
    s=1
fi
echo "$p passed, $f failed, $s skipped"
[ $f -eq 0 ]
