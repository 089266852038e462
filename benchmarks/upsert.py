"""Upserting 1 % of a table, encrypted against plaintext, in copy-on-write and
merge-on-read, and what merge-on-read commits cost later scans (before and after
compaction).

    python benchmarks/upsert.py [--rows 10000000] [--fraction 0.01] [--commits 5] [--rounds 3] [--dir /dev/shm] [--json]

Both variants run the same code (``EncryptedTable.create``, ``append``, ``upsert``,
``scan``, ``rewrite_data_files``); the encrypted table has ``encryption.key-id``, the
plaintext one does not, so the ratio is the cost of encryption (target: at most 1.3x).
Per mode and variant: a fresh table of ROWS event-like rows (the append is not timed),
then an upsert of FRACTION of its rows (existing keys, a changed value, spread over the
whole key range as late corrections are) timed; in merge-on-read COMMITS such upserts in
all, then a full scan timed, then ``rewrite_data_files`` (timed) and the scan again.
One small warm-up run per mode and variant is not counted.  Variants
alternate, and swap order every round; each figure is the median over ROUNDS.
Files go to DIR (default /dev/shm: CPU work, not disk).

Reported: wall and CPU seconds (all threads) per step and variant, and encrypted /
plaintext ratios; on a shared, busy host the CPU ratios are the steadier ones.
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

import icecrypt
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

MODES = ("copy-on-write", "merge-on-read")
VARIANTS = ("plaintext", "encrypted")


def make_rows(rows: int, seed: int = 7) -> pa.Table:
    """Event-like rows keyed by ``id`` (0 .. rows-1)."""
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": pa.array(np.arange(rows, dtype=np.int64)),
        "category": pa.array(np.array(["alpha", "beta", "gamma", "delta"])[rng.integers(0, 4, rows)]),
        "qty": pa.array(rng.integers(-1000, 1000, rows).astype(np.int32)),
        "amount": pa.array(rng.normal(0, 1000, rows)),
        "ts": pa.array(1_700_000_000_000_000 + rng.integers(0, 10**12, rows), pa.timestamp("us")),
    })  # fmt: skip


def corrections(data: pa.Table, fraction: float, seed: int) -> pa.Table:
    """``fraction`` of the rows (random keys), each with a changed ``qty``."""
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(data.num_rows, max(1, int(data.num_rows * fraction)), replace=False))
    rows = data.take(pa.array(picked))
    return rows.set_column(2, "qty", pa.array(rows.column("qty").to_numpy() + 5000, pa.int32()))


def timed(call) -> tuple[float, float, object]:
    start, cpu = time.perf_counter(), time.process_time()
    result = call()
    return time.perf_counter() - start, time.process_time() - cpu, result


def run_mode(work: Path, data: pa.Table, mode: str, variant: str, args, kms) -> dict:
    encrypted = variant == "encrypted"
    props = {f"write.{op}.mode": mode for op in ("delete", "update", "merge")}
    table = EncryptedTable.create(
        str(work / f"{mode}-{variant}"), data.schema, kms=kms if encrypted else None,
        table_key_id="keyA" if encrypted else None, properties=props,
    )  # fmt: skip
    table.append(data)
    out: dict = {}
    wall, cpu, result = timed(lambda: table.upsert(corrections(data, args.fraction, 1), ["id"]))
    assert result.rows_updated == max(1, int(data.num_rows * args.fraction)) and result.rows_inserted == 0
    out["upsert_s"], out["upsert_cpu_s"] = wall, cpu
    if mode == "merge-on-read":
        for n in range(2, args.commits + 1):
            table.upsert(corrections(data, args.fraction, n), ["id"])
        out["dv_files"] = int(table.current_snapshot().summary.get("total-delete-files", 0))
    wall, cpu, rows = timed(lambda: table.scan().to_arrow().num_rows)
    assert rows == data.num_rows
    out["scan_s"], out["scan_cpu_s"] = wall, cpu
    if mode == "merge-on-read":
        wall, cpu, _ = timed(lambda: table.rewrite_data_files(options={"rewrite-all": "true", "min-input-files": "1"}))
        out["compact_s"] = wall
        wall, cpu, rows = timed(lambda: table.scan().to_arrow().num_rows)
        assert rows == data.num_rows
        out["scan_after_compaction_s"], out["scan_after_compaction_cpu_s"] = wall, cpu
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--commits", type=int, default=5, help="merge-on-read upserts before the scans")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    data = make_rows(args.rows)
    kms = MemoryKms.with_iceberg_test_keys()
    work = Path(tempfile.mkdtemp(prefix="icecrypt-upsert-", dir=args.dir))
    runs: dict[str, dict[str, list[dict]]] = {mode: {v: [] for v in VARIANTS} for mode in MODES}
    try:
        small = make_rows(min(args.rows, 20_000))
        for mode in MODES:  # warm-up, not counted: imports, first reads of the KMS, caches
            for variant in VARIANTS:
                run_mode(work, small, mode, variant, args, kms)
                shutil.rmtree(work / f"{mode}-{variant}", ignore_errors=True)
        for round_no in range(args.rounds):
            for n, mode in enumerate(MODES):
                order = VARIANTS if (n + round_no) % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    runs[mode][variant].append(run_mode(work, data, mode, variant, args, kms))
                    shutil.rmtree(work / f"{mode}-{variant}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {
        mode: {v: {k: statistics.median(r[k] for r in runs[mode][v]) for k in runs[mode][v][0]} for v in VARIANTS}
        for mode in MODES
    }

    ratios = {}
    for mode in MODES:
        plain, enc = results[mode]["plaintext"], results[mode]["encrypted"]
        ratios[mode] = {k: round(enc[k] / plain[k], 3) for k in plain if k.endswith("_s") and plain[k] > 0}
    report = {
        "benchmark": "upsert",
        "icecrypt": icecrypt.__version__,
        "rows": args.rows,
        "fraction": args.fraction,
        "merge_on_read_commits": args.commits,
        "rounds": args.rounds,
        "results": results,
        "encrypted_over_plaintext": ratios,
    }
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    print(f"upsert of {args.fraction:.1%} of {args.rows:,} rows (icecrypt {icecrypt.__version__})")
    for mode in MODES:
        print(f"  {mode}:")
        for key in results[mode]["plaintext"]:
            plain, enc = results[mode]["plaintext"][key], results[mode]["encrypted"][key]
            ratio = f"  x{ratios[mode][key]:.2f}" if key in ratios[mode] else ""
            print(f"    {key:30s} plaintext {plain:9.3f}  encrypted {enc:9.3f}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
