"""``icecrypt table spec|sort``: show and evolve the partition spec and the sort order,
each change one commit through the table's commit model
(:meth:`~icecrypt.table.EncryptedTable.update_spec`,
:meth:`~icecrypt.table.EncryptedTable.replace_sort_order`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from icecrypt.cli._refs import _parser
from icecrypt.cli._table import _add_common, _kms, _load
from icecrypt.cli._text import safe

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the spec and sort commands to ``icecrypt table``'s subparsers."""
    p = _parser(sub, "spec", "show the partition spec, or add, remove and rename partition fields in one commit", [
        "icecrypt table spec warehouse/db/orders",
        "icecrypt table spec warehouse/db/orders --all --json",
        "icecrypt table spec warehouse/db/orders --add 'day(ts)' --add 'bucket(16, id)=shard'",
        "icecrypt table spec warehouse/db/orders --remove ts_day --add 'hour(ts)'",
        "icecrypt table spec warehouse/db/orders --rename shard=id_shard"])  # fmt: skip
    p.add_argument("--add", action="append", default=[], metavar="TERM[=NAME]",
                   help="a partition field: COLUMN, year|month|day|hour|void(COLUMN), bucket(N, COLUMN), "
                        "truncate(W, COLUMN); optionally =NAME (default: Java's name, e.g. ts_day) (repeatable)")
    p.add_argument("--remove", action="append", default=[], metavar="NAME", help="a partition field to drop (repeatable)")
    p.add_argument("--rename", action="append", default=[], metavar="OLD=NEW", help="rename a partition field (repeatable)")
    p.add_argument("--all", action="store_true", help="show every spec of the table, not only the default")
    p.add_argument("--json", action="store_true")
    _add_common(p)
    p.set_defaults(func=_spec)

    p = _parser(sub, "sort", "show the sort order, or replace it (writers then sort each new file by it)", [
        "icecrypt table sort warehouse/db/orders",
        "icecrypt table sort warehouse/db/orders --replace 'category, ts DESC NULLS LAST'",
        "icecrypt table sort warehouse/db/orders --replace 'day(ts) DESC, bucket(16, id)'",
        "icecrypt table sort warehouse/db/orders --unsorted",
        "icecrypt table rewrite-data-files warehouse/db/orders --strategy sort --option rewrite-all=true"])  # fmt: skip
    action = p.add_mutually_exclusive_group()
    action.add_argument("--replace", metavar="ORDER",
                        help="terms COLUMN or transform(COLUMN), each with ASC|DESC and NULLS FIRST|LAST")
    action.add_argument("--unsorted", action="store_true", help="make the table unsorted (order 0)")
    p.add_argument("--all", action="store_true", help="show every sort order of the table, not only the default")
    p.add_argument("--json", action="store_true")
    _add_common(p)
    p.set_defaults(func=_sort)


def _field_text(names: dict[int, str], field: dict[str, Any]) -> str:
    column = names.get(field.get("source-id"), f"#{field.get('source-id')}")
    transform = str(field.get("transform"))
    return column if transform == "identity" else f"{transform}({column})"


def _show(args: argparse.Namespace, table: Any, key: str, id_key: str, default_key: str, line: Any) -> int:
    entries = table.metadata.get(key) or []
    default = table.metadata.get(default_key)
    shown = entries if args.all else [e for e in entries if e.get(id_key) == default]
    if args.json:
        json.dump({"table": table.location, default_key: default, key: shown}, sys.stdout, indent=2, ensure_ascii=True)
        print()
        return 0
    names = {f.field_id: table.schema.find_column_name(f.field_id) or f.name for f in table.schema.fields}
    for entry in shown:
        mark = " (default)" if entry.get(id_key) == default else ""
        fields = ", ".join(line(names, f) for f in entry.get("fields") or ()) or "(none)"
        print(f"{id_key} {entry.get(id_key)}{mark}: {safe(fields)}")
    return 0


def _pair(item: str, option: str) -> tuple[str, str]:
    old, sep, new = item.rpartition("=")
    if not sep or not old.strip() or not new.strip():
        raise ValueError(f"{option} {item!r}: expected OLD=NEW")
    return old.strip(), new.strip()


def _spec(args: argparse.Namespace) -> int:
    from icecrypt.table.ops.sort_order import parse_term

    table = _load(args, _kms(args))
    if not (args.add or args.remove or args.rename):
        return _show(args, table, "partition-specs", "spec-id", "default-spec-id",
                     lambda names, f: f"{f.get('name')}={_field_text(names, f)} [{f.get('field-id')}]")  # fmt: skip
    update = table.update_spec()
    for name in args.remove:
        update.remove_field(name)
    for item in args.rename:
        update.rename_field(*_pair(item, "--rename"))
    for item in args.add:
        term, sep, name = item.rpartition("=")
        if not sep:
            term, name = item, ""
        elif not name.strip():
            raise ValueError(f"--add {item!r}: expected TERM or TERM=NAME")
        column, transform = parse_term(term)
        update.add_field(column, transform, name.strip() or None)
    return _committed(update.commit(), "partition spec", f"default spec {table.metadata['default-spec-id']}")


def _sort(args: argparse.Namespace) -> int:
    from icecrypt.table.ops.sort_order import parse_sort_terms

    table = _load(args, _kms(args))
    if args.replace is None and not args.unsorted:
        return _show(args, table, "sort-orders", "order-id", "default-sort-order-id",
                     lambda names, f: f"{_field_text(names, f)} {f.get('direction')} {f.get('null-order')}")  # fmt: skip
    order = table.replace_sort_order()
    for column, transform, direction, nulls in parse_sort_terms(args.replace) if args.replace is not None else ():
        (order.desc if direction.value == "desc" else order.asc)(column, transform, nulls)
    location = order.commit()
    return _committed(location, "sort order", f"default sort order {table.metadata['default-sort-order-id']}")


def _committed(location: str | None, what: str, now: str) -> int:
    print(f"the {what} is unchanged; nothing committed" if location is None else f"{now}; committed {safe(location)}")
    return 0
