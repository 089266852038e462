"""v2-format position-delete files in a format-version 3 table, for tests.

icecrypt (like Iceberg Java on v3) writes deletion vectors only; a table upgraded from v2
may still hold position-delete files of the v2 format.  ``add_v2_position_deletes``
commits one the way such a table has it: a Parquet file of ``file_path``/``pos`` rows
(field ids 2147483546/2147483545), encrypted as the table's data files are (plaintext in
a plaintext table), in the partition of the data files it names."""

from __future__ import annotations

import uuid

import pyarrow as pa

from icecrypt.table import EncryptedTable


def _live_data(table: EncryptedTable) -> dict[str, tuple[int, dict]]:
    from icecrypt.table.maintenance import actions
    from icecrypt.table.ops import write as w

    target = w._Target.of(table)
    _, base = target.latest()
    manager = target.manager(base)
    live = actions._live(target.io(manager), manager, w._current_snapshot(base))
    return {e["data_file"]["file_path"]: (m["partition_spec_id"], e["data_file"]) for m, e in live.data()}


def add_v2_position_deletes(table: EncryptedTable, deletes: dict[str, list[int]], *, partition_of: str | None = None) -> dict:
    """Commit one v2-format position-delete file deleting ``deletes`` (data file path ->
    row positions), in the partition of ``partition_of`` (default: the first file named);
    returns its record."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC

    from icecrypt.table.files.manifest_write import POSITION_DELETES, write_manifest
    from icecrypt.table.files.read import _POSITION_DELETE_SCHEMA
    from icecrypt.table.files.write_data import DataWriteOptions, write_data_files
    from icecrypt.table.ops import write as w

    target = w._Target.of(table)
    base_location, base = target.latest()
    manager = target.manager(base)
    io = target.io(manager)
    layout = w.write_layout(target, base)
    rows = [(path, pos) for path in sorted(deletes) for pos in sorted(deletes[path])]
    data = pa.table({"file_path": [p for p, _ in rows], "pos": [n for _, n in rows]},
                    schema=pa.schema([pa.field("file_path", pa.string(), nullable=False),
                                      pa.field("pos", pa.int64(), nullable=False)]))  # fmt: skip
    written, _ = write_data_files(io, data, schema=_POSITION_DELETE_SCHEMA, spec=UNPARTITIONED_PARTITION_SPEC,
                                  layout=layout, properties={}, options=DataWriteOptions.from_properties({}))  # fmt: skip
    spec_id, owner = _live_data(table)[partition_of or min(deletes)]
    record = dict(written[0], content=POSITION_DELETES, partition=owner["partition"], sort_order_id=None,
                  first_row_id=None)  # fmt: skip
    snapshot_id = w._new_snapshot_id(base)
    manifest = write_manifest(io, layout.metadata_file(f"{uuid.uuid4()}-d0.avro"), w._added_entries([record], snapshot_id),
                              spec=w._specs(base)[spec_id], schema=w._schema(base), content=POSITION_DELETES)  # fmt: skip

    def build(version, version_manager):
        kept = w._read_manifest_list(target.io(version_manager), version_manager, w._current_snapshot(version))
        return w._Change("delete", [manifest], list(kept), [record], [], 0)

    w._commit_change(target, base_location, base, build, snapshot_id=snapshot_id, retry=False)
    table.refresh()
    return record


def v2_files(table: EncryptedTable) -> set[str]:
    """The live v2-format position-delete files of the table's current snapshot."""
    from icecrypt.table.maintenance import actions
    from icecrypt.table.ops import write as w

    target = w._Target.of(table)
    _, base = target.latest()
    manager = target.manager(base)
    live = actions._live(target.io(manager), manager, w._current_snapshot(base))
    return {e["data_file"]["file_path"] for _, e in live.deletes()
            if e["data_file"]["content"] == 1 and not w._is_dv(e["data_file"])}
