/*
 * icecrypt: the physical plan of a copy-on-write UPDATE, MERGE INTO or row-level DELETE
 * of a table on an object store (SourceRewrite).  Spark's own plan (ReplaceDataExec) hands
 * the writer each row by itself; a Python data source's writer takes its rows as one
 * stream, as an append gives them.  So the statement's rows -- each kept, updated or
 * inserted row of the files the scan read, as Spark's ReplaceData projects them -- are
 * written as an append (AppendDataExec) with the rewrite's write, whose commit on the
 * driver replaces the files read by the files written.
 */
package org.icecrypt.spark.catalog;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.catalyst.plans.logical.ReplaceData;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.SparkStrategy;
import org.apache.spark.sql.execution.datasources.v2.AppendDataExec;
import org.apache.spark.sql.execution.datasources.v2.AppendDataExec$;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.apache.spark.sql.connector.write.RowLevelOperationTable;

import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction0;
import scala.runtime.BoxedUnit;

public final class SourceRewriteStrategy extends SparkStrategy {
    private final SparkSession session;

    public SourceRewriteStrategy(SparkSession session) {
        this.session = session;
    }

    @Override
    public Seq<SparkPlan> apply(LogicalPlan plan) {
        List<SparkPlan> out = new ArrayList<>();
        if (plan instanceof ReplaceData) {
            ReplaceData data = (ReplaceData) plan;
            if (data.table() instanceof DataSourceV2Relation && data.write().isDefined()) {
                DataSourceV2Relation relation = (DataSourceV2Relation) data.table();
                Write write = data.write().get();
                if (relation.table() instanceof RowLevelOperationTable
                        && ((RowLevelOperationTable) relation.table()).operation() instanceof SourceRewrite
                        && write instanceof SourceRewrite.Guarded) {
                    out.add(append(data, relation, (SourceRewrite.Guarded) write));
                }
            }
        }
        return CollectionConverters.asScala(out).toList();
    }

    private SparkPlan append(ReplaceData data, DataSourceV2Relation relation, SourceRewrite.Guarded write) {
        // the data columns of each row Spark's ReplaceData writes (its row projection's)
        List<Attribute> output = CollectionConverters.asJava(data.query().output());
        List<NamedExpression> columns = new ArrayList<>();
        for (Object ordinal : CollectionConverters.asJava(data.projections().rowProjection().colOrdinals())) {
            columns.add(output.get((Integer) ordinal));
        }
        if (data.projections().metadataProjection().isDefined()) {  // then the rows' lineage (not _file)
            for (Object ordinal : CollectionConverters.asJava(
                    data.projections().metadataProjection().get().colOrdinals())) {
                Attribute column = output.get((Integer) ordinal);
                if (!Scans.FILE_COLUMN.equals(column.name())) {
                    columns.add(column);
                }
            }
        }
        LogicalPlan rows = new Project(CollectionConverters.asScala(columns).toList(), data.query());
        final org.apache.spark.sql.classic.SparkSession classic = (org.apache.spark.sql.classic.SparkSession) session;
        AbstractFunction0<BoxedUnit> refresh = new AbstractFunction0<BoxedUnit>() {
            @Override
            public BoxedUnit apply() {
                classic.sharedState().cacheManager().recacheByPlan(classic, relation);
                return BoxedUnit.UNIT;
            }
        };
        return new AppendDataExec(planLater(rows), refresh, write.asAppend(), relation.name(),
            AppendDataExec$.MODULE$.apply$default$5());
    }
}
