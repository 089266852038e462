"""Column metrics of fields inside structs, lists and maps, as Iceberg Java's writer
records them (``ParquetMetrics``): every primitive reachable through structs gets counts
and bounds under the table's metrics mode, fields inside lists and maps get none; and
scans prune on the struct children's bounds (``addr.zip = 30`` plans one file of two).

The expected metrics are what Iceberg Java (apache/iceberg @7f879b1,
``ParquetUtil.fileMetrics`` with the default ``MetricsConfig``) computed from the very
file icecrypt writes for ``ROWS``."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from icecrypt.table import EncryptedTable

SCHEMA = Schema(
    NestedField(1, "id", IntegerType(), required=True),
    NestedField(2, "addr", StructType(
        NestedField(3, "zip", IntegerType()), NestedField(4, "city", StringType()),
        NestedField(5, "geo", StructType(NestedField(6, "lat", DoubleType()), NestedField(7, "lon", FloatType()))))),
    NestedField(8, "tags", ListType(9, StringType())),
    NestedField(10, "attrs", MapType(11, StringType(), 12, IntegerType())),
    NestedField(13, "pts", ListType(14, StructType(NestedField(15, "x", IntegerType())))),
    NestedField(16, "d", DecimalType(9, 2)),
)  # fmt: skip


def rows(zip_base: int = 10) -> list[dict]:
    return [
        {"id": i, "addr": {"zip": zip_base + i, "city": f"Zurich-verylongname-over-16{i}",
                           "geo": None if i == 1 else {"lat": 1.5 * i, "lon": float("nan") if i == 2 else float(i)}},
         "tags": [f"t{i}"], "attrs": [("k", i)], "pts": [{"x": i}], "d": decimal.Decimal("-1.25") + i}
        for i in range(3)
    ]  # fmt: skip


#: field id -> (value count, null count, lower bound, upper bound) Java computed for rows()
JAVA_METRICS = {
    1: (3, 0, "00000000", "02000000"),
    3: (3, 0, "0a000000", "0c000000"),
    4: (3, 0, "5a75726963682d766572796c6f6e676e", "5a75726963682d766572796c6f6e676f"),
    6: (3, 1, "0000000000000080", "0000000000000840"),
    7: (3, 1, "00000080", "00000000"),
    16: (3, 0, "83", "4b"),
}


def _metrics(table: EncryptedTable) -> list[dict]:
    files = table.inspect.files().to_pylist()
    return [{name: dict(f[name] or []) for name in ("value_counts", "null_value_counts", "nan_value_counts",
                                                    "lower_bounds", "upper_bounds")} for f in files]  # fmt: skip


@pytest.fixture(params=["encrypted", "plaintext"])
def table(request, tmp_path, kms):
    key = "keyA" if request.param == "encrypted" else None
    return EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id=key)


def test_struct_children_get_javas_metrics_and_lists_and_maps_none(table):
    table.append(pa.Table.from_pylist(rows(), schema=table.scan().arrow_schema))
    (metrics,) = _metrics(table.refresh())
    got = {field_id: (metrics["value_counts"].get(field_id), metrics["null_value_counts"].get(field_id),
                      metrics["lower_bounds"].get(field_id, b"").hex(), metrics["upper_bounds"].get(field_id, b"").hex())
           for field_id in set(metrics["value_counts"]) | set(metrics["lower_bounds"])}  # fmt: skip
    assert got == JAVA_METRICS  # nothing for 9, 11, 12, 15 (inside lists and maps), as Java
    assert metrics["nan_value_counts"] == {6: 0, 7: 1}  # counted by the writer, as Java's value writers do


def test_scans_prune_on_struct_children(table):
    schema = table.scan().arrow_schema
    table.append(pa.Table.from_pylist(rows(10), schema=schema))
    table.append(pa.Table.from_pylist(rows(30), schema=schema))
    table = table.refresh()
    for row_filter, files, ids in (("addr.zip = 30", 1, [0]), ("addr.zip < 12", 1, [0, 1]), ("addr.zip > 0", 2, None),
                                   ("addr.city = 'Aachen'", 0, []), ("addr.geo.lat >= 3.0", 2, [2, 2])):
        scan = table.scan(row_filter=row_filter)
        assert len(scan.plan_files()) == files, row_filter
        if ids is not None:
            assert sorted(scan.to_arrow().column("id").to_pylist()) == ids, row_filter


def test_metrics_modes_apply_to_struct_children(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", properties={
        "write.metadata.metrics.default": "counts", "write.metadata.metrics.column.addr.city": "truncate(4)",
        "write.metadata.metrics.column.addr.zip": "none"})  # fmt: skip
    table.append(pa.Table.from_pylist(rows(), schema=table.scan().arrow_schema))
    (metrics,) = _metrics(table.refresh())
    assert metrics["lower_bounds"] == {4: b"Zuri"} and metrics["upper_bounds"] == {4: b"Zurj"}
    assert 3 not in metrics["value_counts"] and metrics["value_counts"][6] == 3
