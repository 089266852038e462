"""Size caps on what icecrypt reads from storage: the JSON documents it reads whole
(``metadata.json``, key manifests) and the bytes an Avro data file inflates to: what a
crafted file can cost before it is refused."""

from __future__ import annotations

import os

__all__ = [
    "DEFAULT_MAX_AVRO_FILE_BYTES",
    "DEFAULT_MAX_METADATA_BYTES",
    "MAX_AVRO_FILE_BYTES_ENV",
    "MAX_METADATA_BYTES_ENV",
    "max_avro_file_bytes",
    "max_metadata_bytes",
]

#: default cap on the (decompressed) size of a ``metadata.json`` or key manifest: a table
#: with 10,000 snapshots has 0.2-2 MB of metadata; this is generous and still bounds what
#: a crafted (say, gzip-compressed) file costs before its JSON is parsed
DEFAULT_MAX_METADATA_BYTES = 128 << 20
#: environment variable overriding :data:`DEFAULT_MAX_METADATA_BYTES` (a byte count)
MAX_METADATA_BYTES_ENV = "ICECRYPT_MAX_METADATA_BYTES"


#: default cap on the bytes the blocks of one Avro data file (or the part of it one
#: reader reads) inflate to: each block is capped already (``icecrypt.avro._guard``), but a file of
#: many blocks of deflated zeros inflates about a thousandfold.  Iceberg's writers close a
#: data file at ``write.target-file-size-bytes`` (512 MiB by default): this is 32 times that
DEFAULT_MAX_AVRO_FILE_BYTES = 16 << 30
#: environment variable overriding :data:`DEFAULT_MAX_AVRO_FILE_BYTES` (a byte count)
MAX_AVRO_FILE_BYTES_ENV = "ICECRYPT_MAX_AVRO_FILE_BYTES"


def _bytes_from_env(name: str, default: int) -> int:
    """``$name`` as a positive number of bytes when set, else ``default``."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{name} must be a positive number of bytes, not {raw!r}")
    return value


def max_metadata_bytes() -> int:
    """The size cap of a ``metadata.json`` (after decompression) or a key manifest:
    ``$ICECRYPT_MAX_METADATA_BYTES`` when set, else :data:`DEFAULT_MAX_METADATA_BYTES`."""
    return _bytes_from_env(MAX_METADATA_BYTES_ENV, DEFAULT_MAX_METADATA_BYTES)


def max_avro_file_bytes() -> int:
    """The cap on what the blocks of one Avro data file inflate to, in all:
    ``$ICECRYPT_MAX_AVRO_FILE_BYTES`` when set, else :data:`DEFAULT_MAX_AVRO_FILE_BYTES`."""
    return _bytes_from_env(MAX_AVRO_FILE_BYTES_ENV, DEFAULT_MAX_AVRO_FILE_BYTES)
