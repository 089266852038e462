/*
 * icecrypt: the table of a CREATE TABLE ... AS SELECT on an object store.  The Python
 * driver created it when the statement was staged (an object-store table is written
 * through icecrypt.iceberg, which opens the table by name); commitStagedChanges() has
 * nothing left to do, abortStagedChanges() drops it and removes every file under its
 * location (empty when the statement created the table there).  Not atomic: the
 * table is visible, empty, while the statement runs, as with Iceberg's catalogs that do
 * not stage.
 */
package org.icecrypt.spark.catalog;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.connector.catalog.StagedTable;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;

final class StagedSourceTable extends SourceTable implements StagedTable {
    private final CatalogContext context;
    private final JsonNode staged;

    StagedSourceTable(CatalogContext context, JsonNode description) {
        super(context, description);
        this.context = context;
        this.staged = description.path("staged");
    }

    /** (StagedTable's, chosen over the one SupportsDeleteV2 brings: a staged table reports none either way.) */
    @Override
    public CustomTaskMetric[] reportDriverMetrics() {
        return StagedTable.super.reportDriverMetrics();
    }

    @Override
    public void commitStagedChanges() {
        // the rows were committed by the write itself
    }

    @Override
    public void abortStagedChanges() {
        ObjectNode request = context.request();
        request.set("identifier", staged.path("created"));
        request.set("location", staged.path("location"));
        context.callUnchecked("abort_created", request);
    }
}
