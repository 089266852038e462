"""``icecrypt table encrypt|decrypt``: make a plaintext Iceberg table encrypted, or an
encrypted one plaintext, in one commit (:func:`icecrypt.table.encrypt_table`,
:func:`icecrypt.table.decrypt_table`)."""

from __future__ import annotations

import argparse
import textwrap
import sys
from typing import Any

from icecrypt.cli._table import _add_common, _kms, _load
from icecrypt.cli._text import safe

__all__ = ["register"]

_KMS = "--kms-type local --kms-property encryption.kms.local.keystore=keys.json"


def register(sub: Any) -> None:
    """Add ``encrypt`` and ``decrypt`` to ``icecrypt table``'s subparsers."""
    for kind in ("encrypt", "decrypt"):
        old = "plaintext" if kind == "encrypt" else "encrypted"
        key = " --table-key-id orders-key" if kind == "encrypt" else ""
        examples = [
            f"icecrypt table {kind} warehouse/db/orders{key} {_KMS}",
            f"icecrypt table {kind} warehouse/db/orders{key} --expire-{old} {_KMS}",
            f"icecrypt table {kind} warehouse/db/orders{key} --target warehouse/db/orders_{kind}ed {_KMS}",
        ]
        if kind == "encrypt":
            examples.append(f"icecrypt table encrypt db.orders --table-key-id orders-key --catalog uri=sqlite:///cat.db "
                            f"--catalog warehouse=wh {_KMS}")
        description = (
            f"Rewrite every live row of a{'' if kind == 'encrypt' else 'n'} {old} Iceberg table (format v1-v3) "
            f"under {'fresh keys' if kind == 'encrypt' else 'no keys'} in one commit that upgrades it to format v3 "
            f"and {'sets' if kind == 'encrypt' else 'removes'} encryption.key-id; schemas, partition specs, sort "
            f"orders and row ids are kept. In place (the {old} snapshots leave the new version; with "
            f"--expire-{old} their files and the older metadata files are deleted), or with --target into a new "
            "table (the source is left untouched). An interrupted run leaves the old version: run it again."
        )
        p = sub.add_parser(kind, help=f"make a{'' if kind == 'encrypt' else 'n'} {old} table "
                                      f"{'encrypted' if kind == 'encrypt' else 'plaintext'} (one commit)",
                           description=textwrap.fill(description, 88), epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        p.add_argument("table")
        if kind == "encrypt":
            p.add_argument("--table-key-id", required=True, metavar="ID", help="KMS master key id (encryption.key-id)")
            p.add_argument("--data-key-length", type=int, choices=(16, 24, 32), help="encryption.data-key-length")
        p.add_argument("--target", metavar="LOCATION", help="write a new table at LOCATION instead (must not exist)")
        p.add_argument(f"--expire-{old}", dest="expire", action="store_true",
                       help=f"in place: delete the {old} snapshots' files and the older metadata files")
        p.add_argument("--drop-refs", action="store_true",
                       help=f"drop branches and tags other than main (they point at {old} snapshots)")
        _add_common(p)
        p.set_defaults(func=_convert, kind=kind)


def _convert(args: argparse.Namespace) -> int:
    from icecrypt.table import decrypt_table, encrypt_table

    kms = _kms(args)
    if kms is None:
        raise ValueError(f"table {args.kind}: name the KMS that holds the table key (--kms-type, --kms-property)")
    table = _load(args, kms)
    common = dict(kms=kms, target=args.target, drop_refs=args.drop_refs)
    if args.kind == "encrypt":
        result = encrypt_table(table, table_key_id=args.table_key_id, expire_plaintext=args.expire,
                               data_key_length=args.data_key_length, **common)  # fmt: skip
    else:
        result = decrypt_table(table, expire_encrypted=args.expire, **common)
    if result.already_done:
        print(f"already {args.kind}ed: {safe(result.metadata_location)}")
        return 0
    print(f"{args.kind}ed {result.records} row(s) from {result.rewritten_data_files} data and "
          f"{result.rewritten_delete_files} delete file(s) into {result.added_data_files} file(s); "
          f"snapshot {result.snapshot_id}; removed {len(result.removed_snapshot_ids)} old snapshot(s)")
    print(f"metadata: {safe(result.metadata_location)}")
    if result.dropped_refs:
        print(f"dropped branches and tags: {', '.join(safe(name) for name in result.dropped_refs)}", file=sys.stderr)
    if result.deleted_files:
        print(f"deleted {len(result.deleted_files)} old file(s)", file=sys.stderr)
    for path in result.skipped_files:
        print(f"not deleted (not the table's): {safe(path)}", file=sys.stderr)
    return 0
