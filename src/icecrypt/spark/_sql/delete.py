"""``DELETE FROM`` of the SQL catalog (``IcebergTable.deleteWhere``, Spark's
``SupportsDeleteV2``) on the driver.

Spark hands the statement's condition over as predicates when every one of them has an
Iceberg row filter form (``canDeleteWhere``; :mod:`.filters`, strict).  The rows
matching it are deleted by the table API's row-level delete, as the table's
``write.delete.mode`` says: ``copy-on-write`` (Iceberg's default: files holding matching
rows are rewritten, files all of whose rows match are dropped without being read) or
``merge-on-read`` (deletion vectors, or position delete files in format version 2).  One
commit, checked against concurrent commits at the table's isolation level; the files
written are encrypted with fresh DEKs as every write of the table API.  A condition
without an Iceberg form (a subquery, a function Iceberg has no filter for) is refused by
Spark before anything runs.
"""

from __future__ import annotations

from typing import Any

from icecrypt.spark._sql.filters import to_filter
from icecrypt.spark._sql.protocol import catalog_of, method
from icecrypt.spark._sql.write import writable_table


@method("delete_where")
def _delete_where(bridge: Any, request: dict[str, Any]) -> Any:
    from icecrypt.spark._common import file_error
    from icecrypt.table.ops import rowlevel as _rowlevel

    _, catalog = catalog_of(request)
    table, what, branch = writable_table(catalog, request["ref"], same_spec=False)
    if request["ref"].get("wap_id") is not None:
        raise NotImplementedError(f"{what}: DELETE FROM cannot be staged with spark.wap.id (it stages appends): "
                                  "unset it, or delete on a branch (spark.wap.branch)")
    try:
        row_filter = to_filter(request.get("filters") or [], table.schema, strict=True)
    except ValueError as exc:
        raise ValueError(f"{what}: DELETE FROM: {exc}") from None
    try:
        snapshot_id = _rowlevel.delete_rows(table, row_filter, branch=branch)
    except Exception as exc:
        raise file_error(exc, f"{what}: DELETE FROM") from exc
    return {"snapshot_id": snapshot_id}
