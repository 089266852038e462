"""icecrypt's three data sources through Spark Connect.

The client (``cluster_job.py`` with ``SparkSession.builder.remote("sc://...")``) registers
the data sources, which the server unpickles and runs in its own Python workers (this
venv's Python, ``local[2]``).  Through Connect: Avro and Parquet files written and read
back, a table made outside Spark read, appended to and read again with ``icecrypt.iceberg``,
and ``icecrypt.spark.read_table`` (the Python path there).
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pytest

from cluster_job import expected_rows, rows_digest
from clusterlib import HOST, MASTER_KEY, START_TIMEOUT, log_tail, run_driver, server_env, spark_home
from icecrypt.keys.manifest import read_key_manifest
from icecrypt.kms.local import LocalKms
from icecrypt.table import EncryptedTable

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("category", pa.string()), pa.field("amount", pa.float64())])


@pytest.fixture(scope="module")
def connect_run(spark_connect, tmp_path_factory):
    root = tmp_path_factory.mktemp("connect-run")
    keystore = root / "keystore.json"
    LocalKms.create_keystore(keystore, [MASTER_KEY])
    kms = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    table = EncryptedTable.create(str(root / "table"), SCHEMA, kms=LocalKms(keystore), table_key_id=MASTER_KEY)
    rows = expected_rows(0, 1000)
    table.append(pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows], schema=SCHEMA))

    steps = []
    for fmt in ("avro", "parquet"):
        manifest = {"keys.manifest": str(root / f"{fmt}-keys.json"), "encryption.key-id": MASTER_KEY}
        steps += [{"name": f"{fmt}_write", "op": "write", "format": f"icecrypt.{fmt}", "path": str(root / fmt),
                   "rows": 2000, "options": {**kms, **manifest, "encryption.key-id": MASTER_KEY}},
                  {"name": f"{fmt}_read", "op": "read", "format": f"icecrypt.{fmt}", "path": str(root / fmt),
                   "options": {**kms, **manifest}}]
    steps += [
        {"name": "ice_read", "op": "read", "format": "icecrypt.iceberg", "path": str(root / "table"), "options": kms},
        {"name": "ice_append", "op": "write", "format": "icecrypt.iceberg", "path": str(root / "table"),
         "first": 1000, "rows": 500, "options": kms},
        {"name": "ice_read_again", "op": "read", "format": "icecrypt.iceberg", "path": str(root / "table"),
         "options": kms},
        # read_table through Connect: no JVM on the client, so the Python path (or, with
        # native=true, an error saying why)
        {"name": "read_table_auto", "op": "read", "native": "auto", "path": str(root / "table"), "options": kms},
        {"name": "read_table_native", "op": "read", "native": "true", "path": str(root / "table"), "options": kms},
    ]
    spec = {"master": spark_connect.url, "steps": steps}
    return root, LocalKms(keystore), run_driver("cluster_job.py", spec, cwd=root)["steps"]


def _ok(steps, name):
    assert steps[name]["ok"], f"{name}: {steps[name].get('error', '')[:3000]}"
    return steps[name]


@pytest.mark.parametrize("fmt", ["avro", "parquet"])
def test_file_source_through_connect(connect_run, fmt):
    root, kms, steps = connect_run
    _ok(steps, f"{fmt}_write")
    read = _ok(steps, f"{fmt}_read")
    assert read["count"] == 2000 and read["digest"] == rows_digest(expected_rows(0, 2000))
    assert read_key_manifest(root / f"{fmt}-keys.json", kms)


def test_iceberg_through_connect(connect_run):
    root, kms, steps = connect_run
    assert _ok(steps, "ice_read")["digest"] == rows_digest(expected_rows(0, 1000))
    _ok(steps, "ice_append")
    assert _ok(steps, "ice_read_again")["digest"] == rows_digest(expected_rows(0, 1500))
    table = EncryptedTable.load(str(root / "table"), kms=kms)
    assert len(table.snapshots()) == 2 and table.scan().to_arrow().num_rows == 1500


def test_read_table_through_connect_takes_the_python_path(connect_run):
    root, kms, steps = connect_run
    assert _ok(steps, "read_table_auto")["digest"] == rows_digest(expected_rows(0, 1500))
    refused = steps["read_table_native"]
    assert not refused["ok"] and "Spark Connect" in refused["error"], refused


@pytest.fixture(scope="module")
def connect_with_catalog(tmp_path_factory):
    """A Connect server whose session names icecrypt's SQL catalog (the jar on its classpath)."""
    import icecrypt.spark
    from servers import ServerStartError, free_port, start_process, stop_process, unavailable, wait_for_port

    root = tmp_path_factory.mktemp("connect-catalog")
    port = free_port()
    log = root / "connect.log"
    args = [spark_home() / "bin" / "spark-submit", "--master", "local[1]", "--driver-memory", "1g",
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--jars", icecrypt.spark.jar_path(),
            "--conf", f"spark.connect.grpc.binding.address={HOST}", "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", f"spark.driver.host={HOST}", "--conf", f"spark.driver.bindAddress={HOST}",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.catalog.enc=org.icecrypt.spark.SparkCatalog",
            "--conf", f"spark.sql.catalog.enc.warehouse={root / 'warehouse'}", "spark-internal"]
    proc = start_process(args, env=server_env({"PYSPARK_PYTHON": sys.executable}), cwd=root, log_path=log)
    try:
        try:
            wait_for_port(HOST, port, timeout=START_TIMEOUT, proc=proc)
        except ServerStartError as exc:
            unavailable(f"Spark Connect server did not start: {exc}\n{log_tail(log)}")
        yield f"sc://{HOST}:{port}", root
    finally:
        stop_process(proc, timeout=15)


def test_sql_catalog_refuses_spark_connect(connect_with_catalog):
    """The catalog needs icecrypt's Python driver in the server's JVM: through Connect it
    refuses every statement, saying why, and touches nothing."""
    url, root = connect_with_catalog
    steps = [{"name": "show", "op": "sql", "statement": "SHOW NAMESPACES IN enc"},
             {"name": "create", "op": "sql", "statement": "CREATE NAMESPACE enc.db"},
             {"name": "select", "op": "sql", "statement": "SELECT * FROM enc.db.t"}]
    result = run_driver("cluster_job.py", {"master": url, "steps": steps}, cwd=root)["steps"]
    for name in ("show", "create", "select"):
        assert not result[name]["ok"], name
        error = result[name]["error"]
        assert "no icecrypt driver is registered" in error and "Spark Connect cannot use this catalog" in error, error
    assert not (root / "warehouse").exists()
