"""``plain_prefixes`` escaped with ``..`` (issue 16, item 10): both encrypting filesystems
compare paths normalized as table locations are, so a file written through a path that
climbs out of a plain prefix is encrypted like any other file outside it."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from icecrypt.arrow import EncryptedFileSystem as ArrowEncryptedFileSystem
from icecrypt.fsspec import EncryptedFileSystem

ESCAPES = ["{d}/plain/../secret/b.bin", "{d}/plain/./../secret/b.bin", "{d}/plain//..//secret/b.bin",
           "{d}/plain/sub/../../secret/b.bin"]


def _fsspec_write(fs, path: str, data: bytes) -> None:
    with fs.open(path, "wb") as f:
        f.write(data)


def _arrow_write(fs, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as f:
        f.write(data)


@pytest.mark.parametrize("kind", ["fsspec", "arrow"])
@pytest.mark.parametrize("escape", ESCAPES)
def test_dot_dot_out_of_a_plain_prefix_is_encrypted(tmp_path, manager, kind, escape):
    for name in ("plain", "plain/sub", "secret"):
        (tmp_path / name).mkdir(exist_ok=True)
    if kind == "fsspec":
        fs = EncryptedFileSystem("file", manager, plain_prefixes=[str(tmp_path / "plain")])
        write, plain = _fsspec_write, fs.is_plain
    else:
        fs = ArrowEncryptedFileSystem.wrap(pafs.LocalFileSystem(), manager, plain_prefixes=[str(tmp_path / "plain")])
        write, plain = _arrow_write, fs.handler.is_plain
    path = escape.format(d=tmp_path)
    assert not plain(path)
    write(fs, path, b"the secret payload")
    stored = (tmp_path / "secret" / "b.bin").read_bytes()
    assert stored[:4] == b"AGS1" and b"the secret payload" not in stored
    # and the other way: into the plain prefix through a detour stays plain
    into = f"{tmp_path}/secret/../plain/p.txt"
    assert plain(into)
    write(fs, into, b"public")
    assert (tmp_path / "plain" / "p.txt").read_bytes() == b"public"


@pytest.mark.parametrize("kind", ["fsspec", "arrow"])
def test_prefixes_are_normalized_and_odd_names_are_never_plain(tmp_path, manager, kind):
    if kind == "fsspec":
        fs = EncryptedFileSystem("file", manager, plain_prefixes=[f"{tmp_path}/x/../plain/"])
        plain = fs.is_plain
    else:
        fs = ArrowEncryptedFileSystem.wrap(pafs.LocalFileSystem(), manager, plain_prefixes=[f"{tmp_path}/x/../plain/"])
        plain = fs.handler.is_plain
    assert plain(f"{tmp_path}/plain/a") and plain(f"{tmp_path}//plain/./a")
    assert not plain(f"{tmp_path}/plainer/a")
    assert not plain(f"{tmp_path}/plain/a\\..\\..\\secret") and not plain(f"{tmp_path}/plain/%2e%2e/secret")
    with pytest.raises(ValueError, match="plain_prefixes"):
        EncryptedFileSystem("file", manager, plain_prefixes=[f"{tmp_path}/p\x00"])
