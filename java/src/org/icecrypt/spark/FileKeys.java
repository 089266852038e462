/*
 * icecrypt: the data keys of one Spark read of an encrypted Iceberg table, as parquet-java
 * sees them (see FileDecryption).
 *
 * The driver (icecrypt.spark._native) plans the scan, unwraps the key metadata of the data
 * files it hands to Spark's Parquet source and puts, per read, one entry in the scan's
 * Hadoop configuration:
 *
 *   icecrypt.secret.file-keys = entry ( "," entry )*
 *   entry = base64url(path, UTF-8) "." base64(DEK) "." base64(AAD prefix) "." file length
 *
 * (the AAD prefix may be empty, the file length is -1 when the key metadata has none).
 * The name matches Spark's default spark.redaction.regex ("secret"), so wherever Spark
 * shows configuration it shows the value redacted.  icecrypt.read-id names the read; the
 * parsed entries are kept per read id so that every file of a read does not parse them
 * again.  Nothing here logs or prints a key.
 */
package org.icecrypt.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.crypto.ParquetCryptoRuntimeException;

final class FileKeys {
    static final String KEYS = "icecrypt.secret.file-keys";
    static final String READ_ID = "icecrypt.read-id";

    /** The key of one data file: its DEK, AAD prefix and stored length. */
    static final class FileKey {
        final byte[] dek;
        final byte[] aadPrefix;
        final long length;

        FileKey(byte[] dek, byte[] aadPrefix, long length) {
            this.dek = dek;
            this.aadPrefix = aadPrefix;
            this.length = length;
        }
    }

    private static final int CACHED_READS = 16;

    /** read id -> the read's keys by qualified path; the most recently used reads only. */
    private static final Map<String, Map<Path, FileKey>> CACHE =
        new LinkedHashMap<String, Map<Path, FileKey>>(CACHED_READS, 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<String, Map<Path, FileKey>> eldest) {
                return size() > CACHED_READS;
            }
        };

    private FileKeys() {
    }

    /** The key of {@code file} in this read; fails (never returns null) when it has none. */
    static FileKey of(Configuration conf, Path file) {
        Map<Path, FileKey> keys = forRead(conf);
        Path qualified = qualify(conf, file);
        FileKey key = keys.get(qualified);
        if (key == null) {
            throw new ParquetCryptoRuntimeException(
                "icecrypt: " + file + " is not a data file of this read (no key planned for it): refused");
        }
        return key;
    }

    private static Map<Path, FileKey> forRead(Configuration conf) {
        String text = conf.get(KEYS);
        if (text == null || text.isEmpty()) {
            throw new ParquetCryptoRuntimeException(
                "icecrypt: the read's configuration has no " + KEYS + " (not a read planned by icecrypt)");
        }
        String readId = conf.get(READ_ID);
        String cacheKey = readId == null ? null : readId + ":" + text.length();
        if (cacheKey != null) {
            synchronized (CACHE) {
                Map<Path, FileKey> cached = CACHE.get(cacheKey);
                if (cached != null) {
                    return cached;
                }
            }
        }
        Map<Path, FileKey> parsed = parse(conf, text);
        if (cacheKey != null) {
            synchronized (CACHE) {
                CACHE.put(cacheKey, parsed);
            }
        }
        return parsed;
    }

    private static Map<Path, FileKey> parse(Configuration conf, String text) {
        Base64.Decoder names = Base64.getUrlDecoder();
        Base64.Decoder bytes = Base64.getDecoder();
        Map<Path, FileKey> keys = new HashMap<>();
        int index = 0;
        for (String entry : text.split(",", -1)) {
            String[] parts = entry.split("\\.", -1);
            try {
                if (parts.length != 4) {
                    throw new IllegalArgumentException("expected 4 fields, found " + parts.length);
                }
                String path = new String(names.decode(parts[0]), StandardCharsets.UTF_8);
                byte[] dek = bytes.decode(parts[1]);
                if (dek.length != 16 && dek.length != 24 && dek.length != 32) {
                    throw new IllegalArgumentException("a data key of " + dek.length + " bytes");
                }
                byte[] aad = bytes.decode(parts[2]);
                long length = Long.parseLong(parts[3]);
                keys.put(qualify(conf, new Path(path)), new FileKey(dek, aad, length));
            } catch (IllegalArgumentException e) {
                // the message says what is wrong with the entry, never its content
                throw new ParquetCryptoRuntimeException(
                    "icecrypt: entry " + index + " of " + KEYS + " is malformed (" + e.getMessage() + ")");
            }
            index++;
        }
        return keys;
    }

    static Path qualify(Configuration conf, Path path) {
        try {
            FileSystem fs = path.getFileSystem(conf);
            return fs.makeQualified(path);
        } catch (IOException e) {
            throw new ParquetCryptoRuntimeException("icecrypt: cannot resolve the file system of " + path, e);
        }
    }
}
