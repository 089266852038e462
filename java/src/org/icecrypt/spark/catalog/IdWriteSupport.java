/*
 * icecrypt: Spark's Parquet write support with Iceberg field ids on list elements and
 * map keys and values too.
 *
 * Spark writes a column's field id (parquet.field.id) on every struct field, but a list's
 * element and a map's key and value are no struct fields: Spark gives them no id, and
 * Iceberg readers, which match columns by id, would not find them.  This subclass takes
 * the schema Spark's write support built and adds the ids the write's configuration maps
 * (icecrypt.nested-ids: JSON, Parquet path -> field id, e.g. "tags.list.element": 9);
 * the rows are written by Spark's code unchanged.
 */
package org.icecrypt.spark.catalog;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.hadoop.conf.Configuration;
import org.apache.parquet.hadoop.api.WriteSupport;
import org.apache.parquet.schema.GroupType;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.Type;
import org.apache.spark.sql.execution.datasources.parquet.ParquetWriteSupport;

public class IdWriteSupport extends ParquetWriteSupport {
    static final String IDS = "icecrypt.nested-ids";

    @Override
    public WriteSupport.WriteContext init(Configuration configuration) {
        WriteSupport.WriteContext context = super.init(configuration);
        String text = configuration.get(IDS, "{}");
        Map<String, Integer> ids = new HashMap<>();
        try {
            JsonNode node = CatalogContext.JSON.readTree(text);
            Iterator<Map.Entry<String, JsonNode>> fields = node.fields();
            while (fields.hasNext()) {
                Map.Entry<String, JsonNode> e = fields.next();
                ids.put(e.getKey(), e.getValue().asInt());
            }
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException("icecrypt: " + IDS + " is not JSON", e);
        }
        if (ids.isEmpty()) {
            return context;
        }
        MessageType schema = context.getSchema();
        List<Type> fields = new ArrayList<>();
        for (Type field : schema.getFields()) {
            fields.add(withIds(field, field.getName(), ids));
        }
        return new WriteSupport.WriteContext(new MessageType(schema.getName(), fields), context.getExtraMetaData());
    }

    private static Type withIds(Type type, String path, Map<String, Integer> ids) {
        Type out = type;
        if (!type.isPrimitive()) {
            GroupType group = type.asGroupType();
            List<Type> fields = new ArrayList<>();
            for (Type field : group.getFields()) {
                fields.add(withIds(field, path + "." + field.getName(), ids));
            }
            out = group.withNewFields(fields);
        }
        Integer id = ids.get(path);
        return id != null ? out.withId(id) : out;
    }
}
