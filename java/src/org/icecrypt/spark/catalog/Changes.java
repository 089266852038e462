/*
 * icecrypt: Spark's transforms, table changes and predicates as the JSON the Python
 * driver reads (icecrypt.spark._sql).  A predicate with a part that has no JSON form
 * (a function, a literal of a complex type) has none as a whole: it is left to Spark.
 */
package org.icecrypt.spark.catalog;

import java.math.BigDecimal;
import java.util.Base64;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.connector.catalog.ColumnDefaultValue;
import org.apache.spark.sql.connector.catalog.DefaultValue;
import org.apache.spark.sql.connector.catalog.TableChange;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Literal;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;

public final class Changes {
    private Changes() {
    }

    private static ObjectNode object() {
        return CatalogContext.JSON.createObjectNode();
    }

    // --- transforms ------------------------------------------------------------------------

    /** {"name": ..., "args": [{"ref": [...]} | {"lit": ...}]} */
    public static ObjectNode transform(Transform transform) {
        ObjectNode out = object();
        out.put("name", transform.name());
        ArrayNode args = out.putArray("args");
        for (Expression arg : transform.arguments()) {
            if (arg instanceof NamedReference) {
                ArrayNode ref = args.addObject().putArray("ref");
                for (String part : ((NamedReference) arg).fieldNames()) {
                    ref.add(part);
                }
            } else if (arg instanceof Literal) {
                ObjectNode lit = args.addObject();
                Object value = ((Literal<?>) arg).value();
                if (value instanceof Integer || value instanceof Long || value instanceof Short) {
                    lit.put("lit", ((Number) value).longValue());
                } else {
                    lit.put("lit", String.valueOf(value));
                }
            } else {
                args.addObject().put("other", arg.toString());
            }
        }
        return out;
    }

    // --- table changes ---------------------------------------------------------------------

    private static ArrayNode path(ObjectNode out, String[] names) {
        ArrayNode path = out.putArray("path");
        for (String name : names) {
            path.add(name);
        }
        return path;
    }

    private static JsonNode type(DataType type) {
        try {
            return CatalogContext.JSON.readTree(type.json());
        } catch (java.io.IOException e) {
            throw new IllegalStateException("icecrypt catalog: a type that is not JSON", e);
        }
    }

    private static void position(ObjectNode out, TableChange.ColumnPosition position) {
        if (position instanceof TableChange.First) {
            out.putObject("position").put("first", true);
        } else if (position instanceof TableChange.After) {
            out.putObject("position").put("after", ((TableChange.After) position).column());
        }
    }

    public static ObjectNode change(TableChange change) {
        ObjectNode out = object();
        out.put("shown", change.toString());
        if (change instanceof TableChange.SetProperty) {
            TableChange.SetProperty set = (TableChange.SetProperty) change;
            out.put("op", "set_property").put("key", set.property()).put("value", set.value());
        } else if (change instanceof TableChange.RemoveProperty) {
            out.put("op", "remove_property").put("key", ((TableChange.RemoveProperty) change).property());
        } else if (change instanceof TableChange.AddColumn) {
            TableChange.AddColumn add = (TableChange.AddColumn) change;
            out.put("op", "add_column");
            path(out, add.fieldNames());
            out.set("type", type(add.dataType()));
            out.put("nullable", add.isNullable());
            out.put("comment", add.comment());
            position(out, add.position());
            if (add.defaultValue() != null) {
                out.put("default", add.defaultValue().getSql());
                out.set("default_value", defaultLiteral(add.defaultValue().getValue(), add.defaultValue().getSql()));
            }
        } else if (change instanceof TableChange.UpdateColumnDefaultValue) {
            TableChange.UpdateColumnDefaultValue update = (TableChange.UpdateColumnDefaultValue) change;
            out.put("op", "update_default");
            path(out, update.fieldNames());
            DefaultValue value = update.newCurrentDefault();
            if (value == null || update.newDefaultValue() == null || update.newDefaultValue().isEmpty()) {
                out.putNull("default_value");
            } else {
                Literal<?> literal = value instanceof ColumnDefaultValue ? ((ColumnDefaultValue) value).getValue()
                    : value.getExpression() instanceof Literal ? (Literal<?>) value.getExpression() : null;
                String sql = value.getSql() != null ? value.getSql() : update.newDefaultValue();
                out.set("default_value", defaultLiteral(literal, sql));
            }
        } else if (change instanceof TableChange.RenameColumn) {
            TableChange.RenameColumn rename = (TableChange.RenameColumn) change;
            out.put("op", "rename_column").put("new_name", rename.newName());
            path(out, rename.fieldNames());
        } else if (change instanceof TableChange.UpdateColumnType) {
            TableChange.UpdateColumnType update = (TableChange.UpdateColumnType) change;
            out.put("op", "update_type");
            path(out, update.fieldNames());
            out.set("type", type(update.newDataType()));
        } else if (change instanceof TableChange.UpdateColumnNullability) {
            TableChange.UpdateColumnNullability update = (TableChange.UpdateColumnNullability) change;
            out.put("op", "update_nullability").put("nullable", update.nullable());
            path(out, update.fieldNames());
        } else if (change instanceof TableChange.UpdateColumnComment) {
            TableChange.UpdateColumnComment update = (TableChange.UpdateColumnComment) change;
            out.put("op", "update_comment").put("comment", update.newComment());
            path(out, update.fieldNames());
        } else if (change instanceof TableChange.UpdateColumnPosition) {
            TableChange.UpdateColumnPosition update = (TableChange.UpdateColumnPosition) change;
            out.put("op", "update_position");
            path(out, update.fieldNames());
            position(out, update.position());
        } else if (change instanceof TableChange.DeleteColumn) {
            TableChange.DeleteColumn delete = (TableChange.DeleteColumn) change;
            out.put("op", "delete_column").put("if_exists", Boolean.TRUE.equals(delete.ifExists()));
            path(out, delete.fieldNames());
        } else {
            out.put("op", "other");
        }
        return out;
    }

    // --- predicates --------------------------------------------------------------------------

    /** The JSON form of {@code predicate}, or null when a part of it has none. */
    public static ObjectNode predicate(Predicate predicate) {
        try {
            return (ObjectNode) expression(predicate);
        } catch (Unsupported e) {
            return null;
        }
    }

    private static final class Unsupported extends Exception {
        private static final long serialVersionUID = 1L;

        Unsupported() {
            super(null, null, false, false);
        }
    }

    private static JsonNode expression(Expression expression) throws Unsupported {
        if (expression instanceof NamedReference) {
            ObjectNode out = object();
            ArrayNode ref = out.putArray("ref");
            for (String part : ((NamedReference) expression).fieldNames()) {
                ref.add(part);
            }
            return out;
        }
        if (expression instanceof Literal) {
            return literal((Literal<?>) expression);
        }
        if (expression instanceof Predicate) {
            Predicate predicate = (Predicate) expression;
            ObjectNode out = object();
            out.put("op", predicate.name());
            ArrayNode args = out.putArray("args");
            for (Expression child : predicate.children()) {
                args.add(expression(child));
            }
            return out;
        }
        throw new Unsupported();
    }

    /** The field metadata key a CREATE TABLE column's default travels in (JSON: defaultLiteral). */
    public static final String DEFAULT_METADATA = "icecrypt.default";

    /** A column default as the JSON literal the driver converts ({"unsupported": sql} when it has no JSON form). */
    public static JsonNode defaultLiteral(Literal<?> value, String sql) {
        if (value != null) {
            try {
                return literal(value);
            } catch (Unsupported e) {
                // falls through
            }
        }
        ObjectNode out = object();
        out.put("unsupported", sql);
        return out;
    }

    private static ObjectNode literal(Literal<?> literal) throws Unsupported {
        ObjectNode out = object();
        DataType type = literal.dataType();
        Object value = literal.value();
        out.put("type", type.typeName());
        if (value == null) {
            out.putNull("lit");
        } else if (type instanceof BooleanType) {
            out.put("lit", (Boolean) value);
        } else if (type instanceof IntegerType || type instanceof ShortType || type instanceof ByteType
                || type instanceof LongType || type instanceof DateType || type instanceof TimestampType
                || type instanceof TimestampNTZType) {
            out.put("lit", ((Number) value).longValue());
        } else if (type instanceof FloatType || type instanceof DoubleType) {
            out.put("lit", String.valueOf(((Number) value).doubleValue()));  // NaN and infinities have no JSON number
        } else if (type instanceof DecimalType) {
            BigDecimal decimal = ((Decimal) value).toJavaBigDecimal();
            out.put("lit", decimal.toPlainString());
            out.put("scale", ((DecimalType) type).scale());
        } else if (type instanceof StringType) {
            out.put("lit", ((UTF8String) value).toString());
        } else if (type instanceof BinaryType) {
            out.put("lit", Base64.getEncoder().encodeToString((byte[]) value));
        } else if (value instanceof ArrayData) {
            throw new Unsupported();
        } else {
            throw new Unsupported();
        }
        return out;
    }
}
