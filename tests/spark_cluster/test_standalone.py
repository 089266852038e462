"""icecrypt's data sources on a Spark standalone cluster: a master and a worker JVM, whose
executor (its own JVM, with its own Python workers, in the worker's work directory) does
the file work while the driver runs in a subprocess.

One driver run (``cluster_run`` in conftest.py: ``cluster_job.py`` with the executors'
environment shipped as an archive, see test_ship.py) does every step; the tests judge
its results:

* the file sources (``icecrypt.avro``, ``icecrypt.parquet``) write and read back on the
  cluster, and ``icecrypt.iceberg`` creates, appends to and reads a table, with a KMS the
  executors can use (a keystore file named in the options);
* key transport: with a KMS only the driver can use (the local keystore named by the
  driver's ``ICECRYPT_KEYSTORE``; the worker's environment has no such variable, as an
  executor host without the KMS role or credentials), the file sources with the default
  ``keys.transport=executor`` fail with a ``KmsError`` from the executors, and with
  ``keys.transport=task`` read and write; ``icecrypt.iceberg`` reads and appends either way;
* ``icecrypt.spark.read_table`` reads through Spark's Parquet reader in the executor's JVM.
"""

from __future__ import annotations

import pytest

from cluster_job import expected_rows, rows_digest
from clusterlib import NATIVE_DELETED, ROWS
from icecrypt import avro, parquet
from icecrypt.keys.manifest import read_key_manifest
from icecrypt.table import EncryptedTable

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _ok(steps: dict, name: str) -> dict:
    step = steps[name]
    assert step["ok"], f"{name}: {step.get('error', '')[:3000]}"
    return step


def _same_rows(step: dict, rows: list[tuple]) -> None:
    assert step["count"] == len(rows)
    assert step["id_sum"] == sum(r[0] for r in rows)
    assert step["digest"] == rows_digest(rows)


def _kms_failure(steps: dict, name: str) -> str:
    step = steps[name]
    assert not step["ok"], f"{name} should have failed: executors have no KMS access"
    assert "KmsError" in step["error"], step["error"][:3000]
    assert "local KMS needs a keystore" in step["error"], step["error"][:3000]
    return step["error"]


def test_tasks_run_in_executors_without_kms_access(cluster_run, spark_standalone):
    steps = cluster_run.steps
    executors = _ok(steps, "probe")["executors"]
    assert executors
    for executor in executors:  # the executor's own working directory, none of the driver's environment
        assert executor["cwd"].startswith(str(spark_standalone.work_dir)), executor
        assert executor["keystore_env"] is False


@pytest.mark.parametrize("fmt", ["avro", "parquet"])
def test_file_source_round_trip(cluster_run, fmt):
    root, kms, steps = cluster_run.root, cluster_run.kms, cluster_run.steps
    _ok(steps, f"{fmt}_write")
    _same_rows(_ok(steps, f"{fmt}_read"), expected_rows(0, ROWS))
    keys = read_key_manifest(root / f"{fmt}-keys.json", kms)
    files = sorted((root / fmt).glob(f"part-*.{fmt}"))
    assert len(files) == 2 and {str(f) for f in files} == set(keys)  # one file per task, each key recorded


@pytest.mark.parametrize("fmt", ["avro", "parquet"])
def test_default_key_transport_needs_kms_in_executors(cluster_run, fmt):
    root, steps = cluster_run.root, cluster_run.steps
    _kms_failure(steps, f"{fmt}_write_executor_keys")
    _kms_failure(steps, f"{fmt}_read_executor_keys")
    assert not list((root / f"{fmt}-executor").glob("part-*")), "an aborted write leaves no data file"


@pytest.mark.parametrize("fmt", ["avro", "parquet"])
def test_task_key_transport_without_kms_in_executors(cluster_run, fmt):
    root, kms, steps = cluster_run.root, cluster_run.kms, cluster_run.steps
    _ok(steps, f"{fmt}_write_task_keys")
    _same_rows(_ok(steps, f"{fmt}_read_task_keys"), expected_rows(0, ROWS))
    # what the driver recorded decrypts the files outside Spark too
    keys = read_key_manifest(root / f"{fmt}-task-keys.json", kms)
    files = sorted(str(f) for f in (root / f"{fmt}-task").glob(f"part-*.{fmt}"))
    assert files and sorted(keys) == files
    read = avro.read if fmt == "avro" else parquet.read_table
    rows = sum(read(path, keys[path]).num_rows for path in files)
    assert rows == ROWS


def test_iceberg_append_and_read(cluster_run):
    steps = cluster_run.steps
    # the create took Spark's own Parquet writer (the native write), the append the Python source
    assert _ok(steps, "ice_create")["spark_writer_files"] >= 1
    assert _ok(steps, "ice_append")["spark_writer_files"] == 0
    _same_rows(_ok(steps, "ice_read"), expected_rows(0, ROWS + 1000))


def test_iceberg_executors_never_call_the_kms(cluster_run):
    root, kms, steps = cluster_run.root, cluster_run.kms, cluster_run.steps
    # the native write: the executors' JVM encrypts with the write's secret, no KMS there
    assert _ok(steps, "ice_append_driver_kms")["spark_writer_files"] >= 1
    _same_rows(_ok(steps, "ice_read_driver_kms"), expected_rows(0, ROWS + 1500))
    table = EncryptedTable.load(str(root / "table"), kms=kms)
    assert len(table.snapshots()) == 3
    assert table.scan().to_arrow().num_rows == ROWS + 1500


def test_no_key_material_in_event_log_or_executor_logs(cluster_run, spark_standalone):
    """Task-carried keys travel in task descriptions, not in what Spark records: the event
    log (plans, options, task and stage events) and the executors' logs hold no data key
    of any file the run wrote, in any form."""
    from kms_fixtures_services import _key_forms

    root, kms = cluster_run.root, cluster_run.kms
    keys = []
    for manifest in root.glob("*-keys.json"):
        keys += [km.encryption_key for km in read_key_manifest(manifest, kms).values()]
    for name in ("table", "native-table"):  # the native reads put their files' keys in read options
        table = EncryptedTable.load(str(root / name), kms=kms)
        keys += [task.file.key().encryption_key for task in table.scan().plan_files()]
    assert len(keys) >= 12
    events = [p for p in (root / "events").rglob("*") if p.is_file()]  # Spark 4: a directory per application
    assert events and sum(p.stat().st_size for p in events) > 0
    logs = events + [p for p in spark_standalone.work_dir.rglob("std*") if p.is_file()]
    for path in logs:
        text = path.read_bytes().decode("latin-1")
        for key in keys:
            for form in _key_forms(key):
                assert form not in text, f"key material in {path}"


def test_native_read_on_the_cluster(cluster_run):
    """icecrypt.spark.read_table on the cluster: the executor's JVM decrypts with the jar
    (spark.jars, icecrypt.spark.configure) and the keys the driver planned, with no KMS on
    the executors; a file's deletion vector applied there by the jar's LiveRows format
    (shipped in the task); the same read through format("icecrypt.iceberg"), routed by the
    analyzer rule; a tampered file fails the read naming it."""
    steps = cluster_run.steps
    read = _ok(steps, "native_read")
    _same_rows(read, expected_rows(0, ROWS))
    assert read["spark_parquet_scan"] and not read["python_tasks"] and not read["deletes_filter"]
    _ok(steps, "native_delete")
    read = _ok(steps, "native_read_deletes")
    _same_rows(read, expected_rows(NATIVE_DELETED, ROWS - NATIVE_DELETED))
    assert read["spark_parquet_scan"] and read["deletes_filter"] and not read["python_tasks"]
    routed = _ok(steps, "native_read_routed")  # format("icecrypt.iceberg") in a configured session
    assert routed["spark_parquet_scan"] and routed["deletes_filter"] and not routed["python_tasks"]
    assert {k: routed[k] for k in ("count", "id_sum", "digest")} == {k: read[k] for k in ("count", "id_sum", "digest")}
    victim = _ok(steps, "native_tamper")["victim"]
    failed = steps["native_read_tampered"]
    assert not failed["ok"], "a tampered file must fail the read"
    assert victim.rsplit("/", 1)[-1] in failed["error"] and "tag" in failed["error"].lower(), failed["error"][:3000]


def test_sql_merge_on_the_cluster(cluster_run):
    """Spark SQL through icecrypt's catalog on the standalone cluster: CREATE TABLE, INSERT
    and a MERGE INTO (copy-on-write: the executors read the files, join, write the result
    with Spark's Parquet writer and the keys the driver handed over; no KMS there), then the
    rows checked against a model and through the table API; every data file sealed."""
    from clusterlib import SQL_ROWS

    steps = cluster_run.steps
    for name in ("sql_namespace", "sql_create", "sql_insert", "sql_merge"):
        _ok(steps, name)
    model = {i: i * 1.5 for i in range(SQL_ROWS)}
    for i in range(SQL_ROWS // 5):  # id 10 i is in category c(10 i % 3) = c(i % 3): matched, or new past the end
        model[i * 10] = -1.0
    count, total, updated = _ok(steps, "sql_result")["rows"][0]
    assert count == len(model)
    assert total == pytest.approx(sum(model.values()))
    assert updated == SQL_ROWS // 5
    from icecrypt.spark._sql.catalogs import open_catalog

    root = cluster_run.root / "sql-warehouse"
    catalog = open_catalog("enc", {"type": "sql", "warehouse": str(root), "encryption.kms-type": "local",
                                   "encryption.kms.local.keystore": str(cluster_run.root / "keystore.json")})
    rows = catalog.load_table(("db", "orders")).scan().to_arrow().to_pydict()
    assert sorted(zip(rows["id"], rows["amount"])) == sorted(model.items())
    sealed = [p for p in root.rglob("*.parquet")]
    assert sealed and all(p.read_bytes()[:4] == b"PARE" for p in sealed)
