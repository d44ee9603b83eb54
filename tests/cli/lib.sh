# lib.sh: helpers for the shell suites. Each suite sources it, calls check/skip, and ends
# with `summary`, which prints "N passed, N failed, N skipped".
_p=0 _f=0 _s=0
HEARTH=${HEARTH:-build/hearth}
TMP=${HEARTH_TMP:-$(mktemp -d)}
ok()   { _p=$((_p + 1)); echo "ok   $1"; }
bad()  { _f=$((_f + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && echo "$2" | head -n 20 | sed 's/^/     /'; }
skip() { _s=$((_s + 1)); echo "SKIP $1: $2"; }
# check NAME CMD...: passes when CMD exits 0.
check() { local n=$1; shift; local out; if out=$("$@" 2>&1); then ok "$n"; else bad "$n" "$out"; fi; }
# check_fails NAME PATTERN CMD...: passes when CMD exits non-zero (not by a signal)
# and its output matches PATTERN (an extended regex).
check_fails() {
    local n=$1 pat=$2; shift 2; local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc -eq 0 ]; then bad "$n" "exited 0: $out"
    elif [ $rc -ge 128 ]; then bad "$n" "killed by signal $((rc - 128)): $out"
    elif ! grep -Eq -- "$pat" <<<"$out"; then bad "$n" "message does not match /$pat/: $out"
    else ok "$n"; fi
}
summary() { echo "$_p passed, $_f failed, $_s skipped"; [ $_f -eq 0 ]; }
