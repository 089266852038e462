"""An executor task killed mid-write (issue 11 §3): the job's retry commits exactly once
and the killed attempt leaves nothing in the committed table or output; a job whose every
attempt is killed commits nothing and leaves nothing behind (for tables: nothing
``remove_orphan_files`` does not remove).

The writes run in a Spark session of their own, in a subprocess
(``spark_task_kill_job.py``): the shared test session is ``local[2]``, where Spark ignores
``spark.task.maxFailures``; ``local[2,3]`` gives every task 3 attempts.  The data sources
there are icecrypt's, registered under their own names, whose writer's input iterator
calls ``os._exit(1)`` at batch 6 (of 10, 1000 rows each) of one partition — on attempt 0
only, or on every attempt.  One session runs all six scenarios:

==================  =============================================  ==========================
scenario            write                                          kill
==================  =============================================  ==========================
``ice_retry``       ``df.write.format("icecrypt.iceberg")`` append  partition 1, attempt 0
``ice_fail``        same, another table                            partition 1, every attempt
``parquet_retry``   ``icecrypt.spark.write(format="parquet")``     partition 1, attempt 0
``parquet_fail``    same, another directory                        partition 0, every attempt
``avro_retry``      ``df.write.format("icecrypt.avro")``           partition 1, attempt 0
``avro_fail``       same, another directory                        partition 0, every attempt
==================  =============================================  ==========================

The tables roll data files every ~50 kB (``target-file-size-bytes``), so the killed
attempt has published data files before it dies. Their names carry the job's id (the
table's operation id, the file sources' job id), and the driver deletes them after the
commit or in the abort: no attempt that died leaves a file behind.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import posixpath
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from spark_task_kill_job import expected_rows  # noqa: E402

from icecrypt import avro, parquet  # noqa: E402
from icecrypt.keys.manifest import read_key_manifest  # noqa: E402
from icecrypt.kms.local import LocalKms  # noqa: E402
from icecrypt.table import EncryptedTable  # noqa: E402
from icecrypt.table.maintenance.actions import referenced_files  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
MASTER = "master"
ROWS, PARTITIONS, KILL_BATCH = 20_000, 2, 6
ATTEMPTS = 3  # local[2,3]
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("category", pa.string()),
                    pa.field("amount", pa.float64())])
INITIAL = pa.table({"id": pa.array([-2, -1], pa.int64()), "category": ["x", "y"], "amount": [-1.0, -0.5]},
                   schema=SCHEMA)


@dataclasses.dataclass
class TableState:
    """A table right after the Spark job (before any test touches it)."""

    snapshots_before: list[int]
    files: list[str]  # every file under <table>/data, filesystem paths
    referenced: set[str]

    @property
    def unreferenced_visible(self) -> list[str]:
        return [f for f in self.files if f not in self.referenced and not posixpath.basename(f).startswith(".")]


@dataclasses.dataclass
class Runs:
    root: Path
    kms: LocalKms
    results: dict[str, dict]
    tables: dict[str, TableState]

    def ok(self, name: str) -> bool:
        return self.results[name]["ok"]

    def markers(self, name: str) -> dict[str, int]:
        """``attempt-p<P>-a<A>`` / ``killed-p<P>-a<A>`` -> pid of the worker."""
        prefix = f"{name}-"
        return {p.name[len(prefix):]: int(p.read_text()) for p in (self.root / "logs").iterdir()
                if p.name.startswith(prefix)}

    def table(self, name: str) -> EncryptedTable:
        return EncryptedTable.load(str(self.root / name), kms=self.kms)


def _data_files(table_dir: Path) -> list[str]:
    return sorted(str(p) for p in (table_dir / "data").rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    root = tmp_path_factory.mktemp("spark-task-kill")
    (root / "logs").mkdir()
    keystore = root / "keystore.json"
    LocalKms.create_keystore(keystore, [MASTER])
    kms = LocalKms(keystore)
    kms_options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    before = {}
    for name in ("ice_retry", "ice_fail"):
        table = EncryptedTable.create(str(root / name), SCHEMA, kms=kms, table_key_id=MASTER)
        table.append(INITIAL)
        before[name] = [s.snapshot_id for s in table.refresh().snapshots()]

    common = {"rows": ROWS, "partitions": PARTITIONS, "kill_batch": KILL_BATCH}
    roll = {"target-file-size-bytes": "50000"}
    scenarios = [
        {"name": "ice_retry", "how": "iceberg", "path": str(root / "ice_retry"), "kill_partition": 1,
         "kill_attempts": "first", "options": roll},
        {"name": "ice_fail", "how": "iceberg", "path": str(root / "ice_fail"), "kill_partition": 1,
         "kill_attempts": "all", "options": roll},
        {"name": "parquet_retry", "how": "spark.write", "format": "parquet", "path": str(root / "parquet_retry"),
         "kill_partition": 1, "kill_attempts": "first", "options": {"row-group-size": "1500"}},
        {"name": "parquet_fail", "how": "spark.write", "format": "parquet", "path": str(root / "parquet_fail"),
         "kill_partition": 0, "kill_attempts": "all"},
        {"name": "avro_retry", "how": "df.write", "format": "avro", "path": str(root / "avro_retry"),
         "manifest": str(root / "avro_retry_keys.json"), "kill_partition": 1, "kill_attempts": "first"},
        {"name": "avro_fail", "how": "df.write", "format": "avro", "path": str(root / "avro_fail"),
         "manifest": str(root / "avro_fail_keys.json"), "kill_partition": 0, "kill_attempts": "all"},
    ]
    spec = {
        "tests_dir": str(HERE.parent), "master_url": f"local[2,{ATTEMPTS}]", "master": MASTER, "kms": kms_options,
        "log_dir": str(root / "logs"), "conf": {"spark.sql.execution.arrow.maxRecordsPerBatch": "1000"},
        "scenarios": [{**common, **s} for s in scenarios],
    }
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(HERE / "spark_task_kill_job.py"), str(spec_path)], env=env,
                          cwd=str(root), capture_output=True, text=True, timeout=600)  # a hang guard only
    result_path = Path(str(spec_path) + ".result.json")
    assert proc.returncode == 0 and result_path.exists(), f"driver failed ({proc.returncode}):\n{proc.stderr[-5000:]}"
    results = json.loads(result_path.read_text())
    tables = {}
    for name in ("ice_retry", "ice_fail"):
        table = EncryptedTable.load(str(root / name), kms=kms)
        tables[name] = TableState(before[name], _data_files(root / name), referenced_files(table))
    return Runs(root, kms, results, tables)


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(*(table.column(n).to_pylist() for n in ("id", "category", "amount")), strict=True))


def _killed_once(runs: Runs, name: str, partition: int) -> dict[str, int]:
    markers = runs.markers(name)
    assert f"killed-p{partition}-a0" in markers, sorted(markers)  # the kill happened...
    assert f"attempt-p{partition}-a1" in markers and f"killed-p{partition}-a1" not in markers  # ...and a retry ran
    assert not any(m.startswith("killed-") and m != f"killed-p{partition}-a0" for m in markers)
    return markers


def _killed_always(runs: Runs, name: str, partition: int) -> dict[str, int]:
    markers = runs.markers(name)
    assert {m for m in markers if m.startswith("killed-")} == {f"killed-p{partition}-a{a}" for a in range(ATTEMPTS)}
    assert "failed 3 times" in runs.results[name]["error"], runs.results[name]["error"][:500]
    return markers


def _pid_of(data_file: str) -> int:
    # icecrypt.table names data files <partition>-<pid % 100000>-<write uuid>-<count>.<ext>
    return int(posixpath.basename(data_file).lstrip(".").split("-")[1])


# --- icecrypt.iceberg ---------------------------------------------------------------------------


def test_iceberg_append_retry_commits_once(runs):
    assert runs.ok("ice_retry"), runs.results["ice_retry"]
    markers = _killed_once(runs, "ice_retry", 1)
    table = runs.table("ice_retry")
    state = runs.tables["ice_retry"]
    snapshots = table.snapshots()
    assert [s.snapshot_id for s in snapshots[:-1]] == state.snapshots_before  # exactly one new snapshot
    assert snapshots[-1].parent_snapshot_id == state.snapshots_before[-1]
    assert table.current_snapshot_id == snapshots[-1].snapshot_id
    assert _rows(table.scan().to_arrow()) == sorted(_rows(INITIAL) + expected_rows(ROWS))  # every row once
    report = table.verify()
    assert report.ok, str(report)
    # whatever no snapshot references was written by the killed worker, nothing by the committed job
    killed_pid = markers["killed-p1-a0"] % 100_000
    stray = [f for f in state.files if f not in state.referenced]
    assert all(_pid_of(f) == killed_pid for f in stray), (killed_pid, stray)


def test_iceberg_killed_attempt_orphans_are_removable(runs):
    """What the killed attempt left is exactly what remove_orphan_files(now) deletes;
    afterwards every file under data/ is referenced and the table is unchanged."""
    assert runs.ok("ice_retry")
    table = runs.table("ice_retry")
    state = runs.tables["ice_retry"]
    stray = sorted(f for f in state.files if f not in state.referenced)
    snapshot = table.current_snapshot_id
    result = table.remove_orphan_files(older_than=datetime.datetime.now(datetime.timezone.utc))
    assert sorted(str(Path(p)) for p in result.orphan_files if "/data/" in p) == stray
    assert set(_data_files(runs.root / "ice_retry")) <= state.referenced
    table = runs.table("ice_retry")
    assert table.current_snapshot_id == snapshot and table.verify().ok
    assert table.scan().to_arrow().num_rows == ROWS + INITIAL.num_rows


def test_iceberg_killed_attempt_leaves_no_visible_orphan(runs):
    """The data files carry the job's operation id: after the commit the driver deletes
    what the killed attempt left (it never reported them)."""
    assert runs.ok("ice_retry")
    assert runs.tables["ice_retry"].unreferenced_visible == []
    assert [f for f in runs.tables["ice_retry"].files if f not in runs.tables["ice_retry"].referenced] == []


def test_iceberg_job_failure_commits_nothing(runs):
    assert not runs.ok("ice_fail")
    markers = _killed_always(runs, "ice_fail", 1)
    table = runs.table("ice_fail")
    state = runs.tables["ice_fail"]
    assert [s.snapshot_id for s in table.snapshots()] == state.snapshots_before  # no snapshot committed
    assert _rows(table.scan().to_arrow()) == _rows(INITIAL)
    assert table.verify().ok
    # abort removed the files of the attempt that succeeded (partition 0); only the killed
    # workers' files are left, and remove_orphan_files(now) removes them all
    killed = {pid % 100_000 for m, pid in markers.items() if m.startswith("killed-")}
    stray = sorted(f for f in state.files if f not in state.referenced)
    assert all(_pid_of(f) in killed for f in stray), (killed, stray)
    result = table.remove_orphan_files(older_than=datetime.datetime.now(datetime.timezone.utc))
    assert sorted(str(Path(p)) for p in result.orphan_files if "/data/" in p) == stray
    assert set(_data_files(runs.root / "ice_fail")) <= state.referenced
    assert runs.table("ice_fail").verify().ok


# --- icecrypt.parquet / icecrypt.avro -------------------------------------------------------------

FILE_SOURCES = {"parquet": ("_icecrypt_keys.json", ".parquet"), "avro": (None, ".avro")}


def _manifest(runs: Runs, fmt: str, scenario: str) -> Path:
    name, _ = FILE_SOURCES[fmt]
    return runs.root / scenario / name if name else runs.root / f"{scenario}_keys.json"


def _read(fmt: str, path: str, key) -> pa.Table:
    return parquet.read_table(path, key) if fmt == "parquet" else avro.read(path, key)


@pytest.mark.parametrize("fmt", sorted(FILE_SOURCES))
def test_file_write_retry_commits_once(runs, fmt):
    scenario = f"{fmt}_retry"
    assert runs.ok(scenario), runs.results[scenario]
    _killed_once(runs, scenario, 1)
    out = runs.root / scenario
    keys = read_key_manifest(_manifest(runs, fmt, scenario), runs.kms)
    everything = sorted(p.name for p in out.iterdir())
    data = sorted(str(p) for p in out.iterdir() if p.name.endswith(FILE_SOURCES[fmt][1]) and p.name[0] not in "._")
    assert sorted(keys) == data and len(data) == PARTITIONS, everything  # the manifest lists exactly the files
    assert not [n for n in everything if n.startswith(".")], everything  # no temporary of the killed attempt
    rows = pa.concat_tables([_read(fmt, path, keys[path]) for path in data])
    assert _rows(rows) == expected_rows(ROWS)  # every row once


@pytest.mark.parametrize("fmt", sorted(FILE_SOURCES))
def test_file_write_job_failure_leaves_nothing(runs, fmt):
    scenario = f"{fmt}_fail"
    assert not runs.ok(scenario)
    _killed_always(runs, scenario, 0)
    out = runs.root / scenario
    assert sorted(p.name for p in out.iterdir()) == []  # abort removed the other task's file and the temporaries
    manifest = _manifest(runs, fmt, scenario)
    assert not manifest.exists() or read_key_manifest(manifest, runs.kms) == {}


def test_job_files_match_only_this_jobs_files_and_temporaries():
    """The names commit/abort clean up: this job's files and its attempts' temporaries,
    never another job's, the key manifest or other hidden files."""
    from icecrypt.spark._write import _is_job_file

    job, other = "a" * 32, "b" * 32
    marker = f"-{job}-"
    assert _is_job_file(f"part-00001-{job}-9.parquet", marker)
    assert _is_job_file(f".part-00001-{job}-8.parquet.96385ced81523e95.tmp", marker)
    assert _is_job_file(f".part-00000-{job}-10.avro.e2a63910c28e4bb980c44a4fce9c67cb.tmp", marker)
    for name in (f"part-00001-{other}-9.parquet", f".part-00001-{other}-8.parquet.96385ced81523e95.tmp",
                 f".part-00001-{job}-8.parquet.crc", "_icecrypt_keys.json", f"._icecrypt_keys.json.{job}.tmp",
                 f"x-{job}-1.parquet"):
        assert not _is_job_file(name, marker), name
