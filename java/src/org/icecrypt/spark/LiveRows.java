/*
 * icecrypt: Spark's Parquet file format with an Iceberg table's position deletes (deletion
 * vectors and position delete files) applied inside the scan.
 *
 * The driver (icecrypt.spark._native) reads each data file's deletes as a sorted list of
 * deleted row positions and hands them to the read in its option DELETES:
 *
 *   option = base64(buffer)
 *   buffer = file*
 *   file   = int32 path length, path (UTF-8), int64 rows, int32 n, int32 m,
 *            n x uint8 delta, m x uint32 wide delta
 *
 * (big-endian) where rows is the file's record count and the n deltas are the differences
 * of the sorted positions (the first from 0); a delta of 255 or more is written as the byte
 * 255 and taken, in order, from the m wide deltas.
 *
 * The rows this format gives are the live rows only.  A batch of Spark's vectorized reader
 * comes out as a batch of LiveVector views whose row i is the i-th live row of the reader's
 * batch (vectorTypes names that class, so Spark's generated code reads the views
 * directly); nothing is copied and no filter is planned above the scan.  Row by row (when
 * Spark's reader does not return batches) deleted rows are dropped.  Which rows of a batch
 * are deleted comes from one of two places:
 *
 * - counted: a task that reads a whole file in batches with no filter pushed into Parquet
 *   gets every row of it, in order, so a row's position is a running count; at the end the
 *   count must be the file's record count, or the task fails;
 * - otherwise (a split of a file, pushed filters that may skip row groups or pages, rows
 *   instead of batches): parquet-java's row index, the one Spark's _metadata.row_index
 *   reads, requested as one more column and left out of the rows given.
 *
 * Spark's vectorized reader, its column pruning and pushed filters work as for plain Parquet.
 * Fails closed: a file the option does not name fails its task (never read unfiltered), as
 * do a malformed option, a row without its position and a count that is not the record
 * count.  Positions are not secret; no key passes through here.
 */
package org.icecrypt.spark;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection$;
import org.apache.spark.sql.execution.datasources.FileFormat$;
import org.apache.spark.sql.execution.datasources.PartitionedFile;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.internal.SQLConf;
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
import scala.Option;
import scala.collection.AbstractIterator;
import scala.collection.Iterator;
import scala.collection.immutable.Map;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;

public class LiveRows extends ParquetFileFormat {
    private static final long serialVersionUID = 1L;

    /** The read option holding the deleted positions (see the header). */
    public static final String DELETES = "icecrypt.deletes";
    /** The column Spark's Parquet reader fills with parquet-java's row index. */
    private static final String ROW_INDEX = ParquetFileFormat.ROW_INDEX_TEMPORARY_COLUMN_NAME();

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

    /** Every column of a batch is a LiveVector (a view of the reader's vector). */
    @Override
    public Option<Seq<String>> vectorTypes(StructType requiredSchema, StructType partitionSchema, SQLConf conf) {
        List<String> types = Collections.nCopies(requiredSchema.length() + partitionSchema.length(),
                                                 LiveVector.class.getName());
        return Option.apply(CollectionConverters.asScala(types).toSeq());
    }

    @Override
    public Function1<PartitionedFile, Iterator<InternalRow>> buildReaderWithPartitionValues(
            SparkSession session, StructType dataSchema, StructType partitionSchema, StructType requiredSchema,
            Seq<Filter> filters, Map<String, String> options, Configuration hadoopConf) {
        scala.Option<String> encoded = options.get(DELETES);
        if (encoded.isEmpty()) {
            throw new IllegalArgumentException("icecrypt: a read of " + getClass().getName() + " without option " + DELETES);
        }
        if (index(dataSchema, ROW_INDEX) >= 0) {
            throw new IllegalArgumentException("icecrypt: a read of " + getClass().getName() + " with a column named "
                + ROW_INDEX + " (where Spark's reader puts the row position): refused");
        }
        HashMap<String, Deletes> deleted = parse(decode(encoded.get()));
        // the row index: asked for here, unless the read asks for it (_metadata.row_index)
        int column = index(requiredSchema, ROW_INDEX);
        boolean own = column < 0;
        StructType indexed = requiredSchema;
        if (own) {
            column = requiredSchema.length();
            indexed = requiredSchema.add(new StructField(ROW_INDEX, DataTypes.LongType, true, Metadata.empty()));
        }
        Function1<PartitionedFile, Iterator<InternalRow>> read = super.buildReaderWithPartitionValues(
            session, dataSchema, partitionSchema, indexed, filters, options, new Configuration(hadoopConf));
        // whole files in batches, nothing pushed: also a reader without the row index, counted.
        // Each reader gets its own copy of the configuration: Spark's reader sets the schema
        // it reads there, and a local session's broadcast holds the object, not a copy
        Function1<PartitionedFile, Iterator<InternalRow>> whole = null;
        if (filters.isEmpty() && "true".equals(options.get(FileFormat$.MODULE$.OPTION_RETURNING_BATCH()).getOrElse(() -> ""))) {
            whole = super.buildReaderWithPartitionValues(
                session, dataSchema, partitionSchema, requiredSchema, filters, options, new Configuration(hadoopConf));
        }
        List<StructField> fields = new ArrayList<>(java.util.Arrays.asList(indexed.fields()));
        fields.addAll(java.util.Arrays.asList(partitionSchema.fields()));
        StructType output = new StructType(fields.toArray(new StructField[0]));
        return new Reader(read, whole, deleted, column, own ? column : -1, output);
    }

    /** The index of the field {@code name} in {@code schema}, or -1. */
    private static int index(StructType schema, String name) {
        StructField[] fields = schema.fields();
        for (int i = 0; i < fields.length; i++) {
            if (fields[i].name().equals(name)) {
                return i;
            }
        }
        return -1;
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

    /** Reads one file (split) and gives its live rows. */
    private static final class Reader extends AbstractFunction1<PartitionedFile, Iterator<InternalRow>>
            implements java.io.Serializable {
        private static final long serialVersionUID = 1L;
        private final Function1<PartitionedFile, Iterator<InternalRow>> read;
        private final Function1<PartitionedFile, Iterator<InternalRow>> whole;  // null: never counted
        private final HashMap<String, Deletes> deleted;
        private final int column;  // of the row index in read's rows
        private final int dropped;  // the row index's column when it is not given (-1: it is)
        private final StructType output;  // of read's rows

        Reader(Function1<PartitionedFile, Iterator<InternalRow>> read, Function1<PartitionedFile, Iterator<InternalRow>> whole,
               HashMap<String, Deletes> deleted, int column, int dropped, StructType output) {
            this.read = read;
            this.whole = whole;
            this.deleted = deleted;
            this.column = column;
            this.dropped = dropped;
            this.output = output;
        }

        @Override
        public Iterator<InternalRow> apply(PartitionedFile file) {
            String path = file.urlEncodedPath();
            Deletes deletes = deleted.get(path);
            if (deletes == null) {
                throw new IllegalStateException("icecrypt: " + path
                    + " is read through LiveRows, whose option has no deletes planned for that file: refused");
            }
            Object rows;
            if (whole != null && file.start() == 0 && file.fileSize() > 0 && file.length() == file.fileSize()) {
                rows = new Counted(whole.apply(file), deletes, path);
            } else {
                rows = new Indexed(read.apply(file), deletes.positions, column, dropped, output, path);
            }
            @SuppressWarnings("unchecked")  // Spark passes batches as rows (erased), so do these
            Iterator<InternalRow> live = (Iterator<InternalRow>) rows;
            return live;
        }
    }

    /** A batch of views of the live rows of the reader's batches, reused batch after batch. */
    private static final class Views {
        private LiveVector[] vectors;
        private ColumnarBatch batch;
        private int[] rows = new int[0];

        /** Room for the live rows of a batch of {@code n}. */
        int[] rows(int n) {
            if (rows.length < n) {
                rows = new int[Math.max(n, 4096)];
            }
            return rows;
        }

        /**
         * {@code batch} without its column {@code skip} (-1: none), as its {@code live} rows
         * {@code rows[0..live)}; all of its rows, in order, when {@code live} is its size.
         */
        ColumnarBatch of(ColumnarBatch in, int skip, int live) {
            int n = in.numRows();
            if (vectors == null) {
                vectors = new LiveVector[in.numCols() - (skip < 0 ? 0 : 1)];
                for (int i = 0, j = 0; i < in.numCols(); i++) {
                    if (i != skip) {
                        vectors[j++] = new LiveVector(in.column(i).dataType());
                    }
                }
                batch = new ColumnarBatch(vectors);
            }
            int[] mapping = live == n ? null : rows;
            for (int i = 0, j = 0; i < in.numCols(); i++) {
                if (i != skip) {
                    vectors[j++].set(in.column(i), mapping, live);
                }
            }
            batch.setNumRows(live);
            return batch;
        }
    }

    /** The live rows of a whole file read in batches, positions counted. */
    private static final class Counted extends AbstractIterator<Object> {
        private final Iterator<InternalRow> batches;
        private final Deletes deletes;
        private final PeekableIntIterator deleted;
        private final String path;
        private final Views views = new Views();
        private long position;
        private boolean ended;

        Counted(Iterator<InternalRow> batches, Deletes deletes, String path) {
            this.batches = batches;
            this.deletes = deletes;
            this.deleted = deletes.positions.getIntIterator();
            this.path = path;
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
            int live = liveRange(deleted, position, n, views.rows(n));
            position += n;
            return views.of(batch, -1, live);
        }
    }

    /** The live rows of one split, by parquet-java's row index: batches of views, or rows. */
    private static final class Indexed extends AbstractIterator<Object> {
        private final Iterator<InternalRow> rows;
        private final RoaringBitmap positions;
        private final int column;
        private final int dropped;
        private final StructType output;
        private final String path;
        private final Views views = new Views();
        private UnsafeProjection projection;  // rows without the row index
        private Object next;

        Indexed(Iterator<InternalRow> rows, RoaringBitmap positions, int column, int dropped, StructType output,
                String path) {
            this.rows = rows;
            this.positions = positions;
            this.column = column;
            this.dropped = dropped;
            this.output = output;
            this.path = path;
        }

        @Override
        public boolean hasNext() {
            while (next == null && rows.hasNext()) {
                Object item = ((Iterator<?>) rows).next();  // a ColumnarBatch when Spark's reader returns batches
                if (item instanceof ColumnarBatch) {
                    next = live((ColumnarBatch) item);
                } else {
                    InternalRow row = (InternalRow) item;
                    if (row.isNullAt(column) || row.getLong(column) < 0) {
                        throw new IllegalStateException("icecrypt: no row position for a row of " + path);
                    }
                    if (!deleted(row.getLong(column))) {
                        next = dropped < 0 ? row : project(row);
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

        private InternalRow project(InternalRow row) {
            if (projection == null) {
                List<Expression> kept = new ArrayList<>();
                StructField[] fields = output.fields();
                for (int i = 0; i < fields.length; i++) {
                    if (i != dropped) {
                        kept.add(new BoundReference(i, fields[i].dataType(), fields[i].nullable()));
                    }
                }
                projection = UnsafeProjection$.MODULE$.create(CollectionConverters.asScala(kept).toSeq());
            }
            return projection.apply(row);
        }

        /** The live rows of {@code batch}, by the positions in its row index column. */
        private ColumnarBatch live(ColumnarBatch batch) {
            int n = batch.numRows();
            int[] rows = views.rows(n);
            if (n == 0) {
                return views.of(batch, dropped, 0);
            }
            ColumnVector index = batch.column(column);
            if (index.hasNull()) {
                throw new IllegalStateException("icecrypt: no row positions for a batch of " + path);
            }
            long first = index.getLong(0);
            long last = index.getLong(n - 1);
            if (first < 0 || last < first) {
                throw new IllegalStateException("icecrypt: row positions out of order in a batch of " + path);
            }
            int live;
            if (last - first == n - 1) {  // consecutive rows: the usual batch
                live = liveRange(positions.getIntIterator(), first, n, rows);
            } else {  // pages skipped inside the batch's row group
                live = 0;
                for (int i = 0; i < n; i++) {
                    long position = index.getLong(i);
                    if (position < 0) {
                        throw new IllegalStateException("icecrypt: no row position for a row of " + path);
                    }
                    if (!deleted(position)) {
                        rows[live++] = i;
                    }
                }
            }
            return views.of(batch, dropped, live);
        }
    }

    /**
     * Of {@code n} consecutive rows from position {@code first}: the offsets of those
     * {@code deleted} does not hold, in {@code rows}; returns how many (n: none deleted,
     * {@code rows} untouched).  Visits only the deleted positions in the range and leaves
     * {@code deleted} at the first one past it.
     */
    static int liveRange(PeekableIntIterator deleted, long first, int n, int[] rows) {
        if (first > Integer.MAX_VALUE) {
            return n;  // past every position the bitmap can hold
        }
        long end = first + n;  // exclusive
        deleted.advanceIfNeeded((int) first);
        if (!deleted.hasNext() || deleted.peekNext() >= end) {
            return n;
        }
        int live = 0;
        int from = 0;
        while (deleted.hasNext() && deleted.peekNext() < end) {
            int gone = (int) (deleted.next() - first);
            for (int i = from; i < gone; i++) {
                rows[live++] = i;
            }
            from = gone + 1;
        }
        for (int i = from; i < n; i++) {
            rows[live++] = i;
        }
        return live;
    }

    private static byte[] decode(String encoded) {
        try {
            return Base64.getDecoder().decode(encoded);
        } catch (IllegalArgumentException e) {
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
                int wide = in.getInt();
                if (count < 0 || wide < 0 || wide > count || count + 4L * wide > in.remaining()) {
                    throw new IllegalArgumentException("position counts " + count + ", " + wide);
                }
                int narrow = in.position();
                int next = narrow + count;  // the next wide delta
                int[] positions = new int[count];
                long position = 0;
                for (int i = 0; i < count; i++) {
                    int small = in.get(narrow + i) & 0xff;
                    long delta = small;
                    if (small == 255) {
                        if (next >= narrow + count + 4L * wide) {
                            throw new IllegalArgumentException("more wide deltas than " + wide);
                        }
                        delta = Integer.toUnsignedLong(in.getInt(next));
                        next += 4;
                    }
                    position += delta;
                    if ((i > 0 && delta == 0) || position > Integer.MAX_VALUE) {
                        throw new IllegalArgumentException("row position " + position + " out of order or range");
                    }
                    positions[i] = (int) position;
                }
                if (next != narrow + count + 4 * wide) {
                    throw new IllegalArgumentException("fewer wide deltas than " + wide);
                }
                in.position(next);
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
}
