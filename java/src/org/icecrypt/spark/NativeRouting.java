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
 * Untouched: sessions without a registered planner (Spark Connect, a driver that never
 * called icecrypt.spark.register), relations read with option native=false, the table
 * a write command writes to, streaming reads and plans already analyzed. With option
 * native=true a relation the native path cannot read fails the analysis, saying why.
 * No key passes through here: the DataFrame carries its files' keys as read_table's does.
 */
package org.icecrypt.spark;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.WeakHashMap;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.Alias;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.catalyst.plans.logical.V2WriteCommand;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.apache.spark.sql.execution.datasources.v2.python.PythonTable;
import org.apache.spark.sql.types.Metadata;

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
            // the table written to stays a relation; only what is written may be routed
            V2WriteCommand write = (V2WriteCommand) plan;
            LogicalPlan query = route(write.query(), planner);
            return query == write.query() ? plan : (LogicalPlan) (Object) write.withNewQuery(query);
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

    private static LogicalPlan routed(DataSourceV2Relation relation, Planner planner) {
        Map<String, String> options = new HashMap<>();
        for (Map.Entry<String, String> e : relation.options().entrySet()) {
            options.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        }
        String mode = options.getOrDefault(OPTION, "auto").trim().toLowerCase(Locale.ROOT);
        if (!mode.equals("auto") && !mode.equals("true") && !mode.equals("false")) {
            // as icecrypt.spark.read_table refuses it
            throw new IllegalArgumentException(SOURCE + ": option " + OPTION + "=" + mode + " must be auto, true or false");
        }
        if (mode.equals("false") || !options.containsKey("path")) {
            return relation;
        }
        StringBuilder encoded = new StringBuilder();
        for (Map.Entry<String, String> e : options.entrySet()) {
            if (e.getKey().indexOf('\0') >= 0 || e.getValue().indexOf('\0') >= 0) {
                return relation;  // not an option the native path can be told
            }
            encoded.append(e.getKey()).append('\0').append(e.getValue()).append('\0');
        }
        Object answer;
        PLANNING.set(Boolean.TRUE);
        try {
            answer = planner.plan(encoded.toString());
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
