"""Planning an ``icecrypt.parquet`` read of many small encrypted files (issue 12, section 3).

Writes ``--files`` (default 10 000) encrypted Parquet files of a few rows each with
:func:`icecrypt.parquet.write_table` (into pyarrow's in-memory file system, then copied
to a temporary directory: the atomic, fsynced local write would dominate generation) and
one key manifest, then, in one Spark session with the tests' settings
(tests/spark_fixtures.py, ``local[2]``), times

* ``load`` -- ``spark.read.format(...).load(dir)``: listing + ``schema()`` (one footer);
* ``plan`` -- ``df.rdd.getNumPartitions()``: ``reader()`` + ``partitions()``;

for the current planner (``icecrypt.parquet``: by file size, no footer opened) and for
the previous one (``icecrypt.parquet.footers``: this file's copy of the old ``plan``,
which decrypts every footer on the driver to pack row groups), interleaved, after one
warm-up of each (Python workers started, key manifest unwrapped and cached).  Medians
are printed with the ratio.  The footers each planner opens are counted in this process
too (:data:`icecrypt.spark._parquet.STATS`, driving the data source classes directly),
and one ``count()`` of each checks that both read every row.

    .venv/bin/python benchmarks/spark_parquet_planning.py [--files 10000] [--rows 5] [--repeat 3]

The host is shared: figures vary from run to run; the ratio is the point.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from spark_fixtures import start_spark, stop_spark

from icecrypt import parquet
from icecrypt.keys import EncryptionManager
from icecrypt.keys.manifest import write_key_manifest
from icecrypt.kms.local import LocalKms
from icecrypt.spark._common import OPT_BATCH_SIZE, DataFile, pack, positive_int, split_size
from icecrypt.spark._parquet import DEFAULT_BATCH_SIZE, STATS, ParquetDataSource, ParquetReader, _open
from icecrypt.spark._read import FilePartition

MASTER = "master"


# --- the previous planner (src/icecrypt/spark/_parquet.py before issue 12), verbatim --------


class FootersReader(ParquetReader):
    source = "icecrypt.parquet.footers"

    def plan(self, files: list[DataFile]) -> list[FilePartition]:
        target = split_size(self.options, minimum=1)
        row_groups = []
        for file in files:
            with _open(file, self.key(file)) as handle:
                metadata = handle.metadata
                for index in range(metadata.num_row_groups):
                    group = metadata.row_group(index)
                    size = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
                    row_groups.append((size, (file, index)))
        partitions = []
        for number, group in enumerate(pack(row_groups, target)):
            pieces: list[tuple[DataFile, tuple[int, ...]]] = []
            for file, index in group:
                if pieces and pieces[-1][0] is file:
                    pieces[-1] = (file, (*pieces[-1][1], index))
                else:
                    pieces.append((file, (index,)))
            partitions.append(FilePartition(number, pieces))
        return partitions

    def read_piece(self, piece: tuple[DataFile, tuple[int, ...]]) -> Iterator[pa.RecordBatch]:
        file, row_groups = piece
        batch_size = positive_int(self.options, OPT_BATCH_SIZE, DEFAULT_BATCH_SIZE)
        with _open(file, self.key(file)) as handle:
            yield from handle.iter_batches(batch_size=batch_size, row_groups=list(row_groups),
                                           columns=self.projection.columns, use_threads=False)

    def describe(self, piece: tuple[DataFile, tuple[int, ...]]) -> str:
        file, row_groups = piece
        return f"row groups {row_groups[0]}..{row_groups[-1]} of {file.uri}"


class FootersDataSource(ParquetDataSource):
    reader_class = FootersReader

    @classmethod
    def name(cls) -> str:
        return "icecrypt.parquet.footers"


# --- data ----------------------------------------------------------------------------------------


def generate(directory: Path, files: int, rows: int, kms: LocalKms) -> tuple[Path, int]:
    """``files`` encrypted Parquet files of ``rows`` rows (one row group) and their key manifest."""
    data = directory / "data"
    data.mkdir(parents=True)
    memory = pafs._MockFileSystem()
    memory.create_dir("m")
    keys = {}
    for index in range(files):
        ids = pa.array(range(index * rows, (index + 1) * rows), pa.int64())
        table = pa.table({"id": ids, "amount": pc.multiply(ids, 0.5), "tag": pa.array([f"t{index % 97}"] * rows)})
        km = parquet.write_table(table, "m/f.parquet", filesystem=memory)
        with memory.open_input_stream("m/f.parquet") as source:
            content = source.read()
        memory.delete_file("m/f.parquet")
        path = data / f"part-{index:05d}.parquet"
        path.write_bytes(content)
        keys[str(path)] = km
    manifest = directory / "keys.json"
    write_key_manifest(manifest, keys, EncryptionManager(kms, MASTER))
    return manifest, files * rows


def in_process_footers(source_cls, options: dict[str, str]) -> tuple[int, int, float]:
    """(footers opened for schema() + reader(), footers opened by partitions(), partitions() seconds)."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    STATS.reset()
    source = source_cls(CaseInsensitiveDict(options))
    reader = source.reader(source.schema())
    before = STATS.footers
    start = time.perf_counter()
    reader.partitions()
    return before, STATS.footers - before, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="work directory (default: a new temporary one, removed at the end)")
    args = parser.parse_args()

    root = Path(args.dir or tempfile.mkdtemp(prefix="icecrypt-parquet-planning-"))
    try:
        keystore = root / "keystore.json"
        LocalKms.create_keystore(keystore, [MASTER])
        start = time.perf_counter()
        manifest, rows = generate(root, args.files, args.rows, LocalKms(keystore))
        size = sum(p.stat().st_size for p in (root / "data").iterdir())
        print(f"generated {args.files} encrypted Parquet files ({rows} rows, {size / 1e6:.1f} MB) "
              f"and their key manifest in {time.perf_counter() - start:.1f} s")
        options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore),
                   "encryption.key-id": MASTER, "keys.manifest": str(manifest)}
        directory = str(root / "data")

        for label, cls in (("new (by size)", ParquetDataSource), ("old (footers)", FootersDataSource)):
            fixed, planned, seconds = in_process_footers(cls, {**options, "path": directory})
            print(f"in process, {label}: footers opened for schema()+reader() {fixed}, "
                  f"by partitions() {planned} ({seconds:.3f} s)")

        spark = start_spark("icecrypt-parquet-planning")
        try:
            spark.dataSource.register(ParquetDataSource)
            spark.dataSource.register(FootersDataSource)
            variants = {"new": "icecrypt.parquet", "old": "icecrypt.parquet.footers"}

            def run(fmt: str) -> tuple[float, float, int]:
                t0 = time.perf_counter()
                df = spark.read.format(fmt).options(**options).load(directory)
                t1 = time.perf_counter()
                partitions = df.rdd.getNumPartitions()
                t2 = time.perf_counter()
                return t1 - t0, t2 - t1, partitions

            for fmt in variants.values():  # warm-up: workers, manifest unwrapping
                run(fmt)
            times: dict[str, list[tuple[float, float, int]]] = {name: [] for name in variants}
            for _ in range(args.repeat):
                for name, fmt in variants.items():
                    times[name].append(run(fmt))

            print(f"\nSpark local[2], {args.files} files, median of {args.repeat} runs after a warm-up:")
            medians = {}
            for name in variants:
                load = statistics.median(t[0] for t in times[name])
                plan = statistics.median(t[1] for t in times[name])
                medians[name] = (load, plan)
                runs = ", ".join(f"{a + b:.2f}" for a, b, _ in times[name])
                print(f"  {name:3s} ({variants[name]}): load (schema) {load:6.3f} s  plan (getNumPartitions) "
                      f"{plan:6.3f} s  total {load + plan:6.3f} s  partitions {times[name][0][2]}  [runs: {runs}]")
            old, new = medians["old"], medians["new"]
            print(f"  planning ratio old/new: {old[1] / new[1]:.1f}x   load+plan ratio: {sum(old) / sum(new):.1f}x")

            spark.range(1).count()  # the session's first job pays for starting up
            for name, fmt in variants.items():
                t0 = time.perf_counter()
                count = spark.read.format(fmt).options(**options).load(directory).count()
                print(f"  count() {name}: {count} rows ({'ok' if count == rows else 'WRONG'}) "
                      f"in {time.perf_counter() - t0:.2f} s")
        finally:
            stop_spark(spark)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
