"""The atomic output file shared by the AGS1 writer, the CLI and the local keystore."""

from __future__ import annotations

import os
import stat

import pytest

from icecrypt._atomic import AtomicFile


def test_commit_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out"
    target.write_bytes(b"old")
    with AtomicFile(target) as f:
        f.file.write(b"new")
        assert target.read_bytes() == b"old"  # nothing under the name before commit
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["out"]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600


def test_no_overwrite_refuses_and_cleans_up(tmp_path):
    target = tmp_path / "out"
    target.write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        with AtomicFile(target) as f:
            f.file.write(b"other")
            f.commit(overwrite=False)
    assert target.read_bytes() == b"keep"
    assert os.listdir(tmp_path) == ["out"]


def test_exception_discards(tmp_path):
    with pytest.raises(RuntimeError):
        with AtomicFile(tmp_path / "out") as f:
            f.file.write(b"partial")
            raise RuntimeError("producer failed")
    assert os.listdir(tmp_path) == []
