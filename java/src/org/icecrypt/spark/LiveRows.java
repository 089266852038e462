/*
 * icecrypt: the row filter that applies an Iceberg table's position deletes (deletion
 * vectors and position delete files) on Spark's own Parquet reader.
 *
 * The driver (icecrypt.spark._native) reads each data file's deletes as a sorted list of
 * deleted row positions and hands them here in one buffer:
 *
 *   buffer = file*
 *   file   = int32 path length, path (UTF-8), int32 n, n x int64 position   (big-endian)
 *
 * The filter is a Spark UDF on the Parquet source's _metadata.row_index column, placed
 * directly on the scan: it keeps a row unless its position is deleted in the file being
 * read, which it takes, as input_file_name() does, from the file the scan task has open.
 * A row of a file the buffer does not name fails the task (never kept unfiltered).
 * Positions are not secret; no key passes through here.
 */
package org.icecrypt.spark;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;

import org.apache.hadoop.fs.Path;
import org.apache.spark.rdd.InputFileBlockHolder;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;
import org.roaringbitmap.RoaringBitmap;

public final class LiveRows implements UDF1<Long, Boolean> {
    private static final long serialVersionUID = 1L;

    /** Spark's form of a file path (what the scan reports) -> its deleted positions. */
    private final HashMap<String, RoaringBitmap> deleted;

    /** The file of the previous row and its positions (one object: a racing reader sees a pair). */
    private transient volatile Current current;

    private static final class Current {
        final UTF8String path;
        final RoaringBitmap positions;

        Current(UTF8String path, RoaringBitmap positions) {
            this.path = path;
            this.positions = positions;
        }
    }

    LiveRows(byte[] buffer) {
        deleted = parse(buffer);
    }

    /** The filter column (true: keep the row) for the files and positions in {@code buffer}. */
    public static Column filter(byte[] buffer) {
        return functions.udf(new LiveRows(buffer), DataTypes.BooleanType).withName("icecrypt_live_row")
            .apply(functions.col("_metadata.row_index"));
    }

    @Override
    public Boolean call(Long position) {
        UTF8String path = InputFileBlockHolder.getInputFilePath();
        Current now = current;
        if (now == null || now.path != path) {
            RoaringBitmap positions = deleted.get(path.toString());
            if (positions == null) {
                throw new IllegalStateException("icecrypt: a row of " + (path.numBytes() == 0 ? "an unknown file" : path)
                    + " reached the deletes filter, which has no deletes planned for that file: refused");
            }
            now = new Current(path, positions);
            current = now;
        }
        if (position == null || position < 0) {
            throw new IllegalStateException("icecrypt: no row position for a row of " + path);
        }
        return position > Integer.MAX_VALUE || !now.positions.contains(position.intValue());
    }

    private static HashMap<String, RoaringBitmap> parse(byte[] buffer) {
        ByteBuffer in = ByteBuffer.wrap(buffer);
        HashMap<String, RoaringBitmap> files = new HashMap<>();
        try {
            while (in.hasRemaining()) {
                byte[] name = new byte[in.getInt()];
                in.get(name);
                int count = in.getInt();
                if (count < 0 || (long) count * 8 > in.remaining()) {
                    throw new IllegalArgumentException("position count " + count);
                }
                RoaringBitmap positions = new RoaringBitmap();
                for (int i = 0; i < count; i++) {
                    long position = in.getLong();
                    if (position < 0 || position > Integer.MAX_VALUE) {
                        throw new IllegalArgumentException("row position " + position + " out of range");
                    }
                    positions.add((int) position);
                }
                positions.runOptimize();
                // the form Spark's file scan gives a file's path (Hadoop's URI string)
                String path = new Path(new String(name, StandardCharsets.UTF_8)).toUri().toString();
                if (files.put(path, positions) != null) {
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
