/*
 * icecrypt: what the catalog's row-level operations (CopyOnWrite, MergeOnRead) share --
 * the table and command, the scan Spark built for the statement, and what that scan read
 * as the write reports it to the driver at begin and at commit.
 */
package org.icecrypt.spark.catalog;

import java.util.Locale;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

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
