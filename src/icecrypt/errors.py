"""Exceptions raised by icecrypt.

Every error that reports a damaged or foreign file is a :class:`DecryptionError` (a
``ValueError``): :class:`AuthenticationError` when a GCM tag does not verify (wrong key,
wrong AAD prefix, tampered bytes), :class:`FormatError` when the bytes cannot be an AGS1
stream or a key-metadata blob at all (bad header, impossible length, truncation).
Messages name the file and the block; they never contain key bytes.
"""

from __future__ import annotations


class IcecryptError(Exception):
    """Base class of all icecrypt errors."""


class DecryptionError(IcecryptError, ValueError):
    """Input could not be decrypted; nothing unauthenticated was released."""


class AuthenticationError(DecryptionError):
    """A GCM tag check failed: wrong key or AAD prefix, or corrupt/tampered data."""


class FormatError(DecryptionError):
    """The input is not a well-formed AGS1 stream or key-metadata blob."""


class PathOutsideTableError(FormatError):
    """Table metadata (or a caller) names a location outside the table: not under the
    table's pinned location, ``write.data.path`` or ``write.metadata.path`` (nor under a
    location the caller allowed), or not a location at all (control characters, a
    backslash, an encoded dot segment).  Reads and writes there are refused; deletes are
    skipped and reported.  ``location``: the location as recorded; ``table_location``:
    the table it lies outside of (None when the location is refused by itself)."""

    def __init__(self, message: str, *, location: str | None = None, table_location: str | None = None):
        super().__init__(message)
        self.location = location
        self.table_location = table_location


class KeyUsageLimitError(IcecryptError):
    """A key has sealed the maximum number of GCM blocks (2**32, NIST SP 800-38D 8.3)."""


class EncryptionKeyNotFoundError(IcecryptError, LookupError):
    """An ``encryption-keys`` id that a snapshot or key refers to is not in the list."""


class CommitConflictError(IcecryptError):
    """A table commit lost a race with another writer and was not applied.

    Raised when another commit created the metadata version this one was about to
    create and the change cannot be re-applied on top of it (or retries ran out).
    Nothing of the refused commit is visible in the table; it may be retried.
    """


class CatalogError(IcecryptError):
    """A catalog refused an operation or holds something it cannot use.

    Messages name the catalog and the namespace or table identifier."""


class NoSuchNamespaceError(CatalogError, KeyError):
    """The namespace does not exist in the catalog."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class NoSuchTableError(CatalogError, KeyError):
    """The table does not exist in the catalog (or was dropped meanwhile)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NoSuchViewError(CatalogError, KeyError):
    """The view does not exist in the catalog."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ViewAlreadyExistsError(CatalogError):
    """A view (or a table) of that identifier exists already."""


class NamespaceAlreadyExistsError(CatalogError):
    """A namespace of that name exists already."""


class TableAlreadyExistsError(CatalogError):
    """A table of that identifier exists already."""


class NamespaceNotEmptyError(CatalogError):
    """The namespace still holds tables and cannot be dropped."""


class InvalidIdentifierError(CatalogError, ValueError):
    """A namespace or table identifier is malformed (empty, no namespace, empty level)."""


class KmsError(IcecryptError):
    """A key management service failed to wrap or unwrap a key.

    ``backend`` names the KMS type; the backend's own message is kept in the text and the
    original exception is chained as ``__cause__``.
    """

    def __init__(self, message: str, *, backend: str | None = None):
        super().__init__(message)
        self.backend = backend


class KmsKeyNotFoundError(KmsError):
    """The wrapping (master) key id is unknown to the KMS."""


class KmsAccessDeniedError(KmsError):
    """The KMS refused the operation (credentials, policy, disabled key)."""


class KmsInvalidWrappedKeyError(KmsError):
    """The wrapped key is malformed, tampered, or was wrapped by another key."""


class KmsUnavailableError(KmsError):
    """The KMS could not be reached or did not answer in time."""


__all__ = [
    "IcecryptError",
    "DecryptionError",
    "AuthenticationError",
    "FormatError",
    "PathOutsideTableError",
    "KeyUsageLimitError",
    "EncryptionKeyNotFoundError",
    "CommitConflictError",
    "CatalogError",
    "NoSuchNamespaceError",
    "NoSuchTableError",
    "NamespaceAlreadyExistsError",
    "TableAlreadyExistsError",
    "NoSuchViewError",
    "ViewAlreadyExistsError",
    "NamespaceNotEmptyError",
    "InvalidIdentifierError",
    "KmsError",
    "KmsKeyNotFoundError",
    "KmsAccessDeniedError",
    "KmsInvalidWrappedKeyError",
    "KmsUnavailableError",
]


# --- keys dropped by a writer that does not know encryption (icecrypt.table.maintenance.repair) -----


class KeysLostError(FormatError):
    """An encrypted table's current metadata lost keys its snapshots need: snapshots
    without ``key-id`` whose manifest lists are encrypted, ``key-id`` values naming no
    ``encryption-keys`` entry, or missing KEKs (typically a metadata-only commit by a
    writer that does not know Iceberg encryption).

    ``metadata_location``: the damaged metadata file; ``snapshot_ids``: the snapshots
    affected; ``dropped_by``: the first metadata file of the metadata-log that lacks
    them (the commit that dropped them), None when the log does not tell.
    ``EncryptedTable.repair_keys()`` / ``icecrypt table repair`` restores them.
    """

    def __init__(
        self, message: str, *, metadata_location: str, snapshot_ids: tuple[int, ...] = (), dropped_by: str | None = None
    ):
        super().__init__(message)
        self.metadata_location = metadata_location
        self.snapshot_ids = tuple(snapshot_ids)
        self.dropped_by = dropped_by


class RepairError(IcecryptError):
    """``repair_keys()`` refused: the previous metadata files disagree about a key, a
    needed key is in none of them, or a recovered key does not authenticate the file
    it is for.  Nothing was committed."""


__all__ += ["KeysLostError", "RepairError"]


# --- what a table object holds fixed (icecrypt.table.commit.pin) -------------------------------


class TableIdentityError(IcecryptError, ValueError):
    """A table version disagrees with what the table object pinned from a trusted source
    (the caller, the catalog database, or the version it first loaded): encryption
    removed or added, another master key id (``encryption.key-id``), another
    ``table-uuid``, another location.  Raised before anything is read through that
    version's keys or written on top of it.

    ``metadata_location``: the offending metadata file; ``changes``: what differs, as
    ``(field, pinned value, found value)`` triples (key ids and UUIDs, never key bytes);
    ``source``: where the pin came from (``"caller"``, ``"catalog"``, ``"loaded version"``).
    """

    def __init__(
        self, message: str, *, metadata_location: str = "", changes: tuple[tuple[str, object, object], ...] = (),
        source: str | None = None,
    ):
        super().__init__(message)
        self.metadata_location = metadata_location
        self.changes = tuple(changes)
        self.source = source


class TableVersionError(IcecryptError):
    """The table's current version cannot be resolved without going back in time: two
    metadata files both claim to be newest and neither lists the other in its
    ``metadata-log``, or the newest one by the version hint is an ancestor of the version
    this object holds.  ``metadata_locations``: the files involved.  Nothing was written."""

    def __init__(self, message: str, *, metadata_locations: tuple[str, ...] = ()):
        super().__init__(message)
        self.metadata_locations = tuple(metadata_locations)


class TableIntegrityError(IcecryptError, ValueError):
    """A table's metadata file is not what an authority recorded for it: its bytes differ
    from the digest the catalog database recorded when it was committed (the file was
    changed in place), or its authenticator is missing where one is required, does not
    verify under a key the KMS unwrapped, names another file, or does not chain to the
    version this table object held.  Raised before anything is read through the version.

    ``metadata_location``: the offending metadata file; ``reason``: what failed (no key
    bytes, no digest of any secret)."""

    def __init__(self, message: str, *, metadata_location: str = "", reason: str = ""):
        super().__init__(message)
        self.metadata_location = metadata_location
        self.reason = reason


__all__ += ["TableIdentityError", "TableIntegrityError", "TableVersionError"]


# --- KEKs a writer must not adopt for new wraps (icecrypt.keys.manager) ------------------


class ReplayedKeyError(FormatError):
    """The KEK that the table's ``encryption-keys`` list makes current cannot be shown to
    be the table's own current KEK, so nothing is wrapped with it: its wrapped key, or the
    key it unwraps to, already appeared under another KEK id (an old KEK put back under a
    fresh id), or a rotation made by this table object retired it.  ``key_id``: the
    refused KEK's id.  ``rotate_keys(new_kek=True)`` puts a fresh KEK first."""

    def __init__(self, message: str, *, key_id: str):
        super().__init__(message)
        self.key_id = key_id


class InsecureTransportWarning(UserWarning):
    """A KMS client talks to its server without TLS, or without verifying the server's
    certificate, because its configuration explicitly allows it (for local test servers):
    whoever is on the network path sees every key it wraps and can answer in its place."""


__all__ += ["ReplayedKeyError", "InsecureTransportWarning"]


# --- snapshot metadata that its manifests or its history contradict (issue 30) --------------


class SnapshotIntegrityError(IcecryptError, ValueError):
    """What ``metadata.json`` says of a snapshot (its ``operation``, the streaming epoch
    in its summary) disagrees with what its manifests show (authenticated in an encrypted
    table) or with the rest of its history: a forged or damaged table version, refused
    instead of acted on (rows skipped, an epoch dropped).  ``table``: the table's
    location; ``snapshot_id``: the snapshot."""

    def __init__(self, message: str, *, table: str, snapshot_id: int | None):
        super().__init__(message)
        self.table = table
        self.snapshot_id = snapshot_id


__all__ += ["SnapshotIntegrityError"]
