"""Maintenance actions of several steps: compaction, manifest rewrites, rekeying, orphan
removal and key usage (``actions``), and the repair of keys a foreign writer dropped
(``repair``)."""
