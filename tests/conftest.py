"""Suite-wide fixtures: Java vectors, hypothesis profiles, and no swallowed exceptions."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from vectorlib import VECTORS_DIR, load_manifest

# pytest keeps each test module as rewritten for its assertions in __pycache__ (a .pyc of its
# own), unless bytecode writing is off; machines of this class set PYTHONDONTWRITEBYTECODE, so
# every run, and each xdist worker of it, parsed and rewrote all ~470 test modules again:
# collecting the suite took 20 s instead of 8 s.  The modules imported from here on (every
# test module) are kept; the package's own bytecode is `make bytecode`'s.
sys.dont_write_bytecode = False

# Fixtures of the key servers and devices (tests/servers/*), shared by tests and benchmarks.
pytest_plugins = [
    "env_guard", "kms_fixtures_devices", "kms_fixtures_cloud", "kms_fixtures_services", "spark_fixtures"]

#: Every JVM the tests start compiles with HotSpot's client compiler only.  The suite's JVMs
#: live seconds to minutes over small data, and on 2 busy cores the server compiler's
#: background compiles cost more than they return: measured on two Spark test files run side
#: by side, 107 s with the default tiers, 77 s with these.  Set for the shared session's JVM
#: and the ones test jobs and the Connect server start (spark-submit: SPARK_SUBMIT_OPTS), the
#: standalone master and worker (SPARK_DAEMON_JAVA_OPTS); the cluster's executors take
#: ``spark.executor.extraJavaOptions`` (clusterlib).  Tests only: the benchmarks keep the
#: JVM's defaults.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
#: ... and, once ``make test`` has built it (tests/jvm_archive.py), the class-data-sharing
#: archive of what a test JVM loads: start-ups halved.  ``make test`` builds it beside the
#: suite, so a JVM started before it exists runs without it; the ones started after take it
#: (checked before each test: :func:`_jvm_options`).  A JVM whose class path does not match
#: the archive runs without it; the logging options keep that (and only that) silent.
JVM_ARCHIVE = os.environ.get("ICECRYPT_TEST_JVM_ARCHIVE") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "jvm", "spark.jsa")
_ARCHIVE_OPTIONS = f"-XX:SharedArchiveFile={JVM_ARCHIVE} -Xlog:cds=off -Xlog:cds+dynamic=off"


def _jvm_options() -> None:
    """Put the test JVM options (with the archive when it exists) into the environment the
    suite's JVMs are started with; a no-op once the archive is in."""
    options = TEST_JVM_OPTIONS + (f" {_ARCHIVE_OPTIONS}" if os.path.isfile(JVM_ARCHIVE) else "")
    for variable in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
        current = os.environ.get(variable, "")
        if options not in current:
            current = current.replace(TEST_JVM_OPTIONS, "").strip()  # the options without the archive
            os.environ[variable] = f"{current} {options}".strip()


_jvm_options()


def pytest_runtest_setup(item) -> None:
    if _ARCHIVE_OPTIONS not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
        _jvm_options()

settings.register_profile("default", deadline=None, max_examples=60)
settings.register_profile(
    "ci", deadline=None, max_examples=120, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("expensive", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


#: The files that take minutes (``pytest --durations``, 2026-11-29: 1.5-7 min each on a
#: busy 2-core machine), run first.  Under ``make test`` (pytest-xdist, ``--dist loadfile
#: --no-loadscope-reorder``: files handed out in this order, not by their number of tests) a
#: file is one unit of work: a long file handed out last keeps one worker busy while the
#: other has nothing left, so the longest go first and the short ones fill in at the end.
#: Order only: a file missing here, or listed in the wrong place, changes no result.
LONGEST_FIRST = (
    "tests/docs/test_examples.py",
    "tests/faults/test_fs_faults.py",
    "tests/spark_cluster/test_standalone.py",  # (with the other files of tests/spark_cluster/: one unit)
    "tests/spark_cluster/test_ship.py",
    "tests/spark_cluster/test_connect.py",
    "tests/spark_cluster/test_key_transport.py",
    "tests/spark/test_streaming.py",
    "tests/spark_sql/test_sql_iceberg_docs.py",
    "tests/test_imports.py",
    "tests/spark/test_spark_merge.py",
    "tests/arrow/test_exit.py",
    "tests/faults/test_spark_task_kill.py",
    "tests/test_secrets_hygiene.py",
    "tests/spark/test_spark_rowlevel.py",
    "tests/spark/test_attack_spark_streaming.py",
    "tests/spark/test_session_setup.py",
    "tests/test_demo.py",
    "tests/spark/test_iceberg_time_travel.py",
    "tests/spark/test_native_read.py",
    "tests/spark_sql/test_sql_writes.py",
)


#: Directories whose files share costly session fixtures (the standalone cluster, its
#: executors' packed environment and its one driver run are used by test_ship.py and
#: test_standalone.py alike): one unit of work under ``--dist loadfile``, so that one
#: worker builds them once, instead of each worker that draws one of the files.
SHARED_SESSION_DIRECTORIES = ("tests/spark_cluster/",)

try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pytest-xdist is not installed: one process runs everything anyway
    pass
else:

    class _LoadFileSharing(LoadFileScheduling):
        """``--dist loadfile``, with each of :data:`SHARED_SESSION_DIRECTORIES` one unit."""

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return next((d for d in SHARED_SESSION_DIRECTORIES if scope.startswith(d)), scope)

    def pytest_xdist_make_scheduler(config, log):
        return _LoadFileSharing(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the shared Spark session (directly or through another fixture) is a
    Spark test, marked or not: ``-m "not spark"`` (``make test-quick``) leaves it out.  The
    files of :data:`LONGEST_FIRST` go first (a stable sort: each file's own order kept)."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def vectors():
    """manifest.json of ../shared/vectors (Iceberg Java's ground truth); never copied."""
    if not VECTORS_DIR.is_dir():
        pytest.fail(f"Java vectors not found at {VECTORS_DIR} (set ICECRYPT_VECTORS)")
    return load_manifest()


@pytest.fixture(autouse=True)
def _no_ignored_exceptions(capfd):
    """Fail any test during which Python printed "Exception ignored" (an error swallowed
    in __del__, a callback or a thread) to stderr."""
    yield
    captured = capfd.readouterr()
    sys.stdout.write(captured.out)
    sys.stderr.write(captured.err)
    assert "Exception ignored" not in captured.err, captured.err
