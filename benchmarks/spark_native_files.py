"""A native read of many small files: an encrypted table of ``--files`` data files (default
3,000, ``--rows`` rows each, identity-partitioned) read by ``spark.read.format("icecrypt.iceberg")``
on the native path (Spark's own Parquet reader, icecrypt's key factory), against Spark's
``spark.read.parquet`` over the same number of plaintext files with the same rows (a twin
written by pyarrow, one file per partition value, each given to Spark as a path of its own).

Spark's read goes through its file listing: past ``spark.sql.sources.parallelPartitionDiscovery
.threshold`` (32 paths) a job of one task per file, which is most of such a read.  The
native read lists nothing: its file index holds the planned files' statuses.
Query: ``sum(id)``; interleaved, one warm-up each, then the median of ``--repeat``.

    .venv/bin/python benchmarks/spark_native_files.py [--files 3000] [--rows 5] [--repeat 3]

The host is shared: figures vary from run to run; the ratio is the point.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pyiceberg.partitioning import PartitionField, PartitionSpec  # noqa: E402
from pyiceberg.transforms import IdentityTransform  # noqa: E402
from spark_fixtures import start_spark, stop_spark  # noqa: E402

from icecrypt.kms.local import LocalKms  # noqa: E402
from icecrypt.table import EncryptedTable  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="icecrypt-native-files-") as tmp:
        root = Path(tmp)
        keystore = root / "keystore.json"
        LocalKms.create_keystore(keystore, ["master"])
        n = args.files * args.rows
        rows = pa.table({"id": pa.array(range(n), pa.int64()), "p": pa.array([i % args.files for i in range(n)], pa.int64())})
        spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="p"))
        table = EncryptedTable.create(str(root / "enc"), rows.schema, kms=LocalKms(keystore), table_key_id="master",
                                      partition_spec=spec)
        table.append(rows)
        assert len(list(table.scan().plan_files())) == args.files
        plain = root / "plain"
        plain.mkdir()
        paths = []
        for p in range(args.files):
            path = plain / f"p={p}-00000.parquet"
            pq.write_table(rows.filter(pc.equal(rows["p"], p)), path)
            paths.append(str(path))
        spark = start_spark("icecrypt-native-files")
        try:
            import icecrypt.spark

            icecrypt.spark.register(spark)
            kms = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
            reads = {
                "native": lambda: spark.read.format("icecrypt.iceberg").options(**kms).load(table.location),
                "spark": lambda: spark.read.parquet(*paths),
            }
            want = n * (n - 1) // 2
            times: dict[str, list[float]] = {name: [] for name in reads}
            for round_ in range(args.repeat + 1):
                for name, read in reads.items():
                    start = time.perf_counter()
                    got = read().selectExpr("sum(id)").collect()[0][0]
                    took = time.perf_counter() - start
                    assert got == want, (name, got, want)
                    if round_:
                        times[name].append(took)
            native, base = (statistics.median(times[name]) for name in ("native", "spark"))
            print(f"{args.files} files x {args.rows} rows, sum(id), median of {args.repeat}: "
                  f"native {native:.2f} s, spark.read.parquet {base:.2f} s: {native / base:.2f}x")
        finally:
            stop_spark(spark)


if __name__ == "__main__":
    main()
