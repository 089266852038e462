/*
 * icecrypt's Spark session extensions (spark.sql.extensions=org.icecrypt.spark.Extensions,
 * set by icecrypt.spark.configure): the NativeRouting analyzer rule.
 */
package org.icecrypt.spark;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;

import scala.runtime.AbstractFunction1;
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
        return BoxedUnit.UNIT;
    }
}
