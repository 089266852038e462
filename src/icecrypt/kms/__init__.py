"""Key management clients: wrap and unwrap key-encryption keys with a master key."""

from icecrypt.kms.base import (
    KMS_IMPL,
    KMS_TYPE,
    KeyManagementClient,
    create_kms_client,
    kms_types,
)

__all__ = ["KMS_IMPL", "KMS_TYPE", "KeyManagementClient", "create_kms_client", "kms_types", "MemoryKms"]


def __getattr__(name):
    # MemoryKms is re-exported lazily so that importing icecrypt.kms stays cheap.
    if name == "MemoryKms":
        from icecrypt.kms.memory import MemoryKms

        return MemoryKms
    raise AttributeError(name)
