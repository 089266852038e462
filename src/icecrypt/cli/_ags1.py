"""``icecrypt encrypt | decrypt | inspect``: AGS1 files from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any, BinaryIO

from icecrypt import _gcm, ags1
from icecrypt._atomic import AtomicFile
from icecrypt.cli._text import safe
from icecrypt._progress import Progress
from icecrypt.errors import FormatError

CHUNK = 4 * ags1.PLAIN_BLOCK_SIZE  # a few blocks: the data stays in cache between read and write


def register(subparsers: Any) -> None:
    def key_options(p: argparse.ArgumentParser) -> None:
        group = p.add_mutually_exclusive_group(required=True)
        group.add_argument("--key-hex", metavar="HEX", help="the AES key as hex (visible in the process list)")
        group.add_argument("--key-file", metavar="PATH", help="file holding the key: 16/24/32 raw bytes or hex text")
        p.add_argument("--aad-hex", metavar="HEX", help="AAD prefix as hex (Iceberg: from the key metadata)")

    p = subparsers.add_parser("encrypt", help="encrypt a file into an AGS1 stream")
    p.add_argument("input", help="plaintext file, or - for stdin")
    p.add_argument("output", help="AGS1 file to write (atomically), or - for stdout")
    key_options(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print no summary")
    p.set_defaults(func=cmd_encrypt)

    p = subparsers.add_parser("decrypt", help="decrypt an AGS1 stream; writes nothing unless it all authenticates")
    p.add_argument("input", help="AGS1 file, or - for stdin")
    p.add_argument("output", help="plaintext file to write, or - for stdout")
    key_options(p)
    p.add_argument("--length", type=int, metavar="N", help="trusted ciphertext length (key metadata file_length)")
    p.set_defaults(func=cmd_decrypt)

    p = subparsers.add_parser("inspect", help="show an AGS1 file's header and geometry (no key needed)")
    p.add_argument("input", help="AGS1 file")
    p.add_argument("--length", type=int, metavar="N", help="trusted ciphertext length")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_inspect)


def _read_key(args: argparse.Namespace) -> bytes:
    if args.key_hex is not None:
        text = args.key_hex
    else:
        with open(args.key_file, "rb") as f:
            raw = f.read()
        if len(raw) in (16, 24, 32):
            return raw
        text = raw.decode("ascii", "replace")
    try:
        return bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError("the key is neither 16/24/32 raw bytes nor hex") from None


def _aad(args: argparse.Namespace) -> bytes | None:
    return bytes.fromhex(args.aad_hex) if args.aad_hex else None


def _copy(read_into, write, total: int, label: str) -> int:
    """Move ``total`` bytes (or until EOF when total < 0) through one reused buffer."""
    buf = memoryview(bytearray(CHUNK))
    moved = 0
    with Progress(max(total, 0), label) as progress:
        while True:
            n = read_into(buf)
            if not n:
                return moved
            write(buf[:n])
            moved += n
            progress.update(n)


def _spool_stdin() -> BinaryIO:
    """stdin in a temporary file: decryption needs random access and the length."""
    spool = tempfile.TemporaryFile()
    _copy(sys.stdin.buffer.readinto, spool.write, -1, "reading")
    spool.seek(0)
    return spool


def cmd_encrypt(args: argparse.Namespace) -> int:
    key = _read_key(args)
    source = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")
    try:
        total = -1 if args.input == "-" else os.fstat(source.fileno()).st_size
        sink: Any = sys.stdout.buffer if args.output == "-" else args.output
        writer = ags1.open_writer(sink, key, _aad(args))
        with writer:
            _copy(source.readinto, writer.write, total, "encrypting")
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    if args.output == "-":
        sys.stdout.buffer.flush()
    if not args.quiet:
        print(f"icecrypt: {writer.tell()} bytes encrypted; file_length={writer.ciphertext_length}", file=sys.stderr)
    return 0


def cmd_decrypt(args: argparse.Namespace) -> int:
    key = _read_key(args)
    aad = _aad(args)
    source: Any = _spool_stdin() if args.input == "-" else args.input
    try:
        with ags1.open_reader(source, key, aad, args.length) as reader:
            if args.output == "-":
                # Nothing may reach stdout before every block authenticated: verify all
                # blocks first, then decrypt again while writing.
                _copy(reader.readinto, lambda b: None, reader.size, "verifying")
                reader.seek(0)
                _copy(reader.readinto, sys.stdout.buffer.write, reader.size, "decrypting")
                sys.stdout.buffer.flush()
            else:
                _decrypt_to_path(reader, args.output)
    finally:
        if hasattr(source, "close"):
            source.close()
    return 0


def _decrypt_to_path(reader: ags1.Ags1Reader, output: str) -> None:
    """Decrypt into a temporary file beside ``output`` that takes its name only after
    the last block authenticated; on failure it is removed."""
    with AtomicFile(output) as out:
        _copy(reader.readinto, out.file.write, reader.size, "decrypting")
        out.commit(fsync=False)


def cmd_inspect(args: argparse.Namespace) -> int:
    with open(args.input, "rb") as f:
        actual = os.fstat(f.fileno()).st_size
        header = f.read(ags1.HEADER_LENGTH)
    length = actual if args.length is None else args.length
    info: dict[str, Any] = {
        "file": args.input,
        "file_size": actual,
        "ciphertext_length": length,
        "magic": header[:4].decode("ascii", "replace"),
        "block_size": int.from_bytes(header[4:8], "little", signed=True) if len(header) == 8 else None,
    }
    problem = None
    try:
        _gcm.check_header(header, args.input)
        if length != actual:
            raise FormatError(f"{args.input}: file is {actual} bytes, expected {length}")
        plain, blocks, last = _gcm.geometry(length, args.input)
        info.update(blocks=blocks, plaintext_length=plain, last_block_plaintext=last - _gcm.GCM_OVERHEAD)
    except FormatError as exc:
        problem = exc
        info["error"] = str(exc)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:>22}: {safe(v)}")  # the magic and the error quote the file
    if problem is not None:
        raise problem
    return 0
