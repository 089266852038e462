"""``icecrypt table refs|branch|tag|rollback|properties``: branches, tags, the current
snapshot and table properties, each one commit through the table's commit model
(:meth:`~icecrypt.table.EncryptedTable.manage_snapshots`,
:meth:`~icecrypt.table.EncryptedTable.update_properties`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from icecrypt.cli._table import _add_common, _kms, _load, parse_time
from icecrypt.cli._text import safe

__all__ = ["register"]

_RETENTION = ("min-snapshots-to-keep", "max-snapshot-age-ms", "max-ref-age-ms")


def _parser(sub: Any, name: str, help_text: str, examples: list[str]) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                       epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("table")
    return p


def register(sub: Any) -> None:
    """Add the ref and property commands to ``icecrypt table``'s subparsers."""
    p = _parser(sub, "refs", "list the table's branches and tags", [
        "icecrypt table refs warehouse/db/orders", "icecrypt table refs warehouse/db/orders --json"])
    p.add_argument("--json", action="store_true")
    _add_common(p)
    p.set_defaults(func=_refs)

    for kind in ("branch", "tag"):
        p = _parser(sub, kind, f"create, replace, rename or remove a {kind}", [
            f"icecrypt table {kind} warehouse/db/orders audit --snapshot 4487484300036148224",
            f"icecrypt table {kind} warehouse/db/orders audit --replace --snapshot 5012345678901234567",
            *([f"icecrypt table {kind} warehouse/db/orders audit --rename review"] if kind == "branch" else []),
            f"icecrypt table {kind} warehouse/db/orders audit --remove"])  # fmt: skip
        p.add_argument("name")
        p.add_argument("--snapshot", type=int, help="snapshot id (default for a new branch: the current one)")
        action = p.add_mutually_exclusive_group()
        action.add_argument("--replace", action="store_true", help=f"point an existing {kind} at --snapshot")
        action.add_argument("--remove", action="store_true", help=f"remove the {kind}")
        if kind == "branch":
            action.add_argument("--rename", metavar="NEW", help="rename the branch")
            p.add_argument("--min-snapshots-to-keep", type=int)
            p.add_argument("--max-snapshot-age-ms", type=int)
        p.add_argument("--max-ref-age-ms", type=int)
        _add_common(p)
        p.set_defaults(func=_ref_command, kind=kind)

    p = _parser(sub, "rollback", "make an older snapshot (or any snapshot or ref) current", [
        "icecrypt table rollback warehouse/db/orders --to-snapshot 4487484300036148224",
        "icecrypt table rollback warehouse/db/orders --to-timestamp 2026-11-24T12:00:00",
        "icecrypt table rollback warehouse/db/orders --set-current audit"])  # fmt: skip
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-snapshot", type=int, help="an ancestor of the current snapshot")
    target.add_argument("--to-timestamp", help="the newest ancestor before this time (ISO, ms since the epoch, 7d ...)")
    target.add_argument("--set-current", metavar="SNAPSHOT_OR_REF", help="any snapshot id or ref name")
    _add_common(p)
    p.set_defaults(func=_rollback)

    p = _parser(sub, "properties", "list, set or remove table properties (encryption ones are refused)", [
        "icecrypt table properties warehouse/db/orders",
        "icecrypt table properties warehouse/db/orders --set owner=analytics --set commit.retry.num-retries=10",
        "icecrypt table properties warehouse/db/orders --remove owner"])  # fmt: skip
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--remove", action="append", default=[], metavar="KEY")
    p.add_argument("--json", action="store_true")
    _add_common(p)
    p.set_defaults(func=_properties)


def _refs(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    refs = table.metadata.get("refs") or {}
    if args.json:
        json.dump({"table": table.location, "refs": refs}, sys.stdout, indent=2, ensure_ascii=True)
        print()
        return 0
    for name, ref in refs.items():
        retention = " ".join(f"{k}={ref[k]}" for k in _RETENTION if ref.get(k) is not None)
        print(f"{safe(name)}  {ref.get('type')}  {ref.get('snapshot-id')}" + (f"  {retention}" if retention else ""))
    return 0


def _ref_command(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    retention = {"max_ref_age_ms": args.max_ref_age_ms}
    if args.kind == "branch":
        retention.update(min_snapshots_to_keep=args.min_snapshots_to_keep, max_snapshot_age_ms=args.max_snapshot_age_ms)
    ms = table.manage_snapshots()
    if args.remove:
        (ms.remove_branch if args.kind == "branch" else ms.remove_tag)(args.name)
        done = "removed"
    elif getattr(args, "rename", None):
        ms.rename_branch(args.name, args.rename)
        done = f"renamed to {safe(args.rename)}"
    elif args.replace:
        if args.snapshot is None:
            raise ValueError("--replace needs --snapshot")
        (ms.replace_branch if args.kind == "branch" else ms.replace_tag)(args.name, args.snapshot, **retention)
        done = f"now at snapshot {args.snapshot}"
    elif args.kind == "branch":
        ms.create_branch(args.name, args.snapshot, **retention)
        done = "created"
    else:
        if args.snapshot is None:
            raise ValueError("a new tag needs --snapshot")
        ms.create_tag(args.name, args.snapshot, **retention)
        done = "created"
    ms.commit()
    print(f"{args.kind} {safe(args.name)} {done}; committed {safe(table.metadata_location)}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    ms = table.manage_snapshots()
    if args.to_snapshot is not None:
        ms.rollback_to_snapshot(args.to_snapshot)
    elif args.to_timestamp is not None:
        ms.rollback_to_timestamp(parse_time(args.to_timestamp))
    else:
        target = args.set_current
        ms.set_current_snapshot(int(target) if target.lstrip("-").isdigit() else target)
    ms.commit()
    print(f"current snapshot {table.current_snapshot_id}; committed {safe(table.metadata_location)}")
    return 0


def _properties(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    if args.set or args.remove:
        props = table.update_properties()
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--set {item!r}: expected KEY=VALUE")
            props.set(key, value)
        for key in args.remove:
            props.remove(key)
        props.commit()
        print(f"committed {safe(table.metadata_location)}")
        return 0
    if args.json:
        json.dump(table.properties, sys.stdout, indent=2, ensure_ascii=True)
        print()
        return 0
    for key, value in table.properties.items():
        print(f"{safe(key)}={safe(value)}")
    return 0
