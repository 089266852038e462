"""The main job of the quick start (``make demo``), on the embedded default.

A local keystore KMS and a local warehouse with the embedded SQLite catalog
(``<warehouse>/catalog.db``, which PyIceberg's ``SqlCatalog`` reads too): a few million
generated orders go into an encrypted Iceberg table in several commits (natively encrypted Parquet data files, AGS1
manifests and manifest lists, the manifest-list keys wrapped by a KEK, the KEK by the
master key), PySpark reads it back (``icecrypt.iceberg``, in a session built with
``icecrypt.spark.configure``: Spark's own Parquet reader decrypts the data files; the same
read through Python tasks is timed beside it), every file is verified, the KEK
and then the master key are rotated, and the table is read again through the new master
key only.  An encrypted Avro dataset written and read by PySpark (``icecrypt.avro``)
and a one-byte tamper drill close it.

    python -m icecrypt.demo [--dir demo-output] [--rows 3000000] [--commits 3] [--force]

The work directory is recreated on each run.  The demo leaves a marker file in it and
removes an existing directory only when it holds that marker (or is empty): anything
else is refused unless ``--force`` says to remove it anyway.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icecrypt import openssl_version
from icecrypt.kms.local import LocalKms

#: left in the work directory: a directory holding it was made by the demo, and may go
MARKER = ".icecrypt-demo"
MASTER_KEY_IDS = ("demo-master-1", "demo-master-2")  # the second is added at rotation
COUNTRIES = np.array(["DE", "FR", "US", "JP", "BR", "IN", "NG", "SE", "CA", "AU"])
STATUSES = np.array(["paid", "shipped", "returned", "cancelled"])

SCHEMA = pa.schema([
    pa.field("order_id", pa.int64(), nullable=False),
    pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("customer", pa.string(), nullable=False),
    pa.field("country", pa.string(), nullable=False),
    pa.field("amount", pa.decimal128(12, 2), nullable=False),
    pa.field("quantity", pa.int32(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("note", pa.string()),
])  # fmt: skip


def generate_orders(first: int, rows: int, seed: int) -> pa.Table:
    """``rows`` orders with ids from ``first``: realistic shapes, skewed countries, nulls."""
    rng = np.random.default_rng(seed)
    ids = np.arange(first, first + rows, dtype=np.int64)
    ts = 1_700_000_000_000_000 + ids * 37_000 + rng.integers(0, 30_000, rows)
    customers = pc.binary_join_element_wise("cust-", pa.array(rng.integers(0, 1_000_000, rows).astype(str)), "")
    country = COUNTRIES[np.minimum(rng.geometric(0.25, rows) - 1, len(COUNTRIES) - 1)]
    cents = rng.integers(100, 500_000, rows)
    notes = pa.array(np.where(ids % 9 == 0, "gift wrap", ""), pa.string())
    notes = pc.if_else(pc.equal(notes, ""), pa.scalar(None, pa.string()), notes)
    return pa.table(
        [
            ids,
            pa.array(ts, pa.timestamp("us", tz="UTC")),
            customers,
            pa.array(country),
            _cents_to_decimal(cents),
            pa.array(rng.integers(1, 20, rows).astype(np.int32)),
            pa.array(STATUSES[rng.integers(0, len(STATUSES), rows)]),
            notes,
        ],
        schema=SCHEMA,
    )


def _cents_to_decimal(cents: np.ndarray) -> pa.Array:
    """Integer cents -> decimal(12, 2), exactly (decimal arithmetic, no floats)."""
    whole = pa.array(cents.astype(np.int32)).cast(pa.decimal128(10, 0))
    return pc.divide(whole, pa.scalar(100, pa.decimal128(3, 0))).cast(pa.decimal128(12, 2))


def start_spark():
    """A local Spark session on every core, built as the Spark guide says: with
    :func:`icecrypt.spark.configure` (icecrypt's jar and session extension, so reads and
    writes of ``icecrypt.iceberg`` take Spark's own Parquet reader and writer, and Python
    workers that run this interpreter), the sources registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import icecrypt.spark

    builder = (
        SparkSession.builder.master("local[*]").appName("icecrypt-demo")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4").config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
    )  # fmt: skip
    spark = icecrypt.spark.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    icecrypt.spark.register(spark)
    return spark


def count_by_country(df) -> tuple[int, dict[str, int], float, bool]:
    """(rows, rows per country, seconds for both queries, whether Spark's own Parquet reader
    read them: the native path, rather than the Python data source's tasks)."""
    t0 = time.perf_counter()
    count = df.count()
    by_country = {r["country"]: r["n"] for r in df.groupBy("country").count().withColumnRenamed("count", "n").collect()}
    seconds = time.perf_counter() - t0
    native = "BatchScan icecrypt.iceberg" not in df._jdf.queryExecution().executedPlan().toString()
    return count, by_country, seconds, native


def file_heads(root: str) -> dict[str, int]:
    """How many files under ``root`` start with each 4-byte magic."""
    heads: dict[str, int] = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith((".parquet", ".avro", ".puffin")):
                with open(os.path.join(folder, name), "rb") as f:
                    magic = f.read(4).decode("ascii", "replace")
                heads[magic] = heads.get(magic, 0) + 1
    return heads


def prepare_work_dir(work: str, *, force: bool = False) -> None:
    """Make ``work`` an empty directory holding only the demo's marker file.

    An existing directory is removed only if the demo made it (it holds :data:`MARKER`),
    it is empty, or ``force``; a symbolic link or a file there is never removed.
    ValueError (nothing touched) otherwise."""
    if os.path.islink(work) or (os.path.lexists(work) and not os.path.isdir(work)):
        raise ValueError(f"{work} exists and is not a directory: not removing it; choose another --dir")
    if os.path.isdir(work):
        names = os.listdir(work)
        if names and MARKER not in names and not force:
            raise ValueError(
                f"{work} is not empty and was not made by the demo (no {MARKER} file in it): not removing it; "
                "choose another --dir, or pass --force to remove it and everything in it"
            )
        shutil.rmtree(work)
    os.makedirs(work)
    with open(os.path.join(work, MARKER), "x", encoding="utf-8") as f:
        f.write("made by python -m icecrypt.demo; the next run removes this directory\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="demo-output",
                        help="work directory (recreated; an existing one only if the demo made it)")
    parser.add_argument("--rows", type=int, default=3_000_000, help="rows of generated orders")
    parser.add_argument("--commits", type=int, default=3, help="appends that write them")
    parser.add_argument("--force", action="store_true", help="remove an existing --dir the demo did not make")
    args = parser.parse_args(argv)
    work = os.path.abspath(args.dir)
    try:
        prepare_work_dir(work, force=args.force)
    except ValueError as exc:
        parser.exit(2, f"icecrypt demo: {exc}\n")

    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    from icecrypt import avro
    from icecrypt.catalog import load_catalog
    from icecrypt.keys import EncryptionManager, write_key_manifest
    from icecrypt.table import EncryptedTable

    keystore = os.path.join(work, "keystore.json")
    warehouse = os.path.join(work, "warehouse")
    location = os.path.join(warehouse, "sales", "orders")
    print(f"icecrypt demo in {work} ({openssl_version()})")
    ok = True

    # 1. The embedded KMS: a 0600 keystore file with two master keys.
    kms = LocalKms.create_keystore(keystore, key_ids=MASTER_KEY_IDS[:1])
    kms_options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": keystore}
    print(f"1. keystore {os.path.basename(keystore)} (mode {oct(os.stat(keystore).st_mode & 0o777)}), "
          f"master key {MASTER_KEY_IDS[0]!r}")

    # 2. An encrypted, partitioned format-version 3 table in the embedded SQLite catalog,
    #    filled in several commits (each one a compare-and-swap in the catalog).
    spec = PartitionSpec(PartitionField(source_id=4, field_id=1000, transform=IdentityTransform(), name="country"))
    catalog = load_catalog("demo", warehouse=warehouse, kms=kms)
    catalog.create_namespace("sales")
    table = catalog.create_table("sales.orders", SCHEMA, table_key_id=MASTER_KEY_IDS[0], partition_spec=spec)
    per_commit = -(-args.rows // args.commits)
    generated = write_seconds = 0.0
    expected_total = 0
    for i in range(args.commits):
        rows = min(per_commit, args.rows - i * per_commit)
        t0 = time.perf_counter()
        batch = generate_orders(i * per_commit, rows, seed=i)
        generated += time.perf_counter() - t0
        expected_total += rows
        t0 = time.perf_counter()
        table.append(batch)
        write_seconds += time.perf_counter() - t0
        del batch
    heads = file_heads(location)
    print(f"2. {args.rows:,} orders appended in {args.commits} commits: {args.rows / write_seconds:,.0f} rows/s "
          f"(generation {generated:.1f} s apart); files by magic: {heads}")
    ok &= set(heads) <= {"PARE", "AGS1"}

    # 2b. PyIceberg's own SqlCatalog on the same database sees the table where we committed it.
    from pyiceberg.catalog.sql import SqlCatalog

    theirs = SqlCatalog("demo", uri=catalog.uri)
    listed = theirs.list_tables("sales")
    same = theirs.load_table("sales.orders").metadata_location == table.metadata_store.to_recorded(table.metadata_location)
    print(f"2b. PyIceberg's SqlCatalog on {os.path.relpath(catalog.uri.removeprefix('sqlite:///'), work)} lists "
          f"{listed}, at our current metadata file: {same}")
    ok &= listed == [("sales", "orders")] and same

    # 3. The key chain of the current snapshot, as recorded in metadata.json.
    current = next(s for s in table.metadata["snapshots"] if s["snapshot-id"] == table.current_snapshot_id)
    keys = {k["key-id"]: k for k in table.metadata.get("encryption-keys", [])}
    ml_key = keys[current["key-id"]]
    print(f"3. snapshot {table.current_snapshot_id}: manifest-list key {ml_key['key-id']} -> KEK "
          f"{ml_key['encrypted-by-id']} -> master key {table.properties['encryption.key-id']!r}")

    # 4. PySpark reads the table: every file decrypted in the executors, by Spark's own
    #    Parquet reader (the native path); then the same through the Python data source.
    spark = start_spark()
    try:
        spark.range(1000).count()  # the JVM's first job, so that neither read pays for it
        read = spark.read.format("icecrypt.iceberg").options(**kms_options)
        count, by_country, spark_seconds, native = count_by_country(read.load(table.metadata_location))
        top = sorted(by_country.items(), key=lambda kv: -kv[1])[:3]
        python_count, python_by_country, python_seconds, _ = count_by_country(
            read.option("native", "false").load(table.metadata_location))
        print(f"4. PySpark (local[*]) read {count:,} rows, count + groupBy in {spark_seconds:.1f} s "
              f"({count / spark_seconds:,.0f} rows/s) with Spark's own Parquet reader"
              f"{'' if native else ' (NOT TAKEN)'}; top countries {top}\n"
              f"   the same through Python tasks (option native=false, or a session built without "
              f"icecrypt.spark.configure): {python_seconds:.1f} s ({python_count / python_seconds:,.0f} rows/s, "
              f"{python_seconds / spark_seconds:.1f}x the time)")
        ok &= native and count == python_count == expected_total and by_country == python_by_country

        # 5. Authenticate every reachable file of every snapshot.
        t0 = time.perf_counter()
        report = table.verify()
        verify_seconds = time.perf_counter() - t0
        print(f"5. verify: {report.summary()} in {verify_seconds:.1f} s")
        ok &= report.ok

        # 5b. Files outside a table: encrypted Avro files written from Python, their keys in a
        #     key manifest (wrapped by a KEK under the master key), split and read by PySpark.
        avro_dir = os.path.join(work, "avro")
        os.makedirs(avro_dir)
        avro_rows = min(args.rows, 400_000)
        sample = table.scan(row_filter=f"order_id < {avro_rows}").to_arrow()
        t0 = time.perf_counter()
        written = {}
        for i, part in enumerate(sample.to_batches(max_chunksize=-(-avro_rows // 4))):
            path = os.path.join(avro_dir, f"orders-{i}.avro")
            written[path] = avro.write([part], path)
        avro_seconds = time.perf_counter() - t0
        manifest = os.path.join(avro_dir, "_icecrypt_keys.json")
        write_key_manifest(manifest, written, EncryptionManager(kms, MASTER_KEY_IDS[0]))
        t0 = time.perf_counter()
        avro_df = (spark.read.format("icecrypt.avro").options(**kms_options)
                   .option("encryption.key-id", MASTER_KEY_IDS[0])  # the manifest must be under it
                   .option("keys.manifest", manifest).option("split-size", "1m").load(avro_dir))
        avro_count = avro_df.count()
        partitions = avro_df.rdd.getNumPartitions()
        read_seconds = time.perf_counter() - t0
        print(f"5b. {len(written)} encrypted Avro files ({avro_rows:,} rows, {avro_rows / avro_seconds:,.0f} rows/s written); "
              f"PySpark read them in {partitions} splits: {avro_count:,} rows, {avro_count / read_seconds:,.0f} rows/s")
        ok &= avro_count == sample.num_rows == avro_rows

        # 6. Rotate the KEK, append, then move every KEK under a new master key and
        #    retire the old one from the keystore.
        kek = table.rotate_keys()["kek_id"]
        table.append(generate_orders(args.rows, 1000, seed=99))
        kms.add_key(MASTER_KEY_IDS[1])
        moved = table.rotate_keys(new_kek=False, new_master_key_id=MASTER_KEY_IDS[1])
        kms.remove_key(MASTER_KEY_IDS[0])
        print(f"6. new KEK {kek}; appended 1,000 rows; {len(moved['rewrapped_kek_ids'])} KEK(s) re-wrapped under "
              f"{MASTER_KEY_IDS[1]!r}, {MASTER_KEY_IDS[0]!r} removed from the keystore (no data file rewritten)")

        # 7. Read again: only the new master key exists now.
        t0 = time.perf_counter()
        again = spark.read.format("icecrypt.iceberg").options(**kms_options).load(table.metadata_location).count()
        print(f"7. after rotation PySpark reads {again:,} rows in {time.perf_counter() - t0:.1f} s "
              f"(keystore now holds {LocalKms(keystore).key_ids})")
        ok &= again == expected_total + 1000
        reloaded = load_catalog("demo", warehouse=warehouse, kms=LocalKms(keystore)).load_table("sales.orders")
        python_rows = reloaded.scan(columns=["order_id"]).to_arrow().num_rows
        ok &= python_rows == again
    finally:
        spark.stop()

    # 8. Tamper drill on a copy: one flipped byte in a manifest is found and named.
    copy = os.path.join(work, "tampered")
    shutil.copytree(location, copy)
    manifest = next(os.path.join(copy, "metadata", n) for n in sorted(os.listdir(os.path.join(copy, "metadata")))
                    if n.endswith("-m0.avro") or (n.endswith(".avro") and not n.startswith("snap-")))
    with open(manifest, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    copied_metadata = os.path.join(copy, "metadata", os.path.basename(table.metadata_location))
    damaged = EncryptedTable.load(copied_metadata, kms=LocalKms(keystore), location_map={location: copy}).verify()
    print(f"8. one flipped byte in {os.path.basename(manifest)}: "
          f"{'found: ' + str(damaged.problems[0]) if not damaged.ok else 'NOT DETECTED'}")
    ok &= not damaged.ok
    print(f"summary: {expected_total + 1000:,} rows, append {args.rows / write_seconds:,.0f} rows/s, "
          f"Spark read {count / spark_seconds:,.0f} rows/s (through Python tasks {python_count / python_seconds:,.0f}), verify {report.rows_checked / verify_seconds:,.0f} rows/s: "
          f"{'all checks passed' if ok else 'SOMETHING FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
