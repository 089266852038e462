"""Spark reads of encrypted files equal reads of the same data unencrypted, by pyarrow /
fastavro, for every way of splitting and loading them.

Each test unions all its variants into one DataFrame (a ``variant`` column tells them
apart), so a test costs one Spark job.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from sparkhelpers import (
    MASTER,
    canonical_lines,
    digest,
    fastavro_rows,
    java_data_files,
    java_expected,
    sync_positions,
    table_lines,
    union_variants,
)

from icecrypt.spark import wrap_keys
from icecrypt.spark._common import AGS1_BLOCK

pytestmark = pytest.mark.spark


def _by_variant(table, count: int, columns: list[str]) -> list[list[str]]:
    rows = table.to_pylist()
    return [canonical_lines((r for r in rows if r["variant"] == i), columns) for i in range(count)]


def test_avro_splits_at_and_around_block_and_sync_boundaries(icespark, kms, kms_options, avro_data):
    big = avro_data.enc / "big.avro"
    plain = avro_data.twin(big)
    data = plain.read_bytes()
    # The first sync marker that starts well past the first AGS1 block boundary.
    sync = next(p for p in sync_positions(data) if p > AGS1_BLOCK + 64)
    split_sizes = [AGS1_BLOCK, AGS1_BLOCK + 1, 2 * AGS1_BLOCK - 1,  # AGS1 block boundaries
                   sync - 1, sync, sync + 1, sync + 16,              # at / around a sync marker
                   None]                                             # default: one split
    wrapped = wrap_keys(avro_data.keys, kms=kms, table_key_id=MASTER)

    def read(path, **options):
        return (icespark.read.format("icecrypt.avro").options(**kms_options)
                .option("keys.wrapped", wrapped).options(**options).load(str(path)))

    frames = [read(big, **({} if size is None else {"split-size": str(size)})) for size in split_sizes]
    frames.append(read(plain, encryption="none", **{"split-size": str(AGS1_BLOCK + 1)}))
    frames.append(read(avro_data.enc, **{"split-size": "1m"}))  # directory: big + small/*, _hidden skipped
    result = union_variants(frames).toArrow()

    columns = avro_data.table.column_names
    expected_big = canonical_lines(fastavro_rows(plain), columns)
    expected_all = canonical_lines(
        [row for name in ("big.avro", "small/s1.avro", "small/s2.avro") for row in fastavro_rows(avro_data.plain / name)],
        columns)
    got = _by_variant(result, len(frames), columns)
    for size, lines in zip([*split_sizes, "plain"], got):
        assert lines == expected_big, f"split size {size}"
    assert got[-1] == expected_all
    assert len(expected_big) == 12_000


def test_parquet_multi_file_loads_and_projection(icespark, kms, kms_options, parquet_data):
    enc, plain = parquet_data.enc, parquet_data.plain
    wrapped = wrap_keys(parquet_data.keys, kms=kms, table_key_id=MASTER)
    expected_table = pq.read_table(plain)  # pyarrow reading the plaintext twins
    columns = expected_table.column_names
    full_schema = None

    def read(paths, schema=None, **options):
        reader = (icespark.read.format("icecrypt.parquet").options(**kms_options)
                  .option("keys.wrapped", wrapped).options(**options))
        if schema is not None:
            reader = reader.schema(schema)
        return reader.load(paths)

    frames = [
        read(str(enc)),                                                    # directory, recursive
        read([str(enc / "p0.parquet"), str(enc / "sub/p1.parquet"), str(enc / "p2.parquet")]),
        read([f"{enc}/p*.parquet", f"file://{enc}/sub"]),                 # glob + URI of a directory
        read(str(enc), **{"split-size": "1"}),                             # one file per partition
        read(str(plain), encryption="none"),                               # the plaintext twins
        read(str(enc), columns="s,id"),                                    # projection by option
        read(str(enc), schema="u BIGINT, id BIGINT"),                      # projection by schema
    ]
    full_schema = frames[0].schema
    assert [f.name for f in full_schema] == columns
    assert full_schema["u"].dataType.simpleString() == "bigint"  # uint32 widened
    assert frames[5].columns == ["s", "id"] and frames[6].columns == ["u", "id"]
    aligned = [df.select(*[(F.col(f.name) if f.name in df.columns else F.lit(None).cast(f.dataType)).alias(f.name)
                           for f in full_schema]) for df in frames]
    union = union_variants(aligned)
    assert union.rdd.getNumPartitions() == 3 + 6  # 3 single files + 1 partition per other load
    result = union.toArrow()
    got = _by_variant(result, len(frames), columns)
    expected = table_lines(expected_table)
    for index, lines in enumerate(got[:5]):
        assert lines == expected, f"variant {index}"
    assert got[5] == canonical_lines(({"s": r["s"], "id": r["id"], **{c: None for c in columns if c not in ("s", "id")}}
                                      for r in expected_table.to_pylist()), columns)
    assert got[6] == canonical_lines(({"u": r["u"], "id": r["id"], **{c: None for c in columns if c not in ("u", "id")}}
                                      for r in expected_table.to_pylist()), columns)


def test_tables_written_by_iceberg_java(icespark, kms, kms_options):
    """The Avro (AGS1) and Parquet (native encryption) data files Iceberg Java wrote for
    ../shared/tables read to the rows Java recorded (digest of the canonical rows)."""
    frames, expected = [], []
    for table, fmt in (("enc_avro_dek16", "avro"), ("enc_parquet_dek16", "parquet")):
        files = java_data_files(table)
        wrapped = wrap_keys({str(p): km for p, km in files.items()}, kms=kms, table_key_id=MASTER)
        directory = next(iter(files)).parents[1]  # .../<table>/data
        frames.append(icespark.read.format(f"icecrypt.{fmt}").options(**kms_options)
                      .option("keys.wrapped", wrapped).option("split-size", "1m").load(str(directory)))
        expected.append(java_expected(table))
    assert frames[0].schema == frames[1].schema
    result = union_variants(frames).toArrow()
    for index, want in enumerate(expected):
        lines = canonical_lines((r for r in result.to_pylist() if r["variant"] == index), want["columns"])
        assert len(lines) == want["rows"]
        assert digest(lines) == want["digest"], json.dumps(lines[:2])
