"""Spark SQL through icecrypt's catalog (``org.icecrypt.spark.SparkCatalog``, issue 33):
the same statements on an encrypted table, on a plaintext table of the same catalog, and,
for the reads, on a table of Spark's own (``USING parquet`` in the session catalog), over
the same rows, side by side in one run.

Statements (``t`` stands for each table):

* ``INSERT INTO t SELECT * FROM src``: N rows from a cached DataFrame into an empty table
  (created before the clock starts, dropped after), Spark's Parquet writer in every case
  (Iceberg's default codec, zstd, in the catalog's tables; Spark's, snappy, in its own);
* a selective ``SELECT``: ``SELECT id, amount FROM t WHERE id BETWEEN a AND a + 999``
  collected (min/max statistics prune most files and row groups);
* an aggregation: ``SELECT category, count(*), sum(amount), max(qty) FROM t GROUP BY
  category`` collected;
* a 1 % ``MERGE INTO`` (``WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT
  *``: half of the source's rows update a row, half are new) on the table the INSERT just
  filled, for the two tables of icecrypt's catalog (Spark's own Parquet tables have no
  MERGE), three times: the updated ids from the first quarter of the table (every 50th:
  Spark's group filter keeps the files holding them), then spread evenly over the table
  (every 200th id: every file holds one), copy-on-write (every file rewritten) and, after
  ``write.merge.mode`` is set to ``merge-on-read``, merge-on-read (deletion vectors and
  the new rows only).

Targets (issue 33): reads, INSERT and MERGE INTO within 1.3 x of the plaintext table of
the same catalog; the reads are also set against Spark's own Parquet table.  Median of the rounds
after a warm-up round; the order of the variants alternates every round.

    .venv/bin/python benchmarks/spark_sql.py [--rows 10000000] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from spark_fixtures import spark_conf, stop_spark  # noqa: E402

import icecrypt.spark  # noqa: E402
from icecrypt.kms.local import LocalKms  # noqa: E402

TARGET = 1.3
CATALOG = "enc"
TABLES = {  # variant -> (table name, CREATE TABLE suffix)
    "encrypted": (f"{CATALOG}.db.t_enc", "USING iceberg TBLPROPERTIES ('encryption.key-id'='master')"),
    "plaintext": (f"{CATALOG}.db.t_plain", "USING iceberg"),
    "spark parquet": ("spark_catalog.default.t_parquet", "USING parquet"),
}
COLUMNS = "id BIGINT, category INT, qty INT, amount DOUBLE, note STRING"


def source(spark: SparkSession, rows: int):
    """N rows, the same every run (no random numbers: hashes of the id)."""
    h = F.abs(F.xxhash64("id"))
    return spark.range(rows).select(
        F.col("id"),
        (h % 1000).cast("int").alias("category"),
        (h % 100).cast("int").alias("qty"),
        ((h % 100_000) / 100.0).alias("amount"),
        F.concat(F.lit("n-"), (h % 50_000).cast("string")).alias("note"),
    )


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the medians and ratios here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="icecrypt-bench-sql-"))
    try:
        keystore = work / "keystore.json"
        LocalKms.create_keystore(keystore, ["master"])
        builder = SparkSession.builder.master("local[2]").appName("icecrypt-bench-sql")
        for key, value in {**spark_conf(), "spark.driver.memory": "4g",
                           "spark.sql.warehouse.dir": str(work / "spark-warehouse")}.items():
            builder = builder.config(key, value)
        settings = {"type": "sql", "warehouse": str(work / "warehouse"), "encryption.kms-type": "local",
                    "encryption.kms.local.keystore": str(keystore)}
        builder = builder.config(f"spark.sql.catalog.{CATALOG}", "org.icecrypt.spark.SparkCatalog")
        for key, value in settings.items():
            builder = builder.config(f"spark.sql.catalog.{CATALOG}.{key}", value)
        spark = icecrypt.spark.configure(builder).getOrCreate()
        icecrypt.spark.register(spark)
        try:
            results = run(spark, args.rows, args.rounds)
        finally:
            stop_spark(spark)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results, args)


def run(spark: SparkSession, rows: int, rounds: int) -> dict[str, dict[str, float]]:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.db")
    src = source(spark, rows).cache()
    src.count()
    src.createOrReplaceTempView("src")
    changes = max(2, rows // 100)  # 1 %: half updates, half inserts (ids past the end)

    def changes_view(view: str, updated: str, inserted_from: int) -> None:
        spark.sql(f"SELECT * FROM src WHERE {updated} LIMIT {changes // 2}").selectExpr(
            "id", "category", "qty + 1 AS qty", "amount", "note").union(
            spark.sql(f"SELECT id + {inserted_from} AS id, category, qty, amount, note FROM src "
                      f"LIMIT {changes - changes // 2}")
        ).cache().createOrReplaceTempView(view)

    changes_view("changes", "id % 50 = 0", rows)  # the first quarter of the ids (LIMIT keeps the first)
    spread = max(2, rows // (changes // 2))
    changes_view("spread_cow", f"id % {spread} = 1", 2 * rows)  # every file
    changes_view("spread_mor", f"id % {spread} = 2", 3 * rows)
    merge = ("MERGE INTO {t} t USING {s} s ON t.id = s.id "
             "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
    merges = (("MERGE 1 % (1st qtr)", "changes", None), ("MERGE 1 % spread", "spread_cow", None),
              ("MERGE 1 % spread MoR", "spread_mor", "merge-on-read"))
    times: dict[str, dict[str, list[float]]] = {}

    def record(statement: str, variant: str, seconds: float, warm: bool) -> None:
        if not warm:
            times.setdefault(statement, {}).setdefault(variant, []).append(seconds)

    variants = list(TABLES)
    for round_ in range(rounds + 1):  # round 0 warms up
        warm = round_ == 0
        order = variants if round_ % 2 else variants[::-1]
        for variant in order:
            name, suffix = TABLES[variant]
            scratch = name + "_insert"
            spark.sql(f"DROP TABLE IF EXISTS {scratch}")
            spark.sql(f"CREATE TABLE {scratch} ({COLUMNS}) {suffix}")
            record("INSERT", variant, timed(lambda s=scratch: spark.sql(f"INSERT INTO {s} SELECT * FROM src")), warm)
            if variant != "spark parquet":
                for n, (statement, view, mode) in enumerate(merges, 1):
                    if mode is not None:
                        spark.sql(f"ALTER TABLE {scratch} SET TBLPROPERTIES ('write.merge.mode'='{mode}')")
                    record(statement, variant,
                           timed(lambda t=scratch, v=view: spark.sql(merge.format(t=t, s=v))), warm)
                    if not warm and spark.table(scratch).count() != rows + n * (changes - changes // 2):
                        raise SystemExit(f"{statement}: {variant} table holds the wrong number of rows")
            spark.sql(f"DROP TABLE {scratch} PURGE" if variant != "spark parquet" else f"DROP TABLE {scratch}")
    for variant, (name, suffix) in TABLES.items():  # the tables the reads read: the same rows
        spark.sql(f"DROP TABLE IF EXISTS {name}")
        spark.sql(f"CREATE TABLE {name} ({COLUMNS}) {suffix}")
        spark.sql(f"INSERT INTO {name} SELECT * FROM src ORDER BY id")
    start = rows // 3
    queries = {
        "selective SELECT": "SELECT id, amount FROM {t} WHERE id BETWEEN %d AND %d" % (start, start + 999),
        "aggregation": "SELECT category, count(*), sum(amount), max(qty) FROM {t} GROUP BY category",
    }
    expected: dict[str, object] = {}
    for round_ in range(rounds + 1):
        warm = round_ == 0
        order = variants if round_ % 2 else variants[::-1]
        for query, text in queries.items():
            for variant in order:
                statement = text.format(t=TABLES[variant][0])
                found: list = []
                record(query, variant, timed(lambda s=statement: found.extend(spark.sql(s).collect())), warm)
                digest = sorted(tuple(r) for r in found)
                if expected.setdefault(query, digest) != digest:
                    raise SystemExit(f"{query}: {variant} answered other rows than the first variant")
    src.unpersist()
    return {statement: {variant: statistics.median(values) for variant, values in by.items()}
            for statement, by in times.items()}


def report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    print(f"\nSpark SQL through icecrypt's catalog, {args.rows:,} rows, local[2], median of {args.rounds} rounds")
    print(f"{'statement':<20} {'encrypted':>10} {'plaintext':>10} {'spark pq':>10} {'enc/plain':>10} {'enc/pq':>8}")
    ratios = {}
    for statement, by in results.items():
        enc, plain, pq = by.get("encrypted"), by.get("plaintext"), by.get("spark parquet")
        ratio = enc / plain if enc and plain else None
        ratio_pq = enc / pq if enc and pq else None
        ratios[statement] = {"encrypted/plaintext": ratio, "encrypted/spark parquet": ratio_pq}
        cells = [f"{v:>9.2f}s" if v is not None else f"{'-':>10}" for v in (enc, plain, pq)]
        print(f"{statement:<20} {' '.join(cells)} {ratio:>9.2f}x " + (f"{ratio_pq:>7.2f}x" if ratio_pq else f"{'-':>8}"))
    worst = max(r["encrypted/plaintext"] for r in ratios.values())
    print(f"worst encrypted/plaintext: {worst:.2f} x (target <= {TARGET} x): {'met' if worst <= TARGET else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": args.rows, "rounds": args.rounds, "seconds": results,
                                               "ratios": ratios}, indent=2) + "\n")


if __name__ == "__main__":
    main()
