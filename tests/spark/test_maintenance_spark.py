"""icecrypt.spark.rewrite_data_files: file groups rewritten in executors, one commit."""

from __future__ import annotations

import pyarrow as pa

import icecrypt.spark
from icecrypt.table import EncryptedTable


def _rows(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table({"id": pa.array(ids, pa.int64()), "category": [("a", "b")[i % 2] for i in ids],
                     "amount": [i * 0.5 for i in ids]})


def test_rewrite_data_files_in_executors(spark, kms, kms_options, tmp_path):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category"))
    table = EncryptedTable.create(str(tmp_path / "t"), _rows(0, 1).schema, kms=kms, table_key_id="master",
                                  partition_spec=spec)
    for i in range(5):
        table.append(_rows(i * 100, i * 100 + 100))
    table.delete("id in (1, 2, 3)")
    before = table.scan().to_arrow().sort_by("id")
    snapshots = len(table.snapshots())
    result = icecrypt.spark.rewrite_data_files(spark, str(tmp_path / "t"), kms_properties=kms_options,
                                               options={"rewrite-all": "true"})
    assert result.groups == 2 and result.added_data_files == 2 and result.removed_delete_files == 2  # one DV per data file hit
    table.refresh()
    assert len(table.snapshots()) == snapshots + 1  # one commit
    assert table.current_snapshot().summary["operation"] == "replace"
    assert table.scan().to_arrow().sort_by("id").equals(before)
    assert table.verify().ok


def test_zorder_rewrite_in_executors(spark, kms, kms_options, tmp_path):
    """The options strategy=sort and sort-order=zorder(...) reach the executors' writers:
    each new file holds its rows in Java's z-order (the z-values as the executors' module
    computes them, checked against Java's own in tests/table/test_zorder.py)."""
    from icecrypt.table import read_task
    from icecrypt.table.files.zorder import ZOrder

    table = EncryptedTable.create(str(tmp_path / "z"), _rows(0, 1).schema, kms=kms, table_key_id="master")
    for i in range(4):
        table.append(_rows(i * 50, i * 50 + 50))
    before = table.scan().to_arrow().sort_by("id")
    icecrypt.spark.rewrite_data_files(spark, str(tmp_path / "z"), kms_properties=kms_options,
                                      options={"rewrite-all": "true", "strategy": "sort",
                                               "sort-order": "zorder(amount, category)"})
    table.refresh()
    schema = table.schema
    order = ZOrder((schema.find_field("amount").field_id, schema.find_field("category").field_id))
    (task,) = table.scan().plan_files()
    stored = pa.Table.from_batches(list(read_task(task, table.filesystem)))
    z = order.values([(stored["amount"], schema.find_field("amount").field_type),
                      (stored["category"], schema.find_field("category").field_type)]).to_pylist()
    assert z == sorted(z) and stored["id"].to_pylist() != sorted(stored["id"].to_pylist())
    assert table.scan().to_arrow().sort_by("id").equals(before) and table.verify().ok
