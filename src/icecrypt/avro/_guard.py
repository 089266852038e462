"""What an Avro container file may make the decoder do: its schema and a budget per block.

Private to :mod:`icecrypt.avro`.  Everything in an Avro file of a table is input from
storage, and fastavro decodes in C without limits: a recursive schema recurses until the
process's stack overflows (a crash, nothing to catch), a deflate block of zeros inflates
a thousandfold, and an ``array<null>`` declares 2×10⁸ items in one varint.  So before
fastavro sees a file:

* its writer schema is checked (:func:`plan`): named types resolve, none refers to
  itself (no recursion), nesting is at most :data:`MAX_DEPTH` deep and a record expands
  to at most :data:`MAX_VALUES_PER_RECORD` values; a table's manifests and manifest
  lists (``kind="metadata"``) may only use what Iceberg writes there (records, unions of
  null and one type, primitives, fixed, arrays and maps).
* every block is checked (:class:`BlockGuard`): it inflates to at most
  :data:`BLOCK_BYTES` (:data:`METADATA_BLOCK_BYTES` for metadata), decompressed here
  with that cap (fastavro then reads "null"-codec blocks), its object count fits its
  bytes (each record takes at least the schema's minimum width), and it decodes to at
  most :data:`BLOCK_VALUES` values (records, fields, items).  The value count is bounded
  from the schema when it can be (most blocks: a block of 64 kB of Iceberg's schemas
  cannot hold more); otherwise the block is walked once, without building anything,
  counting values and stopping at the budget (items of zero width, such as nulls, are
  counted too, so a count no bytes back is refused).
* a metadata file inflates to at most :data:`METADATA_INFLATION` times its stored size
  (plus :data:`METADATA_INFLATION_FLOOR`): the table code keeps all its records in
  memory, so a file of many small blocks that each stay under the caps is refused too.
* a data file's blocks inflate to at most :func:`icecrypt._limits.max_avro_file_bytes`
  in all (16 GiB unless ``$ICECRYPT_MAX_AVRO_FILE_BYTES`` says otherwise): blocks of
  deflated zeros that each pass would otherwise inflate a file about a thousandfold.

Failures are :class:`~icecrypt.FormatError` naming the file.
"""

from __future__ import annotations

import bz2
import dataclasses
import lzma
import math
import zlib
from collections.abc import Iterator
from typing import Any

from icecrypt._limits import MAX_AVRO_FILE_BYTES_ENV, max_avro_file_bytes
from icecrypt.avro._arrow import _fullname, resolve
from icecrypt.avro._container import SYNC_SIZE, _zigzag
from icecrypt.errors import FormatError

#: deepest nesting of types (records, arrays, maps, unions) in a schema
MAX_DEPTH = 64
#: most values one record may expand to outside arrays and maps (named types used more
#: than once count each time)
MAX_VALUES_PER_RECORD = 1 << 20
#: most bytes a block may inflate to (Avro Java closes a block at 64 kB, plus one record)
BLOCK_BYTES = 64 << 20
#: the same for manifests and manifest lists
METADATA_BLOCK_BYTES = 16 << 20
#: most values (records, fields, array and map items) one block may decode to
BLOCK_VALUES = 1 << 20
#: a manifest or manifest list inflates to at most METADATA_INFLATION times its stored
#: size plus METADATA_INFLATION_FLOOR bytes (the table code keeps all their records, a
#: few hundred bytes of Python objects per 16 bytes of Avro); Iceberg's deflated
#: manifests inflate 2-10 times
METADATA_INFLATION = 32
METADATA_INFLATION_FLOOR = 1 << 20

_PRIMITIVE_WIDTH = {"null": 0, "boolean": 1, "int": 1, "long": 1, "float": 4, "double": 8, "bytes": 1, "string": 1}
_NAMED = ("record", "error", "enum", "fixed")
#: the types Iceberg writes in manifests and manifest lists (``null`` only in unions)
_METADATA_TYPES = frozenset(("record", "array", "map", "fixed", "boolean", "int", "long", "float", "double", "bytes", "string"))

# node tags of the compiled schema the walker uses
_NULL, _BOOL, _VARINT, _FLOAT, _DOUBLE, _BYTES, _FIXED, _ENUM, _UNION, _RECORD, _ARRAY, _MAP = range(12)
_TAGS = {"null": _NULL, "boolean": _BOOL, "int": _VARINT, "long": _VARINT, "float": _FLOAT, "double": _DOUBLE,
         "bytes": _BYTES, "string": _BYTES}


class _Refused(Exception):
    """A schema or block outside what is accepted (becomes a FormatError with the name)."""


@dataclasses.dataclass
class _Node:
    """One type of the compiled schema: ``tag``, ``arg`` (fixed size, enum symbols,
    branches, fields, items), ``width`` (fewest bytes a value takes) and ``values``
    (values a value decodes to, outside the items of arrays and maps)."""

    tag: int
    arg: Any = None
    width: int = 0
    values: int = 1


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checked writer schema: the compiled root record, its width and values per
    record, and ``per_byte``: the most values one byte of array or map items can
    decode to (``inf`` when an item may take no bytes)."""

    root: _Node
    width: int
    values: int
    per_byte: float
    metadata: bool


def _compile(schema: Any, metadata: bool) -> Plan:
    defined: dict[str, _Node] = {}
    active: set[str] = set()
    repeated: list[_Node] = []

    def walk(t: Any, ns: str | None, depth: int, in_union: bool = False) -> _Node:
        if depth > MAX_DEPTH:
            raise _Refused(f"types nested more than {MAX_DEPTH} deep")
        if isinstance(t, dict) and isinstance(t.get("type"), str) and t["type"] in _PRIMITIVE_WIDTH:
            t = t["type"]  # {"type": "long", "logicalType": ...}
        if isinstance(t, str):
            if t in _PRIMITIVE_WIDTH:
                if metadata and t == "null" and not in_union:
                    raise _Refused("type null outside a union, which Iceberg does not write in manifests")
                return _Node(_TAGS[t], None, _PRIMITIVE_WIDTH[t])
            return resolve(t, ns, active, defined, _Refused)
        if isinstance(t, list):
            if metadata and (len(t) != 2 or "null" not in t):
                raise _Refused("a union other than of null and one type, which Iceberg does not write in manifests")
            if not t:
                raise _Refused("an empty union")
            branches = [walk(b, ns, depth + 1, True) for b in t]
            return _Node(_UNION, branches, 1 + min(b.width for b in branches), max(b.values for b in branches))
        if not isinstance(t, dict) or "type" not in t:
            raise _Refused(f"invalid schema {str(t)[:80]!r}")
        kind = t["type"]
        if not isinstance(kind, str):
            return walk(kind, ns, depth + 1, in_union)
        if kind not in _NAMED and kind not in ("array", "map"):
            return walk(kind, ns, depth + 1, in_union)  # {"type": "<a named type>"}
        if metadata and kind not in _METADATA_TYPES:
            raise _Refused(f"type {kind}, which Iceberg does not write in manifests")
        if kind in ("array", "map"):
            inner = walk(t.get("items") if kind == "array" else t.get("values"), ns, depth + 1)
            if kind == "map":  # an entry: a string key and the value
                inner = _Node(_RECORD, [_Node(_BYTES, None, 1), inner], 1 + inner.width, 2 + inner.values)
            repeated.append(inner)
            return _Node(_ARRAY if kind == "array" else _MAP, inner, 1, 1)
        name = t.get("name")
        if not isinstance(name, str):
            raise _Refused(f"a {kind} without a name")
        full = _fullname(name, t.get("namespace", ns))
        if full in defined or full in active:
            raise _Refused(f"type {full!r} is defined twice")
        if kind == "fixed":
            size = t.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise _Refused(f"fixed {full!r} has no valid size")
            node = _Node(_FIXED, size, size)
        elif kind == "enum":
            symbols = t.get("symbols")
            if not isinstance(symbols, list) or not symbols:
                raise _Refused(f"enum {full!r} has no symbols")
            node = _Node(_ENUM, len(symbols), 1)
        else:
            fields = t.get("fields")
            if not isinstance(fields, list):
                raise _Refused(f"record {full!r} has no field list")
            active.add(full)
            inner_ns = full.rpartition(".")[0] or None
            nodes = []
            for f in fields:
                if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
                    raise _Refused(f"invalid field in record {full!r}")
                nodes.append(walk(f["type"], inner_ns, depth + 1))
            active.discard(full)
            values = 1 + sum(n.values for n in nodes)
            if values > MAX_VALUES_PER_RECORD:
                raise _Refused(f"record {full!r} expands to more than {MAX_VALUES_PER_RECORD} values")
            node = _Node(_RECORD, nodes, sum(n.width for n in nodes), values)
        defined[full] = node
        return node

    root = walk(schema, None, 0)
    if root.tag != _RECORD:
        raise _Refused("the schema is not a record")
    per_byte = max((n.values / n.width if n.width else math.inf for n in repeated), default=0.0)
    return Plan(root, root.width, root.values, per_byte, metadata)


_PLANS: dict[tuple[bytes, bool], Plan | str] = {}


def plan(schema: Any, raw: bytes, name: str, *, metadata: bool) -> Plan:
    """The checked plan of a writer schema (JSON-decoded ``schema``, its header bytes
    ``raw``, by which plans are cached); FormatError naming ``name`` when it is
    refused."""
    memo = (bytes(raw), metadata)
    found = _PLANS.get(memo)
    if found is None:
        try:
            found = _compile(schema, metadata)
        except _Refused as exc:
            found = str(exc)
        except RecursionError:
            found = "types nested too deep"
        if len(_PLANS) >= 256:
            _PLANS.clear()
        _PLANS[memo] = found
    if isinstance(found, str):
        what = "a manifest's or manifest list's" if metadata else "an"
        raise FormatError(f"{name}: refused {what} Avro schema: {found}")
    return found


# --------------------------------------------------------------------------- blocks


def _varint(data: Any, pos: int) -> tuple[int, int]:
    shift = result = 0
    for i in range(pos, pos + 10):
        b = data[i]  # IndexError at the end of the block
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), i + 1
        shift += 7
    raise _Refused("a varint longer than 10 bytes")


def count_values(root: _Node, data: Any, count: int, budget: int) -> int:
    """Walk ``count`` records of ``root`` in ``data`` (a block's decompressed bytes)
    without building them; the number of values.  Refuses a block that holds more than
    ``budget`` values, ends early or has bytes left over."""
    left = [budget]

    def spend(n: int) -> None:
        left[0] -= n
        if left[0] < 0:
            raise _Refused(f"the block decodes to more than {budget} values")

    def skip(node: _Node, pos: int) -> int:
        tag = node.tag
        if tag == _UNION:  # decodes to its branch's value
            index, pos = _varint(data, pos)
            if not 0 <= index < len(node.arg):
                raise _Refused(f"union branch {index} of {len(node.arg)}")
            return skip(node.arg[index], pos)
        spend(1)
        if tag == _VARINT:
            return _varint(data, pos)[1]
        if tag == _BYTES:
            n, pos = _varint(data, pos)
            if n < 0:
                raise _Refused("a negative length")
            return pos + n
        if tag == _RECORD:
            for field in node.arg:
                pos = skip(field, pos)
            return pos
        if tag in (_ARRAY, _MAP):
            while True:
                n, pos = _varint(data, pos)
                if n == 0:
                    return pos
                if n < 0:
                    n = -n
                    _, pos = _varint(data, pos)  # the block's byte size
                if n > left[0]:  # each item is at least one value: refused before any is read
                    spend(n)
                for _ in range(n):
                    pos = skip(node.arg, pos)
                    if pos > len(data):
                        raise IndexError
        if tag == _BOOL:
            return pos + 1
        if tag == _FLOAT:
            return pos + 4
        if tag == _DOUBLE:
            return pos + 8
        if tag == _FIXED:
            return pos + node.arg
        if tag == _ENUM:
            index, pos = _varint(data, pos)
            if not 0 <= index < node.arg:
                raise _Refused(f"enum symbol {index} of {node.arg}")
            return pos
        return pos  # null

    pos = 0
    try:
        for _ in range(count):
            pos = skip(root, pos)
            if pos > len(data):
                raise IndexError
    except IndexError:
        raise _Refused("the block ends inside a record") from None
    if pos != len(data):
        raise _Refused(f"{len(data) - pos} bytes after the block's {count} records")
    return budget - left[0]


def _inflate(codec: str, data: bytes, limit: int) -> bytes:
    """A block's data decompressed, at most ``limit`` bytes (refused beyond)."""
    if codec == "zstandard":
        import io

        import zstandard

        out = bytearray()
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
            while len(out) <= limit:
                chunk = reader.read(limit + 1 - len(out))
                if not chunk:
                    break
                out += chunk
        out = bytes(out)
    else:
        if codec == "deflate":
            inflater: Any = zlib.decompressobj(-15)
        elif codec == "bzip2":
            inflater = bz2.BZ2Decompressor()
        elif codec == "xz":
            inflater = lzma.LZMADecompressor()
        else:
            raise _Refused(f"codec {codec}")
        out = inflater.decompress(data, limit + 1)
        if len(out) <= limit and not inflater.eof:
            raise _Refused(f"a truncated {codec} block")
    if len(out) > limit:
        raise _Refused(f"a block inflates to more than {limit} bytes")
    return out


def _declared_size(codec: str, data: bytes) -> int:
    """The decompressed size a snappy or lz4 block declares (their decompressors make
    exactly that many bytes or fail)."""
    if codec == "lz4":
        return int.from_bytes(data[:4], "little") if len(data) >= 4 else 0
    size = shift = 0  # snappy: a little-endian base-128 varint
    for b in data[:5]:
        size |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return size


class BlockGuard:
    """Checks each block of one file before fastavro decodes it, and hands fastavro
    the block decompressed (a "null"-codec block) where the codec allows (snappy and lz4
    blocks pass on compressed after their declared size is checked)."""

    def __init__(self, plan: Plan, codec: str, name: str, stored_size: int):
        self.plan, self.codec, self.name = plan, codec, name
        self.passthrough = codec in ("snappy", "lz4")
        self.block_bytes = METADATA_BLOCK_BYTES if plan.metadata else BLOCK_BYTES
        #: the most bytes a block may be stored in (compression can add a little)
        self.max_stored = self.block_bytes + (self.block_bytes >> 6) + 4096
        self.inflation_left = METADATA_INFLATION_FLOOR + METADATA_INFLATION * stored_size if plan.metadata else None
        #: what the data file's blocks may still inflate to (None for metadata files)
        self.file_bytes = None if plan.metadata else max_avro_file_bytes()
        self.file_bytes_left = self.file_bytes
        self.blocks = 0

    @property
    def header_codec(self) -> str:
        """The codec the header fastavro reads should name."""
        return self.codec if self.passthrough else "null"

    def __call__(self, raw: bytes) -> bytes:
        """The checked block (``raw``: count, size, data, sync as iter_blocks yields it)."""
        self.blocks += 1
        try:
            return self._check(raw)
        except _Refused as exc:
            raise FormatError(f"{self.name}: Avro block {self.blocks} refused: {exc}") from None
        except FormatError:
            raise
        except Exception as exc:  # a damaged compressed block (zlib.error, lzma.LZMAError, zstandard.ZstdError, ...)
            raise FormatError(f"{self.name}: Avro block {self.blocks} cannot be decompressed: {exc}") from None

    def _check(self, raw: bytes) -> bytes:
        count, pos = _varint(raw, 0)
        size, start = _varint(raw, pos)
        data = raw[start : start + size]
        if self.codec == "null":
            plain = data
        elif self.passthrough:
            declared = _declared_size(self.codec, data)
            if declared > self.block_bytes:
                raise _Refused(f"it declares {declared} bytes, more than {self.block_bytes}")
            plain = None
        else:
            plain = _inflate(self.codec, data, self.block_bytes)
        length = declared if plain is None else len(plain)
        if length > self.block_bytes:
            raise _Refused(f"it holds {length} bytes, more than {self.block_bytes}")
        if self.inflation_left is not None:
            self.inflation_left -= length
            if self.inflation_left < 0:
                raise _Refused(f"the file inflates to more than {METADATA_INFLATION} times its size (and {METADATA_INFLATION_FLOOR} bytes)")
        if self.file_bytes_left is not None:
            self.file_bytes_left -= length
            if self.file_bytes_left < 0:
                raise _Refused(f"the data file inflates to more than {self.file_bytes} bytes "
                               f"(${MAX_AVRO_FILE_BYTES_ENV} raises the cap)")
        plan = self.plan
        if plan.width:
            if count > length // plan.width:
                raise _Refused(f"{count} records cannot fit in {length} bytes")
        elif count > BLOCK_VALUES:
            raise _Refused(f"{count} records of no width, more than {BLOCK_VALUES}")
        bound = count * plan.values + (length * plan.per_byte if length else 0)
        if bound > BLOCK_VALUES:
            if plain is None:
                raise _Refused(f"a {self.codec} block that may decode to more than {BLOCK_VALUES} values")
            count_values(plan.root, plain, count, BLOCK_VALUES)
        if plain is None or plain is data:
            return raw
        return _zigzag(count) + _zigzag(len(plain)) + plain + raw[-SYNC_SIZE:]

    def blocks_of(self, raws: Iterator[bytes]) -> Iterator[bytes]:
        for raw in raws:
            yield self(raw)

