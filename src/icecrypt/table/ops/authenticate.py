"""``authenticate_metadata``: adopt an encrypted table's current version into the chain of
authenticated versions (``icecrypt.table.commit.authenticity``).

The table object's version is committed again, unchanged but for the metadata log, with
an authenticator under a new metadata key that only the KMS can unwrap; every later
icecrypt commit chains to it.  Only that version: a newer one that landed meanwhile makes
the call fail (CommitConflictError), so that what the caller checked is what gets
authenticated.
"""

from __future__ import annotations

from typing import Any

from icecrypt.table.model import changes as _model

__all__ = ["authenticate_metadata"]


def authenticate_metadata(table: Any) -> str | None:
    """Commit the version ``table`` holds with an authenticator; returns the new metadata
    location, or None when that version is authenticated already.  ValueError for a
    plaintext table (an authenticator is made under the table's master key)."""
    from icecrypt.table.commit import committer as _committer
    from icecrypt.table.commit.target import _Target

    if table.authenticator is not None:
        return None
    target = _Target.of(table)

    def build(base_location: str, base: dict[str, Any]) -> _committer.Staged | None:
        manager = target.manager(base, check_kek=False)
        if manager is None:
            raise ValueError(
                f"{base_location}: the table is not encrypted (no encryption.key-id): its metadata cannot be "
                "authenticated under a master key"
            )
        return _committer.Staged(
            _model.Change.on(base, [], what="metadata authentication"), manager=manager,
            keys_whole=False, authenticate=True,
        )  # fmt: skip

    return _committer.commit(
        target, build, first_base=(table.metadata_location, table.metadata),
        policy=_committer.RetryPolicy(num_retries=0),
    )  # fmt: skip
