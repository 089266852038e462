"""Branch and tag names (issue 30).

Ref names were not validated: names with control characters (terminal escapes), ``/../``,
or 100,000 characters were committed, and a loaded version with such names was taken as
it was.  Iceberg Java accepts any non-null string; icecrypt refuses, when a ref is
created or renamed (the API, a write to a new branch, the CLI) and in a loaded version,
names that are empty, longer than 255 UTF-8 bytes, hold control or format characters or
line separators, start or end with whitespace, hold what a location may not (a
backslash, percent-encoded dot segments or separators), or have empty, ``.`` or ``..``
segments between ``/``."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from test_attack_cli import MEMORY_KMS, commit_edit, run

from icecrypt import FormatError
from icecrypt.table import EncryptedTable
from icecrypt.table.model.changes import MAX_REF_NAME_BYTES

SCHEMA = pa.schema([pa.field("id", pa.int64())])

REFUSED = {
    "escape": "a\x1b[2Jb",
    "newline": "audit\nmain",
    "nul": "a\x00b",
    "bidi": "txt\u202egnp",
    "zero-width": "ma\u200bin",
    "line-separator": "a\u2028b",
    "dot-dot": "x/../y",
    "leading-dot-dot": "../x",
    "dot": "./x",
    "only-dots": "..",
    "empty-segment": "a//b",
    "leading-slash": "/a",
    "trailing-slash": "a/",
    "backslash": "a\\b",
    "encoded-dots": "a/%2e%2e/b",
    "encoded-slash": "a%2Fb",
    "trailing-space": "main ",
    "leading-space": " main",
    "huge": "b" * 100_000,
    "too-many-bytes": "é" * 128,  # 256 bytes in UTF-8
    "empty": "",
}
ALLOWED = ["feature/x", "release-1.2", "ünïcödé", "with space", "x" * MAX_REF_NAME_BYTES, "a%20b", "v1.0"]


@pytest.fixture
def table(tmp_path, kms) -> EncryptedTable:
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    table.append(pa.table({"id": [1, 2]}, schema=SCHEMA))
    return table


@pytest.mark.parametrize("name", list(REFUSED.values()), ids=list(REFUSED))
def test_a_bad_ref_name_is_never_committed(table, name):
    sid = table.current_snapshot_id
    attempts = [lambda: table.manage_snapshots().create_branch(name).commit(),
                lambda: table.manage_snapshots().create_tag(name, sid).commit(),
                lambda: table.append(pa.table({"id": [3]}, schema=SCHEMA), branch=name)]
    table.manage_snapshots().create_branch("dev").commit()
    before = table.refresh().metadata_location
    attempts.append(lambda: table.manage_snapshots().rename_branch("dev", name).commit())
    for attempt in attempts:
        with pytest.raises(ValueError, match="is refused|non-empty string") as caught:
            attempt()
        text = str(caught.value)
        assert len(text) < 400 and "\x1b" not in text and "\n" not in text  # cut and escaped
    assert table.refresh().metadata_location == before
    assert set(table.metadata["refs"]) == {"main", "dev"}


@pytest.mark.parametrize("name", ALLOWED)
def test_names_iceberg_users_write_still_work(table, name):
    sid = table.current_snapshot_id
    table.manage_snapshots().create_branch(name).create_tag(name + "-t" if len(name) < 200 else "t", sid).commit()
    table.append(pa.table({"id": [3]}, schema=SCHEMA), branch=name)
    reloaded = EncryptedTable.load(table.location, kms=table.kms)
    assert sorted(reloaded.scan(branch=name).to_arrow()["id"].to_pylist()) == [1, 2, 3]


@pytest.mark.parametrize("key", ["escape", "dot-dot", "huge", "trailing-space", "backslash"])
def test_a_loaded_version_with_a_bad_ref_name_is_refused(table, key):
    """What an attacker writes into metadata.json: a ref whose name is refused; loading
    that version fails naming the file and why, the name escaped and cut."""
    name = REFUSED[key]
    where = Path(table.location)

    def add_ref(metadata):
        metadata["refs"][name] = {"snapshot-id": metadata["current-snapshot-id"], "type": "branch"}

    forged = commit_edit(where, add_ref)
    with pytest.raises(FormatError) as caught:
        EncryptedTable.load(str(where), kms=table.kms)
    text = str(caught.value)
    assert str(forged) in text and "is not a valid branch or tag name" in text
    assert len(text) < 600 and "\x1b" not in text


def test_the_cli_refuses_a_bad_branch_name(tmp_path, capfd, table):
    before = table.refresh().metadata_location
    status, out, err = run(capfd, "table", "branch", table.location, "a\x1b[2Jb", *MEMORY_KMS)
    assert status != 0 and "is refused" in err and "\x1b" not in err and "\\x1b" in err
    status, out, err = run(capfd, "table", "tag", table.location, "../../x", "--snapshot", table.current_snapshot_id,
                           *MEMORY_KMS)
    assert status != 0 and "'..' segment" in err
    assert table.refresh().metadata_location == before
    status, out, err = run(capfd, "table", "branch", table.location, "feature/x", *MEMORY_KMS)
    assert status == 0, err
    assert json.loads(Path(table.refresh().metadata_location).read_text())["refs"]["feature/x"]["type"] == "branch"
