"""The table-level fault sweep: scenarios (one operation = one entry of ``OPERATIONS``),
reference runs, and the invariants checked after every injected fault.

What "no third state" means here, precisely (checked by :func:`check_state`):

1. The table loads, at version ``old`` or ``new`` (``v<N>.metadata.json`` numbers of the
   state before the operation and after a fault-free run of it), and no metadata file of a
   later version exists (a reader probing forward would find it: it would be a third state).
   Every ``v<N>.metadata.json`` present parses; ``version-hint.text``, when present and
   numeric, names a version that exists and is not newer than the loaded one.
2. Its rows (a digest of the sorted rows) equal the rows of that version.
3. ``verify()`` reports no problem.
4. Every file under the table directory is one of:
   * **committed**: the current metadata file, an older ``v<N>.metadata.json`` (N below the
     loaded version), ``version-hint.text``, or a file reachable from a snapshot of the
     loaded version (manifest lists, manifests, data and delete files), or
   * **hidden temporary**: a name starting with ``.`` (never read: readers only follow
     references and ``v<N>.metadata.json`` names), or
   * **orphan**: a data or manifest file no snapshot of the loaded version references.
     It was either committed before and left behind by a cleanup that failed (expiry's
     deletes come after its commit), or written by the interrupted operation before its
     commit.  Its key exists nowhere (it was never committed), so it is unreadable; a later
     orphan cleanup may delete it.  Orphans and temporaries are what a *kill* may leave;
     after a *raised* fault the operation's own cleanup runs, so there only files committed
     in the old version may be left over (``strict=True``).
5. A retry of the same operation on the same table object succeeds, ``verify()`` is clean,
   and the rows are those of one fault-free run of the operation from the loaded version.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
from faultfs import FaultPlan, failing_filesystem
from pyiceberg.types import StringType

from icecrypt.kms.local import LocalKms
from icecrypt.table import EncryptedTable

TABLE = "wh/t"  # the table's location on the failing filesystem (relative to its root)
MASTER, MASTER2 = "master", "master-2"
FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01: expire every snapshot but the current one

_VERSION = re.compile(r"v([0-9]+)\.metadata\.json\Z")
#: distinct values of ``cat`` (the partition column).  Two keep every per-partition and
#: per-file loop of an operation running more than once (a fault can hit a later file after
#: an earlier one was written) while keeping the tables small: a sweep's cost grows with the
#: number of files twice over (more calls to fault, and each case writes and reads more).
PARTITIONS = 2


def rows(start: int, n: int) -> pa.Table:
    return pa.table({
        "id": pa.array(range(start, start + n), pa.int64()),
        "cat": [f"c{i % PARTITIONS}" for i in range(start, start + n)],
        "amount": pa.array([i * 1.5 for i in range(start, start + n)], pa.float64()),
    })


#: Operations under test: name -> op(table).  Adding one is one line.
OPERATIONS: dict[str, Callable[[EncryptedTable], object]] = {
    "append": lambda t: t.append(rows(100, 7)),
    "overwrite": lambda t: t.overwrite(rows(200, 5)),
    "delete": lambda t: t.delete("id < 3 or id = 105"),
    "expire_snapshots": lambda t: t.expire_snapshots(FAR_FUTURE_MS),
    "rotate_keys(new KEK)": lambda t: t.rotate_keys(new_kek=True),
    "rotate_keys(new master key)": lambda t: t.rotate_keys(new_kek=True, new_master_key_id=MASTER2),
}
# Maintenance actions, with arguments that make each one do its work on the template.
OPERATIONS.update({
    "rewrite_manifests": lambda t: t.rewrite_manifests(force=True),
    "rewrite_data_files": lambda t: t.rewrite_data_files(options={"rewrite-all": "true"}),
    "rekey": lambda t: t.rekey(everything=True, expire=True),
    "remove_orphan_files": lambda t: t.remove_orphan_files(older_than=FAR_FUTURE_MS),
})
# Metadata-only changes through the commit model (_committer): a rollback to the current
# snapshot's parent with a tag on the way, and a property update.
OPERATIONS.update({
    "manage_snapshots": lambda t: t.manage_snapshots().create_branch(f"b{version(t)}").rollback_to_snapshot(
        t.snapshot(t.current_snapshot_id).parent_snapshot_id).commit(),
    "update_properties": lambda t: t.update_properties().set("owner", f"v{version(t)}").remove("comment").commit(),
    "update_schema": lambda t: t.update_schema().add_column(f"c{version(t)}", StringType()).update_column(
        "id", doc=f"v{version(t)}").commit(),
})
# Snapshot producers on a branch (created from main by the write) and a cherry-pick of a
# branch's append onto main that re-applies its files (main moved since the branch).
OPERATIONS["append(branch)"] = lambda t: t.append(rows(100, 7), branch=f"side{version(t)}")


def _cherry_pick(t: EncryptedTable) -> None:
    name = f"pick{version(t)}"
    t.manage_snapshots().create_branch(name, t.snapshot(t.current_snapshot_id).parent_snapshot_id).commit()
    picked = t.append(rows(300, 4), branch=name)
    t.manage_snapshots().cherry_pick(picked).commit()


OPERATIONS["cherry_pick"] = _cherry_pick
#: Operations made of several commits, each atomic (rekey: KEK, data, manifests, expiry):
#: after a fault the table may be at any version the fault-free run passes through,
#: always with that version's rows, and a re-run completes the operation.
MULTI_COMMIT = {"rekey", "cherry_pick"}


def digest(table: pa.Table) -> str:
    """Order-independent digest of a table's rows."""
    lines = sorted(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def version(table: EncryptedTable) -> int:
    match = _VERSION.search(table.metadata_location)
    assert match, table.metadata_location
    return int(match.group(1))


@dataclass
class World:
    """A keystore and a template table directory every case copies."""

    base: str  # a directory holding keystore.json and template/

    @property
    def keystore(self) -> str:
        return os.path.join(self.base, "keystore.json")

    def kms(self) -> LocalKms:
        return LocalKms(self.keystore)

    def fresh(self, name: str) -> str:
        """A new case root: a copy of the template."""
        root = os.path.join(self.base, name)
        shutil.copytree(os.path.join(self.base, "template"), root)
        return root

    def load(self, root: str, plan: FaultPlan | None = None) -> tuple[EncryptedTable, object]:
        fs, handler = failing_filesystem(root, plan)
        return EncryptedTable.load(TABLE, kms=self.kms(), filesystem=fs), handler


def make_world(base: str) -> World:
    """Template: an encrypted table partitioned by ``cat`` with two appends, a row delete
    (deletion vectors) and a KEK rotation, i.e. several snapshots for expiry to drop."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    os.makedirs(base, exist_ok=True)
    LocalKms.create_keystore(os.path.join(base, "keystore.json"), [MASTER, MASTER2])
    world = World(base)
    root = os.path.join(base, "template")
    os.makedirs(root)
    fs, _ = failing_filesystem(root)
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="cat"))
    t = EncryptedTable.create(TABLE, rows(0, 1).schema, kms=world.kms(), table_key_id=MASTER,
                              partition_spec=spec, filesystem=fs)
    t.append(rows(0, 10))
    t.append(rows(10, 6))
    t.delete("id = 4")
    # An orphan, old enough for remove_orphan_files: a data file no metadata references.
    with fs.open_output_stream(posixpath.join(TABLE, "data", "orphan-from-a-killed-writer.parquet")) as out:
        out.write(b"not referenced by any snapshot")
    return world


@dataclass
class Reference:
    """A fault-free run of an operation from the template: versions and row digests."""

    name: str
    old_version: int
    old_digest: str
    new_version: int
    new_digest: str
    twice_digest: str  # after running the operation twice
    census: list[tuple[str, str]]  # the counted calls of the operation
    sites: list[tuple[tuple[str, int], ...]]  # per counted call: the Python stack that made it


class _CensusPlan(FaultPlan):
    """A plan that never fails and also records, for each counted call, where it was made
    from: the (file, line) of every Python frame on the stack (native frames, such as
    Arrow's Parquet writer, are not seen: its writes share the site of the Python call
    that started them)."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[tuple[tuple[str, int], ...]] = []

    def hit(self, operation: str, path: str) -> None:
        frame, site = sys._getframe(1), []
        while frame is not None:
            site.append((frame.f_code.co_filename, frame.f_lineno))
            frame = frame.f_back
        self.sites.append(tuple(site))
        super().hit(operation, path)


def reference(world: World, name: str) -> Reference:
    op = OPERATIONS[name]
    root = world.fresh(f"ref-{_slug(name)}")
    t, handler = world.load(root)
    old_v, old_d = version(t), digest(t.scan().to_arrow())
    handler.plan = plan = _CensusPlan()
    op(t)
    census, sites = list(plan.calls), list(plan.sites)
    t2, _ = world.load(root)
    new_v, new_d = version(t2), digest(t2.scan().to_arrow())
    op(t2)
    twice = digest(world.load(root)[0].scan().to_arrow())
    shutil.rmtree(root)
    return Reference(name, old_v, old_d, new_v, new_d, twice, census, sites)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _listing(root: str) -> list[str]:
    """Paths (relative to the filesystem root) of every file under the table."""
    base = pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())
    infos = base.get_file_info(pafs.FileSelector(TABLE, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File)


def referenced(table: EncryptedTable) -> set[str]:
    """Filesystem paths of every file reachable from any snapshot of ``table``."""
    from icecrypt.table.ops import write as _write  # the write path's own walk of a version (a reader, not a mock)

    target = _write._Target.of(table)
    manager = target.manager(table.metadata)
    io = target.io(manager)
    cache: dict = {}
    found: set[str] = set()
    for snapshot in table.metadata.get("snapshots") or []:
        found |= _write._referenced_files(io, manager, snapshot, cache, live_only=False)
    return {table.fs_path(location) for location in found}


@dataclass
class Outcome:
    version: int
    orphans: list[str]
    temporaries: list[str]


def check_state(world: World, root: str, ref: Reference, *, strict: bool, old_files: set[str]) -> Outcome:
    """Invariants 1-4 of the module docstring; returns what was left over."""
    t, _ = world.load(root)
    v = version(t)
    if ref.name in MULTI_COMMIT:
        # Every intermediate version of these operations keeps main's rows (rekey
        # re-encrypts them; a cherry-pick changes them by its last commit only).
        assert ref.old_version <= v <= ref.new_version, f"loaded version {v} outside the run's versions"
        if ref.name == "rekey":
            assert ref.old_digest == ref.new_digest
        want = ref.new_digest if v == ref.new_version else ref.old_digest
    else:
        assert v in (ref.old_version, ref.new_version), f"third state: loaded version {v}"
        want = ref.old_digest if v == ref.old_version else ref.new_digest
    assert digest(t.scan().to_arrow()) == want, f"rows of version {v} differ from that version's rows"
    report = t.verify()
    assert report.ok, str(report)

    committed = referenced(t)
    metadata_dir = posixpath.join(TABLE, "metadata")
    orphans, temporaries = [], []
    for path in _listing(root):
        name = posixpath.basename(path)
        match = _VERSION.match(name)
        if posixpath.dirname(path) == metadata_dir and match:
            assert int(match.group(1)) <= v, f"{path}: a metadata version beyond the loaded one ({v})"
            with open(os.path.join(root, path), "rb") as f:
                json.loads(f.read())  # every version file present is complete
            continue
        if path == posixpath.join(metadata_dir, "version-hint.text"):
            with open(os.path.join(root, path), "rb") as f:
                text = f.read().decode("ascii", "replace").strip()
            if text.isdigit():
                assert int(text) <= v, f"version hint {text} beyond the loaded version {v}"
            continue
        if path in committed:
            continue
        if name.startswith("."):
            temporaries.append(path)
        else:
            orphans.append(path)
    if strict:
        assert not temporaries, f"temporary files left after a raised fault: {temporaries}"
        fresh = [p for p in orphans if p not in old_files]
        assert not fresh, f"files written by the failed operation left under final names: {fresh}"
    return Outcome(v, orphans, temporaries)


def check_retry(world: World, table: EncryptedTable, root: str, name: str, ref: Reference, loaded: int) -> None:
    """Invariant 5: the retry succeeds on the same table object."""
    OPERATIONS[name](table)
    t, _ = world.load(root)
    report = t.verify()
    assert report.ok, str(report)
    want = ref.twice_digest if loaded == ref.new_version else ref.new_digest
    assert digest(t.scan().to_arrow()) == want, "rows after the retry are not one fault-free run's"


def sample_points(census: list[tuple[str, str]], limit: int) -> list[int]:
    """1-based call numbers: the first and last call, the first call of each distinct
    kind, then evenly spaced ones, up to ``limit`` (at least the mandatory ones)."""
    n = len(census)
    chosen = {1, n}
    seen: set[str] = set()
    for i, (operation, _) in enumerate(census, 1):
        if operation not in seen:
            seen.add(operation)
            chosen.add(i)
    k = max(0, limit - len(chosen))
    for j in range(k):
        chosen.add(1 + round(j * (n - 1) / max(1, k - 1)))
    return sorted(chosen)


def wait_ms() -> int:
    return time.time_ns() // 1_000_000
