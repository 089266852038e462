"""The names of a table's metadata tables, in a module that imports nothing (the CLI's
parser lists them without loading the table package)."""

#: The metadata tables, by name (``table.inspect.table(name)``, the CLI, Spark's
#: ``metadata-table`` option).
METADATA_TABLES = (
    "snapshots",
    "history",
    "refs",
    "metadata_log_entries",
    "manifests",
    "all_manifests",
    "entries",
    "all_entries",
    "files",
    "data_files",
    "delete_files",
    "partitions",
    "position_deletes",
    "all_files",
    "all_data_files",
    "all_delete_files",
)
