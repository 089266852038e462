"""parquet-mr (parquet-java 1.17, shipped in pyspark's jars) driven through py4j in the
shared Spark driver JVM: read and write natively encrypted Parquet files exactly the way
Iceberg Java configures them (SPEC.md section 5).

Reading yields canonical rows (see ``parquet_rows``), converted from parquet-mr's
physical values with the column's logical type annotation, so they compare directly with
``parquet_rows.canonical_rows`` of an Arrow table.

py4j notes: byte arrays are passed as ``bytearray``; a Python int always selects the
``int`` overload of ``Group.add`` (and a boxed ``java.lang.Long`` comes back as a Python
int), so INT64 values are added through reflection (``Method.invoke`` widens an
``Integer`` to ``long``).
"""

from __future__ import annotations

import decimal
import re
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

# Decimal arithmetic without rounding (the default context keeps 28 digits; DECIMAL(38,s) needs 38)
_EXACT = decimal.Context(prec=80)

__all__ = [
    "decryption_properties",
    "encryption_properties",
    "encryption_type",
    "read_longs",
    "read_rows",
    "write_rows",
]


def encryption_properties(
    jvm, key: bytes, aad_prefix: bytes | None, *, store_aad_prefix: bool = False, plaintext_footer: bool = False
):
    """``FileEncryptionProperties`` as Iceberg's Parquet writer builds them
    (``builder(dek).withAADPrefix(aad).withoutAADPrefixStorage().build()``); the
    keyword options depart from Iceberg's layout."""
    builder = jvm.org.apache.parquet.crypto.FileEncryptionProperties.builder(bytearray(key))
    if aad_prefix is not None:
        builder = builder.withAADPrefix(bytearray(aad_prefix))
        if not store_aad_prefix:
            builder = builder.withoutAADPrefixStorage()
    if plaintext_footer:
        builder = builder.withPlaintextFooter()
    return builder.build()


def decryption_properties(jvm, key: bytes, aad_prefix: bytes | None):
    """``FileDecryptionProperties`` as Iceberg's Parquet reader builds them
    (``builder().withFooterKey(dek).withAADPrefix(aad).build()``)."""
    builder = jvm.org.apache.parquet.crypto.FileDecryptionProperties.builder().withFooterKey(bytearray(key))
    if aad_prefix is not None:
        builder = builder.withAADPrefix(bytearray(aad_prefix))
    return builder.build()


def _hadoop_path(jvm, path: str | Path):
    return jvm.org.apache.hadoop.fs.Path(Path(path).resolve().as_uri())


def encryption_type(jvm, path: str | Path, key: bytes, aad_prefix: bytes | None) -> str:
    """parquet-mr's view of the file's encryption (``ENCRYPTED_FOOTER``, ...)."""
    p = jvm.org.apache.parquet
    conf = jvm.org.apache.hadoop.conf.Configuration()
    options = (
        p.HadoopReadOptions.builder(conf).withDecryption(decryption_properties(jvm, key, aad_prefix)).build()
    )
    input_file = p.hadoop.util.HadoopInputFile.fromPath(_hadoop_path(jvm, path), conf)
    reader = p.hadoop.ParquetFileReader.open(input_file, options)
    try:
        return reader.getFooter().getFileMetaData().getEncryptionType().name()
    finally:
        reader.close()


# --- reading -----------------------------------------------------------------------------

_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")
_TIMESTAMP = re.compile(r"TIMESTAMP\((MILLIS|MICROS|NANOS),(true|false)\)")
_INTEGER = re.compile(r"INTEGER\((\d+),(true|false)\)")


def _column_reader(field):
    """A function (group, index) -> canonical value for one primitive column."""
    primitive = field.asPrimitiveType().getPrimitiveTypeName().name()
    annotation = field.getLogicalTypeAnnotation()
    logical = "" if annotation is None else annotation.toString()
    dec = _DECIMAL.fullmatch(logical)
    if dec:
        scale = int(dec.group(2))
        if primitive == "INT32":
            raw = lambda g, i: g.getInteger(i, 0)
        elif primitive == "INT64":
            raw = lambda g, i: g.getLong(i, 0)
        else:
            raw = lambda g, i: int.from_bytes(g.getBinary(i, 0).getBytes(), "big", signed=True)
        return lambda g, i: format(decimal.Decimal(raw(g, i)).scaleb(-scale, _EXACT), "f")
    if primitive == "BOOLEAN":
        return lambda g, i: g.getBoolean(i, 0)
    if primitive == "INT32":
        integer = _INTEGER.fullmatch(logical)
        if integer and integer.group(2) == "false":
            bits = int(integer.group(1))
            return lambda g, i: g.getInteger(i, 0) & ((1 << bits) - 1)
        return lambda g, i: g.getInteger(i, 0)  # plain, INTEGER(n,true), DATE (days)
    if primitive == "INT64":
        ts = _TIMESTAMP.fullmatch(logical)
        if ts:
            unit = ts.group(1)
            if unit == "MILLIS":
                return lambda g, i: g.getLong(i, 0) * 1000
            if unit == "NANOS":
                return lambda g, i: g.getLong(i, 0) // 1000
        return lambda g, i: g.getLong(i, 0)
    if primitive == "FLOAT":
        # py4j sends a float as its shortest decimal string, read back as a double:
        # rounding that to binary32 recovers the exact value
        return lambda g, i: struct.pack(">d", struct.unpack(">f", struct.pack(">f", g.getFloat(i, 0)))[0]).hex()
    if primitive == "DOUBLE":
        return lambda g, i: struct.pack(">d", g.getDouble(i, 0)).hex()
    if primitive in ("BINARY", "FIXED_LEN_BYTE_ARRAY"):
        if logical == "STRING":
            return lambda g, i: g.getString(i, 0)
        return lambda g, i: bytes(g.getBinary(i, 0).getBytes()).hex()
    raise NotImplementedError(f"column {field.getName()}: {primitive} {logical}")


def _group_reader(jvm, path: str | Path, key: bytes, aad_prefix: bytes | None):
    """parquet-mr's record reader of whole ``Group`` records, with Iceberg's decryption."""
    p = jvm.org.apache.parquet
    return (
        p.hadoop.ParquetReader.builder(p.hadoop.example.GroupReadSupport(), _hadoop_path(jvm, path))
        .withConf(jvm.org.apache.hadoop.conf.Configuration())
        .withDecryption(decryption_properties(jvm, key, aad_prefix))
        .build()
    )


def read_rows(jvm, path: str | Path, key: bytes, aad_prefix: bytes | None) -> tuple[list[str], list[list]]:
    """Read every row of a (flat) encrypted Parquet file with parquet-mr's example
    ``GroupReadSupport``; returns the column names and the canonical rows."""
    reader = _group_reader(jvm, path, key, aad_prefix)
    names: list[str] = []
    rows: list[list] = []
    try:
        group = reader.read()
        if group is None:
            return names, rows
        schema = group.getType()
        fields = [schema.getType(i) for i in range(schema.getFieldCount())]
        names = [f.getName() for f in fields]
        readers = [_column_reader(f) for f in fields]
        while group is not None:
            rows.append(
                [
                    readers[i](group, i) if group.getFieldRepetitionCount(i) else None
                    for i in range(len(readers))
                ]
            )
            group = reader.read()
    finally:
        reader.close()
    return names, rows


def read_longs(jvm, path: str | Path, key: bytes, aad_prefix: bytes | None, name: str) -> list[int]:
    """The required INT64 column ``name`` of every record of an encrypted Parquet file (any
    schema, nested too), read with parquet-mr's ``GroupReadSupport`` and no projection:
    every record is assembled whole, so every page of every column is decrypted."""
    reader = _group_reader(jvm, path, key, aad_prefix)
    values = []
    try:
        group = reader.read()
        while group is not None:
            values.append(group.getLong(name, 0))
            group = reader.read()
    finally:
        reader.close()
    return values


# --- writing -----------------------------------------------------------------------------


class _LongAdder:
    """``Group.add(String, long)`` through reflection (see the module docstring)."""

    def __init__(self, jvm):
        lang = jvm.java.lang
        array = lang.reflect.Array
        types = array.newInstance(lang.Class.forName("java.lang.Class"), 2)
        types[0] = lang.Class.forName("java.lang.String")
        types[1] = lang.Long.TYPE
        group_class = lang.Class.forName("org.apache.parquet.example.data.Group")
        self._method = group_class.getMethod("add", types)
        self._args = array.newInstance(lang.Class.forName("java.lang.Object"), 2)

    def __call__(self, group, name: str, value: int) -> None:
        self._args[0] = name
        self._args[1] = value
        self._method.invoke(group, self._args)


def _fixed_decimal(value: decimal.Decimal, scale: int, width: int) -> bytearray:
    unscaled = int(value.scaleb(scale, _EXACT))
    return bytearray(unscaled.to_bytes(width, "big", signed=True))


def write_rows(
    jvm,
    path: str | Path,
    schema: str,
    rows: Iterable[Mapping[str, object]],
    key: bytes,
    aad_prefix: bytes | None,
    *,
    compression: str = "ZSTD",
    row_group_size: int | None = None,
    page_size: int | None = None,
    store_aad_prefix: bool = False,
    plaintext_footer: bool = False,
    writer_version: str = "PARQUET_1_0",
    bloom_filter_columns: Iterable[str] = (),
) -> None:
    """Write ``rows`` with parquet-mr's ``ExampleParquetWriter`` and Iceberg's encryption
    properties.  ``schema`` is a Parquet message type in parquet-mr's text syntax (flat,
    primitive columns); row values are Python values in the columns' logical domain:
    int (also days for DATE, microseconds for TIMESTAMP(MICROS)), float, bool, str,
    bytes, Decimal; None or a missing key leaves an optional column null.
    ``store_aad_prefix=True`` and ``plaintext_footer=True`` depart from Iceberg (prefix
    stored in the file; footer in clear, signed with the footer key);
    ``writer_version="PARQUET_2_0"`` writes version 2 data pages (Iceberg writes 1.0);
    ``bloom_filter_columns`` get a bloom filter (as Iceberg's
    ``write.parquet.bloom-filter-enabled.column.*`` asks).  Page indexes are written
    as parquet-mr does by default."""
    p = jvm.org.apache.parquet
    message = p.schema.MessageTypeParser.parseMessageType(schema)
    output = p.io.LocalOutputFile(jvm.java.io.File(str(path)).toPath())
    builder = (
        p.hadoop.example.ExampleParquetWriter.builder(output)
        .withType(message)
        .withEncryption(
            encryption_properties(
                jvm, key, aad_prefix, store_aad_prefix=store_aad_prefix, plaintext_footer=plaintext_footer
            )
        )
        .withCompressionCodec(p.hadoop.metadata.CompressionCodecName.valueOf(compression))
        .withWriterVersion(p.column.ParquetProperties.WriterVersion.valueOf(writer_version))
    )
    if row_group_size is not None:
        builder = builder.withRowGroupSize(row_group_size)
    if page_size is not None:
        builder = builder.withPageSize(page_size)
    for column in bloom_filter_columns:  # sized for a few hundred values, not parquet-mr's 1 MiB
        builder = builder.withBloomFilterEnabled(column, True).withBloomFilterNDV(column, 200)
    writer = builder.build()
    add_long = _LongAdder(jvm)
    binary = p.io.api.Binary

    adders = []
    for i in range(message.getFieldCount()):
        field = message.getType(i)
        name = field.getName()
        primitive = field.asPrimitiveType().getPrimitiveTypeName().name()
        annotation = field.getLogicalTypeAnnotation()
        logical = "" if annotation is None else annotation.toString()
        dec = _DECIMAL.fullmatch(logical)
        if dec and primitive == "FIXED_LEN_BYTE_ARRAY":
            scale, width = int(dec.group(2)), field.asPrimitiveType().getTypeLength()
            add = lambda g, n, v, s=scale, w=width: g.add(n, binary.fromConstantByteArray(_fixed_decimal(v, s, w)))
        elif dec and primitive == "INT64":
            scale = int(dec.group(2))
            add = lambda g, n, v, s=scale: add_long(g, n, int(v.scaleb(s, _EXACT)))
        elif dec and primitive == "INT32":
            scale = int(dec.group(2))
            add = lambda g, n, v, s=scale: g.add(n, int(v.scaleb(s, _EXACT)))
        elif primitive == "INT64":
            add = add_long
        elif primitive in ("INT32", "BOOLEAN", "DOUBLE") or logical == "STRING":
            add = lambda g, n, v: g.add(n, v)
        elif primitive in ("BINARY", "FIXED_LEN_BYTE_ARRAY"):
            add = lambda g, n, v: g.add(n, binary.fromConstantByteArray(bytearray(v)))
        else:
            raise NotImplementedError(f"column {name}: {primitive} {logical}")
        adders.append((name, add))

    factory = p.example.data.simple.SimpleGroupFactory(message)
    try:
        for row in rows:
            group = factory.newGroup()
            for name, add in adders:
                value = row.get(name)
                if value is not None:
                    add(group, name, value)
            writer.write(group)
    finally:
        writer.close()
