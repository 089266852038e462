"""Against Avro Java (avro-1.12 on the Spark driver's classpath): it parses the schemas
and reads the containers icecrypt.avro writes, and its split rule (``DataFileReader.sync``
+ ``pastSync``, what Hadoop's AvroRecordReader and Iceberg's split reads use) assigns
every record to the same split as :func:`icecrypt.avro.read_split`."""

from __future__ import annotations

import decimal
import itertools
import random

import pyarrow as pa
import pytest

from icecrypt import ags1, avro

pytestmark = pytest.mark.spark


def decrypted_copy(path, km, target):
    target.write_bytes(ags1.decrypt(path.read_bytes(), km.encryption_key, km.aad_prefix, km.file_length))
    return target


def java_reader(jvm, path):
    return jvm.org.apache.avro.file.DataFileReader(
        jvm.java.io.File(str(path)), jvm.org.apache.avro.generic.GenericDatumReader()
    )


def test_java_reads_what_we_write(jvm, tmp_path):
    fid = lambda i: {b"PARQUET:field_id": str(i).encode()}
    table = pa.table({
        "id": pa.array(range(300), pa.int64()),
        "name": pa.array([f"n{i}" if i % 7 else None for i in range(300)]),
        "price": pa.array([None if i % 5 == 0 else decimal.Decimal(i * 3).scaleb(-2) for i in range(300)],
                          pa.decimal128(14, 2)),
        "ts": pa.array(range(300), pa.timestamp("us", "UTC")),
        "tags": pa.array([[i, -i] for i in range(300)], pa.list_(pa.int32())),
        "m": pa.array([[(i, "v")] for i in range(300)], pa.map_(pa.int32(), pa.string())),
    })
    table = table.cast(pa.schema([f.with_metadata(fid(i + 1)) for i, f in enumerate(table.schema)]))
    km = avro.write(table, tmp_path / "t.avro", sync_interval=2000)
    plain = decrypted_copy(tmp_path / "t.avro", km, tmp_path / "plain.avro")
    reader = java_reader(jvm, plain)
    try:
        schema = reader.getSchema()
        assert schema.getField("price").getObjectProp("field-id") == 3
        price = schema.getField("price").schema().getTypes().get(1)
        assert price.getLogicalType().getName() == "decimal" and price.getLogicalType().getScale() == 2
        assert schema.getField("m").schema().getTypes().get(1).getProp("logicalType") == "map"
        ids, names = [], []
        while reader.hasNext():
            record = reader.next()
            ids.append(record.get("id"))
            name = record.get("name")
            names.append(None if name is None else name.toString())
    finally:
        reader.close()
    assert ids == table.column("id").to_pylist()
    assert names == table.column("name").to_pylist()


def test_split_rule_matches_avro_java(jvm, tmp_path):
    schema = {"type": "record", "name": "r", "fields": [{"name": "i", "type": "long"}, {"name": "p", "type": "bytes"}]}
    rng = random.Random(5)
    rows = [{"i": i, "p": rng.randbytes(rng.randint(0, 300))} for i in range(1500)]
    km = avro.write_records(tmp_path / "s.avro", schema, rows, codec="null", sync_interval=3000)
    plain = decrypted_copy(tmp_path / "s.avro", km, tmp_path / "plain.avro")
    size = avro.plaintext_size(km)
    sync = plain.read_bytes()[-16:]
    syncs = [i for i in range(size) if plain.read_bytes()[i : i + 16] == sync]
    cuts = sorted({*rng.sample(range(1, size), 40), *(s + d for s in syncs[:6] for d in (-1, 0, 1, 16))})
    bounds = [0, *[c for c in cuts if 0 < c < size], size]
    reader = java_reader(jvm, plain)
    try:
        for start, end in itertools.pairwise(bounds):
            reader.sync(start)
            java = []
            while reader.hasNext() and not reader.pastSync(end):
                java.append(reader.next().get("i"))
            ours = [i for b in avro.read_split(tmp_path / "s.avro", km, start, end - start, columns=["i"])
                    for i in b.column("i").to_pylist()]
            assert ours == java, (start, end)
    finally:
        reader.close()
