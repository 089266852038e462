"""``icecrypt.iceberg`` time travel: the read options ``as-of-timestamp``, ``branch`` and
``tag`` (beside ``snapshot-id``) on Iceberg Java's table with four snapshots, with refs
added to a copy's metadata (icecrypt cannot make refs yet); bad options are clear errors,
and writes to a branch (option ``branch``) and WAP staging (``wap-id``)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F
from table.tablelib import copy_table, edit_metadata, expected, location_map, metadata_path, table_digest

from icecrypt.spark._iceberg_source import IcebergDataSource

pytestmark = pytest.mark.spark

JAVA_KMS = {"encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"}
FORMAT = "icecrypt.iceberg"
NAME = "enc_deletes_dek16"


@pytest.fixture(scope="module")
def ispark(spark):
    spark.dataSource.register(IcebergDataSource)
    return spark


@pytest.fixture
def tagged(tmp_path):
    """A copy of the Java table with tag ``audit`` on its second snapshot and branch
    ``dev`` on its third; (root, snapshot-log entries, expected snapshots by id)."""
    root = copy_table(NAME, tmp_path)
    path = metadata_path(NAME, root)
    document = json.loads(path.read_text(encoding="utf-8"))
    log = [(e["snapshot-id"], e["timestamp-ms"]) for e in document["snapshot-log"]]

    def add_refs(metadata: dict) -> None:
        metadata["refs"]["audit"] = {"snapshot-id": log[1][0], "type": "tag"}
        metadata["refs"]["dev"] = {"snapshot-id": log[2][0], "type": "branch"}

    edit_metadata(path, add_refs)
    return root, log, {s["snapshot_id"]: s for s in expected(NAME)["snapshots"]}


def _read(spark, root, **extra: str):
    options = {**JAVA_KMS, "location-map": json.dumps(location_map(NAME, root)), **extra}
    return spark.read.format(FORMAT).options(**options).load(str(metadata_path(NAME, root)))


def test_as_of_timestamp_branch_and_tag(ispark, tagged):
    root, log, states = tagged
    variants = [(sid, {"as-of-timestamp": str(ts)}) for sid, ts in log]
    variants += [(log[2][0], {"as-of-timestamp": str(log[3][1] - 1)}),
                 (log[1][0], {"tag": "audit"}), (log[2][0], {"branch": "dev"}), (log[3][0], {"branch": "main"})]
    frames = [_read(ispark, root, **options).withColumn("_variant", F.lit(i))
              for i, (_, options) in enumerate(variants)]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    rows = union.toArrow()  # one Spark job
    for index, (snapshot_id, options) in enumerate(variants):
        mine = rows.filter(pc.equal(rows["_variant"], index)).drop_columns(["_variant"])
        assert mine.num_rows == states[snapshot_id]["expected_row_count"], options
        assert table_digest(mine) == states[snapshot_id]["expected_digest_sha256"], options


def test_bad_time_travel_options(ispark, tagged):
    root, log, _ = tagged

    def error(**options: str) -> str:
        with pytest.raises(Exception) as info:
            _read(ispark, root, **options).schema  # noqa: B018 - load() runs the source's schema()
        return str(info.value)

    assert "has no snapshot as of" in error(**{"as-of-timestamp": str(log[0][1] - 1)})
    assert "as-of-timestamp='yesterday' is not a timestamp (milliseconds since the epoch)" in \
        error(**{"as-of-timestamp": "yesterday"})
    assert "has no branch 'nope'" in error(branch="nope")
    assert "has no tag 'nope'" in error(tag="nope")
    assert "'audit' is a tag, not a branch" in error(branch="audit")
    assert "'dev' is a branch, not a tag" in error(tag="dev")
    assert "at most one of snapshot_id, as_of_timestamp, branch and tag" in \
        error(tag="audit", **{"snapshot-id": str(log[0][0])})
    # a ref naming a snapshot the table lacks: the version is refused when loaded
    path = metadata_path(NAME, root)
    edit_metadata(path, lambda metadata: metadata["refs"].update(ghost={"snapshot-id": 31337, "type": "tag"}))
    text = error(tag="ghost")
    assert "ref 'ghost' points at snapshot 31337, which is not in the table" in text and "metadata.json" in text
    edit_metadata(path, lambda metadata: metadata["refs"].pop("ghost") and None)


def test_writes_to_a_branch_and_wap(ispark, tagged):
    """Option ``branch`` commits to that branch (main stays); ``wap-id`` stages the
    append (write.wap.enabled); a tag named as the branch is refused, nothing committed."""
    root, log, _ = tagged
    path = metadata_path(NAME, root)
    before = json.loads(path.read_text(encoding="utf-8"))
    frame = _read(ispark, root).limit(3)
    rows = frame.count()
    options = {**JAVA_KMS, "location-map": json.dumps(location_map(NAME, root))}

    def write(**extra: str) -> None:
        frame.write.format(FORMAT).options(**options, **extra).mode("append").save(str(path))

    def latest() -> str:
        import pyarrow.fs as pafs

        from icecrypt.table.commit.store import latest_metadata_location

        return latest_metadata_location(pafs.LocalFileSystem(), str(path))

    def current() -> dict:
        return json.loads(open(latest(), encoding="utf-8").read())

    write(branch="dev")
    after = current()
    assert after["current-snapshot-id"] == before["current-snapshot-id"]
    dev = after["refs"]["dev"]["snapshot-id"]
    assert dev != log[2][0] and next(s for s in after["snapshots"] if s["snapshot-id"] == dev)[
        "parent-snapshot-id"] == log[2][0]  # fmt: skip
    added = next(s for s in after["snapshots"] if s["snapshot-id"] == dev)["summary"]
    assert added["operation"] == "append" and added["added-records"] == str(rows)

    with pytest.raises(Exception, match="'audit' is a tag, not a branch"):
        write(branch="audit")
    with pytest.raises(Exception, match="write.wap.enabled=true"):
        write(**{"wap-id": "w1"})
    assert current()["metadata-log"] == after["metadata-log"]  # nothing committed
    edit_metadata(Path(latest()), lambda metadata: metadata["properties"].update({"write.wap.enabled": "true"}))
    write(**{"wap-id": "w1"})
    staged = current()
    assert staged["current-snapshot-id"] == before["current-snapshot-id"] and staged["refs"] == after["refs"]
    assert staged["snapshots"][-1]["summary"]["wap.id"] == "w1"
