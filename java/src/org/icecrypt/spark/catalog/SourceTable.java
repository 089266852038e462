/*
 * icecrypt: a table of the SQL catalog on an object store (s3://, gs://, ...), served
 * through icecrypt's Python data source icecrypt.iceberg.  Spark's Parquet reader and
 * writer have no file system for such a location in this runtime, so the scans and
 * writes go through the data source Spark runs in its Python workers; the driver's
 * description names the table by this catalog (the source opens the same catalog: pins,
 * KMS) and gives the selected snapshot, branch or tag as the source's options.  Those
 * options hold catalog and KMS properties, never a key.  Reads and appends work, and
 * overwriting the whole table (and CTAS: StagedSourceTable); DELETE FROM with a condition
 * that has an Iceberg row filter form is the driver's, as for every table of the catalog
 * (IcebergTable); UPDATE, MERGE INTO and other deletes are refused by Spark (the source
 * supports no row-level operation).
 */
package org.icecrypt.spark.catalog;

import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.spark.sql.connector.catalog.SupportsDeleteV2;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

class SourceTable implements SupportsRead, SupportsWrite, SupportsDeleteV2 {
    private final CatalogContext catalog;
    private final JsonNode description;
    private final StructType schema;
    private final Map<String, String> options;
    private final Table source;

    SourceTable(CatalogContext catalog, JsonNode description) {
        this.catalog = catalog;
        this.description = description;
        this.schema = (StructType) DataType.fromJson(description.get("schema").toString());
        this.options = CatalogContext.stringMap(description.get("options"));
        PythonDataSourceV2 provider = new PythonDataSourceV2();
        provider.setShortName(description.path("source").asText());
        this.source = provider.getTable(schema, new Transform[0], options);
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
    private CaseInsensitiveStringMap merged(CaseInsensitiveStringMap given) {
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

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap given) {
        return ((SupportsRead) source).newScanBuilder(merged(given));
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        if (description.path("time_travel").asBoolean(false)) {
            throw new UnsupportedOperationException("icecrypt catalog: table " + name() + " is selected at a snapshot "
                + "or tag (VERSION/TIMESTAMP AS OF): it cannot be written");
        }
        final CaseInsensitiveStringMap all = merged(info.options());
        return ((SupportsWrite) source).newWriteBuilder(new LogicalWriteInfo() {
            @Override
            public CaseInsensitiveStringMap options() {
                return all;
            }

            @Override
            public String queryId() {
                return info.queryId();
            }

            @Override
            public StructType schema() {
                return info.schema();
            }

            @Override
            public Optional<StructType> rowIdSchema() {
                return info.rowIdSchema();
            }

            @Override
            public Optional<StructType> metadataSchema() {
                return info.metadataSchema();
            }
        });
    }

    @Override
    public String toString() {
        return "icecrypt table " + name() + " (icecrypt.iceberg)";
    }
}
