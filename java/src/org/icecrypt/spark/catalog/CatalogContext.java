/*
 * icecrypt: one SQL catalog's name and options, and its calls to the Python driver
 * (Bridge): requests are JSON objects naming the catalog, answers JSON values or a
 * Failure (the driver's error kind and message), which the catalog maps onto Spark's
 * exceptions.  Serializable parts of a table (what executors need) never hold this.
 */
package org.icecrypt.spark.catalog;

import java.util.Iterator;
import java.util.Map;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.catalyst.analysis.NamespaceAlreadyExistsException;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.NoSuchViewException;
import org.apache.spark.sql.catalyst.analysis.ViewAlreadyExistsException;
import org.apache.spark.sql.catalyst.analysis.NonEmptyNamespaceException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.StagedTable;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;

import scala.Option;

public final class CatalogContext {
    public static final ObjectMapper JSON = new ObjectMapper();

    public final String name;
    final Map<String, String> options;

    public CatalogContext(String name, Map<String, String> options) {
        this.name = name;
        this.options = options;
    }

    /** A new request naming this catalog (its name and options). */
    public ObjectNode request() {
        ObjectNode request = JSON.createObjectNode();
        ObjectNode spec = request.putObject("catalog");
        spec.put("name", name);
        ObjectNode values = spec.putObject("options");
        for (Map.Entry<String, String> e : options.entrySet()) {
            values.put(e.getKey(), e.getValue());
        }
        return request;
    }

    /** The driver's answer to {@code method}, or its failure. */
    public JsonNode call(String method, ObjectNode request) throws Failure {
        return answer(Bridge.driver(name).call(method, request.toString()));
    }

    /** As call(), a failure thrown as the unchecked exception Spark shows. */
    public JsonNode callUnchecked(String method, ObjectNode request) {
        try {
            return call(method, request);
        } catch (Failure e) {
            throw e.unchecked();
        }
    }

    /** The JVM Dataset the driver answers {@code name} with. */
    Object dataset(String what, ObjectNode request) {
        Object answer = Bridge.driver(name).dataset(what, request.toString());
        if (answer instanceof String) {
            try {
                answer((String) answer);
            } catch (Failure e) {
                throw e.unchecked();
            }
            throw new IllegalStateException("icecrypt catalog: the driver answered no dataset");
        }
        return answer;
    }

    static JsonNode answer(String answer) throws Failure {
        if (answer == null) {
            throw new IllegalStateException("icecrypt catalog: no answer from the icecrypt driver");
        }
        JsonNode node;
        try {
            node = JSON.readTree(answer);
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("icecrypt catalog: the icecrypt driver's answer is not JSON");
        }
        JsonNode error = node.get("error");
        if (error != null) {
            throw new Failure(error.path("kind").asText("failed"), error.path("message").asText(""));
        }
        return node.get("ok");
    }

    /** The Spark table a table description (the driver's load_table answer) describes. */
    public Table table(JsonNode description, String version, Long timestampMicros) {
        if ("metadata".equals(description.path("kind").asText())) {
            return new MetadataTable(this, description, version, timestampMicros);
        }
        if ("source".equals(description.path("kind").asText())) {
            return new SourceTable(this, description);
        }
        return new IcebergTable(this, description);
    }

    /** The staged table of a stage answer (CTAS / RTAS). */
    public StagedTable staged(JsonNode description) {
        if ("source".equals(description.path("kind").asText())) {
            return new StagedSourceTable(this, description);
        }
        return new StagedIcebergTable(this, description);
    }

    // --- JSON helpers ------------------------------------------------------------------------

    public static ArrayNode identifier(ObjectNode request, String field, Identifier ident) {
        ArrayNode levels = request.putArray(field);
        for (String level : ident.namespace()) {
            levels.add(level);
        }
        levels.add(ident.name());
        return levels;
    }

    public static ArrayNode namespace(ObjectNode request, String field, String[] namespace) {
        ArrayNode levels = request.putArray(field);
        for (String level : namespace) {
            levels.add(level);
        }
        return levels;
    }

    public static String[] strings(JsonNode array) {
        String[] out = new String[array == null || array.isNull() ? 0 : array.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = array.get(i).asText();
        }
        return out;
    }

    public static Map<String, String> stringMap(JsonNode object) {
        Map<String, String> out = new java.util.LinkedHashMap<>();
        if (object != null) {
            Iterator<Map.Entry<String, JsonNode>> fields = object.fields();
            while (fields.hasNext()) {
                Map.Entry<String, JsonNode> e = fields.next();
                out.put(e.getKey(), e.getValue().isNull() ? null : e.getValue().asText());
            }
        }
        return out;
    }

    /**
     * A value the Python driver sent as JSON, as Spark holds it ({@code what} names it in the
     * error for a type with no JSON form): strings, numbers (a non-finite float by name,
     * dates as days, timestamps as microseconds), booleans, binary as base64, decimals as
     * their unscaled digits, arrays.
     */
    static Object sparkValue(JsonNode value, DataType type, String what) {
        if (value == null || value.isNull()) {
            return null;
        }
        if (type instanceof StringType) {
            return UTF8String.fromString(value.asText());
        }
        if (type instanceof LongType || type instanceof TimestampType || type instanceof TimestampNTZType) {
            return value.asLong();
        }
        if (type instanceof IntegerType || type instanceof DateType) {
            return value.asInt();
        }
        if (type instanceof BooleanType) {
            return value.asBoolean();
        }
        if (type instanceof FloatType || type instanceof DoubleType) {
            double number = value.isTextual() ? Double.parseDouble(value.asText()) : value.asDouble();
            return type instanceof FloatType ? (Object) (float) number : (Object) number;
        }
        if (type instanceof BinaryType) {
            return java.util.Base64.getDecoder().decode(value.asText());
        }
        if (type instanceof DecimalType) {
            DecimalType decimal = (DecimalType) type;
            return Decimal.apply(new java.math.BigDecimal(new java.math.BigInteger(value.asText()), decimal.scale()),
                                 decimal.precision(), decimal.scale());
        }
        if (type instanceof ArrayType) {
            DataType element = ((ArrayType) type).elementType();
            Object[] items = new Object[value.size()];
            for (int i = 0; i < items.length; i++) {
                items[i] = sparkValue(value.get(i), element, what);
            }
            return new GenericArrayData(items);
        }
        throw new IllegalStateException("icecrypt catalog: " + what + " of type " + type.simpleString());
    }

    /** A failure the Python driver reported: its kind and message. */
    public static final class Failure extends Exception {
        private static final long serialVersionUID = 1L;
        final String kind;

        Failure(String kind, String message) {
            super(message, null, false, false);
            this.kind = kind;
        }

        /** As the unchecked exception Spark shows (for calls whose signature allows no other). */
        public RuntimeException unchecked() {
            switch (kind) {
                case "invalid":
                case "no_such_table":
                case "no_such_view":
                case "no_such_namespace":
                case "table_exists":
                case "view_exists":
                case "namespace_exists":
                case "namespace_not_empty":
                    return new IllegalArgumentException(getMessage());
                case "unsupported":
                    return new UnsupportedOperationException(getMessage());
                case "conflict":
                    return new CommitConflictException(getMessage());
                default:
                    return new IcecryptException(getMessage());
            }
        }

        public NoSuchTableException noSuchTable(Identifier ident) {
            return "no_such_table".equals(kind) ? new NoSuchTableException(ident) : null;
        }

        public NoSuchViewException noSuchView(Identifier ident) {
            return "no_such_view".equals(kind) ? new NoSuchViewException(ident) : null;
        }

        public ViewAlreadyExistsException viewExists(Identifier ident) {
            return "view_exists".equals(kind) ? new ViewAlreadyExistsException(ident) : null;
        }

        public NoSuchNamespaceException noSuchNamespace(String[] namespace) {
            return "no_such_namespace".equals(kind) ? new NoSuchNamespaceException(namespace) : null;
        }

        public TableAlreadyExistsException tableExists(Identifier ident) {
            return "table_exists".equals(kind) ? new TableAlreadyExistsException(ident) : null;
        }

        public NamespaceAlreadyExistsException namespaceExists(String[] namespace) {
            return "namespace_exists".equals(kind) ? new NamespaceAlreadyExistsException(namespace) : null;
        }

        public NonEmptyNamespaceException notEmpty(String[] namespace) {
            return "namespace_not_empty".equals(kind)
                ? new NonEmptyNamespaceException(namespace, getMessage(), Option.<Throwable>empty()) : null;
        }
    }

    /** A failure of icecrypt's driver (a commit, reading metadata, the KMS). */
    public static class IcecryptException extends RuntimeException {
        private static final long serialVersionUID = 1L;

        public IcecryptException(String message) {
            super(message);
        }
    }

    /** A commit refused because another writer committed first (nothing was committed). */
    public static final class CommitConflictException extends IcecryptException {
        private static final long serialVersionUID = 1L;

        public CommitConflictException(String message) {
            super(message);
        }
    }
}
