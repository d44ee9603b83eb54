# gates.sh: the gates at the small shape (the tiny shape runs in tests/gates/mutants, green
# as built and red under each mutant), and once at tiny on the scalar path (HEARTH_NO_SIMD).
. "$(dirname "$0")/../cli/lib.sh"
for g in delta_rows_snap q_mark resume stale k_keep batch_inv anchor accuracy; do
    check "$g small" build/gates "$g" small
done
check "all tiny, scalar path" env HEARTH_NO_SIMD=1 build/gates all tiny
summary
