"""The Arrow schema data files are written and read with (``arrow_write_schema``) is made by
icecrypt itself and must stay exactly PyIceberg's ``schema_to_pyarrow`` with 32-bit offsets:
types, names, nullability, field ids and docs, at every depth.  Made here because importing
PyIceberg's imports pandas, most of what a Spark worker asking for a schema spent."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    GeometryType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)
from vectorlib import TABLES_DIR

from icecrypt.table.model.schema import _small_field, arrow_write_schema

PRIMITIVES = st.sampled_from([
    BooleanType(), IntegerType(), LongType(), FloatType(), DoubleType(), DateType(), TimeType(),
    TimestampType(), TimestamptzType(), TimestampNanoType(), TimestamptzNanoType(), StringType(),
    BinaryType(), UUIDType(), UnknownType(),
]) | st.builds(lambda p, s: DecimalType(p, min(s, p)), st.integers(1, 38), st.integers(0, 38)) \
    | st.builds(FixedType, st.integers(1, 64))


def _pyiceberg(schema: Schema) -> pa.Schema:
    return pa.schema([_small_field(f) for f in schema_to_pyarrow(schema, include_field_ids=True)])


def _same(schema: Schema) -> None:
    """Equal schemas, metadata included; or, where Arrow refuses PyIceberg's (an ``unknown``
    column that is required, or a map key), the same refusal."""
    try:
        expected = _pyiceberg(schema)
    except ValueError as exc:
        with pytest.raises(ValueError, match=re.escape(str(exc))):
            arrow_write_schema(schema)
        return
    assert arrow_write_schema(schema).equals(expected, check_metadata=True)


@st.composite
def _schemas(draw, extra=None) -> Schema:
    ids = itertools.count(1).__next__  # field ids, unique within the schema
    docs = st.none() | st.text(min_size=1, max_size=5)

    def field_type(depth: int):
        kind = draw(st.sampled_from(["primitive"] * 3 + (["struct", "list", "map"] if depth < 3 else [])))
        if kind == "primitive":
            return draw(PRIMITIVES)
        if kind == "struct":
            return StructType(*fields(depth + 1, draw(st.integers(1, 3))))
        if kind == "list":
            return ListType(ids(), field_type(depth + 1), element_required=draw(st.booleans()))
        return MapType(ids(), draw(PRIMITIVES), ids(), field_type(depth + 1), value_required=draw(st.booleans()))

    def fields(depth: int, count: int) -> list[NestedField]:
        return [NestedField(ids(), f"c{depth}_{i}", field_type(depth), required=draw(st.booleans()), doc=draw(docs))
                for i in range(count)]

    top = fields(0, draw(st.integers(1, 6)))
    if extra is not None:
        top.append(NestedField(ids(), "extra", extra, required=False))
    return Schema(*top)


@given(_schemas())
def test_every_schema_converts_as_pyiceberg_converts_it(schema):
    _same(schema)


@given(_schemas(extra=GeometryType()))
def test_a_type_not_made_here_is_left_to_pyiceberg(schema):
    _same(schema)


def test_the_java_tables_schemas():
    for metadata in sorted(TABLES_DIR.glob("*/metadata/*.metadata.json")):
        for raw in json.loads(metadata.read_text(encoding="utf-8")).get("schemas", []):
            schema = Schema.model_validate(raw)
            assert arrow_write_schema(schema).equals(_pyiceberg(schema), check_metadata=True), metadata


def test_a_schema_is_made_without_importing_pandas():
    probe = ("import sys\n"
             "from pyiceberg.schema import Schema\n"
             "from pyiceberg.types import NestedField, StringType, LongType\n"
             "from icecrypt.table.model.schema import arrow_write_schema\n"
             "arrow_write_schema(Schema(NestedField(1, 'id', LongType(), required=True), NestedField(2, 's', StringType())))\n"
             "print(sorted(m for m in ('pandas', 'pyarrow.dataset', 'pyiceberg.io.pyarrow') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
