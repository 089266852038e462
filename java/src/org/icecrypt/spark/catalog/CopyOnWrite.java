/*
 * icecrypt: UPDATE, MERGE INTO and DELETE FROM (with a condition that has no Iceberg row
 * filter form) on a table of the SQL catalog, as copy-on-write row-level operations.
 *
 * Spark plans the statement itself (its ReplaceData rewrite): it reads the files this
 * operation's scan plans -- every row of them; the pushed condition prunes files, never
 * rows inside a file (Scans.Builder with wholeFiles) -- computes every row those files
 * hold after the statement (updated, merged, deleted or kept), and writes them with the
 * operation's write (Spark's Parquet writer, a fresh key per file, as INSERT writes).
 * Spark's group filter first finds the files holding rows the statement's condition matches
 * (Scans.CopyOnWriteScan, on _file), so only those are read and rewritten.
 * The driver then commits, in one snapshot, the new files in place of the ones the scan
 * read (icecrypt.table.ops.rowlevel.merge_files), validating the commits since the
 * scan's snapshot as Iceberg validates a concurrent commit under the table's
 * write.<command>.isolation-level.  A table whose write.<command>.mode is merge-on-read
 * is written copy-on-write too (same rows, different files; the guide says so).
 */
package org.icecrypt.spark.catalog;

import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

final class CopyOnWrite extends RowLevel {
    CopyOnWrite(IcebergTable table, Command command) {
        super(table, command, "copy-on-write");
    }

    /**
     * _file, which the scan's runtime filter is on (none when a data column has that name),
     * and the row lineage columns, which the rewritten rows keep (RowLevel.withLineage).
     */
    @Override
    public NamedReference[] requiredMetadataAttributes() {
        NamedReference[] file = table.isMetadataColumn(Scans.FILE_COLUMN)
            ? new NamedReference[] {Expressions.column(Scans.FILE_COLUMN)} : new NamedReference[0];
        return withLineage(file);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        return new Scans.Builder(table, options, true, built -> scan = built);
    }

    /** The write replaces the files the scan read (RowLevel.read), at its snapshot. */
    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        return new Writes.Builder(table, info, this::read);
    }
}
