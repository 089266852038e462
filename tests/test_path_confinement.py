"""Property tests of the path confinement rule (icecrypt._paths, Locations.confined):
generated locations with schemes in any case, ``file:`` forms, ``.``/``..`` segments,
doubled and trailing slashes and percent-encoding, against an independent oracle
(``posixpath`` on the decoded-free path) and against the filesystem."""

from __future__ import annotations

import os
import posixpath

import pyarrow.fs as pafs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from icecrypt import PathOutsideTableError
from icecrypt._paths import UnsafeLocationError, normalize_path, parse_location
from icecrypt.table.files.io import Locations

NAMES = st.sampled_from(["t", "t2", "data", "metadata", "x.parquet", "a b", "%20", "p%3Dq", "tt", "..t", "t.."])
SEGMENTS = st.lists(st.one_of(NAMES, st.sampled_from(["..", ".", ""])), max_size=8)
ROOT = "/wh/db/t"


def oracle_inside(segments: list[str], root: str = ROOT) -> bool:
    """posixpath's answer: is /wh/db/t/<segments> under root after normalization?"""
    path = posixpath.normpath("/" + "/".join(["wh", "db", "t", *segments]))
    path = "/" + path.lstrip("/")  # normpath keeps a leading '//'
    return path == root or path.startswith(root + "/")


def file_forms(path: str) -> list[str]:
    return [path, f"file:{path}", f"file://{path}", f"file://localhost{path}", f"FILE://{path}", f"File:{path}"]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(segments=SEGMENTS, form=st.integers(0, 5), trailing=st.booleans())
def test_local_locations_agree_with_posixpath(segments, form, trailing):
    locations = Locations(pafs.LocalFileSystem()).confined([ROOT])
    raw = "/" + "/".join(["wh", "db", "t", *segments]) + ("/" if trailing else "")
    location = file_forms(raw)[form]
    expected = oracle_inside(segments)
    try:
        path = locations.to_fs_path(location)
    except PathOutsideTableError as exc:
        assert not expected, location
        assert location in str(exc) and ROOT in str(exc)
        return
    assert expected, location
    # what is opened is the normalized path, and it is the root or below it
    assert path == posixpath.normpath(path) or path == "/"
    assert path == ROOT or path.startswith(ROOT + "/")


@settings(max_examples=300)
@given(segments=SEGMENTS, scheme=st.sampled_from(["s3", "S3", "s3a", "S3A", "s3n"]), bucket=st.sampled_from(["bucket", "Bucket", "other", "bucket2"]))
def test_object_store_locations_keep_scheme_and_bucket(segments, scheme, bucket):
    locations = Locations(pafs.S3FileSystem(anonymous=True, region="us-east-1"), {"s3://bucket/wh": "bucket/wh"}).confined(["s3://bucket/wh/db/t"])
    location = f"{scheme}://{bucket}/" + "/".join(["wh", "db", "t", *segments])
    inside = oracle_inside(segments) and bucket == "bucket"
    try:
        path = locations.to_fs_path(location)
    except PathOutsideTableError:
        assert not inside, location
        return
    assert inside, location
    assert path == "bucket/wh/db/t" or path.startswith("bucket/wh/db/t/")


@given(scheme=st.sampled_from(["gs", "abfs", "hdfs", "http", "s3"]), host=st.sampled_from(["other", "bucket", ""]), segments=SEGMENTS)
def test_a_foreign_scheme_or_bucket_is_never_dropped(scheme, host, segments):
    assume(not (scheme == "s3" and host == "bucket"))  # the table's own bucket: covered above
    locations = Locations(pafs.S3FileSystem(anonymous=True, region="us-east-1")).confined(["s3://bucket/t"])
    with pytest.raises(PathOutsideTableError):
        locations.to_fs_path(f"{scheme}://{host}/" + "/".join(["t", *segments]))


def test_a_plain_key_is_another_place_than_a_scheme_on_an_object_store():
    locations = Locations(pafs.S3FileSystem(anonymous=True, region="us-east-1")).confined(["s3://bucket/t"])
    for location in ("other/t/data/x", "/bucket/t/data/x", "file:///bucket/t/data/x", "gs://bucket/t/data/x"):
        with pytest.raises(PathOutsideTableError):
            locations.to_fs_path(location)
    assert locations.to_fs_path("s3://bucket/t/data/x") == "bucket/t/data/x"


@given(
    prefix=st.lists(NAMES, max_size=3),
    encoded=st.sampled_from(["%2e%2e", "%2E%2e", "%2e", ".%2e", "%2e.", "%00", "a%00b", "x=%00"]),
    suffix=st.lists(NAMES, max_size=3),
)
def test_encoded_dot_segments_and_nul_are_refused(prefix, encoded, suffix):
    location = "/".join([ROOT, *prefix, encoded, *suffix])
    with pytest.raises(UnsafeLocationError):
        parse_location(location, local=True)
    with pytest.raises(PathOutsideTableError, match="of table"):
        Locations(pafs.LocalFileSystem()).confined([ROOT]).to_fs_path(location)


@pytest.mark.parametrize("encoded", ["%1b", "%1B%5D0%3Bx%07", "%0d", "%7f"])
def test_encoded_control_characters_are_literal_names(encoded):
    # partition values are percent-encoded into file names: a value holding an escape
    # character is a name like any other, not a way out of the table
    location = f"{ROOT}/data/part={encoded}/f.parquet"
    assert Locations(pafs.LocalFileSystem()).confined([ROOT]).to_fs_path(location) == location


# --- Java's partition directories and the confinement rule at once ------------------------------

FIELD_NAMES = st.text(max_size=6) | st.sampled_from(["category", "..", ".", "a/b", "%2e%2e"])
VALUES = st.text(max_size=12) | st.sampled_from(["..", ".", "../..", "/", "\\", "%2e%2e", "..%2F..", "a/../../b", "\x00"])


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.lists(st.tuples(FIELD_NAMES, VALUES), min_size=1, max_size=3), prefix=st.sampled_from(["", "file:", "file://"]))
def test_every_java_partition_directory_is_names_inside_the_table(fields, prefix):
    """Whatever the partition field names and values, the directories Java's escaping
    makes of them are accepted, opened exactly as written (nothing decoded, nothing
    normalized away) and lie under the table's data directory; an encoded separator is
    a character of one name."""
    from icecrypt.table.files.layout import escape

    directories = "/".join(f"{escape(name)}={escape(value)}" for name, value in fields)
    location = f"{prefix}{ROOT}/data/{directories}/00000-0-x-00001.parquet"
    locations = Locations(pafs.LocalFileSystem()).confined([ROOT])
    if any("\x00" in name + value for name, value in fields):  # %00: NUL stays refused
        with pytest.raises(UnsafeLocationError):
            locations.to_fs_path(location)
        return
    path = locations.to_fs_path(location)
    assert path == f"{ROOT}/data/{directories}/00000-0-x-00001.parquet"
    assert path.count("/") == ROOT.count("/") + 2 + len(fields)
    assert all("=" in part for part in directories.split("/"))


@settings(max_examples=50, deadline=None)
@given(value=VALUES)
def test_java_partition_directories_on_storage_are_one_name(tmp_path_factory, value):
    """On the local filesystem, through pyarrow and through fsspec: the file lands in one
    directory named as escaped, below the table's data directory."""
    assume("\x00" not in value)
    from fsspec.implementations.local import LocalFileSystem

    from icecrypt.table.files.layout import escape

    root = tmp_path_factory.mktemp("t")
    name = f"category={escape(value)}"
    for n, fs in enumerate((pafs.LocalFileSystem(), pafs.PyFileSystem(pafs.FSSpecHandler(LocalFileSystem())))):
        path = Locations(fs).confined([str(root)]).to_fs_path(f"{root}/data/{name}/f{n}")
        fs.create_dir(posixpath.dirname(path))
        with fs.open_output_stream(path) as out:
            out.write(b"x")
    assert os.listdir(root / "data") == [name]
    assert sorted(os.listdir(root / "data" / name)) == ["f0", "f1"]


@given(segments=st.lists(NAMES, min_size=1, max_size=5), encoded=st.sampled_from(["%2f", "a%2Fb", "%5c", "N%2FA", "..%2F..", "%2F..%2F"]))
def test_encoded_separators_are_characters_of_a_name(segments, encoded):
    location = "/".join([ROOT, *segments, encoded])
    parsed = parse_location(location, local=True)
    assert parsed.path == posixpath.normpath(location) or parsed.path == normalize_path(location)
    assert parsed.path.endswith("/" + encoded)


@given(segments=st.lists(NAMES, min_size=1, max_size=5))
def test_other_percent_encoding_is_kept_literally(segments):
    location = "/".join([ROOT, *segments])
    assert parse_location(location, local=True).path == location


@given(text=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="%"), max_size=20))
def test_control_characters_and_backslashes_are_refused(text):
    location = f"{ROOT}/{text}"
    bad = any(ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in text)
    try:
        parse_location(location, local=True)
    except UnsafeLocationError:
        assert bad
        return
    assert not bad


@given(segments=SEGMENTS)
def test_normalize_path_matches_posixpath_for_absolute_paths(segments):
    path = "/" + "/".join(segments)
    expected = "/" + posixpath.normpath(path).lstrip("/")
    assert normalize_path(path) == expected


def test_roots_on_segment_boundaries_and_relative_locations(tmp_path, monkeypatch):
    locations = Locations(pafs.LocalFileSystem()).confined([str(tmp_path / "t")])
    with pytest.raises(PathOutsideTableError):
        locations.to_fs_path(str(tmp_path / "t2" / "x"))
    with pytest.raises(PathOutsideTableError):
        locations.to_fs_path(str(tmp_path / "t") + "x/y")
    monkeypatch.chdir(tmp_path)
    assert locations.to_fs_path("t/data/x") == str(tmp_path / "t" / "data" / "x")
    with pytest.raises(PathOutsideTableError):
        locations.to_fs_path("t/../u/x")
    assert locations.is_inside("t/./data") and not locations.is_inside("../t")


def test_confinement_survives_pickling():
    import pickle

    locations = Locations(pafs.LocalFileSystem(), {"s3://b/t": "/data/t"}).confined(["s3://b/t"])
    clone = pickle.loads(pickle.dumps(locations))
    assert clone.to_fs_path("s3://b/t/data/x") == "/data/t/data/x"
    with pytest.raises(PathOutsideTableError):
        clone.to_fs_path("/data/other")
    assert os.fspath(clone.unconfined.to_fs_path("/data/other")) == "/data/other"
