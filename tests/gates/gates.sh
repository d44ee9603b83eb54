# gates.sh: the gates at the small shape (the tiny shape runs in tests/gates/mutants, green
# as built and red under each mutant), once at tiny on the scalar path (HEARTH_NO_SIMD), and
# at tiny-dense (the dense qwen35).
. "$(dirname "$0")/../cli/lib.sh"
for g in delta_rows_snap q_mark resume stale k_keep batch_inv anchor accuracy; do
    check "$g small" build/gates "$g" small
done
check "all tiny, scalar path" env HEARTH_NO_SIMD=1 build/gates all tiny
# the dense model (architecture qwen35: an MLP in place of the MoE): every gate
check "all tiny-dense" build/gates all tiny-dense
summary
