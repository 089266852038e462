"""icecrypt: Apache Iceberg table encryption for Python, byte-compatible with Iceberg Java.

Layers (each uses only the ones below it): ``icecrypt.ags1`` (the AES GCM Stream file
format), ``icecrypt.keys`` (StandardKeyMetadata, the DEK/KEK/master-key hierarchy) and
``icecrypt.kms`` (key management clients), over the native AES-GCM core ``icecrypt._gcm``.
"""

from icecrypt._gcm import get_default_threads, openssl_version, set_default_threads
from icecrypt.errors import (
    AuthenticationError,
    CatalogError,
    CommitConflictError,
    DecryptionError,
    EncryptionKeyNotFoundError,
    FormatError,
    IcecryptError,
    InsecureTransportWarning,
    KeyUsageLimitError,
    KmsAccessDeniedError,
    KmsError,
    KmsInvalidWrappedKeyError,
    KmsKeyNotFoundError,
    KmsUnavailableError,
    KeysLostError,
    PathOutsideTableError,
    RepairError,
    ReplayedKeyError,
    SnapshotIntegrityError,
    TableIdentityError,
    TableIntegrityError,
    TableVersionError,
)

from icecrypt._version import __version__

__all__ = [
    "AuthenticationError",
    "CatalogError",
    "CommitConflictError",
    "DecryptionError",
    "EncryptionKeyNotFoundError",
    "FormatError",
    "IcecryptError",
    "InsecureTransportWarning",
    "KeyUsageLimitError",
    "KeysLostError",
    "KmsAccessDeniedError",
    "KmsError",
    "KmsInvalidWrappedKeyError",
    "KmsKeyNotFoundError",
    "KmsUnavailableError",
    "PathOutsideTableError",
    "RepairError",
    "ReplayedKeyError",
    "SnapshotIntegrityError",
    "TableIdentityError",
    "TableIntegrityError",
    "TableVersionError",
    "get_default_threads",
    "openssl_version",
    "set_default_threads",
    "__version__",
]
