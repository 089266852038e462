/*
 * icecrypt: the JVM end of the SQL catalog's bridge to icecrypt's Python driver.
 *
 * The catalog (org.icecrypt.spark.SparkCatalog) decides nothing about a table itself: what
 * an identifier names, a table's schema, the files a scan reads, every commit are
 * icecrypt's Python catalogs and table API, on the driver.  The PySpark driver hands this
 * class its bridge object (icecrypt.spark._sql.bridge.CatalogBridge, a Py4J proxy) with
 * register(); the catalog calls it with a method name and a JSON request and gets JSON
 * back: {"ok": value} or {"error": {"kind": ..., "message": ...}}, which call() turns
 * into Spark's exceptions (no such table or namespace, already exists, not empty, ...)
 * carrying the Python message (it names the catalog and table; it never holds a key).
 *
 * One bridge per JVM: a classic PySpark driver is one Python process per JVM.  A JVM
 * without one (a Spark Connect server, a driver that never called
 * icecrypt.spark.register) refuses every call, saying so; nothing is ever done without
 * the driver.
 */
package org.icecrypt.spark.catalog;

public final class Bridge {
    /** What the Python driver implements (icecrypt.spark._sql.bridge.CatalogBridge). */
    public interface Driver {
        /** Run {@code method} with the JSON {@code request}; answers JSON (see the header). */
        String call(String method, String request);

        /** A JVM Dataset for {@code name} (a metadata table's rows), or a JSON error string. */
        Object dataset(String name, String request);
    }

    private static volatile Driver driver;

    private Bridge() {
    }

    public static void register(Driver bridge) {
        driver = bridge;
    }

    public static void unregister() {
        driver = null;
    }

    public static boolean registered() {
        return driver != null;
    }

    static Driver driver(String catalog) {
        Driver found = driver;
        if (found == null) {
            throw new UnsupportedOperationException("icecrypt catalog '" + catalog + "': no icecrypt driver is "
                + "registered in this JVM. Encrypted tables are planned and committed by icecrypt's Python driver: use "
                + "a classic PySpark session built with icecrypt.spark.configure(builder) and call "
                + "icecrypt.spark.register(spark). Spark Connect cannot use this catalog (its server has no icecrypt "
                + "driver); read and write through the icecrypt.iceberg data source there.");
        }
        return found;
    }

}
