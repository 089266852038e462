/*
 * icecrypt's Spark session extensions (spark.sql.extensions=org.icecrypt.spark.Extensions,
 * set by icecrypt.spark.configure): the NativeRouting analyzer rule, the parser of Iceberg's
 * ALTER TABLE extensions for the tables of icecrypt's SQL catalog (SqlExtensionsParser), and
 * the plan of row-level statements on the catalog's tables on object stores
 * (SourceRewriteStrategy).
 */
package org.icecrypt.spark;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.parser.ParserInterface;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.SparkStrategy;

import org.icecrypt.spark.catalog.SourceRewriteStrategy;

import scala.runtime.AbstractFunction1;
import scala.runtime.AbstractFunction2;
import scala.runtime.BoxedUnit;

public final class Extensions extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        extensions.injectPostHocResolutionRule(new AbstractFunction1<SparkSession, Rule<LogicalPlan>>() {
            @Override
            public Rule<LogicalPlan> apply(SparkSession session) {
                return new NativeRouting(session);
            }
        });
        extensions.injectPlannerStrategy(new AbstractFunction1<SparkSession, SparkStrategy>() {
            @Override
            public SparkStrategy apply(SparkSession session) {
                return new SourceRewriteStrategy(session);
            }
        });
        extensions.injectParser(new AbstractFunction2<SparkSession, ParserInterface, ParserInterface>() {
            @Override
            public ParserInterface apply(SparkSession session, ParserInterface delegate) {
                return new SqlExtensionsParser(session, delegate);
            }
        });
        return BoxedUnit.UNIT;
    }
}
