"""Recorded locations -> filesystem paths, and finding a table's metadata file."""

from __future__ import annotations

import pickle

import pyarrow.fs as pafs
import pytest

from icecrypt.table import EncryptedTable, Locations
from icecrypt.table.files.metadata import resolve_metadata_file


def test_location_map_longest_prefix_on_boundaries():
    loc = Locations(
        location_map={
            "s3://b/t": "/data/t",
            "s3://b/t/data": "/fast/data",
            "s3://b/x/": "/x",
        }
    )
    assert (
        loc.to_fs_path("s3://b/t/metadata/v1.metadata.json")
        == "/data/t/metadata/v1.metadata.json"
    )
    assert loc.to_fs_path("s3://b/t/data/f.parquet") == "/fast/data/f.parquet"
    assert loc.to_fs_path("s3://b/x/y") == "/x/y"
    with pytest.raises(ValueError, match="s3://b/tt/f.*location_map"):
        loc.to_fs_path(
            "s3://b/tt/f"
        )  # not a path boundary: unmapped, and local cannot read s3


def test_uris_on_local_and_object_store_filesystems():
    local = Locations()
    assert local.to_fs_path("file:///tmp/t/a") == "/tmp/t/a"
    assert local.to_fs_path("file:/tmp/t/a") == "/tmp/t/a"
    assert local.to_fs_path("relative/p").endswith("/relative/p")
    remote = Locations(pafs.SubTreeFileSystem("/tmp", pafs.LocalFileSystem()))
    assert (
        remote.to_fs_path("s3://bucket/warehouse/t/x.avro")
        == "bucket/warehouse/t/x.avro"
    )
    assert remote.to_fs_path("bucket/key") == "bucket/key"


def test_locations_pickle():
    loc = Locations(pafs.LocalFileSystem(), {"s3://b/t": "/data/t"})
    again = pickle.loads(pickle.dumps(loc))
    assert again.to_fs_path("s3://b/t/f") == "/data/t/f"
    assert isinstance(again.filesystem, pafs.LocalFileSystem)


def test_bad_location_map():
    with pytest.raises(TypeError):
        Locations(location_map={"": "/x"})


def test_resolve_directory_hint_and_probe(tmp_path):
    fs = pafs.LocalFileSystem()
    meta = tmp_path / "t" / "metadata"
    meta.mkdir(parents=True)
    for v in (1, 2, 3):
        (meta / f"v{v}.metadata.json").write_text("{}")
    (meta / "version-hint.text").write_text("2")  # lags behind v3
    assert resolve_metadata_file(fs, str(tmp_path / "t")) == str(
        meta / "v3.metadata.json"
    )
    assert resolve_metadata_file(fs, str(meta)) == str(meta / "v3.metadata.json")
    (meta / "version-hint.text").unlink()
    assert resolve_metadata_file(fs, str(tmp_path / "t")) == str(
        meta / "v3.metadata.json"
    )
    assert resolve_metadata_file(fs, str(meta / "v1.metadata.json")) == str(
        meta / "v1.metadata.json"
    )
    with pytest.raises(FileNotFoundError, match="no table metadata"):
        resolve_metadata_file(fs, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_metadata_file(fs, str(tmp_path / "nope"))


def test_gzipped_metadata_and_bad_json(tmp_path, kms):
    import gzip

    from tablelib import copy_table, expected, location_map, metadata_path

    name = "enc_parquet_dek16"
    root = copy_table(name, tmp_path)
    target = root / "metadata" / "00009-x.metadata.json.gz"
    target.write_bytes(gzip.compress(metadata_path(name).read_bytes()))
    table = EncryptedTable.load(target, kms=kms, location_map=location_map(name, root))
    assert table.scan().count() == expected(name)["expected"]["row_count"]
    bad = tmp_path / "b" / "metadata" / "v1.metadata.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    from icecrypt.errors import FormatError

    with pytest.raises(FormatError, match="not valid JSON"):
        EncryptedTable.load(bad, kms=kms)


def _rule(loc: Locations, location: str):
    """What the confinement rule says of ``location``, computed in full (no directory kept)."""
    from icecrypt._paths import fs_path_of

    try:
        parsed = loc.confinement.check(location, loc.canonical(location))
        return fs_path_of(parsed, local=isinstance(loc.filesystem, pafs.LocalFileSystem), original=location)
    except Exception as exc:  # noqa: BLE001 - the kind of refusal is compared
        return type(exc)


def _kept(loc: Locations, location: str):
    try:
        return loc.to_fs_path(location)
    except Exception as exc:  # noqa: BLE001
        return type(exc)


@pytest.mark.parametrize("local", [True, False], ids=["local", "object-store"])
def test_directories_kept_by_a_confined_locations_give_what_the_full_rule_gives(tmp_path, local):
    """A confined Locations keeps each directory's canonical form once it was found inside
    (planning maps thousands of files in a few directories); every file name is still
    checked, and the answer is the full rule's, refusals included."""
    fs = pafs.LocalFileSystem() if local else pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    root = "/w/t" if local else "s3://b/w/t"
    loc = Locations(fs, {f"{root}/data/moved": f"{root}/elsewhere", "s3://b/mapped": "s3://b/w/t/m"}).confined(
        [root], allowed_locations=[f"{root.rsplit('/', 1)[0]}/shared/x.parquet"])
    names = ["a.parquet", "%2e%2e", "%2E%2e", "..", ".", "", "a%2Fb", "a%00b", "a\x01b", "a b", "k=v%20w.parquet",
             "moved", "x.parquet"]
    directories = [f"{root}/data", f"{root}/data/", f"{root}/data//p=1", f"{root}/data/./p", f"{root}/data/../data",
                   f"{root}/data/../../t2", f"{root}", f"{root.rsplit('/', 1)[0]}/shared", f"{root}/data/moved",
                   "s3://b/mapped", "s3://other/w/t/data", "file:/w/t/data", "file:///w/t/data", "/w/t/data", "w/t/data"]
    for directory in directories:
        for name in names:
            location = f"{directory}/{name}"
            first, again = _kept(loc, location), _kept(loc, location)  # the second one from the kept directory
            assert first == again == _rule(loc, location), location
