# bench/device_step.sh: sourced by the device scripts (device_f7.sh, device_wg.sh) after they
# set out (the log folder), t_start and deadline (seconds since t_start the call may use).
# left: the seconds left; step NAME SECONDS COMMAND...: runs the command under a timeout cut to
# the time left (skipped under 15 s) into $out/NAME.log and prints one line: its exit status,
# its time and the log's summary lines (tests' counts and failures, a bench's figures).
left() { echo $(( deadline - ($(date +%s) - t_start) )); }
step() { # name, seconds, command... (env assignments go before step)
    local name=$1 limit=$2; shift 2
    local l; l=$(left)
    [ "$limit" -gt "$l" ] && limit=$l
    if [ "$limit" -lt 15 ]; then echo "== $name: skipped, ${l} s left"; return 0; fi
    local s=$(date +%s)
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc in $(( $(date +%s) - s )) s: $(grep -E '^[0-9]+ passed|^FAIL|^!!|skipped|tok/s|t/s' "$out/$name.log" | tail -3 | tr '\n' ' ')"
    return $rc
}
