/*
 * icecrypt: an Iceberg table of the SQL catalog as Spark sees it -- what the Python
 * driver described when the statement loaded it (schema, partitioning, properties, the
 * snapshot and branch selected), fixed for the statement.
 *
 * Reads: a scan of that snapshot (Scans).  Writes: appends, overwrites (whole table,
 * by filter, dynamic by partition) of the branch (Writes); DELETE FROM with a condition
 * that has an Iceberg row filter form, carried out by the driver's row-level delete in
 * the table's write.delete.mode (SupportsDeleteV2; _sql/delete.py); UPDATE, MERGE INTO and
 * other DELETEs as row-level operations, copy-on-write (CopyOnWrite) or merge-on-read
 * (MergeOnRead) as the table's write.<command>.mode says.  Structured
 * Streaming: micro-batch reads of its appends (Streams) and writes committed once per
 * query and epoch (Writes.IcebergStreamingWrite).  A table loaded with
 * time travel (VERSION/TIMESTAMP AS OF, tag_..., snapshot_id_...) is read-only.  The
 * description never holds a key: properties are the table's own and Iceberg's shown
 * ones (format, provider, location, current-snapshot-id, format-version, ...).
 * The table's changelog, db.t.changes, is one too: read-only, its scans plan the
 * changelog of a range of snapshots (Scans; the range by read options).
 * Metadata columns, as in Iceberg: _file, the data file a row was read from (its location
 * as the table records it), _pos, the row's position in that file, and with row lineage
 * (format version 3) _row_id and _last_updated_sequence_number; a data column of the same
 * name hides one.
 */
package org.icecrypt.spark.catalog;

import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.connector.catalog.MetadataColumn;
import org.apache.spark.sql.connector.catalog.SupportsDeleteV2;
import org.apache.spark.sql.connector.catalog.SupportsMetadataColumns;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsRowLevelOperations;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.NullOrdering;
import org.apache.spark.sql.connector.expressions.SortDirection;
import org.apache.spark.sql.connector.expressions.SortOrder;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.RowLevelOperation;
import org.apache.spark.sql.connector.write.RowLevelOperationBuilder;
import org.apache.spark.sql.connector.write.RowLevelOperationInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

public class IcebergTable implements SupportsRead, SupportsWrite, SupportsDeleteV2, SupportsRowLevelOperations,
        SupportsMetadataColumns {
    final CatalogContext catalog;
    final JsonNode description;
    final StructType schema;
    final StructType readSchema;  // with field ids (parquet.field.id)
    private final Map<String, String> properties;
    private final StructType partitionType;  // of _partition (null: the table has none Spark can show)

    IcebergTable(CatalogContext catalog, JsonNode description) {
        this.catalog = catalog;
        this.description = description;
        this.schema = (StructType) DataType.fromJson(description.get("schema").toString());
        this.readSchema = (StructType) DataType.fromJson(description.get("read_schema").toString());
        this.properties = CatalogContext.stringMap(description.get("properties"));
        JsonNode partition = description.get("partition_type");
        this.partitionType = partition == null || partition.isNull() ? null
            : (StructType) DataType.fromJson(partition.toString());
    }

    @Override
    public String name() {
        return description.path("name").asText();
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return schema;
    }

    @Override
    public Map<String, String> properties() {
        return properties;
    }

    @Override
    public MetadataColumn[] metadataColumns() {
        List<MetadataColumn> out = new ArrayList<>();
        if (changelog()) {
            return new MetadataColumn[0];
        }
        out.add(metadataColumn(Scans.FILE_COLUMN, DataTypes.StringType, false,
                               "Path of the file in which a row is stored", null));
        out.add(metadataColumn(Scans.POS_COLUMN, DataTypes.LongType, false,
                               "Ordinal position of a row in the source data file", null));
        out.add(metadataColumn(Scans.SPEC_ID_COLUMN, DataTypes.IntegerType, false,
                               "Spec ID used to track the file containing a row", null));
        if (partitionType() != null) {
            out.add(metadataColumn(Scans.PARTITION_COLUMN, partitionType(), true,
                                   "Partition to which a row belongs to", null));
        }
        if (lineage()) {
            out.addAll(java.util.Arrays.asList(lineageMetadataColumns()));
        }
        out.add(metadataColumn(Scans.DELETED_COLUMN, DataTypes.BooleanType, false,
                               "Whether the row has been deleted", null));
        return out.toArray(new MetadataColumn[0]);
    }

    /** _row_id and _last_updated_sequence_number, as Iceberg declares them. */
    static MetadataColumn[] lineageMetadataColumns() {
        // as Iceberg: an updated or reinserted row keeps its id; its sequence number is the new commit's
        return new MetadataColumn[] {
            metadataColumn(Scans.ROW_ID_COLUMN, DataTypes.LongType, true, "Implicit row ID that is "
                + "automatically assigned", new boolean[] {true, true, false}),
            metadataColumn(Scans.SEQUENCE_COLUMN, DataTypes.LongType, true, "Sequence number when the row "
                + "was last updated", new boolean[] {false, false, false})};
    }

    /** {@code preserve}: on reinsert, update, delete (Spark's defaults when null). */
    static MetadataColumn metadataColumn(String name, DataType type, boolean nullable, String comment,
                                                 boolean[] preserve) {
        return new MetadataColumn() {
            @Override
            public String name() {
                return name;
            }

            @Override
            public DataType dataType() {
                return type;
            }

            @Override
            public boolean isNullable() {
                return nullable;
            }

            @Override
            public String comment() {
                return comment;
            }

            @Override
            public String metadataInJSON() {
                if (preserve == null) {
                    return null;
                }
                return new org.apache.spark.sql.types.MetadataBuilder()
                    .putBoolean(MetadataColumn.PRESERVE_ON_REINSERT, preserve[0])
                    .putBoolean(MetadataColumn.PRESERVE_ON_UPDATE, preserve[1])
                    .putBoolean(MetadataColumn.PRESERVE_ON_DELETE, preserve[2]).build().json();
            }
        };
    }

    /**
     * The type of the _partition metadata column: every partition spec's fields, nullable
     * (a file written under another spec has nulls for the fields its spec lacks); null
     * when a field has a type Spark cannot show.
     */
    StructType partitionType() {
        return partitionType;
    }

    /** Whether the table has row lineage (format version 3): the metadata columns _row_id and its sequence number. */
    boolean lineage() {
        try {
            return Integer.parseInt(properties.getOrDefault("format-version", "2").trim()) >= 3;
        } catch (NumberFormatException e) {
            return false;
        }
    }

    /** Whether {@code name}, asked of a scan, is one of the metadata columns (no data column has that name). */
    boolean isMetadataColumn(String name) {
        if (java.util.Arrays.asList(schema.fieldNames()).contains(name)) {
            return false;
        }
        for (MetadataColumn column : metadataColumns()) {
            if (column.name().equals(name)) {
                return true;
            }
        }
        return false;
    }

    /** The row lineage columns a row-level operation carries (none without lineage, or when a data column hides one). */
    NamedReference[] lineageColumns() {
        if (!isMetadataColumn(Scans.ROW_ID_COLUMN) || !isMetadataColumn(Scans.SEQUENCE_COLUMN)) {
            return new NamedReference[0];
        }
        return new NamedReference[] {Expressions.column(Scans.ROW_ID_COLUMN), Expressions.column(Scans.SEQUENCE_COLUMN)};
    }

    boolean timeTravel() {
        return description.path("time_travel").asBoolean(false);
    }

    /** The changelog's columns after the table's (db.t.changes), as Iceberg names them. */
    static final String[] CHANGE_COLUMNS = {"_change_type", "_change_ordinal", "_commit_snapshot_id"};

    /**
     * Whether this is the table's changelog, db.t.changes (Iceberg's changelog table): the
     * rows the snapshots of a range inserted and deleted, read-only, with the change columns.
     */
    boolean changelog() {
        return description.path("changelog").asBoolean(false);
    }

    /** Whether {@code name}, asked of a changelog's scan, is one of its change columns. */
    boolean isChangeColumn(String name) {
        return changelog() && java.util.Arrays.asList(CHANGE_COLUMNS).contains(name);
    }

    /** Why this table cannot be written (null: it can). */
    private String readOnly() {
        if (changelog()) {
            return "icecrypt catalog: " + name() + " is a changelog: it cannot be written";
        }
        if (timeTravel()) {
            return "icecrypt catalog: table " + name() + " is selected at a snapshot or tag (VERSION/TIMESTAMP AS OF): "
                + "it cannot be written";
        }
        return null;
    }

    @Override
    public Set<TableCapability> capabilities() {
        if (timeTravel() || changelog()) {
            return EnumSet.of(TableCapability.BATCH_READ);
        }
        Set<TableCapability> out = EnumSet.of(TableCapability.BATCH_READ, TableCapability.BATCH_WRITE,
            TableCapability.TRUNCATE, TableCapability.OVERWRITE_BY_FILTER, TableCapability.OVERWRITE_DYNAMIC,
            TableCapability.STREAMING_WRITE, TableCapability.MICRO_BATCH_READ);
        if (acceptsAnySchema()) {
            out.add(TableCapability.ACCEPT_ANY_SCHEMA);
        }
        return out;
    }

    /** The table property under which writes may bring columns in any order, a subset, or new ones (mergeSchema). */
    static final String ACCEPT_ANY_SCHEMA = "write.spark.accept-any-schema";

    /**
     * Whether the table takes writes whose columns are not its own (Iceberg's
     * write.spark.accept-any-schema): the driver matches them by name and, with the write
     * option mergeSchema, first adds the new ones (Writes).
     */
    boolean acceptsAnySchema() {
        return "true".equalsIgnoreCase(properties.getOrDefault(ACCEPT_ANY_SCHEMA, "false").trim());
    }

    @Override
    public Transform[] partitioning() {
        return partitioning(description);
    }

    /** The partitioning a table description gives, as Spark's transforms (fields without one left out). */
    static Transform[] partitioning(JsonNode description) {
        return partitioning(description, null);
    }

    /** The same, with the columns renamed as {@code rename} says (see transform). */
    static Transform[] partitioning(JsonNode description, Map<String, String> rename) {
        List<Transform> out = new ArrayList<>();
        for (JsonNode field : description.path("partitioning")) {
            Transform transform = transform(field, rename);
            if (transform != null) {
                out.add(transform);
            }
        }
        return out.toArray(new Transform[0]);
    }

    /** A column name as Spark's expression parser reads it (every part quoted). */
    static String quoted(JsonNode column) {
        StringBuilder out = new StringBuilder();
        for (JsonNode part : column) {
            if (out.length() > 0) {
                out.append('.');
            }
            out.append('`').append(part.asText().replace("`", "``")).append('`');
        }
        return out.toString();
    }

    /** A partition or sort field as a Spark transform (null: none for it). */
    static Transform transform(JsonNode field) {
        return transform(field, null);
    }

    /**
     * The same, its column's top-level name replaced as {@code rename} says (a write whose
     * rows come by position under other names: Writes); null: none replaced.
     */
    static Transform transform(JsonNode field, Map<String, String> rename) {
        JsonNode column = field.get("column");
        if (column == null || column.isNull()) {
            return null;
        }
        if (rename != null && column.size() > 0 && rename.containsKey(column.get(0).asText())) {
            ArrayNode renamed = column.deepCopy();
            renamed.set(0, renamed.textNode(rename.get(column.get(0).asText())));
            column = renamed;
        }
        String name = quoted(column);
        int parameter = field.path("param").asInt(0);
        switch (field.path("transform").asText()) {
            case "identity":
                return Expressions.identity(name);
            case "bucket":
                return Expressions.bucket(parameter, name);
            case "truncate":
                return Expressions.apply("truncate", Expressions.literal(parameter), Expressions.column(name));
            case "years":
                return Expressions.years(name);
            case "months":
                return Expressions.months(name);
            case "days":
                return Expressions.days(name);
            case "hours":
                return Expressions.hours(name);
            default:
                return null;
        }
    }

    /** The table's partition fields (in spec order) followed by its sort order, as Spark's sort order. */
    SortOrder[] writeOrdering() {
        return writeOrdering(null);
    }

    /** The same, with the columns renamed as {@code rename} says (see transform). */
    SortOrder[] writeOrdering(Map<String, String> rename) {
        List<SortOrder> out = new ArrayList<>();
        for (JsonNode field : description.path("partitioning")) {
            Transform transform = transform(field, rename);
            if (transform != null) {
                out.add(Expressions.sort(expression(transform), SortDirection.ASCENDING, NullOrdering.NULLS_FIRST));
            }
        }
        for (JsonNode field : description.path("sort_order")) {
            Transform transform = transform(field, rename);
            if (transform == null) {
                continue;
            }
            boolean ascending = "asc".equals(field.path("direction").asText());
            boolean nullsFirst = "nulls-first".equals(field.path("null_order").asText());
            out.add(Expressions.sort(expression(transform), ascending ? SortDirection.ASCENDING
                : SortDirection.DESCENDING, nullsFirst ? NullOrdering.NULLS_FIRST : NullOrdering.NULLS_LAST));
        }
        return out.toArray(new SortOrder[0]);
    }

    /** An identity transform as its column (what Spark sorts and clusters by); others as they are. */
    static Expression expression(Transform transform) {
        if ("identity".equals(transform.name())) {
            return transform.references()[0];
        }
        return transform;
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        return new Scans.Builder(this, options);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        if (readOnly() != null) {
            throw new UnsupportedOperationException(readOnly());
        }
        return new Writes.Builder(this, info);
    }

    /**
     * UPDATE, MERGE INTO, and DELETE FROM whose condition has no row filter form: as the
     * table's write.<command>.mode says, merge-on-read (MergeOnRead: deleted rows become
     * deletes of their positions) or copy-on-write (CopyOnWrite: their files are rewritten).
     */
    @Override
    public RowLevelOperationBuilder newRowLevelOperationBuilder(RowLevelOperationInfo info) {
        if (readOnly() != null) {
            throw new UnsupportedOperationException(readOnly());
        }
        if (!info.options().isEmpty()) {
            throw new IllegalArgumentException("icecrypt catalog: table " + name() + ": option "
                + info.options().keySet().iterator().next() + " is not supported for " + info.command());
        }
        RowLevelOperation.Command command = info.command();
        String property = "write." + command.name().toLowerCase(java.util.Locale.ROOT) + ".mode";
        String mode = properties.getOrDefault(property, "copy-on-write").trim().toLowerCase(java.util.Locale.ROOT);
        if (!"copy-on-write".equals(mode) && !"merge-on-read".equals(mode)) {
            throw new IllegalArgumentException("icecrypt catalog: table " + name() + ": " + property + " is "
                + properties.get(property) + ", not copy-on-write or merge-on-read");
        }
        // merge-on-read needs both row id columns (a data column named _file or _pos hides one)
        if ("merge-on-read".equals(mode) && isMetadataColumn(Scans.FILE_COLUMN) && isMetadataColumn(Scans.POS_COLUMN)) {
            return () -> new MergeOnRead(this, command);
        }
        return () -> new CopyOnWrite(this, command);
    }

    /**
     * Whether every predicate has an Iceberg row filter form on the table's columns (else
     * Spark runs the DELETE as a row-level operation: newRowLevelOperationBuilder).
     */
    @Override
    public boolean canDeleteWhere(Predicate[] predicates) {
        for (Predicate predicate : predicates) {
            if (Changes.predicate(predicate) == null) {
                return false;
            }
            for (NamedReference ref : predicate.references()) {  // _file, _pos, ...: a row-level DELETE
                if (ref.fieldNames().length == 1 && isMetadataColumn(ref.fieldNames()[0])) {
                    return false;
                }
            }
        }
        return true;
    }

    /** DELETE FROM: the driver deletes the matching rows in one commit (write.delete.mode). */
    @Override
    public void deleteWhere(Predicate[] predicates) {
        if (readOnly() != null) {
            throw new UnsupportedOperationException(readOnly());
        }
        deleteWhere(catalog, ref(), predicates);
    }

    /** DELETE FROM the table {@code ref} names: the driver's row-level delete, in one commit. */
    static void deleteWhere(CatalogContext catalog, JsonNode ref, Predicate[] predicates) {
        ObjectNode request = catalog.request();
        request.set("ref", ref);
        ArrayNode filters = request.putArray("filters");
        for (Predicate predicate : predicates) {
            filters.add(Changes.predicate(predicate));
        }
        catalog.callUnchecked("delete_where", request);
    }

    /** What the driver needs to find the table again (identifier, snapshot, branch, ids). */
    JsonNode ref() {
        return description.get("ref");
    }

    /** The JSON field the driver's write calls name the table by. */
    String refField() {
        return "ref";
    }

    @Override
    public String toString() {
        return "icecrypt table " + name();
    }
}
