"""Commits under contention: W writer processes appending to one table at once.

    python benchmarks/commit_contention.py [--writers 1 4 8] [--appends 20] [--targets path postgres] [--json]

Each writer is a fresh interpreter that loads the table, waits for a start file, then
appends ``--appends`` small batches (3 rows each), one commit per append, with the
table's default retry settings (``commit.retry.*``: Java's defaults).  Targets:

* ``path``: a path table (``v<N>.metadata.json`` created exclusively) in a temporary
  directory;
* ``postgres``: a table of an SQL catalog on a PostgreSQL server this script starts
  (``initdb`` of a temporary directory, ``postgres`` on 127.0.0.1 at a free port, as an
  unprivileged user when run as root; stopped by its PID at the end);
* ``sqlite``: a table of an SQL catalog in SQLite.

Reported per target and writer count: commits per second (committed appends over the
wall time from the start file to the last writer's exit), the share of commits that
were retried (the attempt number is in each manifest list's name,
``snap-<id>-<attempt>-<uuid>.avro``), and the appends refused with
CommitConflictError (an append cannot conflict: this must be 0).  Every row appended is
checked to be in the table once.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("writer", pa.int64())])
ROWS = 3
KMS_PROPERTIES = {
    "encryption.kms-impl": "icecrypt.kms.memory.MemoryKms",
    "encryption.kms.memory.iceberg-test-keys": "true",
}

WORKER = r"""
import json, os, sys, time
import pyarrow as pa
from icecrypt.errors import CommitConflictError

spec = json.loads(sys.argv[1])
if spec["kind"] == "path":
    from icecrypt.kms.memory import MemoryKms
    from icecrypt.table import EncryptedTable
    table = EncryptedTable.load(spec["root"], kms=MemoryKms.with_iceberg_test_keys())
else:
    from icecrypt.catalog import load_catalog
    table = load_catalog("bench", **spec["properties"]).load_table("db.t")
while not os.path.exists(spec["go"]):
    time.sleep(0.002)
out = {"committed": [], "refused": 0}
for i in range(spec["appends"]):
    start = spec["first_id"] + i * spec["rows"]
    data = pa.table({"id": list(range(start, start + spec["rows"])), "writer": [spec["writer"]] * spec["rows"]})
    try:
        out["committed"].append(table.append(data))
    except CommitConflictError:
        out["refused"] += 1
print(json.dumps(out))
"""


# --- PostgreSQL ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """A throwaway PostgreSQL server on 127.0.0.1 (stopped by its PID)."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
        if not found:
            raise SystemExit("PostgreSQL is not installed (/usr/lib/postgresql/*/bin/postgres)")
        self.bindir = os.path.dirname(found[-1])
        self.root = tempfile.mkdtemp(prefix="icecrypt-bench-pg-")
        self.proc: subprocess.Popen | None = None
        self.port = _free_port()

    def start(self) -> str:
        owner: dict = {}
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            try:
                entry = pwd.getpwnam("icecrypt-pg")
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                                "icecrypt-pg"], check=True, capture_output=True)  # fmt: skip
                entry = pwd.getpwnam("icecrypt-pg")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            owner = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        data, sockets = os.path.join(self.root, "data"), os.path.join(self.root, "run")
        os.mkdir(sockets)
        if owner:
            os.chown(sockets, owner["user"], owner["group"])
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        subprocess.run([os.path.join(self.bindir, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True, env=env, cwd=self.root,
                       **owner)  # fmt: skip
        log = open(os.path.join(self.root, "postgres.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [os.path.join(self.bindir, "postgres"), "-D", data, "-h", "127.0.0.1", "-p", str(self.port), "-k",
             sockets, "-c", "fsync=off", "-c", "max_connections=100"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root, start_new_session=True, **owner,
        )  # fmt: skip
        log.close()
        import psycopg2

        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres").close()
                break
            except psycopg2.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def new_database(self, name: str) -> str:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


# --- one run -----------------------------------------------------------------------------------


def run(kind: str, writers: int, appends: int, workdir: Path, pg: Postgres | None, index: int) -> dict:
    from icecrypt.catalog import load_catalog
    from icecrypt.kms.memory import MemoryKms
    from icecrypt.table import EncryptedTable

    run_dir = workdir / f"{kind}-{writers}-{index}"
    run_dir.mkdir()
    spec_base: dict = {"kind": kind, "appends": appends, "rows": ROWS}
    if kind == "path":
        root = str(run_dir / "t")
        EncryptedTable.create(root, SCHEMA, kms=MemoryKms.with_iceberg_test_keys(), table_key_id="keyA")
        spec_base["root"] = root

        def load():
            return EncryptedTable.load(root, kms=MemoryKms.with_iceberg_test_keys())
    else:
        properties = {"warehouse": str(run_dir / "warehouse"), **KMS_PROPERTIES}
        (run_dir / "warehouse").mkdir()
        if kind == "postgres":
            properties["uri"] = pg.new_database(f"bench_{writers}_{index}")
        catalog = load_catalog("bench", **properties)
        catalog.create_namespace("db")
        catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
        spec_base["properties"] = properties

        def load():
            return load_catalog("bench", **properties).load_table("db.t")

    go = run_dir / "go"
    procs = []
    try:
        for n in range(writers):
            spec = {**spec_base, "go": str(go), "writer": n, "first_id": n * 100_000}
            procs.append(subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(spec)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
        time.sleep(1.0 + 0.3 * writers)  # let the writers import and load before they race
        started = time.monotonic()
        go.write_text("go")
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(err.decode(errors="replace")[-3000:])
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        wall = time.monotonic() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    committed = [s for r in results for s in r["committed"]]
    refused = sum(r["refused"] for r in results)
    table = load()
    snapshots = table.snapshots()
    assert {s.snapshot_id for s in snapshots} == set(committed), "a committed append is missing"
    ids = sorted(table.scan().to_arrow()["id"].to_pylist())
    assert len(ids) == len(set(ids)) == len(committed) * ROWS, "rows lost or doubled"
    retried = sum(1 for s in snapshots if s.manifest_list.rsplit("/", 1)[1].split("-")[2] != "1")
    attempts = sum(int(s.manifest_list.rsplit("/", 1)[1].split("-")[2]) for s in snapshots)
    return {
        "target": kind, "writers": writers, "appends": writers * appends, "committed": len(committed),
        "refused": refused, "seconds": round(wall, 2), "commits_per_s": round(len(committed) / wall, 2),
        "retried_share": round(retried / max(1, len(committed)), 3),
        "attempts_per_commit": round(attempts / max(1, len(committed)), 2),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--appends", type=int, default=20)
    parser.add_argument("--targets", nargs="+", default=["path", "postgres"], choices=["path", "postgres", "sqlite"])
    parser.add_argument("--dir", default=None, help="where tables go (default: a temporary directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="icecrypt-contention-", dir=args.dir))
    pg = None
    rows = []
    try:
        if "postgres" in args.targets:
            pg = Postgres()
            pg.start()
        for kind in args.targets:
            for index, writers in enumerate(args.writers):
                result = run(kind, writers, args.appends, workdir, pg, index)
                rows.append(result)
                if not args.json:
                    print(f"{kind:8} {writers:2} writers: {result['committed']:4}/{result['appends']} committed, "
                          f"{result['refused']} refused, {result['commits_per_s']:6.2f} commits/s, "
                          f"{100 * result['retried_share']:5.1f}% retried "
                          f"({result['attempts_per_commit']} attempts per commit), {result['seconds']} s",
                          flush=True)  # fmt: skip
    finally:
        if pg is not None:
            pg.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
