/*
 * icecrypt: a table of the SQL catalog on an object store (s3://, gs://, ...), served
 * through icecrypt's Python data source icecrypt.iceberg.  Spark's Parquet reader and
 * writer have no file system for such a location in this runtime, so the scans and
 * writes go through the data source Spark runs in its Python workers; the driver's
 * description names the table by this catalog (the source opens the same catalog: pins,
 * KMS) and gives the selected snapshot, branch or tag as the source's options.  Those
 * options hold catalog and KMS properties, never a key.  Reads (with the metadata
 * columns but _partition) and appends work, and overwriting the whole table (and CTAS:
 * StagedSourceTable); DELETE FROM with a condition that has an Iceberg row filter form is
 * the driver's, as for every table of the catalog (IcebergTable); UPDATE, MERGE INTO and
 * the other deletes are copy-on-write rewrites through the source (SourceRewrite).
 */
package org.icecrypt.spark.catalog;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.EnumSet;
import java.util.List;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.spark.sql.connector.catalog.MetadataColumn;
import org.apache.spark.sql.connector.catalog.SupportsDeleteV2;
import org.apache.spark.sql.connector.catalog.SupportsMetadataColumns;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsRowLevelOperations;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.RowLevelOperation;
import org.apache.spark.sql.connector.write.RowLevelOperationBuilder;
import org.apache.spark.sql.connector.write.RowLevelOperationInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

class SourceTable implements SupportsRead, SupportsWrite, SupportsDeleteV2, SupportsRowLevelOperations,
        SupportsMetadataColumns {
    private final CatalogContext catalog;
    private final JsonNode description;
    private final StructType schema;
    private final Map<String, String> options;
    private final Table source;  // for what the table is (capabilities); scans and writes take fresh ones
    private final List<MetadataColumn> metadata;  // the metadata columns the source reads

    SourceTable(CatalogContext catalog, JsonNode description) {
        this.catalog = catalog;
        this.description = description;
        this.schema = (StructType) DataType.fromJson(description.get("schema").toString());
        this.options = CatalogContext.stringMap(description.get("options"));
        this.source = fresh(schema);
        this.metadata = metadata(schema, lineage());
    }

    /** Whether the table has row lineage (format version 3). */
    private boolean lineage() {
        return Integer.parseInt(properties().getOrDefault("format-version", "2").trim()) >= 3;
    }

    /**
     * The metadata columns the source reads (as the catalog's other tables have them, but
     * _partition), those no data column hides: _file, _pos, _spec_id, _deleted (selected,
     * a deleted row is read and marked, as Iceberg reads it), and with lineage _row_id and
     * _last_updated_sequence_number.
     */
    private static List<MetadataColumn> metadata(StructType schema, boolean lineage) {
        List<MetadataColumn> all = new ArrayList<>(Arrays.asList(
            IcebergTable.metadataColumn(Scans.FILE_COLUMN, DataTypes.StringType, false,
                                        "Path of the file in which a row is stored", null),
            IcebergTable.metadataColumn(Scans.POS_COLUMN, DataTypes.LongType, false,
                                        "Ordinal position of a row in the source data file", null),
            IcebergTable.metadataColumn(Scans.SPEC_ID_COLUMN, DataTypes.IntegerType, false,
                                        "Spec ID used to track the file containing a row", null),
            IcebergTable.metadataColumn(DELETED_COLUMN, DataTypes.BooleanType, false,
                                        "Whether the row has been deleted", null)));
        if (lineage) {
            all.addAll(Arrays.asList(IcebergTable.lineageMetadataColumns()));
        }
        List<String> names = Arrays.asList(schema.fieldNames());
        all.removeIf(column -> names.contains(column.name()));
        return all;
    }

    /** Iceberg's metadata column of deleted rows (MetadataColumns.IS_DELETED). */
    static final String DELETED_COLUMN = "_deleted";

    @Override
    public MetadataColumn[] metadataColumns() {
        return metadata.toArray(new MetadataColumn[0]);
    }

    /** Whether {@code name} is one of the metadata columns the source reads. */
    boolean hasMetadataColumn(String name) {
        return metadata.stream().anyMatch(column -> column.name().equals(name));
    }

    /** The lineage columns a row-level statement's rows carry (none without lineage, or when a data column hides one). */
    NamedReference[] lineageColumns() {
        if (!hasMetadataColumn(Scans.ROW_ID_COLUMN) || !hasMetadataColumn(Scans.SEQUENCE_COLUMN)) {
            return new NamedReference[0];
        }
        return new NamedReference[] {Expressions.column(Scans.ROW_ID_COLUMN), Expressions.column(Scans.SEQUENCE_COLUMN)};
    }

    /** The table's columns, then the metadata columns {@code names} (in the order of {@link #metadataColumns}). */
    StructType withMetadata(List<String> names) {
        StructType out = schema;
        for (MetadataColumn column : metadata) {
            if (names.contains(column.name())) {
                out = out.add(column.name(), column.dataType(), column.isNullable());
            }
        }
        return out;
    }

    /** The source's table that reads the metadata columns {@code names} after the table's columns. */
    Table sourceWith(List<String> names) {
        return fresh(withMetadata(names));
    }

    /**
     * The source's table with these columns, on a provider of its own: Spark's Python data
     * source provider keeps the first data source and read plan it makes for any later
     * scan, whatever its options or columns, so each scan and write gets its own.
     */
    private Table fresh(StructType columns) {
        PythonDataSourceV2 provider = new PythonDataSourceV2();
        provider.setShortName(description.path("source").asText());
        return provider.getTable(columns, new Transform[0], options);
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
        return CatalogContext.stringMap(description.get("properties"));
    }

    @Override
    public Transform[] partitioning() {
        return IcebergTable.partitioning(description);
    }

    /** Whether every predicate has an Iceberg row filter form (else Spark refuses the DELETE). */
    @Override
    public boolean canDeleteWhere(Predicate[] predicates) {
        for (Predicate predicate : predicates) {
            if (Changes.predicate(predicate) == null) {
                return false;
            }
        }
        return !description.path("time_travel").asBoolean(false);
    }

    /** DELETE FROM: the driver deletes the matching rows in one commit, as for the catalog's other tables. */
    @Override
    public void deleteWhere(Predicate[] predicates) {
        IcebergTable.deleteWhere(catalog, description.get("ref"), predicates);
    }

    @Override
    public Set<TableCapability> capabilities() {
        Set<TableCapability> out = EnumSet.noneOf(TableCapability.class);
        out.addAll(source.capabilities());
        if (description.path("time_travel").asBoolean(false)) {
            out.retainAll(EnumSet.of(TableCapability.BATCH_READ));
        }
        return out;
    }

    /** The statement's options over the description's (the table is the description's, always). */
    CaseInsensitiveStringMap merged(CaseInsensitiveStringMap given) {
        Map<String, String> out = new HashMap<>(given);
        for (String key : options.keySet()) {
            if (given.containsKey(key) && !given.get(key).equals(options.get(key))) {
                throw new IllegalArgumentException("icecrypt catalog: table " + name() + ": option " + key
                    + " cannot be given (the catalog sets it)");
            }
        }
        out.putAll(options);
        return new CaseInsensitiveStringMap(out);
    }

    /** The source's scan; with the metadata columns the statement reads. */
    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap given) {
        CaseInsensitiveStringMap options = merged(given);
        if (metadata.isEmpty()) {
            return ((SupportsRead) fresh(schema)).newScanBuilder(options);
        }
        return new WithMetadata(options);
    }

    private final class WithMetadata implements ScanBuilder, SupportsPushDownRequiredColumns {
        private final CaseInsensitiveStringMap options;
        private List<String> required = new ArrayList<>();

        WithMetadata(CaseInsensitiveStringMap options) {
            this.options = options;
        }

        /** Every data column is read (the source prunes none); the metadata columns asked for after them. */
        @Override
        public void pruneColumns(StructType columns) {
            required = Arrays.asList(columns.fieldNames());
        }

        @Override
        public Scan build() {
            return ((SupportsRead) sourceWith(required)).newScanBuilder(options).build();
        }
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        if (description.path("time_travel").asBoolean(false)) {
            throw new UnsupportedOperationException("icecrypt catalog: table " + name() + " is selected at a snapshot "
                + "or tag (VERSION/TIMESTAMP AS OF): it cannot be written");
        }
        return ((SupportsWrite) fresh(schema)).newWriteBuilder(writeInfo(info, merged(info.options()), info.schema()));
    }

    /** {@code info} with these options and this schema. */
    static LogicalWriteInfo writeInfo(LogicalWriteInfo info, CaseInsensitiveStringMap options, StructType schema) {
        return new LogicalWriteInfo() {
            @Override
            public CaseInsensitiveStringMap options() {
                return options;
            }

            @Override
            public String queryId() {
                return info.queryId();
            }

            @Override
            public StructType schema() {
                return schema;
            }

            @Override
            public Optional<StructType> rowIdSchema() {
                return info.rowIdSchema();
            }

            @Override
            public Optional<StructType> metadataSchema() {
                return info.metadataSchema();
            }
        };
    }

    /** The source's table for a scan or write (on a provider of its own: {@link #fresh}). */
    Table source() {
        return fresh(schema);
    }

    /** What the driver needs to find the table again (identifier, snapshot, branch, ids). */
    JsonNode ref() {
        return description.get("ref");
    }

    /**
     * UPDATE, MERGE INTO, and DELETE FROM whose condition has no row filter form: copy-on-write
     * through the source (SourceRewrite), whatever write.<command>.mode says.
     */
    @Override
    public RowLevelOperationBuilder newRowLevelOperationBuilder(RowLevelOperationInfo info) {
        if (description.path("time_travel").asBoolean(false)) {
            throw new UnsupportedOperationException("icecrypt catalog: table " + name() + " is selected at a snapshot "
                + "or tag (VERSION/TIMESTAMP AS OF): it cannot be written");
        }
        if (!info.options().isEmpty()) {
            throw new IllegalArgumentException("icecrypt catalog: table " + name() + ": option "
                + info.options().keySet().iterator().next() + " is not supported for " + info.command());
        }
        RowLevelOperation.Command command = info.command();
        return () -> new SourceRewrite(this, command);
    }

    @Override
    public String toString() {
        return "icecrypt table " + name() + " (icecrypt.iceberg)";
    }
}
