/*
 * icecrypt: UPDATE, MERGE INTO and DELETE FROM (a condition without an Iceberg row filter
 * form) on a table of the SQL catalog on an object store (SourceTable), copy-on-write,
 * through icecrypt's Python data source icecrypt.iceberg.
 *
 * Spark plans the statement (its ReplaceData rewrite).  This operation's scan is the
 * source's, told (option icecrypt.rewrite) to read, at the snapshot the statement was
 * analysed at, every live row of each data file the pushed condition may match (the
 * condition selects files, never rows inside a file) and, when Spark's runtime group filter
 * ran (RewriteScan: the files holding a row the statement's condition matches, found by
 * _file), only those files.  Its write is the source's, told the same once the scan has
 * run, so that the driver's commit replaces exactly those files with the written ones
 * (icecrypt.table.ops.rowlevel.merge_files, validating the commits since that snapshot
 * under the table's write.<command>.isolation-level).  A write whose scan was built but
 * never ran is refused by the source (it cannot tell which files were read).  A table whose
 * write.<command>.mode is merge-on-read is written copy-on-write too (same rows, different
 * files).
 *
 * A Python data source's writer takes its rows as one stream (writeAll), which Spark's
 * ReplaceData task does not give it, so icecrypt's session extension plans this write as
 * an append of the statement's rows (SourceRewriteStrategy).  Without the extension the
 * write fails before any task runs: nothing is written and nothing is committed.
 */
package org.icecrypt.spark.catalog;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.Literal;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownV2Filters;
import org.apache.spark.sql.connector.read.SupportsRuntimeV2Filtering;
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
    private volatile boolean built;  // a scan was built for the statement
    private volatile String scanned;  // the rewrite as the last scan that ran read it (null: none ran)

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
     * _file, which the runtime group filter is on (none when a data column has that name),
     * and the row lineage columns, which the rewritten rows keep (as CopyOnWrite).
     */
    @Override
    public NamedReference[] requiredMetadataAttributes() {
        List<NamedReference> out = new ArrayList<>();
        if (table.hasMetadataColumn(Scans.FILE_COLUMN)) {
            out.add(Expressions.column(Scans.FILE_COLUMN));
        }
        out.addAll(Arrays.asList(table.lineageColumns()));
        return out.toArray(new NamedReference[0]);
    }

    /**
     * The rewrite's description, as the source's reader and writer take it: the command,
     * the snapshot, the filters that select the files read, and {@code files}: of those,
     * the only ones read (null: all of them).  {@code read}: true when the scan ran, false
     * when it was never built (Spark found the condition always false: no file is replaced),
     * null when it was built and has not run (the source refuses to commit).
     */
    private String rewrite(ArrayNode filters, List<String> files, Boolean read) {
        ObjectNode out = CatalogContext.JSON.createObjectNode();
        out.put("command", command.name().toLowerCase(Locale.ROOT));
        out.set("snapshot_id", table.ref().get("snapshot_id"));
        out.set("filters", filters);
        if (files == null) {
            out.putNull("files");
        } else {
            ArrayNode list = out.putArray("files");
            files.forEach(list::add);
        }
        if (read == null) {
            out.putNull("read");
        } else {
            out.put("read", read);
        }
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
            built = true;
            List<String> columns = new ArrayList<>();
            for (NamedReference column : requiredMetadataAttributes()) {
                columns.add(column.fieldNames()[0]);
            }
            return new RewriteScan(given, filters.deepCopy(), columns);
        }
    }

    /**
     * The scan of the files the filters select, narrowed by Spark's runtime group filter
     * (an IN list of _file values: the files holding a row the condition matches).  Each
     * toBatch builds the source's scan of the files as they stand, and records that rewrite
     * for the write.
     */
    private final class RewriteScan implements Scan, SupportsRuntimeV2Filtering {
        private final CaseInsensitiveStringMap given;
        private final ArrayNode filters;
        private final List<String> columns;  // the metadata columns read after the table's
        private final StructType schema;
        private List<String> files;  // null: every file the filters select

        RewriteScan(CaseInsensitiveStringMap given, ArrayNode filters, List<String> columns) {
            this.given = given;
            this.filters = filters;
            this.columns = columns;
            this.schema = table.withMetadata(columns);
        }

        /** The source's scan of this rewrite (a table of its own: SourceTable.fresh). */
        private Scan inner(String rewrite) {
            CaseInsensitiveStringMap options = new CaseInsensitiveStringMap(options(given, rewrite, true));
            return ((SupportsRead) table.sourceWith(columns)).newScanBuilder(options).build();
        }

        @Override
        public StructType readSchema() {
            return schema;  // the table's columns, then the metadata columns asked for
        }

        @Override
        public String description() {
            return SourceRewrite.this.description() + (files == null ? "" : " (" + files.size() + " files)");
        }

        @Override
        public NamedReference[] filterAttributes() {
            return table.hasMetadataColumn(Scans.FILE_COLUMN)
                ? new NamedReference[] {Expressions.column(Scans.FILE_COLUMN)} : new NamedReference[0];
        }

        /** {@code _file IN (...)}: only those files are read (anything else keeps every file). */
        @Override
        public void filter(Predicate[] predicates) {
            for (Predicate predicate : predicates) {
                org.apache.spark.sql.connector.expressions.Expression[] children = predicate.children();
                if (!"IN".equals(predicate.name()) || children.length == 0
                        || !(children[0] instanceof NamedReference)
                        || !Scans.FILE_COLUMN.equals(String.join(".", ((NamedReference) children[0]).fieldNames()))) {
                    continue;
                }
                List<String> kept = new ArrayList<>();
                for (int i = 1; i < children.length; i++) {
                    if (!(children[i] instanceof Literal) || ((Literal<?>) children[i]).value() == null) {
                        return;  // not a list of paths: every file stays
                    }
                    kept.add(((Literal<?>) children[i]).value().toString());
                }
                if (files != null) {
                    kept.retainAll(files);
                }
                files = kept;
            }
        }

        @Override
        public Batch toBatch() {
            String rewrite = rewrite(filters, files, true);
            scanned = rewrite;
            return inner(rewrite).toBatch();
        }
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        StructType schema = info.schema();  // the rows' lineage after the table's columns (SourceRewriteStrategy)
        if (info.metadataSchema().isPresent()) {
            for (StructField field : info.metadataSchema().get().fields()) {
                if (!Scans.FILE_COLUMN.equals(field.name())) {
                    schema = schema.add(field);
                }
            }
        }
        final StructType written = schema;
        // the options are read when the write's tasks are planned, after the scan ran
        LogicalWriteInfo lazy = new LogicalWriteInfo() {
            @Override
            public CaseInsensitiveStringMap options() {
                String rewrite = scanned != null ? scanned
                    : rewrite(CatalogContext.JSON.createArrayNode(), null, built ? null : Boolean.FALSE);
                return new CaseInsensitiveStringMap(SourceRewrite.this.options(info.options(), rewrite, false));
            }

            @Override
            public String queryId() {
                return info.queryId();
            }

            @Override
            public StructType schema() {
                return written;
            }

            @Override
            public java.util.Optional<StructType> rowIdSchema() {
                return info.rowIdSchema();
            }

            @Override
            public java.util.Optional<StructType> metadataSchema() {
                return info.metadataSchema();
            }
        };
        WriteBuilder inner = ((SupportsWrite) table.source()).newWriteBuilder(lazy);
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
