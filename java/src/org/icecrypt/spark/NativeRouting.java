/*
 * icecrypt: the analyzer rule that sends batch reads of the Python data source
 * icecrypt.iceberg to Spark's own Parquet reader (the native path of icecrypt.spark._native).
 *
 * A Python data source can only run Python tasks, so the choice is made here, when Spark
 * analyzes a plan: a DataSourceV2Relation over the Python table "icecrypt.iceberg" is handed,
 * with its options, to the planner the Python driver registered for the session (over
 * Py4J). The planner plans the table as icecrypt.spark.read_table does and answers with
 * the DataFrame of the native path, or with why the native path does not apply. A
 * DataFrame whose columns have the relation's names and types takes the relation's place,
 * under a projection that keeps the relation's attribute ids (the plan above it is
 * unchanged); otherwise the relation stays and the read runs in Python tasks as before.
 *
 * Writes: an append or a full overwrite of the Python table (AppendData,
 * OverwriteByExpression(true)) gets NativeWrite in the table's place; Spark then hands the
 * DataFrame to the planner's write on the driver, which writes with Spark's own Parquet
 * writer or, when that does not apply, through the Python source (see NativeWrite).
 *
 * Untouched: sessions without a registered planner (Spark Connect, a driver that never
 * called icecrypt.spark.register), relations read or written with option native=false,
 * other write commands (OverwritePartitionsDynamic, row-level commands), streaming reads
 * and writes and plans already analyzed. With option native=true a relation the native
 * path cannot read fails the analysis, saying why (a write the native path cannot take
 * fails when it runs). No key passes through here: a read's DataFrame carries its files'
 * keys as read_table's does, a write's secret is made by the planner.
 */
package org.icecrypt.spark;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.Alias;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.plans.logical.AppendData;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.OverwriteByExpression;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.catalyst.plans.logical.V2WriteCommand;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.catalyst.util.CaseInsensitiveMap$;
import org.apache.spark.sql.execution.datasources.FileFormat;
import org.apache.spark.sql.execution.datasources.FileIndex;
import org.apache.spark.sql.execution.datasources.FileStatusCache;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.InMemoryFileIndex;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation$;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.execution.datasources.PartitioningAwareFileIndex;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.apache.spark.sql.execution.datasources.v2.python.PythonTable;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractPartialFunction;

public final class NativeRouting extends Rule<LogicalPlan> {
    /** The Python data source this rule routes. */
    public static final String SOURCE = "icecrypt.iceberg";
    /** Its read option: auto (default), true (native or an error), false (Python tasks). */
    public static final String OPTION = "native";

    /** What the Python driver implements (icecrypt.spark._native._Planner). */
    public interface Planner {
        /**
         * The native path's DataFrame (its JVM Dataset) for a read of {@code SOURCE} with
         * these options (name, NUL, value, NUL, ...: one string, one Py4J call; names
         * lower-cased, "path" the table), or a String saying why the native path does not
         * apply.
         */
        Object plan(String options);

        /**
         * Write {@code data} (a Dataset) to the table with these options (encoded as for
         * {@link #plan}); {@code overwrite}: it replaces the table's rows.  Runs the write
         * and its commit, or, when the native path does not apply, the Python source's.
         */
        void write(Object data, String options, boolean overwrite);
    }

    /** Session -> its driver's planner (weak: a stopped session is not kept alive here). */
    private static final Map<SparkSession, Planner> PLANNERS = new WeakHashMap<>();
    /** Set while a planner runs on this thread: a plan analyzed on it meanwhile is not routed. */
    private static final ThreadLocal<Boolean> PLANNING = ThreadLocal.withInitial(() -> Boolean.FALSE);

    private final SparkSession session;

    public NativeRouting(SparkSession session) {
        this.session = session;
    }

    public static void register(SparkSession session, Planner planner) {
        synchronized (PLANNERS) {
            PLANNERS.put(session, planner);
        }
    }

    public static void unregister(SparkSession session) {
        synchronized (PLANNERS) {
            PLANNERS.remove(session);
        }
    }

    public static boolean registered(SparkSession session) {
        synchronized (PLANNERS) {
            return PLANNERS.containsKey(session);
        }
    }

    @Override
    public LogicalPlan apply(LogicalPlan plan) {
        Planner planner;
        synchronized (PLANNERS) {
            planner = PLANNERS.get(session);
        }
        if (planner == null || PLANNING.get()) {
            return plan;
        }
        if (plan instanceof V2WriteCommand) {
            // what is written may be routed as any read; the table written to is replaced
            // by NativeWrite for an append or a full overwrite
            V2WriteCommand write = (V2WriteCommand) plan;
            LogicalPlan query = route(write.query(), planner);
            if (query != write.query()) {
                write = write.withNewQuery(query);
            }
            V2WriteCommand native_ = nativeWrite(write, planner);
            return (LogicalPlan) (Object) (native_ != null ? native_ : write);
        }
        return route(plan, planner);
    }

    private LogicalPlan route(LogicalPlan plan, Planner planner) {
        return plan.resolveOperatorsUp(new AbstractPartialFunction<LogicalPlan, LogicalPlan>() {
            @Override
            public boolean isDefinedAt(LogicalPlan node) {
                return ours(node) != null;
            }

            @Override
            public <A1 extends LogicalPlan, B1> B1 applyOrElse(A1 node, scala.Function1<A1, B1> otherwise) {
                DataSourceV2Relation relation = ours(node);
                if (relation == null) {
                    return otherwise.apply(node);
                }
                @SuppressWarnings("unchecked")
                B1 routed = (B1) routed(relation, planner);
                return routed;
            }
        });
    }

    private static DataSourceV2Relation ours(LogicalPlan node) {
        if (node instanceof DataSourceV2Relation) {
            DataSourceV2Relation relation = (DataSourceV2Relation) node;
            if (relation.table() instanceof PythonTable && SOURCE.equalsIgnoreCase(relation.table().name())) {
                return relation;
            }
        }
        return null;
    }

    /**
     * An append or a full overwrite of the Python table, its table replaced by one whose
     * write the planner runs (NativeWrite); null when the write is not one of those.
     */
    private static V2WriteCommand nativeWrite(V2WriteCommand write, Planner planner) {
        if (!(write instanceof AppendData) && !(write instanceof OverwriteByExpression
                && Literal.TrueLiteral().semanticEquals(((OverwriteByExpression) write).deleteExpr()))) {
            return null;
        }
        DataSourceV2Relation relation = ours((LogicalPlan) (Object) write.table());
        if (relation == null) {
            return null;
        }
        Map<String, String> options = options(relation);
        String encoded = encoded(options);
        if (encoded == null || mode(options).equals("false") || !options.containsKey("path")) {
            return null;
        }
        NativeWrite table = new NativeWrite(relation.table(), planner, encoded, options.get("path"));
        return write.withNewTable(relation.copy(table, relation.output(), relation.catalog(), relation.identifier(),
                                                relation.options(), relation.timeTravelSpec()));
    }

    /** The relation's options, names lower-cased. */
    private static Map<String, String> options(DataSourceV2Relation relation) {
        Map<String, String> options = new HashMap<>();
        for (Map.Entry<String, String> e : relation.options().entrySet()) {
            options.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        }
        return options;
    }

    /** Option native: auto, true or false (anything else is refused, as read_table refuses it). */
    private static String mode(Map<String, String> options) {
        String mode = options.getOrDefault(OPTION, "auto").trim().toLowerCase(Locale.ROOT);
        if (!mode.equals("auto") && !mode.equals("true") && !mode.equals("false")) {
            throw new IllegalArgumentException(SOURCE + ": option " + OPTION + "=" + mode + " must be auto, true or false");
        }
        return mode;
    }

    /** name NUL value NUL ...: one string, one Py4J call; null if a name or value holds a NUL. */
    private static String encoded(Map<String, String> options) {
        StringBuilder encoded = new StringBuilder();
        for (Map.Entry<String, String> e : options.entrySet()) {
            if (e.getKey().indexOf('\0') >= 0 || e.getValue().indexOf('\0') >= 0) {
                return null;  // not an option the native path can be told
            }
            encoded.append(e.getKey()).append('\0').append(e.getValue()).append('\0');
        }
        return encoded.toString();
    }

    private static LogicalPlan routed(DataSourceV2Relation relation, Planner planner) {
        Map<String, String> options = options(relation);
        String mode = mode(options);
        String encoded = encoded(options);
        if (mode.equals("false") || !options.containsKey("path") || encoded == null) {
            return relation;
        }
        Object answer;
        PLANNING.set(Boolean.TRUE);
        try {
            answer = planner.plan(encoded);
        } finally {
            PLANNING.set(Boolean.FALSE);
        }
        String why;
        if (answer instanceof Dataset) {
            LogicalPlan native_ = ((Dataset<?>) answer).queryExecution().analyzed();
            why = mismatch(relation.output(), native_.output());
            if (why == null) {
                return renamed(relation.output(), native_);
            }
        } else {
            why = answer == null ? "no answer from the planner" : answer.toString();
        }
        if (mode.equals("true")) {
            throw new IllegalArgumentException(
                SOURCE + ": table " + options.get("path") + ": the native path does not apply (" + why + ")");
        }
        return relation;
    }

    /**
     * The planner's read of its planned files, in one Py4J call (each call from the
     * planner, which runs in Py4J's callback thread, costs a round trip: building this in
     * Python took some 40 of them, about half of a routed read's planning).
     *
     * Spark's file source {@code format} over {@code paths}, read with the schema
     * {@code schemaJson} and {@code options}, its columns cast to {@code outputJson}'s types
     * where Spark's reader gives another type. The strings are NUL-separated: options name,
     * value, name, value, ...; paths one after the other. Sets the session's
     * {@code settings} (same encoding) first.
     *
     * The relation's file index holds the planned files' own statuses (plannedRelation):
     * nothing is listed, and a planned data file replaced by a directory (whose entries,
     * links to files elsewhere among them, a listing would read as data files) throws
     * {@link UnplannedFile} naming it. The files the index holds must still be the planned
     * files, compared as Spark qualifies paths (a listed file that was not planned throws
     * {@link UnplannedFile} naming it); null when the index lists only
     * planned files but not all of them (a hidden file name, which Spark skips even when
     * named: such a read takes the Python path) or is not one whose files can be listed.
     */
    public static Dataset<Row> plannedRead(SparkSession session, String settings, String format, String schemaJson,
            String outputJson, String options, String paths) throws java.io.IOException {
        String[] set = split(settings);
        for (int i = 0; i + 1 < set.length; i += 2) {
            session.conf().set(set[i], set[i + 1]);
        }
        Map<String, String> read = new HashMap<>();
        String[] pairs = split(options);
        for (int i = 0; i + 1 < pairs.length; i += 2) {
            read.put(pairs[i], pairs[i + 1]);
        }
        String[] files = split(paths);
        // the files' statuses are taken without what only the reader needs (the keys, the
        // deletes), which goes into the relation's options only (plannedRelation)
        Map<String, String> readerOnly = new HashMap<>();
        for (String name : READER_ONLY) {
            String value = read.remove(name);
            if (value != null) {
                readerOnly.put(name, value);
            }
        }
        StructType schema = (StructType) DataType.fromJson(schemaJson);
        Dataset<Row> loaded = plannedRelation(session, format, schema, read, readerOnly, files);
        if (loaded == null) {  // another format: as Spark resolves it, with every option
            read.putAll(readerOnly);
            loaded = session.read().format(format).schema(schema).options(read).load(files);
        }
        Set<Path> listed = listedFiles(loaded);
        if (listed == null || !listed.equals(planned(session, files, listed))) {
            return null;
        }
        StructField[] given = loaded.schema().fields();
        StructField[] output = ((StructType) DataType.fromJson(outputJson)).fields();
        boolean same = given.length == output.length;
        for (int i = 0; same && i < given.length; i++) {
            same = given[i].name().equals(output[i].name())
                && given[i].dataType().simpleString().equals(output[i].dataType().simpleString());
        }
        if (same) {
            return loaded;
        }
        Column[] columns = new Column[output.length];
        for (int i = 0; i < output.length; i++) {
            String name = output[i].name();
            columns[i] = functions.col("`" + name.replace("`", "``") + "`").cast(output[i].dataType()).alias(name);
        }
        return loaded.select(columns);
    }

    /**
     * Spark's file source relation over the planned {@code files}, without listing them: the
     * file index is Spark's own (InMemoryFileIndex, so partitions, splits and the scan are as
     * spark.read.load would make them) over the file statuses taken here, on the driver, one
     * status call per file, given to it as its cache. Spark would instead list more than
     * spark.sql.sources.parallelPartitionDiscovery.threshold (32) paths in a job of one task
     * per path, most of the time of a read of many small files. A planned path that is not
     * a file (a directory) throws {@link UnplannedFile}, naming what it holds; a missing one
     * throws FileNotFoundException. Null for a format other than Parquet and LiveRows.
     */
    private static Dataset<Row> plannedRelation(SparkSession session, String format, StructType schema,
            Map<String, String> read, Map<String, String> readerOnly, String[] files) throws java.io.IOException {
        FileFormat fileFormat;
        if ("parquet".equals(format)) {
            fileFormat = new ParquetFileFormat();
        } else if (LiveRows.class.getName().equals(format)) {
            fileFormat = new LiveRows();
        } else {
            return null;
        }
        scala.collection.immutable.Map<String, String> listing = scalaMap(read);
        Configuration conf = session.sessionState().newHadoopConfWithOptions(listing);
        List<Path> roots = new ArrayList<>();
        Map<Path, FileStatus[]> statuses = new HashMap<>();
        for (String file : files) {
            Path path = new Path(file);
            org.apache.hadoop.fs.FileSystem fs = path.getFileSystem(conf);
            Path qualified = fs.makeQualified(path);
            FileStatus status = fs.getFileStatus(qualified);
            if (!status.isFile()) {
                FileStatus[] inside = status.isDirectory() ? fs.listStatus(qualified) : new FileStatus[0];
                throw new UnplannedFile("planned data file " + qualified + " is not a file"
                    + (status.isDirectory() ? ": it is a directory" + (inside.length > 0
                        ? ", which holds " + inside[0].getPath() : "") : "")
                    + " (refused: only the planned data files are read)");
            }
            roots.add(qualified);
            statuses.put(qualified, new FileStatus[] {status});
        }
        FileStatusCache planned = new FileStatusCache() {
            @Override
            public Option<FileStatus[]> getLeafFiles(Path path) {
                return Option.apply(statuses.get(path));
            }

            @Override
            public void putLeafFiles(Path path, FileStatus[] leafFiles) {
                // the planned statuses only
            }

            @Override
            public void invalidateAll() {
                // nothing cached beyond the plan
            }
        };
        InMemoryFileIndex index = new InMemoryFileIndex(session, CollectionConverters.asScala(roots).toList(), listing,
            Option.apply(schema), planned, Option.empty(), Option.empty());
        Map<String, String> options = new HashMap<>(read);
        options.putAll(readerOnly);
        @SuppressWarnings("unchecked")
        scala.collection.immutable.Map<String, String> caseInsensitive =
            (scala.collection.immutable.Map<String, String>) (Object) CaseInsensitiveMap$.MODULE$.apply(scalaMap(options));
        HadoopFsRelation relation = new HadoopFsRelation(index, index.partitionSchema(), schema.asNullable(),
            Option.empty(), fileFormat, caseInsensitive, session);
        return org.apache.spark.sql.classic.Dataset$.MODULE$.ofRows((org.apache.spark.sql.classic.SparkSession) session,
            LogicalRelation$.MODULE$.apply(relation, false));
    }

    private static scala.collection.immutable.Map<String, String> scalaMap(Map<String, String> map) {
        return scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(map));
    }

    /** Read options only the reader of a planned read uses (not the listing of its files). */
    private static final String[] READER_ONLY = {FileKeys.KEYS, LiveRows.DELETES};

    /** A file Spark's file index lists for a native read that the read did not plan. */
    public static final class UnplannedFile extends RuntimeException {
        private static final long serialVersionUID = 1L;

        UnplannedFile(String message) {
            super(message);
        }
    }

    /**
     * The planned {@code files} qualified as Spark's file index qualifies its paths (the
     * file system's scheme and authority); throws {@link UnplannedFile} naming the first
     * file of {@code listed} that is not among them.
     */
    private static Set<Path> planned(SparkSession session, String[] files, Set<Path> listed) throws java.io.IOException {
        Configuration conf = session.sessionState().newHadoopConf();
        Set<Path> planned = new HashSet<>();
        for (String file : files) {
            Path path = new Path(file);
            planned.add(path.getFileSystem(conf).makeQualified(path));
        }
        for (Path path : listed) {
            if (planned.contains(path)) {
                continue;
            }
            Path parent = path.getParent();
            while (parent != null && !planned.contains(parent)) {
                parent = parent.getParent();
            }
            throw new UnplannedFile(parent != null
                ? "planned data file " + parent + " is not a file: it is a directory, in which Spark's file source"
                    + " lists " + path + " (refused: only the planned data files are read)"
                : "Spark's file source lists " + path + ", which is not a planned data file (refused: only the"
                    + " planned data files are read)");
        }
        return planned;
    }

    private static String[] split(String encoded) {
        return encoded.isEmpty() ? new String[0] : encoded.split("\0", -1);
    }

    /**
     * The distinct files Spark's file sources list in {@code data}'s analyzed plan (the
     * files Dataset.inputFiles names, without optimizing the plan first, as Hadoop paths);
     * null when a file source's index is not one whose files can be listed.
     */
    public static Set<Path> listedFiles(Dataset<?> data) {
        Set<Path> files = new HashSet<>();
        List<LogicalPlan> nodes = new ArrayList<>();
        nodes.add(data.queryExecution().analyzed());
        while (!nodes.isEmpty()) {
            LogicalPlan node = nodes.remove(nodes.size() - 1);
            if (node instanceof LogicalRelation && ((LogicalRelation) node).relation() instanceof HadoopFsRelation) {
                FileIndex index = ((HadoopFsRelation) ((LogicalRelation) node).relation()).location();
                if (!(index instanceof PartitioningAwareFileIndex)) {
                    return null;
                }
                for (FileStatus status : CollectionConverters.asJava(((PartitioningAwareFileIndex) index).allFiles())) {
                    files.add(status.getPath());
                }
            }
            nodes.addAll(CollectionConverters.asJava(node.children()));
        }
        return files;
    }

    /** Why the native plan cannot stand for the relation, or null when it can. */
    private static String mismatch(scala.collection.Seq<? extends Attribute> want, scala.collection.Seq<Attribute> got) {
        if (want.size() != got.size()) {
            return "it gives " + got.size() + " columns for " + want.size();
        }
        for (int i = 0; i < want.size(); i++) {
            Attribute w = want.apply(i);
            Attribute g = got.apply(i);
            if (!w.name().equals(g.name()) || !w.dataType().sameType(g.dataType())) {
                return "column " + i + " is " + g.name() + " " + g.dataType().simpleString() + ", not "
                    + w.name() + " " + w.dataType().simpleString();
            }
        }
        return null;
    }

    /** {@code plan} under a projection giving its columns the relation's attribute ids. */
    private static LogicalPlan renamed(scala.collection.Seq<? extends Attribute> want, LogicalPlan plan) {
        List<NamedExpression> columns = new ArrayList<>();
        scala.collection.immutable.Seq<String> none = CollectionConverters.asScala(new ArrayList<String>()).toList();
        for (int i = 0; i < want.size(); i++) {
            Attribute w = want.apply(i);
            columns.add(new Alias(plan.output().apply(i), w.name(), w.exprId(), none, Option.<Metadata>empty(), none));
        }
        return new Project(CollectionConverters.asScala(columns).toList(), plan);
    }
}
