"""Encrypted Apache Iceberg tables: read what Iceberg Java wrote, write what it reads.

The read path follows the key chain of Iceberg's table encryption (SPEC.md §3): table
metadata → snapshot ``key-id`` → KEK (unwrapped by the KMS) → manifest-list key metadata
→ manifest list → manifests → data and delete files, each decrypted and authenticated
with the key its parent holds.  See :class:`EncryptedTable`::

    from icecrypt.table import EncryptedTable
    table = EncryptedTable.load("warehouse/db/events", kms=kms)
    rows = table.scan(columns=["id", "amount"], row_filter="amount > 100").to_arrow()

Distributed readers plan on the driver and read anywhere::

    tasks = table.scan(row_filter=...).plan_files()     # picklable, keys inside
    batches = icecrypt.table.read_task(tasks[0], filesystem)
"""

from typing import TYPE_CHECKING, Any

#: each public name and the module that defines it, imported when first asked for: a process
#: that needs one layer (a Spark worker reading data files) does not import the others (the
#: writers, maintenance and what they import, pandas among them)
_EXPORTS = {
    "AddFilesError": "icecrypt.table.ops.add_files",
    "AddFilesResult": "icecrypt.table.ops.add_files",
    "ChangelogScan": "icecrypt.table.read.incremental",
    "ChangelogTask": "icecrypt.table.read.incremental",
    "ConvertTableResult": "icecrypt.table.maintenance.encrypt",
    "decrypt_table": "icecrypt.table.maintenance.encrypt",
    "encrypt_table": "icecrypt.table.maintenance.encrypt",
    "EncryptedTable": "icecrypt.table._table",
    "FileScanTask": "icecrypt.table.files.read",
    "IncrementalAppendScan": "icecrypt.table.read.incremental",
    "InspectTable": "icecrypt.table.read.inspect",
    "Locations": "icecrypt.table.files.io",
    "ManageSnapshots": "icecrypt.table.ops.refs",
    "MergeResult": "icecrypt.table.ops.rowlevel",
    "METADATA_TABLES": "icecrypt.table.read.inspect",
    "PlaintextFileError": "icecrypt.table.files.io",
    "PlanMetrics": "icecrypt.table.read.scan",
    "read_changelog_task": "icecrypt.table.read.incremental",
    "read_task": "icecrypt.table.files.read",
    "ReplaceSortOrder": "icecrypt.table.ops.sort_order",
    "Snapshot": "icecrypt.table.files.metadata",
    "TablePin": "icecrypt.table.commit.pin",
    "TableScan": "icecrypt.table.read.scan",
    "TaskFile": "icecrypt.table.files.read",
    "UpdateProperties": "icecrypt.table.ops.refs",
    "UpdateSchema": "icecrypt.table.ops.schema",
    "UpdateSpec": "icecrypt.table.ops.spec",
    "UpsertResult": "icecrypt.table.ops.rowlevel",
    "VerifyProblem": "icecrypt.table.read.verify",
    "VerifyReport": "icecrypt.table.read.verify",
}

__all__ = [
    "AddFilesError",
    "AddFilesResult",
    "ConvertTableResult",
    "ChangelogScan",
    "ChangelogTask",
    "EncryptedTable",
    "FileScanTask",
    "IncrementalAppendScan",
    "InspectTable",
    "Locations",
    "ManageSnapshots",
    "METADATA_TABLES",
    "MergeResult",
    "PlaintextFileError",
    "PlanMetrics",
    "ReplaceSortOrder",
    "Snapshot",
    "TablePin",
    "TableScan",
    "TaskFile",
    "UpdateProperties",
    "UpdateSchema",
    "UpdateSpec",
    "UpsertResult",
    "VerifyProblem",
    "VerifyReport",
    "decrypt_table",
    "encrypt_table",
    "read_changelog_task",
    "read_task",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from icecrypt.table.ops.add_files import AddFilesError, AddFilesResult
    from icecrypt.table.maintenance.encrypt import ConvertTableResult, decrypt_table, encrypt_table
    from icecrypt.table.read.inspect import METADATA_TABLES, InspectTable
    from icecrypt.table.files.io import Locations, PlaintextFileError
    from icecrypt.table.files.metadata import Snapshot
    from icecrypt.table.commit.pin import TablePin
    from icecrypt.table.ops.refs import ManageSnapshots, UpdateProperties
    from icecrypt.table.ops.rowlevel import MergeResult, UpsertResult
    from icecrypt.table.files.read import FileScanTask, TaskFile, read_task
    from icecrypt.table.read.scan import PlanMetrics, TableScan
    from icecrypt.table.ops.schema import UpdateSchema
    from icecrypt.table.ops.sort_order import ReplaceSortOrder
    from icecrypt.table.ops.spec import UpdateSpec
    from icecrypt.table.read.incremental import ChangelogScan, ChangelogTask, IncrementalAppendScan, read_changelog_task
    from icecrypt.table._table import EncryptedTable
    from icecrypt.table.read.verify import VerifyProblem, VerifyReport
