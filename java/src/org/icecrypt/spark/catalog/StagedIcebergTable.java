/*
 * icecrypt: the table of a CREATE/REPLACE TABLE ... AS SELECT (and of DataFrameWriterV2's
 * create, replace, createOrReplace) until Spark commits or aborts the statement.
 *
 * The Python driver staged it (icecrypt.spark._sql.write: a transaction whose commits
 * nobody sees): the write's data files are committed into the transaction, and
 * commitStagedChanges() publishes the table -- created with its rows, or replaced -- in
 * one step; abortStagedChanges() discards everything the statement wrote.
 */
package org.icecrypt.spark.catalog;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.connector.catalog.StagedTable;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;

final class StagedIcebergTable extends IcebergTable implements StagedTable {
    StagedIcebergTable(CatalogContext catalog, JsonNode description) {
        super(catalog, description);
    }

    private ObjectNode request() {
        ObjectNode request = catalog.request();
        request.put("stage", description.path("ref").path("stage").asText());
        return request;
    }

    /** (StagedTable's, chosen over the one SupportsDeleteV2 brings: a staged table reports none either way.) */
    @Override
    public CustomTaskMetric[] reportDriverMetrics() {
        return StagedTable.super.reportDriverMetrics();
    }

    @Override
    public void commitStagedChanges() {
        catalog.callUnchecked("commit_stage", request());
    }

    @Override
    public void abortStagedChanges() {
        catalog.callUnchecked("abort_stage", request());
    }
}
