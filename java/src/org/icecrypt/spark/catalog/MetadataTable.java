/*
 * icecrypt: a metadata table of an Iceberg table (db.t.snapshots, db.t.files, ...), its
 * rows computed on the driver by the table's inspect (icecrypt.table.read.inspect; key
 * metadata shown as fingerprints, never bytes) and served to Spark as a local scan.
 */
package org.icecrypt.spark.catalog;

import java.util.EnumSet;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.LocalScan;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

final class MetadataTable implements SupportsRead {
    private final CatalogContext catalog;
    private final JsonNode description;
    private final StructType schema;
    private final String version;
    private final Long timestampMicros;

    MetadataTable(CatalogContext catalog, JsonNode description, String version, Long timestampMicros) {
        this.catalog = catalog;
        this.description = description;
        this.schema = (StructType) DataType.fromJson(description.get("schema").toString());
        this.version = version;
        this.timestampMicros = timestampMicros;
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
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        return () -> rows();
    }

    private Scan rows() {
        ObjectNode request = catalog.request();
        request.set("ref", description.get("ref"));
        try {
            request.set("schema", CatalogContext.JSON.readTree(schema.json()));
        } catch (java.io.IOException e) {
            throw new IllegalStateException(e);
        }
        if (version != null) {
            request.put("version", version);
        }
        if (timestampMicros != null) {
            request.put("timestamp", timestampMicros.longValue());
        }
        Dataset<?> rows = (Dataset<?>) catalog.dataset("metadata", request);
        final InternalRow[] collected = rows.queryExecution().executedPlan().executeCollect();
        final String name = name();
        return new LocalScan() {
            @Override
            public InternalRow[] rows() {
                return collected;
            }

            @Override
            public StructType readSchema() {
                return schema;
            }

            @Override
            public String description() {
                return "icecrypt metadata table " + name;
            }
        };
    }

    @Override
    public String toString() {
        return "icecrypt metadata table " + name();
    }
}
