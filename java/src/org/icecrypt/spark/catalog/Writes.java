/*
 * icecrypt: the SQL catalog's writes -- INSERT INTO, INSERT OVERWRITE (static, dynamic),
 * DataFrameWriterV2's append / overwrite(condition) / overwritePartitions and the writes
 * of CREATE/REPLACE TABLE ... AS SELECT -- with Spark's own Parquet writer.
 *
 * The write asks Spark to cluster and sort its rows by the table's partitioning (and
 * sort order), as Iceberg's Spark writes do (write.distribution-mode: hash by default
 * for a partitioned table, none, or range), through the catalog's transform functions.
 * When it runs (toBatch), the Python driver checks the table still is what the statement
 * planned against, makes the write's secret (a fresh 32 random bytes, left with Keys,
 * never returned) and answers with the plan: the data directory, the schema with field
 * ids, the partition spec, the table's Parquet settings.  Executors then write each
 * partition's rows into files <data>/<partition path>/<partition>-<task>-<write id>-<n>.parquet
 * through ParquetFileFormat's OutputWriterFactory; for an encrypted table parquet-java
 * encrypts every file with its own DEK and AAD prefix (FileEncryption derives them from
 * the secret and the file's name).  A task reports its files (path, size, record count,
 * partition values); a task that fails deletes the files it wrote.
 *
 * commit() hands the reported files to the driver, which derives their keys, reads and
 * authenticates their footers for the manifests' statistics and commits them in one
 * snapshot through icecrypt's table API (append_files, overwrite_files,
 * overwrite_files_by_filter, dynamic_partition_overwrite_files; with the snapshot the
 * statement read for Java's conflict checks).  abort() -- Spark calls it when a task or
 * the commit fails -- has the driver delete every file the write reported and what its
 * failed tasks left; nothing is committed, no file stays.
 *
 * Streaming (writeStream.toTable): each micro-batch is such a write; its commit carries
 * Spark's query id and the epoch, which the driver records in the snapshot summary and
 * checks first, so a replayed epoch commits nothing (_sql/write.py, as the icecrypt.iceberg
 * sink).
 */
package org.icecrypt.spark.catalog;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.Job;
import org.apache.hadoop.mapreduce.JobID;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.hadoop.mapreduce.TaskAttemptID;
import org.apache.hadoop.mapreduce.TaskID;
import org.apache.hadoop.mapreduce.TaskType;
import org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.connector.distributions.Distribution;
import org.apache.spark.sql.connector.distributions.Distributions;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.SortOrder;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.expressions.filter.AlwaysTrue;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.RequiresDistributionAndOrdering;
import org.apache.spark.sql.connector.write.SupportsDynamicOverwrite;
import org.apache.spark.sql.connector.write.SupportsOverwriteV2;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.execution.datasources.OutputWriter;
import org.apache.spark.sql.execution.datasources.OutputWriterFactory;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.SerializableConfiguration;

final class Writes {
    static final String ENCRYPTION_CLASS = "org.icecrypt.spark.FileEncryption";
    static final String SECRET_PROPERTY = "icecrypt.secret.write-key";
    static final String KEY_LENGTH_PROPERTY = "icecrypt.write-key-length";

    private Writes() {
    }

    /** append (default), overwrite (truncate), overwrite_filter, dynamic. */
    static final class Builder implements WriteBuilder, SupportsOverwriteV2, SupportsDynamicOverwrite {
        private final IcebergTable table;
        private final LogicalWriteInfo info;
        private String mode = "append";
        private Predicate[] filters = new Predicate[0];
        private java.util.function.Supplier<ObjectNode> replaced;

        Builder(IcebergTable table, LogicalWriteInfo info) {
            this.table = table;
            this.info = info;
        }

        /**
         * The write of a copy-on-write row-level operation (CopyOnWrite): its files replace
         * the ones the operation's scan read; {@code replaced} answers which (the scan's files
         * and snapshot, and the command): when the job starts (the files planned) and again
         * at its commit (the files read: Spark's runtime filter, applied as the job runs,
         * may have kept fewer).
         */
        Builder(IcebergTable table, LogicalWriteInfo info, java.util.function.Supplier<ObjectNode> replaced) {
            this(table, info);
            this.mode = "replace";
            this.replaced = replaced;
        }

        @Override
        public WriteBuilder truncate() {
            mode = "overwrite";
            return this;
        }

        @Override
        public boolean canOverwrite(Predicate[] predicates) {
            for (Predicate predicate : predicates) {
                if (Changes.predicate(predicate) == null) {
                    return false;
                }
            }
            return true;
        }

        @Override
        public WriteBuilder overwrite(Predicate[] predicates) {
            boolean all = true;
            for (Predicate predicate : predicates) {
                all &= predicate instanceof AlwaysTrue;
            }
            if (all) {
                return truncate();
            }
            if (!canOverwrite(predicates)) {
                throw new IllegalArgumentException("icecrypt catalog: table " + table.name() + ": cannot overwrite by "
                    + Arrays.toString(predicates) + " (a condition icecrypt cannot evaluate as an Iceberg row filter)");
            }
            mode = "overwrite_filter";
            filters = predicates;
            return this;
        }

        @Override
        public WriteBuilder overwriteDynamicPartitions() {
            mode = "dynamic";
            return this;
        }

        @Override
        public Write build() {
            // a streaming write carries the query's own options (checkpointLocation): toStreaming checks them
            return new IcebergWrite(table, info, mode, filters, replaced);
        }
    }

    /** A planned write: its mode and, when run, its batch write. */
    static class IcebergWrite implements Write, RequiresDistributionAndOrdering {
        private final IcebergTable table;
        private final LogicalWriteInfo info;
        private final String mode;
        private final Predicate[] filters;
        private final java.util.function.Supplier<ObjectNode> replaced;

        IcebergWrite(IcebergTable table, LogicalWriteInfo info, String mode, Predicate[] filters,
                     java.util.function.Supplier<ObjectNode> replaced) {
            this.table = table;
            this.info = info;
            this.mode = mode;
            this.filters = filters;
            this.replaced = replaced;
        }

        /** The write options of schema merging (lower case, as Spark's option map gives them). */
        static final java.util.Set<String> MERGE_SCHEMA_OPTIONS = new java.util.HashSet<>(
            java.util.Arrays.asList("mergeschema", "merge-schema"));

        /** The write option mergeSchema (or merge-schema), as Iceberg's Spark writes read it. */
        static boolean mergeSchema(org.apache.spark.sql.util.CaseInsensitiveStringMap options) {
            String value = options.getOrDefault("mergeSchema", options.getOrDefault("merge-schema", "false"));
            return "true".equalsIgnoreCase(value.trim());
        }

        /** Whether the write has rows to write (a merge-on-read DELETE only deletes positions). */
        boolean writesRows() {
            return !("delta".equals(mode) && info.schema().isEmpty());
        }

        private String distributionMode() {
            String configured = table.properties().get("write.distribution-mode");
            boolean partitioned = table.partitioning().length > 0;
            if (configured == null) {
                return partitioned ? "hash" : table.description.path("sort_order").size() > 0 ? "range" : "none";
            }
            return configured.trim().toLowerCase(java.util.Locale.ROOT);
        }

        @Override
        public Distribution requiredDistribution() {
            String distribution = distributionMode();
            SortOrder[] ordering = requiredOrdering();
            if (!rowsHaveColumnsOf(ordering)) {
                return Distributions.unspecified();  // the driver refuses the write, naming the column
            }
            if (ordering.length == 0) {
                return Distributions.unspecified();
            }
            if ("range".equals(distribution)) {
                return Distributions.ordered(ordering);
            }
            Transform[] partitioning = IcebergTable.partitioning(table.description, positional());
            if ("hash".equals(distribution) && partitioning.length > 0) {
                Expression[] clustering = new Expression[partitioning.length];
                for (int i = 0; i < partitioning.length; i++) {
                    clustering[i] = IcebergTable.expression(partitioning[i]);
                }
                return Distributions.clustered(clustering);
            }
            return Distributions.unspecified();
        }

        @Override
        public SortOrder[] requiredOrdering() {
            SortOrder[] ordering = writesRows() ? table.writeOrdering(positional()) : new SortOrder[0];
            return rowsHaveColumnsOf(ordering) ? ordering : new SortOrder[0];
        }

        /**
         * Whether the rows have every column the ordering names (a write to a table that
         * accepts any schema may lack one: it is not clustered or sorted then, and the
         * driver refuses it, saying which column it lacks).
         */
        private boolean rowsHaveColumnsOf(SortOrder[] ordering) {
            if (!table.acceptsAnySchema()) {
                return true;
            }
            java.util.Set<String> names = new java.util.HashSet<>();
            for (String name : info.schema().fieldNames()) {
                names.add(name.toLowerCase(java.util.Locale.ROOT));
            }
            for (SortOrder order : ordering) {
                for (NamedReference ref : order.expression().references()) {
                    if (!names.contains(ref.fieldNames()[0].toLowerCase(java.util.Locale.ROOT))) {
                        return false;
                    }
                }
            }
            return true;
        }

        /**
         * For a table that accepts any schema (Spark then leaves the rows' columns as the
         * query made them): when no column of the rows has a name of the table's, they came
         * by position (INSERT INTO t VALUES ...: col1, col2, ...), and this maps each of the
         * table's columns to the row column in its place; null when the rows are matched by
         * name (the driver checks them: written_schema), or count other than the table's.
         */
        Map<String, String> positional() {
            if (!table.acceptsAnySchema() || replaced != null) {
                return null;
            }
            String[] own = table.schema.fieldNames();
            String[] given = info.schema().fieldNames();
            for (String name : given) {
                for (String column : own) {
                    if (name.equalsIgnoreCase(column)) {
                        return null;
                    }
                }
            }
            if (given.length != own.length) {
                return null;
            }
            Map<String, String> out = new HashMap<>();
            for (int i = 0; i < own.length; i++) {
                out.put(own[i], given[i]);
            }
            return out;
        }

        @Override
        public String description() {
            return "icecrypt " + mode + " to " + table.name();
        }

        @Override
        public String toString() {
            return description();
        }

        private void refuseOptions(java.util.Set<String> allowed) {
            for (String option : info.options().keySet()) {
                if (!allowed.contains(option.toLowerCase(java.util.Locale.ROOT))) {
                    throw new IllegalArgumentException("icecrypt catalog: table " + table.name() + ": write option "
                        + option + " is not supported (write to a branch through its identifier, t.branch_<name>)");
                }
            }
        }

        @Override
        public BatchWrite toBatch() {
            refuseOptions(MERGE_SCHEMA_OPTIONS);
            return begin();
        }

        /**
         * Structured Streaming (writeStream.toTable): append mode, or complete mode (an
         * overwrite per epoch).  Each micro-batch is a batch write of its own (a fresh
         * secret, so fresh file keys) whose commit names the query and the epoch: the
         * driver commits an epoch once, however often Spark replays it.
         */
        @Override
        public StreamingWrite toStreaming() {
            java.util.Set<String> allowed = new java.util.HashSet<>(MERGE_SCHEMA_OPTIONS);
            allowed.add("checkpointlocation");
            refuseOptions(allowed);
            if (!"append".equals(mode) && !"overwrite".equals(mode)) {
                throw new UnsupportedOperationException("icecrypt catalog: table " + table.name()
                    + ": a streaming write appends (output mode append) or replaces the table (complete)");
            }
            return new IcebergStreamingWrite(this, info.queryId());
        }

        /** Plan the write with the driver (a fresh write id and secret) and make its batch write. */
        IcebergBatchWrite begin() {
            ObjectNode request = table.catalog.request();
            request.set(table.refField(), table.ref());
            request.put("mode", mode);
            request.put("writes_rows", writesRows());  // a delete-only delta gets no write secret
            ArrayNode list = request.putArray("filters");
            for (Predicate predicate : filters) {
                list.add(Changes.predicate(predicate));
            }
            if (replaced != null) {
                request.set("replaced", replaced.get());
            }
            if (table.acceptsAnySchema() && replaced == null && writesRows()) {
                // Spark did not resolve the rows to the table's columns: the driver matches them by name
                try {
                    request.set("write_schema", CatalogContext.JSON.readTree(info.schema().json()));
                } catch (IOException e) {
                    throw new IllegalStateException(e);
                }
                request.put("merge_schema", mergeSchema(info.options()));
                request.put("by_position", positional() != null);
            }
            JsonNode plan = table.catalog.callUnchecked("begin_write", request);
            String writeId = plan.path("write_id").asText();
            String secret = plan.path("encrypted").asBoolean() ? Keys.take(writeId) : null;
            StructType schema = (StructType) DataType.fromJson(plan.get("schema").toString());
            if (writesRows()) {
                check(schema, positional() == null ? info.schema() : named(info.schema(), schema), table);
            }
            return new IcebergBatchWrite(table, plan, writeId, schema, secret, replaced, lineage());
        }

        /**
         * Where the rows' metadata (a row-level operation's) holds _row_id and
         * _last_updated_sequence_number, which the files then store; null when it has none.
         */
        private int[] lineage() {
            if (!info.metadataSchema().isPresent()) {
                return null;
            }
            StructType metadata = info.metadataSchema().get();
            scala.Option<Object> rowId = metadata.getFieldIndex(Scans.ROW_ID_COLUMN);
            scala.Option<Object> sequence = metadata.getFieldIndex(Scans.SEQUENCE_COLUMN);
            if (rowId.isEmpty() || sequence.isEmpty()) {
                return null;
            }
            return new int[] {(Integer) rowId.get(), (Integer) sequence.get()};
        }
    }

    /**
     * A streaming write: per micro-batch a new IcebergBatchWrite (Spark asks for the
     * writer factory once per batch, on the driver, and batches run one at a time), its
     * commit carrying the query id (Spark's persistent id, kept in the checkpoint) and
     * the epoch so that the driver can tell a replayed epoch from a new one.
     */
    static final class IcebergStreamingWrite implements StreamingWrite {
        private final IcebergWrite write;
        private final String queryId;
        private IcebergBatchWrite current;

        IcebergStreamingWrite(IcebergWrite write, String queryId) {
            this.write = write;
            this.queryId = queryId;
        }

        @Override
        public synchronized StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
            current = write.begin();
            DataWriterFactory factory = current.createBatchWriterFactory(info);
            return new EpochWriterFactory(factory);
        }

        private synchronized IcebergBatchWrite take() {
            IcebergBatchWrite taken = current;
            current = null;
            return taken;
        }

        @Override
        public void commit(long epochId, WriterCommitMessage[] messages) {
            IcebergBatchWrite batch = take();
            if (batch == null) {
                return;  // no writer factory for this epoch: nothing was written
            }
            ObjectNode request = batch.request(messages);
            request.put("query_id", queryId);
            request.put("epoch", epochId);
            batch.table.catalog.callUnchecked("commit_write", request);
        }

        @Override
        public void abort(long epochId, WriterCommitMessage[] messages) {
            IcebergBatchWrite batch = take();
            if (batch != null) {
                batch.abort(messages);
            }
        }

        @Override
        public String toString() {
            return "icecrypt streaming write to " + write.description();
        }
    }

    /** The batch factory's writers for a micro-batch's tasks (the epoch is the commit's business). */
    static final class EpochWriterFactory implements StreamingDataWriterFactory {
        private static final long serialVersionUID = 1L;
        private final DataWriterFactory factory;

        EpochWriterFactory(DataWriterFactory factory) {
            this.factory = factory;
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
            return factory.createWriter(partitionId, taskId);
        }
    }

    /**
     * The write's rows must be the table's columns (Spark resolves a write's query to them;
     * anything else is refused).  A row-level operation whose condition
     * names a metadata column (DELETE ... WHERE _row_id = 7) gets rows with the metadata
     * columns after the table's: those are not written (FileWriter writes the table's).
     */
    /** {@code given}'s fields under the names of {@code schema}'s (rows that came by position). */
    static StructType named(StructType given, StructType schema) {
        StructField[] fields = given.fields();
        StructField[] out = new StructField[fields.length];
        for (int i = 0; i < fields.length; i++) {
            String name = i < schema.fields().length ? schema.fields()[i].name() : fields[i].name();
            out[i] = new StructField(name, fields[i].dataType(), fields[i].nullable(), fields[i].metadata());
        }
        return new StructType(out);
    }

    static void check(StructType schema, StructType given, IcebergTable table) {
        StructField[] want = schema.fields();
        StructField[] got = given.fields();
        boolean same = want.length <= got.length;
        for (int i = 0; same && i < got.length; i++) {
            same = i < want.length
                ? want[i].name().equals(got[i].name()) && want[i].dataType().sameType(got[i].dataType())
                : table.isMetadataColumn(got[i].name());
        }
        if (!same) {
            throw new IllegalArgumentException("icecrypt catalog: table " + table.name() + ": the write's rows ("
                + given.simpleString() + ") are not the table's columns (" + schema.simpleString() + ")");
        }
    }

    /** The job: its factory (sent to the executors) and the commit on the driver. */
    static final class IcebergBatchWrite implements BatchWrite {
        final IcebergTable table;
        private final JsonNode plan;
        private final String writeId;
        private final StructType schema;
        private final String secret;
        private final java.util.function.Supplier<ObjectNode> replaced;  // null unless a row-level operation
        private final int[] lineage;  // where the rows' metadata holds their lineage; null: none written

        IcebergBatchWrite(IcebergTable table, JsonNode plan, String writeId, StructType schema, String secret,
                          java.util.function.Supplier<ObjectNode> replaced, int[] lineage) {
            this.table = table;
            this.plan = plan;
            this.writeId = writeId;
            this.schema = schema;
            this.secret = secret;
            this.replaced = replaced;
            this.lineage = lineage;
        }

        @Override
        public WriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
            SparkSession session = SparkSession.active();
            ParquetFileFormat format = new ParquetFileFormat();
            Map<String, String> options = new HashMap<>();
            options.put("compression", plan.path("compression").asText("zstd"));
            Job job;
            try {
                job = Job.getInstance(format.getHadoopConf(session, Scans.scalaMap(options)));
            } catch (IOException e) {
                throw new IllegalStateException("icecrypt: cannot set up the write's Hadoop job", e);
            }
            // with lineage, the files store each row's _row_id and _last_updated_sequence_number after
            // its columns, under their reserved field ids (Iceberg's layout)
            StructType fileSchema = lineage == null ? schema : schema
                .add(Lineage.stored(Scans.ROW_ID_COLUMN, Scans.ROW_ID_FIELD_ID))
                .add(Lineage.stored(Scans.SEQUENCE_COLUMN, Scans.SEQUENCE_FIELD_ID));
            OutputWriterFactory outputs = format.prepareWrite(session, job, Scans.scalaMap(options), fileSchema);
            Configuration conf = job.getConfiguration();
            // Iceberg's Parquet: INT64 microsecond timestamps, standard (not legacy) lists and
            // maps, every column's field id
            conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS");
            conf.set("spark.sql.parquet.writeLegacyFormat", "false");
            conf.set("spark.sql.parquet.fieldId.write.enabled", "true");
            conf.set("parquet.write.support.class", IdWriteSupport.class.getName());
            // no Hadoop checksum files beside the data files
            conf.set("fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem");
            conf.set("fs.file.impl.disable.cache", "true");
            conf.set(IdWriteSupport.IDS, plan.path("nested_ids").toString());
            for (Map.Entry<String, String> e : CatalogContext.stringMap(plan.get("hadoop")).entrySet()) {
                conf.set(e.getKey(), e.getValue());
            }
            if (secret != null) {
                conf.set(Scans.FACTORY_PROPERTY, ENCRYPTION_CLASS);
                conf.set(SECRET_PROPERTY, secret);
                conf.set(KEY_LENGTH_PROPERTY, plan.path("key_length").asText("16"));
            }
            Broadcast<SerializableConfiguration> broadcast = JavaSparkContext.fromSparkContext(session.sparkContext())
                .broadcast(new SerializableConfiguration(conf));
            List<Transforms.Field> spec = new ArrayList<>();
            for (JsonNode field : plan.path("spec")) {
                int[] path = ints(field.get("path"));
                int[] widths = ints(field.get("widths"));
                spec.add(new Transforms.Field(field.path("name").asText(), field.path("transform").asText(),
                    field.path("param").asInt(0), path, widths,
                    DataType.fromJson(field.get("source").toString())));
            }
            // as Spark's file writers: a new file after spark.sql.files.maxRecordsPerFile rows (0: no limit)
            long maxRecords = org.apache.spark.sql.internal.SQLConf.get().maxRecordsPerFile();
            return new WriterFactory(broadcast, outputs, fileSchema, plan.path("root").asText(), writeId,
                spec.toArray(new Transforms.Field[0]), maxRecords, lineage);
        }

        private static int[] ints(JsonNode array) {
            int[] out = new int[array == null ? 0 : array.size()];
            for (int i = 0; i < out.length; i++) {
                out[i] = array.get(i).asInt();
            }
            return out;
        }

        ObjectNode request(WriterCommitMessage[] messages) {
            ObjectNode request = table.catalog.request();
            request.put("write_id", writeId);
            ArrayNode files = request.putArray("files");
            Map<String, List<long[]>> deletes = new java.util.TreeMap<>();
            for (WriterCommitMessage message : messages) {
                if (message instanceof WrittenFiles) {
                    WrittenFiles written = (WrittenFiles) message;
                    written.addTo(files);
                    written.deletes.forEach((file, positions) ->
                        deletes.computeIfAbsent(file, f -> new ArrayList<>()).add(positions));
                }
            }
            if (!deletes.isEmpty()) {  // a merge-on-read's deleted rows: positions per data file
                ObjectNode out = request.putObject("deletes");
                deletes.forEach((file, parts) -> {
                    ArrayNode positions = out.putArray(file);
                    for (long[] part : parts) {
                        for (long position : part) {
                            positions.add(position);
                        }
                    }
                });
            }
            return request;
        }

        @Override
        public void commit(WriterCommitMessage[] messages) {
            ObjectNode request = request(messages);
            if (replaced != null) {
                request.set("replaced", replaced.get());  // the files the scan read, now that it has run
            }
            table.catalog.callUnchecked("commit_write", request);
        }

        @Override
        public void abort(WriterCommitMessage[] messages) {
            table.catalog.callUnchecked("abort_write", request(messages));
        }

        @Override
        public String toString() {
            return "icecrypt write " + writeId + " to " + table.name();
        }
    }

    /**
     * What a task wrote: per file its path under the data directory, size, records, partition
     * values; and for a merge-on-read (MergeOnRead) the row positions it deleted, per data file.
     */
    static final class WrittenFiles implements WriterCommitMessage {
        private static final long serialVersionUID = 1L;
        final Map<String, long[]> deletes = new HashMap<>();
        final List<String> paths = new ArrayList<>();
        final List<Long> sizes = new ArrayList<>();
        final List<Long> records = new ArrayList<>();
        final List<String[]> partitions = new ArrayList<>();

        void addTo(ArrayNode files) {
            for (int i = 0; i < paths.size(); i++) {
                ArrayNode file = files.addArray();
                file.add(paths.get(i)).add(sizes.get(i)).add(records.get(i));
                ArrayNode values = file.addArray();
                for (String value : partitions.get(i)) {
                    if (value == null) {
                        values.addNull();
                    } else {
                        values.add(value);
                    }
                }
            }
        }
    }

    static final class WriterFactory implements DataWriterFactory {
        private static final long serialVersionUID = 1L;
        private final Broadcast<SerializableConfiguration> conf;
        private final OutputWriterFactory outputs;
        private final StructType schema;
        private final String root;
        private final String writeId;
        private final Transforms.Field[] spec;
        private final long maxRecords;
        private final int[] lineage;

        WriterFactory(Broadcast<SerializableConfiguration> conf, OutputWriterFactory outputs, StructType schema,
                      String root, String writeId, Transforms.Field[] spec, long maxRecords, int[] lineage) {
            this.conf = conf;
            this.outputs = outputs;
            this.schema = schema;
            this.root = root;
            this.writeId = writeId;
            this.spec = spec;
            this.maxRecords = maxRecords;
            this.lineage = lineage;
        }

        @Override
        public FileWriter createWriter(int partitionId, long taskId) {
            Configuration configuration = new Configuration(conf.value().value());
            TaskAttemptID attempt = new TaskAttemptID(new TaskID(new JobID("icecrypt", 0), TaskType.MAP, partitionId),
                                                      (int) (taskId & Integer.MAX_VALUE));
            TaskAttemptContext context = new TaskAttemptContextImpl(configuration, attempt);
            return new FileWriter(this, context, partitionId, taskId);
        }
    }

    /** One task: its rows into one open file at a time, a new one when the partition changes. */
    static final class FileWriter implements DataWriter<InternalRow> {
        private final WriterFactory factory;
        private final TaskAttemptContext context;
        private final int partitionId;
        private final long taskId;
        private final WrittenFiles written = new WrittenFiles();
        private final List<Path> started = new ArrayList<>();
        private final GenericInternalRow stored = new GenericInternalRow(2);  // a row's lineage
        private final JoinedRow joined = new JoinedRow();
        private OutputWriter current;
        private Object[] currentValues;
        private String currentPath;
        private long currentRecords;
        private int count;

        FileWriter(WriterFactory factory, TaskAttemptContext context, int partitionId, long taskId) {
            this.factory = factory;
            this.context = context;
            this.partitionId = partitionId;
            this.taskId = taskId;
        }

        /** A row without lineage (an inserted row: its file's first row id gives it its id). */
        @Override
        public void write(InternalRow row) throws IOException {
            write(null, row);
        }

        /** A row and its metadata: with lineage, its _row_id and sequence number are stored after its columns. */
        @Override
        public void write(InternalRow metadata, InternalRow given) throws IOException {
            int[] lineage = factory.lineage;
            InternalRow row = columns(given);
            if (lineage == null) {
                writeRow(row);
                return;
            }
            for (int i = 0; i < 2; i++) {  // the writer consumes the row at once: one row object, reused
                stored.update(i, metadata == null || metadata.isNullAt(lineage[i]) ? null : metadata.getLong(lineage[i]));
            }
            writeRow(joined.apply(row, stored));
        }

        /** The table's columns of a row that has metadata columns after them (see check). */
        private InternalRow columns(InternalRow row) {
            StructField[] fields = factory.schema.fields();
            int width = fields.length - (factory.lineage == null ? 0 : 2);
            if (row.numFields() == width) {
                return row;
            }
            GenericInternalRow out = new GenericInternalRow(width);
            for (int i = 0; i < width; i++) {
                out.update(i, row.isNullAt(i) ? null : row.get(i, fields[i].dataType()));
            }
            return out;
        }

        private void writeRow(InternalRow row) throws IOException {
            Transforms.Field[] spec = factory.spec;
            Object[] values = new Object[spec.length];
            for (int i = 0; i < spec.length; i++) {
                values[i] = spec[i].apply(row);
            }
            if (current == null || !same(values, currentValues)
                    || (factory.maxRecords > 0 && currentRecords >= factory.maxRecords)) {
                finish();
                open(values);
            }
            current.write(row);
            currentRecords++;
        }

        private static boolean same(Object[] a, Object[] b) {
            for (int i = 0; i < a.length; i++) {
                Object x = a[i];
                Object y = b[i];
                if (x instanceof byte[] && y instanceof byte[] ? !Arrays.equals((byte[]) x, (byte[]) y)
                        : !Objects.equals(x, y)) {
                    return false;
                }
            }
            return true;
        }

        private void open(Object[] values) {
            StringBuilder relative = new StringBuilder();
            for (int i = 0; i < values.length; i++) {
                relative.append(factory.spec[i].directory(values[i])).append('/');
            }
            relative.append(String.format("%05d-%d-%s-%05d.parquet", partitionId, taskId, factory.writeId, ++count));
            currentPath = relative.toString();
            Path path = new Path("file", null, factory.root + "/" + currentPath);
            started.add(path);
            current = factory.outputs.newInstance(path.toString(), factory.schema, context);
            currentValues = values;
            currentRecords = 0;
        }

        /** Close the open file and record it. */
        private void finish() throws IOException {
            if (current == null) {
                return;
            }
            OutputWriter closing = current;
            current = null;
            closing.close();
            Path path = started.get(started.size() - 1);
            long size = path.getFileSystem(context.getConfiguration()).getFileStatus(path).getLen();
            String[] encoded = new String[factory.spec.length];
            for (int i = 0; i < encoded.length; i++) {
                encoded[i] = factory.spec[i].encode(currentValues[i]);
            }
            written.paths.add(currentPath);
            written.sizes.add(size);
            written.records.add(currentRecords);
            written.partitions.add(encoded);
        }

        @Override
        public WriterCommitMessage commit() throws IOException {
            finish();
            return written;
        }

        @Override
        public void abort() throws IOException {
            if (current != null) {
                try {
                    current.close();
                } catch (Exception ignored) {
                    // the file goes anyway
                }
                current = null;
            }
            for (Path path : started) {
                try {
                    FileSystem fs = path.getFileSystem(context.getConfiguration());
                    fs.delete(path, false);
                } catch (IOException ignored) {
                    // the driver's abort looks for the write's files too
                }
            }
        }

        @Override
        public void close() {
        }
    }
}
