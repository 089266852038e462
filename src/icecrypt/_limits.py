"""Size caps on the JSON documents icecrypt reads whole from storage (``metadata.json``,
key manifests): what a crafted file can cost before it is parsed."""

from __future__ import annotations

import os

__all__ = ["DEFAULT_MAX_METADATA_BYTES", "MAX_METADATA_BYTES_ENV", "max_metadata_bytes"]

#: default cap on the (decompressed) size of a ``metadata.json`` or key manifest: a table
#: with 10,000 snapshots has 0.2-2 MB of metadata; this is generous and still bounds what
#: a crafted (say, gzip-compressed) file costs before its JSON is parsed
DEFAULT_MAX_METADATA_BYTES = 128 << 20
#: environment variable overriding :data:`DEFAULT_MAX_METADATA_BYTES` (a byte count)
MAX_METADATA_BYTES_ENV = "ICECRYPT_MAX_METADATA_BYTES"


def max_metadata_bytes() -> int:
    """The size cap of a ``metadata.json`` (after decompression) or a key manifest:
    ``$ICECRYPT_MAX_METADATA_BYTES`` when set, else :data:`DEFAULT_MAX_METADATA_BYTES`."""
    raw = os.environ.get(MAX_METADATA_BYTES_ENV)
    if not raw:
        return DEFAULT_MAX_METADATA_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{MAX_METADATA_BYTES_ENV} must be a positive number of bytes, not {raw!r}")
    return value
