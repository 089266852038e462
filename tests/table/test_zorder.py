"""Z-order rewrites (``rewrite_data_files(sort_order="zorder(a, b)")``): the z-values are
Iceberg Java's (``ZOrderByteUtils`` / ``SparkZOrderUDF``: its own interleaving examples,
and a row-at-a-time port of its code against the vectorized one), the rewritten files hold
their rows in that order, and what Java refuses is refused with the table unchanged."""

from __future__ import annotations

import datetime
import decimal
import math
import random
import struct

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable, read_task
from icecrypt.table.files import zorder
from icecrypt.table.files.zorder import ZOrder

UTC = datetime.timezone.utc


# --- a row-at-a-time port of Java's code, the reference --------------------------------------


def java_interleave(columns: list[bytes], size: int) -> bytes:
    """ZOrderByteUtils.interleaveBits, as Java writes it."""
    out = bytearray(size)
    column, byte, source_bit, out_byte, out_bit = 0, 0, 7, 0, 7
    while out_byte < size:
        out[out_byte] |= ((columns[column][byte] >> source_bit) & 1) << out_bit
        out_bit -= 1
        if out_bit == -1:
            out_byte, out_bit = out_byte + 1, 7
        if out_byte == size:
            break
        while True:
            column += 1
            if column == len(columns):
                column, source_bit = 0, source_bit - 1
                if source_bit == -1:
                    byte, source_bit = byte + 1, 7
            if len(columns[column]) > byte:
                break
    return bytes(out)


def java_ordered(value, field_type, var_length: int) -> bytes:
    """SparkZOrderUDF's bytes of one value (None: Java's empty primitive buffer or zeros)."""
    if isinstance(field_type, (StringType, BinaryType)):
        data = b"" if value is None else value.encode() if isinstance(value, str) else value
        if isinstance(value, str) and len(data) > var_length:  # the encoder stops before a split character
            out = b""
            for char in value:
                if len(out) + len(char.encode()) > var_length:
                    break
                out += char.encode()
            data = out
        return data[:var_length].ljust(var_length, b"\0")
    if value is None:
        return bytes(8)
    if isinstance(field_type, BooleanType):
        return (b"\x81" if value else b"\0") + bytes(7)
    if isinstance(field_type, (FloatType, DoubleType)):
        bits = struct.unpack(">q", struct.pack(">d", value))[0] if not math.isnan(value) else 0x7FF8000000000000
        bits ^= (bits >> 63) | -(1 << 63)
        return struct.pack(">q", bits)
    if isinstance(field_type, DateType):
        value = (value - datetime.date(1970, 1, 1)).days
    elif isinstance(field_type, TimestamptzType):  # Spark's cast to long: whole seconds, floored
        micros = (value - datetime.datetime(1970, 1, 1, tzinfo=UTC)) // datetime.timedelta(microseconds=1)
        value = micros // 1_000_000
    elif isinstance(field_type, TimestampType):
        value = (value - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1)
    return struct.pack(">q", value ^ -(1 << 63))


def java_zvalue(row: tuple, types: list, var_length: int = 8, max_output: int = 2**31 - 1) -> bytes:
    columns = [java_ordered(v, t, var_length) for v, t in zip(row, types, strict=True)]
    return java_interleave(columns, min(sum(map(len, columns)), max_output))


# --- Java's own examples ------------------------------------------------------------------------


def _interleave(columns: list[bytes], size: int) -> bytes:
    bits = np.concatenate([np.unpackbits(np.frombuffer(c, dtype=np.uint8)) for c in columns])
    return np.packbits(bits[zorder._interleaving(tuple(map(len, columns)), size)]).tobytes()


def test_interleaving_matches_javas_examples():
    full, o, i = 0xFF, 0x00, 0x01
    assert _interleave([bytes([full, full]), bytes([full]), bytes([full] * 3)], 6) == bytes([full] * 6)
    mixed = [bytes([i, full, o, 0x0F]), bytes([i, o, full]), bytes([i]), bytes([i])]
    assert _interleave(mixed, 9) == bytes([o, o, o, 0x0F, 0xAA, 0xAA, 0x55, 0x55, 0x0F])
    assert java_interleave(mixed, 9) == _interleave(mixed, 9)  # the reference agrees with Java's test
    assert _interleave([bytes(10)] * 4, 40) == bytes(40)
    rng = random.Random(3)
    for _ in range(200):
        columns = [rng.randbytes(rng.randint(1, 12)) for _ in range(rng.randint(1, 5))]
        size = rng.randint(1, sum(map(len, columns)))
        assert _interleave(columns, size) == java_interleave(columns, size)


@pytest.mark.parametrize("field_type, values", [
    (LongType(), [-2**63, -2**40, -1, 0, 1, 7, 2**40, 2**63 - 1]),
    (IntegerType(), [-2**31, -5, 0, 5, 2**31 - 1]),
    (DoubleType(), [-math.inf, -1e300, -2.5, -0.0, 0.0, 1e-300, 3.5, math.inf, math.nan]),
    (FloatType(), [-math.inf, -2.5, 0.0, 0.5, 3.5, math.inf]),
    (StringType(), ["", "a", "ab", "abcdefgh", "abcdefgz", "b", "z", "é", "€"]),
], ids=["long", "int", "double", "float", "string"])
def test_ordered_bytes_sort_as_the_values(field_type, values):
    arrow_type = {LongType: pa.int64(), IntegerType: pa.int32(), DoubleType: pa.float64(), FloatType: pa.float32(),
                  StringType: pa.string()}[type(field_type)]
    got = zorder._ordered_bytes(pa.array(values, arrow_type), field_type, 8)
    keys = [bytes(row) for row in got]
    assert keys == sorted(keys)
    assert keys == [java_ordered(v, field_type, 8) for v in values]


def test_vectorized_zvalues_equal_javas_row_by_row():
    rng = random.Random(11)
    types = [LongType(), DoubleType(), StringType(), DateType(), TimestamptzType(), TimestampType(), BooleanType(),
             BinaryType(), IntegerType(), FloatType()]
    arrow = [pa.int64(), pa.float64(), pa.string(), pa.date32(), pa.timestamp("us", tz="UTC"), pa.timestamp("us"),
             pa.bool_(), pa.binary(), pa.int32(), pa.float32()]

    def value(kind):
        if rng.random() < 0.1:
            return None
        return {
            0: lambda: rng.randint(-2**63, 2**63 - 1),
            1: lambda: rng.choice([rng.uniform(-1e6, 1e6), -0.0, math.inf, -math.inf, math.nan]),
            2: lambda: "".join(rng.choice("aé€😀z") for _ in range(rng.randint(0, 6))),
            3: lambda: datetime.date(1970, 1, 1) + datetime.timedelta(days=rng.randint(-40000, 40000)),
            4: lambda: datetime.datetime(1970, 1, 1, tzinfo=UTC) + datetime.timedelta(microseconds=rng.randint(-2**50, 2**50)),
            5: lambda: datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=rng.randint(-2**50, 2**50)),
            6: lambda: rng.random() < 0.5,
            7: lambda: rng.randbytes(rng.randint(0, 12)),
            8: lambda: rng.randint(-2**31, 2**31 - 1),
            9: lambda: float(np.float32(rng.uniform(-100, 100))),
        }[kind]()

    rows = [tuple(value(k) for k in range(len(types))) for _ in range(300)]
    columns = [(pa.array([r[k] for r in rows], arrow[k]), types[k]) for k in range(len(types))]
    for var_length, max_output in [(8, 2**31 - 1), (3, 2**31 - 1), (12, 20), (8, 1)]:
        got = ZOrder(tuple(range(len(types))), var_length, max_output).values(columns).to_pylist()
        assert got == [java_zvalue(r, types, var_length, max_output) for r in rows], (var_length, max_output)


# --- the rewrite ------------------------------------------------------------------------------------

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("x", pa.int32()),
    pa.field("y", pa.float64()),
    pa.field("name", pa.string()),
    pa.field("region", pa.string()),
    pa.field("amount", pa.decimal128(10, 2)),
])  # fmt: skip


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({
        "id": ids,
        "x": [None if i % 11 == 0 else (i * 37) % 101 - 50 for i in ids],
        "y": [(i * 13) % 17 / 3.0 for i in ids],
        "name": [f"n{(i * 7) % 23}" for i in ids],
        "region": [f"r{i % 2}" for i in ids],
        "amount": [decimal.Decimal(i).scaleb(-2) for i in ids],
    }, schema=SCHEMA)  # fmt: skip


@pytest.fixture(params=["encrypted", "plaintext"])
def table(request, tmp_path):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    kms = MemoryKms.with_iceberg_test_keys() if request.param == "encrypted" else None
    spec = PartitionSpec(PartitionField(source_id=5, field_id=1000, transform=IdentityTransform(), name="region"))
    t = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA" if kms else None,
                              partition_spec=spec)
    for start in range(0, 120, 20):  # unsorted files
        t.append(rows(range(start, start + 20)))
    return t


def _files(table):
    return [(task.file, pa.Table.from_batches(list(read_task(task, table.filesystem))))
            for task in table.scan().plan_files()]


def test_rewrite_writes_each_file_in_javas_zorder(table):
    before = table.scan().to_arrow().sort_by("id")
    with pytest.warns(UserWarning, match="'region' left out: an identity partition column"):
        result = table.rewrite_data_files(strategy="sort", sort_order="zorder(x, y, name, region)",
                                          options={"rewrite-all": "true", "var-length-contribution": "4"})
    assert result.rewritten_data_files == 12 and result.added_data_files == 2  # one per region
    types = [IntegerType(), DoubleType(), StringType()]  # region: an identity partition column, left out
    for _, stored in _files(table):
        z = [java_zvalue((r["x"], r["y"], r["name"]), types, var_length=4) for r in stored.to_pylist()]
        assert z == sorted(z) and len(set(z)) > 1
    assert {r["sort_order_id"] for r in table.inspect.files().to_pylist()} == {0}  # none of the table's orders
    assert table.scan().to_arrow().sort_by("id").equals(before)
    assert table.verify().ok and table.snapshots()[-1].summary["operation"] == "replace"
    # the option sort-order; names and the keyword in any case (Spark's default resolution)
    table.rewrite_data_files(options={"rewrite-all": "true", "strategy": "sort", "sort-order": "ZORDER(Y), zorder(id)",
                                      "max-output-size": "3"})
    for _, stored in _files(table):
        z = [java_zvalue((r["y"], r["id"]), [DoubleType(), LongType()], max_output=3) for r in stored.to_pylist()]
        assert z == sorted(z)
    assert table.scan().to_arrow().sort_by("id").equals(before)


@pytest.mark.parametrize("order, options, reason", [
    ("zorder(x), name", {}, "cannot mix plain sort columns and a zorder"),
    ("zorder(x, nope)", {}, "no such column"),
    ("zorder(amount)", {}, r"type decimal\(10, 2\): the type is unsupported"),
    ("zorder(region)", {}, "every column given is an identity partition column"),
    ("zorder()", {}, "names an empty column"),
    ("zorder(x)", {"var-length-contribution": "0"}, "must be at least 1 byte"),
    ("zorder(x)", {"max-output-size": "many"}, "is not a whole number"),
])
def test_what_java_refuses_is_refused_with_the_table_unchanged(table, order, options, reason):
    before = table.metadata_location
    with pytest.raises(ValueError, match=reason):
        table.rewrite_data_files(strategy="sort", sort_order=order, options={"rewrite-all": "true", **options})
    assert table.metadata_location == before


def test_a_column_named_like_javas_zvalue_is_refused(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("icezvalue", pa.binary())])
    t = EncryptedTable.create(str(tmp_path / "z"), schema, kms=None, table_key_id=None)
    t.append(pa.table({"id": [2, 1], "icezvalue": [b"a", b"b"]}, schema=schema))
    with pytest.raises(ValueError, match="ICEZVALUE"):
        t.rewrite_data_files(sort_order="zorder(id)", strategy="sort", options={"rewrite-all": "true"})


def test_a_zorder_whose_column_is_gone_writes_unsorted_files():
    """A z-order planned before a column was dropped (a rewrite's executors load the table
    again): the files are written unsorted, as for a sort order the schema cannot serve."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    from icecrypt.table.files.write_data import sortable

    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "x", IntegerType()))
    assert sortable(ZOrder((1, 2)), schema) and not sortable(ZOrder((1, 3)), schema)


def test_a_column_named_like_the_keyword_is_a_plain_sort_column(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("zorder_rank", pa.int32())])
    t = EncryptedTable.create(str(tmp_path / "p"), schema, kms=None, table_key_id=None)
    t.append(pa.table({"id": [1, 2, 3], "zorder_rank": [2, 3, 1]}, schema=schema))
    t.rewrite_data_files(strategy="sort", sort_order="zorder_rank DESC", options={"rewrite-all": "true"})
    ((_, stored),) = _files(t)
    assert stored["id"].to_pylist() == [2, 1, 3]
