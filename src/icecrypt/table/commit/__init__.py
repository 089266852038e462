"""Committing: the stores of table versions (``store``: a path table's ``v<N>.metadata.json``,
a catalog's compare-and-swap), the table as the write path sees it (``target``), the one
retry loop (``committer``), what a table object holds fixed (``pin``), the interface the
layers above read a table through (``state``) and what a commit cleans after itself
(``housekeeping``)."""
