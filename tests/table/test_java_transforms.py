"""Partition transforms as Iceberg Java computes them, at every boundary.

Known answers are what Iceberg Java (apache/iceberg @7f879b1 on Java 17) returned for the
same inputs; the property tests compare icecrypt's write path (vectorized) and its
pruning (the projections of row filters) with a reference written from Java's
definitions in fixed-width arithmetic (numpy's int32/int64 wrap as Java's int/long do):
``truncate[W](v) = v - (((v % W) + W) % W)``, ``bucket[N](v) = (murmur3_x86_32(v) &
Integer.MAX_VALUE) % N``."""

from __future__ import annotations

import os
import struct
import warnings
from decimal import Decimal

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.expressions import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, TruncateTransform
from pyiceberg.types import BinaryType, DecimalType, IntegerType, LongType, NestedField, StringType

from icecrypt.table import EncryptedTable
from icecrypt.table.files.write_data import _transform_array
from icecrypt.table.model.transforms import JavaTruncateTransform
from icecrypt.table.ops.write import append_files

INT_MIN, INT_MAX, LONG_MIN, LONG_MAX = -(2**31), 2**31 - 1, -(2**63), 2**63 - 1

#: (width, value, Java's truncate) for int and long
JAVA_TRUNCATE_INT = [
    (10, INT_MIN, 2147483646), (10, INT_MIN + 1, 2147483646), (10, INT_MIN + 7, 2147483646), (10, INT_MIN + 8, -2147483640),
    (10, INT_MAX, 2147483640), (10, -1, -10), (10, -11, -20), (3, INT_MIN, 2147483647), (1000, INT_MIN, 2147483296),
    (1000, INT_MIN + 8, 2147483296), (INT_MAX, INT_MIN, 2), (INT_MAX, 9, -2147483647), (2**30 + 1, INT_MIN, 2147483646),
    (1, INT_MIN, INT_MIN),
]  # fmt: skip
JAVA_TRUNCATE_LONG = [
    (10, LONG_MIN, 9223372036854775806), (10, LONG_MIN + 7, 9223372036854775806), (3, LONG_MIN, LONG_MAX),
    (1000, LONG_MIN + 8, 9223372036854775616), (INT_MAX, LONG_MIN, 9223372034707292163),
    (2**30 + 1, LONG_MIN, 9223372035781033991), (10, INT_MIN, -2147483650), (10, LONG_MAX, 9223372036854775800),
]  # fmt: skip


def java_truncate(value: int, width: int, bits: int) -> int:
    """The reference: Java's expression in numpy's wrapping fixed-width integers."""
    kind = np.int32 if bits == 32 else np.int64
    with warnings.catch_warnings(), np.errstate(over="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        v, w = np.array([value], kind), np.array([width], kind)
        return int((v - np.fmod(np.fmod(v, w) + w, w))[0])  # fmod: the sign of the dividend, as Java's %


def java_bucket(value: int, n: int) -> int:
    return (mmh3.hash(struct.pack("<q", value), 0) & INT_MAX) % n


def test_reference_agrees_with_java():
    for width, value, java in JAVA_TRUNCATE_INT:
        assert java_truncate(value, width, 32) == java, (width, value)
    for width, value, java in JAVA_TRUNCATE_LONG:
        assert java_truncate(value, width, 64) == java, (width, value)


@pytest.mark.parametrize(("source", "arrow", "cases"), [(IntegerType(), pa.int32(), JAVA_TRUNCATE_INT),
                                                         (LongType(), pa.int64(), JAVA_TRUNCATE_LONG)])
def test_truncate_of_integers_is_javas(source, arrow, cases):
    for width, value, java in cases:
        written = _transform_array(TruncateTransform(width), source, pa.array([value], arrow))
        assert written.type == arrow and written[0].as_py() == java, (width, value)
        assert JavaTruncateTransform(width).transform(source)(value) == java, (width, value)


@pytest.mark.parametrize(
    ("source", "arrow", "width", "value", "java"),
    [
        (DecimalType(10, 2), pa.decimal128(10, 2), 10, Decimal("-1.50"), Decimal("-1.50")),
        (DecimalType(10, 2), pa.decimal128(10, 2), 10, Decimal("-0.01"), Decimal("-0.10")),
        (DecimalType(10, 2), pa.decimal128(10, 2), 3, Decimal("-128.00"), Decimal("-128.01")),
        (DecimalType(10, 2), pa.decimal128(10, 2), 100, Decimal("-99999999.99"), Decimal("-100000000.00")),
        (StringType(), pa.string(), 2, "", ""),
        (StringType(), pa.string(), 1, "\U0001f600x", "\U0001f600"),
        (StringType(), pa.string(), 2, "x\U0001f600y", "x\U0001f600"),
        (StringType(), pa.string(), 3, "abc\u0301d", "abc"),
        (StringType(), pa.string(), 2, "\u00e9t\u00e9", "\u00e9t"),
        (BinaryType(), pa.binary(), 2, b"\xff\x01\x02", b"\xff\x01"),
        (BinaryType(), pa.binary(), 2, b"", b""),
    ],
)
def test_truncate_of_decimals_strings_and_binary_is_javas(source, arrow, width, value, java):
    assert _transform_array(TruncateTransform(width), source, pa.array([value], arrow))[0].as_py() == java
    assert JavaTruncateTransform(width).transform(source)(value) == java


@pytest.mark.parametrize(
    ("source", "arrow", "value", "java16", "java_max"),
    [
        (IntegerType(), pa.int32(), INT_MIN, None, None), (IntegerType(), pa.int32(), INT_MAX, None, None),
        (LongType(), pa.int64(), LONG_MIN, None, None), (LongType(), pa.int64(), LONG_MAX, None, None),
        (DecimalType(10, 2), pa.decimal128(10, 2), Decimal("-1.50"), 4, 102099332),
        (DecimalType(10, 2), pa.decimal128(10, 2), Decimal("-128.00"), 6, 1766290598),
        (DecimalType(10, 2), pa.decimal128(10, 2), Decimal("-129.00"), 11, 2011501579),
        (StringType(), pa.string(), "", 0, 0),
        (StringType(), pa.string(), "\u00e9t\u00e9", 15, 865297935),
        (StringType(), pa.string(), "\U0001f600\U0001f600\U0001f600", 1, 623130097),
        (BinaryType(), pa.binary(), b"", 0, 0),
        (BinaryType(), pa.binary(), b"\xff\x01", 10, 594344554),
    ],
)
def test_bucket_is_javas(source, arrow, value, java16, java_max):
    if java16 is None:  # integers: the reference of Java's definition
        java16, java_max = java_bucket(value, 16), java_bucket(value, INT_MAX)
    for n, java in ((16, java16), (INT_MAX, java_max)):
        assert _transform_array(BucketTransform(n), source, pa.array([value], arrow))[0].as_py() == java, n
        assert BucketTransform(n).transform(source)(value) == java, n


WIDTHS = st.one_of(st.integers(1, 100), st.sampled_from([1000, 2**30, 2**30 + 1, INT_MAX]), st.integers(1, INT_MAX))


@settings(max_examples=400)
@given(width=WIDTHS, values=st.lists(st.integers(INT_MIN, INT_MAX) | st.sampled_from([INT_MIN, INT_MIN + 1, INT_MAX]),
                                     min_size=1, max_size=20))
def test_truncate_int_against_the_reference(width, values):
    want = [java_truncate(v, width, 32) for v in values]
    assert _transform_array(TruncateTransform(width), IntegerType(), pa.array(values, pa.int32())).to_pylist() == want
    assert [JavaTruncateTransform(width).transform(IntegerType())(v) for v in values] == want


@settings(max_examples=400)
@given(width=WIDTHS, values=st.lists(st.integers(LONG_MIN, LONG_MAX) | st.sampled_from([LONG_MIN, LONG_MIN + 1, LONG_MAX]),
                                     min_size=1, max_size=20))
def test_truncate_long_against_the_reference(width, values):
    want = [java_truncate(v, width, 64) for v in values]
    assert _transform_array(TruncateTransform(width), LongType(), pa.array(values, pa.int64())).to_pylist() == want
    assert [JavaTruncateTransform(width).transform(LongType())(v) for v in values] == want


@settings(max_examples=200)
@given(n=st.integers(1, INT_MAX), values=st.lists(st.integers(LONG_MIN, LONG_MAX), min_size=1, max_size=10))
def test_bucket_long_against_the_reference(n, values):
    want = [java_bucket(v, n) for v in values]
    assert _transform_array(BucketTransform(n), LongType(), pa.array(values, pa.int64())).to_pylist() == want


# --- pruning: the partition values Java wrote ----------------------------------------------------------------


def _table(tmp_path, kms, source, width: int = 10) -> EncryptedTable:
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "i", source, required=False))
    spec = PartitionSpec(PartitionField(2, 1000, TruncateTransform(width), "i_trunc"))
    return EncryptedTable.create(str(tmp_path / f"t{os.urandom(4).hex()}"), schema, kms=kms, table_key_id="keyA",
                                 partition_spec=spec)  # fmt: skip


@pytest.mark.parametrize(("source", "arrow", "low", "high"), [(IntegerType(), pa.int32(), INT_MIN, INT_MAX),
                                                               (LongType(), pa.int64(), LONG_MIN, LONG_MAX)])
def test_a_java_table_truncated_at_the_minimum_reads_and_prunes(tmp_path, kms, source, arrow, low, high):
    """Data files where Java put them (``i_trunc=<Java's value>``); every filter returns
    exactly the matching rows, and an equality plans the one file that holds the value."""
    from test_partition_paths import java_file

    table = _table(tmp_path, kms, source)
    bits = 32 if arrow == pa.int32() else 64
    values = [low, low + 1, low + 8, -11, -1, 0, 9, high - 1, high]
    records = []
    for n, value in enumerate(values):
        part = java_truncate(value, 10, bits)
        rows = pa.table({"id": pa.array([n], pa.int64()), "i": pa.array([value], arrow)})
        records.append(java_file(table, f"i_trunc={part}", rows, {"i_trunc": part}))
    append_files(table, records)
    table = table.refresh()
    assert sorted(p.rsplit("=", 1)[1] for p in os.listdir(table.fs_path(f"{table.location}/data"))) == sorted(
        {str(java_truncate(v, 10, bits)) for v in values})
    for value in values:
        scan = table.scan(row_filter=EqualTo("i", value))
        assert scan.to_arrow().column("i").to_pylist() == [value], value
        assert len(scan.plan_files()) == 1, value  # its file: partition values and column bounds agree
    for make, test in ((LessThan, lambda v, b: v < b), (LessThanOrEqual, lambda v, b: v <= b),
                       (GreaterThan, lambda v, b: v > b), (GreaterThanOrEqual, lambda v, b: v >= b)):
        for boundary in (low, low + 1, low + 7, low + 8, low + 9, -11, 0, high - 1, high):
            got = sorted(table.scan(row_filter=make("i", boundary)).to_arrow().column("i").to_pylist())
            assert got == sorted(v for v in values if test(v, boundary)), (make.__name__, boundary)
    got = table.scan(row_filter=In("i", {low, high})).to_arrow().column("i").to_pylist()
    assert sorted(got) == [low, high]


@pytest.mark.parametrize(("source", "arrow", "low", "java_dir"), [(IntegerType(), pa.int32(), INT_MIN, "i_trunc=2147483646"),
                                                                  (LongType(), pa.int64(), LONG_MIN,
                                                                   "i_trunc=9223372036854775806")])
def test_appending_the_minimum_writes_javas_partition(tmp_path, kms, source, arrow, low, java_dir):
    table = _table(tmp_path, kms, source)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "i": pa.array([low, low + 8], arrow)}))
    directory = table.fs_path(f"{table.location}/data")
    assert java_dir in os.listdir(directory)
    assert table.scan(row_filter=EqualTo("i", low)).to_arrow().column("id").to_pylist() == [1]
    assert table.verify().ok
