"""Iceberg's key material: per-file key metadata, the DEK/KEK/master-key hierarchy and
the ``encryption-keys`` list of table metadata (SPEC.md §2-3)."""

from icecrypt.keys.encrypted_key import KEY_TIMESTAMP, EncryptedKey
from icecrypt.keys.manager import (
    ENCRYPTION_DEK_LENGTH,
    ENCRYPTION_TABLE_KEY,
    KEK_LIFESPAN_MS,
    EncryptionKeyNotFoundError,
    EncryptionManager,
    read_encryption_keys,
    referenced_keys,
    removable_keys,
    snapshot_key_ids,
    unwrap_key_metadata,
    validate_table_properties,
    with_snapshot_key_id,
    wrap_key_metadata,
    write_encryption_keys,
)
from icecrypt.keys.manifest import read_key_manifest, write_key_manifest
from icecrypt.keys.metadata import StandardKeyMetadata

__all__ = [
    "ENCRYPTION_DEK_LENGTH",
    "ENCRYPTION_TABLE_KEY",
    "KEK_LIFESPAN_MS",
    "KEY_TIMESTAMP",
    "EncryptedKey",
    "EncryptionKeyNotFoundError",
    "EncryptionManager",
    "StandardKeyMetadata",
    "read_encryption_keys",
    "read_key_manifest",
    "referenced_keys",
    "removable_keys",
    "snapshot_key_ids",
    "unwrap_key_metadata",
    "validate_table_properties",
    "with_snapshot_key_id",
    "wrap_key_metadata",
    "write_encryption_keys",
    "write_key_manifest",
]
