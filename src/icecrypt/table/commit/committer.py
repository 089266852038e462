"""The one committer of metadata changes (:class:`~icecrypt.table.model.changes.Change`).

Per attempt: the newest committed version (``_Target.latest``: checked against the
table object's pin), the change's requirements validated on it, the updates applied
(``_model.apply``), the result checked against the pin and committed as the next
version (a path table's ``v<N+1>.metadata.json`` created exclusively, a catalog's
compare-and-swap).  When another writer committed first the attempt is repeated on the
newer version after a jittered exponential backoff bounded by the table's
``commit.retry.*`` properties (Java's names and defaults); a requirement that no longer
holds there refuses the change (:class:`~icecrypt.errors.CommitConflictError`).  A
failed commit leaves nothing behind: a metadata-only change writes no other file.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from icecrypt.errors import CommitConflictError
from icecrypt.table.commit import store as _commit
from icecrypt.table.model import changes as _model

__all__ = ["RetryPolicy", "commit"]


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
        """The wait before retry ``attempt`` (1-based): exponential from ``min_wait_ms``,
        capped at ``max_wait_ms``, with up to 10% jitter (as Java's Tasks)."""
        delay = min(self.min_wait_ms * 2.0 ** (attempt - 1), self.max_wait_ms)
        return delay + random.random() * max(1.0, delay * 0.1)


def commit(
    table_or_target: Any,
    change: _model.Change | Callable[[str, dict[str, Any]], _model.Change | None],
    *,
    policy: RetryPolicy | None = None,
) -> str | None:
    """Commit ``change`` to the table (an EncryptedTable or a ``_write._Target``);
    returns the new metadata location, installed in the table object.

    ``change`` may instead be a function of ``(base_location, base)`` that builds the
    change on each attempt's base (an operation whose updates depend on what the base
    holds, as expiry's); when it returns None there is nothing to do and nothing is
    committed (None is returned).

    CommitConflictError (its subclass ``RequirementFailed`` when a requirement fails on
    the newest version; nothing committed) when the change no longer fits, or when it
    kept losing races beyond the retry policy."""
    from icecrypt.table.ops.write import _Target

    target = table_or_target if isinstance(table_or_target, _Target) else _Target.of(table_or_target)
    started = time.monotonic()
    attempt = 0
    while True:
        base_location, base = target.latest()
        if policy is None:
            policy = RetryPolicy.from_properties(base.get("properties"))
        built = change(base_location, base) if callable(change) else change
        if built is None:
            return None
        built.validate(base)
        # a metadata-only commit wraps nothing: no check of the current KEK
        manager = target.manager(base, check_kek=False)
        keys_whole = target.check_base_keys(base_location, base, manager)
        metadata = _model.apply(base, built.updates, base_location=base_location)
        target.check_pin(base_location, metadata)
        try:
            location = target.commit_metadata(base_location, metadata, base=base)
        except (_commit.VersionExistsError, CommitConflictError) as exc:
            attempt += 1
            elapsed_ms = (time.monotonic() - started) * 1000
            if attempt > policy.num_retries or elapsed_ms >= policy.total_timeout_ms:
                raise CommitConflictError(
                    f"{target.metadata_location}: the {built.what} kept losing to concurrent commits "
                    f"({attempt} attempts); nothing was committed"
                ) from exc
            time.sleep(min(policy.delay_ms(attempt), max(0.0, policy.total_timeout_ms - elapsed_ms)) / 1000)
            continue
        target.last_commit = (location, metadata, manager, keys_whole)
        target.committed(location)
        return location
