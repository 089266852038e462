"""Maintenance actions of several steps: compaction, manifest rewrites, rekeying, orphan
removal and key usage (``actions``), the repair of keys a foreign writer dropped
(``repair``), and turning a plaintext table into an encrypted one and back (``encrypt``)."""
