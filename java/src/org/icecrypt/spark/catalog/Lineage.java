/*
 * icecrypt: the metadata columns of a scan (Scans.IcebergScan) as Spark's Parquet reader
 * gives them, and the row lineage columns computed from them.
 *
 * The scan's rows are its data columns, then the metadata columns asked for, in this
 * order: _pos, _file, _spec_id, _partition, _row_id, _last_updated_sequence_number.
 * Spark's reader is asked for the data columns; with lineage, also the two lineage columns
 * as the data file stores them (by their reserved field ids: null where the file does not
 * store them, or stores null); with _pos or _row_id, also the row index (Scans.ROW_INDEX);
 * and it appends the file's constants as its partition values: _file, _spec_id,
 * _partition (the driver planned them: partitionValues), and with lineage the file's
 * first row id and data sequence number, and for a changelog (db.t.changes) the change
 * columns it reads (the file's change, as the driver planned it).  So without lineage the
 * reader's rows are the scan's rows.  With it they are mapped: as the spec says, a row's _row_id is the stored value, else the file's first row
 * id plus the row's position (null before the table had lineage), and its
 * _last_updated_sequence_number the stored value, else the file's data sequence number.
 * Batches are mapped column by column (a computed column is a view, LineageVector);
 * rows into one reused row.
 *
 * _deleted (Iceberg's: asked for, a scan gives every row, deleted ones too): the driver
 * then plans no deletes for the reader (every file is read whole by the plain reader) and
 * gives each file with deletes its deleted positions instead (planned[9]: big-endian
 * int64s, base64), a constant of the file; a row's _deleted is whether its row index is
 * one of them (DeletedVector).
 *
 * A table with a name mapping (files added as they were, without field ids: add_files,
 * Iceberg's migrate) is read by column name (the plan's by_name: the driver checked that
 * no column was ever renamed, so a name is one field id in every file).  Such a file may
 * lack its identity partition columns (a Hive-style directory held them): each top-level
 * column an identity partition field takes its value from is planned per file as a
 * constant, with whether the file's spec partitions by it; where it does, the scan's
 * column is the constant (Iceberg's readers take identity partition values from the
 * metadata, never from the file), else the file's own values.
 */
package org.icecrypt.spark.catalog;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.MetadataBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

import scala.collection.Iterator;

final class Lineage implements Serializable {
    private static final long serialVersionUID = 1L;
    private final StructType data;  // the data columns, with field ids
    private final boolean pos;
    private final boolean file;
    private final boolean rowId;
    private final boolean sequence;
    private final boolean deleted;
    private final boolean specId;
    private final StructType partition;  // the type of _partition, null when it is not read
    private final StructType changes;  // a changelog's change columns the scan reads, in order
    private final boolean byName;  // read by column name: no field ids in what Spark's reader is asked
    private final int[] constantOf;  // per data column: its index among the plan's by_name constants, or -1
    private final StructType constants;  // the constant columns' types, in the plan's by_name order

    Lineage(Scans.IcebergScan scan) {
        this.data = scan.annotated;
        this.pos = scan.readsPos();
        this.file = scan.readsFile();
        this.specId = scan.readsMetadata(Scans.SPEC_ID_COLUMN);
        this.partition = scan.readsMetadata(Scans.PARTITION_COLUMN) ? scan.table.partitionType() : null;
        this.rowId = scan.readsMetadata(Scans.ROW_ID_COLUMN);
        this.sequence = scan.readsMetadata(Scans.SEQUENCE_COLUMN);
        this.deleted = scan.readsMetadata(Scans.DELETED_COLUMN);
        StructType read = new StructType();
        for (String column : IcebergTable.CHANGE_COLUMNS) {
            if (scan.table.changelog() && scan.readsMetadata(column)) {
                read = read.add(scan.readSchema.apply(column));
            }
        }
        this.changes = read;
        JsonNode names = scan.plan.path("by_name");
        this.byName = names.isArray();
        this.constantOf = new int[data.length()];
        StructType types = new StructType();
        for (int i = 0; i < data.length(); i++) {
            constantOf[i] = -1;
            for (int k = 0; byName && k < names.size(); k++) {
                if (names.get(k).asText().equals(data.fields()[i].name())) {
                    constantOf[i] = types.length();
                    types = types.add("_icecrypt_constant_" + k, data.fields()[i].dataType(), true);
                }
            }
        }
        this.constants = types;
    }

    /** Whether the reader's rows must be mapped (a lineage column, or a file's constant column). */
    boolean needed() {
        return lineage() || constants.length() > 0 || deleted;
    }

    private boolean lineage() {
        return rowId || sequence;
    }

    /** Whether Spark's reader is asked by column name, not field id (a table with a name mapping). */
    boolean byName() {
        return byName;
    }

    /** {@code schema} without Parquet field ids (nested fields too): read by name. */
    static StructType withoutIds(StructType schema) {
        StructField[] fields = schema.fields();
        StructField[] out = new StructField[fields.length];
        for (int i = 0; i < fields.length; i++) {
            StructField field = fields[i];
            Metadata metadata = new MetadataBuilder().withMetadata(field.metadata()).remove(Scans.FIELD_ID).build();
            out[i] = new StructField(field.name(), withoutIds(field.dataType()), field.nullable(), metadata);
        }
        return new StructType(out);
    }

    private static DataType withoutIds(DataType type) {
        if (type instanceof StructType) {
            return withoutIds((StructType) type);
        }
        if (type instanceof org.apache.spark.sql.types.ArrayType) {
            org.apache.spark.sql.types.ArrayType array = (org.apache.spark.sql.types.ArrayType) type;
            return new org.apache.spark.sql.types.ArrayType(withoutIds(array.elementType()), array.containsNull());
        }
        if (type instanceof org.apache.spark.sql.types.MapType) {
            org.apache.spark.sql.types.MapType map = (org.apache.spark.sql.types.MapType) type;
            return new org.apache.spark.sql.types.MapType(withoutIds(map.keyType()), withoutIds(map.valueType()),
                map.valueContainsNull());
        }
        return type;
    }

    private boolean index() {
        return pos || rowId || deleted;
    }

    /** What Spark's reader reads of each file. */
    StructType requiredSchema() {
        StructType out = data;
        if (lineage()) {
            out = out.add(stored(Scans.ROW_ID_COLUMN, Scans.ROW_ID_FIELD_ID))
                .add(stored(Scans.SEQUENCE_COLUMN, Scans.SEQUENCE_FIELD_ID));
        }
        if (byName) {
            out = withoutIds(out);
        }
        // nullable: a column Spark's reader requires must be in the file
        return index() ? out.add(Scans.ROW_INDEX, DataTypes.LongType, true) : out;
    }

    /** A lineage column as a data file stores it: a nullable long under its reserved field id. */
    static StructField stored(String name, int id) {
        Metadata ids = new MetadataBuilder().putLong(Scans.FIELD_ID, id).build();
        return new StructField(name, DataTypes.LongType, true, ids);
    }

    /**
     * The partition values of a planned file ({@code planned}: [Spark path, size, rows, has
     * deletes, first row id, data sequence number, spec id, and when the scan reads it the
     * _partition value]; {@code location}: as the table records it), as partitionSchema
     * lays them out.
     */
    InternalRow partitionValues(JsonNode planned, JsonNode location, JsonNode change) {
        List<Object> values = new ArrayList<>();
        if (file) {
            values.add(UTF8String.fromString(location.asText()));
        }
        if (specId) {
            values.add(planned.get(6).asInt());
        }
        if (partition != null) {
            JsonNode value = planned.get(7);
            if (value == null || !value.isArray() || value.size() != partition.size()) {
                throw new IllegalStateException("icecrypt catalog: the driver planned no _partition value for "
                    + planned.get(0).asText());
            }
            values.add(partitionRow(value, partition));
        }
        if (lineage()) {
            JsonNode first = planned.get(4);
            values.add(first == null || first.isNull() ? null : first.asLong());
            values.add(planned.get(5).asLong());
        }
        if (changes.size() > 0) {
            if (change == null || !change.isArray() || change.size() != IcebergTable.CHANGE_COLUMNS.length) {
                throw new IllegalStateException("icecrypt catalog: the driver planned no change for "
                    + planned.get(0).asText());
            }
            for (StructField field : changes.fields()) {
                JsonNode value = change.get(java.util.Arrays.asList(IcebergTable.CHANGE_COLUMNS).indexOf(field.name()));
                values.add(field.dataType() == DataTypes.StringType ? (Object) UTF8String.fromString(value.asText())
                    : field.dataType() == DataTypes.IntegerType ? (Object) value.asInt() : (Object) value.asLong());
            }
        }
        if (constants.length() > 0) {
            JsonNode planConstants = planned.get(8);
            for (int i = 0; i < data.length(); i++) {
                int k = constantOf[i];
                if (k < 0) {
                    continue;
                }
                JsonNode constant = planConstants == null ? null : planConstants.get(k);
                if (constant == null || !constant.isArray() || constant.size() != 2) {
                    throw new IllegalStateException("icecrypt catalog: the driver planned no constant of column "
                        + data.fields()[i].name() + " for " + planned.get(0).asText());
                }
                values.add(CatalogContext.sparkValue(constant.get(1), constants.fields()[k].dataType(),
                    "the partition value of column " + data.fields()[i].name()));
                values.add(constant.get(0).asBoolean());
            }
        }
        if (deleted) {
            JsonNode positions = planned.get(9);
            values.add(positions == null || positions.isNull() ? null
                : java.util.Base64.getDecoder().decode(positions.asText()));
        }
        return values.isEmpty() ? InternalRow.empty() : new GenericInternalRow(values.toArray());
    }

    /** A file's _partition value of the driver's plan (scan.py's _partition_encoder). */
    static InternalRow partitionRow(JsonNode values, StructType type) {
        Object[] out = new Object[type.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = CatalogContext.sparkValue(values.get(i), type.fields()[i].dataType(), "a _partition field");
        }
        return new GenericInternalRow(out);
    }

    /** The partition values each file gets (partitionValues). */
    StructType partitionSchema() {
        StructType out = new StructType();
        if (file) {
            out = out.add(Scans.FILE_COLUMN, DataTypes.StringType, false);
        }
        if (specId) {
            out = out.add(Scans.SPEC_ID_COLUMN, DataTypes.IntegerType, false);
        }
        if (partition != null) {
            out = out.add(Scans.PARTITION_COLUMN, partition, true);
        }
        if (lineage()) {
            out = out.add("_icecrypt_first_row_id", DataTypes.LongType, true)
                .add("_icecrypt_data_sequence_number", DataTypes.LongType, true);
        }
        out = out.merge(changes, false);
        for (int k = 0; k < constants.length(); k++) {
            out = out.add(constants.fields()[k]).add("_icecrypt_constant_used_" + k, DataTypes.BooleanType, false);
        }
        if (deleted) {
            out = out.add("_icecrypt_deleted_positions", DataTypes.BinaryType, true);
        }
        return out;
    }

    /** The sorted deleted positions of a file (big-endian int64s; none: an empty array). */
    static long[] positions(byte[] encoded) {
        if (encoded == null) {
            return new long[0];
        }
        java.nio.LongBuffer buffer = java.nio.ByteBuffer.wrap(encoded).asLongBuffer();
        long[] out = new long[buffer.remaining()];
        buffer.get(out);
        for (int i = 1; i < out.length; i++) {
            if (out[i] <= out[i - 1]) {
                throw new IllegalStateException("icecrypt catalog: deleted positions not in order");
            }
        }
        return out;
    }

    /** The scan's rows (or batches) of the reader's. */
    @SuppressWarnings("unchecked")
    Iterator<InternalRow> apply(Iterator<InternalRow> raw, boolean columnar) {
        int n = data.length();
        int storedRowId = n;
        int storedSequence = n + 1;
        int stored = lineage() ? 2 : 0;
        int rowIndex = index() ? n + stored : -1;
        int next = n + stored + (index() ? 1 : 0);  // the file's constants (partitionSchema)
        int location = file ? next++ : -1;
        int spec = specId ? next++ : -1;
        int partitionAt = partition != null ? next++ : -1;
        int first = next;
        int dataSequence = first + 1;
        next += lineage() ? 2 : 0;
        int changesAt = next;
        int constantsAt = changesAt + changes.length();  // per constant: its value, then whether it is used
        int deletedAt = constantsAt + 2 * constants.length();
        int width = n + (pos ? 1 : 0) + (file ? 1 : 0) + (specId ? 1 : 0) + (partition != null ? 1 : 0)
            + (rowId ? 1 : 0) + (sequence ? 1 : 0) + (deleted ? 1 : 0) + changes.length();
        long[][] deletedPositions = new long[1][];  // the file's, decoded at its first row
        int partitionWidth = partition != null ? partition.size() : 0;
        int[] constantAt = new int[n];
        for (int i = 0; i < n; i++) {
            constantAt[i] = constantOf[i] < 0 ? -1 : constantsAt + 2 * constantOf[i];
        }
        if (columnar) {
            Iterator<Object> batches = (Iterator<Object>) (Iterator<?>) raw;
            return (Iterator<InternalRow>) (Iterator<?>) batches.map(item -> {
                ColumnarBatch in = (ColumnarBatch) item;
                ColumnVector[] out = new ColumnVector[width];
                int k = 0;
                for (int i = 0; i < n; i++) {
                    int c = constantAt[i];
                    boolean constant = c >= 0 && in.numRows() > 0 && in.column(c + 1).getBoolean(0);
                    out[k++] = in.column(constant ? c : i);
                }
                if (pos) {
                    out[k++] = in.column(rowIndex);
                }
                if (file) {
                    out[k++] = in.column(location);
                }
                if (specId) {
                    out[k++] = in.column(spec);
                }
                if (partition != null) {
                    out[k++] = in.column(partitionAt);
                }
                if (rowId) {
                    out[k++] = new LineageVector(in.column(storedRowId), in.column(first), in.column(rowIndex));
                }
                if (sequence) {
                    out[k++] = new LineageVector(in.column(storedSequence), in.column(dataSequence), null);
                }
                if (deleted) {
                    if (deletedPositions[0] == null && in.numRows() > 0) {
                        deletedPositions[0] = positions(in.column(deletedAt).isNullAt(0) ? null
                            : in.column(deletedAt).getBinary(0));
                    }
                    out[k++] = new DeletedVector(in.column(rowIndex),
                        deletedPositions[0] == null ? new long[0] : deletedPositions[0]);
                }
                for (int i = 0; i < changes.length(); i++) {
                    out[k++] = in.column(changesAt + i);
                }
                return new ColumnarBatch(out, in.numRows());
            });
        }
        DataType[] types = new DataType[n];
        for (int i = 0; i < n; i++) {
            types[i] = data.fields()[i].dataType();
        }
        DataType[] changeTypes = new DataType[changes.length()];
        for (int i = 0; i < changeTypes.length; i++) {
            changeTypes[i] = changes.fields()[i].dataType();
        }
        GenericInternalRow row = new GenericInternalRow(width);
        return raw.map(in -> {
            int k = 0;
            for (int i = 0; i < n; i++) {
                int c = constantAt[i];
                int from = c >= 0 && in.getBoolean(c + 1) ? c : i;
                row.update(k++, in.isNullAt(from) ? null : in.get(from, types[i]));
            }
            if (pos) {
                row.update(k++, in.getLong(rowIndex));
            }
            if (file) {
                row.update(k++, in.getUTF8String(location));
            }
            if (specId) {
                row.update(k++, in.getInt(spec));
            }
            if (partition != null) {
                row.update(k++, in.isNullAt(partitionAt) ? null : in.getStruct(partitionAt, partitionWidth));
            }
            if (rowId) {
                row.update(k++, !in.isNullAt(storedRowId) ? (Object) in.getLong(storedRowId)
                    : in.isNullAt(first) ? null : (Object) (in.getLong(first) + in.getLong(rowIndex)));
            }
            if (sequence) {
                row.update(k++, !in.isNullAt(storedSequence) ? (Object) in.getLong(storedSequence)
                    : in.isNullAt(dataSequence) ? null : (Object) in.getLong(dataSequence));
            }
            if (deleted) {
                if (deletedPositions[0] == null) {
                    deletedPositions[0] = positions(in.isNullAt(deletedAt) ? null : in.getBinary(deletedAt));
                }
                row.update(k++, java.util.Arrays.binarySearch(deletedPositions[0], in.getLong(rowIndex)) >= 0);
            }
            for (int i = 0; i < changeTypes.length; i++) {
                row.update(k++, in.isNullAt(changesAt + i) ? null : in.get(changesAt + i, changeTypes[i]));
            }
            return row;
        });
    }

    /**
     * A computed column of a batch, of one scalar type: a view over the reader's vectors, owning
     * no memory.  Every getter but the type's own refuses, naming the column and its type.
     */
    abstract static class ScalarView extends ColumnVector {
        private final String refusal;

        ScalarView(DataType type, String column) {
            super(type);
            this.refusal = "icecrypt: " + column + " is a " + type.simpleString();
        }

        private UnsupportedOperationException refused() {
            return new UnsupportedOperationException(refusal);
        }

        @Override
        public void close() {
            // a view: the reader closes its vectors
        }

        @Override
        public boolean getBoolean(int rowId) {
            throw refused();
        }

        @Override
        public byte getByte(int rowId) {
            throw refused();
        }

        @Override
        public short getShort(int rowId) {
            throw refused();
        }

        @Override
        public int getInt(int rowId) {
            throw refused();
        }

        @Override
        public long getLong(int rowId) {
            throw refused();
        }

        @Override
        public float getFloat(int rowId) {
            throw refused();
        }

        @Override
        public double getDouble(int rowId) {
            throw refused();
        }

        @Override
        public ColumnarArray getArray(int rowId) {
            throw refused();
        }

        @Override
        public ColumnarMap getMap(int rowId) {
            throw refused();
        }

        @Override
        public Decimal getDecimal(int rowId, int precision, int scale) {
            throw refused();
        }

        @Override
        public UTF8String getUTF8String(int rowId) {
            throw refused();
        }

        @Override
        public byte[] getBinary(int rowId) {
            throw refused();
        }

        @Override
        public ColumnVector getChild(int ordinal) {
            throw refused();
        }
    }

    /**
     * A lineage column of a batch: the stored value, else {@code base} (a file's constant)
     * plus the row's position ({@code offset}; none for the sequence number).
     */
    static final class LineageVector extends ScalarView {
        private final ColumnVector stored;
        private final ColumnVector base;
        private final ColumnVector offset;

        LineageVector(ColumnVector stored, ColumnVector base, ColumnVector offset) {
            super(DataTypes.LongType, "a row lineage column");
            this.stored = stored;
            this.base = base;
            this.offset = offset;
        }

        @Override
        public boolean hasNull() {
            return stored.hasNull() && base.hasNull();  // may say true of a column without nulls
        }

        @Override
        public int numNulls() {
            throw new UnsupportedOperationException("icecrypt: the null count of a row lineage column");
        }

        @Override
        public boolean isNullAt(int rowId) {
            return stored.isNullAt(rowId) && base.isNullAt(rowId);
        }

        @Override
        public long getLong(int rowId) {
            if (!stored.isNullAt(rowId)) {
                return stored.getLong(rowId);
            }
            return offset == null ? base.getLong(rowId) : base.getLong(rowId) + offset.getLong(rowId);
        }
    }

    /** _deleted of a batch: whether each row's index is a deleted position. */
    static final class DeletedVector extends ScalarView {
        private final ColumnVector index;
        private final long[] positions;

        DeletedVector(ColumnVector index, long[] positions) {
            super(DataTypes.BooleanType, "_deleted");
            this.index = index;
            this.positions = positions;
        }

        @Override
        public boolean hasNull() {
            return false;
        }

        @Override
        public int numNulls() {
            return 0;
        }

        @Override
        public boolean isNullAt(int rowId) {
            return false;
        }

        @Override
        public boolean getBoolean(int rowId) {
            return positions.length > 0 && java.util.Arrays.binarySearch(positions, index.getLong(rowId)) >= 0;
        }
    }
}
