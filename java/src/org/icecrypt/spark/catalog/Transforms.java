/*
 * icecrypt: Iceberg's partition transforms, with Iceberg's arithmetic, in the JVM.
 *
 * Two uses: the catalog's functions (years, months, days, hours, bucket, truncate, in
 * namespace system or none, as Iceberg's Spark catalog names them; beside them Iceberg's
 * iceberg_version(), here icecrypt's version: Version), which Spark calls to
 * cluster and sort a write by the table's partitioning (and which queries may call:
 * SELECT enc.system.bucket(16, id)); and the writer's partition values, computed per row
 * on the executors (Field), reported to the driver with each data file.
 *
 * The arithmetic is the Iceberg spec's, as Iceberg Java computes it:
 *   bucket[N](v)   = (murmur3_x86_32(bytes(v)) & Integer.MAX_VALUE) % N, where bytes(v) is
 *                    Iceberg's hash input: int, long, date, time, timestamp as the 8-byte
 *                    little-endian long; string as UTF-8; binary as is; decimal as its
 *                    unscaled value's minimal two's-complement big-endian bytes;
 *   truncate[W](v) = v - (((v % W) + W) % W) for int (32-bit wrapping), long and a
 *                    decimal's unscaled value; the first W code points of a string, the
 *                    first W bytes of a binary;
 *   years, months, days, hours = whole units since 1970-01-01 (00:00 UTC), rounded down.
 * Partition values go to the driver as text (Field.encode): integers in decimal, strings
 * as they are, binaries in base64, decimals as BigDecimal.toPlainString.
 */
package org.icecrypt.spark.catalog;

import java.io.Serializable;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.Arrays;
import java.util.Base64;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.functions.BoundFunction;
import org.apache.spark.sql.connector.catalog.functions.ScalarFunction;
import org.apache.spark.sql.connector.catalog.functions.UnboundFunction;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;

public final class Transforms {
    /** The catalog's functions. */
    public static final String[] FUNCTIONS = {"years", "months", "days", "hours", "bucket", "truncate",
        "iceberg_version"};

    static final long MICROS_PER_HOUR = 3_600_000_000L;
    static final long MICROS_PER_DAY = 86_400_000_000L;

    private Transforms() {
    }

    // --- the arithmetic --------------------------------------------------------------------

    /** MurmurHash3 x86 32-bit, seed 0 (Guava's murmur3_32_fixed, which Iceberg uses). */
    static int murmur3(byte[] data) {
        final int c1 = 0xcc9e2d51;
        final int c2 = 0x1b873593;
        int h1 = 0;
        int length = data.length;
        int i = 0;
        for (; i + 4 <= length; i += 4) {
            int k1 = (data[i] & 0xff) | (data[i + 1] & 0xff) << 8 | (data[i + 2] & 0xff) << 16 | (data[i + 3] & 0xff) << 24;
            k1 *= c1;
            k1 = Integer.rotateLeft(k1, 15);
            k1 *= c2;
            h1 ^= k1;
            h1 = Integer.rotateLeft(h1, 13);
            h1 = h1 * 5 + 0xe6546b64;
        }
        int k1 = 0;
        switch (length & 3) {
            case 3:
                k1 ^= (data[i + 2] & 0xff) << 16;
                // fall through
            case 2:
                k1 ^= (data[i + 1] & 0xff) << 8;
                // fall through
            case 1:
                k1 ^= data[i] & 0xff;
                k1 *= c1;
                k1 = Integer.rotateLeft(k1, 15);
                k1 *= c2;
                h1 ^= k1;
                break;
            default:
                break;
        }
        h1 ^= length;
        h1 ^= h1 >>> 16;
        h1 *= 0x85ebca6b;
        h1 ^= h1 >>> 13;
        h1 *= 0xc2b2ae35;
        h1 ^= h1 >>> 16;
        return h1;
    }

    static int hashLong(long value) {
        byte[] bytes = new byte[8];
        for (int i = 0; i < 8; i++) {
            bytes[i] = (byte) (value >>> (8 * i));
        }
        return murmur3(bytes);
    }

    /** Iceberg's bucket hash of a Spark value (internal form) of {@code type}. */
    static int hash(Object value, DataType type) {
        if (type instanceof IntegerType || type instanceof ShortType || type instanceof ByteType
                || type instanceof DateType || type instanceof LongType || type instanceof TimestampType
                || type instanceof TimestampNTZType) {
            return hashLong(((Number) value).longValue());
        }
        if (type instanceof StringType) {
            return murmur3(((UTF8String) value).getBytes());
        }
        if (type instanceof BinaryType) {
            return murmur3((byte[]) value);
        }
        if (type instanceof DecimalType) {
            return murmur3(((Decimal) value).toJavaBigDecimal().unscaledValue().toByteArray());
        }
        throw new UnsupportedOperationException("icecrypt: bucket does not apply to " + type.simpleString());
    }

    static int bucket(Object value, DataType type, int buckets) {
        return (hash(value, type) & Integer.MAX_VALUE) % buckets;
    }

    /** truncate[width] of a Spark value (internal form), as the same type. */
    static Object truncate(Object value, DataType type, int width) {
        if (type instanceof IntegerType || type instanceof ShortType || type instanceof ByteType) {
            int v = ((Number) value).intValue();
            int truncated = v - (((v % width) + width) % width);
            return type instanceof IntegerType ? (Object) truncated
                : type instanceof ShortType ? (Object) (short) truncated : (Object) (byte) truncated;
        }
        if (type instanceof LongType) {
            long v = (Long) value;
            return v - (((v % width) + width) % width);
        }
        if (type instanceof DecimalType) {
            DecimalType decimal = (DecimalType) type;
            BigDecimal v = ((Decimal) value).toJavaBigDecimal();
            BigInteger w = BigInteger.valueOf(width);
            BigInteger unscaled = v.unscaledValue();
            BigInteger remainder = unscaled.remainder(w).add(w).remainder(w);
            return Decimal.apply(new BigDecimal(unscaled.subtract(remainder), v.scale()), decimal.precision(),
                                 decimal.scale());
        }
        if (type instanceof StringType) {
            String s = ((UTF8String) value).toString();
            if (s.codePointCount(0, s.length()) <= width) {
                return value;
            }
            return UTF8String.fromString(s.substring(0, s.offsetByCodePoints(0, width)));
        }
        if (type instanceof BinaryType) {
            byte[] bytes = (byte[]) value;
            return bytes.length <= width ? bytes : Arrays.copyOf(bytes, width);
        }
        throw new UnsupportedOperationException("icecrypt: truncate does not apply to " + type.simpleString());
    }

    private static LocalDate date(Object value, DataType type) {
        if (type instanceof DateType) {
            return LocalDate.ofEpochDay((Integer) value);
        }
        return LocalDate.ofEpochDay(Math.floorDiv((Long) value, MICROS_PER_DAY));
    }

    static int years(Object value, DataType type) {
        return date(value, type).getYear() - 1970;
    }

    static int months(Object value, DataType type) {
        LocalDate date = date(value, type);
        return (date.getYear() - 1970) * 12 + date.getMonthValue() - 1;
    }

    static int days(Object value, DataType type) {
        return type instanceof DateType ? (Integer) value : (int) Math.floorDiv((Long) value, MICROS_PER_DAY);
    }

    static int hours(Object value, DataType type) {
        return (int) Math.floorDiv((Long) value, MICROS_PER_HOUR);
    }

    private static boolean time(DataType type) {
        return type instanceof DateType || type instanceof TimestampType || type instanceof TimestampNTZType;
    }

    private static boolean timestamp(DataType type) {
        return type instanceof TimestampType || type instanceof TimestampNTZType;
    }

    private static boolean truncatable(DataType type) {
        return type instanceof IntegerType || type instanceof ShortType || type instanceof ByteType
            || type instanceof LongType || type instanceof DecimalType || type instanceof StringType
            || type instanceof BinaryType;
    }

    private static boolean bucketable(DataType type) {
        return truncatable(type) || time(type);
    }

    // --- the catalog's functions -------------------------------------------------------------

    /** The function {@code name}, or null. */
    public static UnboundFunction function(String name) {
        String lower = name.toLowerCase(java.util.Locale.ROOT);
        if (lower.equals("iceberg_version")) {
            return new Version();
        }
        for (String known : FUNCTIONS) {
            if (known.equals(lower)) {
                return new Unbound(known);
            }
        }
        return null;
    }

    private static final class Unbound implements UnboundFunction {
        private static final long serialVersionUID = 1L;
        private final String name;

        Unbound(String name) {
            this.name = name;
        }

        @Override
        public String name() {
            return name;
        }

        @Override
        public String description() {
            switch (name) {
                case "bucket":
                    return "bucket(N, value): Iceberg's bucket transform (murmur3 hash mod N)";
                case "truncate":
                    return "truncate(W, value): Iceberg's truncate transform";
                default:
                    return name + "(value): Iceberg's " + name + " transform (whole " + name + " since 1970-01-01)";
            }
        }

        @Override
        public BoundFunction bind(StructType input) {
            StructField[] fields = input.fields();
            boolean parameterized = name.equals("bucket") || name.equals("truncate");
            int arity = parameterized ? 2 : 1;
            if (fields.length != arity) {
                throw new UnsupportedOperationException("icecrypt: " + name + " takes " + arity + " argument"
                    + (arity == 1 ? "" : "s") + ", not " + fields.length + ": " + description());
            }
            DataType source = fields[arity - 1].dataType();
            if (parameterized && !(fields[0].dataType() instanceof IntegerType || fields[0].dataType() instanceof ShortType
                    || fields[0].dataType() instanceof ByteType || fields[0].dataType() instanceof LongType)) {
                throw new UnsupportedOperationException("icecrypt: " + name + "'s first argument is an integer "
                    + "constant: " + description());
            }
            boolean ok;
            DataType result;
            switch (name) {
                case "bucket":
                    ok = bucketable(source);
                    result = DataTypes.IntegerType;
                    break;
                case "truncate":
                    ok = truncatable(source);
                    result = source;
                    break;
                case "hours":
                    ok = timestamp(source);
                    result = DataTypes.IntegerType;
                    break;
                case "days":
                    ok = time(source);
                    result = DataTypes.DateType;
                    break;
                default:
                    ok = time(source);
                    result = DataTypes.IntegerType;
                    break;
            }
            if (!ok) {
                throw new UnsupportedOperationException("icecrypt: " + name + " does not apply to "
                    + source.simpleString());
            }
            DataType[] inputs = new DataType[arity];
            for (int i = 0; i < arity; i++) {
                inputs[i] = fields[i].dataType();
            }
            return new Bound(name, inputs, result);
        }
    }

    private static final class Bound implements ScalarFunction<Object> {
        private static final long serialVersionUID = 1L;
        private final String name;
        private final DataType[] inputs;
        private final DataType result;

        Bound(String name, DataType[] inputs, DataType result) {
            this.name = name;
            this.inputs = inputs;
            this.result = result;
        }

        @Override
        public String name() {
            return name;
        }

        @Override
        public String canonicalName() {
            return "icecrypt." + name + "(" + inputs[inputs.length - 1].catalogString() + ")";
        }

        @Override
        public DataType[] inputTypes() {
            return inputs;
        }

        @Override
        public DataType resultType() {
            return result;
        }

        @Override
        public Object produceResult(InternalRow input) {
            int at = inputs.length - 1;
            if (input.isNullAt(at)) {
                return null;
            }
            DataType type = inputs[at];
            Object value = input.get(at, type);
            switch (name) {
                case "bucket":
                case "truncate": {
                    if (input.isNullAt(0)) {
                        return null;
                    }
                    long parameter = ((Number) input.get(0, inputs[0])).longValue();
                    if (parameter <= 0 || parameter > Integer.MAX_VALUE) {
                        throw new IllegalArgumentException("icecrypt: " + name + " needs a positive width, not "
                            + parameter);
                    }
                    return name.equals("bucket") ? (Object) bucket(value, type, (int) parameter)
                        : truncate(value, type, (int) parameter);
                }
                case "years":
                    return years(value, type);
                case "months":
                    return months(value, type);
                case "days":
                    return days(value, type);
                default:
                    return hours(value, type);
            }
        }
    }

    /**
     * iceberg_version(): the version of the runtime that serves the catalog.  Iceberg's Spark
     * runtime answers with its own release; this catalog's runtime is icecrypt, so the answer
     * is "icecrypt " and the version the jar was built for (its manifest's
     * Implementation-Version, written by scripts/build-jar.sh from the package's version),
     * never a number that could be taken for an Iceberg Java release.
     */
    static final class Version implements UnboundFunction, ScalarFunction<UTF8String> {
        private static final long serialVersionUID = 1L;

        static String text() {
            String version = Transforms.class.getPackage().getImplementationVersion();
            return "icecrypt " + (version == null ? "(unknown version)" : version);
        }

        @Override
        public String name() {
            return "iceberg_version";
        }

        @Override
        public String description() {
            return "iceberg_version(): the catalog's runtime and its version (" + text() + ")";
        }

        @Override
        public BoundFunction bind(StructType input) {
            if (input.fields().length != 0) {
                throw new UnsupportedOperationException("icecrypt: iceberg_version takes no arguments, not "
                    + input.fields().length);
            }
            return this;
        }

        @Override
        public DataType[] inputTypes() {
            return new DataType[0];
        }

        @Override
        public DataType resultType() {
            return DataTypes.StringType;
        }

        @Override
        public boolean isResultNullable() {
            return false;
        }

        @Override
        public String canonicalName() {
            return "icecrypt.iceberg_version";
        }

        @Override
        public UTF8String produceResult(InternalRow input) {
            return UTF8String.fromString(text());
        }
    }

    // --- the writer's partition values ---------------------------------------------------------

    /** One partition field of the spec a write writes: how a row's value is found and transformed. */
    static final class Field implements Serializable {
        private static final long serialVersionUID = 1L;
        final String name;
        final String transform;  // identity, bucket, truncate, years, months, days, hours, void
        final int parameter;
        final int[] path;  // ordinals from the row to the source value
        final int[] widths;  // field counts of the structs along the path
        final DataType source;  // the source value's Spark type

        Field(String name, String transform, int parameter, int[] path, int[] widths, DataType source) {
            this.name = name;
            this.transform = transform;
            this.parameter = parameter;
            this.path = path;
            this.widths = widths;
            this.source = source;
        }

        /** The transformed value of {@code row}'s source value (null for null). */
        Object apply(InternalRow row) {
            InternalRow at = row;
            for (int i = 0; i < path.length - 1; i++) {
                if (at.isNullAt(path[i])) {
                    return null;
                }
                at = at.getStruct(path[i], widths[i + 1]);
            }
            int last = path[path.length - 1];
            if (at.isNullAt(last) || transform.equals("void")) {
                return null;
            }
            Object value = at.get(last, source);
            switch (transform) {
                case "identity":
                    return value instanceof byte[] ? ((byte[]) value).clone() : value instanceof UTF8String
                        ? ((UTF8String) value).clone() : value;
                case "bucket":
                    return bucket(value, source, parameter);
                case "truncate": {
                    Object truncated = truncate(value, source, parameter);
                    return truncated instanceof UTF8String ? ((UTF8String) truncated).clone() : truncated;
                }
                case "years":
                    return years(value, source);
                case "months":
                    return months(value, source);
                case "days":
                    return days(value, source);
                case "hours":
                    return hours(value, source);
                default:
                    throw new UnsupportedOperationException("icecrypt: partition transform " + transform);
            }
        }

        /** The driver's form of a transformed value (see the header); null for null. */
        String encode(Object value) {
            if (value == null) {
                return null;
            }
            if (value instanceof byte[]) {
                return Base64.getEncoder().encodeToString((byte[]) value);
            }
            if (value instanceof Decimal) {
                return ((Decimal) value).toJavaBigDecimal().toPlainString();
            }
            return value.toString();
        }

        /** Iceberg's human string of a transformed value (the partition directory's value). */
        String human(Object value) {
            if (value == null) {
                return "null";
            }
            switch (transform) {
                case "years":
                    return String.format("%04d", 1970 + (Integer) value);
                case "months": {
                    int months = (Integer) value;
                    return String.format("%04d-%02d", 1970 + Math.floorDiv(months, 12), 1 + Math.floorMod(months, 12));
                }
                case "days":
                    return LocalDate.ofEpochDay((Integer) value).toString();
                case "hours": {
                    LocalDateTime time = LocalDateTime.ofEpochSecond((long) (Integer) value * 3600, 0, ZoneOffset.UTC);
                    return String.format("%s-%02d", time.toLocalDate(), time.getHour());
                }
                case "bucket":
                    return value.toString();
                default:
                    break;
            }
            if (value instanceof byte[]) {
                return Base64.getEncoder().encodeToString((byte[]) value);
            }
            if (value instanceof Decimal) {
                return ((Decimal) value).toJavaBigDecimal().toString();
            }
            if (source instanceof DateType) {
                return LocalDate.ofEpochDay((Integer) value).toString();
            }
            if (source instanceof TimestampType || source instanceof TimestampNTZType) {
                long micros = (Long) value;
                LocalDateTime time = LocalDateTime.ofEpochSecond(Math.floorDiv(micros, 1_000_000L),
                    (int) Math.floorMod(micros, 1_000_000L) * 1000, ZoneOffset.UTC);
                // as Iceberg's DateTimeUtil.microsToIsoTimestamp(tz): seconds always, "+00:00" for UTC
                String local = DateTimeFormatter.ISO_LOCAL_DATE_TIME.format(time);
                return source instanceof TimestampType ? local + "+00:00" : local;
            }
            if (source instanceof BooleanType || source instanceof FloatType || source instanceof DoubleType) {
                return value.toString();
            }
            return value.toString();
        }

        /**
         * {@code name=value}, URL-encoded as Iceberg Java's {@code partitionToPath} names partition
         * directories: a separator in a value is {@code %2F} / {@code %5C}, a character of the
         * directory's name (icecrypt's path rules take it as such and never as a way out).
         */
        String directory(Object value) {
            return URLEncoder.encode(name, StandardCharsets.UTF_8) + "="
                + URLEncoder.encode(human(value), StandardCharsets.UTF_8);
        }
    }
}
