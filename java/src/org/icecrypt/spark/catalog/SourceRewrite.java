/*
 * icecrypt: UPDATE, MERGE INTO and DELETE FROM (a condition without an Iceberg row filter
 * form) on a table of the SQL catalog on an object store (SourceTable), copy-on-write,
 * through icecrypt's Python data source icecrypt.iceberg.
 *
 * Spark plans the statement (its ReplaceData rewrite).  This operation's scan is the
 * source's, told (option icecrypt.rewrite) to read, at the snapshot the statement was
 * analysed at, every live row of each data file the pushed condition may match: the
 * condition selects files, never rows inside a file.  Its write is the source's, told the
 * same, so that the driver's commit replaces exactly those files with the written ones
 * (icecrypt.table.ops.rowlevel.merge_files, validating the commits since that snapshot
 * under the table's write.<command>.isolation-level).  A table whose write.<command>.mode
 * is merge-on-read is written copy-on-write too (same rows, different files).
 *
 * A Python data source's writer takes its rows as one stream (writeAll), which Spark's
 * ReplaceData task does not give it, so icecrypt's session extension plans this write as
 * an append of the statement's rows (SourceRewriteStrategy).  Without the extension the
 * write fails before any task runs: nothing is written and nothing is committed.
 */
package org.icecrypt.spark.catalog;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownV2Filters;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.RowLevelOperation;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

public final class SourceRewrite implements RowLevelOperation {
    /** The source option that carries the rewrite (command, snapshot, file-selecting filters). */
    static final String OPTION = "icecrypt.rewrite";
    /** The source's options a rewrite sets itself (its snapshot is the statement's). */
    private static final String[] SELECTION = {"snapshot-id", "as-of-timestamp", "branch", "tag", "wap-id"};

    private final SourceTable table;
    private final Command command;
    private volatile String scanned;  // the rewrite as the last scan built read it

    SourceRewrite(SourceTable table, Command command) {
        this.table = table;
        this.command = command;
    }

    @Override
    public Command command() {
        return command;
    }

    @Override
    public String description() {
        return "icecrypt copy-on-write " + command.name().toLowerCase(Locale.ROOT) + " of " + table.name()
            + " (icecrypt.iceberg)";
    }

    /**
     * The row lineage columns, which the rewritten rows keep (as CopyOnWrite): no _file, the
     * files are the ones the pushed condition selects (no runtime filter).
     */
    @Override
    public NamedReference[] requiredMetadataAttributes() {
        return table.lineageColumns();
    }

    /**
     * The rewrite's description, as the source's reader and writer take it: the command,
     * the snapshot, and the filters that select the files read (``read`` false: the scan
     * was never built -- Spark found the condition always false -- so no file is replaced).
     */
    private String rewrite(ArrayNode filters, boolean read) {
        ObjectNode out = CatalogContext.JSON.createObjectNode();
        out.put("command", command.name().toLowerCase(Locale.ROOT));
        out.set("snapshot_id", table.ref().get("snapshot_id"));
        out.set("filters", filters);
        out.put("read", read);
        return out.toString();
    }

    private Map<String, String> options(Map<String, String> given, String rewrite, boolean read) {
        Map<String, String> out = new HashMap<>(table.merged(new CaseInsensitiveStringMap(given)));
        if (read) {
            for (String key : SELECTION) {
                out.remove(key);
            }
        }
        out.put(OPTION, rewrite);
        return out;
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap given) {
        return new Builder(given);
    }

    /** Pushed predicates select files (each read whole); Spark evaluates every one again. */
    private final class Builder implements ScanBuilder, SupportsPushDownV2Filters {
        private final CaseInsensitiveStringMap given;
        private final ArrayNode filters = CatalogContext.JSON.createArrayNode();
        private Predicate[] pushed = new Predicate[0];

        Builder(CaseInsensitiveStringMap given) {
            this.given = given;
        }

        @Override
        public Predicate[] pushPredicates(Predicate[] predicates) {
            List<Predicate> kept = new ArrayList<>();
            filters.removeAll();
            for (Predicate predicate : predicates) {
                ObjectNode filter = Changes.predicate(predicate);
                if (filter != null) {
                    filters.add(filter);
                    kept.add(predicate);
                }
            }
            pushed = kept.toArray(new Predicate[0]);
            return predicates;
        }

        @Override
        public Predicate[] pushedPredicates() {
            return pushed;
        }

        @Override
        public Scan build() {
            String rewrite = rewrite(filters, true);
            scanned = rewrite;
            CaseInsensitiveStringMap options = new CaseInsensitiveStringMap(options(given, rewrite, true));
            List<String> lineage = new ArrayList<>();
            for (NamedReference column : table.lineageColumns()) {
                lineage.add(column.fieldNames()[0]);
            }
            return ((SupportsRead) table.sourceWith(lineage)).newScanBuilder(options).build();
        }
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        String rewrite = scanned != null ? scanned : rewrite(CatalogContext.JSON.createArrayNode(), false);
        CaseInsensitiveStringMap all = new CaseInsensitiveStringMap(options(info.options(), rewrite, false));
        StructType schema = info.schema();  // the rows' lineage after the table's columns (SourceRewriteStrategy)
        if (info.metadataSchema().isPresent()) {
            for (StructField field : info.metadataSchema().get().fields()) {
                schema = schema.add(field);
            }
        }
        WriteBuilder inner = ((SupportsWrite) table.source()).newWriteBuilder(SourceTable.writeInfo(info, all, schema));
        return new WriteBuilder() {
            @Override
            public Write build() {
                return new Guarded(inner.build());
            }
        };
    }

    /**
     * The source's write, as SourceRewriteStrategy plans it (an append of the statement's
     * rows).  Planned by Spark's own ReplaceData (no session extension), it refuses to run:
     * that task hands a Python writer its rows one by one, which it does not take.
     */
    public static final class Guarded implements Write {
        private final Write inner;
        private volatile boolean asAppend;

        Guarded(Write inner) {
            this.inner = inner;
        }

        /** Called by SourceRewriteStrategy, which plans the write as an append. */
        public Write asAppend() {
            asAppend = true;
            return this;
        }

        @Override
        public String description() {
            return inner.description();
        }

        @Override
        public BatchWrite toBatch() {
            if (!asAppend) {
                throw new UnsupportedOperationException("icecrypt catalog: UPDATE, MERGE INTO and row-level DELETE "
                    + "on a table on an object store need icecrypt's session extension (spark.sql.extensions="
                    + "org.icecrypt.spark.Extensions, set by icecrypt.spark.configure); nothing was written");
            }
            return inner.toBatch();
        }

        @Override
        public org.apache.spark.sql.connector.metric.CustomMetric[] supportedCustomMetrics() {
            return inner.supportedCustomMetrics();
        }
    }
}
