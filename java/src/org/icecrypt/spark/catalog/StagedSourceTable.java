/*
 * icecrypt: the table of a CREATE TABLE ... AS SELECT on an object store.  The Python
 * driver created it when the statement was staged (an object-store table is written
 * through icecrypt.iceberg, which opens the table by name); commitStagedChanges() has
 * nothing left to do, abortStagedChanges() drops it with its files.  Not atomic: the
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
    private final JsonNode created;

    StagedSourceTable(CatalogContext context, JsonNode description) {
        super(context, description);
        this.context = context;
        this.created = description.path("staged").path("created");
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
        request.set("identifier", created);
        request.put("purge", true);
        context.callUnchecked("drop_table", request);
    }
}
