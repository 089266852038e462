"""``icecrypt.parquet`` plans by file size on the driver and splits row groups in the tasks.

The driver opens one footer for ``schema()`` and one for the reader's projection,
whatever the number of files (counted by :data:`icecrypt.spark._parquet.STATS`, the
footers this process opened); ``partitions()`` opens none.  A task takes, of its byte
range, the row groups whose midpoint lies in it, so every row is read exactly once
whatever the split size: smaller than a row group, equal to a file, spanning many files.

Most tests drive the data source classes in this process (with Spark's pickling
between planner and tasks); the last ones read through the shared Spark session.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from sparkhelpers import MASTER, key_strings

from icecrypt import AuthenticationError, EncryptionKeyNotFoundError, FormatError, parquet
from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.keys.manifest import write_key_manifest
from icecrypt.spark import ParquetDataSource, wrap_keys
from icecrypt.spark._common import split_size
from icecrypt.spark._parquet import MIN_RANGE, STATS, row_groups_in_range

BIG_ROWS, BIG_GROUP = 12_000, 2_000  # 6 row groups of ~1.6 MiB (random bytes: incompressible)
SMALL_FILES, SMALL_ROWS, SMALL_GROUP = 30, 20, 5  # 4 row groups each
SMALL_BASE = 1_000_000


@dataclasses.dataclass
class SplitData:
    enc: Path
    plain: Path
    keys: dict[str, StandardKeyMetadata]
    manifest: Path
    big: Path
    smalls: list[Path]
    ids: list[int]


def _table(ids: np.ndarray, blob: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=len(ids) * blob, dtype=np.uint8).tobytes()
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "blob": pa.array([data[i * blob:(i + 1) * blob] for i in range(len(ids))], pa.binary()),
        "tag": pa.array([f"t{i % 13}" for i in ids.tolist()]),
    })


@pytest.fixture(scope="module")
def split_data(tmp_path_factory, kms) -> SplitData:
    root = tmp_path_factory.mktemp("parquet-splits")
    enc, plain = root / "enc", root / "plain"
    (enc / "small").mkdir(parents=True)
    plain.mkdir()
    keys = {}
    big = enc / "big.parquet"
    table = _table(np.arange(BIG_ROWS), 800, 1)
    keys[str(big)] = parquet.write_table(table, big, row_group_size=BIG_GROUP)
    pq.write_table(table, plain / "big.parquet", row_group_size=BIG_GROUP, compression="zstd")
    smalls = []
    for index in range(SMALL_FILES):
        path = enc / "small" / f"s{index:03d}.parquet"
        ids = np.arange(SMALL_BASE + index * SMALL_ROWS, SMALL_BASE + (index + 1) * SMALL_ROWS)
        keys[str(path)] = parquet.write_table(_table(ids, 16, index + 2), path, row_group_size=SMALL_GROUP)
        smalls.append(path)
    manifest = root / "keys.json"
    write_key_manifest(manifest, keys, EncryptionManager(kms, MASTER))
    ids = list(range(BIG_ROWS)) + list(range(SMALL_BASE, SMALL_BASE + SMALL_FILES * SMALL_ROWS))
    return SplitData(enc, plain, keys, manifest, big, smalls, ids)


def _options(kms_options, data: SplitData, **extra) -> CaseInsensitiveDict:
    return CaseInsensitiveDict({**kms_options, "keys.manifest": str(data.manifest), "path": str(data.enc), **extra})


def _plan(options):
    """Plan as Spark does: schema(), reader(), pickle the reader, partitions(); with the
    footers opened by each step."""
    STATS.reset()
    source = ParquetDataSource(options)
    schema = source.schema()
    after_schema = STATS.footers
    reader = source.reader(schema)
    after_reader = STATS.footers
    shipped = pickle.dumps(reader)
    partitions = reader.partitions()
    footers = {"schema": after_schema, "reader": after_reader - after_schema,
               "partitions": STATS.footers - after_reader}
    return shipped, partitions, footers


def _read(shipped, partitions) -> list[int]:
    reader = pickle.loads(shipped)
    ids: list[int] = []
    for partition in partitions:
        for batch in reader.read(pickle.loads(pickle.dumps(partition))):
            ids.extend(batch.column(0).to_pylist())
    return ids


def _row_groups(pieces, keys) -> list[tuple[str, int]]:
    """(file, row group) for every row group the pieces select, by the tasks' own rule."""
    out = []
    for file, start, end in pieces:
        with parquet.open_file(file.path, keys[file.path]) as handle:
            out += [(file.path, index) for index in row_groups_in_range(handle.metadata, start, end)]
    return out


def _all_row_groups(data: SplitData) -> list[tuple[str, int]]:
    groups = [(str(data.big), index) for index in range(BIG_ROWS // BIG_GROUP)]
    groups += [(str(path), index) for path in data.smalls for index in range(SMALL_ROWS // SMALL_GROUP)]
    return sorted(groups)


@pytest.mark.parametrize("split", ["1", "1m", "1500k", "3m", "file", "64m", None])
def test_every_row_group_and_row_is_read_exactly_once(kms_options, split_data, split):
    big_size = os.path.getsize(split_data.big)
    extra = {} if split is None else {"split-size": str(big_size) if split == "file" else split}
    shipped, partitions, footers = _plan(_options(kms_options, split_data, **extra))
    assert footers == {"schema": 1, "reader": 1, "partitions": 0}
    pieces = [piece for partition in partitions for piece in partition.pieces]

    # The byte ranges of each file tile it from 0 to its end; only big.parquet is cut.
    by_file: dict[str, list[tuple[int, int | None]]] = {}
    for file, start, end in pieces:
        by_file.setdefault(file.path, []).append((start, end))
    assert sorted(by_file) == sorted(split_data.keys)
    for path, ranges in by_file.items():
        assert ranges[0][0] == 0 and ranges[-1][1] is None
        assert all(end == nxt for (_, end), (nxt, _) in zip(ranges, ranges[1:]))
        if path != str(split_data.big):
            assert ranges == [(0, None)]
    step = max(split_size(extra, minimum=1), MIN_RANGE)
    big_ranges = by_file[str(split_data.big)]
    assert all(end - start == step for start, end in big_ranges[:-1])
    assert big_size - big_ranges[-1][0] <= step * 1.1
    if split in ("1", "1m", "1500k"):  # ranges smaller than a row group: some select none
        assert len(by_file[str(split_data.big)]) > BIG_ROWS // BIG_GROUP
    if split in ("64m", None):  # everything shares one partition
        assert len(partitions) == 1

    groups = _row_groups(pieces, split_data.keys)
    assert sorted(groups) == _all_row_groups(split_data)  # each exactly once

    STATS.reset()
    ids = _read(shipped, partitions)
    assert STATS.footers == len(pieces)  # one footer per piece, in the task
    assert sorted(ids) == split_data.ids  # every row exactly once


def test_driver_opens_the_same_footers_for_3_or_31_files(kms_options, split_data):
    counts = []
    for files in (split_data.smalls[:3], [split_data.big, *split_data.smalls]):
        options = _options(kms_options, split_data, paths=json.dumps([str(p) for p in files]), **{"split-size": "1m"})
        del options["path"]
        shipped, partitions, footers = _plan(options)
        counts.append(footers)
        assert sum(len(p.pieces) for p in partitions) >= len(files)
    assert counts[0] == counts[1] == {"schema": 1, "reader": 1, "partitions": 0}
    assert STATS.schema_footers == 2  # both counted as schema reads


def test_plaintext_files_and_projection_split_the_same_way(kms_options, split_data):
    shipped, partitions, footers = _plan(CaseInsensitiveDict(
        {"path": str(split_data.plain), "encryption": "none", "split-size": "1m"}))
    assert footers == {"schema": 1, "reader": 1, "partitions": 0}
    assert len(partitions) > BIG_ROWS // BIG_GROUP
    assert sorted(_read(shipped, partitions)) == list(range(BIG_ROWS))

    shipped, partitions, _ = _plan(_options(kms_options, split_data, columns="tag,id", **{"split-size": "1m"}))
    reader = pickle.loads(shipped)
    batches = [batch for partition in partitions for batch in reader.read(partition)]
    assert all(batch.schema.names == ["tag", "id"] for batch in batches)
    assert sorted(i for batch in batches for i in batch.column(1).to_pylist()) == split_data.ids


def test_wrapped_keys_plan_the_same(kms, kms_options, split_data):
    wrapped = wrap_keys(split_data.keys, kms=kms, table_key_id=MASTER)
    options = CaseInsensitiveDict({**kms_options, "keys.wrapped": wrapped, "path": str(split_data.enc),
                                   "split-size": "1m"})
    shipped, partitions, footers = _plan(options)
    assert footers == {"schema": 1, "reader": 1, "partitions": 0}
    assert sorted(_read(shipped, partitions)) == split_data.ids
    blobs = shipped + pickle.dumps(partitions)
    for leak in key_strings(split_data.keys.values()):
        assert leak.encode() not in blobs


def _error(action) -> BaseException:
    with pytest.raises(Exception) as info:
        action()
    return info.value


def test_wrong_missing_and_tampered_keys_fail_closed(kms, kms_options, split_data, tmp_path):
    keys = split_data.keys
    big, s0, s1 = str(split_data.big), str(split_data.smalls[0]), str(split_data.smalls[1])

    def options(mapping, paths, **extra):
        wrapped = wrap_keys(mapping, kms=kms, table_key_id=MASTER)
        return CaseInsensitiveDict({**kms_options, "keys.wrapped": wrapped, "paths": json.dumps(paths), **extra})

    # s1 with s0's key (and s1's length): planning opens no footer of s1, its task fails.
    wrong = keys[s0].with_file_length(keys[s1].file_length)
    shipped, partitions, _ = _plan(options({big: keys[big], s0: keys[s0], s1: wrong}, [big, s0, s1]))
    exc = _error(lambda: _read(shipped, partitions))
    assert isinstance(exc, AuthenticationError)
    assert str(exc).startswith(f"icecrypt.parquet: row groups of {s1}: ")
    text = str(exc)
    for leak in key_strings(keys.values()):
        assert leak not in text

    # ... with s0's length too: the size check fails first (FormatError), in the task.
    shipped, partitions, _ = _plan(options({big: keys[big], s0: keys[s0], s1: keys[s0]}, [big, s0, s1]))
    exc = _error(lambda: _read(shipped, partitions))
    assert isinstance(exc, FormatError) and f"of {s1}: encrypted Parquet file is" in str(exc)

    # The first file's footer is read for the schema: a wrong key there fails at load().
    exc = _error(lambda: _plan(options({s1: wrong, s0: keys[s0]}, [s1, s0])))
    assert isinstance(exc, AuthenticationError) and f"reading the schema of {s1}" in str(exc)

    # No key for s1: the planner refuses, before any task.
    exc = _error(lambda: _plan(options({big: keys[big], s0: keys[s0]}, [big, s0, s1])))
    assert isinstance(exc, EncryptionKeyNotFoundError) and f"no key metadata for {s1}" in str(exc)

    # A tampered page in big.parquet's 4th row group: only the range that holds its
    # midpoint fails, naming the range; the ranges before it read.
    tampered = tmp_path / "big.parquet"
    shutil.copyfile(big, tampered)
    with parquet.open_file(big, keys[big]) as handle:
        group = handle.metadata.row_group(3)
        column = group.column(1)  # blob
        offset = column.data_page_offset + column.total_compressed_size // 2
    data = bytearray(tampered.read_bytes())
    data[offset] ^= 0x01
    tampered.write_bytes(bytes(data))
    shipped, partitions, _ = _plan(options({str(tampered): keys[big]}, [str(tampered)], **{"split-size": "1m"}))
    reader = pickle.loads(shipped)
    failed = []
    for partition in partitions:
        try:
            sum(batch.num_rows for batch in reader.read(partition))
        except AuthenticationError as exc:
            failed.append(str(exc))
    assert len(failed) == 1
    assert failed[0].startswith("icecrypt.parquet: row groups in bytes [") and f"of {tampered}: " in failed[0]


# --- through Spark ----------------------------------------------------------------------------------


@pytest.mark.spark
def test_spark_reads_every_row_once_with_ranges_and_many_files(icespark, kms_options, split_data):
    def read(**options):
        return (icespark.read.format("icecrypt.parquet").options(**kms_options)
                .option("keys.manifest", str(split_data.manifest)).options(**options).load(str(split_data.enc)))

    _, partitions, _ = _plan(_options(kms_options, split_data, **{"split-size": "1m"}))
    ranged = read(**{"split-size": "1m", "columns": "id"})
    assert ranged.rdd.getNumPartitions() == len(partitions) > BIG_ROWS // BIG_GROUP
    whole = read(columns="id,tag")
    assert whole.rdd.getNumPartitions() == 1
    plain = (icespark.read.format("icecrypt.parquet").option("encryption", "none").option("split-size", "1m")
             .load(str(split_data.plain)))
    assert sorted(ranged.toArrow().column("id").to_pylist()) == split_data.ids
    assert sorted(whole.toArrow().column("id").to_pylist()) == split_data.ids
    assert sorted(plain.select("id").toArrow().column("id").to_pylist()) == list(range(BIG_ROWS))
