"""Spark (local[2]) on an encrypted Iceberg table versus Spark's own Parquet on the same rows
in plaintext (issue 20, target: <= 1.3 x), side by side in one run.

The tables are benchmarks/spark_table.py's (same generator, same appends): an encrypted one
and a plaintext twin whose data files Spark's ``spark.read.parquet`` reads directly.  Reads:
``spark.read.format("icecrypt.iceberg")`` in a session built with
``icecrypt.spark.configure``, which icecrypt's analyzer rule routes to the native path
(Spark's Parquet reader, keys by the project's factory; ``icecrypt.spark.read_table`` is
the same path), the same with ``native=false`` (the Python path, for reference),
``icecrypt.spark.read_table`` (the native path without the Python source's schema call)
and ``spark.read.parquet`` on the plaintext files.  Queries: ``count()``,
``groupBy(category)`` with count/sum/max, two columns with ``qty < 10`` and ``sum(amount)``
(the Python path gets the columns as option ``columns``).  Write: 2M cached rows appended to
an encrypted table through ``icecrypt.iceberg``, routed to Spark's Parquet writer (zstd,
Iceberg's default codec, and snappy, the codec of Spark's writer; ``native=false``, the
Python source, for reference) versus ``df.write.parquet`` (snappy).  Then the
reads again with a deletion vector on every data file (5 % of the rows deleted; target
<= 1.5 x) against Spark's Parquet on the live rows in plaintext, in the twin's file layout
(and, for reference, as Spark's writer lays them out).  Median of the rounds (3; 7 with
deletion vectors, whose queries are short) after a warm-up round; the order of the
variants alternates every round.

    .venv/bin/python benchmarks/spark_native.py [--rows 3000000] [--write-rows 2000000] [--rounds 3]
                                                [--dv-rounds 7] [--no-deletes] [--master spark://127.0.0.1:7077]

For a standalone cluster on this host, start a master and a worker from the pyspark wheel
(``$SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1`` and
``... org.apache.spark.deploy.worker.Worker spark://127.0.0.1:7077 --cores 2``) and pass
``--master``; the driver then runs here and the queries in the worker's executor.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from spark_fixtures import spark_conf, stop_spark  # noqa: E402
from spark_table import MASTER, build, events  # noqa: E402

import icecrypt.spark  # noqa: E402
from icecrypt.kms.local import LocalKms  # noqa: E402
from icecrypt.table import EncryptedTable  # noqa: E402

TARGET = 1.3
DV_TARGET = 1.5  # a table with deletion vectors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--write-rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dv-rounds", type=int, default=7,
                        help="rounds of the queries with deletion vectors (short queries: more rounds, steadier medians)")
    parser.add_argument("--no-deletes", dest="deletes", action="store_false",
                        help="skip the queries on the tables with deletion vectors")
    parser.add_argument("--dir", default=None, help="where the tables go (default: a temporary directory)")
    parser.add_argument("--master", default="local[2]",
                        help="Spark master, e.g. spark://127.0.0.1:7077 for a standalone cluster on this host "
                             "(its executors share the tables' directory and this Python)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="icecrypt-spark-native-", dir=args.dir))
    try:
        kms = LocalKms.create_keystore(root / "keystore.json", [MASTER])
        started = time.perf_counter()
        enc, plain, arrow_bytes = build(root, args.rows, kms)
        print(f"tables: {args.rows:,} rows, {arrow_bytes / 1e6:.0f} MB of Arrow data (written in "
              f"{time.perf_counter() - started:.0f} s)")

        os.environ["PYSPARK_PYTHON"] = sys.executable
        builder = SparkSession.builder.master(args.master).appName("icecrypt-bench-spark-native")
        conf = spark_conf()
        if not args.master.startswith("local"):  # one executor with the 2 cores, as local[2] has
            conf.update({"spark.executor.cores": "2", "spark.cores.max": "2", "spark.executor.memory": "4g",
                         "spark.executorEnv.PYSPARK_PYTHON": sys.executable})
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = icecrypt.spark.configure(builder).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        try:
            icecrypt.spark.register(spark)
            kms_options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(root / "keystore.json")}
            plain_files = str(plain / "data" / "*.parquet")
            reads = {
                # routed to the native path by icecrypt's analyzer rule (the session is built with
                # icecrypt.spark.configure); native=true: an error rather than a silent Python read
                "native": lambda cols=None: spark.read.format("icecrypt.iceberg").options(**kms_options)
                .option("native", "true").load(str(enc)),
                "python": lambda cols=None: spark.read.format("icecrypt.iceberg").options(**kms_options)
                .option("native", "false").options(**({"columns": cols} if cols else {})).load(str(enc)),
                # the same native path without the Python source's schema() call (a Python worker)
                "read_table": lambda cols=None: icecrypt.spark.read_table(spark, str(enc), **kms_options,
                                                                          native="true"),
                "spark": lambda cols=None: spark.read.parquet(plain_files),
            }
            queries = {
                "count()": lambda read: read().count(),
                "groupBy(category)": lambda read: sorted(read().groupBy("category").agg(
                    F.count("*"), F.sum("qty"), F.max("amount")).collect()),
                "2 columns, qty < 10, sum(amount)": lambda read: round(read("amount,qty").select("amount", "qty")
                                                                       .where("qty < 10").agg(F.sum("amount"))
                                                                       .collect()[0][0], 3),
            }
            source = spark.createDataFrame(events(args.write_rows, 10**9).to_pandas()).cache()
            source.count()
            spark_codec = spark.conf.get("spark.sql.parquet.compression.codec")  # snappy
            # variant -> (table name prefix, codec, option native); None: Spark's plaintext write.
            # "native": routed to Spark's Parquet writer (icecrypt's factory encrypts each file)
            writes = {
                "native": ("w", None, "true"),
                "native, snappy": ("ws", spark_codec, "true"),  # the codec of Spark's writer
                "python": ("wp", None, "false"),  # the Python source
                "spark": None,
            }
            times: dict[tuple[str, str], list[float]] = {}
            results: dict[tuple[str, str], object] = {}
            for round_number in range(args.rounds + 1):  # round 0 warms up
                order = list(reads) if round_number % 2 == 0 else list(reversed(reads))
                for query, run in queries.items():
                    for variant in order:
                        t0 = time.perf_counter()
                        results[(query, variant)] = run(reads[variant])
                        elapsed = time.perf_counter() - t0
                        if round_number:
                            times.setdefault((query, variant), []).append(elapsed)
                for variant in (list(writes) if round_number % 2 == 0 else list(reversed(writes))):
                    if writes[variant] is None:
                        t0 = time.perf_counter()
                        source.write.mode("overwrite").parquet(str(root / f"p{round_number}"))
                    else:
                        prefix, codec, native = writes[variant]
                        # the table is created before the clock starts (Spark's write makes a directory)
                        table = _empty_table(root / f"{prefix}{round_number}", kms, codec)
                        t0 = time.perf_counter()
                        source.write.format("icecrypt.iceberg").options(**kms_options).option("native", native) \
                            .mode("append").save(table)
                    elapsed = time.perf_counter() - t0
                    if round_number:
                        times.setdefault(("write", variant), []).append(elapsed)
                t0 = time.perf_counter()
                reads["native"]()  # the analysis: planning on the driver and Spark's file index, no job
                if round_number:
                    times.setdefault(("plan", "native"), []).append(time.perf_counter() - t0)
                done = {key: value[-1] for key, value in times.items()} if round_number else {}
                print(f"round {round_number} {'(warm-up) ' if not round_number else ''}done: "
                      + ", ".join(f"{q} {v} {t:.2f}s" for (q, v), t in done.items()), flush=True)
            for query in queries:
                if len({repr(results[(query, v)]) for v in reads}) != 1:
                    raise SystemExit(f"{query}: the variants gave different results")
            for name in ("w1", "ws1", "wp1"):
                written = EncryptedTable.load(str(root / name), kms=kms)
                assert written.scan().count() == args.write_rows, name
                files = {t.file.path.rsplit("/", 1)[-1] for t in written.scan().plan_files()}
                assert all(f.startswith("part-") for f in files) == (name != "wp1"), (name, files)

            med = {key: statistics.median(value) for key, value in times.items()}
            print(f"\n{'query':<34} {'native s':>9} {'python s':>9} {'spark s':>8} {'native/spark':>13} "
                  f"{'python/spark':>13} {'read_table/spark':>17}")
            for query in queries:
                n, p, s = med[(query, "native")], med[(query, "python")], med[(query, "spark")]
                r = med[(query, "read_table")]
                print(f"{query:<34} {n:>9.2f} {p:>9.2f} {s:>8.2f} {n / s:>12.2f}x {p / s:>12.2f}x {r / s:>16.2f}x"
                      f"   {'ok' if n / s <= TARGET else 'ABOVE TARGET'} (target <= {TARGET})")
            print(f"{'load() alone (driver plan)':<34} {med[('plan', 'native')]:>9.2f}")
            s = med[("write", "spark")]
            print(f"write {args.write_rows:,} rows (append; Spark's writer: snappy):")
            for variant, label in (("native", "  zstd (Iceberg's default)"), ("native, snappy", "  snappy (Spark's codec)")):
                w = med[("write", variant)]
                p = med[("write", "python")] if variant == "native" else None
                shown = f"{p:.2f}" if p is not None else "-"
                print(f"{label:<34} {w:>9.2f} {shown:>9} {s:>8.2f} {w / s:>12.2f}x "
                      f"{f'{p / s:.2f}x' if p is not None else '-':>13}   "
                      f"{'ok' if w / s <= TARGET else 'ABOVE TARGET'} (target <= {TARGET})")
            if args.deletes:
                _with_deletion_vectors(spark, root, enc, plain, kms, reads, queries, args.dv_rounds)
        finally:
            stop_spark(spark)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _live_twin(plain: Path, live: Path) -> None:
    """The plaintext twin's data files without the deleted rows, one file each, written as
    the twin's were (pyarrow, same codec and row group size): the same layout as the
    encrypted table's files, so that only the deletes differ."""
    live.mkdir()
    for index, path in enumerate(sorted((plain / "data").glob("*.parquet"))):
        twin = pq.ParquetFile(path)
        first = twin.metadata.row_group(0)
        rows = twin.read().filter(pc.field("qty") >= 5)
        pq.write_table(rows, live / f"{index:05d}.parquet", compression=first.column(0).compression.lower(),
                       row_group_size=first.num_rows)


def _with_deletion_vectors(spark, root: Path, enc: Path, plain: Path, kms: LocalKms, reads: dict, queries: dict,
                           rounds: int) -> None:
    """The queries again after ``qty < 5`` (5 % of the rows, in every file) is deleted from
    both tables (merge-on-read: a deletion vector per data file), against Spark's Parquet
    on the live rows in plaintext, in the twin's layout (the target's baseline) and as
    Spark's writer lays them out (snappy, one file per task), and on the plaintext twin's
    files (all rows: Spark cannot apply Iceberg's deletes)."""
    for location, table_kms in ((enc, kms), (plain, None)):
        EncryptedTable.load(str(location), kms=table_kms).delete("qty < 5")
    live, written = root / "live", str(root / "live-spark")
    _live_twin(plain, live)
    spark.read.parquet(str(plain / "data" / "*.parquet")).where("qty >= 5").write.parquet(written)
    variants = {"native": reads["native"], "python": reads["python"],
                "spark": lambda cols=None: spark.read.parquet(str(live)),
                "spark, Spark-written": lambda cols=None: spark.read.parquet(written),
                "spark, all rows": reads["spark"]}
    times: dict[tuple[str, str], list[float]] = {}
    results: dict[tuple[str, str], object] = {}
    for round_number in range(rounds + 1):
        order = list(variants) if round_number % 2 == 0 else list(reversed(variants))
        for query, run in queries.items():
            for variant in order:
                t0 = time.perf_counter()
                results[(query, variant)] = run(variants[variant])
                if round_number:
                    times.setdefault((query, variant), []).append(time.perf_counter() - t0)
    for query in queries:
        if len({repr(results[(query, v)]) for v in ("native", "python", "spark", "spark, Spark-written")}) != 1:
            raise SystemExit(f"{query} after deletes: the variants gave different results")
    med = {key: statistics.median(value) for key, value in times.items()}
    print(f"\nwith a deletion vector on every data file (5 % of the rows deleted; target <= {DV_TARGET}):")
    print(f"{'query':<34} {'native s':>9} {'python s':>9} {'spark s':>8} {'native/spark':>13} {'python/spark':>13} "
          f"{'Spark-written s':>16} {'native/that':>12} {'spark all rows s':>17}")
    for query in queries:
        n, p, sp, sw, a = (med[(query, v)] for v in ("native", "python", "spark", "spark, Spark-written",
                                                      "spark, all rows"))
        print(f"{query:<34} {n:>9.2f} {p:>9.2f} {sp:>8.2f} {n / sp:>12.2f}x {p / sp:>12.2f}x {sw:>16.2f} "
              f"{n / sw:>11.2f}x {a:>17.2f}   {'ok' if n / sp <= DV_TARGET else 'ABOVE TARGET'}")


def _empty_table(path: Path, kms: LocalKms, codec: str | None = None) -> str:
    properties = {"write.parquet.compression-codec": codec} if codec else None
    EncryptedTable.create(str(path), events(1, 0).schema, kms=kms, table_key_id=MASTER, properties=properties)
    return str(path)


if __name__ == "__main__":
    main()
