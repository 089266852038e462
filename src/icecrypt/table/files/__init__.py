"""The table's files: encrypted reads and writes (``io``, ``write_io``), ``metadata.json``
(``metadata``), manifests and manifest lists (``manifest``, ``manifest_write``, ``merge``),
data files (``read``, ``write_data``) and delete files (``deletes``, ``write_dv``)."""
