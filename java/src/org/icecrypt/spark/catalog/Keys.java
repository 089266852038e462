/*
 * icecrypt: where the Python driver leaves key material for the SQL catalog's JVM code.
 *
 * A scan's file keys (the value FileKeys parses: each planned file's DEK and AAD prefix)
 * and a write's secret (FileEncryption derives each file's keys from it) are made by the
 * Python driver while it answers a bridge call.  It does not answer with them: it calls
 * put() from inside the call (a Py4J command whose logging icecrypt suppresses), and the
 * catalog take()s them right after the call returns, into the Hadoop configuration of
 * the scan or write (broadcast to the executors as Spark broadcasts every file scan's
 * configuration; under a name Spark redacts).  Nothing here is logged or shown; an entry
 * is taken once, and one never taken (a failed statement) is dropped when the map grows
 * past a few hundred entries.
 */
package org.icecrypt.spark.catalog;

import java.util.LinkedHashMap;
import java.util.Map;

public final class Keys {
    private static final int LIMIT = 256;

    private static final Map<String, String> PENDING = new LinkedHashMap<String, String>() {
        private static final long serialVersionUID = 1L;

        @Override
        protected boolean removeEldestEntry(Map.Entry<String, String> eldest) {
            return size() > LIMIT;
        }
    };

    private Keys() {
    }

    /** Leave {@code value} for {@code id} (called by the Python driver). */
    public static void put(String id, String value) {
        synchronized (PENDING) {
            PENDING.put(id, value);
        }
    }

    /** The value left for {@code id}, removed; fails when there is none. */
    static String take(String id) {
        String value;
        synchronized (PENDING) {
            value = PENDING.remove(id);
        }
        if (value == null) {
            throw new IllegalStateException("icecrypt catalog: the driver left no keys for " + id);
        }
        return value;
    }
}
