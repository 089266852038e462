"""The AGS1 commands of the ``icecrypt`` command line, run as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from icecrypt import ags1

KEY = bytes(range(16))
AAD = bytes(range(100, 116))
PLAIN = os.urandom(2 * ags1.PLAIN_BLOCK_SIZE + 99)


def run(*args, input=None):
    return subprocess.run(
        [sys.executable, "-m", "icecrypt", *map(str, args)], input=input, capture_output=True, timeout=120
    )


@pytest.fixture
def files(tmp_path):
    plain = tmp_path / "plain.bin"
    plain.write_bytes(PLAIN)
    keyfile = tmp_path / "dek.key"
    keyfile.write_bytes(KEY)
    return tmp_path, plain, keyfile


def test_encrypt_inspect_decrypt(files):
    d, plain, keyfile = files
    enc = d / "data.ags1"
    r = run("encrypt", plain, enc, "--key-file", keyfile, "--aad-hex", AAD.hex())
    assert r.returncode == 0, r.stderr
    length = enc.stat().st_size
    assert f"file_length={length}".encode() in r.stderr
    assert ags1.decrypt(enc.read_bytes(), KEY, AAD, length=length) == PLAIN

    r = run("inspect", enc, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["magic"] == "AGS1" and info["block_size"] == 1048576
    assert info["blocks"] == 3 and info["plaintext_length"] == len(PLAIN)

    out = d / "out.bin"
    r = run("decrypt", enc, out, "--key-hex", KEY.hex(), "--aad-hex", AAD.hex(), "--length", length)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == PLAIN


def test_stdin_and_stdout(files):
    d, plain, keyfile = files
    r = run("encrypt", "-", "-", "--key-file", keyfile, "-q", input=PLAIN[:5000])
    assert r.returncode == 0 and r.stderr == b""
    blob = r.stdout
    assert ags1.decrypt(blob, KEY) == PLAIN[:5000]
    r = run("decrypt", "-", "-", "--key-file", keyfile, input=blob)
    assert r.returncode == 0, r.stderr
    assert r.stdout == PLAIN[:5000]


def test_hex_key_file(files):
    d, plain, _ = files
    keyfile = d / "dek.hex"
    keyfile.write_text(KEY.hex() + "\n")
    enc = d / "x.ags1"
    assert run("encrypt", plain, enc, "--key-file", keyfile).returncode == 0
    assert ags1.decrypt(enc.read_bytes(), KEY) == PLAIN


def test_authentication_failure_writes_nothing(files):
    d, plain, keyfile = files
    enc = d / "data.ags1"
    assert run("encrypt", plain, enc, "--key-file", keyfile, "--aad-hex", AAD.hex()).returncode == 0
    damaged = bytearray(enc.read_bytes())
    damaged[-5] ^= 0x10  # last block: earlier blocks would decrypt fine
    enc.write_bytes(damaged)
    out = d / "out.bin"
    r = run("decrypt", enc, out, "--key-file", keyfile, "--aad-hex", AAD.hex())
    assert r.returncode == 2
    assert r.stderr.decode().count("\n") == 1 and "block 2" in r.stderr.decode()
    assert not out.exists()
    assert sorted(p.name for p in d.iterdir()) == ["data.ags1", "dek.key", "plain.bin"]
    r = run("decrypt", enc, "-", "--key-file", keyfile, "--aad-hex", AAD.hex())
    assert r.returncode == 2 and r.stdout == b""  # stdout gets nothing either


def test_wrong_key_is_exit_2_and_format_errors_exit_3(files):
    d, plain, keyfile = files
    enc = d / "data.ags1"
    assert run("encrypt", plain, enc, "--key-file", keyfile).returncode == 0
    r = run("decrypt", enc, d / "o", "--key-hex", "00" * 16)
    assert r.returncode == 2
    assert KEY.hex() not in r.stderr.decode() and "00" * 16 not in r.stderr.decode()
    truncated = d / "t.ags1"
    truncated.write_bytes(enc.read_bytes()[: 8 + 2 * ags1.CIPHER_BLOCK_SIZE + 10])  # 10 stray bytes
    r = run("decrypt", truncated, d / "o", "--key-file", keyfile)
    assert r.returncode == 3 and b"invalid AGS1 stream" in r.stderr
    assert run("inspect", truncated).returncode == 3
    r = run("decrypt", enc, d / "o", "--key-file", keyfile, "--length", enc.stat().st_size + 1)
    assert r.returncode == 3 and b"truncated" in r.stderr
    assert run("inspect", plain).returncode == 3
    assert not (d / "o").exists()


def test_bad_key_arguments(files):
    d, plain, _ = files
    r = run("encrypt", plain, d / "x", "--key-hex", "abcd")
    assert r.returncode == 1 and b"Invalid key length: 2" in r.stderr
    assert not (d / "x").exists()
    r = run("encrypt", plain, d / "x")
    assert r.returncode != 0  # a key is required


class FakeTerminal:
    def __init__(self, tty):
        self.tty = tty
        self.text = ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_bar_only_on_terminals_for_large_files():
    from icecrypt._progress import Progress

    term = FakeTerminal(True)
    with Progress(128 << 20, "encrypting", stream=term) as p:
        for _ in range(128):
            p.update(1 << 20)
    assert "encrypting" in term.text and "100%" in term.text and term.text.endswith("\n")
    for total, tty in ((32 << 20, True), (128 << 20, False)):
        quiet = FakeTerminal(tty)
        with Progress(total, "encrypting", stream=quiet) as p:
            p.update(total)
        assert quiet.text == ""
