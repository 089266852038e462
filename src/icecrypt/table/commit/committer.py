"""The one committer of metadata changes (:class:`~icecrypt.table.model.changes.Change`).

Per attempt: the newest committed version (``_Target.latest``: checked against the
table object's pin), the change's requirements validated on it, the updates applied
(``_model.apply``), the result checked against the pin and committed as the next
version (a path table's ``v<N+1>.metadata.json`` created exclusively, a catalog's
compare-and-swap).  When another writer committed first the attempt is repeated on the
newer version after a jittered exponential backoff bounded by the table's
``commit.retry.*`` properties (Java's names and defaults); a requirement that no longer
holds there refuses the change (:class:`~icecrypt.errors.CommitConflictError`).  A
failed commit leaves nothing behind: a metadata-only change writes no other file.  An
error once the version file may be in place (an interrupt during the housekeeping after
it, a catalog that cannot say whether its swap landed) deletes nothing unless no version
follows the base: the exception is marked (``store.files_needed``) so that the
operation keeps its files too.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from icecrypt.errors import CommitConflictError
from icecrypt.table.commit import store as _commit
from icecrypt.table.model import changes as _model

__all__ = ["RetryPolicy", "Staged", "commit"]


@dataclass(frozen=True)
class RetryPolicy:
    """``commit.retry.num-retries`` (4), ``commit.retry.min-wait-ms`` (100),
    ``commit.retry.max-wait-ms`` (60000), ``commit.retry.total-timeout-ms`` (1800000):
    Iceberg Java's table properties and defaults."""

    num_retries: int = 4
    min_wait_ms: int = 100
    max_wait_ms: int = 60_000
    total_timeout_ms: int = 1_800_000

    @classmethod
    def from_properties(cls, properties: Mapping[str, str] | None) -> RetryPolicy:
        properties = properties or {}
        values = {}
        for attr, name in (
            ("num_retries", "commit.retry.num-retries"),
            ("min_wait_ms", "commit.retry.min-wait-ms"),
            ("max_wait_ms", "commit.retry.max-wait-ms"),
            ("total_timeout_ms", "commit.retry.total-timeout-ms"),
        ):
            raw = properties.get(name)
            if raw is None:
                continue
            try:
                values[attr] = max(0, int(raw))
            except (TypeError, ValueError):
                raise ValueError(f"table property {name} = {raw!r} is not an integer") from None
        return cls(**values)

    def delay_ms(self, attempt: int) -> float:
        """The wait before retry ``attempt`` (1-based): drawn evenly between
        ``min_wait_ms`` and a ceiling that doubles per attempt up to ``max_wait_ms``
        ("full jitter").  Java's Tasks wait the ceiling itself plus 10%: writers that lost
        together retry together and lose again, and under contention the waits of an
        append that is retried until it lands grow long; drawn waits spread them."""
        ceiling = min(self.min_wait_ms * 2.0 ** min(attempt - 1, 60), self.max_wait_ms)
        return self.min_wait_ms + random.random() * max(0.0, ceiling - self.min_wait_ms)


@dataclass(frozen=True)
class Staged:
    """A change built on one attempt's base, with what the attempt prepared for it: the
    encryption manager that wrapped its keys (installed in the table object after the
    commit), the files it wrote (removed when the attempt surely did not land; kept
    when nobody can tell), whether the base's keys were checked whole, and whether the
    change can conflict at all (an append cannot: it is retried until
    ``commit.retry.total-timeout-ms`` rather than ``commit.retry.num-retries`` times).

    A master-key rotation changes what the table object pinned: ``pin_change`` is the
    pin after the change (the built version is checked against it, a catalog records
    the new master key id in the same transaction), ``kms`` the KMS client that holds
    the new master key, ``retired`` the (KEK id, digest) pairs the rotation retired (a
    catalog keeps them in the same transaction).  The table object takes the new pin
    and KMS only once the commit landed.  ``authenticate``: the change adopts an
    unauthenticated base, starting a chain of authenticated versions
    (``authenticate_metadata``)."""

    change: _model.Change
    manager: Any = None
    written: tuple[str, ...] = ()
    keys_whole: bool | None = None
    conflict_free: bool = False
    pin_change: Any = None
    kms: Any = None
    retired: Any = None
    authenticate: bool = False


def commit(
    table_or_target: Any,
    change: _model.Change | Callable[[str, dict[str, Any]], _model.Change | Staged | None],
    *,
    policy: RetryPolicy | None = None,
    on_retry: Callable[[int], None] | None = None,
    first_base: tuple[str, dict[str, Any]] | None = None,
    any_format_version: bool = False,
) -> str | None:
    """Commit ``change`` to the table (an EncryptedTable or a ``commit.target._Target``);
    returns the new metadata location, installed in the table object.

    ``change`` may instead be a function of ``(base_location, base)`` that builds the
    change on each attempt's base (an operation whose updates depend on what the base
    holds, as expiry's, or a snapshot producer's, which writes a manifest list per
    attempt and returns it as :class:`Staged`); when it returns None there is nothing
    to do and nothing is committed (None is returned).

    CommitConflictError (its subclass ``RequirementFailed`` when a requirement fails on
    the newest version; nothing committed) when the change no longer fits, or when it
    kept losing races beyond the retry policy.  ``on_retry(attempt)`` is told of each
    lost race (benchmarks count them).  ``first_base``: (location, document) of the
    version the change was planned on, used for the first attempt instead of asking
    for the newest again (a stale one loses the race and is replaced).  A base not of
    format v3 is refused (ValueError) unless ``any_format_version``: a change whose
    updates upgrade it (``encrypt_table``)."""
    from icecrypt.table.commit.target import _Target, check_format_version

    target = table_or_target if isinstance(table_or_target, _Target) else _Target.of(table_or_target)
    started = time.monotonic()
    attempt = 0
    while True:
        if first_base is not None:
            (base_location, base), first_base = first_base, None
            target.check_base(base_location, base)
            target.base_location = base_location
            if not any_format_version:
                check_format_version(base_location, base)
        else:
            base_location, base = target.latest(any_format_version=any_format_version)
        if policy is None:
            policy = RetryPolicy.from_properties(base.get("properties"))
        built = change(base_location, base) if callable(change) else change
        if built is None:
            return None
        staged = built if isinstance(built, Staged) else Staged(built)
        committing = False
        try:
            staged.change.validate(base)
            manager, keys_whole = staged.manager, staged.keys_whole
            if manager is None:
                # a metadata-only commit wraps nothing: no check of the current KEK
                manager = target.manager(base, check_kek=False)
            if keys_whole is None:
                keys_whole = target.check_base_keys(base_location, base, manager)
            metadata = _model.apply(base, staged.change.updates, base_location=base_location)
            target.check_pin(base_location, metadata, staged.pin_change)
            sealer = target.sealer(
                base_location, metadata, manager, new_key=staged.pin_change is not None, authenticate=staged.authenticate
            )
            committing = True
            location = target.commit_metadata(
                base_location, metadata, base=base, pin=staged.pin_change, retired=staged.retired, sealer=sealer
            )
        except _model.RequirementFailed:
            _remove(target, staged.written)
            raise
        except (_commit.VersionExistsError, CommitConflictError) as exc:
            # another writer's version is there: this attempt surely did not land
            _remove(target, staged.written)
            attempt += 1
            elapsed_ms = (time.monotonic() - started) * 1000
            out_of_tries = attempt > policy.num_retries and not staged.conflict_free
            if out_of_tries or elapsed_ms >= policy.total_timeout_ms:
                raise CommitConflictError(
                    f"{target.metadata_location}: the {staged.change.what} kept losing to concurrent commits "
                    f"({attempt} attempts; retries exhausted); nothing was committed"
                ) from exc
            if on_retry is not None:
                on_retry(attempt)
            time.sleep(min(policy.delay_ms(attempt), max(0.0, policy.total_timeout_ms - elapsed_ms)) / 1000)
            continue
        except BaseException as exc:
            # an error (an interrupt, say) once the version file may be in place: the
            # version may be current and name what the attempt wrote
            if committing and not _commit.files_needed(exc) and _landed(target, base_location, staged) is not False:
                _commit.mark_files_needed(exc)
            if not _commit.files_needed(exc):
                _remove(target, staged.written)
            raise
        _take_identity(target, staged)
        target.last_commit = (location, metadata, manager, keys_whole)
        target.committed(location)
        return location


def _landed(target: Any, base_location: str, staged: Staged) -> bool | None:
    """Whether the attempt that failed while committing landed anyway: the newest
    version holds a snapshot it adds (True), or no version follows its base (False);
    None when that cannot be told (the newest version unreadable, or a change that adds
    no snapshot under a newer version)."""
    added = {u.snapshot.get("snapshot-id") for u in staged.change.updates if isinstance(u, _model.AddSnapshot)}
    try:
        current = target.current_location()
        if current == base_location:
            return False
        if not added:
            return None
        newest = _commit.read_metadata(target.filesystem, current)
    except Exception:  # noqa: BLE001 - nobody can tell: keep the files
        return None
    return any(s.get("snapshot-id") in added for s in newest.get("snapshots") or ())


def _take_identity(target: Any, staged: Staged) -> None:
    """After a commit that landed: the table object follows its own rotation (new KMS
    client first: reading the new version back unwraps its KEKs through it)."""
    table = target.table
    if staged.kms is not None:
        target.kms = staged.kms
        if table is not None:
            table.kms = staged.kms
    if staged.pin_change is not None:
        target.pin = staged.pin_change
        if table is not None:
            table.pin = staged.pin_change


def _remove(target: Any, locations: tuple[str, ...]) -> None:
    """Best-effort removal of files of an attempt that did not land."""
    io = target.io(None)
    for location in locations:
        with contextlib.suppress(Exception):  # the error being handled matters more
            io.remove(location)
