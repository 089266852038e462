"""Reading a table: planning and scans (``scan``), incremental and changelog scans
(``incremental``), snapshot selection by id, time, branch or tag (``travel``), the metadata
tables (``inspect``) and full verification (``verify``)."""
