"""icecrypt's three data sources through Spark Connect.

The client (``cluster_job.py`` with ``SparkSession.builder.remote("sc://...")``) registers
the data sources, which the server unpickles and runs in its own Python workers (this
venv's Python, ``local[2]``).  Through Connect: Avro and Parquet files written and read
back, a table made outside Spark read, appended to and read again with ``icecrypt.iceberg``,
and ``icecrypt.spark.read_table`` (the Python path there).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from cluster_job import expected_rows, rows_digest
from clusterlib import MASTER_KEY, run_driver
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
