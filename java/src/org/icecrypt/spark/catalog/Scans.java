/*
 * icecrypt: the SQL catalog's scans, read by Spark's own Parquet reader.
 *
 * build() asks the Python driver to plan the scan once: the snapshot the table was
 * loaded at, the pushed predicates as an Iceberg row filter (manifests and files pruned
 * by partition values and column statistics), every data file with its size, record
 * count and whether it has deletes.  The driver reads the deletes (deletion vectors,
 * position deletes) as sorted row positions, and leaves the planned files' keys (DEK and
 * AAD prefix) with Keys: they go into the scan's Hadoop configuration (FileKeys'
 * icecrypt.secret.file-keys, a name Spark redacts), which Spark's Parquet reader
 * function broadcasts to the executors as it does for every file scan.  No key is in
 * the Scan's description, the table's properties or the options EXPLAIN shows.
 *
 * Each task reads its files with ParquetFileFormat's reader (vectorized, column pruning,
 * the pushed filters on columns whose name no schema change reused) or, for files with
 * deletes, LiveRows' (the same reader giving only the live rows); FileDecryption gives
 * parquet-java each encrypted file's keys.  Columns are matched by Iceberg field id
 * (parquet.field.id in the read schema; spark.sql.parquet.fieldId.read.enabled is
 * turned on for the session, as the native read does), or in a table with a name
 * mapping by name (Lineage).  Predicates are also evaluated by
 * Spark after the scan: pruning only ever drops files and row groups that cannot match.
 *
 * The scan keeps what it planned (files, snapshot) for row-level operations to build on.
 *
 * The metadata column _file (IcebergTable.metadataColumns) is each file's location as the
 * table records it, given to Spark's reader as a partition value of the file; _pos is the
 * row index Spark's reader gives, and the row lineage columns are computed from what the
 * file stores (Lineage).  The scan
 * of a copy-on-write operation is runtime-filterable on it (CopyOnWriteScan): Spark's
 * group filter (RowLevelOperationRuntimeGroupFiltering) first finds the files that hold
 * rows the statement's condition matches, and the operation then reads and replaces
 * those files only, as Iceberg's copy-on-write scan does.
 */
package org.icecrypt.spark.catalog;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.paths.SparkPath;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.Literal;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.Statistics;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.SupportsPushDownV2Filters;
import org.apache.spark.sql.connector.read.SupportsReportStatistics;
import org.apache.spark.sql.connector.read.SupportsRuntimeV2Filtering;
import org.apache.spark.sql.execution.datasources.FileFormat$;
import org.apache.spark.sql.execution.datasources.PartitionedFile;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.internal.connector.PredicateUtils;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

import org.icecrypt.spark.LiveRows;

import scala.Function1;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

final class Scans {
    static final String FIELD_ID = "parquet.field.id";
    static final String UNREADABLE = "icecrypt.unreadable";
    static final String FIELD_ID_READ = "spark.sql.parquet.fieldId.read.enabled";
    static final String FIELD_ID_IGNORE_MISSING = "spark.sql.parquet.fieldId.read.ignoreMissing";
    static final String FACTORY_PROPERTY = "parquet.crypto.factory.class";
    static final String DECRYPTION_CLASS = "org.icecrypt.spark.FileDecryption";
    static final String KEYS_PROPERTY = "icecrypt.secret.file-keys";
    static final String READ_ID_PROPERTY = "icecrypt.read-id";
    /** The metadata column of a row's data file (its location as the table records it). */
    static final String FILE_COLUMN = "_file";
    /** The metadata column of a row's position in its data file. */
    static final String POS_COLUMN = "_pos";
    /** The metadata columns of a row's data file's partition spec id and partition (every spec's fields). */
    static final String SPEC_ID_COLUMN = "_spec_id";
    static final String PARTITION_COLUMN = "_partition";
    /** The row lineage metadata columns (format version 3), as Iceberg names them. */
    static final String ROW_ID_COLUMN = "_row_id";
    static final String SEQUENCE_COLUMN = "_last_updated_sequence_number";
    /** Iceberg's _deleted: asked for, the scan gives every row of its files, deleted ones marked true. */
    static final String DELETED_COLUMN = "_deleted";
    /** Their reserved Iceberg field ids: how they are stored in a data file (Lineage). */
    static final int ROW_ID_FIELD_ID = 2147483540;
    static final int SEQUENCE_FIELD_ID = 2147483539;
    /** Where Spark's Parquet reader puts a row's position (in the schema it is asked to read). */
    static final String ROW_INDEX = ParquetFileFormat.ROW_INDEX_TEMPORARY_COLUMN_NAME();

    private Scans() {
    }

    /** Collects the pushed predicates and the columns read; build() plans. */
    static final class Builder implements org.apache.spark.sql.connector.read.ScanBuilder, SupportsPushDownV2Filters,
            SupportsPushDownRequiredColumns {
        private final IcebergTable table;
        private final CaseInsensitiveStringMap options;
        private final List<Predicate> pushed = new ArrayList<>();
        private final boolean wholeFiles;
        private final java.util.function.Consumer<IcebergScan> built;
        private StructType required;

        Builder(IcebergTable table, CaseInsensitiveStringMap options) {
            this(table, options, false, null);
        }

        /**
         * {@code wholeFiles}: the scan of a copy-on-write row-level operation, which rewrites
         * every file it reads: the predicates prune files only, never rows or row groups
         * inside a file (what Spark's rewrite does not see would be lost).  {@code built}
         * is told the scan (the operation's write replaces the files it planned).
         */
        Builder(IcebergTable table, CaseInsensitiveStringMap options, boolean wholeFiles,
                java.util.function.Consumer<IcebergScan> built) {
            this.table = table;
            this.options = options;
            this.required = table.schema;
            this.wholeFiles = wholeFiles;
            this.built = built;
        }

        @Override
        public Predicate[] pushPredicates(Predicate[] predicates) {
            for (Predicate predicate : predicates) {
                boolean change = false;
                for (NamedReference ref : predicate.references()) {
                    change |= ref.fieldNames().length == 1 && (table.isChangeColumn(ref.fieldNames()[0])
                        || DELETED_COLUMN.equals(ref.fieldNames()[0]));  // no file has it to prune on
                }
                if (!change && Changes.predicate(predicate) != null) {
                    pushed.add(predicate);
                }
            }
            return predicates;  // Spark evaluates every one after the scan too
        }

        @Override
        public Predicate[] pushedPredicates() {
            return pushed.toArray(new Predicate[0]);
        }

        @Override
        public void pruneColumns(StructType requiredSchema) {
            this.required = requiredSchema;
        }

        @Override
        public Scan build() {
            if (table.changelog()) {
                return changelog();
            }
            if (!options.isEmpty() && Streams.streamingOptions(options)) {
                return new Streams.StreamScan(table, required, annotate(required, table.readSchema, ""), options);
            }
            if (!options.isEmpty()) {
                throw new IllegalArgumentException("icecrypt catalog: table " + table.name() + ": read option "
                    + options.keySet().iterator().next() + " is not supported (select branches, tags and snapshots "
                    + "with the table identifier or VERSION/TIMESTAMP AS OF)");
            }
            StructType data = new StructType();
            Set<String> metadata = new HashSet<>();
            for (StructField field : required.fields()) {
                if (table.isMetadataColumn(field.name())) {
                    metadata.add(field.name());
                } else {
                    data = data.add(field);
                }
            }
            StructType annotated = annotate(data, table.readSchema, "");
            // the data columns, then the metadata columns asked for in this order (see Lineage)
            StructType readSchema = data;
            if (metadata.contains(POS_COLUMN)) {
                readSchema = readSchema.add(POS_COLUMN, DataTypes.LongType, false);
            }
            if (metadata.contains(FILE_COLUMN)) {
                readSchema = readSchema.add(FILE_COLUMN, DataTypes.StringType, false);
            }
            if (metadata.contains(SPEC_ID_COLUMN)) {
                readSchema = readSchema.add(SPEC_ID_COLUMN, DataTypes.IntegerType, false);
            }
            if (metadata.contains(PARTITION_COLUMN)) {
                readSchema = readSchema.add(PARTITION_COLUMN, table.partitionType(), true);
            }
            for (String column : new String[] {ROW_ID_COLUMN, SEQUENCE_COLUMN}) {
                if (metadata.contains(column)) {
                    readSchema = readSchema.add(column, DataTypes.LongType, true);
                }
            }
            if (metadata.contains(DELETED_COLUMN)) {
                readSchema = readSchema.add(DELETED_COLUMN, DataTypes.BooleanType, false);
            }
            IcebergScan scan = IcebergScan.plan(table, pushed.toArray(new Predicate[0]), readSchema, annotated,
                                                wholeFiles);
            if (built != null) {
                built.accept(scan);
            }
            return scan;
        }

        /**
         * The scan of db.t.changes: the data columns read from the files, the change columns
         * as their constants.  The read options (its range) go to the driver, which checks
         * them (scan.plan_changelog).
         */
        private Scan changelog() {
            Map<String, String> range = new HashMap<>(options);
            StructType data = new StructType();
            Set<String> changes = new HashSet<>();
            for (StructField field : required.fields()) {
                if (table.isChangeColumn(field.name())) {
                    changes.add(field.name());
                } else {
                    data = data.add(field);
                }
            }
            StructType readSchema = data;
            for (String column : IcebergTable.CHANGE_COLUMNS) {
                if (changes.contains(column)) {
                    readSchema = readSchema.add(table.schema.apply(column));
                }
            }
            return IcebergScan.plan(table, pushed.toArray(new Predicate[0]), readSchema,
                                    annotate(data, table.readSchema, ""), false, range);
        }
    }

    /** {@code pruned} (a pruning of the table's schema) with the read schema's field metadata. */
    static StructType annotate(StructType pruned, StructType full, String prefix) {
        StructField[] fields = pruned.fields();
        StructField[] out = new StructField[fields.length];
        for (int i = 0; i < fields.length; i++) {
            StructField field = fields[i];
            StructField source = full.apply(field.name());
            if (source.metadata().contains(UNREADABLE)) {
                throw new UnsupportedOperationException("icecrypt catalog: column " + prefix + field.name() + " is "
                    + source.metadata().getString(UNREADABLE) + ": Spark's Parquet reader cannot read it (select "
                    + "the other columns)");
            }
            out[i] = new StructField(field.name(), annotate(field.dataType(), source.dataType(),
                prefix + field.name() + "."), field.nullable(), source.metadata());
        }
        return new StructType(out);
    }

    private static DataType annotate(DataType pruned, DataType full, String prefix) {
        if (pruned instanceof StructType && full instanceof StructType) {
            return annotate((StructType) pruned, (StructType) full, prefix);
        }
        if (pruned instanceof ArrayType && full instanceof ArrayType) {
            ArrayType array = (ArrayType) pruned;
            return new ArrayType(annotate(array.elementType(), ((ArrayType) full).elementType(), prefix),
                                 array.containsNull());
        }
        if (pruned instanceof MapType && full instanceof MapType) {
            MapType map = (MapType) pruned;
            return new MapType(annotate(map.keyType(), ((MapType) full).keyType(), prefix),
                annotate(map.valueType(), ((MapType) full).valueType(), prefix), map.valueContainsNull());
        }
        return pruned;
    }

    /** A planned scan: the files, the snapshot, how to read them. */
    static class IcebergScan implements Scan, Batch, SupportsReportStatistics {
        final IcebergTable table;
        final Predicate[] predicates;
        final StructType readSchema;  // what Spark gets: the data columns, then the metadata columns asked for
        final StructType annotated;  // the data columns, with field ids
        final JsonNode plan;  // the driver's answer (no key in it)
        final boolean wholeFiles;  // rows are never filtered inside a file (copy-on-write)
        private final String keys;  // the file keys, null for a plaintext table
        private InputPartition[] partitions;
        private PartitionReaderFactory factory;
        private Set<String> kept;  // the data files a runtime filter kept (null: every planned file)

        IcebergScan(IcebergTable table, Predicate[] predicates, StructType readSchema, StructType annotated,
                    JsonNode plan, String keys, boolean wholeFiles) {
            this.wholeFiles = wholeFiles;
            this.table = table;
            this.predicates = predicates;
            this.readSchema = readSchema;
            this.annotated = annotated;
            this.plan = plan;
            this.keys = keys;
        }

        static IcebergScan plan(IcebergTable table, Predicate[] predicates, StructType readSchema,
                                StructType annotated, boolean wholeFiles) {
            return plan(table, predicates, readSchema, annotated, wholeFiles, null);
        }

        /** {@code range}: a changelog's read options (null for a table's scan). */
        static IcebergScan plan(IcebergTable table, Predicate[] predicates, StructType readSchema,
                                StructType annotated, boolean wholeFiles, Map<String, String> range) {
            ObjectNode request = table.catalog.request();
            request.set("ref", table.ref());
            if (range != null) {
                ObjectNode options = request.putObject("options");
                for (Map.Entry<String, String> option : range.entrySet()) {
                    options.put(option.getKey(), option.getValue());
                }
            }
            ArrayNode filters = request.putArray("filters");
            for (Predicate predicate : predicates) {
                ObjectNode json = Changes.predicate(predicate);
                if (json != null) {
                    filters.add(json);
                }
            }
            ArrayNode columns = request.putArray("columns");
            for (StructField field : annotated.fields()) {
                columns.add(field.name());
            }
            request.put("partition", readSchema.getFieldIndex(PARTITION_COLUMN).isDefined()
                && annotated.getFieldIndex(PARTITION_COLUMN).isEmpty());
            request.put("mark_deleted", readSchema.getFieldIndex(DELETED_COLUMN).isDefined()
                && annotated.getFieldIndex(DELETED_COLUMN).isEmpty());
            return of(table, predicates, readSchema, annotated, table.catalog.callUnchecked("plan_scan", request),
                      wholeFiles);
        }

        /** The scan of a plan the driver made (its keys taken from Keys); also a micro-batch's. */
        static IcebergScan of(IcebergTable table, Predicate[] predicates, StructType readSchema, StructType annotated,
                              JsonNode plan, boolean wholeFiles) {
            String keys = plan.path("encrypted").asBoolean() && plan.path("files").size() > 0
                ? Keys.take(plan.path("read_id").asText()) : null;
            if (wholeFiles) {
                return new CopyOnWriteScan(table, predicates, readSchema, annotated, plan, keys);
            }
            return new IcebergScan(table, predicates, readSchema, annotated, plan, keys, false);
        }

        /** Whether Spark gets the _file column. */
        boolean readsFile() {
            return readsMetadata(FILE_COLUMN);
        }

        /** Whether Spark gets the _pos column (the reader's row index). */
        boolean readsPos() {
            return readsMetadata(POS_COLUMN);
        }

        /** Whether Spark gets the metadata column {@code column}. */
        boolean readsMetadata(String column) {
            return readSchema.getFieldIndex(column).isDefined() && annotated.getFieldIndex(column).isEmpty();
        }

        /** Reads only the planned data files in {@code locations} from now on (a runtime filter). */
        synchronized void keep(Set<String> locations) {
            kept = locations;
            partitions = null;
        }

        /** The planned data files this scan reads, as the table records them (a runtime filter applied). */
        List<String> dataFiles() {
            List<String> out = new ArrayList<>();
            for (JsonNode[] file : readFiles()) {
                out.add(file[1].asText());
            }
            return out;
        }

        /**
         * The planned files ([Spark path, size, rows, has deletes, ...]: Lineage) with their
         * locations, as read, and a changelog's change of each (else null).
         */
        private synchronized List<JsonNode[]> readFiles() {
            List<JsonNode[]> out = new ArrayList<>();
            JsonNode files = plan.path("files");
            JsonNode locations = plan.path("data_files");
            JsonNode changes = plan.path("changes");
            for (int i = 0; i < files.size(); i++) {
                if (kept == null || kept.contains(locations.get(i).asText())) {
                    out.add(new JsonNode[] {files.get(i), locations.get(i), changes.get(i)});
                }
            }
            return out;
        }

        /** A stream of the table's appends (no read option given). */
        @Override
        public org.apache.spark.sql.connector.read.streaming.MicroBatchStream toMicroBatchStream(String checkpoint) {
            return new Streams.MicroBatch(table, readSchema, annotated, java.util.Collections.emptyMap());
        }

        @Override
        public StructType readSchema() {
            return readSchema;
        }

        @Override
        public String description() {
            StringBuilder out = new StringBuilder("icecrypt ").append(table.name());
            JsonNode snapshot = plan.get("snapshot_id");
            out.append(" [snapshot=").append(snapshot == null || snapshot.isNull() ? "none" : snapshot.asText());
            out.append(", files=").append(plan.path("files").size());
            if (predicates.length > 0) {
                out.append(", filters=").append(Arrays.toString(predicates));
            }
            return out.append(']').toString();
        }

        @Override
        public String toString() {
            return description();
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        /** Spark's file sources' split size: files cut and packed into tasks as Spark packs them. */
        @Override
        public synchronized InputPartition[] planInputPartitions() {
            if (partitions != null) {
                return partitions;
            }
            SparkSession session = SparkSession.active();
            SQLConf conf = SQLConf.get();
            long maxBytes = conf.filesMaxPartitionBytes();
            long openCost = conf.filesOpenCostInBytes();
            long total = 0;
            List<JsonNode[]> files = readFiles();
            for (JsonNode[] file : files) {
                total += file[0].get(1).asLong() + openCost;
            }
            int parallelism = Math.max(1, session.sparkContext().defaultParallelism());
            if (conf.filesMinPartitionNum().isDefined()) {
                parallelism = Math.max(1, ((Number) conf.filesMinPartitionNum().get()).intValue());
            }
            long split = Math.min(maxBytes, Math.max(openCost, total / parallelism));
            List<Object[]> pieces = new ArrayList<>();  // path, start, length, size, live, partition values
            Lineage layout = new Lineage(this);
            for (JsonNode[] file : files) {
                String path = file[0].get(0).asText();
                long size = file[0].get(1).asLong();
                boolean live = file[0].get(3).asBoolean();
                InternalRow partition = layout.partitionValues(file[0], file[1], file[2]);
                for (long start = 0; start < size || (start == 0 && size == 0); start += split) {
                    pieces.add(new Object[] {path, start, Math.min(split, size - start), size, live, partition});
                    if (size == 0) {
                        break;
                    }
                }
            }
            pieces.sort((a, b) -> Long.compare((Long) b[2], (Long) a[2]));
            List<InputPartition> out = new ArrayList<>();
            List<Object[]> current = new ArrayList<>();
            long currentSize = 0;
            for (Object[] piece : pieces) {
                long length = (Long) piece[2];
                if (!current.isEmpty() && currentSize + length > split) {
                    out.add(FilesPartition.of(current));
                    current = new ArrayList<>();
                    currentSize = 0;
                }
                current.add(piece);
                currentSize += length + openCost;
            }
            if (!current.isEmpty()) {
                out.add(FilesPartition.of(current));
            }
            partitions = out.toArray(new InputPartition[0]);
            return partitions;
        }

        @Override
        public synchronized PartitionReaderFactory createReaderFactory() {
            if (factory == null) {
                factory = readers();
            }
            return factory;
        }

        private PartitionReaderFactory readers() {
            SparkSession session = SparkSession.active();
            // Spark's Parquet reader matches columns by field id only with this on; a file without
            // ids then fails instead of reading as nulls (the native read sets the same)
            if (!"true".equals(session.conf().get(FIELD_ID_READ, "false"))) {
                session.conf().set(FIELD_ID_READ, "true");
            }
            if (!"false".equals(session.conf().get(FIELD_ID_IGNORE_MISSING, "false"))) {
                session.conf().set(FIELD_ID_IGNORE_MISSING, "false");
            }
            ParquetFileFormat format = new ParquetFileFormat();
            Lineage layout = new Lineage(this);
            StructType partition = layout.partitionSchema();
            StructType required = layout.requiredSchema();
            boolean columnar = format.supportBatch(session, required.merge(partition, false));
            Map<String, String> options = new HashMap<>();
            options.put(FileFormat$.MODULE$.OPTION_RETURNING_BATCH(), String.valueOf(columnar));
            Configuration conf = format.getHadoopConf(session, scalaMap(options));
            if (keys != null) {
                conf.set(FACTORY_PROPERTY, DECRYPTION_CLASS);
                conf.set(READ_ID_PROPERTY, plan.path("read_id").asText());
                conf.set(KEYS_PROPERTY, keys);
            }
            scala.collection.immutable.Seq<Filter> filters = parquetFilters();
            StructType full = layout.byName() ? Lineage.withoutIds(table.readSchema) : table.readSchema;
            Function1<PartitionedFile, Iterator<InternalRow>> plain = format.buildReaderWithPartitionValues(
                session, full, partition, required, filters, scalaMap(options), new Configuration(conf));
            Function1<PartitionedFile, Iterator<InternalRow>> live = null;
            String deletes = plan.path("deletes").asText("");
            if (!deletes.isEmpty()) {
                Map<String, String> liveOptions = new HashMap<>(options);
                liveOptions.put(LiveRows.DELETES, deletes);
                live = new LiveRows().buildReaderWithPartitionValues(session, full, partition, required, filters,
                    scalaMap(liveOptions), new Configuration(conf));
            }
            return new ReaderFactory(plain, live, columnar, layout.needed() ? layout : null);
        }

        /** The pushed predicates Parquet can apply: on top-level columns no schema change renamed. */
        private scala.collection.immutable.Seq<Filter> parquetFilters() {
            Set<String> pushable = new HashSet<>();
            for (JsonNode name : plan.path("pushable")) {
                pushable.add(name.asText());
            }
            List<Filter> out = new ArrayList<>();
            for (Predicate predicate : wholeFiles ? new Predicate[0] : predicates) {
                boolean ok = true;
                for (NamedReference ref : predicate.references()) {
                    ok &= ref.fieldNames().length == 1 && pushable.contains(ref.fieldNames()[0]);
                }
                if (ok) {
                    scala.Option<Filter> filter = PredicateUtils.toV1(predicate);
                    if (filter.isDefined()) {
                        out.add(filter.get());
                    }
                }
            }
            return CollectionConverters.asScala(out).toList();
        }

        @Override
        public Statistics estimateStatistics() {
            long bytes = 0;
            long rows = 0;
            for (JsonNode[] file : readFiles()) {
                bytes += file[0].get(1).asLong();
                rows += file[0].get(2).asLong();
            }
            final long size = bytes;
            final long count = rows;
            return new Statistics() {
                @Override
                public OptionalLong sizeInBytes() {
                    return OptionalLong.of(size);
                }

                @Override
                public OptionalLong numRows() {
                    return OptionalLong.of(count);
                }
            };
        }
    }

    /**
     * The scan of a copy-on-write operation: whole files, and runtime-filterable on _file.
     * Spark passes the files its group filter found as {@code _file IN (...)}; the scan then
     * reads those files only, and the operation replaces those only.  Spark may filter twice
     * (an UPDATE with a subquery reads the same scan on both sides of a union): a filter
     * that keeps more files than the last one is ignored, as Iceberg does.
     */
    static final class CopyOnWriteScan extends IcebergScan implements SupportsRuntimeV2Filtering {
        CopyOnWriteScan(IcebergTable table, Predicate[] predicates, StructType readSchema, StructType annotated,
                        JsonNode plan, String keys) {
            super(table, predicates, readSchema, annotated, plan, keys, true);
        }

        @Override
        public NamedReference[] filterAttributes() {
            return readsFile() ? new NamedReference[] {Expressions.column(FILE_COLUMN)} : new NamedReference[0];
        }

        @Override
        public void filter(Predicate[] predicates) {
            for (Predicate predicate : predicates) {
                Set<String> locations = fileLocations(predicate);
                if (locations != null && locations.size() < dataFiles().size()) {
                    keep(locations);
                }
            }
        }

        /** The locations of {@code _file IN (...)}; null for any other predicate. */
        private static Set<String> fileLocations(Predicate predicate) {
            org.apache.spark.sql.connector.expressions.Expression[] children = predicate.children();
            if (!"IN".equals(predicate.name()) || children.length == 0 || !(children[0] instanceof NamedReference)
                    || !Arrays.equals(((NamedReference) children[0]).fieldNames(), new String[] {FILE_COLUMN})) {
                return null;
            }
            Set<String> out = new HashSet<>();
            for (int i = 1; i < children.length; i++) {
                if (!(children[i] instanceof Literal)) {
                    return null;
                }
                Object value = ((Literal<?>) children[i]).value();
                if (value != null) {
                    out.add(value.toString());
                }
            }
            return out;
        }
    }

    static scala.collection.immutable.Map<String, String> scalaMap(Map<String, String> map) {
        return scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(map));
    }

    /** One task's file pieces. */
    static final class FilesPartition implements InputPartition {
        private static final long serialVersionUID = 1L;
        final PartitionedFile[] files;
        final boolean[] live;

        private FilesPartition(PartitionedFile[] files, boolean[] live) {
            this.files = files;
            this.live = live;
        }

        static FilesPartition of(List<Object[]> pieces) {
            PartitionedFile[] files = new PartitionedFile[pieces.size()];
            boolean[] live = new boolean[pieces.size()];
            scala.collection.immutable.Map<String, Object> none = scala.collection.immutable.Map$.MODULE$.empty();
            for (int i = 0; i < files.length; i++) {
                Object[] piece = pieces.get(i);
                files[i] = new PartitionedFile((InternalRow) piece[5], SparkPath.fromPath(new Path((String) piece[0])),
                    (Long) piece[1], (Long) piece[2], new String[0], 0L, (Long) piece[3], none);
                live[i] = (Boolean) piece[4];
            }
            return new FilesPartition(files, live);
        }
    }

    /** Reads a task's pieces with the planned reader functions (built and broadcast on the driver). */
    static final class ReaderFactory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final Function1<PartitionedFile, Iterator<InternalRow>> plain;
        private final Function1<PartitionedFile, Iterator<InternalRow>> live;
        private final boolean columnar;
        private final Lineage lineage;  // null: the reader's rows are the scan's

        ReaderFactory(Function1<PartitionedFile, Iterator<InternalRow>> plain,
                      Function1<PartitionedFile, Iterator<InternalRow>> live, boolean columnar, Lineage lineage) {
            this.plain = plain;
            this.live = live;
            this.columnar = columnar;
            this.lineage = lineage;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return columnar;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            return new Reader<>((FilesPartition) partition, this);
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new Reader<>((FilesPartition) partition, this);
        }

        Iterator<InternalRow> open(FilesPartition partition, int index) {
            boolean deletes = partition.live[index];
            if (deletes && live == null) {
                throw new IllegalStateException("icecrypt: " + partition.files[index].urlEncodedPath()
                    + " has deletes but the scan planned none: refused");
            }
            Iterator<InternalRow> rows = (deletes ? live : plain).apply(partition.files[index]);
            return lineage == null ? rows : lineage.apply(rows, columnar);
        }
    }

    /** The rows (or batches) of a task's pieces, one after the other. */
    static final class Reader<T> implements PartitionReader<T>, Serializable {
        private static final long serialVersionUID = 1L;
        private final FilesPartition partition;
        private final ReaderFactory factory;
        private int index = -1;
        private Iterator<InternalRow> current;
        private T item;

        Reader(FilesPartition partition, ReaderFactory factory) {
            this.partition = partition;
            this.factory = factory;
        }

        @Override
        @SuppressWarnings("unchecked")
        public boolean next() {
            while (current == null || !current.hasNext()) {
                index++;
                if (index >= partition.files.length) {
                    return false;
                }
                current = factory.open(partition, index);
            }
            item = (T) ((Iterator<Object>) (Iterator<?>) current).next();
            return true;
        }

        @Override
        public T get() {
            return item;
        }

        @Override
        public void close() {
            // the Parquet readers close at their end, or when the task completes
        }
    }
}
