"""``add_files`` with an I/O error injected at every filesystem call it makes: the caller's
files are never deleted or changed, and the table is at its old version (the rows it had)
or at the new one (the rows with the added files'), with nothing else left behind than
what a committed version references."""

from __future__ import annotations

import hashlib
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
from faultfs import FaultPlan, InjectedFault, failing_filesystem
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from icecrypt.table import EncryptedTable

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "region", StringType(), required=False))
SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
ADDED = ("t/landing/region=eu/a.parquet", "t/landing/region=us/b.parquet")


def _template(root: str) -> None:
    fs, _ = failing_filesystem(root)
    table = EncryptedTable.create("t", SCHEMA, kms=None, table_key_id=None, partition_spec=SPEC, filesystem=fs)
    table.append(pa.table({"id": [1], "region": ["eu"]}))
    for i, path in enumerate(ADDED):
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        pq.write_table(pa.table({"id": [10 + i, 20 + i]}), os.path.join(root, path))


def _digests(root: str) -> dict[str, str]:
    out = {}
    for path in ADDED:
        with open(os.path.join(root, path), "rb") as f:
            out[path] = hashlib.sha256(f.read()).hexdigest()
    return out


def _files(root: str) -> set[str]:
    out = set()
    for base, _, names in os.walk(os.path.join(root, "t")):
        out |= {os.path.relpath(os.path.join(base, n), root) for n in names}
    return out


def _run(root: str, plan: FaultPlan) -> None:
    fs, _ = failing_filesystem(root, plan)
    table = EncryptedTable.load("t", kms=None, filesystem=fs)
    table.add_files(list(ADDED), partition_values={ADDED[0]: {"region": "eu"}, ADDED[1]: {"region": "us"}})


def _rows(root: str) -> tuple[int, list[tuple]]:
    fs, _ = failing_filesystem(root)
    table = EncryptedTable.load("t", kms=None, filesystem=fs)
    rows = sorted((r["id"], r["region"]) for r in table.scan().to_arrow().to_pylist())
    return len(table.snapshots()), rows


def test_a_fault_at_every_call_never_touches_the_callers_files(tmp_path):
    template = str(tmp_path / "template")
    _template(template)
    digests, old_files = _digests(template), _files(template)
    reference = str(tmp_path / "reference")
    shutil.copytree(template, reference)
    census = FaultPlan()
    _run(reference, census)
    old, new = _rows(template), _rows(reference)
    assert new[1] == sorted([(1, "eu"), (10, "eu"), (20, "eu"), (11, "us"), (21, "us")])
    assert census.count > 5
    for at in range(1, census.count + 1):
        root = str(tmp_path / f"case{at}")
        shutil.copytree(template, root)
        plan = FaultPlan(at=at)
        try:
            _run(root, plan)
        except InjectedFault:
            pass
        assert plan.fired is not None, at
        assert _digests(root) == digests, plan.fired
        state = _rows(root)
        assert state in (old, new), (plan.fired, state)
        if state == old:  # the failed commit cleaned up after itself
            left = {f for f in _files(root) - old_files if not os.path.basename(f).startswith(".")}
            operation, path = plan.fired
            if operation in ("write", "close"):
                # this filesystem is no renaming one, so files are written in place, as on an
                # object store, where the upload that failed publishes nothing
                left.discard(path)
            assert not left, (plan.fired, left)
        shutil.rmtree(root)
