/*
 * icecrypt: the table NativeRouting puts in place of the Python table "icecrypt.iceberg"
 * in an append or a full overwrite, so that the write is handed to the Python driver.
 *
 * It is a V1-writable table: Spark plans AppendData / OverwriteByExpression(true) over it
 * as a call of InsertableRelation.insert with the DataFrame to write, on the driver.  That
 * call passes the DataFrame, the write's options and whether it replaces the table to the
 * planner (icecrypt.spark._native_write over Py4J), which writes the data files with
 * Spark's own Parquet writer and commits them, or, when the native path does not apply,
 * writes through the Python data source as before.  No key passes through here.
 */
package org.icecrypt.spark;

import java.util.EnumSet;
import java.util.HashSet;
import java.util.Set;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.V1Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.sources.InsertableRelation;
import org.apache.spark.sql.types.StructType;

final class NativeWrite implements Table, SupportsWrite {
    private final Table python;
    private final NativeRouting.Planner planner;
    private final String options;
    private final String location;

    NativeWrite(Table python, NativeRouting.Planner planner, String options, String location) {
        this.python = python;
        this.planner = planner;
        this.options = options;
        this.location = location;
    }

    @Override
    public String name() {
        return python.name();
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return python.schema();
    }

    @Override
    public Set<TableCapability> capabilities() {
        Set<TableCapability> capabilities = new HashSet<>(python.capabilities());
        capabilities.addAll(EnumSet.of(TableCapability.V1_BATCH_WRITE, TableCapability.TRUNCATE));
        return capabilities;
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        return new Builder();
    }

    @Override
    public String toString() {
        return "icecrypt.iceberg native write to " + location;
    }

    private final class Builder implements SupportsTruncate {
        private boolean overwrite;

        @Override
        public WriteBuilder truncate() {
            overwrite = true;
            return this;
        }

        @Override
        public V1Write build() {
            final boolean replace = overwrite;
            return new V1Write() {
                @Override
                public InsertableRelation toInsertableRelation() {
                    return new InsertableRelation() {
                        @Override
                        public void insert(Dataset<Row> data, boolean ignored) {
                            // Spark's V1 fallback passes false; the builder knows an overwrite
                            planner.write(data, options, replace);
                        }
                    };
                }

                @Override
                public String description() {
                    return (replace ? "overwrite of " : "append to ") + location;
                }

                @Override
                public String toString() {
                    return "icecrypt.iceberg " + description();
                }
            };
        }
    }
}
