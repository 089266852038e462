"""Concurrent writers in separate processes commit through one catalog table (SQLite,
PostgreSQL): appends lose nothing, overwrites either win or fail cleanly.

Each writer is a fresh interpreter (``subprocess``) that builds its own catalog from
properties (the KMS from Iceberg Java's test-key properties), waits for a start file so
that all writers begin together, and reports its outcome as JSON on stdout.  Writers are
bounded: waited for with a timeout and killed (by PID) if they overrun.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from icecrypt.catalog import load_catalog

pytestmark = pytest.mark.slow

N_WRITERS = 4
APPENDS = 5
ROWS = 3
WRITER_TIMEOUT_S = 240

KMS_PROPERTIES = {
    "encryption.kms-impl": "icecrypt.kms.memory.MemoryKms",
    "encryption.kms.memory.iceberg-test-keys": "true",
}

WORKER = r"""
import json, os, sys, time
import pyarrow as pa
from icecrypt.catalog import load_catalog
from icecrypt.errors import CommitConflictError

spec = json.loads(sys.argv[1])
catalog = load_catalog("test", **spec["properties"])
table = catalog.load_table("db.t")
deadline = time.monotonic() + 60
while not os.path.exists(spec["go"]):
    if time.monotonic() > deadline:
        sys.exit("start file never appeared")
    time.sleep(0.005)
out = {"committed": [], "conflicts": []}
for i in range(spec["operations"]):
    start = spec["first_id"] + i * spec["rows"]
    data = pa.table({"id": list(range(start, start + spec["rows"])), "writer": [spec["writer"]] * spec["rows"]})
    try:
        if spec["mode"] == "append":
            out["committed"].append(table.append(data))
        else:
            out["committed"].append(table.overwrite(data))
    except CommitConflictError as exc:
        out["conflicts"].append(str(exc))
print(json.dumps(out))
"""

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("writer", pa.int64())])


def _run_writers(tmp_path, properties: dict[str, str], mode: str, writers: int, operations: int) -> list[dict]:
    go = tmp_path / f"go-{mode}"
    procs = []
    try:
        for n in range(writers):
            spec = {
                "properties": properties, "go": str(go), "mode": mode, "writer": n, "operations": operations,
                "rows": ROWS, "first_id": n * 1000,
            }  # fmt: skip
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WORKER, json.dumps(spec)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                )  # fmt: skip
            )
        time.sleep(0.2)  # let the writers import before they race (they also wait for `go`)
        go.write_text("go")
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=WRITER_TIMEOUT_S)
            assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def _properties(kind: str, request, warehouse: str) -> dict[str, str]:
    properties = {"warehouse": warehouse, **KMS_PROPERTIES}
    if kind == "postgres":
        properties["uri"] = request.getfixturevalue("postgres_uri")
    return properties


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def test_concurrent_appends_lose_nothing(kind, request, tmp_path, warehouse):
    properties = _properties(kind, request, warehouse)
    catalog = load_catalog("test", **properties)
    catalog.create_namespace("db")
    # contention of 4 writers on 2 cores: more retries than Java's default 4
    catalog.create_table("db.t", SCHEMA, table_key_id="keyA", properties={"commit.retry.num-retries": "25"})

    results = _run_writers(tmp_path, properties, "append", N_WRITERS, APPENDS)

    assert [r["conflicts"] for r in results] == [[]] * N_WRITERS
    committed = [s for r in results for s in r["committed"]]
    assert len(set(committed)) == N_WRITERS * APPENDS
    table = catalog.load_table("db.t")
    assert {s.snapshot_id for s in table.snapshots()} == set(committed)  # create makes no snapshot
    data = table.scan().to_arrow()
    assert data.num_rows == N_WRITERS * APPENDS * ROWS
    expected = sorted(n * 1000 + i for n in range(N_WRITERS) for i in range(APPENDS * ROWS))
    assert sorted(data["id"].to_pylist()) == expected
    # every commit is a metadata version (1 create + N*M appends) and the snapshots form
    # one chain of parents: each append saw (or was re-applied on) the one before it
    assert len(table.metadata["metadata-log"]) == N_WRITERS * APPENDS
    chain = [s.snapshot_id for s in table.snapshots()]
    parents = [s.parent_snapshot_id for s in table.snapshots()]
    assert parents == [None, *chain[:-1]]
    # manifest lists are named snap-<id>-<attempt>-<commit>.avro: how many commits retried
    retried = sum(1 for s in table.snapshots() if s.manifest_list.rsplit("/", 1)[1].split("-")[2] != "1")
    print(f"{kind}: {retried} of {len(chain)} appends were re-applied after losing the catalog swap")


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def test_concurrent_overwrites_one_wins_or_clean_conflict(kind, request, tmp_path, warehouse):
    properties = _properties(kind, request, warehouse)
    catalog = load_catalog("test", **properties)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(pa.table({"id": [-1], "writer": [-1]}))

    results = _run_writers(tmp_path, properties, "overwrite", 2, 1)

    winners = [n for n, r in enumerate(results) if r["committed"]]
    losers = [n for n, r in enumerate(results) if r["conflicts"]]
    assert winners and sorted(winners + losers) == [0, 1]
    for n in losers:
        assert "nothing was committed" in results[n]["conflicts"][0]
    print(f"{kind}: concurrent overwrites: {len(winners)} committed, {len(losers)} refused (CommitConflictError)")
    table = catalog.load_table("db.t")
    assert len(table.snapshots()) == 1 + len(winners)
    data = table.scan().to_arrow()
    assert data.num_rows == ROWS
    last = {s.snapshot_id: n for n in winners for s in [table.snapshot(results[n]["committed"][0])]}
    assert set(data["writer"].to_pylist()) == {last[table.current_snapshot_id]}


@pytest.mark.servers
def test_concurrent_appends_on_s3_warehouse(moto_server, tmp_path):
    """Catalog tables on an object store (moto's S3) take concurrent writers: only the
    catalog's swap decides, no create-if-absent is needed on the store."""
    import uuid

    bucket = f"wh-{uuid.uuid4().hex[:12]}"
    moto_server.boto3_client("s3").create_bucket(Bucket=bucket)
    properties = {
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": f"s3://{bucket}/warehouse",
        "s3.endpoint": moto_server.endpoint,
        "s3.access-key-id": moto_server.access_key_id,
        "s3.secret-access-key": moto_server.secret_access_key,
        "s3.region": moto_server.region,
        **KMS_PROPERTIES,
    }
    catalog = load_catalog("test", **properties)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA", properties={"commit.retry.num-retries": "25"})
    assert table.location == f"s3://{bucket}/warehouse/db/t"
    assert table.metadata_store.to_recorded(table.metadata_location).startswith(f"s3://{bucket}/warehouse/db/t/metadata/00000-")

    writers, appends = 2, 3
    results = _run_writers(tmp_path, properties, "append", writers, appends)

    assert [r["conflicts"] for r in results] == [[]] * writers
    table = catalog.load_table("db.t")
    assert len(table.snapshots()) == writers * appends
    assert table.scan().to_arrow().num_rows == writers * appends * ROWS
    listed = moto_server.boto3_client("s3").list_objects_v2(Bucket=bucket, Prefix="warehouse/db/t/metadata/")
    versions = [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".metadata.json")]
    assert len(versions) == 1 + writers * appends  # lost attempts left no metadata file behind
