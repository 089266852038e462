"""read_split: any cut of the decrypted byte range into consecutive splits yields every
record exactly once, in order, and each split decrypts only the AGS1 blocks it needs."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest
from avrohelpers import avro_files, local_path
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from icecrypt import ags1, avro
from icecrypt.avro._container import Plaintext, iter_blocks, read_header

BS = ags1.PLAIN_BLOCK_SIZE
SCHEMA = {
    "type": "record",
    "name": "r",
    "fields": [
        {"name": "i", "type": "long", "field-id": 1},
        {"name": "payload", "type": "bytes", "field-id": 2},
    ],
}


class SplitFile:
    """A written file and what a test needs to know about its layout."""

    def __init__(self, path, km, count):
        self.path, self.km, self.count = path, km, count
        self.size = avro.plaintext_size(km)
        with Plaintext(path, km) as plain:
            header = read_header(plain)
            self.header_end = header.end
            self.block_ends = []  # end of each Avro block (just after its sync marker)
            pos = header.end
            for raw in iter_blocks(plain, header, pos):
                pos += len(raw)
                self.block_ends.append(pos)
        assert not self.block_ends or self.block_ends[-1] == self.size

    def interesting(self):
        """Offsets where off-by-one errors live: sync markers, AGS1 block edges, the header."""
        points = {self.header_end - 16, self.header_end}
        for end in self.block_ends:
            points.update((end - 16, end))
        points.update(k * BS for k in range(1, self.size // BS + 1))
        return sorted(p + d for p in points for d in (-1, 0, 1) if 0 < p + d < self.size)


_files: dict[tuple, SplitFile] = {}


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("splits")


def make_file(directory, seed, count, max_record, sync_interval, codec) -> SplitFile:
    key = (seed, count, max_record, sync_interval, codec)
    if key not in _files:
        rng = random.Random(seed)
        rows = [{"i": i, "payload": rng.randbytes(rng.randint(0, max_record))} for i in range(count)]
        path = directory / f"split-{len(_files)}.avro"
        km = avro.write_records(path, SCHEMA, rows, codec=codec, sync_interval=sync_interval)
        _files[key] = SplitFile(path, km, count)
    return _files[key]


def read_all_splits(f: SplitFile, cuts, columns=("i",)):
    bounds = [0, *sorted(set(cuts)), f.size]
    ids = []
    for start, end in itertools.pairwise(bounds):
        stats = avro.ReadStats()
        for batch in avro.read_split(f.path, f.km, start, end - start, columns=list(columns), stats=stats):
            assert batch.schema.names == list(columns)
            ids.extend(batch.column("i").to_pylist())
        # block 0 for the header, then only blocks of [start, end) and at most one more
        # (the rest of the split's last Avro block), each decrypted once
        assert len(stats.blocks) == len(set(stats.blocks)), stats.blocks
        allowed = {0} | set(range(start // BS, (end - 1) // BS + 2))
        assert set(stats.blocks) <= allowed, (start, end, stats.blocks)
    return ids


sync_intervals = st.sampled_from([1, 200, 16_000, 64_000, 300_000])  # bytes per Avro block
codecs = st.sampled_from(["null", "deflate"])
# small files: every record size, any block size, inside AGS1 block 0
small_files = st.tuples(st.integers(0, 2**32), st.integers(0, 400), st.sampled_from([0, 1, 50, 3000]),
                        sync_intervals, codecs)
# files over 1 to 5 AGS1 blocks
large_files = st.tuples(st.integers(0, 2**32), st.sampled_from([150, 200, 300]),
                        st.sampled_from([15_000, 20_000, 30_000]), sync_intervals, codecs)
_health = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(suppress_health_check=_health, deadline=None, max_examples=40)
@given(params=small_files, data=st.data())
def test_splits_yield_every_record_once(split_dir, params, data):
    check_cuts(make_file(split_dir, *params), data)


@settings(suppress_health_check=_health, deadline=None, max_examples=25)
@given(params=large_files, data=st.data())
def test_splits_of_multi_block_files(split_dir, params, data):
    f = make_file(split_dir, *params)
    assume(f.size > BS)
    check_cuts(f, data)


def check_cuts(f: SplitFile, data) -> None:
    """Any cut of [0, size) into consecutive splits (lengths of 1, edges on sync
    markers and AGS1 block boundaries +-1 included) reads every record once, in order."""
    interesting = f.interesting()
    point = st.integers(1, max(1, f.size - 1))
    if interesting:
        point = st.one_of(point, st.sampled_from(interesting))
    cuts = data.draw(st.lists(point, max_size=24), label="cuts")
    if data.draw(st.booleans(), label="length-1 splits") and f.size > 2:
        p = data.draw(st.integers(1, f.size - 2))
        cuts += [p, p + 1]
    cuts = [c for c in cuts if 0 < c < f.size]
    assert read_all_splits(f, cuts) == list(range(f.count))


def test_multi_block_file_every_boundary(split_dir):
    """A 3+ MiB file cut at every sync marker and AGS1 block edge (+-1) at once, and
    into 1-byte splits around them."""
    f = make_file(split_dir, 7, 300, 20_000, 64_000, "null")
    assert f.size > 2 * BS and len(f.block_ends) > 10
    assert read_all_splits(f, f.interesting()) == list(range(f.count))
    first_sync = f.block_ends[3] - 16
    tiny = list(range(first_sync - 3, first_sync + 20))
    assert read_all_splits(f, tiny) == list(range(f.count))
    assert read_all_splits(f, [BS - 1, BS, BS + 1, 2 * BS]) == list(range(f.count))


def test_split_columns_and_payload(split_dir):
    f = make_file(split_dir, 3, 120, 30_000, 16_000, "deflate")
    rng = random.Random(3)
    expected = [rng.randbytes(rng.randint(0, 30_000)) for _ in range(120)]
    mid = f.size // 2
    tables = [
        pa.Table.from_batches(list(avro.read_split(f.path, f.km, s, n)))
        for s, n in ((0, mid), (mid, f.size - mid))
    ]
    whole = pa.concat_tables(tables)
    assert whole.column("payload").to_pylist() == expected
    assert whole.schema.field("payload").metadata == {b"PARQUET:field_id": b"2"}
    assert whole.equals(avro.read(f.path, f.km))


def test_split_decrypts_only_its_blocks(split_dir):
    f = make_file(split_dir, 11, 300, 20_000, 64_000, "null")
    assert f.size > 2 * BS + 100_000
    sync = next(end - 16 for end in f.block_ends if end - 16 > 2 * BS + 5)
    assert sync + 1000 < 3 * BS
    stats = avro.ReadStats()
    rows = sum(b.num_rows for b in avro.read_split(f.path, f.km, sync - 5, 1000, stats=stats))
    assert rows >= 1
    assert stats.blocks in ([0, 2], [0, 2, 3])
    stats = avro.ReadStats()
    assert list(avro.read_split(f.path, f.km, f.size - 5, 5, stats=stats)) == []
    assert stats.blocks == [0]  # no sync marker can start in the last 15 bytes: nothing to scan


def test_split_past_the_end_and_empty_file(split_dir):
    f = make_file(split_dir, 1, 10, 10, 200, "null")
    assert list(avro.read_split(f.path, f.km, f.size, 100)) == []
    assert list(avro.read_split(f.path, f.km, 0, 0)) == []
    with pytest.raises(ValueError):
        avro.read_split(f.path, f.km, -1, 10)
    empty = make_file(split_dir, 1, 0, 10, 200, "null")
    assert empty.block_ends == []
    assert list(avro.read_split(empty.path, empty.km, 0, empty.size)) == []


def test_java_data_file_splits():
    """The Java-written Avro data file that spans two AGS1 blocks, in splits."""
    table = "enc_avro_dek16"
    uri, f = next((u, f) for u, f in avro_files(table).items() if f["kind"] == "data" and "alpha" in u)
    path, km = local_path(table, uri), f["key_metadata"]
    size = avro.plaintext_size(km)
    assert size > BS
    whole = avro.read(path, km)
    for cuts in ([BS], [1, 4096, BS - 1, BS + 1], list(range(100_000, size, 100_000))):
        bounds = [0, *cuts, size]
        parts = [b for s, e in itertools.pairwise(bounds) for b in avro.read_split(path, km, s, e - s)]
        assert pa.Table.from_batches(parts, schema=whole.schema).equals(whole)
