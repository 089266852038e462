"""Every input a fuzz run (or a review of what the fuzzers reach) found crashing,
replayed through the same harness under the same oracle.

Inputs live in ``regressions/<harness>/<name>`` (small files; each README line names the
defect and its fix).  A fuzz run saves a crashing input under a temporary directory
(``scripts/fuzz.sh`` prints it): copy it here, fix the bug, and this test keeps it fixed.
"""

from __future__ import annotations

import pytest

import fuzzlib

CASES = sorted(
    (p.parent.name, p) for p in fuzzlib.REGRESSIONS.glob("*/*") if p.is_file() and p.name != "README"
)


def test_regressions_exist():
    assert CASES, "no saved inputs under tests/fuzz/regressions"
    assert {name for name, _ in CASES} <= set(fuzzlib.HARNESSES)


@pytest.mark.parametrize(("name", "path"), CASES, ids=[f"{n}/{p.name}" for n, p in CASES])
def test_replay(name, path):
    harness = fuzzlib.load(name)
    fuzzlib.run_harness(harness, path.read_bytes())  # raises Finding if the bug is back
