"""Iceberg's ALTER TABLE SQL extensions on the SQL catalog's tables, as the procedure
``alter_table(table, clause)``.

With icecrypt's session extension (``icecrypt.spark.configure``), Spark's parser hands these
statements on a table of an icecrypt catalog to that procedure
(``org.icecrypt.spark.SqlExtensionsParser``); without it, the procedure can be called as it
is: ``CALL cat.system.alter_table('db.t', 'ADD PARTITION FIELD days(ts)')``.  The clauses
and their meaning are those of Iceberg's extensions grammar:

* ``ADD PARTITION FIELD <transform> [AS name]``, ``DROP PARTITION FIELD <transform | name>``,
  ``REPLACE PARTITION FIELD <transform | name> WITH <transform> [AS name]``;
* ``WRITE [DISTRIBUTED BY PARTITION] [[LOCALLY] ORDERED BY <order> | UNORDERED]``: the
  default sort order (none given: unsorted) and ``write.distribution-mode`` (``hash`` when
  distributed by partition, else ``range`` when ordered, ``none`` when unordered, unchanged
  when locally ordered), in one commit;
* ``SET IDENTIFIER FIELDS a, b``, ``DROP IDENTIFIER FIELDS a``;
* ``CREATE [OR REPLACE] | REPLACE BRANCH name [AS OF VERSION id] [RETAIN n DAYS|HOURS|MINUTES]
  [WITH SNAPSHOT RETENTION [n SNAPSHOTS] [n DAYS|HOURS|MINUTES]]``, ``CREATE BRANCH IF NOT
  EXISTS``, the same for ``TAG`` (no snapshot retention), ``DROP BRANCH | TAG [IF EXISTS] name``.

Every clause is one change of icecrypt's table API (``update_spec``, ``replace_sort_order``,
``update_schema``, ``manage_snapshots``), so a refused one leaves the table as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from icecrypt.spark._sql import ddl as _ddl

__all__ = ["run"]

_TOKEN = re.compile(r"\s*(?:(?P<quoted>`(?:[^`]|``)*`)|(?P<number>-?\d+)[LlSsYy]?(?![\w])|(?P<word>[A-Za-z_]\w*)"
                    r"|(?P<punct>[(),.]))")
_UNIT_MS = {"DAYS": 86_400_000, "HOURS": 3_600_000, "MINUTES": 60_000}


@dataclass(frozen=True)
class _Token:
    kind: str  # quoted | number | word | punct
    text: str  # an identifier's name (backquotes removed), a number's digits, a word, a symbol

    def is_word(self, *words: str) -> bool:
        return self.kind == "word" and self.text.upper() in words


class _Clause:
    """A recursive-descent reader of one clause."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[_Token] = []
        i = 0
        while i < len(text):
            match = _TOKEN.match(text, i)
            if match is None:
                if text[i:].strip():
                    raise self.error(f"unexpected {text[i:].strip()[:20]!r}")
                break
            kind = match.lastgroup
            value = match.group(kind)
            if kind == "quoted":
                value = value[1:-1].replace("``", "`")
            self.tokens.append(_Token(kind, value))
            i = match.end()
        self.at = 0

    def error(self, reason: str) -> ValueError:
        return ValueError(f"cannot read {self.text!r}: {reason}")

    def peek(self, ahead: int = 0) -> _Token | None:
        i = self.at + ahead
        return self.tokens[i] if i < len(self.tokens) else None

    def accept(self, *words: str) -> bool:
        """Take the next tokens if they are these keywords, in order."""
        for k, word in enumerate(words):
            token = self.peek(k)
            if token is None or not token.is_word(word):
                return False
        self.at += len(words)
        return True

    def expect(self, *words: str) -> None:
        if not self.accept(*words):
            found = self.peek()
            raise self.error(f"expected {' '.join(words)}, found {found.text if found else 'the end'}")

    def symbol(self, char: str) -> bool:
        token = self.peek()
        if token is not None and token.kind == "punct" and token.text == char:
            self.at += 1
            return True
        return False

    def identifier(self, what: str) -> str:
        token = self.peek()
        if token is None or token.kind not in ("word", "quoted"):
            raise self.error(f"expected {what}, found {token.text if token else 'the end'}")
        self.at += 1
        return token.text

    def dotted(self, what: str) -> list[str]:
        parts = [self.identifier(what)]
        while self.symbol("."):
            parts.append(self.identifier(what))
        return parts

    def number(self, what: str) -> int:
        token = self.peek()
        if token is None or token.kind != "number":
            raise self.error(f"expected {what}, found {token.text if token else 'the end'}")
        self.at += 1
        return int(token.text)

    def end(self) -> None:
        token = self.peek()
        if token is not None:
            raise self.error(f"unexpected {token.text!r} after the clause")

    # --- Iceberg's terms --------------------------------------------------------------------

    def transform(self) -> dict[str, Any]:
        """``column`` (identity) or ``name(arg, ...)``: the Spark transform form ddl reads."""
        first = self.dotted("a column or transform")
        if len(first) == 1 and self.symbol("("):
            args: list[dict[str, Any]] = []
            while True:
                token = self.peek()
                if token is not None and token.kind == "number":
                    args.append({"lit": self.number("a number")})
                else:
                    args.append({"ref": self.dotted("a column")})
                if self.symbol(")"):
                    break
                if not self.symbol(","):
                    raise self.error("expected , or ) in a transform's arguments")
            return {"name": first[0], "args": args}
        return {"name": "identity", "args": [{"ref": first}]}

    def order(self) -> list[tuple[dict[str, Any], str, str | None]]:
        """``term [ASC|DESC] [NULLS FIRST|LAST], ...``, optionally in parentheses."""
        enclosed = self.symbol("(")
        terms = []
        while True:
            term = self.transform()
            direction = "desc" if self.accept("DESC") else "asc"
            if direction == "asc":
                self.accept("ASC")
            nulls = None
            if self.accept("NULLS"):
                if self.accept("FIRST"):
                    nulls = "nulls-first"
                else:
                    self.expect("LAST")
                    nulls = "nulls-last"
            terms.append((term, direction, nulls))
            if not self.symbol(","):
                break
        if enclosed and not self.symbol(")"):
            raise self.error("expected ) after the order")
        return terms

    def retain(self, what: str) -> int:
        """``n DAYS|HOURS|MINUTES`` in milliseconds."""
        n = self.number(what)
        token = self.peek()
        if token is None or not token.is_word(*_UNIT_MS):
            raise self.error(f"expected DAYS, HOURS or MINUTES after {n}")
        self.at += 1
        if n < 0:
            raise self.error(f"{what} cannot be negative")
        return n * _UNIT_MS[token.text.upper()]


# --- the clauses ----------------------------------------------------------------------------


def _source_and_transform(term: dict[str, Any]) -> tuple[str, Any]:
    """(source column, transform) of a term, read as CREATE TABLE reads PARTITIONED BY."""
    column, transform, _ = _ddl._transform(term)
    return column, transform


def _spec_field(table: Any, term: dict[str, Any]) -> str:
    """The current spec's field a DROP/REPLACE names: a partition field name (a single name
    that is no column of the schema, as Iceberg reads it), or the field of that transform."""
    args = term["args"]
    if term["name"] == "identity" and len(args[0]["ref"]) == 1:
        name = args[0]["ref"][0]
        try:
            table.schema.find_field(name)
        except ValueError:
            if any(f.name == name for f in table.spec.fields):
                return name
            raise ValueError(f"there is no partition field {name!r} (the current spec has "
                             f"{', '.join(f.name for f in table.spec.fields) or 'none'})") from None
    column, transform = _source_and_transform(term)
    try:
        source = table.schema.find_field(column)
    except ValueError:
        raise ValueError(f"there is no column {column!r}") from None
    for field in table.spec.fields:
        if field.source_id == source.field_id and str(field.transform) == str(transform):
            return field.name
    raise ValueError(f"the current partition spec has no field {transform}({column})")


def _partition_field(table: Any, clause: _Clause, verb: str) -> None:
    if verb == "ADD":
        column, transform = _source_and_transform(clause.transform())
        name = clause.identifier("a partition field name") if clause.accept("AS") else None
        clause.end()
        with table.update_spec() as update:
            update.add_field(column, transform, name)
        return
    old = _spec_field(table, clause.transform())
    if verb == "DROP":
        clause.end()
        with table.update_spec() as update:
            update.remove_field(old)
        return
    clause.expect("WITH")
    column, transform = _source_and_transform(clause.transform())
    name = clause.identifier("a partition field name") if clause.accept("AS") else None
    clause.end()
    with table.update_spec() as update:
        update.remove_field(old)
        update.add_field(column, transform, name)


def _write_order(table: Any, clause: _Clause) -> None:
    distributed = locally = unordered = False
    order: list[tuple[dict[str, Any], str, str | None]] = []
    orderings = 0
    while clause.peek() is not None:
        if clause.accept("DISTRIBUTED", "BY", "PARTITION"):
            if distributed:
                raise clause.error("more than one distribution clause")
            distributed = True
        elif clause.accept("UNORDERED"):
            orderings += 1
            unordered = True
        else:
            local = clause.accept("LOCALLY")
            clause.expect("ORDERED", "BY")
            orderings += 1
            locally, order = local, clause.order()
        if orderings > 1:
            raise clause.error("more than one ordering clause")
    if not distributed and not orderings:
        raise clause.error("no distribution or ordering clause (nothing to change)")
    if distributed:
        mode: str | None = "hash"
    elif unordered:
        mode = "none"
    elif locally:
        mode = None
    else:
        mode = "range"
    replace = table.replace_sort_order()
    for term, direction, nulls in order:
        column, transform = _source_and_transform(term)
        (replace.desc if direction == "desc" else replace.asc)(column, transform, nulls)
    if mode is not None:
        replace.distribution_mode(mode)
    replace.commit()


def _identifier_fields(table: Any, clause: _Clause, verb: str) -> None:
    names = [".".join(clause.dotted("a column"))]
    while clause.symbol(","):
        names.append(".".join(clause.dotted("a column")))
    clause.end()
    if verb == "SET":
        wanted = names
    else:
        current = list(table.schema.identifier_field_names())
        for name in names:
            if name not in current:
                raise ValueError(f"{name!r} is not an identifier field (they are: {', '.join(sorted(current)) or 'none'})")
        wanted = [n for n in current if n not in names]
    with table.update_schema() as update:
        update.set_identifier_fields(*wanted)


def _ref(table: Any, clause: _Clause, create: bool, replace: bool, kind: str) -> None:
    if_not_exists = create and not replace and clause.accept("IF", "NOT", "EXISTS")
    name = clause.identifier(f"a {kind} name")
    snapshot_id = clause.number("a snapshot id") if clause.accept("AS", "OF", "VERSION") else None
    retention: dict[str, int] = {}
    if clause.accept("RETAIN"):
        retention["max_ref_age_ms"] = clause.retain(f"the {kind}'s retention")
    if kind == "branch" and clause.accept("WITH", "SNAPSHOT", "RETENTION"):
        token, after = clause.peek(), clause.peek(1)
        if token is not None and token.kind == "number" and after is not None and after.is_word("SNAPSHOTS"):
            retention["min_snapshots_to_keep"] = clause.number("a number of snapshots")
            clause.at += 1
            if clause.peek() is not None:
                retention["max_snapshot_age_ms"] = clause.retain("the snapshots' maximum age")
        else:
            retention["max_snapshot_age_ms"] = clause.retain("the snapshots' maximum age")
    clause.end()
    exists = name in (table.metadata.get("refs") or {})
    if exists and if_not_exists:
        return
    if snapshot_id is None:
        snapshot_id = table.current_snapshot_id
    with table.manage_snapshots() as manage:
        if replace and (exists or not create):
            if snapshot_id is None:
                raise ValueError(f"cannot replace {kind} {name!r}: main has no snapshot")
            (manage.replace_branch if kind == "branch" else manage.replace_tag)(name, snapshot_id, **retention)
        elif kind == "branch":
            manage.create_branch(name, snapshot_id, **retention)
        else:
            if snapshot_id is None:
                raise ValueError(f"cannot create tag {name!r}: main has no snapshot")
            manage.create_tag(name, snapshot_id, **retention)


def _drop_ref(table: Any, clause: _Clause, kind: str) -> None:
    if_exists = clause.accept("IF", "EXISTS")
    name = clause.identifier(f"a {kind} name")
    clause.end()
    if if_exists and name not in (table.metadata.get("refs") or {}):
        return
    with table.manage_snapshots() as manage:
        (manage.remove_branch if kind == "branch" else manage.remove_tag)(name)


def run(table: Any, text: Any) -> None:
    """Apply one ALTER TABLE extension clause (the text after ``ALTER TABLE <table>``)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("argument clause: an ALTER TABLE clause such as 'ADD PARTITION FIELD days(ts)' is required")
    clause = _Clause(text.strip())
    for verb in ("ADD", "DROP", "REPLACE"):
        if clause.accept(verb, "PARTITION", "FIELD"):
            return _partition_field(table, clause, verb)
    if clause.accept("WRITE"):
        return _write_order(table, clause)
    for verb in ("SET", "DROP"):
        if clause.accept(verb, "IDENTIFIER", "FIELDS"):
            return _identifier_fields(table, clause, verb)
    for kind in ("branch", "tag"):
        if clause.accept("CREATE", "OR", "REPLACE", kind.upper()):
            return _ref(table, clause, True, True, kind)
        if clause.accept("CREATE", kind.upper()):
            return _ref(table, clause, True, False, kind)
        if clause.accept("REPLACE", kind.upper()):
            return _ref(table, clause, False, True, kind)
        if clause.accept("DROP", kind.upper()):
            return _drop_ref(table, clause, kind)
    raise clause.error("not one of Iceberg's ALTER TABLE extensions (ADD/DROP/REPLACE PARTITION FIELD, WRITE ..., "
                       "SET/DROP IDENTIFIER FIELDS, CREATE/REPLACE/DROP BRANCH or TAG)")
