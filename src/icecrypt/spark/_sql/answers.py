"""How the SQL catalog's bridge answers a failed call: the kind of error the JVM maps onto
Spark's exceptions (no such table, already exists, not empty, a commit conflict, an
unsupported statement, invalid input, a failure) and its message.  Below the bridge and the
modules it serves (``procedures`` keeps the kind of an error it wraps), so none of them
imports the bridge for it."""

from __future__ import annotations

from icecrypt.errors import (
    CommitConflictError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    NoSuchViewError,
    TableAlreadyExistsError,
    ViewAlreadyExistsError,
)

__all__ = ["kind_of", "message_of"]

_ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (NoSuchTableError, "no_such_table"),
    (NoSuchViewError, "no_such_view"),
    (ViewAlreadyExistsError, "view_exists"),
    (NoSuchNamespaceError, "no_such_namespace"),
    (TableAlreadyExistsError, "table_exists"),
    (NamespaceAlreadyExistsError, "namespace_exists"),
    (NamespaceNotEmptyError, "namespace_not_empty"),
    (CommitConflictError, "conflict"),
)


def kind_of(exc: BaseException) -> str:
    from icecrypt.spark._sql.ddl import Unsupported

    kind = getattr(exc, "bridge_kind", None)  # a procedure's error keeps the kind of its cause
    if isinstance(kind, str):
        return kind
    for cls, kind in _ERRORS:
        if isinstance(exc, cls):
            return kind
    if isinstance(exc, (Unsupported, NotImplementedError)):
        return "unsupported"
    if isinstance(exc, (ValueError, KeyError, TypeError, LookupError)):
        return "invalid"
    return "failed"


def message_of(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]
    else:
        text = str(exc)
    if kind_of(exc) == "failed" and not hasattr(exc, "bridge_kind"):
        text = f"{text} ({type(exc).__name__})"
    return text or type(exc).__name__
