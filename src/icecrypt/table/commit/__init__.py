"""Committing: the stores of table versions (``store``: a path table's ``v<N>.metadata.json``,
a catalog's compare-and-swap), the one retry loop (``committer``), what a table object holds
fixed (``pin``) and what a commit cleans after itself (``housekeeping``)."""
