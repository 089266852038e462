/*
 * icecrypt: a column of a batch of Spark's Parquet reader seen through the rows its file's
 * deletes leave live (the LiveRows format).
 *
 * Row i of this vector is row rows[i] of the reader's vector (row i itself when rows is
 * null: a batch with nothing deleted).  The vector is a view: it owns no memory, and the
 * reader's own vector is closed by the reader.  Structs (and the types Spark reads through
 * children: variants, intervals) get children that are views with the same rows; arrays
 * and maps come whole from the reader's vector at the mapped row.
 */
package org.icecrypt.spark;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

public final class LiveVector extends ColumnVector {
    private ColumnVector data;
    private int[] rows;  // null: the identity
    private int count;  // the rows of this view
    private LiveVector[] children = new LiveVector[0];

    LiveVector(DataType type) {
        super(type);
    }

    /** Points this view (and its children) at {@code data}, rows {@code rows[0..count)}. */
    void set(ColumnVector data, int[] rows, int count) {
        this.data = data;
        this.rows = rows;
        this.count = count;
        for (int i = 0; i < children.length; i++) {
            if (children[i] != null) {
                children[i].set(data.getChild(i), rows, count);
            }
        }
    }

    private int at(int rowId) {
        return rows == null ? rowId : rows[rowId];
    }

    @Override
    public void close() {
        // a view: the reader closes its vectors
    }

    @Override
    public boolean hasNull() {
        return data.hasNull();  // of the reader's rows: true may be said of a view without nulls
    }

    @Override
    public int numNulls() {
        if (rows == null) {
            return data.numNulls();
        }
        int nulls = 0;
        for (int i = 0; i < count; i++) {
            if (data.isNullAt(rows[i])) {
                nulls++;
            }
        }
        return nulls;
    }

    @Override
    public boolean isNullAt(int rowId) {
        return data.isNullAt(at(rowId));
    }

    @Override
    public boolean getBoolean(int rowId) {
        return data.getBoolean(at(rowId));
    }

    @Override
    public byte getByte(int rowId) {
        return data.getByte(at(rowId));
    }

    @Override
    public short getShort(int rowId) {
        return data.getShort(at(rowId));
    }

    @Override
    public int getInt(int rowId) {
        return data.getInt(at(rowId));
    }

    @Override
    public long getLong(int rowId) {
        return data.getLong(at(rowId));
    }

    @Override
    public float getFloat(int rowId) {
        return data.getFloat(at(rowId));
    }

    @Override
    public double getDouble(int rowId) {
        return data.getDouble(at(rowId));
    }

    @Override
    public ColumnarArray getArray(int rowId) {
        return data.getArray(at(rowId));
    }

    @Override
    public ColumnarMap getMap(int rowId) {
        return data.getMap(at(rowId));
    }

    @Override
    public Decimal getDecimal(int rowId, int precision, int scale) {
        return data.getDecimal(at(rowId), precision, scale);
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
        return data.getUTF8String(at(rowId));
    }

    @Override
    public byte[] getBinary(int rowId) {
        return data.getBinary(at(rowId));
    }

    @Override
    public ColumnVector getChild(int ordinal) {
        if (ordinal >= children.length) {
            children = java.util.Arrays.copyOf(children, ordinal + 1);
        }
        if (children[ordinal] == null) {
            ColumnVector child = data.getChild(ordinal);
            children[ordinal] = new LiveVector(child.dataType());
            children[ordinal].set(child, rows, count);
        }
        return children[ordinal];
    }
}
