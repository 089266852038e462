"""``icecrypt table spec|sort`` and ``rewrite-data-files --strategy sort``: each change
one commit through the commit model; bad input exits non-zero with a clear message and
commits nothing; names from storage are printed escaped."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from forgery import without_authenticator
from tablelib import run_cli

from icecrypt.cli import main
from icecrypt.kms.local import LocalKms
from icecrypt.table import EncryptedTable, read_task

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("ts", pa.timestamp("us")), pa.field("cat", pa.string())])


def run(capfd, *argv) -> tuple[int, str, str]:
    return run_cli(capfd, *argv)


@pytest.fixture
def setup(tmp_path):
    keys = tmp_path / "keys.json"
    LocalKms.create_keystore(str(keys), ["master"])
    client = LocalKms(str(keys))
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=client, table_key_id="master")
    for start in (0, 10):
        table.append(pa.table({"id": range(start, start + 10), "ts": [None] * 10,
                               "cat": [f"c{i % 3}" for i in range(start, start + 10)]}, schema=SCHEMA))  # fmt: skip
    kms = ["--kms-type", "local", "--kms-property", f"encryption.kms.local.keystore={keys}"]
    return str(tmp_path / "t"), kms, client


def test_spec_commands(setup, capfd):
    location, kms, client = setup
    status, out, err = run(capfd, "table", "spec", location, "--add", "day(ts)", "--add", "bucket(16, id)=shard", *kms)
    assert status == 0, err
    status, out, _ = run(capfd, "table", "spec", location, "--json", *kms)
    spec = json.loads(out)["partition-specs"]
    assert spec == [{"spec-id": 1, "fields": [
        {"name": "ts_day", "transform": "day", "source-id": 2, "field-id": 1000},
        {"name": "shard", "transform": "bucket[16]", "source-id": 1, "field-id": 1001}]}]  # fmt: skip
    assert run(capfd, "table", "spec", location, "--rename", "shard=id_shard", "--remove", "ts_day", *kms)[0] == 0
    status, out, _ = run(capfd, "table", "spec", location, "--all", *kms)
    assert out.splitlines()[-1] == "spec-id 2 (default): id_shard=bucket[16](id) [1001]"
    status, out, _ = run(capfd, "table", "spec", location, "--rename", "id_shard=id_shard", *kms)
    assert status == 0 and "nothing committed" in out
    table = EncryptedTable.load(location, kms=client)
    assert [f.name for f in table.spec.fields] == ["id_shard"] and table.verify().ok


def test_sort_commands_and_sorted_rewrite(setup, capfd):
    location, kms, client = setup
    status, _, err = run(capfd, "table", "sort", location, "--replace", "cat DESC NULLS LAST, bucket(4, id)", *kms)
    assert status == 0, err
    status, out, _ = run(capfd, "table", "sort", location, *kms)
    assert out.strip() == "order-id 1 (default): cat desc nulls-last, bucket[4](id) asc nulls-first"
    status, _, err = run(capfd, "table", "rewrite-data-files", location, "--strategy", "sort",
                         "--option", "rewrite-all=true", *kms)  # fmt: skip
    assert status == 0, err
    table = EncryptedTable.load(location, kms=client)
    (task,) = table.scan().plan_files()
    cats = pa.Table.from_batches(list(read_task(task, table.filesystem))).column("cat").to_pylist()
    assert cats == sorted(cats, reverse=True) and len(cats) == 20
    assert run(capfd, "table", "sort", location, "--unsorted", *kms)[0] == 0
    assert EncryptedTable.load(location, kms=client).metadata["default-sort-order-id"] == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["spec", "{t}", "--add", "day(nope)"], "no such column"),
        (["spec", "{t}", "--add", "day(cat)"], "does not apply"),
        (["spec", "{t}", "--add", "wobble(id)"], "unknown transform"),
        (["spec", "{t}", "--add", "id=", ], "expected TERM or TERM=NAME"),
        (["spec", "{t}", "--remove", "ghost"], "no partition field 'ghost'"),
        (["spec", "{t}", "--rename", "ghost"], "expected OLD=NEW"),
        (["sort", "{t}", "--replace", "id sideways"], "cannot read sort term"),
        (["sort", "{t}", "--replace", "id, id"], "twice"),
        (["rewrite-data-files", "{t}", "--strategy", "sort"], "unsorted and no sort order"),
    ],
)
def test_bad_input_exits_and_commits_nothing(setup, capfd, argv, message):
    location, kms, client = setup
    before = EncryptedTable.load(location, kms=client).metadata_location
    status, _, err = run(capfd, "table", *[a.format(t=location) for a in argv], *kms)
    assert status != 0 and message in err, err
    assert EncryptedTable.load(location, kms=client).metadata_location == before


def test_help_has_examples(capfd):
    for command in ("spec", "sort"):
        with pytest.raises(SystemExit):
            main(["table", command, "--help"])
        out, _ = capfd.readouterr()
        assert "examples:" in out and f"icecrypt table {command}" in out


def test_names_from_storage_are_printed_escaped(setup, capfd):
    location, kms, client = setup
    table = EncryptedTable.load(location, kms=client)
    table.update_spec().add_identity("cat").commit()
    path = table.fs_path(table.metadata_location)
    with open(path, encoding="utf-8") as f:
        metadata = without_authenticator(json.load(f))  # as an engine that does not know it writes
    metadata["partition-specs"][-1]["fields"][0]["name"] = "\x1b]0;owned\x07\x1b[2J"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f)
    for extra in ([], ["--json"]):
        status, out, _ = run(capfd, "table", "spec", location, *extra, *kms)
        assert status == 0 and "\x1b" not in out and "\x07" not in out
