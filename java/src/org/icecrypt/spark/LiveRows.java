/*
 * icecrypt: Spark's Parquet file format with an Iceberg table's position deletes (deletion
 * vectors and position delete files) applied inside the scan.
 *
 * The driver (icecrypt.spark._native) reads each data file's deletes as a sorted list of
 * deleted row positions and hands them to the read in its option DELETES:
 *
 *   option = base64(zlib(buffer))
 *   buffer = file*
 *   file   = int32 path length, path (UTF-8), int64 rows, int32 n, n x uint32 delta
 *
 * (big-endian) where rows is the file's record count and the deltas are the differences of
 * the sorted positions (the first from 0).
 *
 * The read's schema holds one more column, COLUMN (a long), and the read keeps only the
 * rows where COLUMN >= 0 (live() builds that read).  This format fills that column with the
 * row's position in its file and sets it to -1 for every deleted position, batch by batch, so
 * a deleted row never passes the filter; row by row (when Spark's reader does not return
 * batches) deleted rows are dropped here.  The positions come from one of two places:
 *
 * - counted: a task that reads a whole file with no filter pushed into Parquet gets every
 *   row of it, in order, so the positions are a running count (the column is a vector of
 *   this format's own, added to each batch); at the end the count must be the file's
 *   record count, or the task fails;
 * - otherwise (a split of a file, pushed filters that may skip row groups or pages, rows
 *   instead of batches): parquet-java's row index, the one Spark's _metadata.row_index
 *   reads, read into the column and marked in place.
 *
 * The first costs a store per row; the second about what reading a long column costs.
 * Spark's vectorized reader, its column pruning and pushed filters work as for plain Parquet,
 * and the filter above the scan is one comparison of a long in generated code.
 *
 * Fails closed: a file the option does not name fails its task (never read unfiltered), as
 * does a read whose required columns lack COLUMN (its filter would be gone).  Positions are
 * not secret; no key passes through here.
 */
package org.icecrypt.spark;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.zip.DataFormatException;
import java.util.zip.Inflater;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GreaterThanOrEqual;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.execution.datasources.FileFormat$;
import org.apache.spark.sql.execution.datasources.PartitionedFile;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.execution.vectorized.OffHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.util.TaskCompletionListener;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.roaringbitmap.PeekableIntIterator;
import org.roaringbitmap.RoaringBitmap;

import scala.Function1;
import scala.collection.AbstractIterator;
import scala.collection.Iterator;
import scala.collection.immutable.Map;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;

public class LiveRows extends ParquetFileFormat {
    private static final long serialVersionUID = 1L;

    /** The column of row positions (-1: deleted) the read's filter keeps at >= 0. */
    public static final String COLUMN = "_icecrypt_live_row";
    /** The read option holding the deleted positions (see the header). */
    public static final String DELETES = "icecrypt.deletes";

    @Override
    public String shortName() {
        return "icecrypt-live-rows";
    }

    @Override
    public boolean equals(Object other) {
        return other != null && other.getClass() == LiveRows.class;  // not equal to plain Parquet
    }

    @Override
    public int hashCode() {
        return LiveRows.class.hashCode();
    }

    @Override
    public Function1<PartitionedFile, Iterator<InternalRow>> buildReaderWithPartitionValues(
            SparkSession session, StructType dataSchema, StructType partitionSchema, StructType requiredSchema,
            Seq<Filter> filters, Map<String, String> options, Configuration hadoopConf) {
        int column = index(requiredSchema);
        if (column < 0) {
            throw new IllegalStateException("icecrypt: a read of " + getClass().getName() + " without its column "
                + COLUMN + ": refused (the deletes filter would be lost)");
        }
        scala.Option<String> encoded = options.get(DELETES);
        if (encoded.isEmpty()) {
            throw new IllegalArgumentException("icecrypt: a read of " + getClass().getName() + " without option " + DELETES);
        }
        HashMap<String, Deletes> deleted = parse(decode(encoded.get()));
        // Parquet reads the column as its row index; filters on it are not Parquet's to push
        List<Filter> kept = new ArrayList<>();
        for (Filter filter : CollectionConverters.asJava(filters)) {
            if (!java.util.Arrays.asList(filter.references()).contains(COLUMN)) {
                kept.add(filter);
            }
        }
        Function1<PartitionedFile, Iterator<InternalRow>> read = super.buildReaderWithPartitionValues(
            session, positions(dataSchema), partitionSchema, positions(requiredSchema),
            CollectionConverters.asScala(kept).toSeq(), options, new Configuration(hadoopConf));
        // whole files in batches, nothing pushed: also a reader without the column, counted.
        // Each reader gets its own copy of the configuration: Spark's reader sets the schema
        // it reads there, and a local session's broadcast holds the object, not a copy
        Function1<PartitionedFile, Iterator<InternalRow>> whole = null;
        if (kept.isEmpty() && "true".equals(options.get(FileFormat$.MODULE$.OPTION_RETURNING_BATCH()).getOrElse(() -> ""))) {
            whole = super.buildReaderWithPartitionValues(
                session, without(dataSchema), partitionSchema, without(requiredSchema),
                CollectionConverters.asScala(new ArrayList<Filter>()).toSeq(), options, new Configuration(hadoopConf));
        }
        boolean offHeap = session.sessionState().conf().offHeapColumnVectorEnabled();
        return new Reader(read, whole, deleted, column, offHeap);
    }

    /** The index of COLUMN in {@code schema}, or -1. */
    private static int index(StructType schema) {
        StructField[] fields = schema.fields();
        for (int i = 0; i < fields.length; i++) {
            if (fields[i].name().equals(COLUMN)) {
                return i;
            }
        }
        return -1;
    }

    /** {@code schema} without COLUMN. */
    private static StructType without(StructType schema) {
        List<StructField> fields = new ArrayList<>();
        for (StructField field : schema.fields()) {
            if (!field.name().equals(COLUMN)) {
                fields.add(field);
            }
        }
        return new StructType(fields.toArray(new StructField[0]));
    }

    /** A file's record count and deleted positions. */
    static final class Deletes implements java.io.Serializable {
        private static final long serialVersionUID = 1L;
        final long rows;
        final RoaringBitmap positions;

        Deletes(long rows, RoaringBitmap positions) {
            this.rows = rows;
            this.positions = positions;
        }
    }

    /** {@code schema} with COLUMN replaced by the Parquet source's row index column. */
    private static StructType positions(StructType schema) {
        StructField[] fields = schema.fields().clone();
        int i = index(schema);
        if (i >= 0) {
            fields[i] = new StructField(ParquetFileFormat.ROW_INDEX_TEMPORARY_COLUMN_NAME(), DataTypes.LongType, true,
                                        Metadata.empty());
        }
        return new StructType(fields);
    }

    /** Reads one file (split) and marks or drops its deleted rows. */
    private static final class Reader extends AbstractFunction1<PartitionedFile, Iterator<InternalRow>>
            implements java.io.Serializable {
        private static final long serialVersionUID = 1L;
        private final Function1<PartitionedFile, Iterator<InternalRow>> read;
        private final Function1<PartitionedFile, Iterator<InternalRow>> whole;  // null: never counted
        private final HashMap<String, Deletes> deleted;
        private final int column;
        private final boolean offHeap;

        Reader(Function1<PartitionedFile, Iterator<InternalRow>> read, Function1<PartitionedFile, Iterator<InternalRow>> whole,
               HashMap<String, Deletes> deleted, int column, boolean offHeap) {
            this.read = read;
            this.whole = whole;
            this.deleted = deleted;
            this.column = column;
            this.offHeap = offHeap;
        }

        @Override
        public Iterator<InternalRow> apply(PartitionedFile file) {
            String path = file.urlEncodedPath();
            Deletes deletes = deleted.get(path);
            if (deletes == null) {
                throw new IllegalStateException("icecrypt: " + path
                    + " is read with a deletes filter that has no deletes planned for that file: refused");
            }
            Object rows;
            if (whole != null && file.start() == 0 && file.fileSize() > 0 && file.length() == file.fileSize()) {
                rows = new Counted(whole.apply(file), deletes, column, path, offHeap);
            } else {
                rows = new Live(read.apply(file), deletes.positions, column, path);
            }
            @SuppressWarnings("unchecked")  // Spark passes batches as rows (erased), so do these
            Iterator<InternalRow> live = (Iterator<InternalRow>) rows;
            return live;
        }
    }

    /** The batches of a whole file with COLUMN added: the running position, -1 once deleted. */
    private static final class Counted extends AbstractIterator<Object> {
        private final Iterator<InternalRow> batches;
        private final Deletes deletes;
        private final PeekableIntIterator deleted;
        private final int column;
        private final String path;
        private final boolean offHeap;
        private WritableColumnVector positions;
        private int capacity;
        private long position;
        private boolean ended;

        Counted(Iterator<InternalRow> batches, Deletes deletes, int column, String path, boolean offHeap) {
            this.batches = batches;
            this.deletes = deletes;
            this.deleted = deletes.positions.getIntIterator();
            this.column = column;
            this.path = path;
            this.offHeap = offHeap;
        }

        @Override
        public boolean hasNext() {
            if (batches.hasNext()) {
                return true;
            }
            if (!ended) {
                ended = true;
                if (position != deletes.rows) {
                    throw new IllegalStateException("icecrypt: " + path + " gave " + position
                        + " rows, its manifest entry records " + deletes.rows + ": refused");
                }
            }
            return false;
        }

        @Override
        public Object next() {
            Object item = ((Iterator<?>) batches).next();
            if (!(item instanceof ColumnarBatch)) {
                throw new IllegalStateException("icecrypt: rows instead of batches from " + path);
            }
            ColumnarBatch batch = (ColumnarBatch) item;
            int n = batch.numRows();
            reserve(n);
            for (int i = 0; i < n; i++) {
                positions.putLong(i, position + i);
            }
            markRange(positions, deleted, position, n);
            position += n;
            ColumnVector[] columns = new ColumnVector[batch.numCols() + 1];
            for (int i = 0, j = 0; i < columns.length; i++) {
                columns[i] = i == column ? positions : batch.column(j++);
            }
            return new ColumnarBatch(columns, n);
        }

        /** A vector for COLUMN of at least {@code n} rows, of the class Spark's plan expects. */
        private void reserve(int n) {
            if (positions != null && capacity >= n) {
                return;
            }
            WritableColumnVector old = positions;
            capacity = Math.max(n, 4096);
            positions = offHeap ? new OffHeapColumnVector(capacity, DataTypes.LongType)
                                : new OnHeapColumnVector(capacity, DataTypes.LongType);
            if (old != null) {
                old.close();
            } else if (TaskContext.get() != null) {
                TaskContext.get().addTaskCompletionListener(new TaskCompletionListener() {
                    @Override
                    public void onTaskCompletion(TaskContext context) {
                        if (positions != null) {
                            positions.close();
                        }
                    }
                });
            }
        }
    }

    /** The rows of one split: batches with deleted positions set to -1, or live rows only. */
    private static final class Live extends AbstractIterator<Object> {
        private final Iterator<InternalRow> rows;
        private final RoaringBitmap positions;
        private final int column;
        private final String path;
        private Object next;

        Live(Iterator<InternalRow> rows, RoaringBitmap positions, int column, String path) {
            this.rows = rows;
            this.positions = positions;
            this.column = column;
            this.path = path;
        }

        @Override
        public boolean hasNext() {
            while (next == null && rows.hasNext()) {
                Object item = ((Iterator<?>) rows).next();  // a ColumnarBatch when Spark's reader returns batches
                if (item instanceof ColumnarBatch) {
                    mark((ColumnarBatch) item);
                    next = item;
                } else {
                    InternalRow row = (InternalRow) item;
                    if (row.isNullAt(column) || row.getLong(column) < 0) {
                        throw new IllegalStateException("icecrypt: no row position for a row of " + path);
                    }
                    if (!deleted(row.getLong(column))) {
                        next = row;
                    }
                }
            }
            return next != null;
        }

        @Override
        public Object next() {
            if (!hasNext()) {
                throw new java.util.NoSuchElementException();
            }
            Object row = next;
            next = null;
            return row;
        }

        private boolean deleted(long position) {
            return position <= Integer.MAX_VALUE && positions.contains((int) position);
        }

        /** Sets the position of each deleted row of {@code batch} to -1. */
        private void mark(ColumnarBatch batch) {
            int n = batch.numRows();
            if (n == 0) {
                return;
            }
            ColumnVector vector = batch.column(column);
            if (!(vector instanceof WritableColumnVector) || vector.hasNull()) {
                throw new IllegalStateException("icecrypt: no row positions for a batch of " + path);
            }
            WritableColumnVector out = (WritableColumnVector) vector;
            long first = out.getLong(0);
            long last = out.getLong(n - 1);
            if (first < 0 || last < first) {
                throw new IllegalStateException("icecrypt: row positions out of order in a batch of " + path);
            }
            if (first > Integer.MAX_VALUE) {
                return;  // past every position the bitmap can hold
            }
            if (last - first == n - 1) {
                markRange(out, positions.getIntIterator(), first, n);  // consecutive rows: the usual batch
            } else {
                for (int i = 0; i < n; i++) {  // pages skipped inside the batch's row group
                    long position = out.getLong(i);
                    if (position < 0) {
                        throw new IllegalStateException("icecrypt: no row position for a row of " + path);
                    }
                    if (deleted(position)) {
                        out.putLong(i, -1L);
                    }
                }
            }
        }
    }

    /**
     * Sets to -1 the entries of {@code out} (rows {@code first} .. {@code first + n - 1}, in
     * order) whose positions {@code deleted} holds, visiting only those; {@code deleted} is
     * left at the first position past the range.
     */
    private static void markRange(WritableColumnVector out, PeekableIntIterator deleted, long first, int n) {
        if (first > Integer.MAX_VALUE) {
            return;  // past every position the bitmap can hold
        }
        long end = first + n;  // exclusive
        deleted.advanceIfNeeded((int) first);
        while (deleted.hasNext() && deleted.peekNext() < end) {
            out.putLong((int) (deleted.next() - first), -1L);
        }
    }

    private static byte[] decode(String encoded) {
        try {
            Inflater inflater = new Inflater();
            try {
                inflater.setInput(Base64.getDecoder().decode(encoded));
                ByteArrayOutputStream out = new ByteArrayOutputStream();
                byte[] chunk = new byte[1 << 16];
                while (!inflater.finished()) {
                    int got = inflater.inflate(chunk);
                    if (got == 0 && (inflater.needsInput() || inflater.needsDictionary())) {
                        throw new IllegalArgumentException("truncated");
                    }
                    out.write(chunk, 0, got);
                }
                return out.toByteArray();
            } finally {
                inflater.end();
            }
        } catch (IllegalArgumentException | DataFormatException e) {
            throw new IllegalArgumentException("icecrypt: malformed deletes option (" + e.getClass().getSimpleName()
                + (e.getMessage() == null ? "" : ": " + e.getMessage()) + ")", e);
        }
    }

    /** Spark's form of a file path (what a scan task names) -> its record count and deletes. */
    static HashMap<String, Deletes> parse(byte[] buffer) {
        ByteBuffer in = ByteBuffer.wrap(buffer);
        HashMap<String, Deletes> files = new HashMap<>();
        try {
            while (in.hasRemaining()) {
                byte[] name = new byte[in.getInt()];
                in.get(name);
                long rows = in.getLong();
                if (rows < 0) {
                    throw new IllegalArgumentException("record count " + rows);
                }
                int count = in.getInt();
                if (count < 0 || (long) count * 4 > in.remaining()) {
                    throw new IllegalArgumentException("position count " + count);
                }
                int[] positions = new int[count];
                long position = -1;
                for (int i = 0; i < count; i++) {
                    long delta = Integer.toUnsignedLong(in.getInt());
                    position = i == 0 ? delta : position + delta;
                    if ((i > 0 && delta == 0) || position > Integer.MAX_VALUE) {
                        throw new IllegalArgumentException("row position " + position + " out of order or range");
                    }
                    positions[i] = (int) position;
                }
                RoaringBitmap bitmap = RoaringBitmap.bitmapOf(positions);
                bitmap.runOptimize();
                // the form Spark's file scan gives a file's path (Hadoop's URI string)
                String path = new Path(new String(name, StandardCharsets.UTF_8)).toUri().toString();
                if (files.put(path, new Deletes(rows, bitmap)) != null) {
                    throw new IllegalArgumentException("file named twice");
                }
            }
        } catch (RuntimeException e) {
            throw new IllegalArgumentException("icecrypt: malformed deletes buffer (" + e.getClass().getSimpleName()
                + (e.getMessage() == null ? "" : ": " + e.getMessage()) + ")", e);
        }
        return files;
    }

    /**
     * The live rows of {@code loaded} (a read of this format): its rows with COLUMN >= 0,
     * without COLUMN; one plan, analyzed once.
     */
    public static Dataset<Row> live(Dataset<Row> loaded) {
        LogicalPlan plan = loaded.queryExecution().analyzed();
        Attribute column = null;
        List<NamedExpression> kept = new ArrayList<>();
        for (Attribute attribute : CollectionConverters.asJava(plan.output())) {
            if (attribute.name().equals(COLUMN)) {
                column = attribute;
            } else {
                kept.add(attribute);
            }
        }
        if (column == null) {
            throw new IllegalArgumentException("icecrypt: not a read of " + LiveRows.class.getName() + " (no column "
                + COLUMN + ")");
        }
        Expression live = new GreaterThanOrEqual(column, Literal.create(0L, DataTypes.LongType));
        return Dataset.ofRows(loaded.sparkSession(),
                              new Project(CollectionConverters.asScala(kept).toList(),
                                          new org.apache.spark.sql.catalyst.plans.logical.Filter(live, plan)));
    }
}
