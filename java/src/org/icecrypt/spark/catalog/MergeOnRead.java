/*
 * icecrypt: UPDATE, MERGE INTO and DELETE FROM (with a condition that has no Iceberg row
 * filter form) on a table whose write.<command>.mode is merge-on-read, as position-delta
 * row-level operations (Spark's SupportsDelta), as Iceberg's Spark runtime does them.
 *
 * Spark reads the rows the statement's condition may match, with their row id: the
 * metadata columns _file (the data file, as the table records it) and _pos (the row's
 * position in it, the row index Spark's Parquet reader gives).  Its WriteDelta then hands
 * each task the changes: a deleted row by its id, an updated row as its id deleted and
 * its new values inserted (representUpdateAsDeleteAndInsert), an inserted row by its
 * values.  The task writes the inserted rows with Spark's Parquet writer (a fresh key per
 * file, as INSERT writes, Writes.FileWriter) and keeps the deleted positions per data
 * file; nothing else is rewritten.  At commit the driver receives the new files and the
 * positions, checks that every file named is one the operation's scan planned at its
 * snapshot (what the JVM reports is checked, never taken on trust), and commits them in
 * one snapshot with icecrypt.table.ops.rowlevel.merge_files: the positions joined with the
 * files' existing deletes as new deletion vectors (format 3) or position delete files
 * (format 2), the commits since the scan's snapshot validated as Iceberg validates a
 * concurrent commit under the table's write.<command>.isolation-level.  Executors never
 * write a delete file, so no delete key leaves the driver.
 */
package org.icecrypt.spark.catalog;

import java.io.IOException;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.DeltaBatchWrite;
import org.apache.spark.sql.connector.write.DeltaWrite;
import org.apache.spark.sql.connector.write.DeltaWriteBuilder;
import org.apache.spark.sql.connector.write.DeltaWriter;
import org.apache.spark.sql.connector.write.DeltaWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsDelta;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

final class MergeOnRead extends RowLevel implements SupportsDelta {
    MergeOnRead(IcebergTable table, Command command) {
        super(table, command, "merge-on-read");
    }

    @Override
    public NamedReference[] rowId() {
        return new NamedReference[] {Expressions.column(Scans.FILE_COLUMN), Expressions.column(Scans.POS_COLUMN)};
    }

    /** The row lineage columns, which an updated row keeps (RowLevel.withLineage). */
    @Override
    public NamedReference[] requiredMetadataAttributes() {
        return withLineage(new NamedReference[0]);
    }

    @Override
    public boolean representUpdateAsDeleteAndInsert() {
        return true;
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        return new Scans.Builder(table, options, false, built -> scan = built);
    }

    /** The deletes may name the data files the scan read (RowLevel.read), at its snapshot. */
    @Override
    public DeltaWriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        return new DeltaWriteBuilder() {
            @Override
            public DeltaWrite build() {
                return new Delta(table, info, MergeOnRead.this::read);
            }
        };
    }

    /** The delta write: planned with the driver as every write (mode delta). */
    static final class Delta extends Writes.IcebergWrite implements DeltaWrite {
        Delta(IcebergTable table, LogicalWriteInfo info, java.util.function.Supplier<ObjectNode> read) {
            super(table, info, "delta", new org.apache.spark.sql.connector.expressions.filter.Predicate[0], read);
        }

        @Override
        public DeltaBatchWrite toBatch() {
            Writes.IcebergBatchWrite batch = (Writes.IcebergBatchWrite) super.toBatch();
            return new DeltaBatch(batch);
        }
    }

    /** The job: the files and deleted positions of every task, committed by the driver. */
    static final class DeltaBatch implements DeltaBatchWrite {
        private final Writes.IcebergBatchWrite batch;

        DeltaBatch(Writes.IcebergBatchWrite batch) {
            this.batch = batch;
        }

        @Override
        public DeltaWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
            return new Factory(batch.createBatchWriterFactory(info));
        }

        @Override
        public void commit(WriterCommitMessage[] messages) {
            batch.commit(messages);
        }

        @Override
        public void abort(WriterCommitMessage[] messages) {
            batch.abort(messages);
        }

        @Override
        public String toString() {
            return batch.toString();
        }
    }

    static final class Factory implements DeltaWriterFactory {
        private static final long serialVersionUID = 1L;
        private final Writes.WriterFactory files;

        Factory(Writes.WriterFactory files) {
            this.files = files;
        }

        @Override
        public DeltaWriter<InternalRow> createWriter(int partitionId, long taskId) {
            return new Writer(files.createWriter(partitionId, taskId));
        }
    }

    /** One task: inserted rows into files (Writes.FileWriter), deleted rows as positions per data file. */
    static final class Writer implements DeltaWriter<InternalRow> {
        private final Writes.FileWriter files;
        private final Map<String, Positions> deleted = new HashMap<>();

        Writer(Writes.FileWriter files) {
            this.files = files;
        }

        @Override
        public void delete(InternalRow metadata, InternalRow id) {
            if (id.isNullAt(0) || id.isNullAt(1)) {
                throw new IllegalStateException("icecrypt: a row to delete without its data file or position");
            }
            deleted.computeIfAbsent(id.getUTF8String(0).toString(), file -> new Positions()).add(id.getLong(1));
        }

        @Override
        public void update(InternalRow metadata, InternalRow id, InternalRow row) {
            // representUpdateAsDeleteAndInsert: Spark deletes and reinserts instead
            throw new UnsupportedOperationException("icecrypt: an update is written as a delete and an insert");
        }

        @Override
        public void insert(InternalRow row) throws IOException {
            files.write(row);
        }

        /** An updated row written again: with its lineage (its _row_id kept; Spark dropped its sequence number). */
        @Override
        public void reinsert(InternalRow metadata, InternalRow row) throws IOException {
            files.write(metadata, row);
        }

        @Override
        public WriterCommitMessage commit() throws IOException {
            Writes.WrittenFiles written = (Writes.WrittenFiles) files.commit();
            for (Map.Entry<String, Positions> entry : deleted.entrySet()) {
                written.deletes.put(entry.getKey(), entry.getValue().toArray());
            }
            return written;
        }

        @Override
        public void abort() throws IOException {
            files.abort();
        }

        @Override
        public void close() {
            files.close();
        }
    }

    /** A growable list of row positions. */
    static final class Positions {
        private long[] values = new long[16];
        private int size;

        void add(long position) {
            if (size == values.length) {
                values = Arrays.copyOf(values, size * 2);
            }
            values[size++] = position;
        }

        long[] toArray() {
            return Arrays.copyOf(values, size);
        }
    }
}
