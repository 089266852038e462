"""Arrow <-> Avro: schema mapping with Iceberg's logical types and field ids, lossless
round trips of every Iceberg type, files decoded independently (fastavro, Java)."""

from __future__ import annotations

import datetime
import decimal
import gzip
import hashlib
import io
import json
import struct
import uuid

import fastavro
import pyarrow as pa
import pytest
from avrohelpers import avro_files, expected_json, local_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vectorlib import TABLES_DIR

import icecrypt
from icecrypt import ags1, avro
from icecrypt.keys import StandardKeyMetadata

FID = b"PARQUET:field_id"
_WIDE = decimal.Context(prec=100)


def fid(i: int) -> dict:
    return {FID: str(i).encode()}


def F(name, type_, nullable, field_id):
    return pa.field(name, type_, nullable, fid(field_id))


ALL_TYPES = pa.schema([
    F("b", pa.bool_(), True, 1),
    F("i", pa.int32(), False, 2),
    F("l", pa.int64(), True, 3),
    F("f", pa.float32(), True, 4),
    F("d", pa.float64(), True, 5),
    F("s", pa.string(), True, 6),
    F("bin", pa.binary(), True, 7),
    F("fx", pa.binary(7), True, 8),
    F("u", pa.uuid(), True, 9),
    F("dec9", pa.decimal128(9, 2), True, 10),
    F("dec38", pa.decimal128(38, 10), True, 11),
    F("date", pa.date32(), True, 12),
    F("time", pa.time64("us"), True, 13),
    F("ts", pa.timestamp("us"), True, 14),
    F("tstz", pa.timestamp("us", "UTC"), True, 15),
    F("tsns", pa.timestamp("ns"), True, 16),
    F("tstzns", pa.timestamp("ns", "UTC"), True, 17),
    F("lst", pa.list_(F("element", pa.int64(), True, 19)), True, 18),
    F("smap", pa.map_(F("key", pa.string(), False, 21), F("value", pa.decimal128(5, 1), True, 22)), True, 20),
    F("imap", pa.map_(F("key", pa.int32(), False, 24), F("value", pa.timestamp("us", "UTC"), True, 25)), True, 23),
    F("st", pa.struct([F("x", pa.date32(), True, 27), F("y", pa.list_(F("element", pa.uuid(), False, 29)), False, 28),
                       F("z", pa.struct([F("deep", pa.decimal128(20, 0), False, 31)]), True, 30)]), True, 26),
    F("dec9b", pa.decimal128(9, 2), False, 32),  # the same named Avro fixed as dec9
    F("bytes-name", pa.string(), True, 33),  # not a valid Avro name
])


def _storage(t: pa.DataType) -> pa.DataType:
    """``t`` with arrow.uuid replaced by its storage (pa.array cannot nest extensions)."""
    if isinstance(t, pa.BaseExtensionType):
        return t.storage_type
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_storage(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_storage(t.key_type)), t.item_field.with_type(_storage(t.item_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_storage(t.value_type)))
    return t


def _strategy(t: pa.DataType, nullable: bool):
    s = _value_strategy(t)
    return st.one_of(st.none(), s) if nullable else s


def _value_strategy(t: pa.DataType):
    types = pa.types
    if isinstance(t, pa.BaseExtensionType):
        return st.binary(min_size=16, max_size=16)
    if types.is_boolean(t):
        return st.booleans()
    if types.is_integer(t):
        bits = t.bit_width
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if types.is_floating(t):
        return st.floats(width=t.bit_width, allow_nan=False)
    if types.is_string(t):
        return st.text(max_size=20)
    if types.is_fixed_size_binary(t) and not types.is_decimal(t):
        return st.binary(min_size=t.byte_width, max_size=t.byte_width)
    if types.is_binary(t):
        return st.binary(max_size=20)
    if types.is_decimal(t):
        bound = 10**t.precision - 1
        return st.integers(-bound, bound).map(lambda u, s=t.scale: decimal.Decimal(u).scaleb(-s, _WIDE))
    if types.is_date(t):
        return st.integers(-(10**6), 10**6)
    if types.is_time(t):
        return st.integers(0, 86_400 * 10**6 - 1)
    if types.is_timestamp(t):
        return st.integers(-(2**62), 2**62)
    if types.is_list(t):
        return st.lists(_strategy(t.value_type, t.value_field.nullable), max_size=4)
    if types.is_map(t):
        return st.dictionaries(_value_strategy(t.key_type), _strategy(t.item_type, t.item_field.nullable),
                               max_size=3).map(lambda d: list(d.items()))
    if types.is_struct(t):
        return st.fixed_dictionaries({f.name: _strategy(f.type, f.nullable) for f in t})
    raise NotImplementedError(t)


def _table(schema: pa.Schema, rows: list[dict]) -> pa.Table:
    columns = []
    for field in schema:
        values = [row[field.name] for row in rows]
        columns.append(pa.array(values, _storage(field.type)).cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


rows_strategy = st.lists(st.fixed_dictionaries({f.name: _strategy(f.type, f.nullable) for f in ALL_TYPES}),
                         max_size=30)


def test_schema_round_trip():
    avro_schema = avro.arrow_to_avro_schema(ALL_TYPES, "table")
    assert avro.avro_to_arrow_schema(avro_schema).equals(ALL_TYPES, check_metadata=True)
    assert avro.avro_to_arrow_schema(json.dumps(avro_schema)).equals(ALL_TYPES, check_metadata=True)
    fields = {f["name"]: f for f in avro_schema["fields"]}
    assert avro_schema["name"] == "table"
    assert fields["i"] == {"name": "i", "type": "int", "field-id": 2}
    assert fields["l"] == {"name": "l", "type": ["null", "long"], "default": None, "field-id": 3}
    assert fields["dec9"]["type"][1] == {"type": "fixed", "name": "decimal_9_2", "size": 4,
                                         "logicalType": "decimal", "precision": 9, "scale": 2}
    assert fields["dec9b"]["type"] == "decimal_9_2"  # a reference to the definition above
    assert fields["dec38"]["type"][1]["size"] == 16
    assert fields["u"]["type"][1] == {"type": "fixed", "name": "uuid_fixed", "size": 16, "logicalType": "uuid"}
    assert fields["ts"]["type"][1] == {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": False}
    assert fields["tstz"]["type"][1]["adjust-to-utc"] is True
    assert fields["tsns"]["type"][1]["logicalType"] == "timestamp-nanos"
    assert fields["lst"]["type"][1] == {"type": "array", "items": ["null", "long"], "element-id": 19}
    assert fields["smap"]["type"][1]["type"] == "map"
    assert (fields["smap"]["type"][1]["key-id"], fields["smap"]["type"][1]["value-id"]) == (21, 22)
    imap = fields["imap"]["type"][1]
    assert imap["type"] == "array" and imap["logicalType"] == "map"
    assert imap["items"]["name"] == "k24_v25"
    assert [(f["name"], f["field-id"]) for f in imap["items"]["fields"]] == [("key", 24), ("value", 25)]
    assert fields["st"]["type"][1]["name"] == "r26"
    assert fields["bytes_x2Dname"]["iceberg-field-name"] == "bytes-name"


def test_avro_schema_mapping_java_conventions():
    """Avro schemas as Java and other writers spell them."""
    schema = {
        "type": "record", "name": "t", "namespace": "org.example",
        "fields": [
            {"name": "d", "type": {"type": "int", "logicalType": "date"}, "field-id": 1},
            {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
            {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {"name": "utc_absent", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "bdec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 50, "scale": 3}},
            {"name": "suuid", "type": ["null", {"type": "string", "logicalType": "uuid"}]},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
            {"name": "sub", "type": {"type": "record", "name": "Sub", "fields": [{"name": "a", "type": "E"}]}},
            {"name": "sub2", "type": ["Sub", "null"]},
            {"name": "m", "type": {"type": "map", "values": "long", "key-id": 7, "value-id": 8}},
            {"name": "odd", "type": {"type": "long", "logicalType": "no-such-type"}},
        ],
    }
    got = avro.avro_to_arrow_schema(schema)
    assert got.field("d").type == pa.date32() and got.field("d").metadata == fid(1)
    assert got.field("tm").type == pa.time32("ms")
    assert got.field("ts_ms").type == pa.timestamp("ms", "UTC")
    assert got.field("local").type == pa.timestamp("us")
    assert got.field("utc_absent").type == pa.timestamp("us", "UTC")
    assert got.field("bdec").type == pa.decimal256(50, 3)
    assert got.field("suuid").type == pa.uuid() and got.field("suuid").nullable
    assert got.field("e").type == pa.string()
    assert got.field("sub").type == pa.struct([pa.field("a", pa.string(), False)])
    assert got.field("sub2").type == got.field("sub").type and got.field("sub2").nullable
    assert got.field("m").type == pa.map_(F("key", pa.string(), False, 7), F("value", pa.int64(), False, 8))
    assert got.field("odd").type == pa.int64()  # unknown logical types read as their base type


@pytest.mark.parametrize("schema", [
    {"type": "record", "name": "r", "fields": [{"name": "u", "type": ["int", "string"]}]},
    {"type": "record", "name": "r", "fields": [{"name": "self", "type": ["null", "r"]}]},
    {"type": "record", "name": "r", "fields": [{"name": "x", "type": "nope"}]},
    "long",
])
def test_unmappable_avro_schemas(schema):
    with pytest.raises(ValueError):
        avro.avro_to_arrow_schema(schema)


@pytest.mark.parametrize("dtype", [pa.uint64(), pa.time64("ns"), pa.duration("us"), pa.month_day_nano_interval()])
def test_unmappable_arrow_types(dtype):
    with pytest.raises(ValueError):
        avro.arrow_to_avro_schema(pa.schema([pa.field("x", dtype)]))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], deadline=None,
          max_examples=25)
@given(rows=rows_strategy)
def test_round_trip_every_iceberg_type(tmp_path_factory, rows):
    table = _table(ALL_TYPES, rows)
    path = tmp_path_factory.mktemp("rt") / "all.avro"
    km = avro.write(table, path, codec="deflate", sync_interval=500)
    back = avro.read(path, km)
    assert back.schema.equals(ALL_TYPES, check_metadata=True)
    assert back.equals(table)
    assert avro.read_schema(path, km).equals(ALL_TYPES, check_metadata=True)


def test_round_trip_batches_and_projection(tmp_path):
    rows = [
        {f.name: None if f.nullable else v for f, v in zip(ALL_TYPES, [True, 7, 8, 1.5, 2.5, "s", b"b", b"1234567",
                                                                        b"u" * 16, decimal.Decimal("1.23"),
                                                                        decimal.Decimal(1), 1, 2, 3, 4, 5, 6, [1],
                                                                        [], [], {"x": 1, "y": [], "z": None},
                                                                        decimal.Decimal("-9.99"), "n"])}
        for _ in range(3)
    ]
    rows[1] = dict(rows[0], st={"x": 5, "y": [b"a" * 16, b"b" * 16], "z": {"deep": decimal.Decimal(-1)}}, imap=[(1, 10), (2, None)], smap=[("k", decimal.Decimal("0.5"))], dec9=decimal.Decimal("-1234567.89"), u=b"\xff" * 16)
    table = _table(ALL_TYPES, rows * 1000)
    km = avro.write(table.to_batches(max_chunksize=700), tmp_path / "b.avro", codec="null")
    assert avro.read(tmp_path / "b.avro", km).equals(table)
    cols = ["dec9b", "st", "i"]  # dec9b refers to the decimal_9_2 fixed defined by the skipped dec9
    got = avro.read(tmp_path / "b.avro", km, columns=cols, batch_size=1024)
    assert got.equals(table.select(cols))
    with pytest.raises(ValueError, match="nope"):
        avro.read(tmp_path / "b.avro", km, columns=["nope"])
    km2 = avro.write(pa.RecordBatchReader.from_batches(table.schema, table.to_batches()), tmp_path / "c.avro")
    assert avro.read(tmp_path / "c.avro", km2).equals(table)


def test_written_values_decode_independently(tmp_path):
    """What icecrypt.avro writes, fastavro's own logical-type readers decode the same."""
    u = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
    table = pa.table({
        "dec": pa.array([decimal.Decimal("-0.01"), decimal.Decimal("12345678.90"), None], pa.decimal128(10, 2)),
        "date": pa.array([0, -1, 19000], pa.date32()),
        "tstz": pa.array([0, -1, 1_700_000_000_123_456], pa.timestamp("us", "UTC")),
        "imap": pa.array([[(1, "a")], [], None], pa.map_(pa.int32(), pa.string())),
        "u": pa.array([u.bytes, None, bytes(16)], pa.uuid()),
    })
    km = avro.write(table, tmp_path / "x.avro")
    plain = ags1.decrypt((tmp_path / "x.avro").read_bytes(), km.encryption_key, km.aad_prefix, km.file_length)
    rows = list(fastavro.reader(io.BytesIO(plain)))
    utc = datetime.timezone.utc
    assert [r["dec"] for r in rows] == [decimal.Decimal("-0.01"), decimal.Decimal("12345678.90"), None]
    assert [r["date"] for r in rows] == [datetime.date(1970, 1, 1), datetime.date(1969, 12, 31),
                                         datetime.date(2022, 1, 8)]
    assert rows[2]["tstz"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=utc)
    assert rows[0]["imap"] == [{"key": 1, "value": "a"}] and rows[2]["imap"] is None
    assert rows[0]["u"] in (u.bytes, str(u), u)


def test_values_written_by_fastavro_read_back(tmp_path):
    """Logical values encoded by fastavro (bytes decimals, string UUIDs, ...) read right."""
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "bdec", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 4}]},
        {"name": "fdec", "type": {"type": "fixed", "name": "f9", "size": 9, "logicalType": "decimal",
                                  "precision": 20, "scale": 0}},
        {"name": "suuid", "type": ["null", {"type": "string", "logicalType": "uuid"}]},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
    ]}
    u = uuid.uuid4()
    values = [
        {"bdec": decimal.Decimal("-123456789012345678901234567890.1234"), "fdec": decimal.Decimal(-5),
         "suuid": u, "tm": datetime.time(1, 2, 3, 4000), "e": "B"},
        {"bdec": None, "fdec": decimal.Decimal(10**19), "suuid": None, "tm": datetime.time(0), "e": "A"},
        {"bdec": decimal.Decimal(0), "fdec": decimal.Decimal(0), "suuid": uuid.UUID(int=0), "tm": datetime.time(0),
         "e": "A"},
    ]
    buf = io.BytesIO()
    fastavro.writer(buf, schema, values)
    km = StandardKeyMetadata(bytes(16), b"a" * 16)
    path = tmp_path / "f.avro"
    path.write_bytes(ags1.encrypt(buf.getvalue(), km.encryption_key, km.aad_prefix))
    got = avro.read(path, km)
    assert got.column("bdec").to_pylist() == [v["bdec"] for v in values]
    assert got.column("fdec").to_pylist() == [v["fdec"] for v in values]
    assert got.column("suuid").type == pa.uuid()
    assert got.column("suuid").to_pylist() == [u, None, uuid.UUID(int=0)]
    assert got.column("tm").to_pylist() == [datetime.time(1, 2, 3, 4000), datetime.time(0), datetime.time(0)]
    assert got.column("e").to_pylist() == ["B", "A", "A"]


def _canonical(table: pa.Table) -> list[str]:
    """The rows of ../shared/tables in their canonical form (tables/README.md)."""
    columns = []
    for field, column in zip(table.schema, table.columns):
        t = field.type
        if pa.types.is_date(t):
            values = column.cast(pa.int32()).to_pylist()
        elif pa.types.is_timestamp(t):
            values = column.cast(pa.int64()).to_pylist()
        elif pa.types.is_floating(t):
            values = [None if v is None else struct.pack(">d", v).hex() for v in column.to_pylist()]
        elif pa.types.is_decimal(t):
            values = [None if v is None else format(v, "f") for v in column.to_pylist()]
        elif pa.types.is_binary(t):
            values = [None if v is None else v.hex() for v in column.to_pylist()]
        else:
            values = column.to_pylist()
        columns.append(values)
    return [json.dumps(list(row), separators=(",", ":"), ensure_ascii=True) for row in zip(*columns)]


def test_java_avro_data_files():
    """The Avro data files Iceberg Java wrote: row counts and the table's digest."""
    table_name = "enc_avro_dek16"
    expected = expected_json(table_name)
    tables = []
    for uri, f in avro_files(table_name).items():
        if f["kind"] != "data":
            continue
        stats = avro.ReadStats()
        t = avro.read(local_path(table_name, uri), f["key_metadata"], stats=stats)
        assert t.num_rows == f["info"]["record_count"]
        assert len(stats.blocks) == len(set(stats.blocks)) == -(-avro.plaintext_size(f["key_metadata"]) // 2**20)
        tables.append(t)
    whole = pa.concat_tables(tables)
    assert whole.num_rows == expected["expected"]["row_count"] == 30000
    assert [f.metadata[FID] for f in whole.schema] == [str(i).encode() for i in range(1, 10)]
    assert whole.schema.field("ts").type == pa.timestamp("us")  # Java: adjust-to-utc false
    assert whole.schema.field("price").type == pa.decimal128(10, 2)
    lines = sorted(_canonical(whole))
    digest = hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()
    assert digest == expected["expected"]["digest_sha256"]
    with gzip.open(TABLES_DIR / table_name / expected["expected"]["rows_file"], "rt") as fh:
        assert lines[:50] == [line.rstrip("\n") for line in fh][:50]


def test_write_then_java_reader_schema(tmp_path):
    """A file written from the Java file's Arrow schema carries the same Avro types
    (field ids, adjust-to-utc false, decimal_10_2 fixed) as Java's own header."""
    table_name = "enc_avro_dek16"
    uri, f = next((u, f) for u, f in avro_files(table_name).items() if f["kind"] == "data")
    java = avro.read(local_path(table_name, uri), f["key_metadata"])
    km = avro.write(java, tmp_path / "copy.avro")
    with avro.read_records(tmp_path / "copy.avro", km) as mine, \
            avro.read_records(local_path(table_name, uri), f["key_metadata"]) as theirs:
        assert mine.schema["fields"] == theirs.schema["fields"]
        assert mine.schema["name"] == theirs.schema["name"] == "table"
    assert avro.read(tmp_path / "copy.avro", km).equals(java)


def test_write_rejects(tmp_path):
    with pytest.raises(ValueError, match="x.avro"):
        avro.write(pa.table({"u": pa.array([1], pa.uint64())}), tmp_path / "x.avro")
    with pytest.raises(TypeError):
        avro.write([], tmp_path / "x.avro")
    big = pa.array([decimal.Decimal(10**5)], pa.decimal128(38, 0)).cast(pa.decimal128(5, 0), safe=False)
    with pytest.raises(ValueError, match="precision"):
        avro.write(pa.table({"d": big}), tmp_path / "x.avro")
    with pytest.raises(ValueError, match="differs"):
        avro.write([pa.record_batch({"a": [1]}), pa.record_batch({"a": ["x"]})], tmp_path / "x.avro")
    with pytest.raises(ValueError):  # a null in a non-nullable column
        avro.write(pa.table({"a": pa.array([None], pa.int64())}, schema=pa.schema([pa.field("a", pa.int64(), False)])),
                   tmp_path / "x.avro")
    assert list(tmp_path.iterdir()) == []


def test_decimal_too_wide_for_arrow(tmp_path):
    """A bytes decimal longer than Arrow's decimal width is a FormatError naming the file."""
    field_type = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 0}
    schema = {"type": "record", "name": "r", "fields": [{"name": "d", "type": field_type}]}
    buf = io.BytesIO()
    fastavro.writer(buf, schema, [{"d": b"\x01" * 17}])  # bytes pass through unconverted
    key = StandardKeyMetadata(bytes(16), None)
    (tmp_path / "d.avro").write_bytes(ags1.encrypt(buf.getvalue(), key.encryption_key))
    with pytest.raises(icecrypt.FormatError, match="d.avro"):
        avro.read(tmp_path / "d.avro", key)


def test_no_columns_keeps_the_row_count(tmp_path):
    table = pa.table({"a": pa.array(range(70_000), pa.int64()), "b": ["x"] * 70_000})
    km = avro.write(table, tmp_path / "n.avro")
    assert avro.read(tmp_path / "n.avro", km, columns=[]).num_rows == 70_000
    size = avro.plaintext_size(km)
    counts = [b.num_rows for s in (0, size // 2) for b in avro.read_split(tmp_path / "n.avro", km, s, size // 2 + 1,
                                                                          columns=[])]
    assert sum(counts) == 70_000


def test_schema_metadata_round_trip(tmp_path):
    table = pa.table({"a": [1, 2]}).replace_schema_metadata({b"iceberg.schema": b"{}", b"bin": b"\xff\xfe"})
    km = avro.write(table, tmp_path / "m.avro", metadata={"extra": "1"})
    back = avro.read(tmp_path / "m.avro", km)
    assert back.schema.metadata == {b"iceberg.schema": b"{}", b"extra": b"1"}  # non-UTF-8 entries are dropped
    km2 = avro.write(back, tmp_path / "m2.avro")
    assert avro.read_schema(tmp_path / "m2.avro", km2).metadata == back.schema.metadata


@pytest.mark.parametrize(("name", "avro_name"), [
    ("plain_name9", "plain_name9"), ("1col", "_1col"), ("a-b", "a_x2Db"), ("a b.c", "a_x20b_x2Ec"),
    ("naïve", "naïve"), ("x²", "x_xB2"), ("😀", "_xD83D_xDE00"), ("_", "_"),
])
def test_field_names_sanitized_like_iceberg_java(tmp_path, name, avro_name):
    schema = pa.schema([pa.field(name, pa.int32())])
    (field,) = avro.arrow_to_avro_schema(schema)["fields"]
    assert field["name"] == avro_name
    assert field.get("iceberg-field-name", name) == name
    km = avro.write(pa.table({name: [1]}), tmp_path / "n.avro")
    assert avro.read(tmp_path / "n.avro", km).column_names == [name]
