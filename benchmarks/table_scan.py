"""Scanning an encrypted Iceberg table against the same scan of a plaintext table, and
the cost of planning per manifest.

    python benchmarks/table_scan.py [--rows 4000000] [--rounds 5] [--dir /dev/shm] [--manifests 40] [--json]

Both tables are written by the same code (``EncryptedTable.create`` + ``append``, the
same Arrow data in the same commits, so the same files and layout); the encrypted one has
``encryption.key-id`` (natively encrypted Parquet, AGS1 manifests and manifest lists,
KEK-wrapped manifest-list keys), the plaintext one does not.  Each round runs every scan
variant on both tables, alternating and swapping the order every round (the host is
shared and noisy); one warm-up round is not counted.

Scan variants: ``full`` (``to_arrow()`` of every column), ``stream`` (``to_batches()``,
one task at a time), ``project`` (two columns), ``filter`` (a selective filter: file
pruning by statistics plus exact row filtering).  Reported: median wall seconds, rows/s,
and encrypted / plaintext speed (the target is at least 0.85), plus the same ratio of
process CPU seconds.

Planning: two more tables (encrypted, plaintext) get ``--manifests`` small appends (one
manifest each); ``plan_files()`` is timed on both, and the cost per manifest reported
(manifest list + one manifest per append: unwrap, decrypt, decode).
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

import numpy as np
import pyarrow as pa

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

COMMITS = 4


def make_rows(rows: int, seed: int = 5) -> pa.Table:
    """Event-like rows: ids, low-cardinality category, numbers, timestamps, short text."""
    rng = np.random.default_rng(seed)
    words = np.array([f"note-{i:05d}-{i * 7919 % 100003}" for i in range(20000)], dtype=object)
    return pa.table({
        "id": np.arange(rows, dtype=np.int64),
        "category": pa.array(np.array(["alpha", "beta", "gamma", "delta"])[rng.integers(0, 4, rows)]),
        "qty": rng.integers(-1000, 1000, rows).astype(np.int32),
        "amount": rng.normal(0, 1000, rows),
        "ts": pa.array(1_700_000_000_000_000 + rng.integers(0, 10**12, rows), pa.timestamp("us")),
        "note": pa.array(words[rng.integers(0, len(words), rows)], pa.string()),
    })


def build(root: Path, data: pa.Table, encrypted: bool, kms: MemoryKms, commits: int) -> EncryptedTable:
    table = EncryptedTable.create(
        str(root), data.schema, kms=kms if encrypted else None, table_key_id="keyA" if encrypted else None
    )
    step = -(-data.num_rows // commits)
    for start in range(0, data.num_rows, step):
        table.append(data.slice(start, step))
    return table


def timed(fn, *args) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def scan_variants(rows: int) -> dict:
    cut = rows // 20
    return {
        "full": lambda t: t.scan().to_arrow().num_rows,
        "stream": lambda t: sum(b.num_rows for b in t.scan().to_batches()),
        "project": lambda t: t.scan(columns=["id", "amount"]).to_arrow().num_rows,
        "filter": lambda t: t.scan(row_filter=f"id < {cut} and category = 'beta'").to_arrow().num_rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--manifests", type=int, default=40)
    parser.add_argument("--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    kms = MemoryKms.with_iceberg_test_keys()
    work = Path(tempfile.mkdtemp(prefix="icecrypt-scan-", dir=args.dir))
    try:
        data = make_rows(args.rows)
        tables = {
            "encrypted": build(work / "enc", data, True, kms, COMMITS),
            "plaintext": build(work / "plain", data, False, kms, COMMITS),
        }
        stored = {
            name: sum(p.stat().st_size for p in (work / d / "data").rglob("*") if p.is_file())
            for name, d in (("encrypted", "enc"), ("plaintext", "plain"))
        }
        variants = scan_variants(args.rows)
        samples = {(v, name): [] for v in variants for name in tables}
        counts = {}
        order = list(tables)
        for round_index in range(args.rounds + 1):
            for variant, run in variants.items():
                for name in order:
                    wall, cpu, n = timed(run, tables[name])
                    counts.setdefault((variant, name), n)
                    if counts[(variant, name)] != n:
                        raise AssertionError(f"{variant}/{name}: {n} rows, earlier {counts[(variant, name)]}")
                    if round_index:  # round 0 warms up
                        samples[(variant, name)].append((wall, cpu))
            order.reverse()
        for variant in variants:
            if counts[(variant, "encrypted")] != counts[(variant, "plaintext")]:
                raise AssertionError(f"{variant}: the tables returned different row counts")

        report: dict = {"rows": args.rows, "rounds": args.rounds, "stored_bytes": stored, "scans": {}}
        for variant in variants:
            entry = {}
            for name in tables:
                walls = [w for w, _ in samples[(variant, name)]]
                cpus = [c for _, c in samples[(variant, name)]]
                entry[name] = {"median_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
                               "rows_per_s": counts[(variant, name)] / statistics.median(walls)}
            entry["speed_ratio"] = entry["plaintext"]["median_s"] / entry["encrypted"]["median_s"]
            entry["cpu_ratio"] = entry["plaintext"]["cpu_s"] / entry["encrypted"]["cpu_s"]
            entry["rows"] = counts[(variant, "encrypted")]
            report["scans"][variant] = entry

        # planning cost per manifest
        small = make_rows(2000, seed=9)
        planning = {}
        for name, encrypted in (("encrypted", True), ("plaintext", False)):
            table = build(work / f"plan-{name}", small, encrypted, kms, args.manifests)
            assert len(table.manifests(table.current_snapshot())) == args.manifests
            walls = []
            for _ in range(args.rounds + 1):
                fresh = EncryptedTable.load(table.metadata_location, kms=kms if encrypted else None)
                walls.append(timed(fresh.scan().plan_files)[0])
            per = statistics.median(walls[1:]) / args.manifests
            planning[name] = {"plan_s": statistics.median(walls[1:]), "per_manifest_ms": per * 1000}
        planning["manifests"] = args.manifests
        report["planning"] = planning
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    print(f"{args.rows} rows in {COMMITS} commits; stored data: encrypted {stored['encrypted'] / 1e6:.1f} MB, "
          f"plaintext {stored['plaintext'] / 1e6:.1f} MB; median of {args.rounds} rounds")
    print(f"{'scan':8} {'rows':>9} {'encrypted s':>12} {'plaintext s':>12} {'enc Mrows/s':>12} {'speed enc/plain':>16} {'cpu plain/enc':>14}")
    for variant, entry in report["scans"].items():
        print(f"{variant:8} {entry['rows']:>9} {entry['encrypted']['median_s']:>12.3f} {entry['plaintext']['median_s']:>12.3f} "
              f"{entry['encrypted']['rows_per_s'] / 1e6:>12.2f} {entry['speed_ratio']:>16.3f} {entry['cpu_ratio']:>14.3f}")
    print(f"planning, {planning['manifests']} manifests: encrypted {planning['encrypted']['plan_s'] * 1000:.1f} ms "
          f"({planning['encrypted']['per_manifest_ms']:.2f} ms/manifest), plaintext {planning['plaintext']['plan_s'] * 1000:.1f} ms "
          f"({planning['plaintext']['per_manifest_ms']:.2f} ms/manifest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
