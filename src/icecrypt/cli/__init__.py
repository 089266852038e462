"""The ``icecrypt`` command line.

Command groups live in their own modules and plug in through ``register(subparsers)``:
each adds its sub-commands with ``set_defaults(func=handler)``, where
``handler(args) -> int`` returns the exit status.  Errors leave as one line on stderr;
everything printed shows control characters escaped (:mod:`icecrypt.cli._text`):

  0 success   1 other error   2 authentication failure   3 format error   4 KMS error
  64 usage error (argparse's syntax errors, which would otherwise also exit 2)
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from icecrypt.cli._text import SafeStream, safe
from icecrypt.errors import AuthenticationError, FormatError, IcecryptError, KmsError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_AUTH = 2
EXIT_FORMAT = 3
EXIT_KMS = 4
EXIT_USAGE = 64  # sysexits.h EX_USAGE


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a syntax error, the status that here means "authentication
    failed": a script must be able to tell a typo from tampered data."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

# Modules that define register(subparsers); imported lazily so `icecrypt --help` is quick.
COMMAND_MODULES = ("icecrypt.cli._ags1", "icecrypt.cli._keys", "icecrypt.cli._table")
# Commands of `icecrypt table` kept in modules of their own: each defines register(sub),
# ``sub`` being what icecrypt.cli._table's register returns (the table group's subparsers).
TABLE_COMMAND_MODULES = ("icecrypt.cli._refs", "icecrypt.cli._schema", "icecrypt.cli._spec", "icecrypt.cli._encrypt")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    from icecrypt import __version__
    from icecrypt._gcm import OPENSSL_LINKAGE, openssl_version

    parser = _Parser(
        prog="icecrypt",
        description="Apache Iceberg table encryption (AGS1 streams, key metadata, keys), "
        "byte-compatible with Iceberg Java.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"icecrypt {__version__} ({openssl_version()}, {OPENSSL_LINKAGE})",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups = {name: importlib.import_module(name).register(subparsers) for name in COMMAND_MODULES}
    for name in TABLE_COMMAND_MODULES:
        importlib.import_module(name).register(groups["icecrypt.cli._table"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # What the handlers print embeds text from storage (paths, key ids, messages that
    # quote them): on its way to the terminal every control character is escaped.
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (None if s is None else SafeStream(s) for s in (stdout, stderr))  # None: closed
    try:
        return _run(args)
    except Exception:
        # a bug, or input no check foresaw: the traceback, escaped like the rest
        traceback.print_exc()
        return EXIT_ERROR
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except AuthenticationError as exc:
        return _fail(EXIT_AUTH, "authentication failed", exc)
    except FormatError as exc:
        return _fail(EXIT_FORMAT, "format error", exc)
    except KmsError as exc:
        return _fail(EXIT_KMS, "KMS error", exc)
    except (IcecryptError, OSError, ValueError) as exc:
        return _fail(EXIT_ERROR, "error", exc)
    except KeyboardInterrupt:
        return _fail(130, "interrupted", None)


def _fail(status: int, what: str, exc: BaseException | None) -> int:
    # one line: a message's line breaks (a path may hold one) are escaped with the rest
    detail = f": {safe(exc)}" if exc is not None and str(exc) else ""
    print(f"icecrypt: {what}{detail}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
