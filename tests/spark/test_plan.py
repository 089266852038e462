"""icecrypt.spark without a JVM: options, file discovery, keys, schemas and planning.

The data source classes are plain Python objects; Spark only pickles them between its
workers.  These tests drive them directly (planner and task sides, with a pickle round
trip between, as Spark does); the Spark tests then check the same through real jobs.
"""

from __future__ import annotations

import itertools
import json
import pickle

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import LongType, StructField, StructType
from sparkhelpers import MASTER, key_strings

from icecrypt import AuthenticationError, EncryptionKeyNotFoundError, FormatError, KmsError, avro
from icecrypt.keys import StandardKeyMetadata
from icecrypt.kms.local import LocalKms
from icecrypt.spark import AvroDataSource, ParquetDataSource, wrap_keys
from icecrypt.spark._common import AGS1_BLOCK, kms_properties, list_files, pack, split_size
from icecrypt.spark._keys import KeyRing, canonical, keyring, unwrap_keys
from icecrypt.spark._schema import FIELD_ID, Projection, arrow_for_write, spark_schema


def _options(kms_options, **extra) -> CaseInsensitiveDict:
    return CaseInsensitiveDict({**kms_options, **extra})


def _wrapped(kms, keys) -> str:
    return wrap_keys(keys, kms=kms, table_key_id=MASTER)


# --- options ---------------------------------------------------------------------------------


def test_split_size_parses_units_and_refuses_less_than_an_ags1_block():
    assert split_size({}) == 128 << 20
    assert split_size({"split-size": "1m"}) == AGS1_BLOCK
    assert split_size({"split-size": "2MiB"}) == 2 << 20
    assert split_size({"split-size": "1048577"}) == AGS1_BLOCK + 1
    for bad in ("1048575", "512k", "0", "lots", "-1m"):
        with pytest.raises(ValueError, match="split-size"):
            split_size({"split-size": bad})


def test_kms_properties_drop_source_options_and_refuse_master_key_material():
    props = kms_properties({"path": "/x", "keys.wrapped": "{}", "split-size": "1m", "encryption.kms-type": "local",
                            "vault.token": "t"})
    assert props == {"encryption.kms-type": "local", "vault.token": "t"}
    with pytest.raises(ValueError, match="master-key material") as info:
        kms_properties({"encryption.kms-type": "memory", "encryption.kms.memory.key.k1": "00" * 16})
    assert "00" * 16 not in str(info.value)


def test_encryption_option_is_on_unless_none_is_explicit(avro_data, kms_options):
    ds = AvroDataSource(_options(kms_options, path=str(avro_data.plain), encryption="none"))
    assert [f.name for f in ds.schema()] == avro_data.table.column_names
    # Without encryption=none the same plaintext files need keys, and get none.
    with pytest.raises(EncryptionKeyNotFoundError, match="no key metadata given"):
        AvroDataSource(_options(kms_options, path=str(avro_data.plain))).schema()
    with pytest.raises(ValueError, match="encryption='off'"):
        AvroDataSource(_options(kms_options, path=str(avro_data.plain), encryption="off")).schema()


# --- files ------------------------------------------------------------------------------------


def test_directories_globs_lists_and_uris(avro_data):
    enc = avro_data.enc
    every = sorted(avro_data.keys)

    def listed(**options):
        return sorted(f.path for f in list_files(options, ".avro"))

    assert listed(path=str(enc)) == every  # recursive, _hidden.avro skipped
    assert listed(path=f"file://{enc}/") == every
    assert listed(path=f"{enc}/small/s*.avro") == [str(enc / "small/s1.avro"), str(enc / "small/s2.avro")]
    assert listed(paths=json.dumps([str(enc / "big.avro"), str(enc / "small")])) == every
    assert listed(path=str(enc / "small/_hidden.avro")) == [str(enc / "small/_hidden.avro")]  # named: taken
    with pytest.raises(FileNotFoundError, match="does not exist"):
        listed(path=str(enc / "nope"))
    with pytest.raises(FileNotFoundError, match="no file matches"):
        listed(path=f"{enc}/*.parquet")
    with pytest.raises(FileNotFoundError, match="no .parquet files"):
        list_files({"path": str(enc)}, ".parquet")
    with pytest.raises(ValueError, match="no path given"):
        list_files({}, ".avro")


def test_pack_keeps_order_and_closes_groups_at_the_target():
    assert pack([(5, "a"), (5, "b"), (5, "c"), (20, "d"), (1, "e")], 10) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert pack([], 10) == []


# --- keys ---------------------------------------------------------------------------------------


def test_wrapped_keys_hold_no_key_bytes_and_unwrap_with_the_kms(kms, keystore, avro_data, tmp_path):
    text = _wrapped(kms, avro_data.keys)
    for leak in key_strings(avro_data.keys.values()):
        assert leak not in text
    assert unwrap_keys(text, kms) == avro_data.keys
    other = LocalKms.create_keystore(tmp_path / "other.json", [MASTER])  # same id, other material
    with pytest.raises(KmsError):
        unwrap_keys(text, other)
    document = json.loads(text)
    document["encryption-keys"][-1]["encrypted-key-metadata"] = document["encryption-keys"][0][
        "encrypted-key-metadata"]
    with pytest.raises((AuthenticationError, FormatError)):
        unwrap_keys(json.dumps(document), kms)
    with pytest.raises(FormatError, match="keys.wrapped"):
        unwrap_keys("{}", kms)


def test_key_lookup_by_canonical_path(avro_data):
    km = StandardKeyMetadata(b"k" * 16, b"a" * 16, 100)
    ring = KeyRing({"file:///data/x/../t/a.avro": km, "s3://bucket/t/b.avro": km, "bucket2/c.avro": km}, "test")
    files = list_files({"path": str(avro_data.enc / "big.avro")}, ".avro")
    with pytest.raises(EncryptionKeyNotFoundError, match=f"no key metadata for {files[0].uri} in test"):
        ring.get(files[0])
    assert canonical("file:///data/x/../t/a.avro") == canonical("/data/t/a.avro") == "/data/t/a.avro"
    assert canonical("s3://bucket/t/b.avro") == canonical("s3a://bucket/t/b.avro") == "bucket/t/b.avro"
    assert len(ring) == 3


def test_keyring_needs_exactly_one_source(kms_options, kms, avro_data):
    with pytest.raises(EncryptionKeyNotFoundError, match="keys.manifest"):
        keyring(kms_options)
    with pytest.raises(ValueError, match="not both"):
        keyring({**kms_options, "keys.manifest": "/m.json", "keys.wrapped": _wrapped(kms, {})})


# --- schemas ---------------------------------------------------------------------------------------


def test_projection_casts_to_what_spark_declares():
    source = pa.schema([
        pa.field("u", pa.uint32()), pa.field("big", pa.uint64()), pa.field("fixed", pa.binary(4)),
        pa.field("uuid", pa.uuid()), pa.field("ts", pa.timestamp("ms", tz="Europe/Paris")),
        pa.field("t", pa.time64("us")), pa.field("dict", pa.dictionary(pa.int8(), pa.string())),
        pa.field("l", pa.large_list(pa.large_string())), pa.field("id", pa.int64(), nullable=False,
                                                                  metadata={FIELD_ID: b"7"}),
    ])
    schema = spark_schema(source)
    assert schema["id"].metadata == {"parquet.field.id": 7} and not schema["id"].nullable
    projection = Projection(source, schema, "test")
    batch = pa.record_batch([
        pa.array([1], pa.uint32()), pa.array([2**64 - 1], pa.uint64()), pa.array([b"abcd"], pa.binary(4)),
        pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"0123456789abcdef"], pa.binary(16))),
        pa.array([1000], pa.timestamp("ms", tz="Europe/Paris")), pa.array([1], pa.time64("us")),
        pa.array(["v"]).dictionary_encode(), pa.array([["a"]], pa.large_list(pa.large_string())),
        pa.array([5], pa.int64()),
    ], schema=source)
    out = projection.apply(batch)
    assert out.schema.equals(projection.target)
    assert out.to_pylist()[0]["big"] == 2**64 - 1 and out.column("uuid").to_pylist() == [b"0123456789abcdef"]
    assert out.column("ts").type == pa.timestamp("us", tz="UTC")


def test_projection_selects_reorders_and_refuses_what_does_not_fit():
    source = pa.schema([pa.field("a", pa.int32()), pa.field("B", pa.string()), pa.field("c", pa.int64())])
    wanted = StructType([StructField("c", LongType()), StructField("a", LongType(), nullable=False)])
    projection = Projection(source, wanted, "f.parquet")
    assert projection.columns == ["c", "a"]
    batch = pa.record_batch([pa.array([1, None], pa.int32()), pa.array(["x", "y"]), pa.array([3, 4])], schema=source)
    with pytest.raises(ValueError, match="holds nulls"):
        projection.apply(batch)
    assert Projection(source, StructType([StructField("b", pa_string := spark_schema(source)["B"].dataType)]),
                      "f").columns == ["B"]
    with pytest.raises(ValueError, match=r"f.parquet: .*no column 'zz'"):
        Projection(source, StructType([StructField("zz", LongType())]), "f.parquet")
    assert pa_string.simpleString() == "string"


def test_write_schema_turns_spark_field_ids_back_into_parquet_field_ids():
    source = pa.schema([pa.field("id", pa.int64(), metadata={FIELD_ID: b"3"}),
                        pa.field("s", pa.struct([pa.field("x", pa.int32(), metadata={FIELD_ID: b"4"})]))])
    from pyspark.sql.pandas.types import to_arrow_schema

    spark_arrow = to_arrow_schema(spark_schema(source), timezone="UTC")
    back = arrow_for_write(spark_arrow)
    assert back.field("id").metadata == {FIELD_ID: b"3"}
    assert back.field("s").type.field("x").metadata == {FIELD_ID: b"4"}


# --- planning (driver) and reading (tasks), with Spark's pickling between -----------------------


def _plan(source_cls, options):
    source = source_cls(options)
    reader = source.reader(source.schema())
    shipped = pickle.dumps(reader)  # Spark pickles the reader before it plans
    partitions = reader.partitions()
    return reader, shipped, partitions


def test_avro_splits_cover_every_plaintext_byte_once_and_carry_no_keys(kms, kms_options, avro_data):
    options = _options(kms_options, path=str(avro_data.enc), **{"keys.wrapped": _wrapped(kms, avro_data.keys),
                                                                 "split-size": str(AGS1_BLOCK + 1)})
    _, shipped, partitions = _plan(AvroDataSource, options)
    pieces = [piece for partition in partitions for piece in partition.pieces]
    by_file: dict[str, list[tuple[int, int]]] = {}
    for file, start, length in pieces:
        assert 0 < length <= AGS1_BLOCK + 1
        by_file.setdefault(file.path, []).append((start, length))
    for path, ranges in by_file.items():
        assert ranges[0][0] == 0
        assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(ranges))
        assert sum(n for _, n in ranges) == avro.plaintext_size(avro_data.keys[path])
    big = avro.plaintext_size(avro_data.keys[str(avro_data.enc / "big.avro")])
    assert len(by_file[str(avro_data.enc / "big.avro")]) == -(-big // (AGS1_BLOCK + 1))
    for partition in partitions:  # small pieces share a partition up to the split size
        assert len(partition.pieces) == 1 or sum(n for _, _, n in partition.pieces) <= AGS1_BLOCK + 1
    assert len(partitions) < len(pieces)
    blobs = shipped + pickle.dumps(partitions)
    for leak in key_strings(avro_data.keys.values()):
        assert leak.encode() not in blobs
    for km in avro_data.keys.values():
        assert km.encryption_key not in blobs
    task_reader = pickle.loads(shipped)
    rows = sum(b.num_rows for p in partitions for b in task_reader.read(pickle.loads(pickle.dumps(p))))
    assert rows == avro_data.table.num_rows


def test_parquet_partitions_group_files(kms, kms_options, parquet_data):
    options = _options(kms_options, path=str(parquet_data.enc), **{"keys.wrapped": _wrapped(kms, parquet_data.keys)})
    _, _, partitions = _plan(ParquetDataSource, options)
    assert len(partitions) == 1  # 3 small files: one partition of whole files
    options["split-size"] = "1"
    _, shipped, partitions = _plan(ParquetDataSource, options)
    pieces = [piece for p in partitions for piece in p.pieces]
    # files below the smallest range (1 MiB) are never cut: one whole file per partition
    assert len(partitions) == len(pieces) == 3
    assert sorted(file.path for file, _, _ in pieces) == sorted(parquet_data.keys)
    assert all((start, end) == (0, None) for _, start, end in pieces)
    reader = pickle.loads(shipped)
    assert sum(b.num_rows for p in partitions for b in reader.read(p)) == parquet_data.table.num_rows


def test_writes_need_a_manifest_and_encryption(kms_options, tmp_path):
    from icecrypt.spark._parquet import ParquetWriter

    with pytest.raises(ValueError, match="keys.manifest is required"):
        ParquetWriter({**kms_options, "path": str(tmp_path), "encryption.key-id": MASTER}, None, False)
    with pytest.raises(ValueError, match="always writes encrypted"):
        ParquetWriter({**kms_options, "path": str(tmp_path), "encryption": "none", "keys.manifest": "m"}, None, False)
    without_key = {k: v for k, v in kms_options.items() if k != "encryption.key-id"}
    with pytest.raises(ValueError, match="encryption.key-id"):
        ParquetWriter({**without_key, "path": str(tmp_path), "keys.manifest": str(tmp_path / "m.json")}, None, False)


def test_local_filesystem_is_picklable_in_files(avro_data):
    files = list_files({"path": str(avro_data.enc)}, ".avro")
    again = pickle.loads(pickle.dumps(files))
    assert [f.uri for f in again] == [f.uri for f in files]
    assert isinstance(again[0].filesystem, pafs.LocalFileSystem)
