"""The table model: pure descriptions of a table and of changes to it (no IO, no KMS).

``changes`` holds Iceberg's table updates and requirements (the REST catalog vocabulary)
and applies them to a metadata document; ``schema``, ``metadata_columns`` and
``retention`` are the schema conversions, the reserved metadata columns and the snapshot
retention rules the operations share."""
