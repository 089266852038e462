"""Cost that stays flat: an encrypted and a plaintext table grown side by side to many
commits and files, planning and commit latency measured as they grow.

    python benchmarks/table_scale.py [--commits 10000] [--files-per-commit 10]
        [--off-commits 2000] [--checkpoint 1000] [--dir /dev/shm] [--quick] [--json]

Both tables are written by the same code (``EncryptedTable.create`` + ``append``, the same
generated rows in the same commits; nothing is committed to the repository); the
encrypted one has ``encryption.key-id``.  Every commit appends ``--files-per-commit``
small Parquet files (one per partition value).  Appends alternate between the two tables
(order swapped every commit) and every measurement is interleaved, so the noise of a
shared host falls on both alike; ratios are encrypted / plaintext within this run.

Variants:

* merging on (Java's defaults: ``commit.manifest-merge.enabled``, min-count 100, 8 MiB),
  grown to ``--commits``;
* merging off, grown to ``--off-commits`` (one manifest per commit: planning grows
  linearly; this is the "before merging" table).

At every ``--checkpoint`` commits: median commit latency of the last window, planning
time (``plan_files()`` on a freshly loaded table, median of 5) of a full scan, of a
selective filter (``id < 500``: file statistics prune, every manifest is read) and of
the newest ``batch`` (a day's data: partition summaries prune manifests), the manifest
count, and the peak memory of planning (tracemalloc).  Snapshots older than the last ``--keep-snapshots`` are
expired every ``--expire-every`` commits on both tables (a long-lived table under
maintenance; without it table metadata, and so every commit, grows with history).

Spark: the Parquet file source's planning over 10,000 files is measured by
``benchmarks/spark_parquet_planning.py``.

After growth, the merging-on tables are maintained and planned again: manifests regrouped
by partition (``rewrite_manifests``, about one batch per manifest), then compacted
(``rewrite_data_files`` of every file, then ``rewrite_manifests``).

``rewrite_data_files`` / ``rekey`` throughput: MB/s of encrypted data rewritten against a
plain pyarrow read + write of the same rows (``--maintenance-rows``).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("part", pa.int32(), nullable=False),
    pa.field("batch", pa.int32(), nullable=False),
    pa.field("amount", pa.float64()),
    pa.field("note", pa.string()),
])
# ``batch`` stands for the day of a table fed all day long: it advances every
# BATCH_COMMITS commits; ``part`` spreads each commit over --files-per-commit files
SPEC = PartitionSpec(
    PartitionField(source_id=3, field_id=1000, transform=IdentityTransform(), name="batch"),
    PartitionField(source_id=2, field_id=1001, transform=IdentityTransform(), name="part"),
)
BATCH_COMMITS = 100
ROWS_PER_FILE = 5
SELECTIVE = "id < 500"  # the first commit's rows: file statistics prune, every manifest is read


def recent_filter(commits: int) -> str:
    """The newest batch (today's data): manifests are pruned by their partition summaries."""
    return f"batch = {max(0, commits - 1) // BATCH_COMMITS}"


def commit_rows(commit: int, files: int) -> pa.Table:
    n = files * ROWS_PER_FILE
    base = commit * n
    ids = list(range(base, base + n))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "part": pa.array([i % files for i in range(n)], pa.int32()),
        "batch": pa.array([commit // BATCH_COMMITS] * n, pa.int32()),
        "amount": pa.array([i * 0.25 for i in ids], pa.float64()),
        "note": pa.array([f"n{i % 97}" for i in ids]),
    }, schema=SCHEMA)


def create(root: Path, encrypted: bool, merge: bool, kms: MemoryKms) -> EncryptedTable:
    props = {"commit.manifest-merge.enabled": "true" if merge else "false"}
    return EncryptedTable.create(
        str(root), SCHEMA, kms=kms if encrypted else None, table_key_id="keyA" if encrypted else None,
        partition_spec=SPEC, properties=props,
    )  # fmt: skip


def plan_once(location: str, kms: MemoryKms, row_filter: str | None) -> tuple[float, int]:
    # every plan starts from a collected heap: otherwise a full collection of whatever the
    # process holds (both tables' state) lands on one plan or another at random
    gc.collect()
    t0 = time.perf_counter()
    table = EncryptedTable.load(location, kms=kms)
    tasks = table.scan(row_filter=row_filter).plan_files()
    return time.perf_counter() - t0, len(tasks)


def plan_peak(location: str, kms: MemoryKms, streamed: bool = False) -> int:
    """Peak traced memory of planning a full scan: the whole plan as a list
    (``plan_files``), or streamed (``plan_tasks``: each task dropped once seen, as a
    streaming reader or a task scheduler consumes them)."""
    gc.collect()
    tracemalloc.start()
    try:
        scan = EncryptedTable.load(location, kms=kms).scan()
        if streamed:
            for _ in scan.plan_tasks():
                pass
        else:
            scan.plan_files()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def measure_planning(locations: dict[str, str], kms: MemoryKms, commits: int, reps: int = 5) -> dict:
    """Planning of each kind of scan on each table, ``reps`` rounds interleaved (order
    swapped every round); the median of each."""
    kinds = (("full", None), ("selective", SELECTIVE), ("recent", recent_filter(commits)))
    out: dict = {name: {kind: [] for kind, _ in kinds} for name in locations}
    names = list(locations)
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            for kind, flt in kinds:
                wall, tasks = plan_once(locations[name], kms, flt)
                out[name][kind].append(wall)
                out[name][f"{kind}_tasks"] = tasks
    result = {}
    for name in names:
        result[name] = {
            **{f"plan_{kind}_s": statistics.median(out[name][kind]) for kind, _ in kinds},
            "tasks": out[name]["full_tasks"],
            "selective_tasks": out[name]["selective_tasks"],
            "recent_tasks": out[name]["recent_tasks"],
            "plan_peak_bytes": plan_peak(locations[name], kms),
            "plan_stream_peak_bytes": plan_peak(locations[name], kms, streamed=True),
        }
    return result


def expire(table: EncryptedTable, keep: int) -> None:
    snaps = table.snapshots()
    if len(snaps) > keep:
        table.expire_snapshots(snaps[-keep].timestamp_ms)


def grow(label: str, roots: dict[str, Path], merge: bool, commits: int, args, kms: MemoryKms, report: list) -> None:
    tables = {name: create(root, name == "encrypted", merge, kms) for name, root in roots.items()}
    window: dict[str, list[float]] = {name: [] for name in tables}
    names = list(tables)
    for c in range(commits):
        data = commit_rows(c, args.files_per_commit)
        for name in (names if c % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            tables[name].append(data)
            window[name].append(time.perf_counter() - t0)
        done = c + 1
        if args.expire_every and done % args.expire_every == 0:
            for name in names:
                expire(tables[name], args.keep_snapshots)
        if done % args.checkpoint == 0 or done == commits:
            planning = measure_planning({n: str(roots[n]) for n in names}, kms, done)
            row = {"variant": label, "commits": done, "files": done * args.files_per_commit}
            for name in names:
                t = tables[name]
                row[name] = {
                    "append_ms": statistics.median(window[name]) * 1000,
                    "manifests": len(t.manifests(t.current_snapshot())),
                    **planning[name],
                }
                window[name] = []
            e, p = row["encrypted"], row["plaintext"]
            row["ratio"] = {
                "append": e["append_ms"] / p["append_ms"],
                "plan_full": e["plan_full_s"] / p["plan_full_s"],
                "plan_selective": e["plan_selective_s"] / p["plan_selective_s"],
                "plan_recent": e["plan_recent_s"] / p["plan_recent_s"],
            }
            report.append(row)
            print(
                f"[{label:9s}] commits {done:6d} files {row['files']:7d} manifests {e['manifests']:5d}/{p['manifests']:5d} | "
                f"append ms {e['append_ms']:6.2f}/{p['append_ms']:6.2f} ({row['ratio']['append']:.2f}x) | "
                f"plan full s {e['plan_full_s']:.3f}/{p['plan_full_s']:.3f} ({row['ratio']['plan_full']:.2f}x) | "
                f"plan selective s {e['plan_selective_s']:.3f}/{p['plan_selective_s']:.3f} ({row['ratio']['plan_selective']:.2f}x) | "
                f"plan recent s {e['plan_recent_s']:.3f}/{p['plan_recent_s']:.3f} ({row['ratio']['plan_recent']:.2f}x, "
                f"{e['recent_tasks']} tasks) | "
                f"plan peak MiB {e['plan_peak_bytes'] / 2**20:.1f}/{p['plan_peak_bytes'] / 2**20:.1f} "
                f"(streamed {e['plan_stream_peak_bytes'] / 2**20:.1f}/{p['plan_stream_peak_bytes'] / 2**20:.1f}) | tasks {e['tasks']}",
                flush=True,
            )


def _planning_row(variant: str, roots: dict[str, Path], kms: MemoryKms, commits: int, timing: dict) -> dict:
    planning = measure_planning({n: str(roots[n]) for n in roots}, kms, commits)
    row = {"variant": variant, **{n: {**planning[n], "maintenance_s": timing[n]} for n in roots}}
    e, p = row["encrypted"], row["plaintext"]
    row["ratio"] = {kind: e[f"{kind}_s"] / p[f"{kind}_s"] for kind in ("plan_full", "plan_selective", "plan_recent")}
    print(f"[{variant:9s}] maintenance {e['maintenance_s']:.1f}/{p['maintenance_s']:.1f} s | "
          f"plan full s {e['plan_full_s']:.3f}/{p['plan_full_s']:.3f} ({row['ratio']['plan_full']:.2f}x) | "
          f"plan selective s {e['plan_selective_s']:.3f}/{p['plan_selective_s']:.3f} ({row['ratio']['plan_selective']:.2f}x) | "
          f"plan recent s {e['plan_recent_s']:.3f}/{p['plan_recent_s']:.3f} ({row['ratio']['plan_recent']:.2f}x, "
          f"{e['recent_tasks']} tasks) | tasks {e['tasks']}", flush=True)
    return row


def maintained_rows(roots: dict[str, Path], kms: MemoryKms, commits: int) -> list[dict]:
    """Planning after maintenance, on the merging-on tables (the figures before come from
    the last growth checkpoint):

    * ``regrouped``: ``rewrite_manifests`` with a target size of about one batch's
      entries, so that manifests are clustered by partition (Java's merge on append
      packs by size and keeps one ever-growing manifest holding every batch, which a
      filter on the newest batch cannot skip);
    * ``compacted``: then ``rewrite_data_files`` (every file, bin-packed) and
      ``rewrite_manifests`` at the table's own target size."""
    rows = []
    batches = max(1, -(-commits // BATCH_COMMITS))
    timing = {}
    for name, root in roots.items():
        table = EncryptedTable.load(str(root), kms=kms)
        total = sum(m.length for m in table.manifests(table.current_snapshot()))
        t0 = time.perf_counter()
        table.rewrite_manifests(target_size=max(4096, total // batches), force=True)
        timing[name] = time.perf_counter() - t0
    rows.append(_planning_row("regrouped", roots, kms, commits, timing))
    for name, root in roots.items():
        table = EncryptedTable.load(str(root), kms=kms)
        t0 = time.perf_counter()
        table.rewrite_data_files(options={"rewrite-all": "true"})
        table.rewrite_manifests(force=True)
        timing[name] = time.perf_counter() - t0
    rows.append(_planning_row("compacted", roots, kms, commits, timing))
    return rows


def maintenance_rows(args, work: Path, kms: MemoryKms) -> list[dict]:
    """``rewrite_data_files`` and ``rekey(everything=True, expire=True)`` throughput (MB of
    encrypted data files rewritten per second) against a plain pyarrow read + write of the
    same rows as plaintext Parquet files (zstd, as the tables write), in one run."""
    import numpy as np
    import pyarrow.parquet as pq

    rows, files = (200_000, 8) if args.quick else (args.maintenance_rows, 20)
    n = rows // files
    rng = np.random.default_rng(0)
    root = work / "maintenance"
    plain = root / "plain"
    plain.mkdir(parents=True)

    def chunk(i: int) -> pa.Table:
        ids = np.arange(i * n, (i + 1) * n, dtype=np.int64)
        return pa.table({"id": ids, "amount": rng.normal(0, 1000, n), "note": pa.array([f"n-{x}" for x in ids % 1000])})

    table = EncryptedTable.create(str(root / "enc"), chunk(0).schema, kms=kms, table_key_id="keyA")
    for i in range(files):
        c = chunk(i)
        table.append(c)
        pq.write_table(c, plain / f"{i}.parquet", compression="zstd")
    mb = sum(task.file.file_size_in_bytes for task in table.scan().plan_files()) / 1e6
    start = time.perf_counter()
    for i in range(files):
        pq.write_table(pq.read_table(plain / f"{i}.parquet"), plain / f"{i}.out.parquet", compression="zstd")
    plain_mb_s = mb / (time.perf_counter() - start)
    start = time.perf_counter()
    rewrite = table.rewrite_data_files(options={"rewrite-all": "true"})
    rewrite_mb_s = rewrite.rewritten_bytes / 1e6 / (time.perf_counter() - start)
    start = time.perf_counter()
    rekey = table.rekey(everything=True, expire=True)
    rekey_mb_s = rekey.rewrite.rewritten_bytes / 1e6 / (time.perf_counter() - start)
    row = {"variant": "maintenance", "data_mb": round(mb, 1), "rows": rows, "files": files,
           "plain_read_write_mb_s": round(plain_mb_s, 1), "rewrite_data_files_mb_s": round(rewrite_mb_s, 1),
           "rekey_mb_s": round(rekey_mb_s, 1)}
    print(f"[maintenance] {mb:.1f} MB in {files} files: plain read+write {plain_mb_s:.1f} MB/s | "
          f"rewrite_data_files {rewrite_mb_s:.1f} MB/s ({rewrite_mb_s / plain_mb_s:.2f}x) | "
          f"rekey {rekey_mb_s:.1f} MB/s ({rekey_mb_s / plain_mb_s:.2f}x)", flush=True)
    return [row]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--files-per-commit", type=int, default=10)
    parser.add_argument("--off-commits", type=int, default=2_000)
    parser.add_argument("--checkpoint", type=int, default=1_000)
    parser.add_argument("--expire-every", type=int, default=500)
    parser.add_argument("--keep-snapshots", type=int, default=100)
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 120 commits, 4 files each")
    parser.add_argument("--maintenance-rows", type=int, default=2_000_000,
                        help="rows of the rewrite_data_files / rekey throughput table")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.commits, args.files_per_commit, args.off_commits, args.checkpoint = 120, 4, 60, 60
        args.expire_every, args.keep_snapshots = 50, 20
    kms = MemoryKms.with_iceberg_test_keys()
    work = Path(tempfile.mkdtemp(prefix="icecrypt-scale-", dir=args.dir))
    report: list[dict] = []
    try:
        print(f"python {sys.version.split()[0]}; {args.commits} commits x {args.files_per_commit} files "
              f"(merging on), {args.off_commits} commits (merging off); checkpoint {args.checkpoint}; "
              f"expire every {args.expire_every} keeping {args.keep_snapshots}", flush=True)
        t0 = time.perf_counter()
        grow("merge-off", {"encrypted": work / "off-enc", "plaintext": work / "off-plain"}, False,
             args.off_commits, args, kms, report)
        grow("merge-on", {"encrypted": work / "on-enc", "plaintext": work / "on-plain"}, True,
             args.commits, args, kms, report)
        report.extend(maintained_rows({"encrypted": work / "on-enc", "plaintext": work / "on-plain"}, kms, args.commits))
        report.extend(maintenance_rows(args, work, kms))
        on = [r for r in report if r["variant"] == "merge-on"]
        off = [r for r in report if r["variant"] == "merge-off"]
        print("\nsummary (encrypted / plaintext, same run):")
        for name, rows in (("merge-off", off), ("merge-on", on)):
            if not rows:
                continue
            last = rows[-1]
            print(f"  {name}: at {last['commits']} commits: planning full {last['ratio']['plan_full']:.2f}x, "
                  f"selective {last['ratio']['plan_selective']:.2f}x, recent {last['ratio']['plan_recent']:.2f}x "
                  f"(target <= 1.1x); "
                  f"append median over all windows {statistics.median(r['ratio']['append'] for r in rows):.2f}x "
                  f"(target <= 1.15x)")
        if on:
            first, last = on[0], on[-1]
            print(f"  merge-on growth {first['commits']} -> {last['commits']} commits "
                  f"({last['commits'] / first['commits']:.0f}x): encrypted planning "
                  f"{last['encrypted']['plan_full_s'] / first['encrypted']['plan_full_s']:.2f}x full "
                  f"(files {last['files'] / first['files']:.0f}x), "
                  f"{last['encrypted']['plan_recent_s'] / first['encrypted']['plan_recent_s']:.2f}x recent; "
                  f"append latency {last['encrypted']['append_ms'] / first['encrypted']['append_ms']:.2f}x")
        if off and on:
            same = next((r for r in on if r["commits"] == off[-1]["commits"]), None)
            if same is not None:
                print(f"  at {same['commits']} commits, merging on vs off: encrypted planning "
                      f"{same['encrypted']['plan_full_s']:.3f} s vs {off[-1]['encrypted']['plan_full_s']:.3f} s; "
                      f"manifests {same['encrypted']['manifests']} vs {off[-1]['encrypted']['manifests']}")
        print(f"  total wall {time.perf_counter() - t0:.0f} s")
        if args.json:
            print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
