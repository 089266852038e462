"""Iceberg's ``create_changelog_view`` procedure: a temporary view of a table's changelog
(``db.t.changes``, planned by :func:`.scan.plan_changelog`) with carry-over rows removed,
net changes, or update images, as Iceberg's Spark runtime builds it.

Iceberg's procedure repartitions the changelog and walks each partition's sorted rows
(``ChangelogIterator`` and its subclasses).  Here each of its rules is a grouping or a
window of the same rows, so the view is an ordinary Spark plan (lazy, distributed, no
Python in the executors):

* **carry-over rows** (a copy-on-write rewrite deletes a file's rows and inserts the ones
  it keeps, unchanged): rows equal in every column but the change type cancel in pairs,
  one ``DELETE`` against one ``INSERT``; what remains of the larger side is kept;
* **net changes** (``net_changes``): the same, with the ordinal and snapshot columns left
  out of the comparison, over the whole range in ordinal order: a row inserted and then
  deleted is gone; what remains is shown with the change (type, ordinal, snapshot) of the
  change that started the last uncancelled run, as Iceberg's iterator keeps it;
* **update images** (``compute_updates``, by default when ``identifier_columns`` is given):
  after carry-over removal, a ``DELETE`` and an ``INSERT`` of one change ordinal with equal
  identifier columns become ``UPDATE_BEFORE`` / ``UPDATE_AFTER``; two deletes of one
  identifier in one change fail the view's query, naming the columns, as in Iceberg.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHANGELOG_OPTIONS", "check_range", "create_view"]

CHANGE_TYPE, CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID = "_change_type", "_change_ordinal", "_commit_snapshot_id"
CHANGE_COLUMNS = (CHANGE_TYPE, CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID)
#: the read options of a changelog (Iceberg's ``db.t.changes``): the range of snapshots
CHANGELOG_OPTIONS = ("start-snapshot-id", "end-snapshot-id", "start-timestamp", "end-timestamp")


def quote(name: str) -> str:
    """A column or identifier part as Spark reads it literally."""
    return "`" + name.replace("`", "``") + "`"


def create_view(spark: Any, catalog_name: str, ident: tuple[str, ...], table: Any, args: dict[str, Any]) -> str:
    """Create (or replace) the temporary view ``args["changelog_view"]`` (default
    ``<table>_changes``) of the changelog of table ``ident`` of the catalog in ``spark``;
    the view's name as given."""
    options = {str(k).lower(): str(v) for k, v in (args.get("options") or {}).items()}  # as Spark's reader
    net = bool(args.get("net_changes"))
    given = args.get("identifier_columns")
    identifiers = [str(c) for c in given] if given is not None else sorted(table.schema.identifier_field_names())
    compute = args.get("compute_updates")
    compute = given is not None if compute is None else bool(compute)
    check_range(table, options)
    frame = spark.read.options(**options).table(".".join(quote(p) for p in (catalog_name, *ident, "changes")))
    data = [f for f in frame.schema.fields if f.name not in CHANGE_COLUMNS]
    unknown = [c for c in identifiers if c not in {f.name for f in data}]
    if unknown:
        raise ValueError(f"identifier column {unknown[0]!r} is not a column of the table")
    unorderable = [f.name for f in data if "map<" in f.dataType.simpleString()]
    if unorderable and not identifiers:
        raise ValueError(f"identifier columns are required: the table has columns that cannot be compared "
                         f"({', '.join(unorderable)})")
    if compute:
        if net:
            raise ValueError("net_changes and update images (compute_updates, identifier_columns) cannot be combined")
        if not identifiers:
            raise ValueError("cannot compute update images: no identifier columns (give identifier_columns, or "
                             "set the table's identifier fields)")
    if unorderable:
        raise ValueError(f"column {unorderable[0]!r} is a map, which Spark cannot group rows by: the changelog view "
                         "cannot compare its rows")
    names = [f.name for f in data]
    if net:
        view = _net_changes(frame, names)
    else:
        view = _without_carryovers(frame, names)
        if compute:
            view = _update_images(view, identifiers)
    name = args.get("changelog_view") or f"`{ident[-1]}_changes`"
    view.createOrReplaceTempView(name)
    return name


def check_range(table: Any, options: dict[str, str]) -> dict[str, Any]:
    """The changelog range ``options`` select (``from_snapshot_id``, ``to_snapshot_id``),
    refusing unknown options, malformed values and unknown snapshots, as
    :func:`.scan.plan_changelog` reads them."""
    from icecrypt.spark import _iceberg as ib

    unknown = sorted(set(options) - set(CHANGELOG_OPTIONS))
    if unknown:
        raise ValueError(f"read option {unknown[0]} is not supported (options: {', '.join(CHANGELOG_OPTIONS)})")
    try:
        selected = ib._incremental(table, {**options, ib.OPT_CHANGELOG: "true"})
    except (ValueError, LookupError) as exc:
        raise type(exc)(str(exc).removeprefix(ib.NAME + ": ")) from None
    if table.current_snapshot_id is not None:
        try:  # the range is resolved (snapshots found, ancestry checked) when the scan is made
            table.changelog_scan(**selected)
        except KeyError as exc:
            raise LookupError(exc.args[0] if exc.args else str(exc)) from None
    return selected


def _sign(functions: Any) -> Any:
    return functions.when(functions.col(CHANGE_TYPE) == "INSERT", 1).otherwise(-1)


def _without_carryovers(frame: Any, names: list[str]) -> Any:
    """Rows equal but for the change type cancel in DELETE/INSERT pairs."""
    from pyspark.sql import functions as F

    keys = [*names, CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID]
    counted = frame.groupBy(*[F.col(quote(c)) for c in keys]).agg(F.sum(_sign(F)).alias("__icecrypt_n"))
    n = F.col("__icecrypt_n")
    return (counted.where(n != 0)
            .withColumn("__icecrypt_copy", F.explode(F.sequence(F.lit(1), F.abs(n))))
            .select(*[F.col(quote(c)) for c in names],
                    F.when(n > 0, F.lit("INSERT")).otherwise(F.lit("DELETE")).alias(CHANGE_TYPE),
                    F.col(CHANGE_ORDINAL), F.col(COMMIT_SNAPSHOT_ID)))


def _net_changes(frame: Any, names: list[str]) -> Any:
    """Per row value over the whole range (ordinal order, DELETE before INSERT within an
    ordinal): the running count of inserts less deletes; rows cancel while it returns to
    zero, and the rest is the change after its last zero, repeated |total| times."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    group = [F.col(quote(c)) for c in names]
    ordered = Window.partitionBy(*group).orderBy(F.col(CHANGE_ORDINAL), F.col(CHANGE_TYPE))
    whole = Window.partitionBy(*group)
    running = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    marked = (frame
              .withColumn("__icecrypt_rn", F.row_number().over(ordered))
              .withColumn("__icecrypt_sum", F.sum(_sign(F)).over(running))
              .withColumn("__icecrypt_total", F.sum(_sign(F)).over(whole)))
    last_zero = F.max(F.when(F.col("__icecrypt_sum") == 0, F.col("__icecrypt_rn"))).over(whole)
    marked = marked.withColumn("__icecrypt_start", F.coalesce(last_zero, F.lit(0)) + 1)
    total = F.col("__icecrypt_total")
    return (marked.where((total != 0) & (F.col("__icecrypt_rn") == F.col("__icecrypt_start")))
            .withColumn("__icecrypt_copy", F.explode(F.sequence(F.lit(1), F.abs(total))))
            .select(*[F.col(quote(c)) for c in frame.columns]))


def _update_images(frame: Any, identifiers: list[str]) -> Any:
    """A DELETE and an INSERT of one ordinal with equal identifier columns become
    UPDATE_BEFORE and UPDATE_AFTER (a second INSERT stays one)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    group = Window.partitionBy(*[F.col(quote(c)) for c in identifiers], F.col(CHANGE_ORDINAL))
    deletes = F.sum(F.when(F.col(CHANGE_TYPE) == "DELETE", 1).otherwise(0)).over(group)
    inserts = F.sum(F.when(F.col(CHANGE_TYPE) == "INSERT", 1).otherwise(0)).over(group)
    rank = F.row_number().over(group.orderBy(F.col(CHANGE_TYPE)))
    kind = F.col(CHANGE_TYPE)
    message = (f"Cannot compute updates because there are multiple rows with the same identifier fields "
               f"([{','.join(identifiers)}]) in one change. Please make sure the rows are unique.")
    images = (F.when(deletes > 1, F.raise_error(F.lit(message)).cast("string"))
              .when((deletes == 1) & (inserts >= 1) & (kind == "DELETE"), F.lit("UPDATE_BEFORE"))
              .when((deletes == 1) & (kind == "INSERT") & (rank == 2), F.lit("UPDATE_AFTER"))
              .otherwise(kind))
    return frame.select(*[images.alias(CHANGE_TYPE) if c == CHANGE_TYPE else F.col(quote(c)) for c in frame.columns])
