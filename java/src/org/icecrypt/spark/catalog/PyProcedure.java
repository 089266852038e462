/*
 * icecrypt: a stored procedure of the SQL catalog (CALL cat.system.<name>(...)), as the
 * Python driver describes it (icecrypt.spark._sql.procedures).
 *
 * The driver decides everything -- the parameters (Spark types as DDL, SQL defaults), the
 * output schema, what a call does -- so this one class serves every procedure: Spark binds
 * the call's arguments to parameters() (defaults applied, types coerced), call() turns the
 * bound row into JSON (timestamps as microseconds, arrays and string maps as JSON arrays
 * and objects), the driver's call_procedure runs it through icecrypt's table API and
 * answers the output rows.  A procedure that changed a table also answers its identifier:
 * Spark's cached relations of it are refreshed here, from the JVM, after the commit (as
 * Spark's own writes refresh theirs), so a cached query sees the new state.
 */
package org.icecrypt.spark.catalog;

import java.util.Collections;
import java.util.Iterator;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.connector.catalog.procedures.ProcedureParameter;
import org.apache.spark.sql.connector.catalog.procedures.SimpleProcedure;
import org.apache.spark.sql.connector.read.LocalScan;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;

public final class PyProcedure implements SimpleProcedure {
    private final CatalogContext context;
    private final String name;
    private final String description;
    private final ProcedureParameter[] parameters;
    private final StructType output;

    /** The procedure a description (the driver's answer to "procedure") describes. */
    public PyProcedure(CatalogContext context, JsonNode description) {
        this.context = context;
        this.name = description.path("name").asText();
        this.description = description.path("description").asText("");
        JsonNode params = description.path("parameters");
        this.parameters = new ProcedureParameter[params.size()];
        for (int i = 0; i < parameters.length; i++) {
            JsonNode p = params.get(i);
            ProcedureParameter.Builder builder = ProcedureParameter.in(p.path("name").asText(),
                DataType.fromDDL(p.path("type").asText()));
            if (p.hasNonNull("default")) {
                builder = builder.defaultValue(p.path("default").asText());
            }
            if (p.hasNonNull("comment")) {
                builder = builder.comment(p.path("comment").asText());
            }
            parameters[i] = builder.build();
        }
        String output = description.path("output").asText("");
        this.output = output.isBlank() ? new StructType() : StructType.fromDDL(output);  // blank: no result
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public String description() {
        return description;
    }

    @Override
    public ProcedureParameter[] parameters() {
        return parameters;
    }

    @Override
    public boolean isDeterministic() {
        return false;  // it changes a table, or reads one that changes
    }

    @Override
    public Iterator<Scan> call(InternalRow args) {
        ObjectNode request = context.request();
        request.put("name", name);
        ObjectNode values = request.putObject("args");
        for (int i = 0; i < parameters.length; i++) {
            values.set(parameters[i].name(), args.isNullAt(i) ? values.nullNode()
                : toJson(args.get(i, parameters[i].dataType()), parameters[i].dataType()));
        }
        JsonNode answer = context.callUnchecked("call_procedure", request);
        JsonNode rows = answer.path("rows");
        InternalRow[] out = new InternalRow[rows.size()];
        for (int r = 0; r < out.length; r++) {
            StructField[] fields = output.fields();
            Object[] cells = new Object[fields.length];
            for (int c = 0; c < fields.length; c++) {
                cells[c] = CatalogContext.sparkValue(rows.get(r).get(c), fields[c].dataType(), "a procedure output column");
            }
            out[r] = new GenericInternalRow(cells);
        }
        JsonNode changed = answer.get("refresh");
        if (changed != null && changed.isArray()) {
            refresh(CatalogContext.strings(changed));
        }
        Scan scan = new Rows(output, out);
        return Collections.singletonList(scan).iterator();
    }

    /** Refresh Spark's cached relations of the table {@code levels} of this catalog. */
    private void refresh(String[] levels) {
        StringBuilder quoted = new StringBuilder(quote(context.name));
        for (String level : levels) {
            quoted.append('.').append(quote(level));
        }
        SparkSession.active().catalog().refreshTable(quoted.toString());
    }

    private static String quote(String part) {
        return "`" + part.replace("`", "``") + "`";
    }

    // --- values ----------------------------------------------------------------------------

    private static JsonNode toJson(Object value, DataType type) {
        com.fasterxml.jackson.databind.node.JsonNodeFactory json = CatalogContext.JSON.getNodeFactory();
        if (value == null) {
            return json.nullNode();
        }
        if (type instanceof StringType) {
            return json.textNode(value.toString());
        }
        if (type instanceof LongType || type instanceof TimestampType) {
            return json.numberNode((Long) value);
        }
        if (type instanceof IntegerType) {
            return json.numberNode((Integer) value);
        }
        if (type instanceof BooleanType) {
            return json.booleanNode((Boolean) value);
        }
        if (type instanceof ArrayType) {
            DataType element = ((ArrayType) type).elementType();
            ArrayData array = (ArrayData) value;
            ArrayNode out = json.arrayNode();
            for (int i = 0; i < array.numElements(); i++) {
                out.add(array.isNullAt(i) ? json.nullNode() : toJson(array.get(i, element), element));
            }
            return out;
        }
        if (type instanceof MapType) {
            MapType map = (MapType) type;
            MapData data = (MapData) value;
            ObjectNode out = json.objectNode();
            for (int i = 0; i < data.numElements(); i++) {
                Object v = data.valueArray().isNullAt(i) ? null : data.valueArray().get(i, map.valueType());
                out.set(data.keyArray().get(i, map.keyType()).toString(), toJson(v, map.valueType()));
            }
            return out;
        }
        throw new IllegalStateException("icecrypt catalog: a procedure parameter of type " + type.simpleString());
    }

    /** The answered rows, as the scan Spark shows as the CALL's result. */
    private static final class Rows implements LocalScan {
        private final StructType schema;
        private final InternalRow[] rows;

        Rows(StructType schema, InternalRow[] rows) {
            this.schema = schema;
            this.rows = rows;
        }

        @Override
        public InternalRow[] rows() {
            return rows;
        }

        @Override
        public StructType readSchema() {
            return schema;
        }
    }
}
