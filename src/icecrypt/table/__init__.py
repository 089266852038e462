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

from icecrypt.table._inspect import METADATA_TABLES, InspectTable
from icecrypt.table._io import Locations, PlaintextFileError
from icecrypt.table._metadata import Snapshot
from icecrypt.table._pin import TablePin
from icecrypt.table._refs import ManageSnapshots, UpdateProperties
from icecrypt.table._read import FileScanTask, TaskFile, read_task
from icecrypt.table._scan import PlanMetrics, TableScan
from icecrypt.table._sort_order import ReplaceSortOrder
from icecrypt.table._spec_update import UpdateSpec
from icecrypt.table._table import EncryptedTable
from icecrypt.table._verify import VerifyProblem, VerifyReport

__all__ = [
    "EncryptedTable",
    "FileScanTask",
    "InspectTable",
    "Locations",
    "ManageSnapshots",
    "METADATA_TABLES",
    "PlaintextFileError",
    "PlanMetrics",
    "ReplaceSortOrder",
    "Snapshot",
    "TablePin",
    "TableScan",
    "TaskFile",
    "UpdateProperties",
    "UpdateSpec",
    "VerifyProblem",
    "VerifyReport",
    "read_task",
]
