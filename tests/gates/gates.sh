# gates.sh: the marked-prefill gates at the small shape (the tiny shape runs in
# tests/gates/mutants, green as built and red under each mutant).
. "$(dirname "$0")/../cli/lib.sh"
for g in delta_rows_snap q_mark q_mark_cut k_keep; do
    check "$g small" build/gates "$g" small
done
summary
