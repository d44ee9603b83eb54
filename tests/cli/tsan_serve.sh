# tsan_serve.sh: tests/cli/serve_test.py against the ThreadSanitizer build (build-tsan/hearth,
# `make tsan`, which `make test` builds): the engine thread, the HTTP connection threads, the
# pool's workers and the prompt cache under every check serve_test makes (parallel slots,
# disconnects, the queue, restarts, SIGTERM). Every server and `hearth run` it starts writes
# its reports to one folder; any report there fails the suite, with its summary lines.
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
BIN=build-tsan/hearth
if [ ! -x "$BIN" ]; then
    skip "serve_test under TSan" "$BIN not built (make tsan)"
    summary
    exit
fi
reports="$TMP/tsan-reports"
rm -rf "$reports" && mkdir -p "$reports"
# halt_on_error=0: a race is reported and the run goes on, so one run shows them all
export TSAN_OPTIONS="log_path=$reports/report second_deadlock_stack=1 halt_on_error=0"
out=$(HEARTH=$BIN python3 tests/cli/serve_test.py 2>&1); rc=$?
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -n 1)
if [ $rc -eq 0 ] && [ -n "$line" ]; then ok "serve_test under TSan: $line"
else bad "serve_test under TSan (exit $rc)" "$(grep -E '^FAIL' <<<"$out"; tail -n 15 <<<"$out")"; fi
n=$(cat "$reports"/report* 2>/dev/null | grep -c '^WARNING: ThreadSanitizer')
if [ "$n" = 0 ]; then ok "no ThreadSanitizer report from any process"
else bad "$n ThreadSanitizer reports" "$(cat "$reports"/report* | grep -E '^(WARNING|SUMMARY)' | sort | uniq -c)"; fi
summary
