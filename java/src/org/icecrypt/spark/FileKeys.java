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
 * shows configuration it shows the value redacted.  Nothing here logs or prints a key.
 *
 * The parsed entries are cached so that every file of a read does not parse them again,
 * under the read id (icecrypt.read-id) and the SHA-256 digest of the whole entry text: an
 * entry is found only by a caller that holds the same secret text (read ids appear in
 * plans; another session of the JVM that knows one gets nothing).  An entry lives while
 * tasks use it: each task that takes keys from it registers a completion listener, and
 * when the last such task of the JVM ends (success or failure) the entry is dropped.  A
 * read's tasks that come later (another action, a retried stage) parse the text again.
 * Entries made outside a task, and any left behind, go when unused for IDLE_NANOS; at most
 * CACHED_READS are kept.  A dropped entry's key bytes are overwritten with zeros; callers
 * get copies of a file's key, never the cached arrays.
 */
package org.icecrypt.spark;

import java.io.IOException;
import java.lang.ref.WeakReference;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.crypto.ParquetCryptoRuntimeException;
import org.apache.spark.TaskContext;
import org.apache.spark.util.TaskCompletionListener;

public final class FileKeys {
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

        FileKey copy() {
            return new FileKey(dek.clone(), aadPrefix.clone(), length);
        }

        void wipe() {
            Arrays.fill(dek, (byte) 0);
            Arrays.fill(aadPrefix, (byte) 0);
        }
    }

    /** A read's parsed keys, the tasks of this JVM using them and when they were last used. */
    private static final class Entry {
        final String readId;
        final Map<Path, FileKey> keys;
        final Set<Long> tasks = new HashSet<>();
        long used;

        Entry(String readId, Map<Path, FileKey> keys, long used) {
            this.readId = readId;
            this.keys = keys;
            this.used = used;
        }
    }

    private static final int CACHED_READS = 16;
    /** An entry no task uses is dropped after this long unused (one minute). */
    private static final long IDLE_NANOS = 60_000_000_000L;

    /** read id and key-text digest -> the read's keys; the most recently used reads only. */
    private static final LinkedHashMap<String, Entry> CACHE =
        new LinkedHashMap<String, Entry>(CACHED_READS, 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<String, Entry> eldest) {
                if (size() <= CACHED_READS) {
                    return false;
                }
                wipe(eldest.getValue().keys);
                return true;
            }
        };

    private FileKeys() {
    }

    /**
     * The key of {@code file} in this read (a copy: the caller may keep it); fails (never
     * returns null) when it has none.
     */
    static FileKey of(Configuration conf, Path file) {
        String text = conf.get(KEYS);
        if (text == null || text.isEmpty()) {
            throw new ParquetCryptoRuntimeException(
                "icecrypt: the read's configuration has no " + KEYS + " (not a read planned by icecrypt)");
        }
        Path qualified = qualify(conf, file);
        String readId = conf.get(READ_ID);
        if (readId == null) {
            Map<Path, FileKey> parsed = parse(conf, text);
            try {
                return found(parsed, qualified, file);
            } finally {
                wipe(parsed);
            }
        }
        String cacheKey = readId + ":" + digestOf(text);
        TaskContext task = TaskContext.get();
        synchronized (CACHE) {
            Entry entry = cached(cacheKey, task);
            if (entry != null) {
                return found(entry.keys, qualified, file);
            }
        }
        Map<Path, FileKey> parsed = parse(conf, text);
        synchronized (CACHE) {
            Entry entry = cached(cacheKey, task);  // another task may have parsed it meanwhile
            if (entry != null) {
                wipe(parsed);
            } else {
                entry = new Entry(readId, parsed, System.nanoTime());
                CACHE.put(cacheKey, entry);
                use(cacheKey, entry, task);
            }
            return found(entry.keys, qualified, file);
        }
    }

    /** The number of reads with cached keys, all of them (null) or of one read id; no key. */
    public static int cachedReads(String readId) {
        synchronized (CACHE) {
            expire(System.nanoTime());
            int count = 0;
            for (Entry entry : CACHE.values()) {
                if (readId == null || readId.equals(entry.readId)) {
                    count++;
                }
            }
            return count;
        }
    }

    /** The entry cached under {@code cacheKey}, marked used (by {@code task}); null if none. Holds CACHE. */
    private static Entry cached(String cacheKey, TaskContext task) {
        expire(System.nanoTime());
        Entry entry = CACHE.get(cacheKey);
        if (entry != null) {
            use(cacheKey, entry, task);
        }
        return entry;
    }

    /** Marks {@code entry} used now, and by {@code task} until it completes. Holds CACHE. */
    private static void use(String cacheKey, Entry entry, TaskContext task) {
        entry.used = System.nanoTime();
        if (task == null || !entry.tasks.add(task.taskAttemptId())) {
            return;
        }
        long attempt = task.taskAttemptId();
        task.addTaskCompletionListener((TaskCompletionListener) context -> {
            synchronized (CACHE) {
                Entry current = CACHE.get(cacheKey);
                if (current != entry) {
                    return;  // dropped meanwhile
                }
                entry.tasks.remove(attempt);
                if (entry.tasks.isEmpty()) {
                    CACHE.remove(cacheKey);
                    wipe(entry.keys);
                }
            }
        });
    }

    /** Drops the entries no running task uses that were not used for IDLE_NANOS. Holds CACHE. */
    private static void expire(long now) {
        Iterator<Entry> entries = CACHE.values().iterator();
        while (entries.hasNext()) {
            Entry entry = entries.next();
            if (entry.tasks.isEmpty() && now - entry.used > IDLE_NANOS) {
                wipe(entry.keys);
                entries.remove();
            }
        }
    }

    private static FileKey found(Map<Path, FileKey> keys, Path qualified, Path file) {
        FileKey key = keys.get(qualified);
        if (key == null) {
            throw new ParquetCryptoRuntimeException(
                "icecrypt: " + file + " is not a data file of this read (no key planned for it): refused");
        }
        return key.copy();
    }

    private static void wipe(Map<Path, FileKey> keys) {
        for (FileKey key : keys.values()) {
            key.wipe();
        }
    }

    /** The entry text digested last (held weakly: it may go with its read) and its digest. */
    private static WeakReference<String> lastText = new WeakReference<>(null);
    private static String lastDigest;

    /**
     * {@link #digest} of {@code text}, hashed once per text instance: a read's files share the
     * one instance of its broadcast configuration, and the text names every file of the read,
     * so hashing it again for each file made a read of n files cost n times the text.
     */
    private static String digestOf(String text) {
        synchronized (CACHE) {
            if (lastText.get() == text) {
                return lastDigest;
            }
        }
        String computed = digest(text);
        synchronized (CACHE) {
            lastText = new WeakReference<>(text);
            lastDigest = computed;
        }
        return computed;
    }

    /** The SHA-256 digest of the entry text, in hex (what finds a cached entry, with the read id). */
    private static String digest(String text) {
        try {
            byte[] hash = MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8));
            StringBuilder hex = new StringBuilder(hash.length * 2);
            for (byte b : hash) {
                hex.append(Character.forDigit((b >> 4) & 0xf, 16)).append(Character.forDigit(b & 0xf, 16));
            }
            return hex.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is not available", e);
        }
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
                wipe(keys);
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
