"""``icecrypt table refs|branch|tag|rollback|properties`` on an encrypted table: each a
commit through the commit model; bad input exits non-zero with a clear message and
commits nothing; names from storage are printed escaped."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from forgery import without_authenticator
from tablelib import run_cli

from icecrypt.cli import main
from icecrypt.kms.local import LocalKms
from icecrypt.table import EncryptedTable


def run(capfd, *argv) -> tuple[int, str, str]:
    return run_cli(capfd, *argv)


@pytest.fixture
def setup(tmp_path):
    keys = tmp_path / "keys.json"
    LocalKms.create_keystore(str(keys), ["master"])
    table = EncryptedTable.create(str(tmp_path / "t"), pa.schema([pa.field("id", pa.int64())]),
                                  kms=LocalKms(str(keys)), table_key_id="master")  # fmt: skip
    ids = [table.append(pa.table({"id": [i]})) for i in range(3)]
    kms = ["--kms-type", "local", "--kms-property", f"encryption.kms.local.keystore={keys}"]
    return str(tmp_path / "t"), kms, ids, LocalKms(str(keys))


def test_refs_commands(setup, capfd):
    location, kms, ids, client = setup
    assert run(capfd, "table", "tag", location, "v1", "--snapshot", ids[0], "--max-ref-age-ms", 1000, *kms)[0] == 0
    assert run(capfd, "table", "branch", location, "audit", "--min-snapshots-to-keep", 2, *kms)[0] == 0
    assert run(capfd, "table", "branch", location, "audit", "--rename", "review", *kms)[0] == 0
    status, out, _ = run(capfd, "table", "refs", location, "--json", *kms)
    refs = json.loads(out)["refs"]
    assert refs["v1"] == {"snapshot-id": ids[0], "type": "tag", "max-ref-age-ms": 1000}
    assert refs["review"] == {"snapshot-id": ids[2], "type": "branch", "min-snapshots-to-keep": 2}
    assert run(capfd, "table", "rollback", location, "--to-snapshot", ids[1], *kms)[0] == 0
    assert EncryptedTable.load(location, kms=client).current_snapshot_id == ids[1]
    assert run(capfd, "table", "rollback", location, "--set-current", "review", *kms)[0] == 0
    assert EncryptedTable.load(location, kms=client).current_snapshot_id == ids[2]
    assert run(capfd, "table", "properties", location, "--set", "owner=ops", *kms)[0] == 0
    status, out, _ = run(capfd, "table", "properties", location, *kms)
    assert "owner=ops" in out.splitlines()
    assert run(capfd, "table", "tag", location, "v1", "--remove", *kms)[0] == 0
    status, out, _ = run(capfd, "table", "refs", location, *kms)
    assert sorted(line.split()[0] for line in out.splitlines()) == ["main", "review"]
    assert EncryptedTable.load(location, kms=client).verify().ok


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["branch", "{t}", "main"], "ref 'main' exists"),
        (["tag", "{t}", "x"], "a new tag needs --snapshot"),
        (["branch", "{t}", "nope", "--remove"], "there is no branch 'nope'"),
        (["rollback", "{t}", "--to-snapshot", "123"], "snapshot 123 is not in the table"),
        (["properties", "{t}", "--set", "encryption.key-id=other"], "encryption property"),
        (["properties", "{t}", "--set", "owner"], "expected KEY=VALUE"),
    ],
)
def test_bad_input_exits_and_commits_nothing(setup, capfd, argv, message):
    location, kms, _, client = setup
    before = EncryptedTable.load(location, kms=client).metadata_location
    status, _, err = run(capfd, "table", *[a.format(t=location) for a in argv], *kms)
    assert status != 0 and message in err
    assert EncryptedTable.load(location, kms=client).metadata_location == before


def test_help_has_examples(capfd):
    for command in ("refs", "branch", "tag", "rollback", "properties"):
        with pytest.raises(SystemExit):
            main(["table", command, "--help"])
        out, _ = capfd.readouterr()
        assert "examples:" in out and f"icecrypt table {command}" in out


def test_ref_names_from_storage_are_printed_escaped(setup, capfd):
    location, kms, ids, client = setup
    table = EncryptedTable.load(location, kms=client)
    path = table.fs_path(table.metadata_location)
    with open(path, encoding="utf-8") as f:
        metadata = without_authenticator(json.load(f))  # as an engine that does not know it writes
    metadata["refs"]["\x1b]0;owned\x07\x1b[2J"] = {"snapshot-id": ids[0], "type": "tag"}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f)
    for extra in ([], ["--json"]):  # such a name is refused when the version loads, the message escaped
        status, out, err = run(capfd, "table", "refs", location, *extra, *kms)
        assert status != 0 and "is not a valid branch or tag name" in err
        assert "\x1b" not in out + err and "\x07" not in out + err
