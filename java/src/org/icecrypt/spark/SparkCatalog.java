/*
 * icecrypt's Spark SQL catalog: Iceberg tables of icecrypt's catalogs -- encrypted or
 * not -- by name, with Iceberg's Spark SQL.
 *
 *   spark.sql.catalog.enc                          org.icecrypt.spark.SparkCatalog
 *   spark.sql.catalog.enc.type                     sql | glue | hadoop
 *   spark.sql.catalog.enc.warehouse                <dir or URI>
 *   spark.sql.catalog.enc.uri                      <SQLAlchemy URL> (sql; default SQLite in the warehouse)
 *   spark.sql.catalog.enc.encryption.kms-type      local | aws | gcp | azure | vault | kmip | pkcs11
 *   spark.sql.catalog.enc.encryption.kms.*         the KMS client's properties
 *
 * Every decision is icecrypt's Python driver's (org.icecrypt.spark.catalog.Bridge): this
 * class turns Spark's catalog calls into bridge calls and their answers into Spark's
 * tables (IcebergTable, MetadataTable, StagedIcebergTable) and exceptions.  Scans read
 * with Spark's own Parquet reader, writes write with Spark's own Parquet writer (see
 * catalog/Scans and catalog/Writes); Iceberg's partition transforms are the catalog's
 * functions (catalog/Transforms: years, months, days, hours, bucket, truncate), which
 * also lets Spark cluster a write by them.  Iceberg's stored procedures (CALL
 * cat.system.rollback_to_snapshot(...), ...) are the catalog's procedures, in its namespace
 * system as in Iceberg: each one is described and run by the driver (catalog/PyProcedure).
 *
 * Views (CREATE [OR REPLACE] VIEW, ALTER VIEW ... RENAME TO, DROP VIEW, SHOW VIEWS) are Spark
 * 4's own V2 views, kept by the driver as Iceberg view metadata (icecrypt.catalog._views).
 *
 * The catalog is built by Spark when a statement first names it; initialize() only keeps
 * its name and options.  It keeps no table cache: every statement loads what it names.
 */
package org.icecrypt.spark;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.catalyst.analysis.NamespaceAlreadyExistsException;
import org.apache.spark.sql.catalyst.analysis.NoSuchFunctionException;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.NoSuchViewException;
import org.apache.spark.sql.catalyst.analysis.ViewAlreadyExistsException;
import org.apache.spark.sql.catalyst.analysis.NonEmptyNamespaceException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.FunctionCatalog;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.NamespaceChange;
import org.apache.spark.sql.connector.catalog.ProcedureCatalog;
import org.apache.spark.sql.connector.catalog.StagedTable;
import org.apache.spark.sql.connector.catalog.StagingTableCatalog;
import org.apache.spark.sql.connector.catalog.SupportsNamespaces;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableChange;
import org.apache.spark.sql.connector.catalog.TableInfo;
import org.apache.spark.sql.connector.catalog.Relation;
import org.apache.spark.sql.connector.catalog.RelationCatalog;
import org.apache.spark.sql.connector.catalog.View;
import org.apache.spark.sql.connector.catalog.functions.UnboundFunction;
import org.apache.spark.sql.connector.catalog.procedures.UnboundProcedure;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.MetadataBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

import org.icecrypt.spark.catalog.CatalogContext;
import org.icecrypt.spark.catalog.Changes;
import org.icecrypt.spark.catalog.PyProcedure;
import org.icecrypt.spark.catalog.Transforms;

public class SparkCatalog implements StagingTableCatalog, SupportsNamespaces, FunctionCatalog, ProcedureCatalog,
        RelationCatalog {
    private CatalogContext context;

    public SparkCatalog() {
    }

    @Override
    public void initialize(String name, CaseInsensitiveStringMap options) {
        this.context = new CatalogContext(name, new LinkedHashMap<>(options.asCaseSensitiveMap()));
    }

    @Override
    public java.util.Set<org.apache.spark.sql.connector.catalog.TableCatalogCapability> capabilities() {
        // column DEFAULTs: Iceberg's write-default (and, added to a table, initial-default)
        return java.util.EnumSet.of(
            org.apache.spark.sql.connector.catalog.TableCatalogCapability.SUPPORT_COLUMN_DEFAULT_VALUE);
    }

    @Override
    public String name() {
        return context.name;
    }

    // --- namespaces -------------------------------------------------------------------------

    @Override
    public String[][] listNamespaces() throws NoSuchNamespaceException {
        return listNamespaces(new String[0]);
    }

    @Override
    public String[][] listNamespaces(String[] namespace) throws NoSuchNamespaceException {
        ObjectNode request = context.request();
        CatalogContext.namespace(request, "parent", namespace);
        JsonNode answer;
        try {
            answer = context.call("list_namespaces", request);
        } catch (CatalogContext.Failure e) {
            NoSuchNamespaceException missing = e.noSuchNamespace(namespace);
            if (missing != null) {
                throw missing;
            }
            throw e.unchecked();
        }
        String[][] out = new String[answer.size()][];
        for (int i = 0; i < out.length; i++) {
            out[i] = CatalogContext.strings(answer.get(i));
        }
        return out;
    }

    @Override
    public boolean namespaceExists(String[] namespace) {
        ObjectNode request = context.request();
        CatalogContext.namespace(request, "namespace", namespace);
        return context.callUnchecked("namespace_exists", request).asBoolean();
    }

    @Override
    public Map<String, String> loadNamespaceMetadata(String[] namespace) throws NoSuchNamespaceException {
        ObjectNode request = context.request();
        CatalogContext.namespace(request, "namespace", namespace);
        try {
            return CatalogContext.stringMap(context.call("namespace_metadata", request));
        } catch (CatalogContext.Failure e) {
            NoSuchNamespaceException missing = e.noSuchNamespace(namespace);
            if (missing != null) {
                throw missing;
            }
            throw e.unchecked();
        }
    }

    @Override
    public void createNamespace(String[] namespace, Map<String, String> metadata)
            throws NamespaceAlreadyExistsException {
        ObjectNode request = context.request();
        CatalogContext.namespace(request, "namespace", namespace);
        ObjectNode properties = request.putObject("properties");
        for (Map.Entry<String, String> e : metadata.entrySet()) {
            properties.put(e.getKey(), e.getValue());
        }
        try {
            context.call("create_namespace", request);
        } catch (CatalogContext.Failure e) {
            NamespaceAlreadyExistsException exists = e.namespaceExists(namespace);
            if (exists != null) {
                throw exists;
            }
            throw e.unchecked();
        }
    }

    @Override
    public void alterNamespace(String[] namespace, NamespaceChange... changes) throws NoSuchNamespaceException {
        ObjectNode request = context.request();
        CatalogContext.namespace(request, "namespace", namespace);
        ObjectNode set = request.putObject("set");
        ArrayNode remove = request.putArray("remove");
        for (NamespaceChange change : changes) {
            if (change instanceof NamespaceChange.SetProperty) {
                NamespaceChange.SetProperty property = (NamespaceChange.SetProperty) change;
                set.put(property.property(), property.value());
            } else if (change instanceof NamespaceChange.RemoveProperty) {
                remove.add(((NamespaceChange.RemoveProperty) change).property());
            } else {
                throw new UnsupportedOperationException("icecrypt catalog '" + context.name + "': namespace "
                    + String.join(".", namespace) + ": " + change + " is not supported");
            }
        }
        try {
            context.call("alter_namespace", request);
        } catch (CatalogContext.Failure e) {
            NoSuchNamespaceException missing = e.noSuchNamespace(namespace);
            if (missing != null) {
                throw missing;
            }
            throw e.unchecked();
        }
    }

    @Override
    public boolean dropNamespace(String[] namespace, boolean cascade)
            throws NoSuchNamespaceException, NonEmptyNamespaceException {
        ObjectNode request = context.request();
        CatalogContext.namespace(request, "namespace", namespace);
        request.put("cascade", cascade);
        try {
            return context.call("drop_namespace", request).asBoolean();
        } catch (CatalogContext.Failure e) {
            NoSuchNamespaceException missing = e.noSuchNamespace(namespace);
            if (missing != null) {
                throw missing;
            }
            NonEmptyNamespaceException notEmpty = e.notEmpty(namespace);
            if (notEmpty != null) {
                throw notEmpty;
            }
            throw e.unchecked();
        }
    }

    // --- tables ---------------------------------------------------------------------------------

    @Override
    public Identifier[] listTables(String[] namespace) throws NoSuchNamespaceException {
        return list("list_tables", namespace);
    }

    /** The identifiers the driver's list_tables or list_views answers for namespace. */
    private Identifier[] list(String method, String[] namespace) throws NoSuchNamespaceException {
        ObjectNode request = context.request();
        CatalogContext.namespace(request, "namespace", namespace);
        JsonNode answer;
        try {
            answer = context.call(method, request);
        } catch (CatalogContext.Failure e) {
            NoSuchNamespaceException missing = e.noSuchNamespace(namespace);
            if (missing != null) {
                throw missing;
            }
            throw e.unchecked();
        }
        Identifier[] out = new Identifier[answer.size()];
        for (int i = 0; i < out.length; i++) {
            String[] levels = CatalogContext.strings(answer.get(i));
            out[i] = Identifier.of(java.util.Arrays.copyOf(levels, levels.length - 1), levels[levels.length - 1]);
        }
        return out;
    }

    @Override
    public Table loadTable(Identifier ident) throws NoSuchTableException {
        return load(ident, null, null);
    }

    @Override
    public Table loadTable(Identifier ident, String version) throws NoSuchTableException {
        return load(ident, version, null);
    }

    @Override
    public Table loadTable(Identifier ident, long timestampMicros) throws NoSuchTableException {
        return load(ident, null, timestampMicros);
    }

    private Table load(Identifier ident, String version, Long timestampMicros) throws NoSuchTableException {
        ObjectNode request = context.request();
        CatalogContext.identifier(request, "identifier", ident);
        if (version != null) {
            request.put("version", version);
        }
        if (timestampMicros != null) {
            request.put("timestamp", timestampMicros.longValue());
        }
        // Iceberg's write-audit-publish session settings (the driver applies them to tables
        // with write.wap.enabled=true, as Iceberg's runtime does)
        org.apache.spark.sql.internal.SQLConf conf = org.apache.spark.sql.internal.SQLConf.get();
        for (String[] setting : new String[][] {{"spark.wap.branch", "wap_branch"}, {"spark.wap.id", "wap_id"}}) {
            String value = conf.getConfString(setting[0], null);
            if (value != null) {
                request.put(setting[1], value);
            }
        }
        JsonNode description;
        try {
            description = context.call("load_table", request);
        } catch (CatalogContext.Failure e) {
            NoSuchTableException missing = e.noSuchTable(ident);
            if (missing != null) {
                throw missing;
            }
            throw e.unchecked();
        }
        return context.table(description, version, timestampMicros);
    }

    @Override
    public void invalidateTable(Identifier ident) {
        // nothing cached
    }

    @Override
    public Table createTable(Identifier ident, Column[] columns, Transform[] partitions, Map<String, String> properties)
            throws TableAlreadyExistsException, NoSuchNamespaceException {
        ObjectNode request = createRequest(ident, columns, partitions, properties);
        try {
            return context.table(context.call("create_table", request), null, null);
        } catch (CatalogContext.Failure e) {
            throw createFailure(e, ident);
        }
    }

    @Override
    public Table createTable(Identifier ident, TableInfo info) throws TableAlreadyExistsException,
            NoSuchNamespaceException {
        return createTable(ident, info.columns(), info.partitions(), info.properties());
    }

    @Override
    @SuppressWarnings("deprecation")
    public Table createTable(Identifier ident, StructType schema, Transform[] partitions,
            Map<String, String> properties) throws TableAlreadyExistsException, NoSuchNamespaceException {
        return createTable(ident, columns(schema), partitions, properties);
    }

    private static Column[] columns(StructType schema) {
        Column[] out = new Column[schema.fields().length];
        for (int i = 0; i < out.length; i++) {
            StructField f = schema.fields()[i];
            out[i] = Column.create(f.name(), f.dataType(), f.nullable(), f.getComment().isDefined()
                ? f.getComment().get() : null, null);
        }
        return out;
    }

    private <E extends Exception> RuntimeException createFailure(CatalogContext.Failure e, Identifier ident)
            throws TableAlreadyExistsException, NoSuchNamespaceException {
        TableAlreadyExistsException exists = e.tableExists(ident);
        if (exists != null) {
            throw exists;
        }
        NoSuchNamespaceException missing = e.noSuchNamespace(ident.namespace());
        if (missing != null) {
            throw missing;
        }
        return e.unchecked();
    }

    private ObjectNode createRequest(Identifier ident, Column[] columns, Transform[] partitions,
            Map<String, String> properties) {
        ObjectNode request = context.request();
        CatalogContext.identifier(request, "identifier", ident);
        List<StructField> fields = new ArrayList<>();
        for (Column column : columns) {
            if (column.generationExpression() != null || column.identityColumnSpec() != null) {
                throw new UnsupportedOperationException("icecrypt catalog '" + context.name + "': table " + ident
                    + ": column " + column.name() + ": generated and identity columns are not supported");
            }
            MetadataBuilder builder = new MetadataBuilder();
            if (column.comment() != null) {
                builder.putString("comment", column.comment());
            }
            if (column.defaultValue() != null) {  // the column's write default (Changes.defaultLiteral)
                builder.putString(org.icecrypt.spark.catalog.Changes.DEFAULT_METADATA,
                    org.icecrypt.spark.catalog.Changes.defaultLiteral(column.defaultValue().getValue(),
                        column.defaultValue().getSql()).toString());
            }
            Metadata metadata = builder.build();
            fields.add(new StructField(column.name(), column.dataType(), column.nullable(), metadata));
        }
        StructType schema = new StructType(fields.toArray(new StructField[0]));
        try {
            request.set("schema", CatalogContext.JSON.readTree(schema.json()));
        } catch (java.io.IOException e) {
            throw new IllegalStateException("icecrypt catalog: a schema that is not JSON", e);
        }
        ArrayNode transforms = request.putArray("transforms");
        for (Transform transform : partitions) {
            transforms.add(Changes.transform(transform));
        }
        ObjectNode props = request.putObject("properties");
        for (Map.Entry<String, String> e : properties.entrySet()) {
            props.put(e.getKey(), e.getValue());
        }
        return request;
    }

    @Override
    public Table alterTable(Identifier ident, TableChange... changes) throws NoSuchTableException {
        ObjectNode request = context.request();
        CatalogContext.identifier(request, "identifier", ident);
        ArrayNode list = request.putArray("changes");
        for (TableChange change : changes) {
            list.add(Changes.change(change));
        }
        try {
            return context.table(context.call("alter_table", request), null, null);
        } catch (CatalogContext.Failure e) {
            NoSuchTableException missing = e.noSuchTable(ident);
            if (missing != null) {
                throw missing;
            }
            throw e.unchecked();
        }
    }

    @Override
    public boolean dropTable(Identifier ident) {
        return drop(ident, false);
    }

    @Override
    public boolean purgeTable(Identifier ident) {
        return drop(ident, true);
    }

    private boolean drop(Identifier ident, boolean purge) {
        ObjectNode request = context.request();
        CatalogContext.identifier(request, "identifier", ident);
        request.put("purge", purge);
        return context.callUnchecked("drop_table", request).asBoolean();
    }

    @Override
    public void renameTable(Identifier from, Identifier to) throws NoSuchTableException, TableAlreadyExistsException {
        to = renameTarget(to);
        ObjectNode request = context.request();
        CatalogContext.identifier(request, "from", from);
        CatalogContext.identifier(request, "to", to);
        try {
            context.call("rename_table", request);
        } catch (CatalogContext.Failure e) {
            NoSuchTableException missing = e.noSuchTable(from);
            if (missing != null) {
                throw missing;
            }
            TableAlreadyExistsException exists = e.tableExists(to);
            if (exists != null) {
                throw exists;
            }
            throw e.unchecked();
        }
    }

    /** RENAME TO cat.db.t names the catalog too (as Iceberg's catalog, take it off). */
    private Identifier renameTarget(Identifier to) {
        String[] namespace = to.namespace();
        if (namespace.length > 1 && namespace[0].equalsIgnoreCase(context.name)) {
            return Identifier.of(java.util.Arrays.copyOfRange(namespace, 1, namespace.length), to.name());
        }
        return to;
    }

    // --- staged creates and replaces (CTAS, RTAS) ------------------------------------------------

    @Override
    public StagedTable stageCreate(Identifier ident, Column[] columns, Transform[] partitions,
            Map<String, String> properties) throws TableAlreadyExistsException, NoSuchNamespaceException {
        try {
            return stage(ident, columns, partitions, properties, "create");
        } catch (NoSuchTableException e) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public StagedTable stageCreate(Identifier ident, TableInfo info) throws TableAlreadyExistsException,
            NoSuchNamespaceException {
        return stageCreate(ident, info.columns(), info.partitions(), info.properties());
    }

    @Override
    @SuppressWarnings("deprecation")
    public StagedTable stageCreate(Identifier ident, StructType schema, Transform[] partitions,
            Map<String, String> properties) throws TableAlreadyExistsException, NoSuchNamespaceException {
        return stageCreate(ident, columns(schema), partitions, properties);
    }

    @Override
    public StagedTable stageReplace(Identifier ident, Column[] columns, Transform[] partitions,
            Map<String, String> properties) throws NoSuchNamespaceException, NoSuchTableException {
        try {
            return stage(ident, columns, partitions, properties, "replace");
        } catch (TableAlreadyExistsException e) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public StagedTable stageReplace(Identifier ident, TableInfo info) throws NoSuchNamespaceException,
            NoSuchTableException {
        return stageReplace(ident, info.columns(), info.partitions(), info.properties());
    }

    @Override
    @SuppressWarnings("deprecation")
    public StagedTable stageReplace(Identifier ident, StructType schema, Transform[] partitions,
            Map<String, String> properties) throws NoSuchNamespaceException, NoSuchTableException {
        return stageReplace(ident, columns(schema), partitions, properties);
    }

    @Override
    public StagedTable stageCreateOrReplace(Identifier ident, Column[] columns, Transform[] partitions,
            Map<String, String> properties) throws NoSuchNamespaceException {
        try {
            return stage(ident, columns, partitions, properties, "create_or_replace");
        } catch (TableAlreadyExistsException | NoSuchTableException e) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public StagedTable stageCreateOrReplace(Identifier ident, TableInfo info) throws NoSuchNamespaceException {
        return stageCreateOrReplace(ident, info.columns(), info.partitions(), info.properties());
    }

    @Override
    @SuppressWarnings("deprecation")
    public StagedTable stageCreateOrReplace(Identifier ident, StructType schema, Transform[] partitions,
            Map<String, String> properties) throws NoSuchNamespaceException {
        return stageCreateOrReplace(ident, columns(schema), partitions, properties);
    }

    private StagedTable stage(Identifier ident, Column[] columns, Transform[] partitions, Map<String, String> properties,
            String mode) throws TableAlreadyExistsException, NoSuchNamespaceException, NoSuchTableException {
        ObjectNode request = createRequest(ident, columns, partitions, properties);
        request.put("mode", mode);
        JsonNode description;
        try {
            description = context.call("stage", request);
        } catch (CatalogContext.Failure e) {
            NoSuchTableException missing = e.noSuchTable(ident);
            if (missing != null) {
                throw missing;
            }
            throw createFailure(e, ident);
        }
        return context.staged(description);
    }

    // --- views: Spark's V2 views, as Iceberg view metadata --------------------------------------------

    /** A table or, when there is none of that name, a view (tables and views share names). */
    @Override
    public Relation loadRelation(Identifier ident) throws NoSuchTableException {
        try {
            return loadTable(ident);
        } catch (NoSuchTableException missing) {
            try {
                return loadView(ident);
            } catch (NoSuchViewException noView) {
                throw missing;
            }
        }
    }

    @Override
    public boolean tableExists(Identifier ident) {
        try {
            loadTable(ident);
            return true;
        } catch (NoSuchTableException e) {
            return false;
        }
    }

    @Override
    public boolean viewExists(Identifier ident) {
        try {
            loadView(ident);
            return true;
        } catch (NoSuchViewException e) {
            return false;
        }
    }

    @Override
    public Identifier[] listViews(String[] namespace) throws NoSuchNamespaceException {
        return list("list_views", namespace);
    }

    @Override
    public View loadView(Identifier ident) throws NoSuchViewException {
        ObjectNode request = context.request();
        CatalogContext.identifier(request, "identifier", ident);
        try {
            return view(context.call("load_view", request));
        } catch (CatalogContext.Failure e) {
            NoSuchViewException missing = e.noSuchView(ident);
            if (missing != null) {
                throw missing;
            }
            throw e.unchecked();
        }
    }

    /** Spark's View from the driver's description of one (views.describe). */
    private static View view(JsonNode described) {
        Map<String, String> configs = new LinkedHashMap<>();
        described.get("sql_configs").fields().forEachRemaining(e -> configs.put(e.getKey(), e.getValue().asText()));
        Map<String, String> properties = new LinkedHashMap<>();
        described.get("properties").fields().forEachRemaining(e -> properties.put(e.getKey(), e.getValue().asText()));
        JsonNode catalog = described.get("current_catalog");
        JsonNode mode = described.get("schema_mode");
        View.Builder builder = new View.Builder()
            .withQueryText(described.get("sql").asText())
            .withCurrentCatalog(catalog == null || catalog.isNull() ? null : catalog.asText())
            .withCurrentNamespace(CatalogContext.strings(described.get("current_namespace")))
            .withSqlConfigs(configs)
            .withQueryColumnNames(CatalogContext.strings(described.get("query_column_names")));
        if (mode != null && !mode.isNull()) {
            builder = builder.withSchemaMode(mode.asText());
        }
        builder.withSchema((StructType) DataType.fromJson(described.get("schema").toString()));
        builder.withProperties(properties);
        if (properties.containsKey("comment")) {
            builder.withComment(properties.get("comment"));
        }
        return builder.build();
    }

    private ObjectNode viewRequest(Identifier ident, View info, boolean replace) {
        ObjectNode request = context.request();
        CatalogContext.identifier(request, "identifier", ident);
        request.put("sql", info.queryText());
        request.put("current_catalog", info.currentCatalog());
        CatalogContext.namespace(request, "current_namespace",
            info.currentNamespace() == null ? new String[0] : info.currentNamespace());
        try {
            request.set("schema", CatalogContext.JSON.readTree(info.schema().json()));
        } catch (java.io.IOException e) {
            throw new IllegalStateException("icecrypt catalog: a schema that is not JSON", e);
        }
        ArrayNode names = request.putArray("query_column_names");
        for (String name : info.queryColumnNames() == null ? new String[0] : info.queryColumnNames()) {
            names.add(name);
        }
        ObjectNode configs = request.putObject("sql_configs");
        if (info.sqlConfigs() != null) {
            info.sqlConfigs().forEach(configs::put);
        }
        request.put("schema_mode", info.schemaMode());
        ObjectNode props = request.putObject("properties");
        if (info.properties() != null) {
            info.properties().forEach(props::put);
        }
        request.put("engine_version", org.apache.spark.package$.MODULE$.SPARK_VERSION());
        request.put("replace", replace);
        return request;
    }

    @Override
    public View createView(Identifier ident, View info) throws ViewAlreadyExistsException, NoSuchNamespaceException {
        return writeView(ident, info, false);
    }

    @Override
    public View createOrReplaceView(Identifier ident, View info)
            throws ViewAlreadyExistsException, NoSuchNamespaceException {
        return writeView(ident, info, true);
    }

    @Override
    public View replaceView(Identifier ident, View info) throws NoSuchViewException {
        if (!viewExists(ident)) {
            throw new NoSuchViewException(ident);
        }
        try {
            return writeView(ident, info, true);
        } catch (ViewAlreadyExistsException | NoSuchNamespaceException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
    }

    private View writeView(Identifier ident, View info, boolean replace)
            throws ViewAlreadyExistsException, NoSuchNamespaceException {
        try {
            return view(context.call("create_view", viewRequest(ident, info, replace)));
        } catch (CatalogContext.Failure e) {
            ViewAlreadyExistsException exists = e.viewExists(ident);
            if (exists != null) {
                throw exists;
            }
            NoSuchNamespaceException missing = e.noSuchNamespace(ident.namespace());
            if (missing != null) {
                throw missing;
            }
            throw e.unchecked();
        }
    }

    @Override
    public boolean dropView(Identifier ident) {
        ObjectNode request = context.request();
        CatalogContext.identifier(request, "identifier", ident);
        return context.callUnchecked("drop_view", request).asBoolean();
    }

    @Override
    public void renameView(Identifier from, Identifier to) throws NoSuchViewException, ViewAlreadyExistsException {
        to = renameTarget(to);
        ObjectNode request = context.request();
        CatalogContext.identifier(request, "from", from);
        CatalogContext.identifier(request, "to", to);
        try {
            context.call("rename_view", request);
        } catch (CatalogContext.Failure e) {
            NoSuchViewException missing = e.noSuchView(from);
            if (missing != null) {
                throw missing;
            }
            ViewAlreadyExistsException exists = e.viewExists(to);
            if (exists != null) {
                throw exists;
            }
            throw e.unchecked();
        }
    }

    // --- functions: Iceberg's partition transforms -------------------------------------------------

    @Override
    public Identifier[] listFunctions(String[] namespace) throws NoSuchNamespaceException {
        if (namespace.length > 1 || (namespace.length == 1 && !"system".equalsIgnoreCase(namespace[0]))) {
            throw new NoSuchNamespaceException(namespace);
        }
        List<Identifier> out = new ArrayList<>();
        for (String name : Transforms.FUNCTIONS) {
            out.add(Identifier.of(namespace, name));
        }
        return out.toArray(new Identifier[0]);
    }

    @Override
    public UnboundFunction loadFunction(Identifier ident) throws NoSuchFunctionException {
        String[] namespace = ident.namespace();
        if (namespace.length == 0 || (namespace.length == 1 && "system".equalsIgnoreCase(namespace[0]))) {
            UnboundFunction function = Transforms.function(ident.name());
            if (function != null) {
                return function;
            }
        }
        throw new NoSuchFunctionException(ident);
    }

    // --- procedures: Iceberg's (and icecrypt's) CALL cat.system.<name>(...) ------------------------

    private static boolean isSystem(String[] namespace) {
        return namespace.length == 1 && "system".equalsIgnoreCase(namespace[0]);
    }

    @Override
    public UnboundProcedure loadProcedure(Identifier ident) {
        if (isSystem(ident.namespace())) {
            ObjectNode request = context.request();
            request.put("name", ident.name());
            JsonNode description = context.callUnchecked("procedure", request);
            if (description != null && !description.isNull()) {
                return new PyProcedure(context, description);
            }
        }
        // Spark 4 has no exception of its own for a missing procedure: its routine-not-found
        // error (a SparkThrowable, shown as is) names the catalog, namespace and procedure
        throw sneaky(new NoSuchFunctionException(Identifier.of(
            concat(context.name, ident.namespace()), ident.name())));
    }

    @Override
    public Identifier[] listProcedures(String[] namespace) {
        if (!isSystem(namespace)) {
            return new Identifier[0];
        }
        String[] names = CatalogContext.strings(context.callUnchecked("list_procedures", context.request()));
        Identifier[] out = new Identifier[names.length];
        for (int i = 0; i < out.length; i++) {
            out[i] = Identifier.of(namespace, names[i]);
        }
        return out;
    }

    private static String[] concat(String first, String[] rest) {
        String[] out = new String[rest.length + 1];
        out[0] = first;
        System.arraycopy(rest, 0, out, 1, rest.length);
        return out;
    }

    /** Throw a checked exception where the interface declares none (Spark shows it as is). */
    @SuppressWarnings("unchecked")
    private static <E extends Throwable> RuntimeException sneaky(Throwable e) throws E {
        throw (E) e;
    }

    @Override
    public String toString() {
        return "icecrypt catalog " + (context == null ? "(not initialized)" : context.name);
    }
}
