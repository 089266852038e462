"""What authenticated metadata costs: commits and planning of an encrypted table whose
versions carry an authenticator, against the same table without (issue "Trust, part 2").

    python benchmarks/authentication.py [--manifests 200] [--rounds 15] [--dir DIR] [--json]

Two encrypted tables are grown by the same code with the same rows: ``--manifests``
appends (merging off, so each append adds one manifest and planning reads them all).
Every version of the "on" table carries an authenticator (what icecrypt writes); the "off"
table's authenticators are removed once it is grown (a table made before authentication,
or last committed by Iceberg Java): icecrypt then commits on it without one.  The memory
KMS stands in for a KMS (a KMS round trip per *first* load is the same for both, except
the unwrap of the metadata key on "on", counted in the load figure).

Measured, interleaved round by round (the order swapped every round) so that a busy host
weighs on both alike, medians over ``--rounds``:

* **commit**: ``append`` of one small file on a long-lived table object (the object's
  commit path: manifest, manifest list, metadata file with or without its authenticator);
* **load**: ``EncryptedTable.load`` of the table directory (a fresh object: reading and
  verifying the newest version);
* **planning**: a fresh load plus ``plan_files()`` of a full scan (every manifest read):
  what a new job or the CLI does first.

The ratios on/off are the cost (targets: within 5 % of a commit, 2 % of a planning run).
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

import pyarrow as pa

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("note", pa.string())])
NO_MERGE = {"commit.manifest-merge.enabled": "false"}
FIELD = "icecrypt-authenticator"


def rows(start: int, n: int = 5) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()), "note": [f"n{i}" for i in range(n)]})


def grow(root: Path, kms: MemoryKms, manifests: int) -> EncryptedTable:
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", properties=NO_MERGE)
    for i in range(manifests):
        table.append(rows(i * 5))
    return table


def strip(root: Path) -> None:
    for path in (root / "metadata").glob("*.metadata.json"):
        doc = json.loads(path.read_text())
        if doc.pop(FIELD, None) is not None:
            path.write_text(json.dumps(doc, separators=(",", ":"), ensure_ascii=False))


def timed(fn) -> tuple[float, float]:
    """(wall, CPU) seconds of ``fn()``: the CPU time of this process is what a busy host
    disturbs least (every step runs in it)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dir", help="where to grow the tables (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    kms = MemoryKms.with_iceberg_test_keys()
    base = Path(tempfile.mkdtemp(prefix="icecrypt-auth-", dir=args.dir))
    try:
        roots = {"on": base / "on", "off": base / "off"}
        tables = {name: grow(root, kms, args.manifests) for name, root in roots.items()}
        strip(roots["off"])
        tables["off"] = EncryptedTable.load(str(roots["off"]), kms=kms)
        assert tables["on"].authenticator is not None and tables["off"].authenticator is None
        samples: dict[str, dict[str, list[tuple[float, float]]]] = {
            n: {"commit": [], "load": [], "planning": []} for n in roots
        }
        counter = args.manifests * 5
        for round_no in range(args.rounds):
            order = ["on", "off"] if round_no % 2 == 0 else ["off", "on"]
            for name in order:
                counter += 5
                samples[name]["commit"].append(timed(lambda n=name, c=counter: tables[n].append(rows(c))))
            for name in order:
                samples[name]["load"].append(timed(lambda n=name: EncryptedTable.load(str(roots[n]), kms=kms)))
            for name in order:
                samples[name]["planning"].append(
                    timed(lambda n=name: EncryptedTable.load(str(roots[n]), kms=kms).scan().plan_files()))
        assert tables["on"].authenticator is not None and tables["off"].authenticator is None
        result: dict[str, object] = {"manifests": args.manifests, "rounds": args.rounds}
        for what in ("commit", "load", "planning"):
            row = {}
            for i, clock in enumerate(("wall", "cpu")):
                on, off = (statistics.median(s[i] for s in samples[n][what]) for n in ("on", "off"))
                row[clock] = {"on_ms": round(on * 1000, 2), "off_ms": round(off * 1000, 2), "ratio": round(on / off, 3)}
            result[what] = row
        if args.json:
            print(json.dumps(result))
        else:
            print(f"authenticated metadata: {args.manifests} manifests, medians of {args.rounds} interleaved rounds")
            for what in ("commit", "load", "planning"):
                for clock in ("wall", "cpu"):
                    r = result[what][clock]  # type: ignore[index]
                    print(f"  {what:9s} {clock:4s} on {r['on_ms']:8.2f} ms   off {r['off_ms']:8.2f} ms   "
                          f"on/off {r['ratio']:.3f}")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
