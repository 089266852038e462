"""The key management client protocol and how a client is chosen from properties.

A KMS only ever wraps and unwraps key-encryption keys (KEKs) with a master key that it
holds (SPEC.md section 4); data keys never reach it.  Clients are chosen the way Iceberg
Java's catalogs choose them: ``encryption.kms-type`` names a built-in or registered type,
or ``encryption.kms-impl`` names a class (``package.module.Class`` or
``package.module:Class``) constructed without arguments and then ``initialize``-d with
all the properties.  Third parties register types under the ``icecrypt.kms`` entry-point
group.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Mapping
from importlib import metadata

from icecrypt.errors import KmsError

KMS_TYPE = "encryption.kms-type"
KMS_IMPL = "encryption.kms-impl"
ENTRY_POINT_GROUP = "icecrypt.kms"

# kms-type -> "module:Class"; modules are imported only when their type is asked for, so
# the heavy client libraries (boto3, hvac, ...) stay optional extras.
BUILTIN_KMS_TYPES: dict[str, str] = {
    "memory": "icecrypt.kms.memory:MemoryKms",
    "local": "icecrypt.kms.local:LocalKms",
    "aws": "icecrypt.kms.aws:AwsKms",
    "vault": "icecrypt.kms.vault:VaultKms",
    "kmip": "icecrypt.kms.kmip:KmipKms",
    "pkcs11": "icecrypt.kms.pkcs11:Pkcs11Kms",
    "gcp": "icecrypt.kms.gcp:GcpKms",
    "azure": "icecrypt.kms.azure:AzureKms",
}


class KeyManagementClient(abc.ABC):
    """Wraps and unwraps keys with master keys held by a key management service.

    Implementations are constructed without arguments (or with their own keyword
    arguments) and configured by :meth:`initialize`; they must be safe to call from
    several threads at once.  Every failure is raised as a :class:`icecrypt.KmsError`
    subclass that keeps the backend's message; key bytes never appear in a message.
    """

    #: the ``encryption.kms-type`` name of the backend, used in error messages
    kms_type: str = "custom"

    def initialize(self, properties: Mapping[str, str]) -> None:  # noqa: B027 - optional hook
        """Configure the client from catalog properties (called once, after construction)."""

    @abc.abstractmethod
    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        """Return ``key`` encrypted (wrapped) under the master key ``wrapping_key_id``."""

    @abc.abstractmethod
    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        """Return the key that :meth:`wrap_key` wrapped under ``wrapping_key_id``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and sessions.  Idempotent."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} kms-type={self.kms_type!r}>"


def _load_object(path: str):
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise KmsError(f"invalid {KMS_IMPL} {path!r}: expected 'package.module.Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise KmsError(f"cannot import KMS implementation {path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise KmsError(f"module {module_name!r} has no KMS implementation {attr!r}") from None


def _entry_point_types() -> dict[str, metadata.EntryPoint]:
    return {ep.name.lower(): ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def kms_types() -> list[str]:
    """The ``encryption.kms-type`` names known here: built-in and registered."""
    return sorted(set(BUILTIN_KMS_TYPES) | set(_entry_point_types()))


def create_kms_client(properties: Mapping[str, str]) -> KeyManagementClient:
    """Build and initialize the KMS client that ``properties`` select.

    Exactly one of ``encryption.kms-type`` (case-insensitive) and ``encryption.kms-impl``
    must be set, as in Iceberg Java.
    """
    properties = dict(properties)
    kms_type = properties.get(KMS_TYPE)
    kms_impl = properties.get(KMS_IMPL)
    if kms_type and kms_impl:
        raise KmsError(f"cannot set both {KMS_TYPE} and {KMS_IMPL}")
    if kms_type:
        name = kms_type.strip().lower()
        if name in BUILTIN_KMS_TYPES:
            cls = _load_object(BUILTIN_KMS_TYPES[name])
        else:
            entry = _entry_point_types().get(name)
            if entry is None:
                raise KmsError(f"unknown {KMS_TYPE} {kms_type!r}; known types: {', '.join(kms_types())}")
            cls = entry.load()
    elif kms_impl:
        cls = _load_object(kms_impl)
    else:
        raise KmsError(f"no KMS configured: set {KMS_TYPE} or {KMS_IMPL}")
    if not (isinstance(cls, type) and issubclass(cls, KeyManagementClient)):
        raise KmsError(f"{cls!r} is not a KeyManagementClient")
    client = cls()
    client.initialize(properties)
    return client
