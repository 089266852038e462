"""pytest plugin: every test leaves ``os.environ`` as it found it.

A worker runs many test files one after the other, and a variable a test leaks steers the
subprocesses of the tests after it (a leaked ``PYSPARK_PYTHON`` once failed the demo's
test on another file's worker).  A plugin rather than conftest.py: a hook of a conftest
is not called for the session-scoped fixtures, whose setting up this needs to see.
"""

from __future__ import annotations

import os

import pytest

#: what fixtures wider than a test set in os.environ (a Spark session's PYSPARK_PYTHON,
#: SoftHSM's configuration), in order: such a fixture may be set up in the middle of a test
#: (request.getfixturevalue), and what it sets is its own, kept for the rest of the run
_WIDE_FIXTURE_ENV: list[tuple[str, str | None]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope == "function":
        yield
        return
    before = dict(os.environ)
    yield
    _WIDE_FIXTURE_ENV.extend((key, os.environ.get(key)) for key in sorted(before.keys() | os.environ.keys())
                             if before.get(key) != os.environ.get(key))


@pytest.fixture(autouse=True)
def _environment_restored():
    """Fail a test that leaves os.environ changed: a worker runs many test files, and a
    leaked variable (PYSPARK_PYTHON, once) steers the subprocesses of the tests after it.
    What fixtures of wider scope set is theirs (``pytest_fixture_setup`` above)."""
    before = dict(os.environ)
    mark = len(_WIDE_FIXTURE_ENV)
    yield
    for key, value in _WIDE_FIXTURE_ENV[mark:]:
        if value is None:
            before.pop(key, None)
        else:
            before[key] = value
    after = dict(os.environ)
    changed = sorted(k for k in before.keys() | after.keys()
                     if before.get(k) != after.get(k) and k != "PYTEST_CURRENT_TEST")  # pytest's own
    if changed:
        for key in changed:
            if key in before:
                os.environ[key] = before[key]
            else:
                del os.environ[key]
        pytest.fail(f"the test left environment variables changed: {changed} (use monkeypatch)")
