"""Decrypted bytes held by a reader's own buffers are zeroed when the reader closes
(issue 16, item 11): the per-thread plaintext block of :class:`icecrypt.ags1.Ags1Reader`
(in every thread that read, not only the closing one) and the two decrypted-block slots
of an encrypted Avro file's reader."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from icecrypt import ags1, avro
from icecrypt.avro._container import Plaintext
from icecrypt.keys import StandardKeyMetadata

KEY = bytes(range(16))
AAD = bytes(range(50, 66))
SECRET = b"SECRET-PLAINTEXT"
PLAIN = SECRET * (ags1.PLAIN_BLOCK_SIZE * 5 // 2 // len(SECRET))  # 2.5 blocks


def _blocks(reader: ags1.Ags1Reader) -> list[bytearray]:
    """Every thread's cached plaintext block of ``reader`` (strong references)."""
    blocks = [ref() for ref in reader._plain_blocks]
    return [b for b in blocks if b is not None]


def test_every_threads_scratch_block_is_wiped_on_close():
    sealed = ags1.encrypt(PLAIN, KEY, AAD)
    with ThreadPoolExecutor(1) as pool:  # its thread (and its scratch) outlives the read
        reader = ags1.open_reader(sealed, KEY, AAD)
        assert reader.read_at(10, 100) == PLAIN[10:110]  # a partial read: through block 0's cache
        far = ags1.PLAIN_BLOCK_SIZE + 7
        assert pool.submit(reader.read_at, far, 50).result() == PLAIN[far : far + 50]
        blocks = _blocks(reader)
        assert len(blocks) == 2 and all(SECRET in bytes(b) for b in blocks)  # the plaintext was there
        reader.close()
        assert all(not any(b) for b in blocks)


def test_a_stream_read_leaves_nothing_in_the_scratch():
    sealed = ags1.encrypt(PLAIN, KEY, AAD)
    with ags1.open_reader(sealed, KEY, AAD) as reader:
        while reader.read(12345):  # odd sizes: most reads end inside a block
            pass
        blocks = _blocks(reader)
        assert blocks and all(SECRET in bytes(b) for b in blocks)
    assert all(not any(b) for b in blocks)


def _avro_file(tmp_path) -> tuple[str, StandardKeyMetadata]:
    path = str(tmp_path / "secret.avro")
    schema = {"type": "record", "name": "r", "fields": [{"name": "s", "type": "string"}]}
    # more than one AGS1 block of plaintext, so the general block reader (not the small-file path) reads it
    rows = [{"s": SECRET.decode() + str(i) * 40} for i in range(40_000)]
    km = avro.write_records(path, schema, rows, codec="null")
    assert ags1.plaintext_length(km.file_length) > ags1.PLAIN_BLOCK_SIZE
    return path, km


def test_avro_block_slots_are_wiped_on_close(tmp_path):
    path, km = _avro_file(tmp_path)
    plain = Plaintext(path, km)
    assert SECRET in plain.read(0, plain.size)
    slots = [slot[1] for slot in plain._slots]
    assert len(slots) == 2 and all(SECRET in bytes(s) for s in slots)
    plain.close()
    assert all(not any(s) for s in slots)


def test_avro_records_wipe_when_closed(tmp_path):
    path, km = _avro_file(tmp_path)
    with avro.read_records(path, km) as records:
        assert sum(1 for _ in records) == 40_000
        plain = records._file.plain
        slots = [slot[1] for slot in plain._slots]
        scratch = _blocks(plain._reader)
        assert slots and all(SECRET in bytes(s) for s in slots)
    assert all(not any(b) for b in slots + scratch)
