"""``icecrypt.spark.rewrite_data_files``: the bin-pack rewrite of an encrypted table with
its file work in Spark executors and one commit on the driver."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["rewrite_data_files"]


def _open(
    table_path: str, kms_properties: Mapping[str, str], location_map: Mapping[str, str] | None,
    table_key_id: str | None = None, table_uuid: str | None = None,
) -> Any:
    from icecrypt.spark import _keys
    from icecrypt.table import EncryptedTable

    return EncryptedTable.load(table_path, kms=_keys.kms_client(dict(kms_properties)), location_map=location_map,
                               table_key_id=table_key_id, table_uuid=table_uuid)


def rewrite_data_files(
    spark: Any,
    table_path: str,
    *,
    kms_properties: Mapping[str, str],
    target_file_size: int | None = None,
    row_filter: Any = None,
    options: Mapping[str, Any] | None = None,
    location_map: Mapping[str, str] | None = None,
    table_key_id: str | None = None,
) -> Any:
    """Plan the rewrite on the driver, rewrite each file group in an executor (rows read
    with their deletes applied, written under fresh DEKs; the executor opens the table
    with the KMS ``kms_properties`` describe), and commit once on the driver
    (``icecrypt.table.maintenance.actions.commit_rewrite``).  Returns the
    ``RewriteDataFilesResult``.  Files of a failed job are deleted when Spark reports
    them; those of killed executors are orphans for ``remove_orphan_files``.
    ``table_key_id``: the table's master key id (as ``EncryptedTable.load``); the
    executors build only on versions that keep the driver's key id and table UUID."""
    from icecrypt.table.maintenance import actions as _maintenance
    from icecrypt.table.ops import write as w

    properties = dict(kms_properties)
    mapping = dict(location_map) if location_map else None
    table = _open(table_path, properties, mapping, table_key_id)
    key_id, table_uuid = table.pin.table_key_id, table.pin.table_uuid
    plan = _maintenance.plan_rewrite(table, target_file_size, row_filter, dict(options or {}))
    if not plan.groups:
        return _maintenance.RewriteDataFilesResult(table.current_snapshot_id)
    location = table.metadata_location

    def run(group: Any) -> list[dict[str, Any]]:
        return _maintenance.rewrite_group(_open(location, properties, mapping, key_id, table_uuid), plan, group)

    groups = plan.groups
    rdd = spark.sparkContext.parallelize(groups, len(groups))
    new_files = [f for files in rdd.map(run).collect() for f in files]
    try:
        return _maintenance.commit_rewrite(table, plan, new_files)
    except BaseException as exc:  # kept when the commit landed or may have (the version names them)
        w._discard(w._Target.of(table).io(None), [f["file_path"] for f in new_files], exc)
        raise
