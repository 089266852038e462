/*
 * icecrypt: the SQL catalog's Structured Streaming reads (spark.readStream.table).
 *
 * The Python driver keeps one planner per running query (_sql/stream.py: icecrypt's
 * icecrypt.iceberg source over the catalog's table): offsets, where the stream starts,
 * which snapshots it reads (appends; overwrites and deletes refused unless the options
 * say to pass over them), the rate limits.  An offset is the planner's JSON (a snapshot
 * and a file position in it), kept as Spark's checkpoint keeps it.  Each micro-batch is
 * planned there as a batch scan is (stream_plan) and read here as one (Scans.IcebergScan:
 * Spark's Parquet reader, the files' keys from Keys into the scan's Hadoop
 * configuration): offsets, partitions and logs never hold a key.
 */
package org.icecrypt.spark.catalog;

import java.util.Arrays;
import java.util.HashSet;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadAllAvailable;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxFiles;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.types.StructType;

final class Streams {
    static final String MAX_FILES = "streaming-max-files-per-micro-batch";
    static final String MAX_ROWS = "streaming-max-rows-per-micro-batch";
    /** The read options a stream takes (Iceberg's names); a batch read takes none. */
    static final Set<String> OPTIONS = new HashSet<>(Arrays.asList("stream-from-timestamp", "start-snapshot-id",
        MAX_FILES, MAX_ROWS, "streaming-skip-overwrite-snapshots", "streaming-skip-delete-snapshots"));

    private Streams() {
    }

    /** Whether every option is a streaming read's. */
    static boolean streamingOptions(Map<String, String> options) {
        for (String name : options.keySet()) {
            if (!OPTIONS.contains(name.toLowerCase(Locale.ROOT))) {
                return false;
            }
        }
        return true;
    }

    /** A scan built with streaming options: only a stream reads it. */
    static final class StreamScan implements Scan {
        private final IcebergTable table;
        private final StructType readSchema;
        private final StructType annotated;
        private final Map<String, String> options;

        StreamScan(IcebergTable table, StructType readSchema, StructType annotated, Map<String, String> options) {
            this.table = table;
            this.readSchema = readSchema;
            this.annotated = annotated;
            this.options = options;
        }

        @Override
        public StructType readSchema() {
            return readSchema;
        }

        @Override
        public String description() {
            return "icecrypt stream of " + table.name();
        }

        @Override
        public Batch toBatch() {
            throw new IllegalArgumentException("icecrypt catalog: table " + table.name() + ": read options "
                + options.keySet() + " are a streaming read's (spark.readStream.table)");
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
            return new MicroBatch(table, readSchema, annotated, options);
        }
    }

    /** A snapshot position, as the driver's planner wrote it. */
    static final class JsonOffset extends Offset {
        private final String json;

        JsonOffset(String json) {
            this.json = json;
        }

        @Override
        public String json() {
            return json;
        }
    }

    /** One streaming query's read of the table: the driver plans, Scans reads. */
    static final class MicroBatch implements MicroBatchStream, SupportsTriggerAvailableNow {
        private final IcebergTable table;
        private final StructType readSchema;
        private final StructType annotated;
        private final Map<String, String> options;
        private final String streamId;
        private Scans.IcebergScan planned;  // the last micro-batch planned (its reader factory next)

        MicroBatch(IcebergTable table, StructType readSchema, StructType annotated, Map<String, String> options) {
            this.table = table;
            this.readSchema = readSchema;
            this.annotated = annotated;
            this.options = options;
            ObjectNode request = table.catalog.request();
            request.set("ref", table.ref());
            ObjectNode given = request.putObject("options");
            for (Map.Entry<String, String> e : options.entrySet()) {
                given.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
            }
            streamId = table.catalog.callUnchecked("stream_open", request).path("stream_id").asText();
        }

        private ObjectNode request() {
            ObjectNode request = table.catalog.request();
            request.put("stream_id", streamId);
            return request;
        }

        @Override
        public Offset initialOffset() {
            return new JsonOffset(table.catalog.callUnchecked("stream_initial_offset", request()).asText());
        }

        @Override
        public Offset deserializeOffset(String json) {
            return new JsonOffset(json);  // the planner checks it when it walks from it
        }

        @Override
        public ReadLimit getDefaultReadLimit() {
            // Spark takes one limit; the planner applies the other option too
            String files = options.get(MAX_FILES);
            if (files != null && !files.trim().isEmpty()) {
                return ReadLimit.maxFiles(Integer.parseInt(files.trim()));
            }
            String rows = options.get(MAX_ROWS);
            if (rows != null && !rows.trim().isEmpty()) {
                return ReadLimit.maxRows(Long.parseLong(rows.trim()));
            }
            return ReadLimit.allAvailable();
        }

        @Override
        public Offset latestOffset() {
            throw new UnsupportedOperationException("icecrypt catalog: the stream's latest offset needs its start");
        }

        @Override
        public Offset latestOffset(Offset start, ReadLimit limit) {
            ObjectNode request = request();
            request.put("start", start.json());
            ObjectNode given = request.putObject("limit");
            if (limit instanceof ReadMaxFiles) {
                given.put("files", ((ReadMaxFiles) limit).maxFiles());
            } else if (limit instanceof ReadMaxRows) {
                given.put("rows", ((ReadMaxRows) limit).maxRows());
            } else if (!(limit instanceof ReadAllAvailable)) {
                given.put("options", true);
            }
            return new JsonOffset(table.catalog.callUnchecked("stream_latest_offset", request).asText());
        }

        @Override
        public void prepareForTriggerAvailableNow() {
            table.catalog.callUnchecked("stream_available_now", request());
        }

        @Override
        public synchronized InputPartition[] planInputPartitions(Offset start, Offset end) {
            ObjectNode request = request();
            request.put("start", start.json());
            request.put("end", end.json());
            request.put("partition", readSchema.getFieldIndex(Scans.PARTITION_COLUMN).isDefined()
                && annotated.getFieldIndex(Scans.PARTITION_COLUMN).isEmpty());
            JsonNode plan = table.catalog.callUnchecked("stream_plan", request);
            planned = Scans.IcebergScan.of(table, new Predicate[0], readSchema, annotated, plan, false);
            return planned.planInputPartitions();
        }

        @Override
        public synchronized PartitionReaderFactory createReaderFactory() {
            if (planned == null) {
                throw new IllegalStateException("icecrypt catalog: table " + table.name() + ": no micro-batch planned");
            }
            return planned.createReaderFactory();
        }

        @Override
        public void commit(Offset end) {
            ObjectNode request = request();
            request.put("end", end.json());
            table.catalog.callUnchecked("stream_commit", request);
        }

        @Override
        public void stop() {
            table.catalog.callUnchecked("stream_stop", request());
        }

        @Override
        public String toString() {
            return "icecrypt stream of " + table.name();
        }
    }
}
