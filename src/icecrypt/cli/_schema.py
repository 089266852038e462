"""``icecrypt table schema``: print the table's schema, or evolve it in one commit
(:meth:`~icecrypt.table.EncryptedTable.update_schema`): add, rename, drop, make
optional and widen columns."""

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
    """Add ``schema`` to ``icecrypt table``'s subparsers."""
    p = _parser(sub, "schema", "print the table's schema, or add, rename, drop, make optional or widen columns", [
        "icecrypt table schema warehouse/db/orders",
        "icecrypt table schema warehouse/db/orders --json",
        "icecrypt table schema warehouse/db/orders --add region=string --add address.country=string",
        "icecrypt table schema warehouse/db/orders --add status=string --default status=active --required status",
        "icecrypt table schema warehouse/db/orders --rename qty=quantity --drop note",
        "icecrypt table schema warehouse/db/orders --widen qty=long --widen amount='decimal(18, 2)'",
        "icecrypt table schema warehouse/db/orders --make-optional customer_id"])  # fmt: skip
    p.add_argument("--add", action="append", default=[], metavar="PATH=TYPE",
                   help="add a column (a dotted PATH adds to a struct; TYPE as in Iceberg: long, string, decimal(9, 2), ...)")
    p.add_argument("--default", action="append", default=[], metavar="PATH=VALUE",
                   help="the default value of a column added by --add (format v3)")
    p.add_argument("--required", action="append", default=[], metavar="PATH",
                   help="make a column added by --add required (needs --default)")
    p.add_argument("--doc", action="append", default=[], metavar="PATH=TEXT", help="set a column's doc")
    p.add_argument("--rename", action="append", default=[], metavar="PATH=NEW_NAME")
    p.add_argument("--drop", action="append", default=[], metavar="PATH")
    p.add_argument("--make-optional", action="append", default=[], metavar="PATH")
    p.add_argument("--widen", action="append", default=[], metavar="PATH=TYPE",
                   help="promote a column's type: int=long, float=double, decimal precision")
    p.add_argument("--json", action="store_true", help="print the schema as metadata.json records it")
    _add_common(p)
    p.set_defaults(func=_schema)


def _pair(item: str, option: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"{option} {item!r}: expected PATH=VALUE")
    return key, value


def _type(text: str, option: str) -> Any:
    from pyiceberg.types import NestedField

    try:
        return NestedField.model_validate({"id": 0, "name": "x", "type": text.strip(), "required": False}).field_type
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not an Iceberg primitive type (long, string, decimal(9, 2), ...)") from None


def _path(text: str) -> tuple[str, ...]:
    return tuple(text.split("."))


def _schema(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    changes = (args.add, args.rename, args.drop, args.make_optional, args.widen, args.doc)
    if not any(changes):
        if args.default or args.required:
            raise ValueError("--default and --required apply to columns added with --add")
        return _print(table, as_json=args.json)
    defaults = dict(_pair(item, "--default") for item in args.default)
    added = set()
    update = table.update_schema()
    for item in args.add:
        path, type_text = _pair(item, "--add")
        added.add(path)
        update.add_column(_path(path), _type(type_text, f"--add {item}"), required=path in args.required,
                          default_value=defaults.get(path))  # fmt: skip
    for name in (*defaults, *args.required):
        if name not in added:
            raise ValueError(f"--default/--required {name!r}: not a column added with --add")
    for item in args.rename:
        path, new = _pair(item, "--rename")
        update.rename_column(_path(path), new)
    for path in args.drop:
        update.delete_column(_path(path))
    for path in args.make_optional:
        update.make_column_optional(_path(path))
    for item in args.widen:
        path, type_text = _pair(item, "--widen")
        update.update_column(_path(path), field_type=_type(type_text, f"--widen {item}"))
    for item in args.doc:
        path, doc = _pair(item, "--doc")
        update.update_column(_path(path), doc=doc)
    location = update.commit()
    if location is None:
        print("schema unchanged; nothing committed")
    else:
        print(f"schema {table.metadata['current-schema-id']}; committed {safe(location)}")
    return 0


def _print(table: Any, *, as_json: bool) -> int:
    current = table.metadata.get("current-schema-id", 0)
    entry = next(s for s in table.metadata.get("schemas") or () if s.get("schema-id") == current)
    if as_json:
        json.dump(entry, sys.stdout, indent=2, ensure_ascii=True)
        print()
        return 0
    print(f"schema {current} (last column id {table.metadata.get('last-column-id')})")
    identifiers = set(table.schema.identifier_field_ids)
    for line in _lines(table.schema.fields, identifiers, ""):
        print(line)
    return 0


def _lines(fields: Any, identifiers: set[int], indent: str) -> Any:
    from pyiceberg.types import ListType, MapType, StructType

    for field in fields:
        flags = ["required" if field.required else "optional"]
        if field.field_id in identifiers:
            flags.append("identifier")
        if field.initial_default is not None:
            flags.append(f"default={field.initial_default!r}")
        text = f"{indent}{field.field_id}: {field.name}: {' '.join(flags)} {_type_name(field.field_type)}"
        if field.doc:
            text += f"  -- {field.doc}"
        yield safe(text)
        nested = field.field_type
        if isinstance(nested, StructType):
            yield from _lines(nested.fields, identifiers, indent + "  ")
        elif isinstance(nested, ListType):
            yield from _lines([nested.element_field], identifiers, indent + "  ")
        elif isinstance(nested, MapType):
            yield from _lines([nested.key_field, nested.value_field], identifiers, indent + "  ")


def _type_name(field_type: Any) -> str:
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(field_type, StructType):
        return "struct"
    if isinstance(field_type, ListType):
        return "list"
    if isinstance(field_type, MapType):
        return "map"
    return str(field_type)
