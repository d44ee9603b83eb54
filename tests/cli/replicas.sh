#!/usr/bin/env bash
# replicas.sh: `hearth serve` replicas behind nginx on loopback (tests/cli/replicas_test.py:
# conversation affinity through deploy/nginx-hearth.conf, failover, a shared --cache-dir,
# racing writers), on the binary and on the sanitizers' build, and deploy/hearth@.service checked
# by systemd-analyze where it is found.
# nginx comes from scripts/setup-deps.sh: missing, the suite fails in CI and skips elsewhere.
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh

nginx_bin=$(command -v nginx || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; })
if [ -z "$nginx_bin" ]; then
    if [ "${CI:-}" = true ]; then bad "nginx is missing (scripts/setup-deps.sh installs it)"
    else skip "replicas behind nginx" "nginx is missing (scripts/setup-deps.sh installs it)"; fi
else
    run_py() { # the suite on $HEARTH; its counts added to this one's
        local out rc line
        out=$(NGINX=$nginx_bin timeout 150 python3 tests/cli/replicas_test.py 2>&1)
        rc=$?
        echo "$out"
        line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -n 1)
        if [ -z "$line" ]; then bad "replicas_test.py printed no summary (exit $rc)"; return; fi
        _p=$((_p + $(sed -E 's/^([0-9]+) passed.*/\1/' <<<"$line")))
        local f
        f=$(sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")
        _f=$((_f + f))
        [ $rc -ne 0 ] && [ "$f" = 0 ] && bad "replicas_test.py exited $rc"
    }
    run_py
    # and on the AddressSanitizer + UBSan build (`make asan`, which `make test` builds), where a
    # memory error kills a replica mid-test and a leak fails its exit status on SIGTERM
    if [ -x build-asan/hearth ]; then
        echo "== the same against build-asan/hearth"
        HEARTH=build-asan/hearth run_py
    else
        skip "replicas under the sanitizers" "build-asan/hearth missing (make asan)"
    fi
fi

# the unit, with ExecStart pointed at this build (systemd-analyze wants the binary to exist)
if command -v systemd-analyze >/dev/null; then
    unit_dir=$(mktemp -d)
    sed "s#/usr/local/bin/hearth#$(readlink -f "$HEARTH")#" deploy/hearth@.service >"$unit_dir/hearth@.service"
    cp "$unit_dir/hearth@.service" "$unit_dir/hearth@8081.service"
    check "systemd-analyze verify deploy/hearth@.service" \
        bash -c "out=\$(systemd-analyze verify '$unit_dir/hearth@8081.service' 2>&1); echo \"\$out\"; [ -z \"\$out\" ]"
    rm -rf "$unit_dir"
else
    skip "deploy/hearth@.service" "systemd-analyze not found"
fi
summary
