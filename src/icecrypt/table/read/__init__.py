"""Reading a table: planning and scans (``scan``), snapshot selection by id, time, branch or
tag (``travel``), the metadata tables (``inspect``) and full verification (``verify``)."""
