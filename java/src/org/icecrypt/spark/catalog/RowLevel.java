/*
 * icecrypt: what the catalog's row-level operations (CopyOnWrite, MergeOnRead) share --
 * the table and command, the scan Spark built for the statement, what that scan read as
 * the write reports it to the driver at begin and at commit, and the row lineage columns
 * the rows carry.
 */
package org.icecrypt.spark.catalog;

import java.util.Locale;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.write.RowLevelOperation;

abstract class RowLevel implements RowLevelOperation {
    final IcebergTable table;
    private final Command command;
    private final String mode;
    volatile Scans.IcebergScan scan;  // the last scan Spark built for the statement

    RowLevel(IcebergTable table, Command command, String mode) {
        this.table = table;
        this.command = command;
        this.mode = mode;
    }

    @Override
    public Command command() {
        return command;
    }

    @Override
    public String description() {
        return "icecrypt " + mode + " " + command.name().toLowerCase(Locale.ROOT) + " of " + table.name();
    }

    /**
     * {@code columns} and, for a table with row lineage, _row_id and
     * _last_updated_sequence_number: Spark reads them with the rows and hands them to the
     * write with each row it writes again (a copied or updated row keeps its _row_id; as
     * the metadata columns say, an updated row's sequence number is dropped, so that it
     * takes the new commit's), which stores them in the new files as Iceberg does.
     */
    NamedReference[] withLineage(NamedReference[] columns) {
        NamedReference[] lineage = table.lineageColumns();
        NamedReference[] out = java.util.Arrays.copyOf(columns, columns.length + lineage.length);
        System.arraycopy(lineage, 0, out, columns.length, lineage.length);
        return out;
    }

    /**
     * What the scan read: the command, the data files (a runtime filter applied) and the
     * snapshot.  A statement whose condition Spark found always false reads nothing (its
     * scan is replaced by an empty relation): no file, at the statement's snapshot.
     */
    ObjectNode read() {
        ObjectNode out = CatalogContext.JSON.createObjectNode();
        out.put("command", command.name().toLowerCase(Locale.ROOT));
        ArrayNode files = out.putArray("data_files");
        Scans.IcebergScan planned = scan;
        if (planned == null) {
            out.set("snapshot_id", table.ref().get("snapshot_id"));
            return out;
        }
        for (String file : planned.dataFiles()) {
            files.add(file);
        }
        out.set("snapshot_id", planned.plan.get("snapshot_id"));
        return out;
    }
}
