"""Key management clients: wrap and unwrap key-encryption keys with a master key."""

from icecrypt.kms.base import (
    KMS_IMPL,
    KMS_TYPE,
    KeyManagementClient,
    create_kms_client,
    kms_types,
)

__all__ = ["KMS_IMPL", "KMS_TYPE", "KeyManagementClient", "LocalKms", "MemoryKms", "create_kms_client", "kms_types"]

_LAZY = {"MemoryKms": "icecrypt.kms.memory", "LocalKms": "icecrypt.kms.local"}


def __getattr__(name):
    # The embedded clients are re-exported lazily so that importing icecrypt.kms stays cheap.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'icecrypt.kms' has no attribute {name!r}")
