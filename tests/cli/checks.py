"""checks.py: the one-line checks every Python suite under tests/cli prints (serve_test.py and
the suites that import it, shapes_test.py, replicas_test.py, scenarios_test.py): an "ok NAME"
or "FAIL NAME: detail" line per check (the failure also to stderr, where tests/run's log
keeps it beside the server's), the counts, and the summary line tests/run reads."""
import sys

passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""))
        print(f"    check failed: {name} {detail}", file=sys.stderr)
    sys.stdout.flush()


def summary(skipped=None):
    """the last line: "N passed, N failed" (", N skipped" when given)"""
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped is not None else ""))
    return failed
